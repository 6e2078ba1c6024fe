"""``subagents top``: the held sessions as aligned columns, once or refreshing.

``render_top`` prints one snapshot; ``TopView`` refreshes it (a rich Live
table on a terminal, else a time line and the plain table per refresh, or
one compact JSON list per refresh under ``--json``). Rows are the plain dicts
of ``subagents.store.HeldSession``.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Mapping, Sequence

from .columns import iso_moments, visible
from .node_state import node_text
from .render import Output, fmt_time, status_style, to_json
from .whole_writes import whole_writer

__all__ = ["render_top", "TopView", "COLUMNS_HELP"]

# -- top ------------------------------------------------------------------------------------

# ids are short unique prefixes (accepted back by every verb), so the label keeps its room;
# what gives way on a narrow terminal is the owner on the right
_TOP_COLUMNS = ("id", "status", "last", "mode", "label", "busy", "turn", "node", "epoch", "pid", "parent", "owner")

COLUMNS_HELP = """columns:
  id      the session id's shortest unique prefix (every verb takes it back)
  status  running (a turn runs or is queued) or idle (waiting on its own children)
  last    the outcome of its last finished turn (completed, error, ...; - : none yet)
  mode    one-shot, continuable, root (top-level) or - (a plain fork)
  busy    time spent in its finished turns
  turn    how long the open turn has been running (- : no turn open)
  node    where the open turn runs: the worker's host:pid (local pool), the Ray node ip/id:pid;
          (stopped): that local worker is stopped (SIGSTOP, Ctrl-Z), its turn stalls until it is continued
  epoch   the lease epoch (grows by one each time a supervisor takes the session)
  pid     the process of the supervisor holding it; owner: that supervisor's id"""


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 60 else f"{int(value // 60)}m{int(value % 60):02d}s"


def _top_cells(row: dict[str, Any], now: float, shorts: Mapping[str, str]) -> tuple[str, ...]:
    busy = _seconds(row["settled_ms"] / 1000.0)
    turn = _seconds(max(0.0, now - row["active_since"])) if row.get("active_since") is not None else "-"
    pid = str(row["owner_pid"]) if row.get("owner_pid") is not None else "-"
    parent = row.get("parent")
    return (shorts.get(row["id"], row["id"]), row["status"], row.get("outcome") or "-", row["mode"], visible(row.get("label") or "-"),
            busy, turn, node_text(row.get("node"), long=False) or "-", str(row["epoch"]), pid, shorts.get(parent, parent) if parent else "-", row["owner"])


def _top_plain(rows: Sequence[dict[str, Any]], now: float, shorts: Mapping[str, str]) -> list[str]:
    if not rows:
        return ["(no running or idle sessions)"]
    table = [_TOP_COLUMNS, *(_top_cells(r, now, shorts) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_TOP_COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]


def _top_table(rows: Sequence[dict[str, Any]], now: float, shorts: Mapping[str, str]) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold",
                  caption=f"{len(rows)} sessions held, {fmt_time(now, date=False)} (columns: subagents top --help)")
    cells_by_row = [_top_cells(row, now, shorts) for row in rows]
    for i, column in enumerate(_TOP_COLUMNS):
        widest = max([len(column), *(len(cells[i]) for cells in cells_by_row)])
        if column in ("parent", "owner"):  # on a narrow terminal these give way (`--once --json` has them whole)
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        else:  # the short id (what the other commands take), the label and the short columns are never cut
            table.add_column(column, no_wrap=True, min_width=widest)
    for row, plain in zip(rows, cells_by_row):
        cells = [escape(c) for c in plain]
        style = status_style(row["status"])
        cells[1] = f"[{style}]{cells[1]}[/]" if style else cells[1]
        table.add_row(*cells)
    return table


def render_top(out: Output, rows: Sequence[dict[str, Any]], shorts: Mapping[str, str] | None = None) -> None:
    """One snapshot: aligned columns (``COLUMNS_HELP`` says what each one means)."""
    now = time.time()
    if out.rich:
        out.console.print(_top_table(rows, now, shorts or {}))
        return
    for line in _top_plain(rows, now, shorts or {}):
        out.line(line)


class TopView:
    """``top`` refreshing: a rich Live table on a terminal, else a snapshot per refresh
    (plain text under a time line, or one compact JSON list per line under ``--json``).
    Each refresh off a terminal goes out in one write a stop signal never cuts (``whole_writes``):
    one that landed while a refresh larger than a pipe's buffer was blocked (a reader that lags)
    ended ``top`` with its last line cut, a JSON list or a row of the table only part there."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self._live: Any = None
        self._write = whole_writer(out.stream)

    def __enter__(self) -> "TopView":
        if self.out.rich:
            from rich.live import Live

            self._live = Live(_top_table([], time.time(), {}), console=self.out.console, auto_refresh=False)
            self._live.__enter__()
        return self

    def update(self, rows: Sequence[dict[str, Any]], now: float, shorts: Mapping[str, str] | None = None) -> None:
        if self._live is not None:
            self._live.update(_top_table(rows, now, shorts or {}), refresh=True)
        elif self.out.json_mode:
            self._write(to_json(iso_moments(list(rows)), compact=True) + "\n")
        else:
            self._write("\n".join([f"-- {fmt_time(now)}: {len(rows)} sessions held", *_top_plain(rows, now, shorts or {})]) + "\n")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
