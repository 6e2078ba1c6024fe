"""``subagents top``: the held sessions as aligned columns, once or refreshing.

``render_top`` prints one snapshot; ``TopView`` refreshes it (a rich Live
table on a terminal, else a time line and the plain table per refresh, or
one compact JSON list per refresh under ``--json``). Rows are the plain dicts
of ``subagents.store.HeldSession``.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Sequence

from .render import Output, fmt_time, status_style

__all__ = ["render_top", "TopView"]

# -- top ------------------------------------------------------------------------------------

# the short columns first: on a narrow terminal what gives way is the long ids on the right
_TOP_COLUMNS = ("id", "status", "mode", "label", "epoch", "settled", "pid", "parent", "owner")


def _top_cells(row: dict[str, Any], now: float) -> tuple[str, ...]:
    settled = f"{row['settled_ms'] / 1000.0:.1f}s"
    if row.get("active_since") is not None:
        settled += f" +{max(0.0, now - row['active_since']):.1f}s"
    pid = str(row["owner_pid"]) if row.get("owner_pid") is not None else "-"
    return (row["id"], row["status"], row["mode"], row.get("label") or "-", str(row["epoch"]), settled, pid, row.get("parent") or "-", row["owner"])


def _top_plain(rows: Sequence[dict[str, Any]], now: float) -> list[str]:
    if not rows:
        return ["(no running or idle sessions)"]
    table = [_TOP_COLUMNS, *(_top_cells(r, now) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_TOP_COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]


def _top_table(rows: Sequence[dict[str, Any]], now: float) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold", caption=f"{len(rows)} sessions held, {fmt_time(now, date=False)}")
    cells_by_row = [_top_cells(row, now) for row in rows]
    for i, column in enumerate(_TOP_COLUMNS):
        widest = max([len(column), *(len(cells[i]) for cells in cells_by_row)])
        if column in ("label", "parent", "owner"):  # on a narrow terminal these give way (`--once --json` has them whole)
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        else:  # the id (what the other commands take) and the short columns are never cut
            table.add_column(column, no_wrap=True, min_width=widest)
    for row, plain in zip(rows, cells_by_row):
        cells = [escape(c) for c in plain]
        style = status_style(row["status"])
        cells[1] = f"[{style}]{cells[1]}[/]" if style else cells[1]
        table.add_row(*cells)
    return table


def render_top(out: Output, rows: Sequence[dict[str, Any]]) -> None:
    """One snapshot: aligned columns (``settled`` is settled time, ``+N s`` the open turn)."""
    now = time.time()
    if out.rich:
        out.console.print(_top_table(rows, now))
        return
    for line in _top_plain(rows, now):
        out.line(line)


class TopView:
    """``top`` refreshing: a rich Live table on a terminal, else a snapshot per refresh
    (plain text under a time line, or one compact JSON list per line under ``--json``)."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self._live: Any = None

    def __enter__(self) -> "TopView":
        if self.out.rich:
            from rich.live import Live

            self._live = Live(_top_table([], time.time()), console=self.out.console, auto_refresh=False)
            self._live.__enter__()
        return self

    def update(self, rows: Sequence[dict[str, Any]], now: float) -> None:
        if self._live is not None:
            self._live.update(_top_table(rows, now), refresh=True)
        elif self.out.json_mode:
            self.out.json(list(rows), compact=True)
        else:
            self.out.line(f"-- {fmt_time(now)}: {len(rows)} sessions held")
            for line in _top_plain(rows, now):
                self.out.line(line)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
