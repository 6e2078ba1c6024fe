"""A settled row records its file's modification time: damage in place is read, not listed healthy.

Audit: a settled child was listed from its row after one ``lstat`` that only
checked the file's type and length, so bytes of its header or of a committed
log record overwritten in place (same size) still listed as ``complete`` with
its outcome, while every read of it found it corrupt. The row now carries
``mtime_ns`` (the file's ``st_mtime_ns`` after the release's last write);
the same ``lstat`` compares it, and a file written since is read the slow
way, which finds the damage. A changed time alone is no damage.

How a test knows a child was listed from its row and not from its file: the
row is edited to say something its file does not (a made-up error), which
only a listing that did not read the file can show (``check`` calls such a
row a lie: ``test_catalog_rows.py``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from subagents import store
from subagents.store.check import check_store
from subagents.store.framing import FRAME, encode_record, scan
from subagents.store.lease import write_released

from ..session_bytes import HEADER_AT, log_start, patch
from ._support import ONE_SHOT, make_child, read_file, write_file

TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]
LIE = {"outcome": "error", "error_code": "MADE_UP", "error": "MADE_UP: only the row says so"}


@pytest.fixture
def owner(st: store.Store) -> str:
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    return owner


def settle(st: store.Store, parent: str, child: str, owner: str, *, through_writer: bool) -> None:
    """A child run and released as a supervisor does: created leased, one turn at epoch 1, released by
    ``release_lease`` or by its log writer (``write_released``, the worker's way)."""
    make_child(st, parent, child, descriptor=ONE_SHOT, lease_owner=owner)
    with store.LogWriter.open(st, child, epoch=1) as writer:
        writer.append(TURN, commit=True)
        if through_writer:
            writer.release_lease(owner, write_released)
    if not through_writer:
        store.release_lease(st, child, owner, 1)


@pytest.fixture(params=["release_lease", "log writer"])
def family(request, st: store.Store, owner: str) -> list[str]:
    """Children a, b, c of ``r``, settled; each has its ``settled`` row."""
    store.create_session(st, "r")
    for child in ("a", "b", "c"):
        settle(st, "r", child, owner, through_writer=request.param == "log writer")
    assert all(e.settled is not None for e in store.read_children(st, "r"))
    return ["a", "b", "c"]


def index_records(st: store.Store, parent: str) -> list[dict[str, Any]]:
    return scan(read_file(st.children_index_path(parent))).records


def rewrite_rows(st: store.Store, parent: str, edit) -> None:
    """Rewrite ``parent``'s index with ``edit(record)`` applied to every ``settled`` record."""
    records = [edit(dict(r)) if r.get("state") == "settled" else r for r in index_records(st, parent)]
    write_file(st.children_index_path(parent), b"".join(encode_record(r) for r in records))


def flip(st: store.Store, session_id: str, offset: int) -> None:
    """Invert one byte of the session's file in place: same size, same inode."""
    with open(st.session_path(session_id), "rb") as handle:
        handle.seek(offset)
        byte = handle.read(1)
    size = os.path.getsize(st.session_path(session_id))
    patch(st, session_id, offset, bytes([byte[0] ^ 0xFF]))
    assert os.path.getsize(st.session_path(session_id)) == size


def record_offset(st: store.Store, session_id: str, kind: str) -> int:
    """The file offset of a byte inside the payload of the log's committed ``kind`` record."""
    found = store.inspect(st, session_id)
    [seq] = [e["seq"] for e in found.events if e["type"] == kind]
    return log_start(st, session_id) + found.offsets[seq] + FRAME.size + 4


def test_the_release_records_the_files_modification_time_after_its_last_write(st, family):
    """``mtime_ns`` is the file's time as the release left it: the next listing takes the fast path."""
    for entry in store.read_children(st, "r"):
        assert entry.settled.mtime_ns == os.lstat(st.session_path(entry.id)).st_mtime_ns
    assert [r.get("mtime_ns") for r in index_records(st, "r") if r.get("state") == "settled"] == [
        os.lstat(st.session_path(c)).st_mtime_ns for c in family]


def test_a_settled_child_untouched_since_its_release_is_listed_from_its_row(st, family):
    """The fast path still holds: a row edited to lie is what the listing shows (its file was not read)."""
    rewrite_rows(st, "r", lambda r: {**r, **LIE})
    rows = store.list_children(st, "r")
    assert [(r.kind, r.outcome, r.error_code) for r in rows] == [("child", "error", "MADE_UP")] * 3


def test_a_file_written_since_its_release_is_read_and_its_time_alone_is_no_damage(st, family):
    """A file whose time moved (a write the row does not know of) costs a read of its files, which
    say what the child is: healthy here, and ``check`` calls its row true."""
    info = os.lstat(st.session_path("b"))
    os.utime(st.session_path("b"), ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    assert check_store(st).clean, check_store(st).violations
    rewrite_rows(st, "r", lambda r: {**r, **LIE})
    rows = store.list_children(st, "r")
    assert [(r.id, r.kind, r.outcome, r.error_code) for r in rows] == [
        ("a", "child", "error", "MADE_UP"), ("b", "child", "completed", None), ("c", "child", "error", "MADE_UP")]


@pytest.mark.parametrize("where", ["header", "log record"])
def test_a_settled_child_damaged_in_place_lists_as_corrupt_and_its_siblings_stay_healthy(st, family, where):
    """The audit's case: a byte of the header, or of a committed log record, flipped in place (same size)."""
    before = store.list_children(st, "r")
    assert [r.kind for r in before] == ["child"] * 3
    offset = HEADER_AT + 8 + 3 if where == "header" else record_offset(st, "b", "assistant/message")
    flip(st, "b", offset)
    expected = [before[0], store.DiagnosticEntry("b", "corrupt"), before[2]]
    assert store.list_children(st, "r") == expected
    assert [row.entry for row in store.list_descendants(st, "r")] == expected
    report = check_store(st)
    assert not report.clean and {v.session_id for v in report.violations} == {"b"}, str(report)


def test_an_old_row_without_mtime_is_still_listed_from_the_row(st, family):
    """A ``settled`` row written before rows recorded the time: the listing takes it as before (no time
    to compare: only the file's type and length), and ``check`` reads the missing field as unknown."""
    rewrite_rows(st, "r", lambda r: {k: v for k, v in r.items() if k != "mtime_ns"})
    assert all(e.settled.mtime_ns is None for e in store.read_children(st, "r"))
    assert check_store(st).clean, check_store(st).violations
    os.utime(st.session_path("b"), ns=(0, 1_000_000_000))
    rewrite_rows(st, "r", lambda r: {**r, **LIE})
    assert [(r.kind, r.error_code) for r in store.list_children(st, "r")] == [("child", "MADE_UP")] * 3


def test_a_long_log_damaged_before_its_cached_checkpoint_lists_as_corrupt(st, owner):
    """A log of at least 64 KiB has an identity cache, which vouches for the bytes before its checkpoint
    only as its writer left them: a settled child whose file was written since is folded whole."""
    store.create_session(st, "r")
    settle(st, "r", "a", owner, through_writer=True)
    make_child(st, "r", "b", descriptor=ONE_SHOT, lease_owner=owner)
    long_turn = [("turn/start", {})] + [("assistant/message", {"text": "x" * 2000})] * 40 + [("turn/end", {"stop_reason": "completed"})]
    with store.LogWriter.open(st, "b", epoch=1) as writer:
        writer.append(long_turn, commit=True)
        writer.release_lease(owner, write_released)
    assert os.path.exists(st.path("b", "identity")), "the log is long enough for an identity cache"
    before = store.list_children(st, "r")
    found = store.inspect(st, "b")
    flip(st, "b", log_start(st, "b") + found.offsets[5] + FRAME.size + 4)
    assert store.inspect(st, "b").status == "corrupt"
    assert store.list_children(st, "r") == [before[0], store.DiagnosticEntry("b", "corrupt")]
