"""What a turn may ask of its supervisor: the RPCs behind ``TurnContext``.

One ``TurnRpc`` per turn, bound to the calling session (the worker never
names its own identity in a request: authority comes from the turn the
supervisor dispatched). Background children started by the turn belong to
it: they are cancelled when the turn is cancelled, and each is disposed when
it finishes, even if the program never waited for it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict
from typing import Any, Iterator

import anyio

from subagents.store import SubagentError, check_lease, list_children, list_descendants, validate_session_id
from subagents.store.errors import FencedError
from subagents.worker.protocol import TurnSpec

from .backend import ChildRun
from .continuable import ContinuationManager
from .errors import InvalidRequestError, RpcError
from .models import AncestorAuthority, ContinuableSpec, RunBudget, SubagentRequest
from .oneshot import OneShotRuns, SubagentRun
from .runtime import Runtime

__all__ = ["TurnRpc", "catalog_rows"]

log = logging.getLogger(__name__)

# the requests that act for the turn (child starts, messages, reports, interrupts): refused once it was taken over
_ACTS = frozenset({"spawn", "spawn_wait", "start_continuable", "send_message", "report", "interrupt"})


def catalog_rows(entries: list[Any], *, descendants: bool) -> list[dict[str, Any]]:
    rows = []
    for item in entries:
        entry = item.entry if descendants else item
        row = asdict(entry)
        if descendants:
            row["parent_id"], row["depth"] = item.parent_id, item.depth
        rows.append(row)
    return rows


class TurnRpc:
    """The RPC handler of one turn (``Pool.run_turn``'s ``on_rpc``) and owner of the one-shot children it starts."""

    def __init__(self, rt: Runtime, spec: TurnSpec, *, runs: OneShotRuns, continuation: ContinuationManager) -> None:
        self._rt = rt
        self._spec = spec
        self._runs = runs
        self._continuation = continuation
        self._background: dict[str, SubagentRun] = {}
        self._children: list[SubagentRun] = []
        self._starting = 0  # child starts in progress (``starts_done``)
        self._started: anyio.Event | None = None  # made by the first start in progress, set when none is
        self._cancelled: str | None = None

    def cancel_children(self, reason: str) -> None:
        """Cancel the children started so far, and any whose start is still in progress when it ends."""
        self._cancelled = self._cancelled or reason
        for run in self._children:
            run.cancel(reason)

    async def starts_done(self) -> None:
        """Return once no child start of this turn is in progress: each has its index entry, or left none."""
        while self._starting:
            assert self._started is not None
            await self._started.wait()

    @contextlib.contextmanager
    def _child_start(self) -> Iterator[None]:
        self._starting += 1
        if self._starting == 1:
            self._started = anyio.Event()
        try:
            yield
        finally:
            self._starting -= 1
            if not self._starting:
                assert self._started is not None
                self._started.set()

    def started_runs(self) -> list[ChildRun]:
        return list(self._children)

    async def __call__(self, method: str, args: dict[str, Any]) -> Any:
        handler = getattr(self, f"_rpc_{method}", None)
        if handler is None:
            raise RpcError.unknown(method)
        if method in _ACTS:
            await self._rt.store_thread.run(self._require_lease)
        return await handler(**args)

    def _require_lease(self) -> None:
        """``FENCED`` when the turn's session is no longer leased to it: another supervisor took it over.

        The worker's own appends are fenced by the store, but what it asks its host to do is written
        by the host: a host stopped past its lease (``SIGSTOP``, a stalled machine) while the worker
        went on woke with the worker's request waiting, and created a child under a session the
        taker had already settled (``store check``: its settled row said it had no children). The
        lease is read before each request that acts, so a request that arrives once the session was
        taken over does nothing; one under way when the host stops can still land, as an append
        under way does. A lease that does not read lets it through: the turn's next append decides.
        """
        store, session_id, epoch = self._rt.store, self._spec.session_id, self._spec.epoch
        try:
            lease = check_lease(store, session_id)
        except (SubagentError, OSError):
            return
        if lease is not None and (lease.owner != self._rt.owner_id or lease.epoch != epoch):
            raise FencedError(session_id, epoch=epoch, current_epoch=lease.epoch,
                              lease=f"epoch {lease.epoch}, {lease.state}, held by {lease.owner}")

    async def _start(self, args: dict[str, Any]) -> SubagentRun:
        provider = self._provider(args.pop("provider", None))
        budget = None
        max_steps, timeout_ms = args.pop("max_steps", None), args.pop("timeout_ms", None)
        if max_steps is not None or timeout_ms is not None:
            budget = RunBudget(max_steps=max_steps, timeout_ms=timeout_ms)
        request = SubagentRequest(parent=self._spec.session_id, budget=budget, **args)
        with self._child_start():
            run = await self._runs.start(provider, request)
        self._children.append(run)
        if self._cancelled is not None:
            run.cancel(self._cancelled)  # the turn was cancelled while this child was being created
        return run

    async def _rpc_spawn_wait(self, **args: Any) -> dict[str, Any]:
        run = await self._start(args)
        try:
            result = await run.result()
        finally:
            with anyio.CancelScope(shield=True):
                await run.dispose()
        return {"id": run.id, **result.model_dump()}

    async def _rpc_spawn(self, **args: Any) -> str:
        run = await self._start(args)
        self._background[run.id] = run
        self._rt.tg.start_soon(_dispose_when_done, run)
        return run.id

    def _provider(self, asked: Any) -> str:
        """The provider a child of this turn runs: the caller's own when none is named. A name that is
        not one (empty, or not text) is ``INVALID_REQUEST``: an empty one used to fall back to the
        caller's program, and a program that named none by mistake started itself without end."""
        if asked is None:
            return self._spec.provider or ""
        InvalidRequestError.require(asked, str, "provider")
        if not asked:
            raise InvalidRequestError("provider must be a provider's name, not empty text", field="provider")
        return asked

    async def _rpc_wait_run(self, run_id: str) -> dict[str, Any]:
        InvalidRequestError.require(run_id, str, "run_id")
        run = self._background.get(run_id)
        if run is None:
            raise RpcError.no_run(run_id)
        result = await run.result()
        return {"id": run.id, **result.model_dump()}

    async def _rpc_list_agents(self, scope: str = "children") -> list[dict[str, Any]]:
        store = self._rt.store
        if scope == "descendants":
            return catalog_rows(await anyio.to_thread.run_sync(list_descendants, store, self._spec.session_id), descendants=True)
        return catalog_rows(await anyio.to_thread.run_sync(list_children, store, self._spec.session_id), descendants=False)

    async def _rpc_start_continuable(self, prompt: Any, label: str, provider: str | None = None, options: dict[str, Any] | None = None) -> list[str]:
        _refuse_fixed("ContinuableSpec", options or {}, ("parent", "provider", "prompt", "label"))
        spec = ContinuableSpec(parent=self._spec.session_id, provider=self._provider(provider), prompt=prompt, label=label, **(options or {}))
        with self._child_start():
            child_id, message_id = await self._continuation.start_continuable(spec)
        return [child_id, message_id]

    async def _rpc_send_message(self, child_id: str, message: Any) -> str:
        source = {"kind": "coordinator", "form": "relay", "sender_session_id": self._spec.session_id}
        return await self._continuation.followup(self._spec.session_id, child_id, message, source=source)

    async def _rpc_report(self, content: Any, delivery: str = "quiet") -> str:
        return await self._continuation.report_from(self._spec.session_id, content, delivery=delivery)

    async def _rpc_interrupt(self, child_id: str) -> bool:
        """A well-formed id with no running turn under this caller is no error (False); an id no session can
        have is the caller's mistake (``INVALID_SESSION_ID``), as ``send_message`` and ``Supervisor.interrupt`` say."""
        InvalidRequestError.require(child_id, str, "child_id")
        validate_session_id(child_id)
        return self._continuation.interrupt(child_id, AncestorAuthority(self._spec.session_id))


async def _dispose_when_done(run: SubagentRun) -> None:
    await run.result()
    await run.dispose()


def _refuse_fixed(model: str, options: dict[str, Any], fixed: tuple[str, ...]) -> None:
    """``INVALID_REQUEST`` for an option a program's request may not set, because the call sets it
    (``parent``: a program starts children of its own session; the call's own arguments). It was a
    ``TypeError`` of the model's constructor, logged with a traceback and answered ``RPC_FAILED``.
    (``spawn`` takes no free options: ``ctx.spawn`` refuses an unknown one itself.)"""
    taken = [(key, "is not an option here: the call sets it (a program's children are its own session's)")
             for key in fixed if key in options]
    if taken:
        raise InvalidRequestError.wrong_fields(model, taken)
