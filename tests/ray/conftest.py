"""The Ray tests' cluster: one simulated cluster per test session, in a private network.

Every test under ``tests/ray/`` is marked ``ray`` (``RAY_TESTS``), and under
``--dist loadgroup`` (pyproject's addopts) they all run on one xdist worker
(``tests/conftest.py``'s scheduler makes them one unit), so one cluster
(~1 GiB, ~10 s to start) exists at a time.
The session-scoped ``ray_cluster`` fixture makes a private network namespace
with only ``lo`` (``supervisor/netns.py``), where Ray binds and advertises
127.0.0.1 only, starts a head with no CPUs and the store resource plus two
one-CPU nodes in it, and connects the test process as a driver. Each test
that uses it runs with its thread inside that namespace, and the thread
leaves it after, so other tests of the same xdist worker keep the host's
network. Without Ray, or without the right to make a namespace, the tests
skip saying why.
"""

from __future__ import annotations

import importlib.util
from typing import Iterator

import pytest
from multiprocess import forkserver

from subagents.supervisor import netns
from subagents.supervisor.ray_cluster import SimulatedCluster

GROUP = "ray-cluster"
NAMESPACE = "subagents-tests"


# every test module here sets ``pytestmark = RAY_TESTS``; the xdist group is what xdist itself
# reads (it cannot under pytest 9, hence the scheduler in tests/conftest.py)
RAY_TESTS = [pytest.mark.ray, pytest.mark.xdist_group(GROUP)]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[SimulatedCluster]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[test]' installs it)")
    if not netns.available():
        pytest.skip("no private network namespace here (needs CAP_SYS_ADMIN): Ray must never use a network but loopback")
    cluster = SimulatedCluster(nodes=2).start(namespace=NAMESPACE)
    started = cluster.pids()
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not [pid for pid in started if alive(pid)], "processes of the simulated cluster outlived it"


@pytest.fixture(params=["local", "ray"])
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """The pool a test of the pool contract runs on: each such test runs once on each."""
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    yield request.param


@pytest.fixture(autouse=True)
def _inside_the_cluster_network(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test using the cluster runs with this thread in its namespace, and leaves it after.

    multiprocess's forkserver (shared by every local pool of this process) is
    started first, outside: started inside, it would fork every later local
    worker of this xdist process into the private network.
    """
    if "ray_cluster" not in request.fixturenames:
        yield
        return
    cluster: SimulatedCluster = request.getfixturevalue("ray_cluster")
    forkserver.ensure_running()
    assert cluster.network is not None
    with cluster.network.entered():
        yield


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read (ESRCH)
        return False
