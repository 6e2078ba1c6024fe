"""A new session's seed: the events it inherits from its parent, checked and framed as log records.

A seed is given to ``create_session`` as a list of event maps, typically a
fork's prefix copied from the parent's log. Each is checked here, before
any byte of the new session is written, the way an append checks its
events: a map whose keys are the log envelope's own (``seq``, ``ts``,
``type``, ``data``, ``epoch``, ``ignorable``), ``type`` a string, ``ts`` a
finite number when given, ``seq`` its own index when given (contiguous from
0), and a type this build reads unless the event is marked ``ignorable``.

Why refuse rather than repair: a seed event whose type this build cannot
read made a session every reader then refused (``UNSUPPORTED_FORMAT`` from
``inspect``, a violation in ``store check``), and one whose type was not a
string made a log that read as a torn tail; a key the envelope does not have
(the reference's ``surfaceOp``, a misspelt ``tpye``) was dropped without a
word, so what the caller meant by it was lost. An ``ignorable`` mark is kept,
not dropped: without it an event a newer writer made skippable becomes one
that makes the copy unreadable.

A seed also ends between turns: one whose last ``turn/start`` has no
``turn/end`` after it made a session that read as running a turn nobody ran
(its projection's ``open_turn`` set from its creation, for the next writer to
repair as a crash). A fork's prefix ends at its source's last ``turn/end``,
so it always does.
"""

from __future__ import annotations

from typing import Any, Sequence

from .errors import InvalidRecordError
from .events import EVENT_TYPES
from .records import finite_number

__all__ = ["SEED_KEYS", "seed_rows"]

# the log envelope's keys (FORMAT.md §5): a seed event has no others
SEED_KEYS = ("seq", "ts", "type", "data", "epoch", "ignorable")


def seed_rows(seed: Sequence[Any], now: float) -> list[dict[str, Any]]:
    """The seed as log records (``seq`` from 0, ``epoch`` 0, its own ``ts`` or ``now``), or
    ``InvalidRecordError`` naming the first event a reader would refuse, or the ``turn/start`` of a
    turn the seed leaves open."""
    rows: list[dict[str, Any]] = []
    open_turn: int | None = None
    for i, event in enumerate(seed):
        problem = _problem(i, event)
        if problem is not None:
            raise InvalidRecordError(f"seed event {i}", problem)
        if event["type"] == "turn/start":
            open_turn = i
        elif event["type"] == "turn/end":
            open_turn = None
        row = {"seq": i, "ts": event.get("ts", now), "type": event["type"], "data": event.get("data"), "epoch": 0}
        if event.get("ignorable") is True:
            row["ignorable"] = True
        rows.append(row)
    if open_turn is not None:
        raise InvalidRecordError(f"seed event {open_turn}", "the seed ends inside an open turn (this turn/start has no turn/end): "
                                 "a seed ends between turns")
    return rows


def _problem(index: int, event: Any) -> str | None:
    """What makes ``event`` (at ``index`` in the seed) a record no reader would take, or None."""
    if not isinstance(event, dict):
        return f"an event is a map, not {type(event).__name__}"
    unknown = [key for key in event if key not in SEED_KEYS]
    if unknown:
        return f"unknown key {unknown[0]!r} (an event's keys are {', '.join(SEED_KEYS)})"
    kind = event.get("type")
    if not isinstance(kind, str):
        return f"type must be a string, not {type(kind).__name__}"
    if "ts" in event and not finite_number(event["ts"]):
        return "ts must be a finite number"
    seq = event.get("seq", index)
    if type(seq) is not int or seq != index:
        return f"seq must be {index} (a seed's events are contiguous from 0), not {seq!r}"
    epoch = event.get("epoch", 0)
    if type(epoch) is not int or epoch < 0:
        return "epoch must be a non-negative integer"
    ignorable = event.get("ignorable", False)
    if type(ignorable) is not bool:
        return "ignorable must be a boolean"
    if kind not in EVENT_TYPES and not ignorable:
        return f'event type "{kind}" is not one this build reads, and the event is not marked ignorable'
    return None
