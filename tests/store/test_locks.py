"""The session lock: one ``flock`` on the session's file ``sessions/<id>``, shared by every critical section.

Appends to the log and lease updates (``SessionFile.lock``), appends to the
companion files (``SessionLock``), and lease acquisition and ``gc``
(``pin_flock``, polled) all take it, and no lock file is ever made for it.
A waiter frozen in the queue blocks nobody; a waiter whose session ``gc``
moved to the trash meanwhile finds it gone and writes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

import pytest

from subagents import store
from subagents.store import locks
from subagents.store.session_file import SessionFile, SessionLock

from ..session_bytes import file_bytes
from ._support import ONE_SHOT, REPO_ROOT

WAITER = """
import sys
from subagents.store.session_file import SessionFile
file = SessionFile.open("s1", sys.argv[1], write=True)
print("waiting", flush=True)
file.lock()
print("got it", flush=True)
file.unlock()
"""


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    done, errors = threading.Event(), []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # recorded for the caller's assertions
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, errors


def held(st: store.Store, sid: str) -> SessionFile:
    """The session's lock, held through its file the way a log writer holds it."""
    file = SessionFile.open(sid, st.session_path(sid), write=True)
    file.lock()
    return file


def test_a_waiter_stopped_in_the_queue_blocks_nobody(st):
    """A writer frozen (SIGSTOP) while it waits for the lock must not keep others out once the
    holder releases: a taken-over owner can be frozen anywhere, and the new owner must go on.
    (A turnstile lock held by waiters, tried in an earlier version for fairness, failed this.)"""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    holder = held(st, "s1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, st.session_path("s1")], stdout=subprocess.PIPE, text=True, env=env)
    writer = None
    try:
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "waiting"
        time.sleep(0.2)  # let it block in flock
        os.kill(waiter.pid, signal.SIGSTOP)
        _, status = os.waitpid(waiter.pid, os.WUNTRACED)  # stopped while still waiting, not holding
        assert os.WIFSTOPPED(status)
        holder.unlock()
        writer = store.LogWriter.open(st, "s1", epoch=0)
        thread, done, errors = in_thread(lambda: writer.append([("turn/start", {})]))
        assert done.wait(5) and not errors, "a stopped waiter kept the lock from everybody else"
        thread.join(5)
    finally:
        os.kill(waiter.pid, signal.SIGCONT)
        waiter.wait(10)  # it takes the lock once the writer let go, then exits
        holder.close()
        if writer is not None:
            writer.close()
    assert waiter.returncode == 0
    assert os.listdir(st.sessions_dir) == ["s1"]  # no lock file: the lock is the session's file


def test_every_critical_section_of_a_session_takes_its_one_lock(st, monkeypatch):
    """Held through the session's file, the lock keeps out an append to the log, a lease update, an
    acceptance into the mailbox and a control request; a lease acquisition (polled) times out.
    Each goes on once it is released."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    store.register_owner(st, "o1", ttl=60)
    lease = store.acquire_lease(st, "s1", "o1")
    writer = store.LogWriter.open(st, "s1", epoch=lease.epoch)
    ids = store.IdGenerator()
    calls = {
        "append": lambda: writer.append([("turn/start", {})]),
        "lease-update": lambda: store.set_lease_state(st, "s1", "o1", lease.epoch, "idle"),
        "accept": lambda: store.accept(st, "s1", source={"kind": "user"}, content="hi", ids=ids),
        "request": lambda: store.request(st, "s1", "interrupt", {}, ids=ids),
    }
    try:
        for name, call in calls.items():
            holder = held(st, "s1")
            try:
                before = file_bytes(st, "s1")
                thread, done, errors = in_thread(call)
                assert not done.wait(0.3), f"{name} ran while the session's lock was held"
                assert file_bytes(st, "s1") == before
            finally:
                holder.close()
            assert done.wait(10) and not errors, (name, errors)
            thread.join(5)
        monkeypatch.setattr(locks, "LOCK_TIMEOUT_S", 0.05)
        holder = SessionLock("s1", st.session_path("s1"))
        with holder:
            with pytest.raises(store.LockTimeoutError):
                store.acquire_lease(st, "s1", "o1")
        holder.close()
    finally:
        writer.close()
    assert [e["type"] for e in store.inspect(st, "s1").events] == ["subagent/descriptor", "turn/start"]
    assert store.read_lease(st, "s1").state == "idle" and len(store.read_mailbox(st, "s1")) == 1


@pytest.mark.parametrize("what", ["accept", "request", "lease-update", "acquire"])
def test_a_waiter_whose_session_gc_moved_finds_it_gone_and_writes_nothing(st, what):
    """A caller that waited on the lock while ``gc`` moved the session's file to the trash gets
    SESSION_NOT_FOUND: it writes nothing into the trashed file, and makes no companion beside a
    session that no longer exists."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    store.register_owner(st, "o1", ttl=60)
    lease = store.acquire_lease(st, "s1", "o1")
    ids = store.IdGenerator()
    call = {
        "accept": lambda: store.accept(st, "s1", source={"kind": "user"}, content="late", ids=ids),
        "request": lambda: store.request(st, "s1", "interrupt", {}, ids=ids),
        "lease-update": lambda: store.set_lease_state(st, "s1", "o1", lease.epoch, "idle"),
        "acquire": lambda: store.acquire_lease(st, "s1", "o1"),
    }[what]
    holder = held(st, "s1")
    trashed = os.path.join(st.root, "elsewhere")
    try:
        before = file_bytes(st, "s1")
        thread, done, errors = in_thread(call)
        assert not done.wait(0.3)
        os.rename(st.session_path("s1"), trashed)  # what gc does under the lock
    finally:
        holder.close()
    assert done.wait(10)
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], store.SessionNotFoundError), errors
    with open(trashed, "rb") as handle:
        assert handle.read() == before
    assert os.listdir(st.sessions_dir) == []
