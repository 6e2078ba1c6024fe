"""A reader's second look under the session lock never waits forever for a stuck holder.

Readers without the lock read damage that may be an append in flight again under the session lock
(``inspect``, ``scan_mailbox``, a listing row). A holder that never lets go (a process
stopped mid-append) must not hang ``show``, ``check`` or a listing: the wait is bounded like every
lock wait of the store that reports a stuck peer (``LOCK_TIMEOUT_S``), then ``LockTimeoutError``
(a listing row: a diagnostic).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from subagents import store
from subagents.store import locks
from subagents.store.check import check_store
from subagents.store.errors import LockTimeoutError
from subagents.store.session_file import SessionLock

from ..session_bytes import log_start
from ._support import CONTINUABLE, make_child
from .test_settled_mtime import TURN, flip


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread; fails the test, instead of hanging it, when it does not return in time."""
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader waited for the session lock without bound"
    if "error" in got:
        raise got["error"]
    return got["value"]


@pytest.fixture
def held_corrupt(st, monkeypatch):
    """A child whose log and mailbox are damaged (a committed turn after the damage), its lock held by a stuck holder."""
    monkeypatch.setattr(locks, "LOCK_TIMEOUT_S", 0.2)
    store.create_session(st, "r")
    make_child(st, "r", "c", descriptor=CONTINUABLE)
    ids = store.IdGenerator()
    for text in ("one", "two"):
        store.accept(st, "c", source={"kind": "user"}, content=text, ids=ids)
    with store.LogWriter.open(st, "c", epoch=0) as writer:
        writer.append(TURN, commit=True)
        writer.append(TURN, commit=True)
    found = store.inspect(st, "c")
    flip(st, "c", log_start(st, "c") + found.offsets[1] + 12)  # inside the first turn: a turn/end follows
    with open(st.path("c", "mailbox"), "r+b") as handle:  # inside the first message: the second follows
        handle.seek(12)
        byte = handle.read(1)
        handle.seek(12)
        handle.write(bytes([byte[0] ^ 0xFF]))
    holder = SessionLock("c", st.session_path("c"))
    holder.acquire()
    yield st
    holder.release()
    holder.close()


def test_inspect_gives_up_waiting_for_a_stuck_holder(held_corrupt):
    with pytest.raises(LockTimeoutError):
        _within(10, lambda: store.inspect(held_corrupt, "c"))


def test_a_mailbox_reader_gives_up_waiting_for_a_stuck_holder(held_corrupt):
    with pytest.raises(LockTimeoutError):
        _within(10, lambda: store.read_mailbox(held_corrupt, "c"))


def test_a_listing_gives_the_child_a_diagnostic_instead_of_waiting(held_corrupt):
    rows = _within(10, lambda: store.list_children(held_corrupt, "r"))
    assert [(row.id, row.kind) for row in rows] == [("c", "diagnostic")]


def test_check_reports_the_session_unreadable_instead_of_waiting(held_corrupt):
    report = _within(10, lambda: check_store(held_corrupt))
    kinds = {v.kind for v in report.violations if v.session_id == "c"}
    assert "unreadable" in kinds and "header-corrupt" not in kinds, report.violations
