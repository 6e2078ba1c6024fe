"""The simulated cluster keeps the network rule: loopback only, every socket on 127.0.0.1."""

from __future__ import annotations


import os
import subprocess

from subagents.supervisor import netns
from subagents.supervisor.ray_cluster import SimulatedCluster

from .conftest import RAY_TESTS

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
ANY = {"0.0.0.0", "*", "::", "[::]"}

pytestmark = RAY_TESTS


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return host.strip("[]").split("%", 1)[0]


def test_cluster_lives_in_a_private_network(ray_cluster: SimulatedCluster) -> None:
    """Every Ray process shares this thread's namespace, whose only interface is lo."""
    assert netns.loopback_only()
    ours = os.readlink("/proc/thread-self/ns/net")
    pids = ray_cluster.pids()
    assert len(pids) >= 6  # a GCS and three raylets at least
    for pid in pids:
        assert os.readlink(f"/proc/{pid}/ns/net") == ours, f"Ray process {pid} is outside the private network"
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"


def test_every_socket_is_on_loopback(ray_cluster: SimulatedCluster) -> None:
    """``ss`` in the namespace: each TCP/UDP socket's local and peer address is 127.0.0.1 (a listener's peer is *)."""
    out = subprocess.run(["ss", "-H", "-tuanp"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    gcs_port = ray_cluster.address.rsplit(":", 1)[1]
    assert any(_host(r[4]) in LOOPBACK and r[4].endswith(":" + gcs_port) for r in rows), "the GCS listener is missing"
    for row in rows:
        state, local, peer = row[1], row[4], row[5]
        assert _host(local) in LOOPBACK, f"a socket bound off loopback: {' '.join(row)}"
        if state not in ("LISTEN", "UNCONN"):
            assert _host(peer) in LOOPBACK, f"a connection off loopback: {' '.join(row)}"
        else:
            assert _host(peer) in ANY | LOOPBACK, " ".join(row)


def test_head_has_no_cpus_and_the_store_resource(ray_cluster: SimulatedCluster) -> None:
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    head = nodes[ray_cluster.head_node_id]
    assert head["Resources"].get("CPU", 0) == 0 and head["Resources"]["subagents_store"] == 1
    workers = [n for node_id, n in nodes.items() if node_id != ray_cluster.head_node_id]
    assert len(workers) >= 2 and all(n["Resources"]["CPU"] == 1 and "subagents_store" not in n["Resources"] for n in workers)
