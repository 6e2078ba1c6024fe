"""One-shot runs: validate → create the child durably → run one turn → result → dispose.

Ownership: until ``start`` returns, this module owns setup and rolls back
everything unpublished on failure or cancellation (no session file, no
index entry, no lease, no lifecycle events). After, the caller owns the
``SubagentRun`` and must ``dispose()`` it.

Creation goes through ``SessionCreator`` (batched store work on long-lived
store threads). The worker releases the child's lease right after the turn's commit
(``TurnSpec.release_owner``); the supervisor releases it only when the worker
did not (a crash, a takeover, a store failure).

Every validation happens before the first byte is written, in this order:
provider (``NO_PROVIDER``), capabilities (``UNSUPPORTED_CAPABILITY``), the
request's fields (``validation.py``), parent and depth (``SubagentDepthError``).
Built by the ``Supervisor`` from its ``Runtime``. No task waits for a run's
turn: the pool calls back when it ended (``Pool.submit``), and the run is
finished right there when its worker committed the turn and released the
lease; only a crash repair or a release left to us runs as a task of the
runtime's task group (starting a task costs more CPU than a whole child's
bookkeeping otherwise does). A running turn is stopped by its holder
(``SubagentRun.cancel``), by a user interrupt here (``interrupt``), by one
from another process through the child's control file (``ControlPoller``), or
because another process took the child over while this one was stopped
(``stop_taken_over``, after the heartbeat lapsed).

(About 500 lines: a run's whole life, from the checks before its creation to
its repair after a crash, kept in one place so that who owns a run at each
step reads in one file.)
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import anyio
from anyio.lowlevel import EventLoopToken

from subagents.store import LogWriter, OneShotDescriptor, acquire_lease, delete_session, release_lease
from subagents.store.appender import check_fits
from subagents.store.events import widest_event
from subagents.store.lease import taken_over
from subagents.store.control import ControlRecord
from subagents.store.errors import FencedError, SessionNotFoundError, SubagentError
from subagents.store.session import CreatedSession, NewSession, create_under_settled_parent
from subagents.worker.logcontext import bind
from subagents.worker.protocol import Budget, TurnOutcome, TurnSpec

from .backend import ChildRun, TurnChildren, TurnResult, TurnRpcHandler, TurnTicket, WorkerRef
from .creator import CreatorStatistics, SessionCreator
from .errors import CancelledBeforeStartError, InvalidRequestError, NoParentError, SupervisorClosedError
from .event_loop import on_loop, require_loop, to_its_end
from .models import Provider, SubagentRequest, SubagentResult
from .registry import program_fields
from .runtime import Runtime
from .thread_failures import thread_failures_coded
from .turn_log import read_back
from .validation import Placement, check_label_fits, delegation_events, place_child, prompt_text, request_fields

__all__ = ["CancelToken", "SubagentRun", "OneShotRuns", "TurnChildren", "result_from_outcome", "one_shot_turn_spec"]

log = logging.getLogger(__name__)
# more than a prompt's ``message/accepted`` record adds to its text (ids, source, the event's envelope)
PROMPT_ENVELOPE_BYTES = 1024

_STOP_REASONS = ("completed", "aborted", "error", "max-tokens", "refusal", "budget-exhausted")


@runtime_checkable
class CancelToken(Protocol):
    """Anything with ``is_set()`` and ``await wait()`` (e.g. ``anyio.Event``); checked by shape at ``start``."""

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


# builds the RPC handler of one turn (the Supervisor passes ``rpc.TurnRpc``'s builder)
RpcFactory = Callable[[TurnSpec], TurnRpcHandler]


def result_from_outcome(outcome: TurnOutcome) -> SubagentResult:
    """A result reports only public stop reasons: crash repair's ``interrupted`` (and anything unknown) is ``error``."""
    reason = outcome.stop_reason if outcome.stop_reason in _STOP_REASONS else "error"
    return SubagentResult(output=outcome.output, structured=outcome.structured, stop_reason=reason, diagnostic=outcome.diagnostic)


def one_shot_turn_spec(
    rt: Runtime, *, child_id: str, placement: Placement, provider: Provider, request: SubagentRequest, budget: Budget,
    message_id: str, prompt: str, log_state: dict[str, Any] | None = None,
) -> TurnSpec:
    """The one turn of a one-shot child: its creation already logged the message; the worker releases the lease.

    ``log_state`` is the session as its creation left it (``{"header", "projection"}``
    records): the worker attaches to the log with it instead of reopening the session.
    """
    program, blob = program_fields(provider)
    return TurnSpec(
        session_id=child_id, epoch=1, store_root=rt.store.root, durability=rt.store.durability.name,
        program=program, program_blob=blob, message_id=message_id, message_source={"kind": "user"}, message=prompt,
        log_message=False, budget=budget, depth=placement.depth, mode="one-shot", label=request.label, provider=provider.name,
        parent_session=placement.parent_id, persona=request.persona, tool_filter=request.tool_filter, sandbox=placement.sandbox,
        output_schema=request.output_schema, agent_model=request.model, release_owner=rt.owner_id, log_state=log_state,
    )


@dataclass(eq=False)
class _RunState:
    """One run's mutable state. ``OneShotRuns`` writes ``ticket`` (at dispatch) and ``result`` (when the turn ended);
    ``cancel`` writes ``cancelled`` (first reason wins); ``done`` is set once, after ``result``."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: SubagentResult | None = None
    ticket: TurnTicket | None = None
    worker: WorkerRef | None = None  # where the turn ran (set with the result)
    cancelled: str | None = None
    children: TurnChildren | None = None


class SubagentRun:
    """A published one-shot child. The holder must ``dispose()`` it (idempotent)."""

    def __init__(self, runs: "OneShotRuns", child_id: str, run_id: str, state: _RunState) -> None:
        self.id = child_id
        self.run_id = run_id
        self._runs = runs
        self._state = state

    @thread_failures_coded
    async def result(self) -> SubagentResult:
        require_loop(self._runs.loop)  # awaited elsewhere, the result's event would never wake that loop
        await self._state.done.wait()
        assert self._state.result is not None
        return self._state.result

    @property
    def done(self) -> bool:
        return self._state.done.is_set()

    @property
    def worker(self) -> WorkerRef | None:
        """Where the turn ran once it is done: host (a Ray pool: the node) and pid; None if it never ran."""
        return self._state.worker

    @property
    def cancelled(self) -> str | None:
        """Why the run was asked to stop (the first reason), or None."""
        return self._state.cancelled

    def cancel(self, reason: str = "user") -> None:
        """Stop the run; its result becomes ``aborted`` unless it already finished. ``reason`` (text,
        ``INVALID_REQUEST`` otherwise, before anything changes) is recorded with the turn's end. From
        another thread it is scheduled on the supervisor's loop, without waiting, and takes effect there
        (``cancelled`` reads its reason from then on)."""
        InvalidRequestError.require_reason(reason)
        # from a plain thread (a UI's stop button) too: what it starts, the worker's kill after the grace, runs there
        on_loop(self._runs.loop, self._runs.cancel_run, self._state, reason)

    def started_runs(self) -> list[ChildRun]:
        """The one-shot runs this run's turn started, oldest first (none before it ran)."""
        return [] if self._state.children is None else self._state.children.started_runs()

    @thread_failures_coded
    async def dispose(self) -> None:
        """Cancel if still running, wait for the result and quiescence. Idempotent.

        Quiescence includes the one-shot children its turn started: each is
        cancelled (if still running) and disposed before this returns, so no
        descendant still runs or holds a lease. The supervisor then forgets
        the run and them.

        The tree below is walked level by level, not by recursion: a program
        that delegates to itself builds a chain deeper than Python's recursion
        limit in seconds, and a recursive walk then failed half-way and left
        the close waiting for good.

        It runs shielded, as a cleanup in a ``finally`` must: in a scope already
        cancelled (a request handler's deadline) its wait was a checkpoint that
        raised before the run was forgotten, and the supervisor held every such
        run until it closed. The wait is bounded: a turn that ignores its
        cancellation has its worker killed after ``cancel_grace_s``.
        """
        require_loop(self._runs.loop)
        with anyio.CancelScope(shield=True):
            level: list[ChildRun] = [self]
            disposed: list[ChildRun] = []
            while level:
                for run in level:
                    if not run.done:
                        run.cancel("disposed")
                below: list[ChildRun] = []
                for run in level:
                    await run.result()
                    below.extend(run.started_runs())
                disposed.extend(level)
                level = below
            for run in disposed:
                self._runs.forget(run.id)


class OneShotRuns:
    """Starts one-shot children and drives each to its result."""

    def __init__(self, rt: Runtime, *, rpc_for: RpcFactory) -> None:
        self._rt = rt
        self._rpc_for = rpc_for
        self._runs: dict[str, SubagentRun] = {}
        self._creator = SessionCreator(rt.store)
        self._cancelling: deque[tuple[_RunState, str]] = deque()  # the cancel cascade running (``cancel_run``)

    @property
    def loop(self) -> EventLoopToken:
        """The event loop its runs answer on (the supervisor's)."""
        return self._rt.loop

    @property
    def runs(self) -> Mapping[str, SubagentRun]:
        """The runs this supervisor holds (published, not yet disposed)."""
        return self._runs

    def live(self) -> int:
        return sum(1 for run in self._runs.values() if not run.done)

    def creation_statistics(self) -> CreatorStatistics:
        return self._creator.statistics()

    async def aclose(self) -> None:
        """Stop creating (``SupervisorClosedError`` for later starts) once what is queued is created."""
        await self._creator.aclose()

    def interrupt(self, child_id: str) -> bool:
        """A user interrupt of a run held here: whether it stopped a turn (False: none held, done, or already stopping)."""
        run = self._runs.get(child_id)
        if run is None or run.done or run.cancelled is not None:
            return False
        run.cancel("user")
        return True

    async def stop_taken_over(self) -> list[str]:
        """Stop the turn of each live run whose lease reads as another supervisor's (after this one's
        heartbeat lapsed: ``fsck --repair`` or a takeover closed it meanwhile); the ids stopped. The turn
        is cancelled (``fenced``), and its closing append, refused, ends it as a fenced write does."""
        live = {child_id: run for child_id, run in self._runs.items() if not run.done and run.cancelled is None}
        taken = await anyio.to_thread.run_sync(taken_over, self._rt.store, self._rt.owner_id, list(live))
        for child_id in taken:
            live[child_id].cancel("fenced")
        return taken

    def _apply_control(self, run: SubagentRun, record: ControlRecord) -> None:
        if record.kind == "interrupt":
            if not run.done:
                log.info("one-shot child %s interrupted from another process (control record %d)", run.id, record.seq,
                         extra={"child": run.id})
                run.cancel("user")
        else:
            log.warning("control record %d of one-shot child %s has kind %r, which a one-shot run does not take; ignored",
                        record.seq, run.id, record.kind, extra={"child": run.id})

    async def start(self, provider_name: str, request: SubagentRequest, *, cancel: CancelToken | None = None) -> SubagentRun:
        rt = self._rt
        provider = rt.registry.require(provider_name)
        rt.registry.check_capabilities(
            provider,
            {
                "output_schema": request.output_schema,
                "max_depth": request.max_depth,
                "tool_filter": request.tool_filter,
                "persona": request.persona,
                "sandbox": request.sandbox,
                "budget": request.budget,
            },
        )
        fields = request_fields(
            max_depth=request.max_depth, budget=request.budget, tool_filter=request.tool_filter, output_schema=request.output_schema,
            texts={"persona": request.persona, "model": request.model, "label": request.label},
        )
        descriptor = OneShotDescriptor(provider=provider.name, label=request.label)
        check_label_fits(descriptor, rt.store.max_record_bytes)
        placement = place_child(rt.agents, rt.store, request.parent_id, max_depth=fields.max_depth, host_max_depth=rt.config.max_depth, sandbox=request.sandbox)
        if cancel is not None and cancel.is_set():
            raise CancelledBeforeStartError.before_creation()
        child_id = rt.ids.new()
        prompt = prompt_text(request.prompt)
        message_id = rt.ids.new()
        events = delegation_events(placement.sandbox, descriptor)
        accepted = {"message_id": message_id, "source": {"kind": "user"}, "content": prompt}
        # a prompt no record holds is the caller's oversized message, as a continuable child's is (the mailbox's
        # MESSAGE_TOO_LARGE): the store's RECORD_TOO_LARGE named a "message/accepted" event no model ever sees.
        # Checked only when it may not fit (4 bytes a character at most, and the envelope), and sized, not framed
        # (``check_fits``): the creation frames it anyway, and a 16 MiB prompt framed twice took 48 MiB more
        if 4 * len(prompt) + PROMPT_ENVELOPE_BYTES > rt.store.max_record_bytes:
            check_fits(widest_event("message/accepted", accepted), rt.store.max_record_bytes, f"the prompt of {child_id}",
                       "MESSAGE_TOO_LARGE", text_at=("data", "content"))
        events.append(("message/accepted", accepted))
        created = await self._create(
            NewSession(
                child_id, parent_session=placement.parent_id, origin="subagent", delegation_depth=placement.depth, events=events,
                lease_owner=rt.owner_id, fresh_id=True,
            ),
            # a parent no root or resident child of ours holds (a live lease ``gc`` keeps) is created under its lock
            cancel, guarded=placement.stored and placement.parent_id not in rt.control,
        )
        # published: from here the caller owns the run
        spec = one_shot_turn_spec(
            rt, child_id=child_id, placement=placement, provider=provider, request=request, budget=fields.budget,
            message_id=message_id, prompt=prompt,
            log_state={"header": created.header.to_record(), "projection": created.projection.to_record()},
        )
        state = _RunState(children=None)
        run = SubagentRun(self, child_id, rt.ids.new(), state)
        self._runs[child_id] = run
        rt.control.watch(child_id, lambda record: self._apply_control(run, record))
        rt.agents.add_child(child_id, depth=placement.depth, sandbox=placement.sandbox, parent=placement.parent_id)
        info = {"run_id": run.run_id, "provider": provider.name, "id": child_id, "local": True}
        rt.events.emit("subagent/start", info)
        on_rpc = self._rpc_for(spec)
        state.children = on_rpc
        self._submit(state, spec, on_rpc, info)
        if cancel is not None:
            rt.tg.start_soon(self._watch_cancel, run, cancel)
        return run

    async def _create(self, request: NewSession, cancel: CancelToken | None, *, guarded: bool = False) -> CreatedSession:
        """Create the child leased to us (epoch 1); roll it back if the start is cancelled before it is published.
        ``guarded``: under its parent's lock, outside the batches (a parent no live agent of ours holds, which
        ``gc`` may be collecting: ``Placement.stored``)."""
        store, child_id, parent_id = self._rt.store, request.session_id, request.parent_session

        async def create() -> CreatedSession:
            if guarded:
                try:
                    created = await anyio.to_thread.run_sync(create_under_settled_parent, store, request)
                except SessionNotFoundError as exc:
                    if exc.fields.get("session_id") != parent_id:
                        raise
                    raise NoParentError(str(parent_id)) from None  # collected by gc meanwhile
            else:
                created = await self._creator.create(request)
            if cancel is not None and cancel.is_set():
                await anyio.to_thread.run_sync(lambda: delete_session(store, child_id, parent_session=parent_id))
                raise CancelledBeforeStartError.before_publication()
            return created

        try:
            with anyio.CancelScope(shield=True):
                # to its end even under a native ``Task.cancel()`` (a Ctrl-C through ``asyncio.run``), which the
                # shield does not hold back: cut there, the rollback below ran before the creation ended, and
                # the child was left made and leased, never published nor released
                created, host_cancel = await to_its_end(create())
                if host_cancel is not None:
                    raise host_cancel
            await anyio.lowlevel.checkpoint_if_cancelled()  # a cancel that came while shielded: roll back
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: delete_session(store, child_id, parent_session=parent_id))
            raise
        return created

    def cancel_run(self, state: _RunState, reason: str) -> None:
        """Stop a run's turn and the children it started; the first reason wins, a finished run is left alone.

        The cascade is a queue, not a recursion: a child's ``cancel`` made while a cascade runs joins it
        and returns, and the outermost call stops the whole tree before it returns. Recursing, a chain
        of children deeper than Python's recursion limit (a program delegating to itself) was stopped
        half-way, by a ``RecursionError`` in whatever cancelled it.
        """
        self._cancelling.append((state, reason))
        if len(self._cancelling) > 1:
            return  # a cascade is running further up this stack: it takes this one too
        try:
            while self._cancelling:
                state, reason = self._cancelling[0]
                if not (state.done.is_set() or state.cancelled is not None):
                    state.cancelled = reason
                    if state.ticket is not None:
                        self._rt.pool.cancel(state.ticket, reason)
                    if state.children is not None:
                        state.children.cancel_children("parent")
                self._cancelling.popleft()
        finally:
            self._cancelling.clear()

    def forget(self, child_id: str) -> None:
        self._runs.pop(child_id, None)

    async def _watch_cancel(self, run: SubagentRun, cancel: CancelToken) -> None:
        """Turn the caller's cancel token into ``run.cancel`` until the run is done."""
        async with anyio.create_task_group() as tg:
            async def on_cancel() -> None:
                await cancel.wait()
                run.cancel("user")
                tg.cancel_scope.cancel()

            tg.start_soon(on_cancel)
            await run.result()
            tg.cancel_scope.cancel()

    def _submit(self, state: _RunState, spec: TurnSpec, on_rpc: TurnRpcHandler, info: dict[str, Any]) -> None:
        """Queue the run's turn; ``_turn_ended`` takes it from there (no task waits for it: most runs need none)."""
        rt = self._rt

        def started(ticket: TurnTicket) -> None:
            state.ticket = ticket
            if state.cancelled is not None:
                rt.pool.cancel(ticket, state.cancelled)

        def ended(turn: TurnResult) -> None:
            self._turn_ended(state, spec, on_rpc, info, turn)

        try:
            rt.pool.submit(spec, on_rpc, on_done=ended, started=started)
        except SupervisorClosedError as exc:  # the pool closed before this run's turn was queued
            ended(TurnResult(TurnOutcome(stop_reason="aborted", diagnostic=str(exc)), worker=None))

    def _turn_ended(self, state: _RunState, spec: TurnSpec, on_rpc: TurnRpcHandler, info: dict[str, Any], turn: TurnResult) -> None:
        """On the event loop, once the turn ended: the run is finished at once when its worker committed the
        turn and released the lease (the usual case); otherwise a task repairs and releases it first."""
        state.worker = turn.worker
        result = _result_of(state, turn.outcome)
        if turn.outcome.released and not turn.crashed:
            self._finish(state, spec, info, result)
        else:
            self._rt.tg.start_soon(self._settle, state, spec, on_rpc, info, turn, result)

    async def _settle(
        self, state: _RunState, spec: TurnSpec, on_rpc: TurnRpcHandler, info: dict[str, Any], turn: TurnResult, result: SubagentResult,
    ) -> None:
        """Repair the log after a crash and release the lease the worker did not, then finish the run.

        Whatever happens the lease is released: a store failure here (repair,
        release) is logged and leaves the result as the outcome said; the next
        open of the log repairs it.
        """
        rt = self._rt
        fields = {"child": spec.session_id, "parent": spec.parent_session, "epoch": spec.epoch}
        bind(**fields)
        epoch = spec.epoch  # raised by the fence before a crash repair
        try:
            if turn.crashed:
                epoch, committed, said = await anyio.to_thread.run_sync(self._repair, spec, turn.cancel_reason, turn.crash)
                if committed is not None:
                    log.warning("the worker of %s died after the turn's closing commit: its result is read from the log (%s)",
                                spec.session_id, turn.crash, extra=fields)
                    result = _result_of(state, committed)
                elif said:
                    result = result.model_copy(update={"output": said})
            elif not turn.dispatched and turn.cancel_reason in _INTERRUPTS:
                await anyio.to_thread.run_sync(self._record_unrun, spec, turn.cancel_reason, turn.outcome.diagnostic)
        finally:
            with anyio.CancelScope(shield=True):
                # a child start the turn left in flight lands in this session's children
                # index before its release (and the settled row the release writes)
                await on_rpc.starts_done()
                try:
                    await anyio.to_thread.run_sync(release_lease, rt.store, spec.session_id, rt.owner_id, epoch)
                except FencedError:
                    log.warning("lease of %s was taken over before release", spec.session_id, extra=fields)
                except (SubagentError, OSError):
                    # the store refuses writes now (a read-only mount, its files' modes): what the turn
                    # committed stands, and the lease reads as free once this supervisor's heartbeat stops
                    log.warning("could not release the lease of %s; it lapses with this supervisor", spec.session_id,
                                extra=fields, exc_info=True)
        self._finish(state, spec, info, result)

    def _finish(self, state: _RunState, spec: TurnSpec, info: dict[str, Any], result: SubagentResult) -> None:
        """The run's lease is released: forget its bookkeeping and publish its result."""
        rt = self._rt
        rt.agents.remove(spec.session_id)
        rt.control.unwatch(spec.session_id)
        state.result = result
        # the turn's ticket holds the pool's turn, whose end callback holds this state: a cycle that kept a
        # disposed run, its output twice over, until the cyclic collector ran (a host swung by hundreds of MB)
        state.ticket = None
        state.done.set()
        rt.events.emit("subagent/end", {**info, "stop_reason": result.stop_reason, "last_assistant_message": result.output or None})

    def _record_unrun(self, spec: TurnSpec, cause: str, diagnostic: str | None) -> None:
        """Log the turn an interrupt stopped before any worker took it, so listings read ``aborted`` as the
        run's result does (the log held only the creation's ``message/accepted``: ``not-started``), as a
        continuable child's message an interrupt drops unrun does. A run disposed or closed before it started
        is not logged: it still reads ``not-started``, as a child that never ran. A store
        failure here is logged; the result stands and the listing keeps saying ``not-started``."""
        end = {"stop_reason": "aborted", "diagnostic": diagnostic, "cause": cause}
        try:
            with LogWriter.open(self._rt.store, spec.session_id, epoch=spec.epoch) as writer:
                writer.append([("turn/start", {"message_id": spec.message_id}), ("turn/end", end)], commit=True)
        except (SubagentError, OSError):
            log.warning("could not log the unrun turn of %s", spec.session_id, extra={"child": spec.session_id}, exc_info=True)

    def _repair(self, spec: TurnSpec, cause: str | None, crash: str | None) -> tuple[int, TurnOutcome | None, str]:
        """Fence, then balance a log whose worker died mid-turn (closers, torn tail); returns the new epoch,
        the turn's outcome as its log says when the worker had committed its closing records, and
        else the last reply the turn logged before its worker died (its output; "" if none).
        ``cause``: the cancel the turn was under (its worker killed for ignoring it), recorded on its ``turn/end``
        with ``crash``, how the worker died (the words the run's result gives).

        Fence before repair: the lease is taken again (epoch + 1) first, so a worker
        only *believed* dead (on a cluster node cut off from us) gets ``FencedError``
        on its next append instead of writing after the closers.

        A worker may die between its closing commit and telling us (a Ray actor whose ``TurnDone`` was
        still on its way, a process between its commit and its pipe write): the log then holds the
        turn's own end, which the repair leaves alone, and the caller is told what the log says (as a
        listing does), not a crash. One rule for every pool: it is read here, from the store.
        """
        session_id = spec.session_id
        epoch = spec.epoch
        try:
            epoch = acquire_lease(self._rt.store, session_id, self._rt.owner_id).epoch
            with LogWriter.open(self._rt.store, session_id, epoch=epoch, cause=cause, crash=crash) as writer:
                committed, said = read_back(self._rt.store, writer, output_schema=spec.output_schema)
            return epoch, committed, said
        except SubagentError:
            log.exception("repair of %s after a worker crash failed", session_id)
        return epoch, None, ""


# the cancel reasons of an interrupt (a user's, or an ancestor's): ``store/outcome.py`` reads them as ``aborted``
_INTERRUPTS = frozenset({"user", "parent"})


def _result_of(state: _RunState, outcome: TurnOutcome) -> SubagentResult:
    """A turn's result as its caller reads it: one cancelled meanwhile that did not complete reads ``aborted``,
    but for a turn another process took over (a fenced write; stopped as ``fenced`` after a lapse), which
    reads ``error`` with the store's ``FENCED`` text, as a continuable child's does: nobody stopped it."""
    result = result_from_outcome(outcome)
    if state.cancelled is not None and state.cancelled != "fenced" and result.stop_reason != "completed":
        result = result.model_copy(update={"stop_reason": "aborted"})
    return result

