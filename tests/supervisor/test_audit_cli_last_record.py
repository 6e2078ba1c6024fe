"""Audit: ``ls`` and ``show`` of a settled child whose *last* committed record was overwritten in place.

``test_cli_damaged_child.py`` covers a byte flipped in the header or in the ``assistant/message``: both give
the diagnostic. A byte flipped in the child's final ``turn/end`` — the commit point of its last turn, with
nothing after it — reads by the log's torn-tail rule as a turn torn by a crash: ``ls`` lists it ``complete``,
``crashed`` ("its host stopped mid-turn") and ``show`` prints that normal view and exits 0, though its row
(``end``) says its committed records reached past the damage.
"""

from __future__ import annotations

import json
from pathlib import Path


from subagents import store
from subagents.store.framing import FRAME

from ..session_bytes import log_start
from .test_cli import cli
from .test_cli_damaged_child import flip, settled_children


def test_show_and_ls_of_a_child_whose_last_record_is_damaged_give_its_diagnostic(tmp_path: Path) -> None:
    st = settled_children(tmp_path / "st")
    found = store.inspect(st, "b")
    assert found.events[-1]["type"] == "turn/end"
    flip(st, "b", log_start(st, "b") + found.offsets[-1] + FRAME.size + 4)

    listed = cli("--store", "st", "ls", "r", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    shown = cli("--store", "st", "show", "b", "--json", cwd=tmp_path)
    assert (rows["b"]["kind"], rows["b"].get("reason"), shown.returncode) == ("diagnostic", "corrupt", 2), (
        rows["b"], shown.returncode, shown.stdout[:300], shown.stderr)
