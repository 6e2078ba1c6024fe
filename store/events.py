"""Event types of a session log and the crash closers that balance an open turn.

An event is ``{seq, ts, type, data, epoch}`` (+ ``ignorable: true`` for a
type a reader may skip). A type outside ``EVENT_TYPES`` without
``ignorable`` makes the log unsupported: a newer writer meant something this
build cannot read. ``message/discarded`` is this project's addition: a mailbox
message dropped by teardown (drain), which counts as consumed.
"""

from __future__ import annotations

from typing import Any

from .appender import WIDEST_SEQ

__all__ = ["EVENT_TYPES", "STOP_REASONS_IN_LOG", "unknown_type", "closers", "widest_event", "TOOL_OUTCOME_UNKNOWN"]

EVENT_TYPES = frozenset(
    {
        "subagent/descriptor",
        "sandbox/mode",
        "approval/policy",
        "session/end-seed",
        "message/accepted",
        "message/discarded",
        "turn/start",
        "step/start",
        "step/end",
        "tool/call",
        "tool/result",
        "assistant/message",
        "turn/end",
        "report/sent",
        "notice/received",
    }
)

STOP_REASONS_IN_LOG = frozenset(
    {"completed", "aborted", "error", "max-tokens", "refusal", "budget-exhausted", "blocked", "interrupted"}
)


def unknown_type(event: dict[str, Any]) -> str | None:
    """The event's type if this build must refuse it, else ``None``."""
    kind = event.get("type")
    if kind in EVENT_TYPES or event.get("ignorable") is True:
        return None
    return str(kind)


def widest_event(kind: str, data: Any) -> dict[str, Any]:
    """The event ``(kind, data)`` as its widest log record frames it (seq and epoch at their widest,
    ``ts`` a float): what a check that it will fit the store's record limit must encode."""
    return {"seq": WIDEST_SEQ, "ts": 0.0, "type": kind, "data": data, "epoch": WIDEST_SEQ}


# the answer of a ``tool/call`` whose tool may or may not have run: its worker died in it (crash repair,
# ``closers``), or its turn was stopped while it waited (``TurnContext.closing_events``)
TOOL_OUTCOME_UNKNOWN = {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}


def closers(
    open_turn: int | None, open_step: int | None, open_calls: dict[str, int], *, cause: str | None = None,
    crash: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Events that close a turn a crash left open (the resume path's crash repair, store/FORMAT.md).

    Every ``tool/call`` without a ``tool/result`` gets a synthetic error result
    (``TOOL_OUTCOME_UNKNOWN``: it may or may not have run), then the open step
    gets ``step/end``, then the turn gets ``turn/end`` ``interrupted``, with
    ``cause`` when the repairer knows the worker died because the turn was
    being stopped (a cancel it ignored): the log then says who stopped it, in
    the words the turn's caller got (``the turn was cancelled (user); worker
    process 1234 killed by signal SIGKILL``), and a listing reads it as the
    stop it was (``aborted``, ``store/outcome.py``), not a crash
    (``budget-exhausted`` for ``timeout``: killed past its ``timeout_ms``). ``crash``: how the worker
    died, when the repairer saw it (``worker process 1234 exited with code 3``), in the diagnostic, so
    a listing says what its caller was told.
    """
    if open_turn is None:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for call_id, call_seq in open_calls.items():
        out.append(
            (
                "tool/result",
                {
                    "call_id": call_id,
                    "is_error": True,
                    "error": dict(TOOL_OUTCOME_UNKNOWN),
                    "source_seqs": [call_seq],
                },
            )
        )
    if open_step is not None:
        out.append(("step/end", {"repaired": True}))
    if cause == "timeout":  # killed past its ``timeout_ms`` for ignoring the stop: its budget ended it
        end: dict[str, Any] = {"stop_reason": "budget-exhausted", "diagnostic": "the turn exceeded its timeout_ms and did not stop; "
                               "its worker was killed" + (f" ({crash})" if crash else "")}
    elif cause is not None:  # killed for ignoring a cancel: no crash, and the words its caller got (``cancelled (user); ...``)
        end = {"stop_reason": "interrupted", "diagnostic": f"the turn was cancelled ({cause}); {crash or 'its worker was killed'}"}
    else:
        end = {"stop_reason": "interrupted", "diagnostic": "the turn was interrupted by a crash" + (f" ({crash})" if crash else "")}
    if cause is not None:
        end["cause"] = cause
    out.append(("turn/end", end))
    return out
