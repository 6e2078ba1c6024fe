"""Audit: an evicted append checkpoint costs more than a re-read: it drops the damage check it fed.

58b0b03 bounds a store handle's append checkpoints ("a dropped checkpoint is a lost hint: the next append
reads the file from its start, never a wrong seq"). 12c0fe3 then made the same checkpoint the mailbox's
``committed_end`` (FORMAT.md §3.3, rule 1): damage that starts before where this process knows records reach
is corruption, never a torn tail. So the process that accepted a message refuses to cut it when its frame is
later damaged into the shape of a torn write (its length field now runs into the zero padding) — until the
checkpoint is evicted by appends to 1,024 other files: the next acceptance of the same handle then cuts the
acknowledged message as a torn tail and acknowledges the new one in its place, without a word.
"""

from __future__ import annotations

import struct

import pytest

from subagents import store
from subagents.store.checkpoints import CHECKPOINT_LIMIT

from ._support import CONTINUABLE, make_child, read_file, write_file

SOURCE = {"kind": "user"}


def _damage_last_length(st: store.Store) -> None:
    """Grow the last record's length field so that its announced bytes run into the padding (``short-payload``)."""
    ends = [m.end for m in store.read_mailbox(st, "c")]
    start = ends[-2]
    path = st.path("c", "mailbox")
    data = bytearray(read_file(path))
    (length,) = struct.unpack_from("<I", data, start)
    struct.pack_into("<I", data, start, length + 64)
    write_file(path, bytes(data))


@pytest.mark.xfail(strict=True, reason="audit: the mailbox's committed_end comes from the bounded checkpoint map; once "
                                       "evicted, the same process cuts an acknowledged message it refused to cut before")
def test_an_evicted_checkpoint_does_not_let_its_process_cut_an_acknowledged_message(tmp_path):
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "p")
    make_child(st, "p", "c", descriptor=CONTINUABLE)
    ids = store.IdGenerator()
    accepted = [store.accept(st, "c", source=SOURCE, content=f"m{i}", ids=ids) for i in range(2)]
    _damage_last_length(st)
    with pytest.raises(store.CorruptSessionError):  # while the checkpoint is held: refused, nothing cut
        store.accept(st, "c", source=SOURCE, content="refused", ids=ids)
    for n in range(CHECKPOINT_LIMIT):  # ordinary work of a long-lived supervisor: other children's mailboxes
        make_child(st, "p", f"o{n}", descriptor=CONTINUABLE)
        store.accept(st, f"o{n}", source=SOURCE, content="hello", ids=ids)
    with pytest.raises(store.CorruptSessionError):
        store.accept(st, "c", source=SOURCE, content="after eviction", ids=ids)
    assert [m.id for m in store.read_mailbox(st, "c")][:2] == accepted
