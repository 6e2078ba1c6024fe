"""What a table's cells show when a session's fields are unusual (found by a probe).

One very long label widens its own row only: ``ls`` of a parent with a child labelled with 100,000
characters printed about 200 KB, every row padded out to that label's width before its ERROR cell,
and the header too. A label is never cut in a table (a row wraps rather than hide it), but a column
is padded to at most ``columns.PAD_AT_MOST`` characters: a longer cell runs over its column, and the
rows beside it stay as wide as their own cells.

A time ahead of this host's clock (a session another host wrote, its clock ahead) says how far ahead,
not "just now".
"""

from __future__ import annotations

import time

from subagents.supervisor.cli import columns


def _row(session_id: str, label: str, error: str | None = None) -> dict:
    return {"id": session_id, "status": "complete", "outcome": "error" if error else "completed", "mode": "one-shot",
            "created_at": time.time(), "label": label, "error": error}


def test_a_very_long_label_widens_its_own_row_only() -> None:
    long = "x" * 100_000
    rows = [_row("01A", "short", "E: first"), _row("01B", long, "E: second"), _row("01C", "also short", "E: third")]
    lines = columns.children_table(rows, {}, time.time())
    header, first, second, third = lines
    assert long in second and second.endswith("E: second")  # whole: never cut
    assert max(len(header), len(first), len(third)) < 200, (len(header), len(first), len(third))
    # the columns before the label still line up, and the short rows' ERROR cells line up with each other
    assert first.index("short") == header.index("LABEL") == third.index("also short") == second.index(long)
    assert first.index("E: first") == third.index("E: third") == header.index("ERROR")


def test_labels_within_the_pad_still_align_every_column() -> None:
    rows = [_row("01A", "a" * 30, "E: one"), _row("01B", "b", "E: two")]
    header, first, second = columns.children_table(rows, {}, time.time())
    assert first.index("E: one") == second.index("E: two") == header.index("ERROR")


def test_a_time_ahead_of_this_clock_says_so() -> None:
    """Found by a probe: a session created on a host whose clock runs ahead read "just now" until this
    clock caught up, however far ahead it was; it says how far ahead instead."""
    now = 1_000_000.0
    assert columns.relative(now - 0.5, now) == "just now"
    assert columns.relative(now + 0.5, now) == "just now"  # within a second either way: the same moment
    assert columns.relative(now + 90, now) == "1 min ahead"
    assert columns.relative(now + 3 * 3600, now) == "3 h ahead"
    assert columns.relative(now - 90, now) == "1 min ago"
