"""The store service as a Ray actor on the store's host: seq and fencing hold under Ray's reordering."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from subagents.store import Store, acquire_lease, create_session, inspect, read_lease
from subagents.store.errors import FencedError
from subagents.supervisor.ray_cluster import SimulatedCluster
from subagents.worker.service_writer import ServiceSessions, StoreServiceError
from subagents.worker.store_service import StoreService, pack_events

from ..conftest import DEADLINE_S
from .conftest import RAY_TESTS

pytestmark = RAY_TESTS


def wait_dead(actor: Any) -> None:
    """Return once ``actor`` answers no more: ``ray.kill`` only asks the cluster, and a call made
    before the kill has landed is still served."""
    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=DEADLINE_S)
        except RayActorError:
            return
        time.sleep(0.01)  # a poll interval, not a synchronisation sleep
    pytest.fail(f"the killed actor still answered after {DEADLINE_S}s")


@pytest.fixture
def service(ray_cluster: SimulatedCluster, tmp_path: Path) -> Any:
    import ray

    st = Store(tmp_path / "store", durability="strict")
    actor = ray.remote(StoreService).options(num_cpus=0, resources={ray_cluster.store_resource: 0.01}).remote(st.root, "strict")
    ray.get(actor.ping.remote())
    yield st, actor
    ray.kill(actor)


def test_the_service_runs_on_the_store_host(ray_cluster: SimulatedCluster, service: Any) -> None:
    import ray

    _st, actor = service

    @ray.remote(num_cpus=0, resources={ray_cluster.store_resource: 0.01})
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    assert ray.get(where.remote()) == ray_cluster.head_node_id


def test_batches_reordered_by_ray_land_only_at_their_own_seq(service: Any) -> None:
    """Forty batches submitted at once, each claiming seq i: Ray runs them in any order; the log stays contiguous."""
    import ray

    st, actor = service
    create_session(st, "s1")
    epoch = acquire_lease(st, "s1", "01OWNER").epoch
    assert "next_seq" in ray.get(actor.open_writer.remote("w", "s1", epoch))
    refs = [actor.append.remote("w", seq, pack_events([("assistant/message", {"text": str(seq)})]), False) for seq in range(40)]
    replies = ray.get(refs)
    events = inspect(st, "s1").events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(e["data"]["text"] == str(e["seq"]) for e in events)
    assert sum(1 for r in replies if "next_seq" in r) == len(events) >= 1
    assert all(r["error"]["code"] == "SEQ_MISMATCH" for r in replies if "error" in r)


def test_remote_writer_over_ray_and_a_fenced_zombie(service: Any) -> None:
    import ray

    from subagents.worker.ray_actor import service_transport

    st, actor = service
    create_session(st, "s1")
    epoch = acquire_lease(st, "s1", "01OWNER").epoch
    sessions = ServiceSessions(service_transport(actor))
    writer = sessions.open_writer("s1", epoch=epoch)
    for i in range(50):
        writer.append([("assistant/message", {"text": str(i)})])
    asyncio.run(writer.flush())
    assert [e["seq"] for e in inspect(st, "s1").events] == list(range(50))
    assert writer.batches_sent < 50  # queued appends were coalesced
    acquire_lease(st, "s1", "01OWNER")  # epoch + 1: the writer is now a zombie
    writer.append([("assistant/message", {"text": "late"})])
    with pytest.raises(FencedError):
        asyncio.run(writer.flush())
    writer.close()
    assert len(inspect(st, "s1").events) == 50
    ray.kill(actor)
    wait_dead(actor)
    with pytest.raises(StoreServiceError):
        sessions.open_writer("s1", epoch=epoch + 1)


def test_a_remote_turns_release_and_close_over_ray(service: Any) -> None:
    """The turn's last act over Ray: one call releases the lease through the service's writer and closes it."""
    import ray

    from subagents.worker.ray_actor import service_transport

    st, actor = service
    create_session(st, "s1")
    epoch = acquire_lease(st, "s1", "01OWNER").epoch
    writer = ServiceSessions(service_transport(actor)).open_writer("s1", epoch=epoch)
    writer.append([("turn/start", {"message_id": "m"})], commit=True)
    asyncio.run(writer.flush())
    writer.release_lease("01OWNER")
    writer.close()
    lease = read_lease(st, "s1")
    assert lease is not None and (lease.epoch, lease.state) == (epoch, "released")
    assert ray.get(actor.statistics.remote())["open_writers"] == 0
