"""The Ray pool across the simulated nodes: placement, node loss, resume elsewhere, a killed driver.

The cluster is shared by the session: a test that removes a node adds one
back before it ends, so the next test again finds two one-CPU nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents.store import LogWriter, list_children, read_lease
from subagents.store.errors import FencedError
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, SubagentRequest
from subagents.supervisor.ray_cluster import SimulatedCluster

from ..conftest import DEADLINE_S, REPO_ROOT, events_of, last_turn_end, said, wait_until
from ._pools import open_pool_supervisor
from .conftest import NAMESPACE, RAY_TESTS, alive

pytestmark = [pytest.mark.anyio, *RAY_TESTS]


def node_of(cluster: SimulatedCluster, node_id: str) -> Any:
    for node in cluster.worker_nodes:
        if node.node_id == node_id:
            return node
    pytest.fail(f"{node_id} is not a worker node of the cluster")


async def restore_nodes(cluster: SimulatedCluster, sup: Any) -> None:
    """Add a node for the one removed, and wait for the pool's replacement actor to start on it.

    Ray starts a node from the main thread only (it installs signal handlers), so this blocks the loop a few seconds.
    """
    cluster.add_node()
    await wait_until(lambda: sup.statistics().pool.workers_alive == sup.pool.size, timeout=60, what="the replacement actor")


async def test_children_run_on_both_worker_nodes_never_the_head(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    gate = tmp_path / "gate"
    async with open_pool_supervisor(tmp_path, "ray", pool_size=2) as sup:
        root = await sup.open_root()
        # each turn stays open until the gate opens: both are listed running at once however late
        # the second starts (a fixed sleep could end the first before the second began, under load)
        runs = [await sup.start("node-then-hold", SubagentRequest(parent=root, prompt=str(gate))) for _ in range(2)]
        # issue 11 item 5: while they run, the listing says on which node (``ip/<node id head>:<actor pid>``)
        def listed_running() -> list[Any]:
            rows = [r for r in list_children(sup.store, root.id) if r.node and said(sup.store, r.id)]
            return rows if len(rows) == 2 else []

        running = await wait_until(listed_running, what="both children running and listed with their node")
        for row in running:
            ip_and_node, pid = row.node.rsplit(":", 1)
            node_id, actor_pid = said(sup.store, row.id)[0].split()
            assert (ip_and_node, pid) == (f"127.0.0.1/{node_id[:12]}", actor_pid)
        gate.touch()
        with anyio.fail_after(DEADLINE_S):
            for run in runs:
                assert (await run.result()).stop_reason == "completed"
        nodes = {said(sup.store, run.id)[0].split()[0] for run in runs}
        assert nodes == {node.node_id for node in ray_cluster.worker_nodes}
        assert ray_cluster.head_node_id not in nodes
        hosts = {ref.host.split("/")[1] for ref in sup.pool.workers()}
        assert hosts == {n[:12] for n in nodes}
        for run in runs:
            await run.dispose()


async def test_node_loss_mid_turn_ends_it_error_and_fences_a_zombie(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    """remove_node under a running turn: it ends error naming the node, the epoch rises before the
    repair, and a writer still holding the old epoch (a zombie on a partitioned node) is fenced."""
    async with open_pool_supervisor(tmp_path, "ray", pool_size=2) as sup:
        root = await sup.open_root()
        run = await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="60000"))
        texts = await wait_until(lambda: said(sup.store, run.id), what="the turn to start")
        node_id = texts[0].split()[0]
        old_epoch = read_lease(sup.store, run.id).epoch
        ray_cluster.remove_node(node_of(ray_cluster, node_id))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        assert result.stop_reason == "error"
        assert f"on node 127.0.0.1/{node_id[:12]}" in (result.diagnostic or "")
        # a probe read "The actor is temporarily unavailable: RpcError ... may or may not have been ex": a lost
        # node said to be temporarily away, in Ray's words cut mid-word
        assert "temporarily" not in result.diagnostic and not result.diagnostic.endswith(" ex"), result.diagnostic
        events = events_of(sup.store, run.id)
        assert events[-1]["type"] == "turn/end" and events[-1]["data"]["stop_reason"] == "interrupted"
        assert events[-1]["epoch"] == old_epoch + 1
        with pytest.raises(FencedError):
            LogWriter.open(sup.store, run.id, epoch=old_epoch).append([("assistant/message", {"text": "zombie"})])
        assert [e for e in events_of(sup.store, run.id) if e["data"].get("text") == "zombie"] == []
        await run.dispose()
        await restore_nodes(ray_cluster, sup)


async def test_continuable_child_resumes_on_another_node(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    """A continuable child's node dies mid-turn with two followups accepted behind it: they run on the
    other node, so does a later followup, and every accepted message is in the log exactly once."""
    async with open_pool_supervisor(tmp_path, "ray", pool_size=2) as sup:
        root = await sup.open_root()
        child_id, first = await sup.start_continuable(ContinuableSpec(parent=root, provider="node-then-sleep", prompt="60000", label="c"))
        texts = await wait_until(lambda: said(sup.store, child_id), what="the first turn to start")
        lost = texts[0].split()[0]
        queued = [await sup.followup(root, child_id, "10") for _ in range(2)]
        ray_cluster.remove_node(node_of(ray_cluster, lost))
        await wait_until(lambda: len(said(sup.store, child_id)) >= 5, what="the queued followups to run")
        later = await sup.followup(root, child_id, "10")
        await wait_until(lambda: len(said(sup.store, child_id)) >= 7, what="the later followup to run")
        events = events_of(sup.store, child_id)
        accepted = [e["data"]["message_id"] for e in events if e["type"] == "message/accepted"]
        for message_id in [first, *queued, later]:
            assert accepted.count(message_id) == 1, (message_id, accepted)
        ends = [e["data"]["stop_reason"] for e in events if e["type"] == "turn/end"]
        assert ends == ["interrupted", "completed", "completed", "completed"]
        where = [t.split()[0] for t in said(sup.store, child_id) if not t.startswith("slept")]
        assert where[0] == lost and lost not in where[1:] and len(where) == 4
        await restore_nodes(ray_cluster, sup)


_DRIVER = r"""
import json, sys, anyio
from subagents import Supervisor, SupervisorConfig
from subagents.supervisor.config import RayConfig

async def main():
    cfg = SupervisorConfig(pool="ray", pool_size=2, durability="none", ray=RayConfig(address=sys.argv[2], namespace=sys.argv[3]))
    async with Supervisor.open(store=sys.argv[1], config=cfg) as sup:
        print(json.dumps(sup.pool.worker_pids()), flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def test_a_driver_killed_by_sigkill_leaves_no_actors(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(tmp_path / "store"), ray_cluster.address, NAMESPACE + "-driver"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    reader = ThreadPoolExecutor(1)  # a driver that never gets ready fails the test, never hangs it
    try:
        assert driver.stdout is not None
        pids = json.loads(reader.submit(driver.stdout.readline).result(timeout=90))
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(DEADLINE_S)
        reader.shutdown()
    anyio.run(lambda: wait_until(lambda: not any(alive(pid) for pid in pids), what="the dead driver's actors to exit"))


async def test_an_actor_still_starting_when_open_gives_up_is_killed(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    """Three actors of one CPU on two one-CPU nodes, in a process that joined Ray itself (the pool does not
    disconnect it at close): the start times out, and the actor still waiting for a CPU is killed with the
    two that started. Before, it was left to the garbage collector and took the first CPU the close freed."""
    import ray

    from subagents.supervisor.errors import RayUnavailableError

    def cpus() -> float:
        return float(ray.available_resources().get("CPU", 0.0))

    await wait_until(lambda: cpus() == 2.0, what="the cluster's two CPUs free")
    with pytest.raises(RayUnavailableError) as failed:  # ``failed`` keeps the starting task's frames alive
        async with open_pool_supervisor(tmp_path, "ray", pool_size=3, worker_ready_timeout_s=3.0):
            pass

    async def both_free_for_a_while() -> bool:
        for _ in range(20):  # 2 s: a leftover actor is placed within a moment of a CPU freeing
            if cpus() != 2.0:
                return False
            await anyio.sleep(0.1)
        return True

    await wait_until(both_free_for_a_while, what="both CPUs free for 2 s after the failed open")
    assert failed.value.code == "RAY_UNAVAILABLE"


async def test_a_dead_store_service_is_replaced(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    """kill -9 of the store service mid-turn: that turn ends error in one line naming the store service,
    a new service starts (and new worker actors that append through it), and the next child completes."""
    async with open_pool_supervisor(tmp_path, "ray", pool_size=1) as sup:
        root = await sup.open_root()
        victim = await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="2000"))
        await wait_until(lambda: said(sup.store, victim.id), what="the child to start")
        service = await sup.pool._service.ping.remote()
        os.kill(int(service["pid"]), signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            result = await victim.result()
        assert result.stop_reason == "error" and "store service" in (result.diagnostic or "")
        assert "\n" not in (result.diagnostic or "")
        with anyio.fail_after(DEADLINE_S * 3):
            nxt = await sup.start("node-pid", SubagentRequest(parent=root, prompt="x"))
            assert (await nxt.result()).stop_reason == "completed"
        assert sup.statistics().pool.store_service_restarts == 1
        await nxt.dispose()
        await victim.dispose()


async def test_an_actor_starting_when_the_store_service_dies_is_not_left_tied_to_it(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    """Found by a probe: a replacement actor still starting when the store service died came up holding the dead
    service's handle (the service's replacement replaces only admitted actors), and every turn it took failed
    ``StoreServiceError``, for good. The service is killed while the replacement of a killed actor starts (an
    actor takes about a second to start; the pool learns of the service's death within milliseconds)."""
    async with open_pool_supervisor(tmp_path, "ray", pool_size=1) as sup:
        root = await sup.open_root()
        first = await sup.start("node-pid", SubagentRequest(parent=root, prompt="x"))
        with anyio.fail_after(DEADLINE_S * 3):
            assert (await first.result()).stop_reason == "completed"
        await first.dispose()
        [actor] = [a for a in sup.pool._slots if a is not None]
        os.kill(actor.pid, signal.SIGKILL)
        await wait_until(lambda: sup.pool._pending, what="the replacement actor to be starting")
        service = await sup.pool._service.ping.remote()
        os.kill(int(service["pid"]), signal.SIGKILL)
        for _ in range(3):
            with anyio.fail_after(DEADLINE_S * 3):
                run = await sup.start("node-pid", SubagentRequest(parent=root, prompt="x"))
                result = await run.result()
            assert result.stop_reason == "completed", result
            await run.dispose()


async def test_a_program_no_node_can_import_names_the_node_in_the_log_too(tmp_path: Path, ray_cluster: SimulatedCluster) -> None:
    """README: a program a node cannot import ends the turn ``PROGRAM_LOAD_FAILED``, naming that node. Found by a
    probe: only the caller's result named it (the outcome was rewritten after the worker had logged the turn's
    end), so the listings, ``show`` and another process reading the store never saw where it failed."""
    async with open_pool_supervisor(tmp_path, "ray", pool_size=1) as sup:
        sup.register_provider(Provider(name="nowhere", program="not_installed_here:program", capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("nowhere", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        [row] = await sup.list_children(root)
    assert result.diagnostic.startswith("PROGRAM_LOAD_FAILED") and "on Ray node " in result.diagnostic, result
    assert last_turn_end(sup.store, run.id)["diagnostic"] == result.diagnostic
    assert "on Ray node " in (row.error or ""), row
