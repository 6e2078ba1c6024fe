"""The outcome of a session: how its work ended, in one word, derived from its log.

``status`` (running / idle / complete) says whether a live supervisor holds a
session; the outcome says how its last turn went. This module is the one
place that maps log records to outcome words (``store/FORMAT.md`` "Outcomes"
repeats the table for readers of the bytes). It reads a ``Projection`` (the
identity cache plus the log after it), never the whole log, so a listing pays
nothing extra for it. Called by the catalog, ``list_roots``, ``held_sessions``,
``describe_session`` and the CLI.

What is *not* guaranteed: the outcome is the log's word. A turn stopped by
its parent (``cause = "parent"``) reads ``aborted`` whether an ancestor
interrupted it or a drain tore its lineage down; a drain reads ``drained``
when it dropped accepted work unrun (``message/discarded``) or its cancel
says ``drain``. Work dropped unrun because an interrupt stopped the turn
before a worker took it (the discard's ``cause`` is ``user`` or ``parent``)
reads ``aborted``, as the same interrupt of a running turn does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from .projection import Projection
from .query_words import OUTCOMES, Outcome

__all__ = ["Outcome", "OUTCOMES", "OutcomeVerdict", "dropped_text", "is_dropped_text", "outcome_of", "split_diagnostic"]

# turn/end ``stop_reason`` → outcome, where the reason alone decides
_BY_REASON: dict[str, Outcome] = {
    "completed": "completed",
    "error": "error",
    "interrupted": "interrupted",  # written only by crash repair (store/events.py closers); a known stop's cause: _turn_outcome
    "blocked": "refused",
    "refusal": "refused",
    "max-tokens": "max-tokens",
}

# a ``message/discarded`` cause that reads as a stopped turn rather than a drain
_INTERRUPT_CAUSES = frozenset({"user", "parent"})

# an error code is the diagnostic's first word before ": " (``NOT_RESUMABLE: …``, ``ValueError: …``)
_CODE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]{0,63}): ")

# what happens next to a crashed turn: a continuable child is resumed (crash repair closes it), a one-shot never is
CRASHED_TEXT = "its host stopped mid-turn; the turn is closed as interrupted when the child is next resumed"
CRASHED_ONE_SHOT_TEXT = "its host stopped mid-turn; a one-shot child is never resumed, so its work ended there"


@dataclass(frozen=True)
class OutcomeVerdict:
    """One session's outcome, and for a failure its error code and the diagnostic's first line."""

    outcome: Outcome | None  # None: a live session whose first turn has not finished, or a root that never ran one
    error_code: str | None = None
    error: str | None = None


def split_diagnostic(diagnostic: str | None) -> tuple[str | None, str | None]:
    """``(code, first line)`` of a diagnostic; the code only when it leads as ``CODE: text``."""
    if not diagnostic:
        return None, None
    first = diagnostic.strip().splitlines()[0] if diagnostic.strip() else ""
    match = _CODE.match(first)
    return (match.group(1) if match else None), (first or None)


def _turn_outcome(p: Projection) -> Outcome:
    """The outcome of the last finished turn (``p.turns`` > 0)."""
    reason, cause = p.last_stop_reason or "", p.last_cause
    if reason == "aborted":
        return "drained" if cause == "drain" else "aborted"
    if reason == "budget-exhausted":
        timed_out = cause == "timeout" or (cause is None and (p.last_diagnostic or "").startswith("the turn exceeded timeout_ms"))
        return "timeout" if timed_out else "budget"
    if reason == "interrupted" and cause is not None:
        # closed by crash repair after its worker was killed for ignoring a stop: the stop it was, as its caller was told
        # (any cause: ``user``, ``parent``, its host closing, ``disposed``; as a turn that stopped when asked reads)
        return "drained" if cause == "drain" else "aborted"
    return _BY_REASON.get(reason, "error")  # an unknown reason is a failure: say so, with its text


def _discard_verdict(p: Projection) -> OutcomeVerdict:
    """Work dropped unrun (``p.discarded`` > 0): by an interrupt (``user`` / ``parent``) or by a drain
    (``drain``, or no cause: logs written before ``message/discarded`` said who dropped it), saying
    how much and by whom, as a turn a drain stopped says it was cancelled."""
    outcome: Outcome = "aborted" if p.discard_cause in _INTERRUPT_CAUSES else "drained"
    return OutcomeVerdict(outcome, None, dropped_text(p.discarded, p.discard_cause or "drain"))


def dropped_text(count: int, cause: str) -> str:
    """What a row of a session whose accepted work was dropped unrun says (its ``error``)."""
    return f"{count} accepted message{'' if count == 1 else 's'} dropped unrun ({cause})"


def is_dropped_text(text: str | None) -> bool:
    """Whether ``text`` is ``dropped_text``'s: a settled row an earlier build wrote has none there (``store check``)."""
    return text is not None and _DROPPED.fullmatch(text) is not None


_DROPPED = re.compile(r"[0-9]+ accepted messages? dropped unrun \([^()]*\)")


def outcome_of(p: Projection, *, held: bool, root: bool = False) -> OutcomeVerdict:
    """The outcome of a session whose log folds to ``p``; ``held``: a live owner holds its lease.

    Rules, first match wins:
    1. a turn is open and no live owner holds the session → ``crashed``;
    2. no turn finished: work dropped unrun → ``drained`` (``aborted`` when an interrupt dropped
       it); a live or open first turn, one a live owner holds (queued for a worker), or a root that
       never ran one → none yet; else ``not-started`` (nobody will start it until it is resumed);
    3. accepted work dropped unrun after the last turn ended → the same as in 2;
    4. else the last ``turn/end``: see ``_turn_outcome`` (FORMAT.md "Outcomes").
    """
    if p.open_turn is not None and not held:
        one_shot = getattr(p.identity, "mode", None) == "one-shot"
        return OutcomeVerdict("crashed", None, CRASHED_ONE_SHOT_TEXT if one_shot else CRASHED_TEXT)
    if p.turns == 0:
        if p.discarded:
            return _discard_verdict(p)
        if p.open_turn is not None or held or root:
            return OutcomeVerdict(None)
        return OutcomeVerdict("not-started")
    if p.discarded:
        return _discard_verdict(p)
    outcome = _turn_outcome(p)
    if outcome == "completed":
        return OutcomeVerdict(outcome)
    code, first = split_diagnostic(p.last_diagnostic)
    if outcome == "error" and p.last_stop_reason not in ("error", None):
        first = first or f"stop reason {p.last_stop_reason}"
    return OutcomeVerdict(outcome, code, first)
