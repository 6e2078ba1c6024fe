"""``TurnRunner``: runs the turns a host process hands it, whatever carries the messages.

The host owns the transport and passes messages on: ``run(RunTurn, send)``
runs one turn to its outcome (``send`` carries that turn's ``Rpc`` requests
to the supervisor), ``cancel(Cancel)`` stops a turn, ``reply(Reply)`` answers
an RPC. Today's host is the worker process's pipe loop (``worker/main.py``);
an actor of a cluster framework can host a runner the same way.

The runner owns the state of the turns resident in its process: each turn's
``TurnControl`` (admitted before its task starts, so a ``Cancel`` that
follows its ``RunTurn`` always finds it), the RPCs in flight, and the open
store handles. Every admitted turn ends with an outcome, never a hang: a
failure outside the program becomes an ``error`` outcome.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio

from subagents.store.errors import SubagentError, from_wire
from subagents.store.root import Store

from .budget import TIMEOUT, TurnControl
from .logcontext import bind
from .protocol import BLOCKING_RPCS, CHILD_STARTS, Cancel, CancelRpc, Reply, Rpc, RunTurn, TurnOutcome, TurnSpec
from .sessions import LocalSessions, SessionAccess
from .turn import run_turn

__all__ = ["TurnRunner", "RpcSender", "SessionsFor", "LocalStores"]

log = logging.getLogger(__name__)

RpcSender = Callable[[Rpc | CancelRpc], None]
SessionsFor = Callable[[TurnSpec], SessionAccess]

# open store handles a worker keeps: opening one reads and checks the STORE marker, which
# every turn would repeat; a worker rarely serves more than one store
_MAX_STORES = 16


class LocalStores:
    """The default ``SessionsFor``: one ``LocalSessions`` per (store root, durability), reused across turns.

    A handle holds no session state (``store/root.py``), so sharing it is safe.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], LocalSessions] = {}

    def __call__(self, spec: TurnSpec) -> SessionAccess:
        key = (spec.store_root, spec.durability)
        sessions = self._open.get(key)
        if sessions is None:
            sessions = LocalSessions(Store(spec.store_root, durability=spec.durability, create=False))
            if len(self._open) >= _MAX_STORES:
                self._open.pop(next(iter(self._open))).close()  # the oldest
            self._open[key] = sessions
        return sessions


@dataclass(eq=False)
class _Waiter:
    """One RPC awaiting its ``Reply``."""

    event: anyio.Event = field(default_factory=anyio.Event)
    reply: Reply | None = None


class TurnRunner:
    """The turns resident in one process: admit, run, cancel, and the RPCs they make."""

    def __init__(self, sessions_for: SessionsFor | None = None, *, on_park: Callable[[bool], None] | None = None,
                 load_hint: str = "") -> None:
        self._sessions_for = sessions_for or LocalStores()
        self._load_hint = load_hint  # after the diagnostic of a program this process cannot load (``run_turn``)
        # told when a turn begins (True) and ends (False) a waiting RPC (``BLOCKING_RPCS``): the
        # host frees that turn's slot meanwhile, as the pool does
        self._on_park = on_park
        self._turns: dict[int, TurnControl] = {}
        self._rpc_ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        # child-starting RPCs sent and not yet answered: rpc id → the turn's call id (``_release_allowed``)
        self._starting: dict[int, int] = {}
        # waiting RPCs in flight per turn (call id → count): a turn parks at its first and unparks after its last.
        # Told per call, a turn with two in flight (a model's tool calls run at once) freed two slots
        self._waiting: dict[int, int] = {}

    @property
    def resident(self) -> int:
        return len(self._turns)

    def admit(self, msg: RunTurn) -> None:
        """Register the turn before its task starts, so that a ``Cancel`` right behind it finds it."""
        if msg.call_id not in self._turns:
            self._turns[msg.call_id] = TurnControl(max_steps=msg.spec.budget.max_steps, timeout_ms=msg.spec.budget.timeout_ms)

    async def run(self, msg: RunTurn, send: RpcSender) -> TurnOutcome:
        """Run one turn to its outcome; its RPC requests go out through ``send``."""
        self.admit(msg)
        control = self._turns[msg.call_id]
        spec = msg.spec

        async def rpc(method: str, args: dict[str, Any]) -> Any:
            return await self._call(msg.call_id, send, method, args)

        def release_allowed() -> bool:
            return msg.call_id not in self._starting.values()

        bind(child=spec.session_id, parent=spec.parent_session, epoch=spec.epoch)
        try:
            return await run_turn(spec, control, rpc, sessions=self._sessions_for(spec), node=msg.node, release_allowed=release_allowed,
                                  load_hint=self._load_hint)
        except Exception as exc:  # a store failure outside the program: report, never hang the caller
            log.exception("turn failed outside its program", extra={"session": spec.session_id})
            # a store's error by its code (``DURABILITY_FAILED``), as the turn's own diagnostics say it, not its class
            cause = f"{exc.code}: {exc}" if isinstance(exc, SubagentError) else f"{type(exc).__name__}: {exc}"
            return TurnOutcome(stop_reason="error", diagnostic=cause[:4000], steps=control.steps)
        finally:
            self._turns.pop(msg.call_id, None)
            for rpc_id in [r for r, c in self._starting.items() if c == msg.call_id]:
                del self._starting[rpc_id]

    def _park(self, call_id: int, parked: bool) -> None:
        """Count a waiting RPC of the turn in (True) or out (False); ``on_park`` hears the turn's first and last."""
        count = self._waiting.get(call_id, 0) + (1 if parked else -1)
        if count:
            self._waiting[call_id] = count
        else:
            del self._waiting[call_id]
        if self._on_park is not None and count == (1 if parked else 0):
            self._on_park(parked)

    def cancel(self, msg: Cancel) -> None:
        """Stop a resident turn (first cause wins); an unknown or finished turn is a no-op."""
        control = self._turns.get(msg.call_id)
        if control is None:
            return
        if msg.reason == TIMEOUT:  # the host holding the turn's budget: stopped as its own timer would stop it
            control.time_out()
        else:
            control.stop("aborted", f"the turn was cancelled ({msg.reason})", why=msg.reason)

    def cancel_all(self, reason: str) -> None:
        """Stop every resident turn as ``cancel`` would (at shutdown: each still closes its log and reports)."""
        for call_id in list(self._turns):
            self.cancel(Cancel(call_id=call_id, reason=reason))

    def reply(self, msg: Reply) -> None:
        """Hand an RPC's answer to the turn awaiting it (a late reply for a gone turn is dropped)."""
        self._starting.pop(msg.rpc_id, None)
        waiter = self._waiters.get(msg.rpc_id)
        if waiter is not None:
            waiter.reply = msg
            waiter.event.set()

    async def _call(self, call_id: int, send: RpcSender, method: str, args: dict[str, Any]) -> Any:
        rpc_id = next(self._rpc_ids)
        waiter = _Waiter()
        self._waiters[rpc_id] = waiter
        if method in CHILD_STARTS:
            self._starting[rpc_id] = call_id
        waits = method in BLOCKING_RPCS
        parked = False
        try:
            send(Rpc(rpc_id=rpc_id, call_id=call_id, method=method, args=args))
            if waits:
                self._park(call_id, True)
                parked = True
            await waiter.event.wait()
        finally:
            self._waiters.pop(rpc_id, None)
            if parked:
                self._park(call_id, False)
            if waiter.reply is None and method in BLOCKING_RPCS:
                # the program stopped waiting (its own timeout, a cancel) while its turn goes on: the host
                # stops the wait and what it waited on, or a child started for nobody would run to its end.
                # A stopped turn's children are the host's to stop, once their creation has landed
                control = self._turns.get(call_id)
                if control is not None and not control.stopping:
                    send(CancelRpc(rpc_id=rpc_id))
        reply = waiter.reply
        assert reply is not None
        if not reply.ok:
            raise from_wire(reply.error or {})
        return reply.value
