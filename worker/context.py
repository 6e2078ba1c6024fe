"""``TurnContext``: everything a program sees of its turn.

A program is ``async def program(ctx: TurnContext) -> str | TurnResult``; a
plain ``def`` runs in a thread and gets a ``BlockingTurnContext`` with the
same methods, each hopping back to the worker's event loop. Every method that
touches another agent (spawn, send, list, report, interrupt) is an RPC to the
supervisor over the worker's pipe; every method that records something
(step, say, tool calls) appends to the child's own log with the lease epoch.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import msgpack

from subagents.store.events import TOOL_OUTCOME_UNKNOWN

from .budget import TurnControl, TurnStopped
from .errors import UnsendableArgumentError
from .protocol import TurnSpec, non_text_key
from .sessions import SessionAccess, SessionWriter
from .tools import Toolbox, builtin_tools

__all__ = ["AGENT_SCOPES", "RESULT_STOP_REASONS", "TurnResult", "RunResult", "TurnContext", "BlockingTurnContext", "RpcCaller"]

RpcCaller = Callable[[str, dict[str, Any]], Awaitable[Any]]

# what ``list_agents`` lists: the direct children, or every descendant
AGENT_SCOPES = ("children", "descendants")
# the stop reasons a program may give (``TurnResult.stop_reason``); the others are the runtime's to say
RESULT_STOP_REASONS = ("completed", "refusal", "max-tokens", "error")


@dataclass
class TurnResult:
    """What a program may return instead of a plain string (checked at the turn's end: ``RESULT_STOP_REASONS``,
    text for ``output`` and ``diagnostic``, ``structured`` a record can hold). ``output`` left ``None`` is the
    turn's last ``ctx.say`` text, as a plain ``""`` return gives; text, ``""`` too, is the output as it is (the
    ``llm`` program's empty reply, which must not answer with a remark made beside an earlier tool call)."""

    output: str | None = None
    structured: Any = None
    stop_reason: Literal["completed", "refusal", "max-tokens", "error"] = "completed"
    diagnostic: str | None = None


@dataclass(frozen=True)
class RunResult:
    """A child's result as a program sees it."""

    id: str
    output: str
    structured: Any
    stop_reason: str
    diagnostic: str | None

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> "RunResult":
        return cls(data["id"], data.get("output", ""), data.get("structured"), data["stop_reason"], data.get("diagnostic"))


@dataclass
class _Outputs:
    last_text: str = ""
    said: list[str] = field(default_factory=list)


class TurnContext:
    """The turn's message, history, budget, tools and delegation API."""

    def __init__(
        self, spec: TurnSpec, writer: SessionWriter, control: TurnControl, rpc: RpcCaller, tools: Toolbox | None, sessions: SessionAccess,
    ) -> None:
        """``tools`` ``None``: the built-in tools under the spec's tool filter and sandbox, built when first used."""
        self.spec = spec
        self._writer = writer
        self._sessions = sessions
        self._control = control
        self._rpc = rpc
        self._tools = tools
        self._outputs = _Outputs()
        self._step_open = False
        self._call_ids = itertools.count(1)
        self._open_calls: list[str] = []  # recorded calls with no result yet: the turn's end answers them

    @property
    def tools(self) -> Toolbox:
        """The tools this turn may see and call (built on first use: most turns never look, and
        building the built-in set cost every turn about 6 µs)."""
        if self._tools is None:
            spec = self.spec
            tf = spec.tool_filter or {}
            self._tools = Toolbox(builtin_tools(), allow=tf.get("allow"), deny=tf.get("deny"), sandbox=spec.sandbox)
        return self._tools

    # -- what the turn is ------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.spec.session_id

    @property
    def message(self) -> Any:
        return self.spec.message

    @property
    def message_id(self) -> str:
        return self.spec.message_id

    @property
    def message_source(self) -> dict[str, Any]:
        """Where the turn's message came from: ``{"kind": "user"}`` (a prompt, a followup),
        ``"subagent-settled"`` (a child's settlement notice) or ``"subagent-report"`` (a child's
        report), the latter two naming the child as ``sender_session_id``. A program that delegates
        is woken by its children's notices, which are prose, whatever its prompts are."""
        return dict(self.spec.message_source)

    @property
    def text(self) -> str:
        """The message as text (JSON for structured content)."""
        content = self.spec.message
        return content if isinstance(content, str) else json.dumps(content)

    @property
    def depth(self) -> int:
        return self.spec.depth

    @property
    def persona(self) -> str | None:
        return self.spec.persona

    @property
    def sandbox(self) -> str | None:
        return self.spec.sandbox

    @property
    def label(self) -> str | None:
        return self.spec.label

    @property
    def notices(self) -> list[dict[str, Any]]:
        """Quiet reports and settlement notices delivered as context for this turn."""
        return list(self.spec.notices)

    @property
    def steps(self) -> int:
        return self._control.steps

    @property
    def record_limit(self) -> int:
        """The largest record the store holds (``max_record_bytes``): what the turn says or a tool call it
        records must fit in one, so a program need not read more than a few of them from anywhere."""
        return self._writer.max_record_bytes

    async def history(self) -> list[dict[str, Any]]:
        """The events of this session's log before this turn's end (read-only)."""
        return await anyio.to_thread.run_sync(self._sessions.history, self.session_id)

    # -- budget and recording ---------------------------------------------------

    def check(self) -> None:
        """Raise if the turn must stop (cheap and thread-safe: for tight loops, also off the event loop)."""
        self._control.check()

    async def step(self) -> int:
        """Count a step (``max_steps``), check cancellation, and record it in the log."""
        self._control.check()
        if self._step_open:
            self._writer.append([("step/end", {})])
            self._step_open = False
        n = self._control.count_step()
        self._writer.append([("step/start", {"n": n})])
        self._step_open = True
        await anyio.lowlevel.checkpoint()
        return n

    def limit_steps(self, max_steps: int) -> None:
        """The program's own step cap, for a turn whose caller set no ``max_steps``: past it the turn
        ends ``budget-exhausted`` as a caller's budget ends it (outcome ``budget``); a caller's budget,
        larger or smaller, stands. A runaway loop (a model calling tools forever) is a budget, not an error."""
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a whole number of at least 1, not {max_steps!r}")
        self._control.default_max_steps(max_steps)

    def close_step(self) -> None:
        events = self.closing_events()
        if events:
            self._writer.append(events)

    def closing_events(self) -> list[tuple[str, Any]]:
        """The ``tool/result`` of each call still waiting and the ``step/end`` of an open step, handed to
        the caller instead of appended.

        The turn's end writes them in the same append as the final message and
        ``turn/end`` (one lock, one write, one commit instead of three appends).
        A call still waiting was stopped with its turn (an interrupt, a timeout):
        it is answered ``TOOL_OUTCOME_UNKNOWN``, as crash repair answers one a
        dead worker left, so that no later turn replays a call without an
        answer (model endpoints refuse such a conversation).
        """
        closing: list[tuple[str, Any]] = [
            ("tool/result", {"call_id": call_id, "is_error": True, "error": dict(TOOL_OUTCOME_UNKNOWN)}) for call_id in self._open_calls
        ]
        self._open_calls.clear()
        if self._step_open:
            self._step_open = False
            closing.append(("step/end", {}))
        return closing

    async def say(self, text: str) -> None:
        """Record an assistant message; the last non-empty one is the turn's output. ``TypeError`` for what is no
        text (``say(123)`` was logged as a number, and the turn's end, which needs text, then never reached its caller)."""
        if not isinstance(text, str):
            raise TypeError(f"say takes text, not {type(text).__name__}")
        self._control.check()
        self._writer.append([("assistant/message", {"text": text})])
        if text:
            self._outputs.last_text = text
        self._outputs.said.append(text)

    @property
    def last_output(self) -> str:
        return self._outputs.last_text

    async def call_tool(self, name: str, **args: Any) -> Any:
        """Run a visible tool, recording ``tool/call`` and ``tool/result``."""
        self._control.check()
        tool = self.tools.get(name)
        return await self.recorded_call(name, args, lambda: anyio.to_thread.run_sync(tool.invoke, args))

    async def recorded_call(
        self, name: str, args: dict[str, Any] | str, run: Callable[[], Awaitable[Any]], *, failed: Callable[[Any], str | None] | None = None,
    ) -> Any:
        """Record ``tool/call``, await ``run()``, record its ``tool/result`` (or the error, then re-raise).

        ``args`` is the call's arguments, or their text when they were unusable (the call is then
        recorded with its refusal, so a rebuilt transcript is what the model saw). ``failed(value)``
        says why a returned value is a failure (a tool that answers its errors rather than raising
        them): the result is then logged ``is_error`` with that ``error``, beside the value.
        Crash repair closes a call left without a result (``TOOL_OUTCOME_UNKNOWN``).
        """
        self._control.check()
        call_id = f"{self.message_id}-{next(self._call_ids)}"
        self._writer.append([("tool/call", {"call_id": call_id, "name": name, "args": args})])
        self._open_calls.append(call_id)
        await self._writer.flush()  # write-ahead: the call is in the log before the tool acts
        try:
            value = await run()
        except Exception as exc:
            self._open_calls.remove(call_id)
            self._writer.append([("tool/result", {"call_id": call_id, "is_error": True, "error": f"{type(exc).__name__}: {exc}"})])
            raise
        self._open_calls.remove(call_id)
        error = failed(value) if failed is not None else None
        result: dict[str, Any] = {"call_id": call_id, "is_error": error is not None, "value": value}
        if error is not None:
            result["error"] = error
        self._writer.append([("tool/result", result)])
        return value

    # -- other agents (RPCs to the supervisor) ------------------------------------

    async def _call(self, method: str, **args: Any) -> Any:
        self._control.check()
        _require_sendable(_CALLED_AS.get(method, method), args)
        return await self._rpc(method, args)

    async def spawn(
        self,
        prompt: Any,
        *,
        provider: str | None = None,
        label: str | None = None,
        wait: bool = True,
        max_steps: int | None = None,
        timeout_ms: int | None = None,
        output_schema: dict[str, Any] | None = None,
        tool_filter: dict[str, list[str]] | None = None,
        persona: str | None = None,
        sandbox: str | None = None,
        max_depth: int | None = None,
    ) -> "RunResult | str":
        """Start a one-shot child; wait for its result, or return its id (``wait=False``)."""
        args = {
            "prompt": prompt, "provider": provider, "label": label, "max_steps": max_steps, "timeout_ms": timeout_ms,
            "output_schema": output_schema, "tool_filter": tool_filter, "persona": persona, "sandbox": sandbox,
            "max_depth": max_depth,
        }
        if wait:
            return RunResult.from_wire(await self._call("spawn_wait", **args))
        return str(await self._call("spawn", **args))

    async def wait(self, run_id: str) -> RunResult:
        """Wait for a background child started with ``spawn(wait=False)``."""
        return RunResult.from_wire(await self._call("wait_run", run_id=run_id))

    async def start_continuable(
        self, prompt: Any, *, label: str, provider: str | None = None, max_steps: int | None = None, timeout_ms: int | None = None,
        **options: Any,
    ) -> tuple[str, str]:
        """Start a continuable child: ``(child id, message id)`` once its first message is accepted.

        ``max_steps`` and ``timeout_ms`` bound each of its turns, as ``spawn`` takes them (or
        ``budget={"max_steps": ..., "timeout_ms": ...}``, not both); ``options`` are the other fields of
        ``ContinuableSpec`` (``max_depth``, ``tool_filter``, ``persona``, ``sandbox``, ``child_id``, ...)."""
        if max_steps is not None or timeout_ms is not None:
            if "budget" in options:
                raise TypeError("start_continuable takes max_steps and timeout_ms, or budget, not both")
            options["budget"] = {k: v for k, v in (("max_steps", max_steps), ("timeout_ms", timeout_ms)) if v is not None}
        _require_sendable("start_continuable", options)  # each option by its own name, not as "options"
        child_id, message_id = await self._call("start_continuable", prompt=prompt, label=label, provider=provider, options=options)
        return child_id, message_id

    async def send_message(self, child_id: str, message: Any) -> str:
        return str(await self._call("send_message", child_id=child_id, message=message))

    async def list_agents(self, scope: Literal["children", "descendants"] = "children") -> list[dict[str, Any]]:
        """``ValueError`` for another scope (``list_agents("bogus")`` listed the children)."""
        if scope not in AGENT_SCOPES:
            raise ValueError(f'scope must be "children" or "descendants", not {scope!r}')
        return list(await self._call("list_agents", scope=scope))

    async def report(self, content: Any, delivery: Literal["quiet", "wakeup"] = "quiet") -> str:
        await self._writer.flush()  # the parent never reads a report ahead of what led to it
        message_id = str(await self._call("report", content=content, delivery=delivery))
        self._writer.append([("report/sent", {"message_id": message_id, "delivery": delivery})])
        return message_id

    async def interrupt(self, child_id: str) -> bool:
        """Stop the running turn of a continuable descendant; whether one was stopped. As in the reference,
        what has no turn to stop here (a one-shot child, which its ``spawn`` handle disposes; an idle or
        unknown id) is no error: the answer is False, never a success that did nothing. An id no session
        can have (``../x``) is ``INVALID_SESSION_ID``, as ``send_message`` answers it."""
        return bool(await self._call("interrupt", child_id=child_id))


# the requests whose public name is not the one they travel under
_CALLED_AS = {"spawn_wait": "spawn", "wait_run": "wait"}


def _require_sendable(call: str, args: dict[str, Any]) -> None:
    """``UnsendableArgumentError`` naming the first argument no message holds, before anything is sent: msgpack's
    bare ``TypeError`` from deep inside the pipe said neither which call nor which argument."""
    for name, value in args.items():
        try:
            msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise UnsendableArgumentError(call, name, exc) from None
        problem = non_text_key(value)
        if problem is not None:
            raise UnsendableArgumentError(call, name, TypeError(problem))


class BlockingTurnContext:
    """The same API for a plain ``def`` program running in a worker thread.

    Built on the turn's event loop, it keeps that loop's token, so that its calls
    work from any thread: the one the turn runs in and the threads the program
    starts itself (a ``ThreadPoolExecutor`` fanning out work), which anyio's
    thread-local lookup alone would refuse with ``NoEventLoopError``.
    """

    def __init__(self, ctx: TurnContext, control: TurnControl) -> None:
        self._ctx = ctx
        self._control = control
        self._loop = anyio.lowlevel.current_token()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ctx, name)
        if callable(value) and name in _ASYNC_METHODS:
            def call(*args: Any, **kwargs: Any) -> Any:
                self._control.check()
                return anyio.from_thread.run(lambda: value(*args, **kwargs), token=self._loop)
            return call
        return value

    def stopping(self) -> bool:
        """True once the turn was cancelled or ran out of budget (cheap; no loop hop)."""
        return self._control.stopping

    def check(self) -> None:
        """Raise if the turn must stop (cheap; for tight CPU loops)."""
        self._control.check()


_ASYNC_METHODS = frozenset(
    {"history", "step", "say", "call_tool", "spawn", "wait", "start_continuable", "send_message", "list_agents", "report", "interrupt"}
)

__all__ += ["TurnStopped"]
