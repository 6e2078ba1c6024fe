"""Shared fixtures of the supervisor, worker and crash tests.

Every test owns its store under ``tmp_path``. A supervisor is opened with a
small pool (``pool_size`` 1 or 2) and ``durability="none"`` unless the test is
about durability. Waits never sleep to synchronize: ``wait_until`` polls a
condition (usually a file the worker writes) under an ``anyio.fail_after``
deadline, so a regression fails instead of hanging.

Worker processes import helper programs by module path
(``"tests.programs_for_tests:name"``): the repository root is put on
``sys.path`` (and ``PYTHONPATH``, inherited by forkserver/spawn workers)
before any pool starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
_pythonpath = os.environ.get("PYTHONPATH", "")
if REPO_ROOT not in _pythonpath.split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, _pythonpath) if p)

from subagents.store import Store, inspect  # noqa: E402
from subagents.store.root import COMPANIONS  # noqa: E402
from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig  # noqa: E402

DEADLINE_S = 20.0  # a generous per-wait deadline: a hang fails, a pass never comes near it
HELPERS = "tests.programs_for_tests"


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (pyproject's addopts) that also holds under pytest 9.

    xdist groups ``xdist_group`` tests by a suffix it writes into each node id,
    which pytest 9 no longer lets it change; then the Ray tests spread over
    every worker and each starts its own simulated cluster (~1 GiB, two cores'
    worth of processes). Here every test under ``tests/ray/`` is one unit, run
    by one worker, so one cluster exists at a time; other tests stay units of
    one, as under ``--dist load``.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneRayCluster(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/ray/"):
                return "tests/ray"
            return super()._split_scope(nodeid)

    return OneRayCluster(config, log)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def helper(name: str) -> str:
    """The import path of a program in ``tests/programs_for_tests.py``."""
    return f"{HELPERS}:{name}"


def all_providers() -> list[Provider]:
    """``echo`` and ``script`` with every capability, and the helper programs by name."""
    caps = Capabilities.all()
    return [
        Provider(name="echo", program="echo", capabilities=caps),
        Provider(name="script", program="script", capabilities=caps),
        Provider(name="refuse", program=helper("refuse"), capabilities=caps),
        Provider(name="max-tokens", program=helper("max_tokens"), capabilities=caps),
        Provider(name="huge-fail", program=helper("huge_fail"), capabilities=caps),
        Provider(name="pid", program=helper("pid"), capabilities=caps),
        Provider(name="pid-then-sleep", program=helper("pid_then_sleep"), capabilities=caps),
        Provider(name="cpu-pid", program=helper("cpu_then_pid"), capabilities=caps),
        Provider(name="tool-names", program=helper("tool_names"), capabilities=caps),
        Provider(name="blocking", program=helper("blocking_program"), capabilities=caps),
    ]


@asynccontextmanager
async def open_supervisor(tmp_path: Path, *, pool_size: int = 1, durability: str = "none", providers: bool = True, **config: Any) -> AsyncIterator[Supervisor]:
    """A supervisor over ``tmp_path/store`` with the test providers registered."""
    cfg = SupervisorConfig(pool_size=pool_size, durability=durability, **config)
    async with Supervisor.open(store=tmp_path / "store", config=cfg) as sup:
        if providers:
            for provider in all_providers():
                sup.register_provider(provider)
        yield sup


async def wait_until(predicate: Callable[[], Any | Awaitable[Any]], *, timeout: float = DEADLINE_S, what: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; fail after ``timeout``."""
    try:
        with anyio.fail_after(timeout):
            while True:
                value = predicate()
                if isinstance(value, Awaitable):
                    value = await value
                if value:
                    return value
                await anyio.sleep(0.005)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout}s waiting for {what}")


def events_of(st: Store, session_id: str) -> list[dict[str, Any]]:
    """The valid event prefix of a session's log (read-only)."""
    return inspect(st, session_id).events


def types_of(st: Store, session_id: str) -> list[str]:
    return [e["type"] for e in events_of(st, session_id)]


def last_turn_end(st: Store, session_id: str) -> dict[str, Any]:
    ends = [e for e in events_of(st, session_id) if e["type"] == "turn/end"]
    assert ends, f"no turn/end in {session_id}"
    return ends[-1]["data"]


def said(st: Store, session_id: str) -> list[str]:
    """The texts of ``assistant/message`` events, in log order."""
    return [e["data"]["text"] for e in events_of(st, session_id) if e["type"] == "assistant/message"]


def disk_snapshot(st: Store) -> tuple[list[str], list[str]]:
    """What exists under ``sessions/`` and ``index/children/`` (sorted names). Companion files
    (``<id>.mailbox`` ...) are left out: messages reach existing sessions while a test runs;
    a creation's leftover temporary file (``.<id>.new.*``) is not."""
    companions = tuple(f".{name}" for name in COMPANIONS)
    names = [name for name in os.listdir(st.sessions_dir) if name.startswith(".") or not name.endswith(companions)]
    return sorted(names), sorted(os.listdir(st.children_index_dir))


@dataclass(frozen=True)
class LiveProcess:
    """One running process, from ``/proc/<pid>/stat``."""

    ppid: int
    session: int
    started: int  # clock ticks since boot: with the pid, names one process, never a later one given its pid


def live_processes() -> dict[int, LiveProcess]:
    """Every process running now, by pid (zombies count as gone)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] not in ("Z", "X"):
            found[int(entry)] = LiveProcess(ppid=int(fields[1]), session=int(fields[3]), started=int(fields[19]))
    return found


def still_running(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids of ``pids`` still running after ``within`` seconds (zombies count as gone); at once when none is."""
    deadline = time.monotonic() + within
    while True:
        running = [pid for pid in pids if pid in live_processes()]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def kill_leftover_sleeps(pids: list[int]) -> None:
    """Cleanup after a test whose programs start ``sleep`` (or a shell running one): those of ``pids`` still
    running are killed; a pid that now names another program is left alone."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if not handle.read().startswith((b"sleep", b"sh")):
                    continue
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def session_processes(sid: int) -> list[int]:
    """The processes of session ``sid`` still running (zombies count as gone): what a host started in a session
    of its own (``start_new_session``) left behind, its workers and its cluster's processes."""
    return [pid for pid, process in live_processes().items() if process.session == sid]


def started_child(st: Path, *, timeout: float = DEADLINE_S, proc: "subprocess.Popen[str] | None" = None) -> str:
    """The child of the store at ``st`` whose turn has begun (it said something), as another process writes it;
    fails after ``timeout``, or at once when ``proc`` (that process) has exited (its stderr said)."""
    from subagents import store as store_api

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            opened = Store(st, create=False)
            for session in opened.session_ids():
                if any(e["type"] == "assistant/message" for e in inspect(opened, session).events):
                    return session
        except store_api.SubagentError:
            pass
        time.sleep(0.05)
    if proc is not None:
        proc.kill()
        pytest.fail(f"the turn never started: {proc.communicate()[1][-2000:]}")
    pytest.fail("the turn never started")
