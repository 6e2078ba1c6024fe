"""The session lock: one ``flock`` on ``sessions/<id>/.lock``, shared by every critical section."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from subagents.store.locks import SessionFlock, file_lock

from ._support import REPO_ROOT

WAITER = """
import sys
from subagents.store.locks import SessionFlock
lock = SessionFlock(sys.argv[1])
print("waiting", flush=True)
lock.acquire()
print("got it", flush=True)
lock.release()
"""


def acquire_in_thread(lock: SessionFlock) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def run() -> None:
        lock.acquire()
        got.set()
        lock.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def test_a_waiter_stopped_in_the_queue_blocks_nobody(tmp_path):
    """A writer frozen (SIGSTOP) while it waits for the lock must not keep others out once the
    holder releases: a taken-over owner can be frozen anywhere, and the new owner must go on.
    (A turnstile lock held by waiters, tried in an earlier version for fairness, failed this.)"""
    path = str(tmp_path / ".lock")
    holder, other = SessionFlock(path), SessionFlock(path)
    holder.acquire()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, path], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "waiting"
        time.sleep(0.2)  # let it block in acquire
        os.kill(waiter.pid, signal.SIGSTOP)
        _, status = os.waitpid(waiter.pid, os.WUNTRACED)  # stopped while still waiting, not holding
        assert os.WIFSTOPPED(status)
        holder.release()
        thread, got = acquire_in_thread(other)
        assert got.wait(5), "a stopped waiter kept the lock from everybody else"
        thread.join(5)
    finally:
        os.kill(waiter.pid, signal.SIGCONT)
        waiter.wait(10)  # it takes the lock once ``other`` let go, then exits
        holder.close()
        other.close()
    assert waiter.returncode == 0
    assert os.listdir(tmp_path) == [".lock"]


def test_session_flock_and_filelock_exclude_each_other(tmp_path):
    """Both are flock on the same file: filelock's holder keeps a SessionFlock out and the reverse."""
    path = str(tmp_path / ".lock")
    lock = SessionFlock(path)
    try:
        with file_lock(path):
            thread, got = acquire_in_thread(lock)
            assert not got.wait(0.3), "SessionFlock and filelock did not exclude each other"
        assert got.wait(5)
        thread.join(5)
        lock.acquire()
        other = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
        lock.release()
    finally:
        lock.close()
