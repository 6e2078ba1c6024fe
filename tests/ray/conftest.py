"""The Ray tests' cluster: one simulated cluster per test session, in a private network.

Every test under ``tests/ray/`` is marked ``ray`` and put in the xdist group
``ray-cluster``; with ``--dist loadgroup`` (pyproject's addopts) they all run
on one xdist worker, so one cluster (~1 GiB, ~10 s to start) exists at a time.
The session-scoped ``ray_cluster`` fixture moves that worker's main thread
into a private network namespace with only ``lo`` (``supervisor/netns.py``),
where Ray binds and advertises 127.0.0.1 only, starts a head with no CPUs and
the store resource plus two one-CPU nodes, and connects the test process as
a driver. Without Ray, or without the right to make a namespace, the tests
skip saying why.
"""

from __future__ import annotations

import importlib.util
from typing import Iterator

import pytest

from subagents.supervisor import netns
from subagents.supervisor.ray_cluster import SimulatedCluster

GROUP = "ray-cluster"
NAMESPACE = "subagents-tests"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/ray/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.xdist_group(GROUP))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[SimulatedCluster]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[test]' installs it)")
    if not netns.available():
        pytest.skip("no private network namespace here (needs CAP_SYS_ADMIN): Ray must never use a network but loopback")
    import ray

    cluster = SimulatedCluster(nodes=2).start()
    started = cluster.pids()
    try:
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        cluster.stop()
    assert not [pid for pid in started if alive(pid)], "processes of the simulated cluster outlived it"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
