"""A mailbox's accepted, never-consumed messages survive damage behind the store's back.

Audit defect: with nothing consumed yet, ``require_consumed_prefix`` checked
nothing, and the next acceptance read damage in the mailbox (a record changed
in place, the whole file replaced by random bytes) as the torn tail of an
append that never returned: it cut the file there, dropping acknowledged
messages, and acknowledged the new one; a writer that trusted its checkpoint
appended after the damage, where no reader would ever find the message. The
readers reported fewer messages without a word. Now only a provable torn tail
(FORMAT.md §3.3: the cut-short last frame of one write, then zeros or the
file's end) is cut; any other damage refuses the acceptance before a byte is
written, the readers raise ``CorruptSessionError``, ``fsck`` and ``check`` say
so, and a listing gives that child (only) a diagnostic.
"""

from __future__ import annotations

import random

import pytest

from subagents import store
from subagents.store.catalog import DiagnosticEntry, list_children
from subagents.store.check import check_store
from subagents.store.framing import encode_record, scan
from subagents.store.fsck import fsck
from subagents.store.changes import ChangeWatch
from subagents.store.mailbox import MailboxWriter

from ._support import CONTINUABLE, make_child, read_file, write_file

SOURCE = {"kind": "user"}


@pytest.fixture
def family(any_st):
    """A root ``p`` with two continuable children: ``c`` (the victim) and ``sib``."""
    store.create_session(any_st, "p")
    make_child(any_st, "p", "c", descriptor=CONTINUABLE)
    make_child(any_st, "p", "sib", descriptor=CONTINUABLE)
    return any_st


def accept(st, content, ids, session_id="c"):
    return store.accept(st, session_id, source=SOURCE, content=content, ids=ids)


def flip(offset_of):
    def damage(data: bytearray, ends: list[int]) -> None:
        data[offset_of(ends)] ^= 0x5A
    return damage


def replace_at_random(data: bytearray, ends: list[int]) -> None:
    data[:] = random.Random(7).randbytes(len(data))


DAMAGE = {
    "first-record-payload": flip(lambda ends: 20),  # a CRC that fails, with whole records after it
    "first-record-length": flip(lambda ends: 2),  # a length no writer wrote
    "last-record-payload": flip(lambda ends: ends[-2] + 20),  # the last record, its length still fitting
    "random-same-length": replace_at_random,
}


def damaged(st, how: str) -> tuple[list[str], bytes]:
    """Three messages accepted into ``c``'s mailbox, none consumed; then ``how`` changed its bytes in place."""
    ids = store.IdGenerator()
    accepted = [accept(st, f"m{i}", ids) for i in range(3)]
    path = st.path("c", "mailbox")
    data = bytearray(read_file(path))
    DAMAGE[how](data, [m.end for m in store.read_mailbox(st, "c")])
    write_file(path, bytes(data))
    return accepted, bytes(data)


@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("handle", ["same-store", "fresh-store", "held-writer", "held-writer-watched"])
def test_an_acceptance_beside_damaged_unconsumed_messages_is_refused(family, how, handle):
    """Every acceptance path raises CORRUPT_SESSION and leaves the mailbox byte for byte as it was: the
    process that wrote the messages (its checkpoint), a fresh process, and a writer held open since."""
    st = family
    watch = ChangeWatch.open() if handle == "held-writer-watched" else None
    if handle == "held-writer-watched" and watch is None:
        pytest.skip("no inotify here")
    writer = MailboxWriter(st, "c", changes=watch) if handle.startswith("held-writer") else None
    if writer is not None:
        writer.accept(source=SOURCE, content="before", ids=store.IdGenerator())
    _, data = damaged(st, how)
    path = st.path("c", "mailbox")
    ids = store.IdGenerator()
    target = store.Store(st.root, durability=st.durability) if handle == "fresh-store" else st
    for _ in range(2):  # refused again: the first refusal changed nothing
        with pytest.raises(store.CorruptSessionError) as info:
            if writer is not None:
                writer.accept(source=SOURCE, content="lost", ids=ids)
            else:
                accept(target, "lost", ids)
        assert info.value.code == "CORRUPT_SESSION"
        assert read_file(path) == data
    if writer is not None:
        writer.close()
    if watch is not None:
        watch.close()


@pytest.mark.parametrize("how", list(DAMAGE))
def test_readers_fsck_check_and_listing_report_the_damage(family, how):
    """The readers raise instead of returning fewer messages; fsck says ``mailbox-damaged``, check
    ``mailbox-corrupt``; the victim's listing row is a diagnostic, its sibling's is not."""
    st = family
    accept(st, "hello", store.IdGenerator(), session_id="sib")
    damaged(st, how)
    fresh = store.Store(st.root, durability=st.durability)
    for reader in (st, fresh):
        with pytest.raises(store.CorruptSessionError):
            store.read_mailbox(reader, "c")
        with pytest.raises(store.CorruptSessionError):
            store.pending(reader, "c", consumed=0, last_consumed_id=None)
    found = fsck(fresh, repair=False, lease_ttl_s=5.0)
    assert [f["kind"] for f in found["findings"] if f["id"] == "c"] == ["mailbox-damaged"]
    assert not [f for f in found["findings"] if f["id"] != "c"]
    assert [(v.session_id, v.kind) for v in check_store(fresh).violations] == [("c", "mailbox-corrupt")]
    rows = {row.id: row for row in list_children(fresh, "p")}
    assert rows["c"] == DiagnosticEntry("c", "corrupt")
    assert not isinstance(rows["sib"], DiagnosticEntry)
    assert [m.content for m in store.read_mailbox(fresh, "sib")] == ["hello"]


@pytest.mark.parametrize("where", ["in-the-padding", "at-the-end-of-the-file"])
@pytest.mark.parametrize("handle", ["same-store", "fresh-store"])
def test_a_torn_tail_is_still_cut_and_nothing_accepted_is_lost(family, where, handle):
    """A crash mid-append leaves the valid prefix, a partial last frame, then zeros (or the file's end):
    the readers stop before it without a word, and the next acceptance cuts it and keeps every message."""
    st = family
    ids = store.IdGenerator()
    accepted = [accept(st, f"m{i}", ids) for i in range(3)]
    path = st.path("c", "mailbox")
    data = read_file(path)
    end = scan(data, padded=True).end
    partial = encode_record({"seq": 3, "id": "torn", "ts": 1.0, "source": SOURCE, "content": "never returned"})[:-6]
    if where == "in-the-padding":
        write_file(path, data[:end] + partial + data[end + len(partial):])
    else:
        write_file(path, data[:end] + partial)
    target = store.Store(st.root, durability=st.durability) if handle == "fresh-store" else st
    assert [m.id for m in store.read_mailbox(target, "c")] == accepted
    assert [m.id for m in store.pending(target, "c", consumed=0, last_consumed_id=None)] == accepted
    assert [f for f in fsck(target, repair=False, lease_ttl_s=5.0)["findings"] if f["id"] == "c"] == []
    accepted.append(accept(target, "next", ids))
    result = scan(read_file(path), padded=True)
    assert result.damage is None
    assert [(r["seq"], r["id"]) for r in result.records] == list(enumerate(accepted))


@pytest.mark.parametrize("how", list(DAMAGE))
def test_show_describes_the_damage_instead_of_raising(family, how):
    """``describe_session`` (``subagents show``) says the mailbox does not read, and counts nothing it cannot
    vouch for; the sibling is described as before."""
    st = family
    accept(st, "hello", store.IdGenerator(), session_id="sib")
    damaged(st, how)
    found = store.describe_session(st, "c")
    assert found.mailbox.accepted is None and found.mailbox.pending is None
    assert "no torn tail" in (found.mailbox.problem or "")
    assert store.describe_session(st, "sib").mailbox == store.MailboxCounts(1, 1)


def consume(st, session_id: str, messages) -> None:
    """Messages taken into a turn, as a worker records it: the log's ``message/accepted``, with where each ends."""
    with store.LogWriter.open(st, session_id, epoch=0) as writer:
        writer.append([("message/accepted", m.to_event_data()) for m in messages], commit=True)


@pytest.mark.parametrize("repair", [False, True])
def test_fsck_reports_damage_among_the_consumed_messages_as_check_does(family, repair):
    """Found by a probe: fsck checked a mailbox only from where its log's consumed messages end (the
    O(pending) check of an acceptance), so a record changed in place before it was no finding (exit 0),
    while check said ``mailbox-corrupt``, show said the mailbox does not read and a send from a fresh
    process was refused. Now fsck reads it whole: ``mailbox-damaged`` (exit 1), saying no pending message
    lies in the damage; its repair leaves the mailbox byte for byte (nothing repairs a mailbox)."""
    st = family
    ids = store.IdGenerator()
    accepted = [accept(st, f"m{i}", ids) for i in range(3)]
    consume(st, "c", store.read_mailbox(st, "c")[:2])
    path = st.path("c", "mailbox")
    data = bytearray(read_file(path))
    data[20] ^= 0x5A  # inside the first record, consumed
    write_file(path, bytes(data))
    fresh = store.Store(st.root, durability=st.durability)
    found = fsck(fresh, repair=repair, lease_ttl_s=5.0)
    mine = [f for f in found["findings"] if f["id"] == "c"]
    assert [f["kind"] for f in mine] == ["mailbox-damaged"], found["findings"]
    assert "consumed" in mine[0]["detail"] and "refused" in mine[0]["detail"], mine[0]["detail"]
    assert found["damaged_mailboxes"] == ["c"] and found["repaired"] == []
    assert not [f for f in found["findings"] if f["id"] != "c"]
    assert read_file(path) == bytes(data)
    assert "mailbox-corrupt" in [v.kind for v in check_store(fresh).violations if v.session_id == "c"]
    with pytest.raises(store.CorruptSessionError):
        accept(store.Store(st.root, durability=st.durability), "lost", ids)
    assert read_file(path) == bytes(data)
    # the pending message reads: the damage is in what the log already took
    projection = store.read_projection(st, "c")
    assert [m.id for m in store.pending(fresh, "c", consumed=2, last_consumed_id=accepted[1],
                                        mailbox_end=projection.mailbox_end)] == accepted[2:]
