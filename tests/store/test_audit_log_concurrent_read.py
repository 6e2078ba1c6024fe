"""Audit: a reader of a session log that does not hold the session lock takes an append in flight for damage.

The mailbox's readers had this defect (12c0fe3, fixed by 2c0bf43 with a confirmation under the session lock).
Its cause is in ``atomic.pread_all``, which every lock-free reader of a whole log uses (``inspect``,
``inspect_file``): one ``pread`` of the size ``fstat`` gave, then more until a read returns nothing. A log
append writes its batch into the zero padding before the file's end and, when it is longer than what is
left of the block, past that end. One landing between the two reads gives a buffer whose first part is
the zeros the first read saw and whose rest is the batch's bytes past the old end, its ``turn/end``
included: ``classify`` reads an all-zero frame header (``undecodable``) followed by a committed ``turn/end``
that chains, ``corrupt``. So while its writer appends turns normally, a healthy running child is read as
corrupt by ``inspect`` (``subagents show`` prints CORRUPT_SESSION and exits 2 for it since 65ef1e7), by
``check_store`` (``log-corrupt``: ``tests/multi/test_check_live.py``'s promise), by ``fsck`` (a ``corrupt`` finding) and by a listing (a
``corrupt`` diagnostic; a listing folds a log through ``pread_all`` while it has no identity cache, and
since 1d566cd whole, whatever its length, when a settled row's file was written since).

Free-running threads (a writer appending 9 KB turns, two readers) reproduced it on every one of 16 runs of
this file alone, and on none under ``-n 2`` beside other tests: the window is the microseconds between the
two reads. So the interleaving is forced here: the reader is held, as a preemption would hold it, right
after ``pread_all``'s first ``pread`` of the child's file returns (a ``sys.setprofile`` hook on that call,
in the reader's own thread), while a real ``LogWriter`` appends one turn; then it reads on. Nothing of the
store is replaced. With ``pread_all`` reading once (the ``fstat`` size), all of them pass.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest

from subagents import store
from subagents.store import atomic
from subagents.store.check import check_store
from subagents.store.fsck import fsck

from ._support import CONTINUABLE, make_child

BODY = "x" * 9000  # a turn's batch is longer than a block: its append extends the file past its padding
TURN = [("turn/start", {}), ("assistant/message", {"text": BODY}), ("turn/end", {"stop_reason": "completed"})]


def _corrupt_by_inspect(st: store.Store) -> str | None:
    found = store.inspect(st, "c")
    return f"inspect: {found.status} {found.damage}" if found.status == "corrupt" else None


def _corrupt_by_listing(st: store.Store) -> str | None:
    bad = [row for row in store.list_children(st, "r") if isinstance(row, store.DiagnosticEntry)]
    return f"list_children: {bad}" if bad else None


def _corrupt_by_check(st: store.Store) -> str | None:
    bad = [v for v in check_store(st).violations if v.kind == "log-corrupt"]
    return f"check_store: {bad}" if bad else None


def _corrupt_by_fsck(st: store.Store) -> str | None:
    bad = [f for f in fsck(st, repair=False, lease_ttl_s=60.0)["findings"] if f["kind"] == "corrupt"]
    return f"fsck: {bad}" if bad else None


def _read_with_an_append_between_reads(read: Callable[[store.Store], str | None], reader: store.Store, path: str,
                                       append: Callable[[], None]) -> str | None:
    """``read(reader)``, with ``append()`` run once, right after the first ``pread`` of ``pread_all`` on ``path``."""
    target = os.stat(path)
    fired: list[bool] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if fired or event != "c_return" or arg is not os.pread or frame.f_code is not atomic.pread_all.__code__:
            return
        info = os.fstat(frame.f_locals["fd"])
        if (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):
            fired.append(True)
            append()

    sys.setprofile(hook)
    try:
        found = read(reader)
    finally:
        sys.setprofile(None)
    assert fired, "the reader never read the child's file through pread_all"
    return found


@pytest.mark.parametrize("read", [_corrupt_by_inspect, _corrupt_by_listing, _corrupt_by_check, _corrupt_by_fsck],
                         ids=["inspect", "list_children", "check_store", "fsck"])
def test_log_readers_never_take_an_append_in_flight_for_damage(tmp_path, read: Callable[[store.Store], str | None]):
    writer_store = store.Store(tmp_path / "store", durability="none")
    reader_store = store.Store(tmp_path / "store", durability="none")
    owner = store.new_id()
    store.register_owner(writer_store, owner, ttl=600.0)
    store.create_session(writer_store, "r")
    make_child(writer_store, "r", "c", descriptor=CONTINUABLE, lease_owner=owner)
    with store.LogWriter.open(writer_store, "c", epoch=1) as writer:
        writer.append(TURN, commit=True)  # the log's data now ends inside a block: zeros, then the file's end
        assert read(reader_store) is None
        found = _read_with_an_append_between_reads(read, reader_store, writer_store.session_path("c"),
                                                   lambda: writer.append(TURN, commit=True))
    assert store.inspect(reader_store, "c").status == "clean"  # the log itself is healthy, two whole turns
    assert read(reader_store) is None
    assert found is None, found
