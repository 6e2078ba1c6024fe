"""A message is accepted only if the turn that takes it can log it (found by a probe).

The mailbox took a record up to the store's limit, and the turn that takes a message logs it again
as ``message/accepted``, some tens of bytes larger (the event's envelope, its ``mailbox_end``, the
writer's epoch). A message in that window was acknowledged, and every turn that tried to take it
failed with ``RECORD_TOO_LARGE`` before it started: a worker retried it 20,000 times in 40 s, and
nothing queued behind it ever ran, even after a restart.
"""

from __future__ import annotations

import pytest

from subagents import store
from subagents.store import LogWriter, RecordTooLargeError
from subagents.store.appender import WIDEST_SEQ
from subagents.store.mailbox import LOG_MARGIN, check_message

from ._support import ONE_SHOT

LIMIT = 4096
SOURCE = {"kind": "coordinator", "sender": "p"}


@pytest.fixture
def small(tmp_path):
    st = store.Store(str(tmp_path / "st"), max_record_bytes=LIMIT)
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    return st


def _largest_accepted(st: store.Store) -> int:
    """The largest content (in characters) the mailbox accepts, found by bisection (nothing is written)."""
    low, high = 0, LIMIT
    while low < high:
        mid = (low + high + 1) // 2
        try:
            check_message(st, "s1", source=SOURCE, content="x" * mid)
            low = mid
        except RecordTooLargeError:
            high = mid - 1
    return low


def test_the_largest_message_accepted_is_one_its_turn_can_log(small) -> None:
    ids = store.IdGenerator()
    size = _largest_accepted(small)
    message_id = store.accept(small, "s1", source=SOURCE, content="x" * size, ids=ids)
    [message] = store.read_mailbox(small, "s1")
    with LogWriter.open(small, "s1", epoch=0) as writer:
        writer.append([("message/accepted", {**message.to_event_data(), "quiet": True})], commit=False)
    assert message.id == message_id
    with pytest.raises(RecordTooLargeError) as refused:
        store.accept(small, "s1", source=SOURCE, content="x" * (size + 1), ids=ids)
    assert refused.value.code == "MESSAGE_TOO_LARGE"
    assert len(store.read_mailbox(small, "s1")) == 1  # nothing written for the refused one


def test_the_margin_covers_what_the_log_adds() -> None:
    """The exact check runs only within ``LOG_MARGIN`` of the limit: the log's record of a message
    must never outgrow its mailbox record by more, whatever the message."""
    from subagents.store.framing import encode_record

    for content in ("", "x" * 1000, {"a": [1, 2, 3]}, None):
        mailbox = encode_record({"id": "0" * 26, "ts": 0.0, "source": {}, "content": content, "wake": False, "seq": 0})
        logged = encode_record({"seq": WIDEST_SEQ, "ts": 1e300, "type": "message/accepted", "epoch": WIDEST_SEQ,
                                "data": {"message_id": "0" * 26, "source": {}, "content": content, "mailbox_end": WIDEST_SEQ, "quiet": True}})
        assert len(logged) - len(mailbox) < LOG_MARGIN
