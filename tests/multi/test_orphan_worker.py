"""A worker whose host died by ``kill -9`` while its turn blocked the worker's event loop.

The worker learns of its host's death from its pipe. A turn that never
awaits (``spin``) keeps the loop from reading that end of file; the worker
must still die with its host, and it must never commit the turn it was
running: the host is gone, nobody asked for that result any more, and every
reader already reported the child crashed.
"""

from __future__ import annotations

import os
import signal
import time

import anyio
import pytest

from subagents.store import Store, inspect, list_children

from ._driver import S, gone, poll, tagged_pids

pytestmark = pytest.mark.anyio


def wait_pids_gone(pids: list[int], *, timeout: float) -> float:
    """Seconds until every one of ``pids`` runs nothing (a zombie counts as gone)."""
    t0 = time.monotonic()
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() - t0 < timeout, f"{pids} still run after {timeout} s"
        time.sleep(0.005)
    return time.monotonic() - t0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return 0.0
    fields = raw[raw.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

SPIN_MS = 3000


async def test_a_dead_hosts_worker_dies_at_once_and_never_commits_the_blocked_turn(tmp_path, hosts) -> None:
    st = Store(tmp_path / "store", durability="none")
    host = hosts.start(st.root, pool_size=1, lease_ttl_s=30.0)
    root = await host.acall("open_root", label="orphans")
    child = (await host.acall("start", parent=root, prompt=S({"say": "spinning"}, {"spin": SPIN_MS}, {"return": "finished"}), provider="script", wait=False))["child"]
    workers = [pid for pid in tagged_pids(host.tag) if pid != host.proc.pid]
    assert workers, "the host's worker runs"
    # the log may hold nothing of a turn until it ends: its worker burning CPU says the spin runs
    started = {pid: cpu_s(pid) for pid in workers}
    await poll(lambda: any(cpu_s(pid) - started[pid] >= 0.3 for pid in workers), what="the spin to start")

    wall_kill = time.time()
    # SIGKILL by hand: ``host.kill`` also waits for the host's output pipes to close, which the worker holds too
    killed_at = time.monotonic()
    os.kill(host.proc.pid, signal.SIGKILL)
    took = await anyio.to_thread.run_sync(lambda: wait_pids_gone(workers, timeout=SPIN_MS / 1000 + 5))
    assert took < 1.0, f"the worker outlived its host by {took:.2f} s: it ran on until its blocking turn ended"
    host.kill()

    # past the moment the spin would have ended: the log holds no ending written by an orphan
    await anyio.sleep(max(0.0, killed_at + SPIN_MS / 1000 + 0.5 - time.monotonic()))
    ends = [e for e in inspect(st, child).events if e["type"] == "turn/end"]
    assert ends == [], f"an orphan worker committed {ends} ({ends[0]['ts'] - wall_kill:.3f} s after the kill; workers {workers}, gone after {took:.3f} s)"
    [row] = [r for r in list_children(st, root) if r.id == child]
    assert row.outcome == "crashed", row
