"""A public call behind a stopped process that holds a child's file lock ends at its caller's deadline.

A real process takes the ``flock`` on the child's session file (as any writer's
critical section does) and stops itself with SIGSTOP: nothing outside can break
that lock. A follow-up under ``fail_after`` must end at its deadline with
nothing accepted, one without a deadline after the lock timeout with
``LOCK_TIMEOUT`` (the timeout shortened here), and the child must take the
next message once the holder is gone (``supervisor/lock_wait.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import anyio
import pytest

from subagents.store import read_mailbox
from subagents.supervisor import SubagentError, Supervisor, UserAuthority

from .test_continuable import S, continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio

HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""

# a followup the fix does not bound returns only once this watchdog kills the holder: the test then
# fails on the time it took, and on the message it accepted, rather than hanging the suite
WATCHDOG_S = 8.0


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] == "T"


@contextmanager
def stopped_holder(path: str) -> Iterator[subprocess.Popen[str]]:
    """A process that holds ``path``'s ``flock`` and is stopped (SIGSTOP); killed on exit, or by a watchdog."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(WATCHDOG_S, proc.kill)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        deadline = time.monotonic() + 10
        while not _stopped(proc.pid):
            assert time.monotonic() < deadline, "the holder never stopped"
            time.sleep(0.01)
        watchdog.start()
        yield proc
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def accepted_contents(sup: Supervisor, child_id: str) -> list[str]:
    return [m.content for m in read_mailbox(sup.store, child_id)]


async def busy_child(sup: Supervisor) -> tuple[Any, str]:
    """A resident continuable child in a long turn (its follow-ups go to its open mailbox)."""
    root = await sup.open_root()
    child_id, _ = await start(sup, root, S({"sleep": 60_000}, {"return": "t0"}))
    return root, child_id


async def test_a_followup_behind_a_stopped_lock_holder_ends_at_its_callers_deadline(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root, child_id = await busy_child(sup)
        with stopped_holder(sup.store.session_path(child_id)):
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                with anyio.fail_after(1.0):
                    await sup.followup(root, child_id, S({"return": "never"}))
            took = time.monotonic() - began
            with anyio.move_on_after(0.5) as scope:
                await sup.followup(root, child_id, S({"return": "never either"}))
            assert scope.cancelled_caught
        assert took < 3.0, f"the follow-up took {took:.1f} s past a 1 s deadline"
        assert not [c for c in accepted_contents(sup, child_id) if "never" in c]
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await sup.followup(root, child_id, S({"return": "after"}))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.endswith("\nafter"), notice.content
        assert not [c for c in accepted_contents(sup, child_id) if "never" in c]


async def test_a_followup_with_no_deadline_behind_a_stopped_lock_holder_says_lock_timeout(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("subagents.supervisor.lock_wait.LOCK_TIMEOUT_S", 0.5)
    async with continuable_supervisor(tmp_path) as sup:
        root, child_id = await busy_child(sup)
        with stopped_holder(sup.store.session_path(child_id)):
            began = time.monotonic()
            with pytest.raises(SubagentError) as caught:
                await sup.followup(root, child_id, S({"return": "never"}))
            took = time.monotonic() - began
        assert caught.value.code == "LOCK_TIMEOUT", caught.value
        assert took < 3.0, f"the follow-up took {took:.1f} s past a 0.5 s lock timeout"
        assert not [c for c in accepted_contents(sup, child_id) if "never" in c]
        await sup.interrupt(child_id, authority=UserAuthority(root.id))


def test_a_holder_that_is_not_stopped_only_delays_a_bounded_acceptance(tmp_path) -> None:
    """The bounded wait polls: a holder that lets go within the bound is waited for, and the message accepted."""
    from subagents import store
    from subagents.store import IdGenerator
    from subagents.store.mailbox import accept

    st = store.Store(tmp_path / "store")
    store.create_session(st, "c")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.replace("os.kill(os.getpid(), signal.SIGSTOP)", "import time; time.sleep(0.3)"),
                             st.session_path("c")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        began = time.monotonic()
        message_id = accept(st, "c", source={"kind": "user"}, content="hello", ids=IdGenerator(), lock_timeout=5.0)
        waited = time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()
    assert [m.id for m in read_mailbox(st, "c")] == [message_id]
    assert 0.1 < waited < 5.0, waited


def test_a_control_request_behind_a_stopped_lock_holder_writes_nothing(tmp_path) -> None:
    from subagents import store
    from subagents.store import IdGenerator, LockTimeoutError
    from subagents.store.control import read_controls, request

    st = store.Store(tmp_path / "store")
    store.create_session(st, "c")
    with stopped_holder(st.session_path("c")):
        began = time.monotonic()
        with pytest.raises(LockTimeoutError):
            request(st, "c", "interrupt", {"reason": "user"}, ids=IdGenerator(), lock_timeout=0.3)
        took = time.monotonic() - began
    assert took < 2.0, took
    assert read_controls(st, "c") == []
    assert not os.path.exists(st.path("c", "control")) or os.path.getsize(st.path("c", "control")) == 0
