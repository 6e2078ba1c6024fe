"""A mailbox extended sparsely by one stray byte far past its end is read in bounded memory.

The log's readers were made to read a session file so (``test_sparse_extended_log.py``); the
mailbox had the same weakness: ``f.seek(1 << 30); f.write(b"x")`` on ``sessions/<id>.mailbox``
makes a file of 1 GiB that takes a few KiB on disk, and every reader of it (``pending``,
``read_mailbox``, the check an acceptance makes first, ``check_store``, ``fsck``, a listing of
the parent) read the whole region up to that byte into memory, twice when it read again under
the lock (a GiB or two of RSS per call, seconds each).

The verdict is the format's and stays: zeros followed by a byte that is not zero are damage at
the start of the zeros (FORMAT.md §3.4), and every mailbox record is a commit point, so damage
that is no cut-short last frame is corruption (§3.3 rule 3, §8): acceptances are refused before a
byte is written, readers raise ``CorruptSessionError``, ``check`` and ``fsck`` report it, nothing
repairs it. Each operation runs in a child process that reports the growth of its own peak RSS
(``VmHWM``) across the operation alone.
"""

from __future__ import annotations

import os
import time

import pytest

from subagents import store
from subagents.store.framing import FRAME, encode_record

from ._support import CONTINUABLE, make_child
from .test_sparse_extended_log import assert_bounded, measured

EXTENDED = 1 << 30
TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]
OLD = time.time() - 600
USER = {"kind": "user"}


def extend(path: str) -> None:
    """One stray byte a GiB past the start of the file: a hole before it, nothing on disk."""
    with open(path, "r+b") as handle:
        handle.seek(EXTENDED)
        handle.write(b"x")
    assert os.stat(path).st_blocks * 512 < 1 << 20


@pytest.fixture
def tree(tmp_path) -> store.Store:
    """A root that took one of its two messages, and its settled continuable child that took its one
    message (its prompt); both mailboxes then extended sparsely to 1 GiB."""
    st = store.Store(tmp_path / "store", durability="none")
    ids = store.IdGenerator()
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    store.create_session(st, "root", created_at=OLD)
    make_child(st, "root", "child", descriptor=CONTINUABLE, created_at=OLD, lease_owner=owner)
    store.accept(st, "child", source=USER, content="the prompt", ids=ids)
    [prompt] = store.read_mailbox(st, "child")
    with store.LogWriter.open(st, "child", epoch=1) as writer:
        writer.append([("message/accepted", prompt.to_event_data()), *TURN], commit=True)
    store.release_lease(st, "child", owner, 1)
    store.remove_owner(st, owner)
    for content in ("taken", "pending"):
        store.accept(st, "root", source=USER, content=content, ids=ids)
    taken = store.read_mailbox(st, "root")[0]
    with store.LogWriter.open(st, "root", epoch=0) as writer:
        writer.append([("message/accepted", taken.to_event_data())], commit=True)
    from subagents.store.check import check_store
    assert not check_store(st).violations  # sound before the stray byte
    for session_id in ("child", "root"):
        extend(st.path(session_id, "mailbox"))
    return st


def mailbox_bytes(st: store.Store, session_id: str) -> tuple[int, bytes]:
    """The mailbox's size and its data before the hole: what a refused acceptance must leave as it was."""
    path = st.path(session_id, "mailbox")
    with open(path, "rb") as handle:
        return os.path.getsize(path), handle.read(1 << 16)


def test_an_acceptance_into_the_extended_mailbox_is_refused_in_bounded_memory(tree):
    st = tree
    before = {s: mailbox_bytes(st, s) for s in ("child", "root")}
    found = measured(st, """
        result = []
        for session_id in ("child", "root"):
            try:
                store.accept(st, session_id, source={"kind": "user"}, content="never", ids=store.IdGenerator())
                result.append("accepted")
            except store.CorruptSessionError as exc:
                result.append(exc.code)
    """)
    assert_bounded(found)
    assert found["result"] == ["CORRUPT_SESSION", "CORRUPT_SESSION"]
    assert {s: mailbox_bytes(st, s) for s in ("child", "root")} == before


def test_a_held_writer_refuses_its_next_acceptance_in_bounded_memory(tree, tmp_path):
    """A writer kept open (a resident child's, a held root's) that accepted before the stray byte was
    written learns of it (the file changed under it) and checks the mailbox again: bounded too."""
    st = tree
    path = st.path("child", "mailbox")
    os.truncate(path, 1 << 12)  # the stray byte undone: the writer's first acceptance is accepted
    found = measured(st, f"""
        from subagents.store.mailbox import MailboxWriter
        writer = MailboxWriter(st, "child")
        writer.accept(source={{"kind": "user"}}, content="first", ids=store.IdGenerator())
        with open({path!r}, "r+b") as handle:
            handle.seek({EXTENDED})
            handle.write(b"x")
        before = peak()
        try:
            writer.accept(source={{"kind": "user"}}, content="never", ids=store.IdGenerator())
            result = "accepted"
        except store.CorruptSessionError as exc:
            result = exc.code
        writer.close()
    """)
    assert_bounded(found)
    assert found["result"] == "CORRUPT_SESSION"
    assert os.path.getsize(path) == EXTENDED + 1


def test_a_roots_take_refuses_the_extended_mailbox_in_bounded_memory(tree):
    """What ``take_messages`` reads (``pending`` from the log's last ``mailbox_end``, then the whole
    mailbox when damage sits right there) and what it asks when nothing is pending."""
    st = tree
    found = measured(st, """
        from subagents.store.log import read_projection
        from subagents.store.mailbox import require_consumed_prefix
        p = read_projection(st, "root")
        result = []
        for call in (lambda: store.pending(st, "root", consumed=p.consumed, last_consumed_id=p.last_message_id,
                                           mailbox_end=p.mailbox_end),
                     lambda: store.read_mailbox(st, "root"),
                     lambda: require_consumed_prefix(st, "root", p)):
            try:
                call()
                result.append("read")
            except store.CorruptSessionError as exc:
                result.append([exc.code, exc.fields.get("offset")])
    """)
    assert_bounded(found)
    assert [r[0] for r in found["result"]] == ["CORRUPT_SESSION"] * 3, found["result"]


def test_listing_the_parent_reads_the_childs_mailbox_in_bounded_memory(tree):
    """A settled child is listed from its ``settled`` index row while its file is as its release left
    it (its mailbox is not read: nothing to bound). Once its file was written since, the row is read
    from its files, pending messages included: a diagnostic, read in bounded memory."""
    st = tree
    settled = measured(st, """
        result = [[r.id, type(r).__name__, getattr(r, "status", None)] for r in store.list_children(st, "root")]
    """)
    assert_bounded(settled)
    assert settled["result"] == [["child", "ChildEntry", "complete"]]
    os.utime(st.session_path("child"), ns=(time.time_ns(), time.time_ns()))  # written since it settled
    found = measured(st, """
        result = [[r.id, type(r).__name__, getattr(r, "reason", None)] for r in store.list_children(st, "root")]
    """)
    assert_bounded(found)
    assert found["result"] == [["child", "DiagnosticEntry", "corrupt"]]


def test_check_store_reports_both_mailboxes_in_bounded_memory(tree):
    st = tree
    found = measured(st, """
        report = check_store(st)
        result = sorted([v.kind, v.session_id] for v in report.violations)
    """)
    assert_bounded(found)
    assert found["result"] == [["mailbox-corrupt", "child"], ["mailbox-corrupt", "root"]]


def test_fsck_repair_reports_both_mailboxes_and_repairs_neither_in_bounded_memory(tree):
    st = tree
    before = {s: mailbox_bytes(st, s) for s in ("child", "root")}
    found = measured(st, """
        report = fsck(st, repair=True, lease_ttl_s=30.0)
        result = sorted([f["id"], f["kind"], bool(f.get("repaired"))] for f in report["findings"])
    """)
    assert_bounded(found)
    assert found["result"] == [["child", "mailbox-damaged", False], ["root", "mailbox-damaged", False]]
    assert {s: mailbox_bytes(st, s) for s in ("child", "root")} == before


def test_where_the_mailbox_data_ends_is_read_in_bounded_memory(tree):
    """What a watcher polls (``mailbox_data_end``): the stray byte's end, found from the file's last blocks."""
    st = tree
    found = measured(st, """
        from subagents.store.mailbox_read import mailbox_data_end
        result = [mailbox_data_end(st, s) for s in ("child", "root")]
    """)
    assert_bounded(found)
    assert found["result"] == [EXTENDED + 1, EXTENDED + 1]


def test_a_whole_frame_before_a_hole_is_corruption_whatever_its_length(tmp_path):
    """The bounded read stops at the frame where the records stop; a frame announcing more than the
    store's limit is not read whole then. Its bytes still lie inside the data (a stray byte follows
    them), so it was written whole and changed since: corruption, as the whole read said, never the
    cut-short frame of a torn acceptance that the next acceptance would cut."""
    st = store.Store(tmp_path / "store", durability="none", max_record_bytes=64 << 10)
    store.create_session(st, "root", created_at=OLD)
    store.accept(st, "root", source=USER, content="kept", ids=store.IdGenerator())
    path = st.path("root", "mailbox")
    end = store.read_mailbox(st, "root")[0].end
    with open(path, "r+b") as handle:
        handle.seek(end)
        handle.write(FRAME.pack(1 << 20, 12345) + b"\x81" + b"y" * 100)  # 1 MiB announced: over the limit
        handle.seek(end + (8 << 20))  # its announced bytes end before this: data, then a hole
        handle.write(b"x")
    with pytest.raises(store.CorruptSessionError):
        store.read_mailbox(st, "root")
    with pytest.raises(store.CorruptSessionError):
        store.accept(st, "root", source=USER, content="never", ids=store.IdGenerator())
    assert os.path.getsize(path) == end + (8 << 20) + 1


def test_a_torn_acceptance_before_zeros_is_still_cut(tmp_path):
    """The other side of the rule, through the same bounded read: a cut-short last frame, then only
    zeros however far the file was extended, is the torn tail an acceptance cuts and writes over."""
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "root", created_at=OLD)
    ids = store.IdGenerator()
    store.accept(st, "root", source=USER, content="kept", ids=ids)
    path = st.path("root", "mailbox")
    end = store.read_mailbox(st, "root")[0].end
    torn = encode_record({"seq": 1, "id": "x" * 26, "ts": 1.0, "source": USER, "content": "z" * 5000, "wake": True})
    with open(path, "r+b") as handle:
        handle.seek(end)
        handle.write(torn[:3000])  # its first page only
    os.truncate(path, EXTENDED)  # zeros, a hole, no stray byte
    assert [m.content for m in store.read_mailbox(st, "root")] == ["kept"]
    store.accept(st, "root", source=USER, content="next", ids=ids)
    assert [m.content for m in store.read_mailbox(st, "root")] == ["kept", "next"]
