"""Plain-text tables of the listings: aligned columns, short ids, relative times.

``ls`` (a parent's children, or the top-level sessions) prints one header row
then one row per session; ``tree`` prints one indented line per session.
Ids are shown as their shortest unique prefix (``store.short_ids``; every verb
takes one back) and times as "3 min ago"; ``--json`` has the whole ids and
ISO 8601 times. The label and the outcome are never cut: on a narrow
terminal a row wraps rather than hide them; a column is padded to at most
``PAD_AT_MOST`` characters, so one long label widens its own row only.
Called by ``render`` only.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Mapping, Sequence

__all__ = ["relative", "iso", "aligned", "children_table", "roots_table", "tree_line", "state", "visible"]

# C0 and C1 controls, line and paragraph separators, and the marks that reorder bidirectional text
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def visible(text: str) -> str:
    """``text`` as one line that prints as it reads: a control character (a newline, an escape
    sequence that would recolour the terminal or move its cursor) or a mark that reorders the text
    after it becomes its escape (``\\n``, ``\\x1b``, ``\\u202e``). Labels are free text, often
    a model's words: a row of a table, a tree or ``top`` must stay one row, and show what is stored.
    ``--json`` prints them as they are."""
    return _INVISIBLE.sub(_escape, text)


def relative(ts: float | None, now: float) -> str:
    """``12 s ago``, ``3 min ago``, ``5 h ago``, ``4 d ago``; ``-`` for no time. A time ahead of this clock
    (written on a host whose clock runs ahead) says how far: ``3 min ahead``, not ``just now``."""
    if ts is None:
        return "-"
    age = now - ts
    if abs(age) < 1:
        return "just now"
    when = "ago" if age > 0 else "ahead"
    age = abs(age)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if age >= size:
            return f"{int(age // size)} {unit} {when}"
    return f"{int(age)} s {when}"


def iso(ts: float | None) -> str | None:
    """ISO 8601 in UTC with milliseconds (``2026-11-30T17:02:09.123Z``), what ``--json`` prints."""
    if ts is None:
        return None
    moment = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


# keys whose numbers are moments (seconds since the epoch), in every document ``--json`` prints
MOMENT_KEYS = frozenset({"created_at", "active_since", "active_through", "pending_since", "acquired_at", "started_at",
                         "heartbeat_at", "checked_at", "ts", "last_active", "cutoff"})
# what a record or a message carries of its own (an event's data, a message's content, a result): as written
PAYLOAD_KEYS = frozenset({"data", "content", "result", "output", "structured", "descriptor"})


def iso_moments(doc: Any) -> Any:
    """``doc`` with every moment in ISO 8601, so each ``--json`` document gives its times one way (durations,
    ``settled_ms`` or ``ttl``, stay numbers). A moment the platform cannot convert (``1e20``, a record no
    writer made) stays the number it is."""
    if isinstance(doc, list):
        return [iso_moments(item) for item in doc]
    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key in PAYLOAD_KEYS:
            out[key] = value
        elif key in MOMENT_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                out[key] = iso(value)
            except (OverflowError, ValueError, OSError):
                out[key] = value
        else:
            out[key] = iso_moments(value)
    return out


# the most a column is padded to: a longer cell (a label of a model's words, whole) runs over its column, and
# the rows beside it stay as wide as their own cells (one label of 100,000 characters padded every row to it)
PAD_AT_MOST = 60


def aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    table = [list(header), *(list(r) for r in rows)]
    widths = [min(max(len(line[i]) for line in table), PAD_AT_MOST) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]


def state(row: Mapping[str, Any]) -> str:
    """The outcome cell: the outcome, ``-`` when none yet."""
    return row.get("outcome") or "-"


def _error(row: Mapping[str, Any]) -> str:
    return visible(row.get("error") or "")


def _label(row: Mapping[str, Any], none: str = "") -> str:
    return visible(row["label"]) if row.get("label") else none


def children_table(rows: Sequence[Mapping[str, Any]], shorts: Mapping[str, str], now: float) -> list[str]:
    """A parent's children: id, status, outcome, mode, created, label, error (its first line); and NODE,
    where a running child's turn runs, when one of them has a turn running."""
    if not rows:
        return ["(no subagents)"]
    nodes = any(row.get("node") for row in rows)
    cells = []
    for row in rows:
        short = shorts.get(row["id"], row["id"])
        if row.get("kind") == "diagnostic":
            cells.append([short, "diagnostic", row["reason"], "", "", "", ""] + ([""] if nodes else []))
        else:
            cells.append([short, row["status"], state(row), row["mode"], relative(row.get("created_at"), now)]
                         + ([row.get("node") or ""] if nodes else []) + [_label(row), _error(row)])
    header = ("ID", "STATUS", "OUTCOME", "MODE", "CREATED") + (("NODE",) if nodes else ()) + ("LABEL", "ERROR")
    return aligned(header, cells)


def roots_table(rows: Sequence[Mapping[str, Any]], shorts: Mapping[str, str], now: float) -> list[str]:
    """Top-level sessions: id, status, outcome, children, created, label; a root whose files no longer
    read is a diagnostic row, as a child is (``children_table``)."""
    if not rows:
        return ["(no sessions)"]
    cells = [[shorts.get(r["id"], r["id"]), "diagnostic", r["reason"], "", "", ""] if r.get("kind") == "diagnostic" else
             [shorts.get(r["id"], r["id"]), r["status"], state(r), str(r["children"]), relative(r.get("created_at"), now),
              _label(r)] for r in rows]
    return aligned(("ID", "STATUS", "OUTCOME", "CHILDREN", "CREATED", "LABEL"), cells)


def tree_line(row: Mapping[str, Any], short: str) -> str:
    """``<id> [<status>, <outcome>] — <label>`` (no dash without a label) and `` (<error>)`` for a failure."""
    if row.get("kind") == "diagnostic":
        return f"{short} [diagnostic: {row['reason']}]"
    label = f" — {_label(row)}" if row.get("label") else ""
    error = f" ({_error(row)})" if row.get("error") else ""
    return f"{short} [{row['status']}, {state(row)}]{label}{error}"


def tree_lines(rows: Sequence[Mapping[str, Any]], root: str, shorts: Mapping[str, str]) -> list[str]:
    """Each row of a tree under ``root`` indented by its depth (two spaces a level), as ``tree_line``s.

    A row is drawn under the nearest row above it with less indentation. When that is not its parent
    (its parent has no row: its session file is gone, or a filter dropped it), the row says
    `` (child of <parent>)``: drawn bare, it read as a child of whatever sibling was listed before."""
    lines: list[str] = []
    above: dict[int, str] = {0: root}  # the id drawn last at each depth
    for row in rows:
        depth = row["depth"]
        line = "  " * depth + tree_line(row, shorts.get(row["id"], row["id"]))
        parent = row.get("parent_id")
        if parent is not None and above.get(depth - 1) != parent:
            line += f" (child of {shorts.get(parent, parent)})"
        above = {level: drawn for level, drawn in above.items() if level < depth}
        above[depth] = row["id"]
        lines.append(line)
    return lines
