"""What a settled activation tells its parent: the epoch's stop reason and the settlement notice.

Pure functions over an epoch's own turns; ``teardown.py`` sends the notice
durably to the parent's mailbox before the parent stops owning the child.
The notice texts are part of the contract (a parent's model reads them).
"""

from __future__ import annotations

__all__ = ["SUMMARIES", "epoch_stop_reason", "settlement_text", "bounded_line"]

SUMMARIES = {
    "completed": "Background subagent {id} finished and will do no further work unless you send it more.",
    "aborted": "Background subagent {id} was stopped before it finished.",
    "max-tokens": "Background subagent {id} ran out of room before it finished.",
    "refusal": "Background subagent {id} declined the task.",
    "error": "Background subagent {id} failed before it finished.",
}


def epoch_stop_reason(reasons: list[str], dropped_unrun: bool) -> str:
    """The stop reason of a whole residency epoch, from the stop reasons of its own turns.

    The last turn decides: an interrupted or aborted turn makes the epoch
    ``aborted``, a guard's ``blocked`` is a ``refusal``; a completed epoch
    whose pending messages a drain dropped unrun is ``aborted`` too.
    """
    if not reasons:
        return "aborted" if dropped_unrun else "completed"
    last = reasons[-1]
    if last in ("aborted", "interrupted"):
        return "aborted"
    if last in ("blocked", "refusal"):
        return "refusal"
    if last in ("max-tokens", "error"):
        return last
    if last == "completed":
        return "aborted" if dropped_unrun else "completed"
    return last


def settlement_text(child_id: str, reason: str, output: str, *, cut: int | None = None) -> tuple[str, str]:
    """(summary line, whole notice) for a child that settled with ``reason`` and closing ``output``.

    ``cut``: the most UTF-8 bytes of ``output`` the notice may carry (a closing message near the store's
    record limit would make a notice no mailbox takes, and the parent would hear nothing); a cut message
    ends saying where the whole of it is."""
    template = SUMMARIES.get(reason)
    summary = template.format(id=child_id) if template else f"Background subagent {child_id} ended abnormally ({reason}) before it finished."
    if cut is not None and len(output.encode("utf-8")) > cut:
        kept = output.encode("utf-8")[:cut].decode("utf-8", errors="ignore")
        output = f"{kept}\n[… cut: the closing message is longer than a notice may be; all of it is in the child's log (`subagents log {child_id}`)]"
    body = f"{summary}\nIts closing message:\n{output}" if output else f"{summary}\nIt left no closing message."
    return summary, body


def bounded_line(line: str) -> str:
    """The first line, at most 120 characters (the notice's one-line summary in its source)."""
    first = line.splitlines()[0] if line else ""
    return first if len(first) <= 120 else first[:119] + "…"
