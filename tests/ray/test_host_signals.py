"""Stop signals to a host on the Ray pool behave as on the local pool (found by a probe).

``ray.init``, which the pool's start calls to join the cluster, replaced the
host's SIGTERM handler with Ray's own (``sys.exit`` from wherever the main
thread was), and Ray's core worker hooked SIGTERM in C with a crash handler
that aborts the process 3 s later. So the CLI's SIGTERM, which stops a host
as Ctrl-C does (its turns ``aborted``, its leases released, exit 143 saying
"terminated"), became on Ray a core dump after 3 s (exit -6), nothing said
and the root's lease left unreleased; an application's own SIGTERM handler
was lost the same way. SIGINT and SIGHUP were untouched, and behaved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store import Store, check_store
from subagents.supervisor.ray_cluster import SimulatedCluster

from ..conftest import DEADLINE_S, session_processes, started_child
from .conftest import NAMESPACE, RAY_TESTS

pytestmark = RAY_TESTS

# above Ray's 3 s abort: a host that outlives it was not aborted
_STOP_DEADLINE_S = 30.0


def _env(cluster: SimulatedCluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    return {**env, "SUBAGENTS_POOL": "ray", "SUBAGENTS_RAY_ADDRESS": cluster.address, "SUBAGENTS_POOL_SIZE": "1",
            "SUBAGENTS_DURABILITY": "none", "SUBAGENTS_WORKER_READY_TIMEOUT_S": "120", "RAY_USAGE_STATS_ENABLED": "0"}


def test_sigterm_stops_a_cli_host_on_ray_as_ctrl_c_does(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "run", "script", "--prompt",
         '{"script": [{"say": "up"}, {"cpu": 60000}]}'],
        cwd=tmp_path, env=_env(ray_cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        child = started_child(tmp_path / "st", timeout=120, proc=proc)
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=_STOP_DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "terminated", err[-2000:]
    ends = [e["data"] for e in store.inspect(Store(tmp_path / "st", create=False), child).events if e["type"] == "turn/end"]
    assert [e["stop_reason"] for e in ends] == ["aborted"], ends
    report = check_store(tmp_path / "st")
    assert not report.violations and report.counts.leases_dead == 0, report


_APPLICATION = r'''
import signal, sys, anyio
from subagents.supervisor import Supervisor, SupervisorConfig
from subagents.supervisor.config import RayConfig

def mine(signum, frame):
    print("mine", signum, flush=True)

def caught_in_c() -> bool:
    """Whether SIGTERM has a handler at the C level (Python's, once ``signal.signal`` installed one)."""
    for line in open("/proc/self/status"):
        if line.startswith("SigCgt"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False

async def main(store: str, address: str) -> None:
    config = SupervisorConfig(pool="ray", pool_size=1, worker_ready_timeout_s=120, ray=RayConfig(address=address, namespace=sys.argv[3]))
    async with Supervisor.open(store=store, config=config):
        print("open", signal.getsignal(signal.SIGTERM) is mine, caught_in_c(), flush=True)
    print("closed", signal.getsignal(signal.SIGTERM) is mine, caught_in_c(), flush=True)

signal.signal(signal.SIGTERM, mine)
anyio.run(main, sys.argv[1], sys.argv[2])
'''


def test_an_applications_sigterm_handler_outlives_the_ray_pool(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    done = subprocess.run([sys.executable, "-c", _APPLICATION, str(tmp_path / "st"), ray_cluster.address, NAMESPACE + "-app"],
                          env=_env(ray_cluster), capture_output=True, text=True, timeout=DEADLINE_S * 6)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["open True True", "closed True True"], done.stdout


@pytest.mark.usefixtures("ray_cluster")  # Ray installed, a private network possible; one cluster test at a time
def test_sigterm_stops_the_ray_demo_and_its_simulated_cluster(tmp_path: Path) -> None:
    """Each node a ``SimulatedCluster`` starts installed Ray's SIGTERM handler in the host (drain 30 s, then stop
    that node, ``sys.exit(1)``), and ``ray.init`` its own: ``subagents demo --pool ray`` aborted 3 s after a
    SIGTERM and left six Ray agent processes of its cluster running for good."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "demo", "--pool", "ray",
                             "--children", "2", "--cpu-ms", "20000"], cwd=tmp_path, env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not proc.stdout.readline().startswith("demo root"):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(1.0)  # the children's turns under way
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=_STOP_DEADLINE_S)
        assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert err.strip().splitlines()[-1] == "terminated", err[-2000:]
        deadline = time.monotonic() + 10
        while session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not session_processes(proc.pid), "processes of the demo's cluster outlived it"
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
