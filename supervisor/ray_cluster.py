"""Joining a Ray cluster, and a simulated one on this host.

``require_ray`` is what ``Supervisor.open`` checks first when ``pool = "ray"``:
Ray importable and the event loop asyncio (Ray's object refs are asyncio
awaitables; a trio host cannot await them). ``join`` connects this process to
the cluster the ``[ray]`` table names, unless it already is, and ``leave``
disconnects it. Ray is imported only inside these functions, never at module
import.

Both keep the process's stop-signal handlers (``keeping_stop_handlers``):
``ray.init`` replaced the host's SIGTERM handler with Ray's ``sys.exit`` and
its core worker hooked SIGTERM in C with a crash handler that aborts the
process 3 s later, and ``ray.shutdown`` reset it to the default. The CLI's
SIGTERM, which stops a host as Ctrl-C does, became a core dump after 3 s
with the root's lease left held; an application's own handler was lost.
``SimulatedCluster`` keeps them too: each node it starts installs Ray's own.

``SimulatedCluster`` starts a head (no CPUs, the store resource: the store's
host) and N one-CPU worker nodes, all on this host and all inside a private
network namespace (``netns.py``): the tests, the benchmark and
``subagents demo --pool ray`` use it. It stops only the processes it started
(through Ray's ``Cluster`` object, never ``ray stop``). A host that dies
without stopping it, even by SIGKILL, takes them along: Ray ties a node's
services to the host with ``PR_SET_PDEATHSIG`` but not the agents each raylet
starts, which outlived a ``kill -9`` by a minute, so the cluster also starts
a reaper (``cluster_reaper.py``) that ends every process it was sent when
the host is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from subagents.worker.descendants import descendants

from . import netns
from .cluster_reaper import ClusterReaper
from .config import RayConfig
from .errors import RayUnavailableError

__all__ = ["require_ray", "join", "leave", "keeping_stop_handlers", "SimulatedCluster"]

log = logging.getLogger(__name__)

# a simulated node's object store: Ray's test default; turns move only small msgpack frames
_NODE_OBJECT_STORE_BYTES = 100 * 1024 * 1024


def require_ray() -> None:
    """Raise ``RayUnavailableError`` unless Ray is installed and the running loop is asyncio."""
    try:
        import ray  # noqa: F401  (the pool imports it next anyway)
    except ImportError as exc:
        raise RayUnavailableError(f"pool = \"ray\" needs Ray, which cannot be imported ({exc}): pip install 'subagents[ray]'") from None
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RayUnavailableError(
            'pool = "ray" needs the asyncio event loop (anyio.run(..., backend="asyncio")): Ray\'s object refs are asyncio awaitables'
        ) from None


# the signals that stop a host (``cli/stopping.py``); Ray's driver takes SIGTERM over, the others are kept alike
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def keeping_stop_handlers() -> Iterator[None]:
    """Around ``ray.init`` and ``ray.shutdown``: the process's stop-signal handlers as they were before.

    ``ray.init`` installs Ray's own SIGTERM handler (``sys.exit`` from wherever the main thread is) and its
    core worker a C-level crash handler that aborts the process 3 s after a SIGTERM; ``ray.shutdown``
    resets SIGTERM to the default. A stop is the host's to handle, as on the local pool, so each handler
    Python knew is installed again (which also displaces the C-level one). Only the main thread can.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: installed outside Python, which cannot put it back
                signal.signal(signum, handler)


def join(config: RayConfig) -> bool:
    """Connect this process to the cluster; True if this call connected it (then the caller disconnects)."""
    import ray

    if ray.is_initialized():
        return False
    address = None if config.address == "local" else config.address
    if address is not None:
        _require_answer(address)
    try:
        with keeping_stop_handlers():
            ray.init(address=address, namespace=config.namespace, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailableError(f"cannot join the Ray cluster at {config.address!r}: {exc}", address=config.address) from exc
    return True


def leave() -> None:
    """Disconnect this process from the cluster ``join`` connected it to, keeping its stop-signal handlers."""
    import ray

    with keeping_stop_handlers():
        ray.shutdown()


# how long a cluster's address has to accept a connection before the join is refused
CONNECT_TIMEOUT_S = 5.0


def _require_answer(address: str) -> None:
    """``RayUnavailableError`` at once when nothing accepts a connection at a ``host:port`` address:
    ``ray.init`` retried such an address for minutes, ignoring Ctrl-C. Others ("auto", "ray://...")
    are Ray's to resolve."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RayUnavailableError(f"cannot join the Ray cluster at {address!r}: nothing answers there ({why})", address=address) from None


@dataclass
class SimulatedCluster:
    """A head with ``num_cpus=0`` and the store resource, plus ``nodes`` one-CPU nodes, in a private network.

    ``start(namespace=...)`` also connects this process as the cluster's
    driver, from inside the namespace (Ray's driver threads stay there).
    Whatever talks to the cluster afterwards (Ray calls, drivers started as
    subprocesses) runs ``with cluster.network.entered():``.
    """

    nodes: int = 2
    store_resource: str = "subagents_store"
    node_cpus: float = 1.0
    cluster: Any = None
    network: netns.PrivateNetwork | None = None
    worker_nodes: list[Any] = field(default_factory=list)
    reaper: ClusterReaper | None = None
    _saved_usage_stats: str | None = None

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    @property
    def head_node_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    def start(self, *, namespace: str | None = None) -> "SimulatedCluster":
        from ray.cluster_utils import Cluster

        self._saved_usage_stats = os.environ.get("RAY_USAGE_STATS_ENABLED")
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # never report usage
        self.network = netns.PrivateNetwork.create()
        try:
            self.reaper = ClusterReaper.start()  # first, and outside the namespace: it needs no network
            # each node started here installs Ray's SIGTERM handler in this process (drain for 30 s, then stop
            # that one node and sys.exit(1), from inside the signal handler), and ray.init its own: the host's
            # are kept, so ``subagents demo --pool ray`` stops on SIGTERM as on Ctrl-C, then stops the cluster
            with self.network.entered(), keeping_stop_handlers():
                self.cluster = Cluster(
                    initialize_head=True,
                    head_node_args={
                        "num_cpus": 0,
                        "resources": {self.store_resource: 1},
                        "include_dashboard": False,
                        "object_store_memory": _NODE_OBJECT_STORE_BYTES,
                    },
                )
                self._watch()
                for _ in range(self.nodes):
                    self.add_node()
                self.cluster.wait_for_nodes()
                if namespace is not None:
                    import ray

                    ray.init(address=self.address, namespace=namespace, log_to_driver=False, configure_logging=False)
        except BaseException:
            self.stop()
            raise
        log.info("simulated Ray cluster at %s: head + %d nodes", self.address, self.nodes)
        return self

    def add_node(self) -> Any:
        """Start one more worker node (call inside the namespace), keeping the host's stop-signal handlers."""
        with keeping_stop_handlers():
            node = self.cluster.add_node(num_cpus=self.node_cpus, object_store_memory=_NODE_OBJECT_STORE_BYTES)
        self.worker_nodes.append(node)
        self._watch()
        return node

    def _watch(self) -> None:
        """Send the reaper every process of the cluster so far: a node's agents are up once ``add_node`` returns
        (its raylet starts them before it registers with the GCS, which ``add_node`` waits for)."""
        if self.reaper is not None:
            started = self.pids()
            self.reaper.watch([*started, *descendants(started)])

    def remove_node(self, node: Any) -> None:
        """Kill every process of one worker node (a node loss, as Ray sees it)."""
        self.worker_nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def pids(self) -> list[int]:
        """The pids of every Ray service process this cluster started itself (GCS, raylets, monitor, dashboard,
        log monitor); each raylet's agents and workers are their children (``worker/descendants.py``)."""
        out: list[int] = []
        for node in self.cluster.list_all_nodes() if self.cluster is not None else []:
            for infos in node.all_processes.values():
                out.extend(info.process.pid for info in infos)
        return out

    def stop(self) -> None:
        """Disconnect the driver and stop every process the cluster started."""
        import ray

        try:
            if self.network is not None:
                with self.network.entered():
                    if ray.is_initialized():
                        leave()
                    if self.cluster is not None:
                        self.cluster.shutdown()
                        self.cluster = None
        finally:
            if self.reaper is not None:
                self.reaper.close()  # ends what the shutdown left, if anything
                self.reaper = None
            if self.network is not None:
                self.network.close()
                self.network = None
            if self._saved_usage_stats is None:
                os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
            else:
                os.environ["RAY_USAGE_STATS_ENABLED"] = self._saved_usage_stats
