"""One-shot runs: validate → create the child durably → run one turn → result → dispose.

Ownership (REFERENCE.md §2 ``start``): until ``start`` returns, this module
owns setup and rolls back everything unpublished on failure or cancellation
(no session folder, no index entry, no lease, no lifecycle events). After, the
caller owns the ``SubagentRun`` and must ``dispose()`` it.

Creation goes through ``SessionCreator`` (batched store work, few thread
hops). The worker releases the child's lease right after the turn's commit
(``TurnSpec.release_owner``); the supervisor releases it only when the worker
did not (a crash, a takeover, a store failure).

Every validation happens before the first byte is written, in the
reference's order: provider (``NO_PROVIDER``), capabilities
(``UNSUPPORTED_CAPABILITY``), ``max_depth``, budget, output schema, parent,
depth (``SubagentDepthError``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from subagents.store import IdGenerator, LogWriter, OneShotDescriptor, Store, delete_session, read_header, release_lease
from subagents.store.errors import FencedError, SessionNotFoundError, SubagentError
from subagents.store.session import NewSession
from subagents.worker.logcontext import bind
from subagents.worker.protocol import Budget, TurnSpec

from .creator import SessionCreator
from .errors import CancelledBeforeStartError, InvalidRequestError, SubagentDepthError
from .events import EventBus
from .models import Provider, RunBudget, SubagentRequest, SubagentResult
from .backend import Pool, TurnTicket
from .registry import ProviderRegistry

if TYPE_CHECKING:
    from .agents import LiveAgents

__all__ = ["CancelToken", "SubagentRun", "OneShotRuns", "validate_max_depth", "validate_budget", "program_fields", "result_from_outcome"]

log = logging.getLogger(__name__)

MAX_TIMEOUT_MS = 2_147_483_647


class CancelToken(Protocol):
    """Anything with ``is_set()`` and ``await wait()`` (e.g. ``anyio.Event``)."""

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


def validate_max_depth(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError("subagent maxDepth must be a non-negative safe integer")
    return value


def validate_budget(budget: RunBudget | None) -> Budget:
    if budget is None:
        return Budget()
    for name in ("max_steps", "timeout_ms"):
        value = getattr(budget, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise InvalidRequestError(f"budget {name} must be a positive integer", field=name)
    if budget.timeout_ms is not None and budget.timeout_ms > MAX_TIMEOUT_MS:
        raise InvalidRequestError(f"budget timeout_ms must be at most {MAX_TIMEOUT_MS}", field="timeout_ms")
    return Budget(max_steps=budget.max_steps, timeout_ms=budget.timeout_ms)


def validate_output_schema(schema: Any) -> None:
    if schema is None:
        return
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidRequestError("output_schema must be an object-rooted JSON schema ({\"type\": \"object\", ...})")


def program_fields(provider: Provider) -> tuple[str | None, bytes | None]:
    """A program reference travels as its import path; a bare callable travels by dill."""
    if isinstance(provider.program, str):
        return provider.program, None
    import dill

    return None, dill.dumps(provider.program)


def result_from_outcome(outcome: Any) -> SubagentResult:
    reason = outcome.stop_reason
    if reason == "interrupted":
        reason = "error"
    if reason not in ("completed", "aborted", "error", "max-tokens", "refusal", "budget-exhausted"):
        reason = "error"
    return SubagentResult(output=outcome.output, structured=outcome.structured, stop_reason=reason, diagnostic=outcome.diagnostic)


class SubagentRun:
    """A published one-shot child. The holder must ``dispose()`` it (idempotent)."""

    def __init__(self, runs: "OneShotRuns", child_id: str, run_id: str) -> None:
        self.id = child_id
        self.run_id = run_id
        self._runs = runs
        self._done = anyio.Event()
        self._result: SubagentResult | None = None
        self._handle: TurnTicket | None = None
        self._cancelled: str | None = None
        self._disposed = False
        self._rpc: Any = None  # the TurnRpc of this run's turn: cancellation propagates to its children

    async def result(self) -> SubagentResult:
        await self._done.wait()
        assert self._result is not None
        return self._result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self, reason: str = "user") -> None:
        """Stop the run; its result becomes ``aborted`` unless it already finished."""
        if self._done.is_set() or self._cancelled is not None:
            return
        self._cancelled = reason
        if self._handle is not None:
            self._runs.pool.cancel(self._handle, reason)
        if self._rpc is not None:
            self._rpc.cancel_children("parent")

    async def dispose(self) -> None:
        """Cancel if still running, wait for the result and quiescence. Idempotent.

        Quiescence includes the one-shot children its turn started: each is
        cancelled (if still running) and disposed before this returns, so no
        descendant still runs or holds a lease. The supervisor then forgets
        the run.
        """
        if not self._done.is_set():
            self.cancel("disposed")
        await self._done.wait()
        if self._rpc is not None:
            for child in list(self._rpc._children):
                await child.dispose()
        self._disposed = True
        self._runs.runs.pop(self.id, None)


@dataclass
class _Parent:
    id: str
    depth: int
    sandbox: str | None


class OneShotRuns:
    """Starts one-shot children and drives each to its result."""

    def __init__(self, *, store: Store, pool: Pool, registry: ProviderRegistry, events: EventBus, agents: "LiveAgents", owner_id: str, ids: IdGenerator, tg: anyio.abc.TaskGroup) -> None:
        self.store = store
        self.pool = pool
        self.registry = registry
        self.events = events
        self.agents = agents
        self.owner_id = owner_id
        self.ids = ids
        self.tg = tg
        self.runs: dict[str, SubagentRun] = {}
        self.creator = SessionCreator(store, tg)
        self.continuation: Any = None  # the ContinuationManager, set by the Supervisor

    async def start(self, provider_name: str, request: SubagentRequest, *, cancel: CancelToken | None = None) -> SubagentRun:
        provider = self.registry.require(provider_name)
        self.registry.check_capabilities(
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
        max_depth = validate_max_depth(request.max_depth)
        budget = validate_budget(request.budget)
        validate_output_schema(request.output_schema)
        if request.tool_filter is not None:
            from subagents.store.descriptor import ToolFilter

            try:
                ToolFilter.model_validate(request.tool_filter)
            except Exception as exc:
                raise InvalidRequestError(f"tool_filter is invalid: {exc}") from None
        # policy snapshot before the first await (REFERENCE.md §1.7)
        parent = self._parent(request.parent_id)
        sandbox = request.sandbox if request.sandbox is not None else parent.sandbox
        child_depth = parent.depth + 1
        if max_depth is not None and child_depth > max_depth:
            raise SubagentDepthError(child_depth, max_depth)
        if cancel is not None and cancel.is_set():
            raise CancelledBeforeStartError("the start was cancelled before the child was created")
        child_id = self.ids.new()
        program, blob = program_fields(provider)
        descriptor = OneShotDescriptor(provider=provider.name, label=request.label)
        prompt = request.prompt if isinstance(request.prompt, str) else json.dumps(request.prompt)
        message_id = self.ids.new()
        events: list[tuple[str, Any]] = []
        if sandbox is not None:
            events.append(("sandbox/mode", {"mode": sandbox, "source": "delegation"}))
        events.append(("approval/policy", {"policy": "never", "source": "delegation"}))
        events.append(("subagent/descriptor", descriptor.to_record()))
        events.append(("message/accepted", {"message_id": message_id, "source": {"kind": "user"}, "content": prompt}))

        new_session = NewSession(
            child_id, parent_session=parent.id, origin="subagent", delegation_depth=child_depth, events=events, lease_owner=self.owner_id,
        )
        try:
            with anyio.CancelScope(shield=True):
                await self.creator.create(new_session)
                epoch = 1  # created leased to us (create_session's lease_owner)
                if cancel is not None and cancel.is_set():
                    await anyio.to_thread.run_sync(lambda: delete_session(self.store, child_id, parent_session=parent.id))
                    raise CancelledBeforeStartError("the start was cancelled before the child was published")
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: delete_session(self.store, child_id, parent_session=parent.id))
            raise
        # published: from here the caller owns the run
        run = SubagentRun(self, child_id, self.ids.new())
        self.runs[child_id] = run
        spec = TurnSpec(
            session_id=child_id, epoch=epoch, store_root=self.store.root, durability=self.store.durability.name,
            program=program, program_blob=blob, message_id=message_id, message_source={"kind": "user"}, message=prompt,
            log_message=False, budget=budget, depth=child_depth, mode="one-shot", label=request.label, provider=provider.name,
            parent_session=parent.id, persona=request.persona, tool_filter=request.tool_filter, sandbox=sandbox,
            output_schema=request.output_schema, agent_model=request.model, release_owner=self.owner_id,
        )
        self.agents.add_child(child_id, depth=child_depth, sandbox=sandbox, parent=parent.id)
        info = {"run_id": run.run_id, "provider": provider.name, "id": child_id, "local": True}
        self.events.emit("subagent/start", info)
        from .rpc import TurnRpc

        on_rpc = TurnRpc(self, spec, self.continuation)
        run._rpc = on_rpc
        self.tg.start_soon(self._drive, run, spec, epoch, on_rpc, info)
        if cancel is not None:
            self.tg.start_soon(self._watch_cancel, run, cancel)
        return run

    def _parent(self, parent_id: str) -> _Parent:
        live = self.agents.get(parent_id)
        if live is not None:
            # a live agent's depth already includes its header's (open_root and start read it)
            return _Parent(parent_id, live.depth, live.sandbox)
        try:
            header = read_header(self.store, parent_id)
        except SessionNotFoundError:
            raise SubagentError(f'parent session "{parent_id}" does not exist', code="NO_PARENT", parent=parent_id) from None
        return _Parent(parent_id, header.delegation_depth, None)

    async def _watch_cancel(self, run: SubagentRun, cancel: CancelToken) -> None:
        """Turn the caller's cancel token into ``run.cancel`` until the run is done."""
        async with anyio.create_task_group() as tg:
            async def on_cancel() -> None:
                await cancel.wait()
                run.cancel("user")
                tg.cancel_scope.cancel()

            tg.start_soon(on_cancel)
            await run._done.wait()
            tg.cancel_scope.cancel()

    async def _drive(self, run: SubagentRun, spec: TurnSpec, epoch: int, on_rpc: Any, info: dict[str, Any]) -> None:
        bind(child=spec.session_id, parent=spec.parent_session, epoch=epoch)
        result: SubagentResult
        released = False  # the worker releases the lease after a committed turn (TurnSpec.release_owner)
        try:
            if run._cancelled is not None:
                result = SubagentResult(stop_reason="aborted", diagnostic=f"the run was cancelled ({run._cancelled}) before it started")
            else:
                def started(ticket: TurnTicket) -> None:
                    run._handle = ticket
                    if run._cancelled is not None:
                        self.pool.cancel(ticket, run._cancelled)

                turn = await self.pool.run_turn(spec, on_rpc, started=started)
                released = turn.outcome.released and not turn.crashed
                if turn.crashed:
                    await anyio.to_thread.run_sync(self._repair, spec.session_id, epoch)
                result = result_from_outcome(turn.outcome)
                if run._cancelled is not None and result.stop_reason != "completed":
                    result = result.model_copy(update={"stop_reason": "aborted"})
        except Exception as exc:
            log.exception("one-shot run %s failed in the supervisor", run.id, extra={"child": run.id, "parent": spec.parent_session, "epoch": epoch})
            result = SubagentResult(stop_reason="error", diagnostic=f"{type(exc).__name__}: {exc}")
        finally:
            with anyio.CancelScope(shield=True):
                if not released:
                    try:
                        await anyio.to_thread.run_sync(release_lease, self.store, spec.session_id, self.owner_id, epoch)
                    except FencedError:
                        log.warning("lease of %s was taken over before release", spec.session_id, extra={"child": spec.session_id, "parent": spec.parent_session, "epoch": epoch})
                self.agents.remove(spec.session_id)
        run._result = result
        run._done.set()
        self.events.emit("subagent/end", {**info, "stop_reason": result.stop_reason, "last_assistant_message": result.output or None})

    def _repair(self, session_id: str, epoch: int) -> None:
        """Balance a log whose worker died mid-turn (closers, torn tail)."""
        try:
            LogWriter.open(self.store, session_id, epoch=epoch).close()
        except SubagentError:
            log.exception("repair of %s after a worker crash failed", session_id)
