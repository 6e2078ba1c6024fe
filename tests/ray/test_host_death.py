"""A host killed by SIGKILL takes its simulated cluster with it (found by a probe of ``kill -9`` of the demo).

Ray starts a node's GCS, raylet, monitor, dashboard and log monitor with
``PR_SET_PDEATHSIG`` (SIGKILL), so they die with the host. The two agents
each raylet starts (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) have
no such tie: they watch their raylet through a pipe, see it die, then block
in a last report to the GCS, which died at the same moment, until its 60 s
timeout. A ``kill -9`` of ``subagents demo --pool ray`` left six of them
(a head and two nodes) running, their parent pid 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import LiveProcess, live_processes
from .conftest import RAY_TESTS

pytestmark = RAY_TESTS

# well under the agents' own 60 s: what ends them is the cluster's reaper, not Ray's timeout
_GONE_WITHIN_S = 30.0

_HOST = r"""
import json, sys, time
from subagents.supervisor.ray_cluster import SimulatedCluster

cluster = SimulatedCluster(nodes=2).start(namespace=sys.argv[1])
print(json.dumps(cluster.pids()), flush=True)
time.sleep(600)
"""


def _tree(root: int, processes: dict[int, LiveProcess]) -> set[int]:
    """``root`` and every live process below it, from their parent pids."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process.ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode(errors="replace")
        return f"{pid} {command[:100].strip()}"
    except OSError:
        return f"{pid} (gone)"


@pytest.mark.usefixtures("ray_cluster")  # Ray installed, a private network possible; one cluster test at a time
def test_sigkill_of_a_host_ends_every_process_of_its_simulated_cluster(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    host = subprocess.Popen([sys.executable, "-c", _HOST, "host-death"], cwd=tmp_path, env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    ours: dict[int, int] = {}  # pid: start time

    def left() -> list[int]:
        now = live_processes()
        return [pid for pid, started in ours.items() if pid in now and now[pid].started == started]

    try:
        assert host.stdout is not None
        line = host.stdout.readline()
        assert line, f"the host exited ({host.wait()}) before its cluster started"
        services = json.loads(line)  # SimulatedCluster.pids(): what Ray's node objects started
        processes = live_processes()
        ours.update((pid, processes[pid].started) for pid in _tree(host.pid, processes) - {host.pid})
        assert set(services) <= set(ours), "the cluster's own processes are the host's children"
        assert len(set(ours) - set(services)) >= 6, "the raylets' agents (two per node) were not found"

        os.kill(host.pid, signal.SIGKILL)
        killed = time.monotonic()
        host.wait()
        deadline = killed + _GONE_WITHIN_S
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = left()
        assert not survivors, f"{len(survivors)} processes of the cluster outlived its host by {_GONE_WITHIN_S:.0f} s:\n" + "\n".join(
            _describe(pid) for pid in survivors)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        for pid in left():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
