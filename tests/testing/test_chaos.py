"""``Chaos`` (issue 16): real signals to real processes at seeded times, every action recorded with its seed."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from subagents.testing import Chaos, processes

DEADLINE_S = 20.0


def sleepers(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(n)]


def state_of(pid: int) -> str:
    """The process state letter from /proc (``T``: stopped), ``-`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "-"


def run_until(chaos: Chaos, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    with chaos:
        while sum(a.action != "cont" for a in chaos.actions) < count and time.monotonic() < deadline:
            time.sleep(0.005)  # polling the chaos thread's record, under a deadline
    assert sum(a.action != "cont" for a in chaos.actions) >= count, chaos.summary()


@pytest.fixture
def procs():
    started = sleepers(4)
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_kills_and_stops_are_real_and_logged(procs, caplog) -> None:
    """Killed processes die of SIGKILL; stopped ones are continued by the end; each action is logged with its seed."""
    caplog.set_level(logging.WARNING, logger="subagents.testing.chaos")
    chaos = Chaos({"sleeper": processes(*procs)}, seed=11, interval_s=(0.01, 0.04), stop_for_s=(0.01, 0.05), max_actions=5)
    run_until(chaos, 5)
    kills = [a for a in chaos.actions if a.action == "kill"]
    stops = [a for a in chaos.actions if a.action == "stop"]
    assert kills and stops, chaos.summary()
    for action in kills:
        proc = next(p for p in procs if p.pid == action.pid)
        assert proc.wait(timeout=DEADLINE_S) == -9
    for action in stops:
        assert any(a.action == "cont" and a.pid == action.pid for a in chaos.actions), f"{action} never continued"
    assert all(state_of(p.pid) not in ("T", "t") for p in procs if p.poll() is None), "a process was left stopped"
    logged = [r.getMessage() for r in caplog.records]
    assert all(any(str(a) == m for m in logged) for a in chaos.actions)
    assert all("seed=11" in m for m in logged)


def test_one_seed_replays_the_same_draws() -> None:
    """Two runs with one seed over identical process sets hit the same positions with the same actions."""
    runs = []
    for _ in range(2):
        group = sleepers(4)
        try:
            order = sorted(p.pid for p in group)
            chaos = Chaos({"sleeper": processes(*group)}, seed=1234, interval_s=(0.005, 0.01), actions=("kill",), max_actions=3)
            run_until(chaos, 3)
            runs.append([(a.action, a.target, order.index(a.pid)) for a in chaos.actions])
        finally:
            for proc in group:
                proc.kill()
                proc.wait()
    assert runs[0] == runs[1]


def test_never_signals_its_own_process() -> None:
    import os

    chaos = Chaos(lambda: [os.getpid()], seed=3, interval_s=(0.001, 0.002), actions=("kill",))
    with chaos:
        time.sleep(0.05)  # the chaos runs for this long: nothing may happen
    assert chaos.actions == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Chaos({}, seed=1)
    with pytest.raises(ValueError):
        Chaos(lambda: [], actions=("explode",))  # type: ignore[arg-type]
