"""How a child listing reads to a model (the reference's ``list_agents`` texts, exactly)."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["render_rows"]


def render_rows(rows: Sequence[dict[str, Any]], *, descendants: bool = False) -> str:
    """``<id> [<status>] — <label>``, ``<id> [diagnostic: <reason>]``, or ``(no subagents)``."""
    lines = []
    for row in rows:
        where = f" parent={row['parent_id']} depth={row['depth']}" if descendants and "parent_id" in row else ""
        if row.get("kind") == "diagnostic":
            lines.append(f"{row['id']} [diagnostic: {row['reason']}]{where}")
        else:
            lines.append(f"{row['id']} [{row['status']}]{where} — {row.get('label') or ''}")
    return "\n".join(lines) if lines else "(no subagents)"
