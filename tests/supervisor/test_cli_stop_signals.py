"""SIGTERM and SIGHUP to a CLI host stop it as Ctrl-C does (found by a probe).

A service manager stops a host with SIGTERM (often to its whole process
group, workers and forkserver included); a closed terminal sends SIGHUP to
its foreground group. Was: the host died at once (exit -15, nothing said),
and its children were left ``crashed`` for the next host to repair. Now the
host aborts its turns (each ends ``aborted``, its lease released) and exits
128 + the signal's number, saying why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from subagents import store
from subagents.store import Store

from ..conftest import started_child
from .test_cli_mistakes import CLI, DEADLINE_S, FAST
from .test_forkserver_death import forkserver_of, gone


@contextmanager
def _host(cwd: Path, prompt: str, *, env: dict[str, str] = FAST, **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """``subagents run script --prompt PROMPT`` on store ``st`` in ``cwd``, in its own session; killed (group) if it outlives the block."""
    proc = subprocess.Popen([*CLI, "--store", "st", "run", "script", "--prompt", prompt], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.parametrize("signum, group, said", [
    (signal.SIGTERM, False, "terminated"),
    (signal.SIGTERM, True, "terminated"),  # as a service manager stops a unit: workers and forkserver too
    (signal.SIGHUP, True, "hung up"),  # a closed terminal: its foreground process group
])
def test_a_stop_signal_aborts_the_turn_and_exits_with_its_number(tmp_path: Path, signum: int, group: bool, said: str) -> None:
    with _host(tmp_path, '{"script": [{"say": "up"}, {"sleep": 60000}]}') as proc:
        child = started_child(tmp_path / "st", timeout=DEADLINE_S)
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        _out, err = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 128 + signum, err
        assert err.strip().splitlines()[-1] == said, err
        assert "died" not in err, err
        ends = [e["data"] for e in store.inspect(Store(tmp_path / "st", create=False), child).events if e["type"] == "turn/end"]
        assert [e["stop_reason"] for e in ends] == ["aborted"], ends


def test_ctrl_c_while_the_forkserver_starts_says_interrupted(tmp_path: Path) -> None:
    """Found by a probe: a Ctrl-C in the host's first second reached the forkserver while it imported the
    worker's modules (it ignores SIGINT only after): a ``KeyboardInterrupt`` traceback from it, then
    ``error: WORKER_START_FAILED`` (exit 2). The forkserver is started with the stop signals ignored."""
    with _host(tmp_path, '{"script": [{"sleep": 60000}]}') as proc:
        deadline = time.monotonic() + DEADLINE_S
        while forkserver_of(proc.pid) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
        _out, err = proc.communicate(timeout=DEADLINE_S)
        assert (proc.returncode, err.strip().splitlines()[-1:]) == (130, ["interrupted"]), err
        assert "Traceback" not in err, err


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_host_started_under_nohup_outlives_a_hangup(tmp_path: Path) -> None:
    """``nohup`` starts a command with SIGHUP ignored so that it outlives its terminal: the CLI keeps it so."""
    with _host(tmp_path, '{"script": [{"say": "up"}, {"sleep": 60000}]}', preexec_fn=_ignore_sighup) as proc:
        started_child(tmp_path / "st", timeout=DEADLINE_S)
        os.killpg(proc.pid, signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)
        proc.terminate()
        _out, err = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 128 + signal.SIGTERM, err


def test_a_second_ctrl_c_quits_without_waiting_for_the_turns(tmp_path: Path) -> None:
    """Found by a probe: a second Ctrl-C while the host waited for a turn that ignores cancellation made the
    exit slower than the first alone (12.5 s against 2.2 s). It quits at once: here the first would wait for
    the turn's grace of 600 s; the worker exits as its pipe closes, and the child is left to crash repair."""
    env = {**FAST, "SUBAGENTS_CANCEL_GRACE_S": "600"}
    with _host(tmp_path, '{"script": [{"say": "up"}, {"spin": 600000}]}', env=env) as proc:
        started_child(tmp_path / "st", timeout=DEADLINE_S)
        workers = [pid for pid in _descendants(proc.pid) if pid != forkserver_of(proc.pid)]
        os.killpg(proc.pid, signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # the first waits for the turn, which ignores it
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1] == "interrupted again: quitting without waiting for the turns (the next host repairs them)", err
        deadline = time.monotonic() + DEADLINE_S
        while not all(gone(pid) for pid in workers):
            assert time.monotonic() < deadline, f"workers {workers} outlived their host"
            time.sleep(0.05)


def _descendants(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return children + [d for child in children for d in _descendants(child)]



def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_host_started_with_ctrl_c_ignored_still_stops_its_turns_in_order_on_sigterm(tmp_path: Path) -> None:
    """A shell's background job (``subagents run ... &`` in a script) starts with SIGINT ignored, and the event
    loop then takes no SIGINT handler for SIGTERM to reach. Was (found by a probe): SIGTERM raised out of the event
    loop from wherever it was, and the loop's teardown cancelled what it found: the turn's cancellation never
    reached its worker, which was killed after the grace ("turn ignored cancellation for 2.0s; killing worker"),
    12 s after the signal against 0.2 s with Ctrl-C handled. Now the host's work is cancelled as under Ctrl-C: the
    turn ends ``aborted``, no worker is killed, exit 143, and Ctrl-C stays ignored."""
    with _host(tmp_path, '{"script": [{"say": "up"}, {"sleep": 60000}]}', preexec_fn=_ignore_sigint) as proc:
        child = started_child(tmp_path / "st", timeout=DEADLINE_S)
        os.kill(proc.pid, signal.SIGINT)  # ignored, as the shell asked
        time.sleep(0.3)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert err.strip().splitlines()[-1] == "terminated", err
        assert "Traceback" not in err and "killing worker" not in err, err
        ends = [e["data"] for e in store.inspect(Store(tmp_path / "st", create=False), child).events if e["type"] == "turn/end"]
        assert [e["stop_reason"] for e in ends] == ["aborted"], ends
