"""``RayPool``: the ``Pool`` over async actors of a Ray cluster; the store stays on its host.

    Supervisor tasks ──run_turn()──▶ queue ──_schedule()──▶ _drive(actor, turn)
          ▲                                                      │ actor.run_turn: streaming generator
          └──── TurnDone / Rpc frames (msgpack, as on the pipe) ◀┘ replies: actor.reply, cancels: actor.cancel
                                     _watch(actor): a pending actor.watch() call → _crashed()

    worker actors (SubagentWorker, any node) ──appends──▶ StoreService actor (pinned to the store's host)

What runs where: this supervisor (and its store) on the store's host; one
``StoreService`` actor per pool, placed by the custom resource only that host
advertises (``[ray] store_resource``); ``size`` ``SubagentWorker`` actors
spread over the cluster (``worker_num_cpus`` each, SPREAD). Worker actors have
``max_restarts=0``: the pool replaces a dead one itself, which keeps Ray's
precise ``ActorDiedError`` (a restarting actor only says "unavailable") and
keeps turns at-most-once (a turn calls tools and models; it must never rerun).

Dispatch, parking and cancellation follow the local pool (``pool.py``): an
actor takes a queued turn while fewer than ``turns_per_worker`` of its
resident turns are running; a turn blocked in ``spawn_wait``/``wait_run`` is
parked and frees its slot, so nested delegation never deadlocks; a cancelled
turn that ignores it for ``cancel_grace_s`` has its actor killed (``ray.kill``).

A dead actor (its process killed, its node lost, Ray's memory monitor) ends
every turn resident on it ``error`` — ``aborted`` if it was being cancelled —
with ``WORKER_CRASHED`` naming the node, the pid and the cause, and a
replacement starts (it waits for room if the node that had it is gone). The
callers then fence the session (lease at epoch + 1) before repairing its log:
across hosts "dead" is only the cluster's belief.

One owner for the mutable state: every method and task runs on the
supervisor's asyncio loop. Ray is imported only when this pool starts.

About 460 lines: dispatch and parking mirror ``pool.py`` (one scheduler shared
by both pools is the next step), and the death handling of a cluster
(unavailable vs dead, replacements that wait for room) has no local twin.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio

from subagents.store.errors import SubagentError
from subagents.worker.errors import WorkerCrashedError
from subagents.worker.protocol import BLOCKING_RPCS, Reply, Rpc, RunTurn, TurnDone, TurnOutcome, TurnSpec, decode, encode

from .backend import PoolStatistics, RpcHandler, StartedCallback, TurnResult, TurnTicket, WorkerRef
from .config import RayConfig
from .errors import RayUnavailableError, RpcError, SupervisorClosedError
from .ray_cluster import join, require_ray

__all__ = ["RayPool", "crash_cause"]

log = logging.getLogger(__name__)

# the share of the store resource one service takes: several supervisors of one store
# host (each with its own service) fit on it
_SERVICE_RESOURCE_SHARE = 0.001
_CAUSE_MAX = 300
# how long an actor that stopped answering may take to be declared dead by Ray before the
# pool kills it and declares it dead itself (Ray's node-death verdict took ~1.6 s here)
_DEATH_VERDICT_S = 5.0


@dataclass(eq=False)
class _Turn:
    """One queued or resident turn: the pool's ticket (``TurnTicket``), owned by the pool's tasks."""

    call_id: int
    spec: TurnSpec
    on_rpc: RpcHandler
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: TurnOutcome | None = None
    crashed: bool = False
    worker: "_Actor | None" = None
    parked: int = 0
    cancel_reason: str | None = None


@dataclass(eq=False)
class _Actor:
    index: int
    handle: Any
    node_id: str
    ip: str
    pid: int
    turns: dict[int, _Turn] = field(default_factory=dict)
    alive: bool = True
    dead: anyio.Event = field(default_factory=anyio.Event)  # set once the pool has handled its death

    @property
    def running(self) -> int:
        return sum(1 for t in self.turns.values() if t.parked == 0)

    @property
    def node(self) -> str:
        """The node as people read it: its address and the head of its id (ids tell simulated nodes apart)."""
        return f"{self.ip}/{self.node_id[:12]}"

    def ref(self) -> WorkerRef:
        return WorkerRef(self.node, self.pid)


def crash_cause(exc: BaseException) -> str:
    """The cause of an actor's death in one line, from Ray's error text (which has no structured field for it)."""
    text = " ".join(str(exc).split())
    lowered = text.lower()
    if "memory monitor" in lowered or "outofmemoryerror" in lowered:
        return "killed by Ray's memory monitor"
    reason = _between(text, "The actor is dead because ", ". ") or _between(text, "The actor died because ", ". ")
    if reason is None:
        return text[:_CAUSE_MAX] or type(exc).__name__
    exit_type = _between(text, "Worker exit type: ", " ")
    detail = _between(text, "Worker exit detail: ", " Some common causes") or ""
    extra = ": ".join(part for part in (exit_type, detail.strip()) if part)
    return (f"{reason} ({extra})" if extra else reason)[:_CAUSE_MAX]


def _between(text: str, start: str, end: str) -> str | None:
    begin = text.find(start)
    if begin < 0:
        return None
    begin += len(start)
    stop = text.find(end, begin)
    return text[begin:] if stop < 0 else text[begin:stop]


class RayPool:
    """``Pool`` over ``SubagentWorker`` actors of a Ray cluster, appending through a ``StoreService``."""

    def __init__(
        self, *, size: int, ray: RayConfig, store_root: str, durability: str, ready_timeout_s: float, cancel_grace_s: float,
        log_level: int = logging.WARNING, turns_per_worker: int = 1,
    ) -> None:
        self.size = size
        self._config = ray
        self._store_root = store_root
        self._durability = durability
        self._ready_timeout_s = ready_timeout_s
        self._cancel_grace_s = cancel_grace_s
        self._log_level = log_level
        self._turns_per_worker = turns_per_worker
        self._actors: list[_Actor | None] = [None] * size
        self._queue: deque[_Turn] = deque()
        self._call_ids = itertools.count(1)
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._joined = False
        self._service: Any = None
        self._worker_class: Any = None
        self._pending: dict[int, Any] = {}  # index → an actor handle not ready yet (killed on close)
        self._started = 0
        self._crash_count = 0

    # -- life cycle ------------------------------------------------------------

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Join the cluster, start the store service on the store's host, then every worker actor."""
        require_ray()
        import ray

        from subagents.worker.ray_actor import SubagentWorker
        from subagents.worker.store_service import StoreService

        self._tg = tg
        self._joined = join(self._config)
        self._worker_class = ray.remote(SubagentWorker)
        resource = self._config.store_resource
        self._service = (
            ray.remote(StoreService)
            .options(num_cpus=0, resources={resource: _SERVICE_RESOURCE_SHARE}, max_restarts=0)
            .remote(self._store_root, self._durability)
        )
        try:
            with anyio.fail_after(self._ready_timeout_s):
                await self._service.ping.remote()
        except TimeoutError:
            await self.aclose()
            raise RayUnavailableError(
                f'the store service did not start within {self._ready_timeout_s:.0f}s: no node of the cluster advertises the '
                f'resource "{resource}" (start the store\'s host with ray start --resources=\'{{"{resource}": 1}}\')',
                resource=resource,
            ) from None
        try:
            with anyio.fail_after(self._ready_timeout_s):
                async with anyio.create_task_group() as starting:
                    for index in range(self.size):
                        starting.start_soon(self._start_actor, index)
        except TimeoutError:
            await self.aclose()
            raise RayUnavailableError(
                f"{self.size} worker actors of {self._config.worker_num_cpus} CPU each did not all start within "
                f"{self._ready_timeout_s:.0f}s: the cluster has too few free CPUs (lower pool_size or [ray] worker_num_cpus)",
            ) from None

    async def _start_actor(self, index: int) -> None:
        handle = self._worker_class.options(
            num_cpus=self._config.worker_num_cpus, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD",
        ).remote(self._service, self._log_level)
        self._pending[index] = handle
        try:
            where = await handle.ready.remote()
        finally:
            self._pending.pop(index, None)
        self._admit(index, handle, where)

    async def _replace(self, index: int) -> None:
        """Start a replacement, however long the cluster takes to have room; retry if it dies starting
        (placed on a node that was dying too), until the pool closes."""
        from ray.exceptions import RayActorError

        delay = 0.05
        while not self._closing:
            try:
                await self._start_actor(index)
                return
            except RayActorError as exc:
                if self._closing:
                    return  # killed by aclose while it started
                log.warning("replacement worker %d died while starting (%s); retrying", index, crash_cause(exc))
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _admit(self, index: int, handle: Any, where: dict[str, Any]) -> None:
        actor = _Actor(index, handle, where["node_id"], where["ip"], where["pid"])
        if self._closing:
            self._kill(actor.handle)
            return
        self._actors[index] = actor
        self._started += 1
        assert self._tg is not None
        self._tg.start_soon(self._watch, actor)
        self._schedule()

    async def aclose(self) -> None:
        self._closing = True
        for handle in list(self._queue):
            self._finish(handle, TurnOutcome(stop_reason="aborted", diagnostic="the supervisor closed before the turn ran"))
        self._queue.clear()
        for actor in self._actors:
            if actor is not None and actor.alive:
                actor.alive = False
                self._kill(actor.handle)
                for handle in list(actor.turns.values()):
                    self._finish(handle, TurnOutcome(stop_reason="aborted", diagnostic="the supervisor closed during the turn"), crashed=True)
        for handle in list(self._pending.values()):
            self._kill(handle)
        if self._service is not None:
            self._kill(self._service)
            self._service = None
        if self._joined:
            import ray

            ray.shutdown()
            self._joined = False

    @staticmethod
    def _kill(handle: Any) -> None:
        import ray

        try:
            ray.kill(handle, no_restart=True)
        except ValueError:
            pass  # not an actor handle any more (already gone)

    # -- turns -------------------------------------------------------------------

    async def run_turn(self, spec: TurnSpec, on_rpc: RpcHandler, *, started: StartedCallback | None = None) -> TurnResult:
        if self._closing:
            raise SupervisorClosedError("the supervisor is closed")
        handle = _Turn(next(self._call_ids), spec, on_rpc)
        self._queue.append(handle)
        if started is not None:
            started(handle)
        self._schedule()
        await handle.done.wait()
        assert handle.outcome is not None
        return TurnResult(handle.outcome, None if handle.worker is None else handle.worker.ref(), handle.crashed)

    def cancel(self, ticket: TurnTicket, reason: str = "user") -> None:
        """Ask a turn to stop; kill its actor if it ignores that past the grace period."""
        assert isinstance(ticket, _Turn), "a ticket of another pool"
        handle = ticket
        if handle.done.is_set() or handle.cancel_reason is not None:
            return
        handle.cancel_reason = reason
        if handle.worker is None:
            if handle in self._queue:
                self._queue.remove(handle)
            self._finish(handle, TurnOutcome(stop_reason="aborted", diagnostic=f"the turn was cancelled ({reason}) before it started"))
            return
        assert self._tg is not None
        self._tg.start_soon(self._send_cancel, handle.worker, handle, reason)
        self._tg.start_soon(self._enforce_cancel, handle)

    async def _send_cancel(self, actor: _Actor, handle: _Turn, reason: str) -> None:
        from ray.exceptions import RayActorError

        try:
            await actor.handle.cancel.remote(handle.call_id, reason)
        except RayActorError:
            pass  # the actor died: _watch reports it

    async def _enforce_cancel(self, handle: _Turn) -> None:
        with anyio.move_on_after(self._cancel_grace_s):
            await handle.done.wait()
            return
        actor = handle.worker
        if actor is not None and actor.alive and not handle.done.is_set():
            log.warning("turn ignored cancellation for %.1fs; killing worker %s on node %s", self._cancel_grace_s, actor.pid, actor.node)
            self._kill(actor.handle)

    def _finish(self, handle: _Turn, outcome: TurnOutcome, *, crashed: bool = False) -> None:
        if handle.done.is_set():
            return
        handle.outcome, handle.crashed = outcome, crashed
        if handle.worker is not None:
            handle.worker.turns.pop(handle.call_id, None)
        handle.done.set()

    def _schedule(self) -> None:
        for actor in self._actors:
            if not self._queue:
                return
            if actor is None or not actor.alive or actor.running >= self._turns_per_worker:
                continue
            handle = self._queue.popleft()
            handle.worker = actor
            actor.turns[handle.call_id] = handle
            assert self._tg is not None
            self._tg.start_soon(self._drive, actor, handle)

    async def _drive(self, actor: _Actor, handle: _Turn) -> None:
        """Stream one turn's frames: serve its RPCs, finish it on ``TurnDone``; a dead actor is a crash."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        try:
            stream = actor.handle.run_turn.options(num_returns="streaming").remote(encode(RunTurn(call_id=handle.call_id, spec=handle.spec, node=f"{actor.node}:{actor.pid}")))
            async for ref in stream:
                msg = decode(await ref)
                if isinstance(msg, Rpc):
                    assert self._tg is not None
                    self._tg.start_soon(self._serve_rpc, actor, handle, msg)
                elif isinstance(msg, TurnDone):
                    outcome = msg.outcome
                    if handle.cancel_reason is not None and outcome.stop_reason == "completed":
                        outcome = dataclasses.replace(outcome, stop_reason="aborted")
                    self._finish(handle, outcome)
                    self._schedule()
                    return
        except ActorUnavailableError as exc:
            # _watch gets the verdict (dead, with its cause; or killed past a deadline)
            with anyio.move_on_after(2 * _DEATH_VERDICT_S):
                await actor.dead.wait()
                return
            self._kill(actor.handle)
            await self._crashed(actor, exc)
            return
        except RayActorError as exc:
            await self._crashed(actor, exc)
            return
        except Exception as exc:  # the stream broke without the actor dying: this turn alone ends
            log.exception("turn %s on worker %s failed in transit", handle.spec.session_id, actor.pid)
            self._finish(handle, TurnOutcome(stop_reason="error", diagnostic=f"{type(exc).__name__}: {exc}"[:4000]), crashed=True)
            self._schedule()
            return
        if not handle.done.is_set():
            self._finish(handle, TurnOutcome(stop_reason="error", diagnostic="the worker's stream ended without an outcome"), crashed=True)
            self._schedule()

    async def _serve_rpc(self, actor: _Actor, handle: _Turn, msg: Rpc) -> None:
        from ray.exceptions import RayActorError

        blocking = msg.method in BLOCKING_RPCS
        if blocking:
            handle.parked += 1
            self._schedule()
        try:
            value = await handle.on_rpc(msg.method, msg.args)
            reply = Reply(rpc_id=msg.rpc_id, ok=True, value=value)
        except SubagentError as exc:
            reply = Reply(rpc_id=msg.rpc_id, ok=False, error=exc.to_wire())
        except Exception as exc:  # isolation boundary: a failure serving one request goes back to its turn as an error
            log.exception("rpc %s failed", msg.method)
            reply = Reply(rpc_id=msg.rpc_id, ok=False, error=RpcError.failed(exc).to_wire())
        finally:
            if blocking:
                handle.parked -= 1
        if actor.alive and not handle.done.is_set():
            try:
                await actor.handle.reply.remote(encode(reply))
            except RayActorError:
                pass  # the actor died: _watch reports it

    async def _watch(self, actor: _Actor) -> None:
        """Keep one ``watch()`` call pending on the actor; its failure is the death sentinel.

        ``ActorUnavailableError`` (the actor stopped answering: dead, or cut off
        from us) is not yet a verdict: the call is made again, and Ray's
        ``ActorDiedError`` with the precise cause usually follows within a
        second or two. Past ``_DEATH_VERDICT_S`` the actor is killed and
        declared dead by the pool. Either way the callers fence the session
        before repairing its log, so a worker still running somewhere can
        never write after the repair.
        """
        from ray.exceptions import ActorUnavailableError, RayActorError

        unavailable_since: float | None = None
        while actor.alive:
            try:
                await actor.handle.watch.remote()
                return
            except ActorUnavailableError as exc:
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > _DEATH_VERDICT_S:
                    self._kill(actor.handle)
                    await self._crashed(actor, exc)
                    return
                await anyio.sleep(0.05)
            except RayActorError as exc:
                await self._crashed(actor, exc)
                return

    async def _crashed(self, actor: _Actor, exc: BaseException) -> None:
        """End every turn resident on a dead actor, then start its replacement."""
        if not actor.alive or self._closing:
            return
        actor.alive = False
        actor.dead.set()
        self._crash_count += 1
        crash = WorkerCrashedError(actor.pid, None, node=actor.node, cause=crash_cause(exc))
        log.error("%s", crash)
        for handle in list(actor.turns.values()):
            if handle.cancel_reason is not None:
                outcome = TurnOutcome(stop_reason="aborted", diagnostic=f"the turn was cancelled ({handle.cancel_reason}); {crash.code}: {crash}")
            else:
                outcome = TurnOutcome(stop_reason="error", diagnostic=f"{crash.code}: {crash}")
            self._finish(handle, outcome, crashed=True)
        self._actors[actor.index] = None
        if not self._closing:
            # no deadline: after a node loss the replacement waits until the cluster has room
            await self._replace(actor.index)

    # -- introspection --------------------------------------------------------------

    def statistics(self) -> PoolStatistics:
        alive = [a for a in self._actors if a is not None and a.alive]
        return PoolStatistics(
            size=self.size,
            workers_alive=len(alive),
            queued=len(self._queue),
            resident=sum(len(a.turns) for a in alive),
            parked=sum(1 for a in alive for t in a.turns.values() if t.parked),
            started=self._started,
            crashed=self._crash_count,
        )

    def workers(self) -> list[WorkerRef]:
        return [a.ref() for a in self._actors if a is not None and a.alive]

    def worker_pids(self) -> list[int]:
        return [a.pid for a in self._actors if a is not None and a.alive]
