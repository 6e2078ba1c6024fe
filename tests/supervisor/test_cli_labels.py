"""Labels are free text (often a model's words): the CLI prints each row of a listing as one row.

Found by a probe: a label holding a newline split its row of ``ls`` and ``tree`` in two, an escape
sequence (``ESC [31m``) recoloured the user's terminal, and a right-to-left override reordered the
rest of the line. Tables, trees, ``show`` and ``top`` print such characters as escapes
(``\\n``, ``\\x1b``, ``\\u202e``); ``--json`` keeps the label as stored.
"""

from __future__ import annotations

import json

import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig

from .test_cli_control import ok

pytestmark = pytest.mark.anyio

ROOT_LABEL = "root\nsecond line\x1b[31mred"
LABELS = ["a\nb", "nul\x00x", "tab\there", "\u202eevil", "plain é 中"]
SHOWN = ["a\\nb", "nul\\x00x", "tab\\there", "\\u202eevil", "plain é 中"]


async def _store(path: str) -> tuple[str, list[str]]:
    async with Supervisor.open(store=path, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="e", program="echo", capabilities=Capabilities.all()))
        root = await sup.open_root(label=ROOT_LABEL)
        ids = []
        for label in LABELS:
            run = await sup.start("e", SubagentRequest(parent=root, prompt="hi", label=label))
            await run.result()
            await run.dispose()
            ids.append(run.id)
        return root.id, ids


async def test_listings_print_one_row_per_session_whatever_its_label(tmp_path) -> None:
    where = str(tmp_path / "st")
    root, ids = await _store(where)
    table = ok(where, "ls", root).splitlines()
    assert len(table) == 1 + len(LABELS), table
    for line, shown in zip(table[1:], SHOWN):
        assert line.rstrip().endswith(shown), (line, shown)
    roots = ok(where, "ls").splitlines()
    assert len(roots) == 2 and roots[1].rstrip().endswith("root\\nsecond line\\x1b[31mred"), roots
    tree = ok(where, "tree", root).splitlines()
    assert len(tree) == 1 + len(LABELS), tree
    assert tree[0].endswith("— root\\nsecond line\\x1b[31mred"), tree[0]
    assert [line.split(" — ", 1)[1] for line in tree[1:]] == SHOWN
    show = ok(where, "show", ids[0])
    assert "a\\nb" in show and "a\nb" not in show
    assert [row["label"] for row in json.loads(ok(where, "ls", root, "--json"))] == LABELS  # as stored
