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

Dispatch, parking and cancellation are the local pool's own, shared
(``Dispatcher``, ``dispatch.py``): an actor takes a queued turn while fewer
than ``turns_per_worker`` of its resident turns are running; a turn blocked in
``spawn_wait``/``wait_run`` is parked and frees its slot, so nested delegation
never deadlocks; a cancelled turn that ignores it for ``cancel_grace_s`` has
its actor killed (``ray.kill``). This module reaches the actors and turns a
cluster's verdicts on them into outcomes.

A dead actor (its process killed, its node lost, Ray's memory monitor) ends
every turn resident on it ``error`` — ``aborted`` if it was being cancelled —
with ``WORKER_CRASHED`` naming the node, the pid and the cause, and a
replacement starts (it waits for room if the node that had it is gone). The
callers then fence the session (lease at epoch + 1) before repairing its log:
across hosts "dead" is only the cluster's belief. A dead store service (a
pending ``watch()`` call on it too) is replaced, and so is every worker actor,
as each holds the dead service's handle: their turns end ``error`` saying so,
and ``statistics().store_service_restarts`` counts it.

The environment is not the host's of the moment: an actor runs in a Ray worker
process of its node, with the environment Ray gave it (that of the process
that started the node, ``ray start`` there, plus the job's ``runtime_env``
``env_vars`` if the application joined the cluster itself with one). The local pool hands each worker the host's ``os.environ`` of the moment
(``pool.py``); this one sends none, since a node elsewhere has its own, and a
variable such as an API key set in the host would otherwise travel through the
cluster. So the ``llm`` program's ``SUBAGENTS_LLM_*`` settings and key are the
nodes' to set.

One owner for the mutable state: every method and task runs on the
supervisor's asyncio loop. Ray is imported only when this pool starts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from subagents.store import MAX_RECORD_BYTES
from subagents.worker.errors import WorkerCrashedError
from subagents.worker.protocol import CancelRpc, Reply, Rpc, RunTurn, TurnDone, TurnOutcome, decode, encode

from .backend import PoolStatistics, WorkerRef
from .config import RayConfig
from .dispatch import Dispatcher, Turn, WorkerSlot
from .errors import RayUnavailableError
from .ray_cluster import join, leave, require_ray

__all__ = ["RayPool", "crash_cause", "unanswered_cause"]

log = logging.getLogger(__name__)

# the share of the store resource one service takes: several supervisors of one store
# host (each with its own service) fit on it
_SERVICE_RESOURCE_SHARE = 0.001
_CAUSE_MAX = 300
# how long an actor that stopped answering may take to be declared dead by Ray before the
# pool kills it and declares it dead itself (Ray's node-death verdict took ~1.6 s here)
_DEATH_VERDICT_S = 5.0


@dataclass(eq=False)
class _Actor(WorkerSlot):
    handle: Any
    node_id: str
    ip: str
    dead: anyio.Event = field(default_factory=anyio.Event)  # set once the pool has handled its death

    @property
    def node(self) -> str:
        """The node as people read it: its address and the head of its id (ids tell simulated nodes apart)."""
        return f"{self.ip}/{self.node_id[:12]}"

    def ref(self) -> WorkerRef:
        return WorkerRef(self.node, self.pid)

    def describe(self) -> str:
        return f"{self.pid} on node {self.node}"


def crash_cause(exc: BaseException) -> str:
    """The cause of an actor's death in one line, from Ray's error text (which has no structured field for it)."""
    text = " ".join(str(exc).split())
    lowered = text.lower()
    if "memory monitor" in lowered or "outofmemoryerror" in lowered:
        return "killed by Ray's memory monitor"
    reason = _between(text, "The actor is dead because ", ". ") or _between(text, "The actor died because ", ". ")
    if reason is None:
        return _clip(text) or type(exc).__name__
    exit_type = _between(text, "Worker exit type: ", " ")
    detail = _between(text, "Worker exit detail: ", " Some common causes") or ""
    extra = ": ".join(part for part in (exit_type, detail.strip()) if part)
    return _clip(f"{reason} ({extra})" if extra else reason)


def unanswered_cause(waited_s: float) -> str:
    """Why an actor that stopped answering was declared dead by the pool, not by Ray. Ray's own text for it
    ("The actor is temporarily unavailable: RpcError ...") called a node lost for good temporarily away."""
    return (f"it stopped answering for {waited_s:g} s without Ray declaring it dead (its node lost, or cut off from "
            "this host), and the pool killed it")


def _clip(text: str) -> str:
    """At most ``_CAUSE_MAX`` characters, cut at a word with an ellipsis: a cause cut mid-word read as garbled."""
    if len(text) <= _CAUSE_MAX:
        return text
    head = text[: _CAUSE_MAX - 1]
    return (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(" ,;:") + "…"


def _between(text: str, start: str, end: str) -> str | None:
    begin = text.find(start)
    if begin < 0:
        return None
    begin += len(start)
    stop = text.find(end, begin)
    return text[begin:] if stop < 0 else text[begin:stop]


class RayPool(Dispatcher[_Actor]):
    """``Pool`` over ``SubagentWorker`` actors of a Ray cluster, appending through a ``StoreService``."""

    def __init__(
        self, *, size: int, ray: RayConfig, store_root: str, durability: str, ready_timeout_s: float, cancel_grace_s: float,
        log_level: int = logging.WARNING, log_json: bool = False, turns_per_worker: int = 1,
    ) -> None:
        super().__init__(size=size, turns_per_worker=turns_per_worker, cancel_grace_s=cancel_grace_s)
        self._config = ray
        self._store_root = store_root
        self._durability = durability
        self._ready_timeout_s = ready_timeout_s
        self._log_level = log_level
        self._log_json = log_json
        self._joined = False
        self._service: Any = None
        self._worker_class: Any = None
        self._pending: dict[int, Any] = {}  # index → an actor handle not ready yet (killed on close)
        self._service_class: Any = None
        self._service_restarts = 0
        self._record_limit = MAX_RECORD_BYTES  # the store's, once its service answered (``start``)

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
        self._service_class = ray.remote(StoreService).options(num_cpus=0, resources={resource: _SERVICE_RESOURCE_SHARE}, max_restarts=0)
        self._service = self._service_class.remote(self._store_root, self._durability)
        try:
            with anyio.fail_after(self._ready_timeout_s):
                served = await self._service.ping.remote()
            self._record_limit = int(served["max_record_bytes"])  # the workers' writers refuse above it, as local ones do
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
        tg.start_soon(self._watch_service, self._service)

    async def _start_actor(self, index: int) -> None:
        """Start the actor of slot ``index`` and admit it once ready. It appends through the store service of
        the moment it was created: one that came ready after that service died (and was replaced, which
        replaces only the admitted actors) is killed and started again; admitted, every turn it took failed."""
        while True:
            service = self._service
            handle = self._worker_class.options(
                num_cpus=self._config.worker_num_cpus, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD",
            ).remote(service, self._log_level, self._log_json, self._record_limit)
            self._pending[index] = handle
            try:
                where = await handle.ready.remote()
            except BaseException:
                # an actor that never came ready never takes a turn: killed now (the start's deadline, the close,
                # its death). Left to the garbage collector, one still waiting for room took the first CPU the
                # close freed, whenever the caller's process stays joined to the cluster
                self._kill(handle)
                raise
            finally:
                self._pending.pop(index, None)
            if service is self._service or self._closing:
                self._admit(index, handle, where)
                return
            log.warning("worker %d came ready tied to a store service that died meanwhile; starting it again", index)
            self._kill(handle)

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
        actor = _Actor(index, where["pid"], handle, where["node_id"], where["ip"])
        if self._closing:
            self._kill(actor.handle)
            return
        self._slots[index] = actor
        self._started += 1
        assert self._tg is not None
        self._tg.start_soon(self._watch, actor)
        self._schedule()

    async def aclose(self) -> None:
        self._closing = True
        self._abort_queued()
        for actor in self._slots:
            if actor is not None and actor.alive:
                actor.alive = False
                self._kill(actor.handle)
                self._end_at_close(actor)
        for handle in list(self._pending.values()):
            self._kill(handle)
        if self._service is not None:
            self._kill(self._service)
            self._service = None
        self._end_shielded()  # after the kills: a stream still open reads the actor's death, or nothing
        if self._joined:
            leave()
            self._joined = False

    @staticmethod
    def _kill(handle: Any) -> None:
        import ray

        if not ray.is_initialized():
            return  # disconnected at close: the cluster ended this driver's actors with it
        try:
            ray.kill(handle, no_restart=True)
        except ValueError:
            pass  # not an actor handle any more (already gone)

    # -- reaching an actor (the dispatcher's hooks) ----------------------------------

    def _hand_over(self, actor: _Actor, turn: Turn) -> bool:
        assert self._tg is not None
        self._tg.start_soon(self._drive, actor, turn)
        return True

    def _send_cancel(self, actor: _Actor, turn: Turn, reason: str) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._cancel_call, actor, turn, reason)

    async def _cancel_call(self, actor: _Actor, turn: Turn, reason: str) -> None:
        """Shielded (``Dispatcher._shielded``): a close from a cancelled scope cancels its turns, and this call
        is what carries that to the actor."""
        from ray.exceptions import RayActorError

        with self._shielded():
            try:
                await actor.handle.cancel.remote(turn.call_id, reason)
            except RayActorError:
                pass  # the actor died: _watch reports it

    async def _send_reply(self, actor: _Actor, turn: Turn | None, reply: Reply) -> None:
        from ray.exceptions import RayActorError

        if turn is not None and turn.done.is_set():
            return
        try:
            await actor.handle.reply.remote(encode(reply))
        except RayActorError:
            pass  # the actor died: _watch reports it

    def _kill_worker(self, actor: _Actor) -> None:
        self._kill(actor.handle)

    def statistics(self) -> PoolStatistics:
        return dataclasses.replace(super().statistics(), store_service_restarts=self._service_restarts)

    # -- per-actor tasks -------------------------------------------------------------

    async def _drive(self, actor: _Actor, turn: Turn) -> None:
        """Stream one turn's frames: serve its RPCs, finish it on ``TurnDone``; a dead actor is a crash.

        Shielded (``Dispatcher._shielded``), as the local pool's pipe reader: a close from a cancelled
        scope cancels the turn and must still read how it ended; the close ends the stream otherwise.
        """
        with self._shielded():
            await self._stream(actor, turn)

    async def _stream(self, actor: _Actor, turn: Turn) -> None:
        from ray.exceptions import ActorUnavailableError, RayActorError

        try:
            stream = actor.handle.run_turn.options(num_returns="streaming").remote(encode(RunTurn(call_id=turn.call_id, spec=turn.spec, node=f"{actor.node}:{actor.pid}")))
            async for ref in stream:
                msg = decode(await ref)
                if isinstance(msg, Rpc):
                    self._serve_rpc_soon(actor, turn, msg)
                elif isinstance(msg, CancelRpc):
                    self._cancel_rpc(actor, msg)
                elif isinstance(msg, TurnDone):
                    self._turn_done(turn, msg.outcome)
                    return
        except ActorUnavailableError:
            # _watch gets the verdict (dead, with its cause; or killed past a deadline)
            with anyio.move_on_after(2 * _DEATH_VERDICT_S):
                await actor.dead.wait()
                return
            self._kill(actor.handle)
            await self._crashed(actor, cause=unanswered_cause(2 * _DEATH_VERDICT_S))
            return
        except RayActorError as exc:
            await self._crashed(actor, exc)
            return
        except Exception as exc:  # the stream broke without the actor dying: this turn alone ends
            log.exception("turn %s on worker %s failed in transit", turn.spec.session_id, actor.pid)
            broken = f"{type(exc).__name__}: {exc}"[:4000]
            self._finish(turn, TurnOutcome(stop_reason="error", diagnostic=broken), crash=broken)
            self._schedule()
            return
        if not turn.done.is_set():
            ended = "the worker's stream ended without an outcome"
            self._finish(turn, TurnOutcome(stop_reason="error", diagnostic=ended), crash=ended)
            self._schedule()

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
            except ActorUnavailableError:
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > _DEATH_VERDICT_S:
                    self._kill(actor.handle)
                    await self._crashed(actor, cause=unanswered_cause(_DEATH_VERDICT_S))
                    return
                await anyio.sleep(0.05)
            except RayActorError as exc:
                await self._crashed(actor, exc)
                return

    async def _watch_service(self, service: Any) -> None:
        """Keep one ``watch()`` call pending on the store service; when it dies, start another and replace
        every worker actor (each holds the dead one's handle): their resident turns end ``error`` naming the
        store service, and their callers repair the logs here, where the store is."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        while not self._closing:
            try:
                await service.watch.remote()
                return
            except ActorUnavailableError:
                await anyio.sleep(0.05)  # not yet a verdict: Ray's ActorDiedError follows, or it answers again
            except RayActorError as exc:
                if self._closing:
                    return
                self._service_restarts += 1
                log.error("the store service died (%s); starting another and replacing the worker actors", crash_cause(exc))
                service = self._service = self._service_class.remote(self._store_root, self._durability)
                assert self._tg is not None
                for actor in self._slots:
                    if actor is not None and self._declare_dead(actor, "the store service it appended through died; the pool replaced both"):
                        self._kill(actor.handle)
                        self._tg.start_soon(self._replace, actor.index)

    async def _crashed(self, actor: _Actor, exc: BaseException | None = None, *, cause: str | None = None) -> None:
        """End every turn resident on a dead actor (``cause``, else Ray's error ``exc`` says why), then start its
        replacement."""
        if self._declare_dead(actor, cause if cause is not None else crash_cause(exc or RuntimeError("died"))) and not self._closing:
            # no deadline: after a node loss the replacement waits until the cluster has room
            await self._replace(actor.index)

    def _declare_dead(self, actor: _Actor, cause: str) -> bool:
        """At once, so nothing is dispatched to it meanwhile: end its resident turns (``cause`` says why it
        died) and free its slot; whether this call did (an actor is declared dead once, never at close)."""
        if not actor.alive or self._closing:
            return False
        actor.alive = False
        actor.dead.set()
        self._crash_count += 1
        crash = WorkerCrashedError(actor.pid, None, node=actor.node, cause=cause)
        log.error("%s", crash)
        self._end_resident(actor, f"{crash.code}: {crash}")
        self._slots[actor.index] = None
        return True
