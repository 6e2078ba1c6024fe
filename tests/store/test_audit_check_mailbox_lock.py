"""Audit: ``check_store`` raises when a session it reads is collected while it confirms mailbox damage.

``check_store`` "never raises for what it finds". Since 2c0bf43 it reads a mailbox with ``scan_mailbox``,
which, at damage that is no torn tail, opens the session's lock and re-reads under it. ``gc`` collects a
session under that same lock: it locks the session's file, renames it into the trash, and lets go. A
check whose confirmation waited for that lock then finds the session gone: ``SessionLock.acquire`` raises
``SessionNotFoundError``, which nothing in ``check`` catches (a session gone at ``inspect`` is counted as
``vanished``). The gc below is the rename ``store/retention.py`` does, under the lock, done by hand.
"""

from __future__ import annotations

import os
import threading
import time


from subagents import store
from subagents.store.check import check_store
from subagents.store.session_file import SessionLock

from ._support import CONTINUABLE, make_child, read_file, write_file


def _descriptors_on(path: str) -> int:
    """How many descriptors of this process are open on ``path`` (a reader waiting for its lock keeps one:
    the wait is polled, ``locks.flock_within``, so ``/proc/locks`` shows no waiter)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            pass
    return count


def test_check_store_does_not_raise_when_gc_collects_a_session_whose_mailbox_it_confirms(st):
    store.create_session(st, "p")
    make_child(st, "p", "c", descriptor=CONTINUABLE)
    ids = store.IdGenerator()
    for text in ("one", "two"):
        store.accept(st, "c", source={"kind": "user"}, content=text, ids=ids)
    mailbox = st.path("c", "mailbox")
    data = bytearray(read_file(mailbox))
    data[20] ^= 0x5A  # the first record's payload: a whole frame that fails, a record after it
    write_file(mailbox, bytes(data))
    session_path = st.session_path("c")
    gc_lock = SessionLock("c", session_path)
    gc_lock.acquire()
    outcome: list[object] = []

    def check() -> None:
        try:
            outcome.append(check_store(st))
        except BaseException as exc:  # noqa: BLE001 - the finding
            outcome.append(exc)

    thread = threading.Thread(target=check)
    thread.start()
    deadline = time.monotonic() + 20
    while _descriptors_on(session_path) < 2 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # ours (gc's lock) and the one check waits on
    time.sleep(0.05)  # past its first attempt at the lock
    assert thread.is_alive(), f"check ended without waiting for the session lock: {outcome}"
    trash = os.path.join(st.trash_dir, "c." + "ab" * 4)
    os.makedirs(trash)  # the folder gc renames into
    os.rename(session_path, os.path.join(trash, "session"))  # gc: the session is gone from this rename on
    gc_lock.release()
    gc_lock.close()
    thread.join(timeout=20)
    assert not thread.is_alive()
    [result] = outcome
    assert not isinstance(result, BaseException), repr(result)
