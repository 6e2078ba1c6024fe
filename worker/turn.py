"""One turn of one child, inside a worker process.

Writes, with the lease epoch the supervisor gave it: ``message/accepted``
(unless creation already logged the message), ``turn/start``, whatever the
program records, the final ``assistant/message``, then ``turn/end`` with the
stop reason, and a commit point (fsync under ``batched``). Any failure of the
program resolves the turn with a non-``completed`` reason; only a store
failure (fenced, fsync) makes the turn end without a ``turn/end``, which the
next open repairs. Every store access goes through a ``SessionAccess``
(``worker/sessions.py``), so the turn does not care where the store is.
"""

from __future__ import annotations

import asyncio
import inspect as pyinspect
import json
import logging
import traceback
from typing import Any, Callable, Iterator

import anyio
import msgpack

from subagents.store.errors import FencedError, InvalidRecordError, NoRoomError, RecordTooLargeError, SubagentError
from subagents.store.events import widest_event
from subagents.store.framing import RecordEncoder
from subagents.store.root import Store

from .budget import TurnControl, TurnStopped
from .context import RESULT_STOP_REASONS, BlockingTurnContext, RpcCaller, TurnContext, TurnResult
from .errors import BudgetExhaustedError, ProgramLoadError
from .forks import exit_forked
from .leftovers import cancel_leftovers, tracked
from .programs import load_program
from .protocol import TurnOutcome, TurnSpec, non_text_key
from .sessions import LocalSessions, SessionAccess, SessionWriter

__all__ = ["MAX_DIAGNOSTIC_BYTES", "truncate_diagnostic", "run_turn"]

log = logging.getLogger(__name__)

MAX_DIAGNOSTIC_BYTES = 4096
_TRUNCATED = "\n[diagnostic truncated]"


def truncate_diagnostic(text: str | None) -> str | None:
    """At most 4096 UTF-8 bytes, cut on a character boundary, with a marker; a character no UTF-8
    holds (a lone surrogate: a file name ``os.listdir`` decoded from other bytes, in an exception's
    text) written as its escape, so the diagnostic can be stored and the turn closed with it."""
    if text is None:
        return None
    raw = text.encode("utf-8", errors="backslashreplace")
    if len(raw) <= MAX_DIAGNOSTIC_BYTES:
        return raw.decode("utf-8")
    room = MAX_DIAGNOSTIC_BYTES - len(_TRUNCATED.encode("utf-8"))
    return raw[:room].decode("utf-8", errors="ignore") + _TRUNCATED


def _validate_structured(schema: dict[str, Any], output: str, structured: Any) -> tuple[Any, str | None]:
    from .output_schema import check_structured  # jsonschema is imported only by turns that ask for it

    value = structured
    if value is None:
        try:
            value = json.loads(output)
        except (TypeError, ValueError):
            return None, "structured output is missing: the output is not JSON"
    problem = check_structured(schema, value)
    return (None, problem) if problem is not None else (value, None)


async def _timer(control: TurnControl, timeout_ms: int) -> None:
    """Stop the turn at its wall-clock budget (a cancellation that came first wins)."""
    await anyio.sleep(timeout_ms / 1000.0)
    control.timeout_ms = timeout_ms
    control.time_out()


async def run_turn(
    spec: TurnSpec, control: TurnControl, rpc: RpcCaller, *, sessions: SessionAccess | None = None, node: str | None = None,
    release_allowed: Callable[[], bool] | None = None, load_hint: str = "",
) -> TurnOutcome:
    """Run one turn; ``sessions`` reaches the store (default: the local store at ``spec.store_root``,
    opened for this turn and closed after it); ``node`` (where the pool dispatched it) goes into ``turn/start``;
    ``load_hint`` follows the diagnostic of a program this process cannot load, in the log as in the result
    (a Ray node: which one, and how to install the program there)."""
    if sessions is None:
        local = LocalSessions(Store(spec.store_root, durability=spec.durability, create=False))
        try:
            return await run_turn(spec, control, rpc, sessions=local, node=node, release_allowed=release_allowed, load_hint=load_hint)
        finally:
            local.close()  # the indexes it kept open for the release's row
    try:
        writer = await _store_call(sessions, lambda: sessions.open_writer(spec.session_id, epoch=spec.epoch, log_state=spec.log_state))
    except FencedError as exc:  # taken over before the turn began: nothing was written
        return _fenced(spec, control, exc)
    try:
        outcome = await _run(spec, control, rpc, writer, sessions, node, load_hint)
        # a child start still unanswered (the turn was stopped during it) may add to this session's
        # children index after the release, under a settled row that says it has none: the
        # supervisor releases once the start is over (``OneShotRuns._drive``)
        if spec.release_owner is not None and (release_allowed is None or release_allowed()):
            outcome.released = await _store_call(sessions, lambda: _release(writer, spec))
    except FencedError as exc:
        return _fenced(spec, control, exc)
    finally:
        control.ended = True  # before the writer closes: a kept context says TURN_GONE, never "fd -1"
        await _store_call(sessions, writer.close)
    return outcome


async def _store_call(sessions: SessionAccess, call: Callable[[], Any]) -> Any:
    """``call`` (an open, a release, a close) as ``sessions`` needs it: inline on a local store, in a
    thread on a remote one, so that its round trip holds up no other turn on this worker's loop.

    Shielded either way: once begun, an open, a release or a close completes (a cancelled turn
    must still close the writer it opened; the cancellation is delivered right after).
    """
    if not sessions.remote:
        return call()
    with anyio.CancelScope(shield=True):
        return await anyio.to_thread.run_sync(call)


def _release(writer: SessionWriter, spec: TurnSpec) -> bool:
    """Release a one-shot child's lease after its closing commit, on the turn's own writer;
    False leaves it to the supervisor.

    Any failure here is reported, never raised: the turn itself is committed, and
    the supervisor releases (or finds the lease taken over) when ``released`` is False.
    """
    assert spec.release_owner is not None
    try:
        writer.release_lease(spec.release_owner)
    except FencedError:
        log.info("lease of %s moved on before release at epoch %d", spec.session_id, spec.epoch)
        return False
    except (SubagentError, OSError):
        log.warning("releasing the lease of %s failed; the supervisor retries", spec.session_id, exc_info=True)
        return False
    return True


def _fenced(spec: TurnSpec, control: TurnControl, exc: FencedError) -> TurnOutcome:
    """The outcome of a turn whose session another supervisor took over.

    ``fenced`` tells the supervisor's driver to drop the activation without
    writing; the diagnostic names the epochs for people.
    """
    # info, not warning: the supervisor that drops the activation logs it, once per session
    log.info("turn of %s fenced at epoch %d", spec.session_id, spec.epoch)
    return TurnOutcome(stop_reason="error", diagnostic=truncate_diagnostic(f"{exc.code}: {exc}"), steps=control.steps, fenced=True)


class _ProgramFailed(Exception):
    """A program raised what is no ``Exception`` (``KeyboardInterrupt``, a ``BaseException`` of its own):
    carried as one, so the turn ends ``error`` saying so instead of the worker dying of it."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__(str(failure))
        self.failure = failure


def _program_failure(exc: BaseException, control: TurnControl) -> Exception:
    """What the program raised, as the turn's failure; a cancellation someone asked for (the turn's own stop,
    or the worker's) and ``SystemExit`` (the program asked the worker to exit) go on as they are.

    A cancellation nobody asked for is the program's own failure: passed on, it ended the turn's task as
    cancelled, which sent no outcome, and the caller waited until an interrupt killed the worker. So is
    ``GeneratorExit`` (what closing a generator raises inside it), which ended the whole worker."""
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, SystemExit) or (isinstance(exc, anyio.get_cancelled_exc_class()) and _cancel_asked(control)):
        raise exc
    return _ProgramFailed(exc)


def _cancel_asked(control: TurnControl) -> bool:
    """Whether the turn's scope, or anything around the task running it, asked for a cancellation."""
    if control.scope.cancel_called:
        return True
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not asyncio: every cancellation there comes from a scope
        return True
    return task is None or task.cancelling() > 0


def _described(exc: BaseException) -> str:
    """``Type: message`` of a program's failure, even when its ``__str__`` raises. A group (what a task
    group raises) is followed by what failed inside it, its first three leaves: the group's own text
    ("unhandled errors in a TaskGroup") says nothing of the cause."""
    try:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except Exception:  # noqa: BLE001 - the failure's own text failed: its type is what is left
        return type(exc).__name__
    if not isinstance(exc, BaseExceptionGroup):
        return text
    leaves = list(_leaves(exc))
    more = f"; and {len(leaves) - 3} more" if len(leaves) > 3 else ""
    return f"{text}: " + "; ".join(_described(leaf) for leaf in leaves[:3]) + more


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            yield from _leaves(inner)
        else:
            yield inner


def _check_result(result: TurnResult) -> None:
    """A ``TurnResult`` a caller, a log and a listing can all hold: ``TypeError``/``ValueError`` (the turn ends
    ``error`` naming the field) for output or diagnostic that is no text, an unknown stop reason, or structured
    output no record can hold. A result the supervisor could not take used to leave its caller waiting."""
    if result.output is not None and not isinstance(result.output, str):
        raise TypeError(f"TurnResult.output must be text, not {type(result.output).__name__}")
    if result.diagnostic is not None and not isinstance(result.diagnostic, str):
        raise TypeError(f"TurnResult.diagnostic must be text or None, not {type(result.diagnostic).__name__}")
    if result.stop_reason not in RESULT_STOP_REASONS:
        raise ValueError(f"TurnResult.stop_reason must be one of {', '.join(RESULT_STOP_REASONS)}, not {result.stop_reason!r}")
    if result.structured is not None:
        try:
            msgpack.packb(result.structured)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"TurnResult.structured cannot be stored ({exc})") from None
        try:  # a JSON value: every reader prints it as JSON (``--json``, the notice), and JSON has no NaN
            json.dumps(result.structured, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"TurnResult.structured must be a JSON value ({exc})") from None
        problem = non_text_key(result.structured)  # JSON would make them text: another value than the program's
        if problem is not None:
            raise TypeError(f"TurnResult.structured must be a JSON value ({problem})")


def _refuse_result(result: object) -> None:
    """``TypeError`` for a program's return value that is neither text nor a ``TurnResult`` (bytes, a dict, the
    generator an ``async def`` that yields returns): its ``str()`` used to become the output, as if completed."""
    if pyinspect.iscoroutine(result):
        result.close()  # never awaited, and never will be: no "was never awaited" warning on top
    raise TypeError(f"a program returns text or a TurnResult, not {type(result).__name__}")


def _run_blocking(program: Any, ctx: BlockingTurnContext) -> Any:
    """A plain ``def`` program, in its thread; a process it forks ends as it comes back (``worker/forks.py``)."""
    try:
        result = program(ctx)
    except BaseException:
        exit_forked(failed=True)
        raise
    exit_forked(failed=False)
    return result


async def _call_program(program: Any, ctx: TurnContext, control: TurnControl) -> Any:
    """Run the program under the turn's cancel scope: ``async def`` on the loop, plain ``def`` in a thread.
    The tasks it leaves running are cancelled as it returns or fails (``worker/leftovers.py``)."""
    with tracked() as owned:
        try:
            with control.scope:
                if pyinspect.iscoroutinefunction(program) or pyinspect.iscoroutinefunction(getattr(program, "__call__", None)):
                    try:
                        result = await program(ctx)
                    except BaseException:
                        exit_forked(failed=True)  # a process the program forked ends here (worker/forks.py)
                        raise
                    exit_forked(failed=False)
                    return result
                return await anyio.to_thread.run_sync(_run_blocking, program, BlockingTurnContext(ctx, control))
        finally:
            if owned:
                with anyio.CancelScope(shield=True):
                    await cancel_leftovers(owned, who=f"turn of {ctx.session_id}")


def _oversized_messages(first: list[tuple[str, Any]], exc: RecordTooLargeError) -> tuple[list[tuple[str, Any]], str] | None:
    """``first`` with each message its log cannot hold discarded unrun (``cause: too-large``), and why;
    None when no message is the one too large.

    Acceptance refuses such a message (``store/mailbox.py``), but a store's mailbox may hold one from
    a build that framed only the mailbox's record: taken as it is, every turn would fail before it
    started, and nothing queued behind it would ever run. When the waking message is one of them, no
    turn runs: ``turn/start`` and a ``turn/end`` error with the diagnostic close the batch instead."""
    limit = getattr(exc, "limit", None)
    if not isinstance(limit, int):
        return None
    encode = RecordEncoder(limit)
    out: list[tuple[str, Any]] = []
    dropped: list[str] = []
    for kind, data in first:
        if kind == "message/accepted":
            try:
                encode(widest_event(kind, data))
            except RecordTooLargeError:
                kept = {key: data[key] for key in ("message_id", "mailbox_end") if key in data}
                out.append(("message/discarded", {**kept, "cause": "too-large"}))
                dropped.append(str(data.get("message_id")))
                continue
        out.append((kind, data))
    if not dropped:
        return None
    diagnostic = (f"MESSAGE_TOO_LARGE: message {', '.join(dropped)} is larger than a log record may be ({limit} bytes): "
                  f"discarded unrun")
    log.error("%s", diagnostic)
    waking = next((data for kind, data in first if kind == "turn/start"), {})
    if waking.get("message_id") in dropped:
        out += [("turn/end", {"stop_reason": "error", "diagnostic": diagnostic})]  # after its turn/start: a turn that ran nothing
    return out, diagnostic


async def _run(
    spec: TurnSpec, control: TurnControl, rpc: RpcCaller, writer: SessionWriter, sessions: SessionAccess, node: str | None,
    load_hint: str = "",
) -> TurnOutcome:
    first: list[tuple[str, Any]] = []
    for notice in spec.notices:
        # quiet messages accepted before this turn's waking one: consumed here, in FIFO order
        first.append(("message/accepted", {**notice, "quiet": True}))
    if spec.log_message:
        accepted: dict[str, Any] = {"message_id": spec.message_id, "source": spec.message_source, "content": spec.message}
        if spec.message_mailbox_end is not None:
            accepted["mailbox_end"] = spec.message_mailbox_end
        first.append(("message/accepted", accepted))
    # the place rides the turn's first append: no write of its own (FORMAT.md §5)
    first.append(("turn/start", {"message_id": spec.message_id} if node is None else {"message_id": spec.message_id, "node": node}))
    try:
        writer.append(first)
    except RecordTooLargeError as exc:
        refused = _oversized_messages(first, exc)
        if refused is None:
            raise
        first, diagnostic = refused
        if first[-1][0] != "turn/start":  # the waking message itself: consumed unrun, and the turn says why
            writer.append(first, commit=True)
            return TurnOutcome(stop_reason="error", diagnostic=diagnostic)
        writer.append(first)

    ctx = TurnContext(spec, writer, control, rpc, None, sessions)
    output, structured = "", None
    given = False  # the program's TurnResult gave its output, "" too: no falling back to the last text said
    stop_reason, diagnostic = "completed", None
    try:
        program = load_program(spec.program, spec.program_blob)
        result: Any = None
        failure: Exception | None = None
        if spec.budget.timeout_ms is None:
            # no timer to run beside the program: no task group (creating and cancelling
            # one costs more than a short turn such as echo)
            try:
                result = await _call_program(program, ctx, control)
            except BaseException as exc:
                failure = _program_failure(exc, control)
        else:
            async with anyio.create_task_group() as timers:
                timers.start_soon(_timer, control, spec.budget.timeout_ms)
                try:
                    result = await _call_program(program, ctx, control)
                except BaseException as exc:
                    # kept out of the task group: leaving it with an error would wrap
                    # the program's exception in an ExceptionGroup, and the diagnostic
                    # (and the SubagentError branch below) would see only the wrapper
                    failure = _program_failure(exc, control)
                timers.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if control.cause is None:
            if isinstance(result, TurnResult):
                _check_result(result)
                output, structured, given = result.output or "", result.structured, result.output is not None
                stop_reason, diagnostic = result.stop_reason, result.diagnostic
            elif isinstance(result, str):
                output = result
            elif result is not None:
                _refuse_result(result)
    except (TurnStopped, BudgetExhaustedError):
        pass
    except ProgramLoadError as exc:
        stop_reason, diagnostic = "error", f"{exc.code}: {exc}{load_hint}"
    except SubagentError as exc:
        stop_reason, diagnostic = "error", f"{exc.code}: {exc}"
    except _ProgramFailed as exc:
        stop_reason, diagnostic = "error", _described(exc.failure)
    except Exception as exc:
        stop_reason, diagnostic = "error", _described(exc)
    if control.cause is not None:
        stop_reason, diagnostic = control.cause, control.diagnostic
    # the open step's end, the final message and turn/end go out as one append and one
    # commit: they describe the same instant, and a crash before it is repaired alike
    closing = ctx.closing_events()
    if output and output != ctx.last_output:
        closing.append(("assistant/message", {"text": output}))
    elif not output and not given:
        output = ctx.last_output
    if stop_reason == "completed" and spec.output_schema is not None:
        structured, problem = _validate_structured(spec.output_schema, output, structured)
        if problem is not None:
            stop_reason, diagnostic = "error", problem
    diagnostic = truncate_diagnostic(diagnostic)
    log_reason = "blocked" if stop_reason == "refusal" else stop_reason
    end: dict[str, Any] = {"stop_reason": log_reason, "diagnostic": diagnostic}
    if control.cause is not None and control.why is not None:
        end["cause"] = control.why  # what stopped it (store/outcome.py reads it)
    closing.append(("turn/end", end))
    try:
        writer.append(closing, commit=True)
        # in the try too: a remote writer (``worker/service_writer.py``) hears the disk's refusal of what it
        # queued, this append or one before it, only when the store's host answers, so here
        await writer.flush()
    except (RecordTooLargeError, InvalidRecordError, NoRoomError) as exc:
        # what the program left cannot be stored (larger than the store takes, text no encoding holds, more
        # than the disk has room for: that append was cut back whole, and a short closing record fits in
        # the block the log already has): the turn still ends, in the log as in its result, saying why
        output, structured, stop_reason = "", None, "error"
        diagnostic = truncate_diagnostic(f"{exc.code}: the turn's closing message cannot be stored: {exc}")
        closing = [event for event in closing if event[0] not in ("assistant/message", "turn/end")]
        writer.append([*closing, ("turn/end", {"stop_reason": "error", "diagnostic": diagnostic})], commit=True)
        await writer.flush()
    return TurnOutcome(output=output, structured=structured, stop_reason=stop_reason, diagnostic=diagnostic, steps=control.steps)
