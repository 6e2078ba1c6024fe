"""The session lock: flock for exclusion, an OFD byte lock on the same file as the fair turnstile."""

from __future__ import annotations

import fcntl
import os
import struct
import threading

import pytest

from store.locks import SessionFlock, file_lock

pytestmark = pytest.mark.skipif(not hasattr(fcntl, "F_OFD_SETLKW"), reason="no OFD locks on this platform")

BYTE0 = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
UNLOCK0 = struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, 0, 1, 0)


def acquire_in_thread(lock: SessionFlock) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def run() -> None:
        lock.acquire()
        got.set()
        lock.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def test_a_queued_waiter_holds_back_a_fair_acquirer(tmp_path):
    """While someone holds the turnstile (a waiter queued for the lock), a fair acquire waits
    even though the flock itself is free; an unfair one does not. No second lock file exists."""
    path = str(tmp_path / ".lock")
    fair, unfair = SessionFlock(path, fair=True), SessionFlock(path)
    queued = os.open(path, os.O_RDWR)
    try:
        fcntl.fcntl(queued, fcntl.F_OFD_SETLKW, BYTE0)
        thread, got = acquire_in_thread(unfair)
        assert got.wait(5), "an unfair acquire waited for the turnstile"
        thread.join(5)
        thread, got = acquire_in_thread(fair)
        assert not got.wait(0.3), "a fair acquire passed a queued waiter"
        fcntl.fcntl(queued, fcntl.F_OFD_SETLKW, UNLOCK0)
        assert got.wait(5)
        thread.join(5)
    finally:
        os.close(queued)
        fair.close()
        unfair.close()
    assert os.listdir(tmp_path) == [".lock"]


def test_the_fair_lock_and_filelock_exclude_each_other(tmp_path):
    """The turnstile adds to the flock, it does not replace it: filelock's holder keeps a fair
    acquirer out, and a fair holder keeps out any other flock of the file."""
    path = str(tmp_path / ".lock")
    fair = SessionFlock(path, fair=True)
    try:
        with file_lock(path):
            thread, got = acquire_in_thread(fair)
            assert not got.wait(0.3), "the fair lock and filelock did not exclude each other"
        assert got.wait(5)
        thread.join(5)
        fair.acquire()
        other = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
        fair.release()
    finally:
        fair.close()
