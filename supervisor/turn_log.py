"""What a turn said and how it ended, read back from its log when its worker could not tell (it died).

A worker hands its turn's outcome to the supervisor over its pipe. When it dies first, the log is
the only witness, and both kinds of child read it the same way after the crash repair
(``LogWriter.open``): a worker that died after its closing commit left the turn's own ``turn/end``
(``committed_outcome``: the caller is told what the log says, as a listing does, not a crash); one
that died mid-turn left the replies it logged before it died (``last_reply``), which are the
turn's output as a failing turn's last reply is.
"""

from __future__ import annotations

import json
from typing import Any

from subagents.store import LogWriter, Store, read_from
from subagents.worker.protocol import TurnOutcome

__all__ = ["ReadBack", "committed_outcome", "last_reply", "read_back"]


def _last_turn(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    start = max((i for i, e in enumerate(events) if e["type"] == "turn/start"), default=0)
    return events[start:]


def last_reply(events: list[dict[str, Any]]) -> str:
    """The last ``assistant/message`` of the events' last turn ("" if it logged none): its output."""
    return next((str(e["data"].get("text") or "") for e in reversed(_last_turn(events)) if e["type"] == "assistant/message"), "")


def committed_outcome(
    events: list[dict[str, Any]], output_schema: dict[str, Any] | None, *, message_id: str | None = None,
) -> TurnOutcome | None:
    """The outcome a turn's worker committed (its ``turn/end``, its last message), read back from its
    log. The output is the turn's last reply, as the worker's own outcome has it; a structured value is
    the output's JSON (what the worker validated against ``output_schema``), as a value the program gave
    beside its output is not logged. ``None`` if the events' last turn holds no ``turn/end``, or is not
    the one that took ``message_id`` when given (a continuable child's earlier turn: its worker died
    before it logged this one)."""
    turn = _last_turn(events)
    end = next((e["data"] for e in reversed(turn) if e["type"] == "turn/end"), None)
    if end is None or not turn or (message_id is not None and (turn[0].get("data") or {}).get("message_id") != message_id):
        return None
    output = last_reply(events)
    reason = "refusal" if end.get("stop_reason") == "blocked" else str(end.get("stop_reason"))  # the worker logs a refusal so
    structured = None
    if reason == "completed" and output_schema is not None:
        try:
            structured = json.loads(output)
        except ValueError:
            structured = None
    return TurnOutcome(stop_reason=reason, output=output, structured=structured, diagnostic=end.get("diagnostic"))


ReadBack = tuple[TurnOutcome | None, str]


def read_back(
    store: Store, writer: LogWriter, *, output_schema: dict[str, Any] | None = None, message_id: str | None = None,
) -> ReadBack:
    """What the log says of a turn whose worker died, once ``LogWriter.open`` (``writer``) repaired it:
    ``(the outcome its worker committed, "")`` when it died after the turn's closing commit (of the turn
    that took ``message_id``, when given), else ``(None, the last reply the turn logged before it died)``."""
    projection = writer.projection
    if not writer.repaired and projection.open_turn is None and projection.turns > 0:
        return committed_outcome(read_from(store, writer.session_id, 0), output_schema, message_id=message_id), ""
    if writer.closed_turn is not None:
        return None, last_reply(read_from(store, writer.session_id, writer.closed_turn))
    return None, ""
