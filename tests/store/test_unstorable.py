"""A record its readers would refuse is refused before it is written, with a code.

A followup whose ``source`` was not a map was acknowledged and written; every
reader of the mailbox then refused that record as damage (not a torn tail),
so the child could never run again and every later followup was
``CORRUPT_SESSION``. A value msgpack cannot encode (an object, a lone
surrogate) escaped as a bare ``TypeError`` or ``UnicodeEncodeError``.
"""

from __future__ import annotations

import pytest

from subagents import store
from subagents.store.errors import SubagentError
from subagents.store.framing import encode_record
from subagents.store.mailbox import MailboxWriter

from ._support import ONE_SHOT


@pytest.mark.parametrize("source", ["notadict", 5, [1], None])
def test_an_acceptance_whose_source_is_no_map_is_refused_and_writes_nothing(tmp_path, source):
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    ids = store.IdGenerator()
    store.accept(st, "s1", source={"kind": "user"}, content="before", ids=ids)
    before = open(st.path("s1", "mailbox"), "rb").read()
    writer = MailboxWriter(st, "s1")
    try:
        with pytest.raises(SubagentError) as caught:
            writer.accept(source=source, content="bad", ids=ids)
        assert caught.value.code == "INVALID_RECORD" and "source" in str(caught.value)
        assert open(st.path("s1", "mailbox"), "rb").read() == before
        writer.accept(source={"kind": "user"}, content="after", ids=ids)
    finally:
        writer.close()
    assert [m.content for m in store.read_mailbox(st, "s1")] == ["before", "after"]


@pytest.mark.parametrize("value", [object(), "\ud800", {1, 2}, 2**70])
def test_a_value_msgpack_cannot_encode_is_an_invalid_record(value):
    with pytest.raises(SubagentError) as caught:
        encode_record({"seq": 0, "data": value}, what="a test record")
    assert caught.value.code == "INVALID_RECORD" and "a test record" in str(caught.value)
    with pytest.raises(SubagentError):
        store.framing.RecordEncoder()({"seq": 0, "type": "x", "data": value})


def test_a_message_msgpack_cannot_encode_keeps_its_code(tmp_path):
    """The mailbox's size check renamed every error of the framing ``MESSAGE_TOO_LARGE``."""
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    for content, source, code in (("\ud800", {}, "INVALID_RECORD"), ("x", {"k": object()}, "INVALID_RECORD"),
                                  ("x" * (st.max_record_bytes + 1), {}, "MESSAGE_TOO_LARGE")):
        with pytest.raises(SubagentError) as caught:
            store.accept(st, "s1", source=source, content=content, ids=store.IdGenerator())
        assert caught.value.code == code
