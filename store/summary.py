"""Counts of a store or of one root's subtree: by status, by outcome, and live per supervisor.

``summarize`` walks the roots (or one root) with the catalog and counts its
rows; the per-supervisor counts come from the held sessions (live leases),
grouped by owner. Read-only; the cost is the catalog's for every session in
scope, so it is a command for people, not a hot path. Called by
``subagents summary``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .catalog import DiagnosticEntry, list_descendants
from .held import held_sessions
from .ids import validate_session_id
from .root import Store
from .roots import list_roots

__all__ = ["SupervisorCount", "Summary", "summarize"]


@dataclass(frozen=True)
class SupervisorCount:
    owner: str
    pid: int | None
    host: str | None
    running: int
    idle: int


@dataclass(frozen=True)
class Summary:
    root: str | None  # the subtree counted, or None for the whole store
    roots: int  # top-level sessions counted (1 for a subtree)
    subagents: int  # subagent sessions below them, diagnostics included
    by_status: dict[str, int] = field(default_factory=dict)  # subagents by running / idle / complete
    by_outcome: dict[str, int] = field(default_factory=dict)  # subagents by outcome ("none": no turn finished yet)
    diagnostics: dict[str, int] = field(default_factory=dict)  # subagents that do not read, by reason
    root_diagnostics: dict[str, int] = field(default_factory=dict)  # top-level sessions that do not read, by reason
    supervisors: list[SupervisorCount] = field(default_factory=list)  # live owners holding sessions in scope


def summarize(store: Store, root: str | None = None) -> Summary:
    if root is not None:
        validate_session_id(root)
    tops = [] if root is not None else list_roots(store)
    roots = [root] if root is not None else [r.id for r in tops]
    # a damaged root is a session too: counted, or a store whose roots no longer read sums up as healthy
    damaged_roots = Counter(r.reason for r in tops if isinstance(r, DiagnosticEntry))
    status: Counter[str] = Counter()
    outcome: Counter[str] = Counter()
    damaged: Counter[str] = Counter()
    in_scope = set(roots)
    count = 0
    for top in roots:
        for row in list_descendants(store, top):
            count += 1
            entry = row.entry
            in_scope.add(entry.id)
            if isinstance(entry, DiagnosticEntry):
                damaged[entry.reason] += 1
                continue
            status[entry.status] += 1
            outcome[entry.outcome or "none"] += 1
    owners: dict[str, list[int]] = {}
    meta: dict[str, tuple[int | None, str | None]] = {}
    for held in held_sessions(store):
        if held.id not in in_scope:
            continue
        counts = owners.setdefault(held.owner, [0, 0])
        counts[0 if held.status == "running" else 1] += 1
        meta[held.owner] = (held.owner_pid, held.owner_host)
    supervisors = [SupervisorCount(o, meta[o][0], meta[o][1], c[0], c[1]) for o, c in sorted(owners.items())]
    return Summary(root, len(roots), count, dict(status), dict(outcome), dict(damaged), dict(damaged_roots), supervisors)
