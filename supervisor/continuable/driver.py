"""The driver: one task per activation, running its mailbox as turns until it settles or is disposed.

Each pass reads the pending mailbox from the cursor. *Quiet* messages wait
and ride along as context of the next turn; each *waking* message is one
turn (a followup never steers a running turn). With no waking message the
driver waits while deliveries are in flight, sets its lease ``idle`` and
waits while it owns live children, and otherwise settles (the loop ends and
teardown disposes the activation). After each turn the cursor follows what
the log says was consumed: advanced for a committed turn, re-read after a
crash or a turn that failed before logging, advanced by ``message/discarded``
for a turn stopped before any worker took it.

The loop is an isolation boundary: whatever fails in it — the child's own
files damaged, its provider gone — ends this activation with ``error``
(logged with its traceback); the supervisor and the other activations carry
on, and the next activation of the child starts from what its log says.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import anyio

from subagents.store import LogWriter, MailboxMessage, acquire_lease, pending, read_projection, set_lease_state
from subagents.store.errors import FencedError, SubagentError
from subagents.worker.logcontext import bind
from subagents.worker.protocol import TurnOutcome, TurnSpec

from ..backend import TurnRpcHandler, TurnTicket
from ..descriptors import outlasting
from ..errors import SupervisorClosedError, program_missing
from ..registry import ProgramRef
from ..runtime import Runtime
from ..turn_log import read_back
from .activation import Activation, ActivationTable, LeaseState, log_fields
from .teardown import Teardown

__all__ = ["Driver", "continuable_turn_spec"]

log = logging.getLogger(__name__)

RpcFactory = Callable[[TurnSpec], TurnRpcHandler]

# how a turn ends when it was stopped rather than finished: an interrupt, a drain or its budget
_STOPPED = frozenset({"aborted", "budget-exhausted"})


def continuable_turn_spec(rt: Runtime, act: Activation, program: ProgramRef, quiet: list[MailboxMessage], main: MailboxMessage) -> TurnSpec:
    """The turn that consumes ``main`` (and the ``quiet`` messages before it) under the activation's lease."""
    ident = act.identity
    tf = ident.descriptor.tool_filter
    return TurnSpec(
        session_id=ident.child_id, epoch=ident.epoch, store_root=rt.store.root, durability=rt.store.durability.name,
        program=program[0], program_blob=program[1], message_id=main.id, message_source=main.source, message=main.content,
        message_mailbox_end=main.end, log_message=True, budget=ident.budget, depth=ident.depth, mode="continuable",
        label=ident.descriptor.label, provider=ident.descriptor.provider, parent_session=ident.parent_id,
        persona=ident.descriptor.persona, tool_filter=None if tf is None else tf.to_record(), sandbox=ident.sandbox,
        agent_model=ident.descriptor.agent_model, notices=[m.to_event_data() for m in quiet],
    )


class Driver:
    def __init__(self, rt: Runtime, table: ActivationTable, teardown: Teardown, *, rpc_for: RpcFactory) -> None:
        self._rt = rt
        self._table = table
        self._teardown = teardown
        self._rpc_for = rpc_for

    async def run(self, act: Activation) -> None:
        """Run turns until the activation settles or its disposal begins (the caller then disposes it)."""
        bind(**log_fields(act))
        try:
            await self._loop(act)
        except SupervisorClosedError:  # the pool closed under a turn being queued: its message stays pending
            log.info("driver of %s stopped: the supervisor closed", act.child_id, extra=log_fields(act))
            act.reasons.append("error")
        except SubagentError as exc:  # a diagnosed condition (a damaged mailbox, a program gone): its code says it
            log.error("driver of %s stopped: %s: %s", act.child_id, exc.code, exc.message, extra=log_fields(act))
            act.reasons.append("error")
        except Exception:  # isolation boundary: see the module docstring; a traceback is for a bug
            log.exception("driver of %s failed", act.child_id, extra=log_fields(act))
            act.reasons.append("error")

    async def _loop(self, act: Activation) -> None:
        program: ProgramRef | None = None
        while not act.disposing:
            act.wake = anyio.Event()
            messages = await outlasting(lambda: self._rt.store_thread.run(self._pending, act), f"the mailbox read of {act.child_id}")
            waking = next((i for i, m in enumerate(messages) if m.wake), None)
            if waking is None:
                # a delivery in flight (accepting, or still finding this activation), or one that
                # landed after the read began (its poke set ``wake``): read again rather than
                # settle over an accepted message
                if act.admitted or act.wake.is_set() or self._table.routing_to(act.child_id):
                    await act.wake.wait()
                    continue
                if self._table.owned(act.child_id):
                    await self._set_lease_state(act, LeaseState.WAITING)
                    await act.wake.wait()
                    continue
                return  # settled
            if program is None:
                program = self._rt.registry.program_for(act.identity.descriptor.provider, recorded=act.identity.descriptor.program)
                if program is None:
                    raise program_missing(act.child_id, act.identity.descriptor.provider)
            await self._set_lease_state(act, LeaseState.RUNNING)
            if act.disposing:
                return  # fenced while recording the state: never dispatch a turn it cannot write
            if not await self._turn(act, program, messages[:waking], messages[waking]):
                return  # its turn failed before it took its message: settled, the message kept (``_turn``)

    async def _turn(self, act: Activation, program: ProgramRef, quiet: list[MailboxMessage], main: MailboxMessage) -> bool:
        """Run one turn; whether the driver goes on. It stops when the turn failed before it took its
        message (the worker's writer refused the log, which a retry would meet again at once): the
        activation settles ``error`` and the message stays pending, durable, for a later activation,
        which is not started for it straight away (``Activation.stalled``)."""
        rt = self._rt
        spec = continuable_turn_spec(rt, act, program, quiet, main)
        stop, act.stop_before = act.stop_before, None
        interrupted = stop[0] if stop is not None and main.ts < stop[1] else None

        def started(ticket: TurnTicket) -> None:
            act.ticket = ticket
            reason = "parent" if act.disposing else interrupted
            if reason is not None:
                rt.pool.cancel(ticket, reason)

        act.turn_message_ts, act.turn_message_id = main.ts, main.id
        on_rpc = self._rpc_for(spec)
        try:
            turn = await rt.pool.run_turn(spec, on_rpc, started=started)
        finally:
            act.ticket = act.turn_message_ts = act.turn_message_id = None
            with anyio.CancelScope(shield=True):
                # a child start the turn left in flight lands in this session's children index
                # before anything follows the turn: a settlement's release writes the catalog row
                await on_rpc.starts_done()
        if turn.cancel_reason is not None or turn.crashed or turn.outcome.stop_reason in _STOPPED:
            # the one-shot children it started belong to the turn (``supervisor/rpc.py``), as a one-shot
            # parent's do: one it waited on would otherwise run on for a result nobody reads
            on_rpc.cancel_children("parent")
        outcome = turn.outcome
        if not turn.dispatched:
            # stopped before a worker took it, so nothing was logged: an interrupt or a
            # drain consumes it unrun (durably); closing the supervisor leaves it pending
            if not act.disposing or act.discard:
                cause = "drain" if act.disposing else turn.cancel_reason
                await rt.store_thread.run(self._discard, act, [*quiet, main], cause)
        elif turn.crashed:
            outcome = await rt.store_thread.run(self._repair, act, turn.cancel_reason, turn.crash, turn.outcome, main.id)
        elif turn.outcome.stop_reason == "error" and not turn.outcome.fenced:
            # a turn can fail before it logs its message (its log would not open):
            # what it consumed is what the log says, never an assumption
            consumed = act.cursor.consumed
            await rt.store_thread.run(self._recount, act)
            if act.cursor.consumed == consumed:
                act.stalled = True
                log.warning("turn of %s failed before it took message %s (%s); the activation settles and the message stays pending",
                            act.child_id, main.id, turn.outcome.diagnostic, extra=log_fields(act))
        elif not act.fenced:
            act.cursor.advance([*quiet, main])
        act.reasons.append(outcome.stop_reason)
        if outcome.output:  # the closing message is the epoch's last non-empty reply
            act.last_output = outcome.output
        if turn.outcome.fenced:
            self._teardown.fence(act)
        return not act.stalled

    async def _set_lease_state(self, act: Activation, state: LeaseState) -> None:
        if act.lease_state is state:
            return
        act.lease_state = state
        rt = self._rt
        try:
            await rt.store_thread.run(lambda: set_lease_state(rt.store, act.child_id, rt.owner_id, act.epoch, state.value))  # type: ignore[arg-type]
        except FencedError:
            self._teardown.fence(act)

    def _pending(self, act: Activation) -> list[MailboxMessage]:
        """The activation's unconsumed mailbox messages (read from where its log says they start)."""
        c = act.cursor
        return pending(self._rt.store, act.child_id, consumed=c.consumed, last_consumed_id=c.last_id, mailbox_end=c.mailbox_end)

    def _recount(self, act: Activation) -> None:
        """Take the cursor from the log itself."""
        try:
            act.cursor.reset(read_projection(self._rt.store, act.child_id))
        except SubagentError:
            log.exception("could not re-read what %s consumed", act.child_id, extra=log_fields(act))

    def _repair(self, act: Activation, cause: str | None, crash: str | None, outcome: TurnOutcome, message_id: str) -> TurnOutcome:
        """Fence, then balance the log of a turn whose worker died; what it consumed is what its log
        says (a message the dead worker never logged stays pending and runs again). ``cause``: the
        cancel the turn was under (its worker killed for ignoring it), recorded on its ``turn/end`` with
        ``crash``, how the worker died. Returns the turn's outcome as the epoch counts it: the pool's
        ``outcome`` (the crash) with the last reply the turn logged as its output, or what the log
        says when the worker died after the closing commit of this turn (the one that took ``message_id``;
        ``supervisor/turn_log.py``).

        Fence before repair: the activation takes its own lease again (epoch + 1,
        the lease state kept) before it repairs, so a worker only *believed* dead
        (on a cluster node cut off from us) gets ``FencedError`` on its next
        append instead of writing after the closers. The activation writes at the
        new epoch from then on.
        """
        try:
            lease = acquire_lease(self._rt.store, act.child_id, self._rt.owner_id, state=act.lease_state.value)  # type: ignore[arg-type]
            act.identity = dataclasses.replace(act.identity, epoch=lease.epoch)
            with LogWriter.open(self._rt.store, act.child_id, epoch=act.epoch, cause=cause, crash=crash) as writer:
                act.cursor.reset(writer.projection)
                committed, said = read_back(self._rt.store, writer, message_id=message_id)
            if committed is not None:
                return committed
            if said:
                return dataclasses.replace(outcome, output=said)
        except SubagentError:
            log.exception("repair of %s failed", act.child_id, extra=log_fields(act))
        return outcome

    def _discard(self, act: Activation, messages: list[MailboxMessage], cause: str | None) -> None:
        """Record the head of the pending mailbox as consumed unrun (``message/discarded``), with who
        dropped it (``cause``: the interrupt's reason, or ``drain``), which listings tell apart."""
        data: dict[str, object] = {"cause": cause} if cause is not None else {}
        with LogWriter.open(self._rt.store, act.child_id, epoch=act.epoch) as writer:
            writer.append([("message/discarded", {"message_id": m.id, "mailbox_end": m.end, **data}) for m in messages], commit=True)
        act.cursor.advance(messages)
