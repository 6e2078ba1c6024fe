"""``Interrupts``: one interrupt routed to whoever runs the target's turn, and what came of it.

A user interrupt (``UserAuthority``: the target's recorded parent) reaches
every running turn on the store. A one-shot run or a continuable activation
held by this supervisor is stopped here (``OneShotRuns.interrupt``,
``ContinuationManager.interrupt``). A child whose lease a live other
supervisor holds gets a durable ``interrupt`` control record, which that
supervisor's pollers carry out; the caller may wait, bounded, until the
child's log shows the turn ended. An ancestor interrupt (a turn's
``ctx.interrupt``) keeps the reference rule: it reaches continuable
activations resident here only, and a miss is a no-op.

The answer is an ``InterruptResult``: ``cancelled``, ``requested`` or
``no_turn_running`` with the reason. Not guaranteed: a turn may end on its
own between the read and the cancel (then the log, not this answer, says
how it ended); another host's confirmation is what its log shows within the
wait, nothing more. Of several requests for one turn another host carries
out, only the first in its control file is answered ``cancelled`` (the rest:
already being stopped); an interrupt asked inside the holder's own process
leaves no record, so a request racing one is still answered ``cancelled``. Built by the ``Supervisor``; called by
``Supervisor.interrupt``. Never writes anything but the control record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio

from subagents.store import (
    Projection,
    SessionHeader,
    SessionNotFoundError,
    outcome_of,
    read_from,
    read_header,
    read_lease,
    read_owner,
    read_projection,
    owner_alive,
    validate_session_id,
)
from subagents.store.control import ControlRecord, read_controls
from subagents.store.control import request as control_request
from subagents.store.errors import SubagentError

from .continuable import ContinuationManager
from .errors import UnauthorizedError
from .lock_wait import LockWait
from .models import AncestorAuthority, InterruptResult, UserAuthority
from .oneshot import OneShotRuns
from .runtime import Runtime

__all__ = ["Interrupts", "CONFIRM_POLL_S"]

CONFIRM_POLL_S = 0.02  # how often a wait for another host's confirmation reads the child's log and lease


@dataclass(frozen=True)
class _Turn:
    """The turn open in a child's log: its number (1: the first) and the message it runs."""

    number: int | None = None
    message_id: str | None = None


@dataclass(frozen=True)
class _Holder:
    """Who holds a child's lease, as read once."""

    owner: str
    epoch: int
    state: str
    pid: int | None


class Interrupts:
    def __init__(self, rt: Runtime, runs: OneShotRuns, continuation: ContinuationManager) -> None:
        self._rt = rt
        self._runs = runs
        self._continuation = continuation

    async def interrupt(self, target_id: str, authority: UserAuthority | AncestorAuthority, *, wait_s: float = 0.0) -> InterruptResult:
        if isinstance(authority, AncestorAuthority):
            # the turn is read before the cancel: a turn quick to stop has no open turn left to name after it
            turn = await anyio.to_thread.run_sync(self._open_turn, target_id) if self._continuation.hosts(target_id) else _Turn()
            if self._continuation.interrupt(target_id, authority):
                return _cancelled(target_id, await self._stopped_turn(target_id, turn))
            return _nothing(target_id, self._no_turn_here(target_id, "it has no turn running as a continuable child of this supervisor"))
        header = await anyio.to_thread.run_sync(self._header, target_id)
        if header is None:
            return _nothing(target_id, "there is no session with this id")
        if header.parent_session != authority.parent_session:
            raise UnauthorizedError.other_parent(target_id)
        if target_id in self._runs.runs:
            turn = await anyio.to_thread.run_sync(self._open_turn, target_id)
            if self._runs.interrupt(target_id):
                return _cancelled(target_id, turn)
            return _nothing(target_id, "its one-shot turn has ended, or is already being stopped")
        if self._continuation.hosts(target_id):
            turn = await anyio.to_thread.run_sync(self._open_turn, target_id)
            if self._continuation.interrupt(target_id, authority):
                return _cancelled(target_id, await self._stopped_turn(target_id, turn))
            return _nothing(target_id, self._no_turn_here(target_id, "it is idle in this supervisor: no turn is running or queued"))
        return await self._elsewhere(target_id, wait_s)

    # -- held here -------------------------------------------------------------------------

    def _no_turn_here(self, target_id: str, otherwise: str) -> str:
        """Why a continuable child held here had no turn to stop: an earlier interrupt's cancel is
        still under way (the turn may ignore it until ``cancel_grace_s``), or ``otherwise``."""
        return "its turn is already being stopped (an earlier interrupt)" if self._continuation.stopping(target_id) else otherwise

    async def _stopped_turn(self, target_id: str, read: _Turn) -> _Turn:
        """The turn a continuable child's cancel reached, named as the answer says it: ``read``, the turn
        the log showed open before the cancel, unless the activation moved on while it was read (that
        turn ended and the next one was dispatched, or none is in flight and the next one will be
        stopped as it is). Named from the read, a ``cancelled`` answer named a turn that ran to its end,
        whose message a caller might send again, and not the one it stopped."""
        running = self._continuation.turn_message(target_id)
        if running == read.message_id:
            return read
        if running is None:
            return _Turn()  # the next turn is stopped before a worker takes it
        again = await anyio.to_thread.run_sync(self._open_turn, target_id)
        return again if again.message_id == running else _Turn(None, running)

    def _header(self, target_id: str) -> SessionHeader | None:
        """The target's header; None for a well-formed id with no session (a malformed one raises ``INVALID_SESSION_ID``)."""
        try:
            return read_header(self._rt.store, validate_session_id(target_id))
        except SessionNotFoundError:
            return None

    def _open_turn(self, target_id: str) -> _Turn:
        try:
            projection = read_projection(self._rt.store, target_id)
            return _open_turn_of(self._rt.store, target_id, projection)
        except SubagentError:
            return _Turn()  # the answer names the turn when it can; the interrupt does not depend on it

    # -- held by another supervisor ----------------------------------------------------------

    def _holder(self, target_id: str) -> _Holder | None:
        """The live other supervisor that holds the child's lease, if one does."""
        lease = read_lease(self._rt.store, target_id)
        if lease is None or lease.state == "released" or lease.owner == self._rt.owner_id:
            return None
        owner = read_owner(self._rt.store, lease.owner)
        if not owner_alive(owner):
            return None
        return _Holder(lease.owner, lease.epoch, lease.state, owner.pid if owner is not None else None)

    async def _elsewhere(self, target_id: str, wait_s: float) -> InterruptResult:
        store = self._rt.store

        def ask(timeout: float) -> tuple[_Holder | None, Projection, str | None]:
            holder = self._holder(target_id)
            projection = read_projection(store, target_id)
            if holder is not None and holder.state != "idle" and not _one_shot_ended(projection):
                data = {"reason": "user", **_aim(store, target_id, projection)}
                return holder, projection, control_request(store, target_id, "interrupt", data, ids=self._rt.ids, lock_timeout=timeout)
            return holder, projection, None

        async def asked(timeout: float) -> tuple[_Holder | None, Projection, str | None]:
            with anyio.CancelScope(shield=True):  # an acknowledged request is durable: never cut between write and answer
                return await anyio.to_thread.run_sync(ask, timeout)

        # a stopped process that holds the child's lock ends the wait at the caller's deadline (``lock_wait.py``)
        holder, before, request_id = await LockWait.of_caller().run(asked)
        if holder is None:
            return _nothing(target_id, _why_unheld(before))
        if holder.state == "idle":
            return _nothing(target_id, f"it is idle in supervisor {holder.owner}{_pid(holder)}: it waits on its own children",
                            host=holder.owner, host_pid=holder.pid)
        if _one_shot_ended(before):
            # its one turn ended (the log, read after the lease, says how) and the holder has yet to let
            # it go: nothing to stop, and its release later is no sign of a turn stopped before it ran
            reason = before.last_stop_reason
            return _nothing(target_id, f"its turn ended {reason} before the interrupt reached it", stop_reason=reason,
                            host=holder.owner, host_pid=holder.pid)
        turn = await anyio.to_thread.run_sync(_open_turn_of, store, target_id, before)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            await anyio.sleep(CONFIRM_POLL_S)
            seen = await anyio.to_thread.run_sync(self._after, target_id, before, holder)
            if seen is not None:
                turn = seen.get("turn", turn)
                answer = _confirmed(target_id, turn, holder, seen)
                if answer.outcome == "cancelled" and request_id is not None:
                    one_shot = getattr(before.identity, "mode", None) == "one-shot"
                    earlier = await anyio.to_thread.run_sync(_earlier_request, store, target_id, request_id, one_shot)
                    if earlier is not None:
                        return _stopped_by_earlier(target_id, turn, holder, earlier, answer)
                return answer
        return InterruptResult(
            outcome="requested", child_id=target_id, turn=turn.number, message_id=turn.message_id, host=holder.owner, host_pid=holder.pid,
            detail=f"its log showed no end of the turn within {wait_s:g} s" if wait_s > 0 else "not waited for",
        )

    def _after(self, target_id: str, before: Projection, holder: _Holder) -> dict[str, Any] | None:
        """What ended the turn since ``before``: its ``turn/end`` or ``message/discarded`` record (a
        ``turn/end`` of a turn that began after ``before`` carries it as ``turn``, a ``_Turn``),
        ``{"released": ...}`` when the holder let the child go without either, ``{"died": ...}`` when it
        died (same host: its pid; else its heartbeat) with neither written; None: nothing yet.

        The lease is read before the log: a holder writes the turn's end before it lets the child
        go, so a lease seen let go with no end in the log read after it really ended without one.
        The holder taking its own lease again (a higher epoch: it fenced a dead worker to repair
        the log) has not let go: the repair's ``turn/end`` follows.
        """
        store = self._rt.store
        lease = read_lease(store, target_id)
        now = read_projection(store, target_id)
        if (now.turns, now.discarded) != (before.turns, before.discarded):
            started = None
            for event in read_from(store, target_id, before.seq + 1):
                if event["type"] == "turn/start":
                    started = (event.get("data") or {}).get("message_id")
                if event["type"] in ("turn/end", "message/discarded"):
                    if event["type"] == "turn/end" and before.open_turn is None:
                        # a turn that began after the request was aimed (at the next one): the log names it
                        return {**event, "turn": _Turn(before.turns + 1, started if isinstance(started, str) else None)}
                    return event
        if lease is None or lease.state == "released" or lease.owner != holder.owner:
            return {"type": "released", "data": {}, "one_shot": getattr(now.identity, "mode", None) == "one-shot"}
        if not owner_alive(read_owner(store, holder.owner)):
            return {"type": "died", "data": {}}  # its turn is left open until a supervisor repairs it
        return None


# -- answers -------------------------------------------------------------------------------------


def _open_turn_of(store: Any, target_id: str, projection: Projection) -> _Turn:
    if projection.open_turn is None:
        return _Turn()
    start = next((e for e in read_from(store, target_id, projection.open_turn) if e["type"] == "turn/start"), None)
    message_id = (start or {}).get("data", {}).get("message_id")
    return _Turn(projection.turns + 1, message_id if isinstance(message_id, str) else None)


def _aim(store: Any, target_id: str, projection: Projection) -> dict[str, Any]:
    """The turn a request is about, as its holder can tell it from later ones: the running turn's
    message, or, with none running, the last message the log consumed (the turn to stop comes
    next). A request read after that turn ended then stops nothing, as its answer says."""
    if projection.open_turn is None:
        return {"after_message_id": projection.last_message_id}
    message_id = _open_turn_of(store, target_id, projection).message_id
    return {"message_id": message_id} if message_id is not None else {}


def _earlier_request(store: Any, target_id: str, request_id: str, one_shot: bool) -> ControlRecord | None:
    """The first interrupt record before ours that asked to stop the same turn, if any.

    The holder applies a child's control records in their order, so that one stopped the turn and
    ours found it already stopping: only its asker may say "cancelled". The same turn: for a
    one-shot child, any (it has one turn); for a continuable one, a record aimed as ours is (the
    same running turn's message, or the same last consumed message before it). Not seen: an
    interrupt asked in the holder's own process, which leaves no record.
    """
    records = read_controls(store, target_id)
    mine = next((r for r in records if r.id == request_id), None)
    if mine is None:
        return None
    for record in records:
        if record.seq >= mine.seq:
            return None
        if record.kind == "interrupt" and (one_shot or _aim_of(record) == _aim_of(mine)):
            return record
    return None


def _aim_of(record: ControlRecord) -> dict[str, Any]:
    return {key: record.data.get(key) for key in ("message_id", "after_message_id")}


def _stopped_by_earlier(target_id: str, turn: _Turn, holder: _Holder, earlier: ControlRecord, seen: InterruptResult) -> InterruptResult:
    which = f"its turn {turn.number}" if turn.number is not None else "its turn"
    return _nothing(target_id, f"{which} was already being stopped by an earlier interrupt (control record {earlier.seq}), "
                               f"which supervisor {holder.owner} carried out", stop_reason=seen.stop_reason, turn=turn.number,
                    message_id=turn.message_id, host=holder.owner, host_pid=holder.pid)


def _one_shot_ended(projection: Projection) -> bool:
    """A one-shot child whose one turn has ended: an interrupt finds nothing of it left to stop."""
    return getattr(projection.identity, "mode", None) == "one-shot" and projection.turns > 0


def _pid(holder: _Holder) -> str:
    return f" (pid {holder.pid})" if holder.pid is not None else ""


def _cancelled(target_id: str, turn: _Turn) -> InterruptResult:
    detail = "stopped here" if turn.number is not None else "stopped here before a worker took it"
    return InterruptResult(outcome="cancelled", child_id=target_id, turn=turn.number, message_id=turn.message_id, detail=detail)


def _nothing(target_id: str, detail: str, **fields: Any) -> InterruptResult:
    return InterruptResult(outcome="no_turn_running", child_id=target_id, detail=detail, **fields)


def _why_unheld(projection: Projection) -> str:
    verdict = outcome_of(projection, held=False)
    # ``not-started``: a child whose host let it go before any turn of it ran (a one-shot queued for a
    # worker as its host closed), no turn that ended so
    if verdict.outcome in (None, "not-started"):
        return "no live supervisor holds it, and no turn of it has run"
    if verdict.outcome == "crashed":
        return "no live supervisor holds it: its host stopped mid-turn"
    return f"no live supervisor holds it; its last turn ended {verdict.outcome}"


def _confirmed(target_id: str, turn: _Turn, holder: _Holder, seen: dict[str, Any]) -> InterruptResult:
    """The answer once the holder's log (or lease) moved after the request."""
    host = {"host": holder.owner, "host_pid": holder.pid}
    by = f"by supervisor {holder.owner}{_pid(holder)}"
    if seen["type"] == "message/discarded":
        return InterruptResult(outcome="cancelled", child_id=target_id, detail=f"stopped {by} before a worker took it", **host)
    if seen["type"] == "died":
        return _nothing(target_id, f"its host, supervisor {holder.owner}{_pid(holder)}, died before carrying out the interrupt; its turn "
                                   "is left as the crash left it (the next supervisor to take the child closes it interrupted)",
                        turn=turn.number, message_id=turn.message_id, **host)
    if seen["type"] == "released":
        if seen["one_shot"]:  # a one-shot run stopped while queued for a worker logs no turn
            return InterruptResult(outcome="cancelled", child_id=target_id, detail=f"stopped {by} before a worker took it", **host)
        return _nothing(target_id, f"supervisor {holder.owner} let it go before any turn of it ended", **host)
    data = seen.get("data") or {}
    reason, cause = data.get("stop_reason"), data.get("cause")
    if cause == "user" and reason in ("aborted", "interrupted"):
        # ``interrupted`` with the user's cause: the turn ignored the cancel and the holder killed its
        # worker (crash repair names the cancel it was under), as the same interrupt asked here does
        killed = ": its worker ignored the interrupt and was killed" if reason == "interrupted" else ""
        return InterruptResult(outcome="cancelled", child_id=target_id, turn=turn.number, message_id=turn.message_id,
                               stop_reason=reason, detail=f"stopped {by}{killed}", **host)
    return _nothing(target_id, f"its turn ended {reason} before the interrupt reached it", stop_reason=reason, turn=turn.number,
                    message_id=turn.message_id, **host)
