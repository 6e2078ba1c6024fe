"""``tree`` never draws a session under one that is not its parent.

Found by a corruption probe: the text tree indented each row by its depth alone, so a row whose parent
has no row of its own (the parent's session file is gone, or a filter dropped it: ``--label``) was drawn
under the sibling listed before: a grandchild shown as the child of a session it has nothing to do
with. ``tree --json`` had it right. Such a row now names its parent.
"""

from __future__ import annotations

import json
import os

import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig

from .test_cli_control import ok

pytestmark = pytest.mark.anyio


async def _store(path: str) -> dict[str, str]:
    """A root with two children, ``c1`` and ``k1``, and ``g1`` under ``k1``."""
    async with Supervisor.open(store=path, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="e", program="echo", capabilities=Capabilities.all()))
        root = await sup.open_root(label="A")
        ids = {"A": root.id}
        for label, parent in (("c1", "A"), ("k1", "A"), ("g1", "k1")):
            run = await sup.start("e", SubagentRequest(parent=ids[parent], prompt="hi", label=label))
            await run.result()
            await run.dispose()
            ids[label] = run.id
        return ids


def _line(tree: list[str], label: str) -> str:
    return next(line for line in tree if line.split(" — ")[-1].split(" (")[0] == label)


def _drawn_under(tree: list[str], label: str) -> str | None:
    """The label of the row nearest above ``label``'s with less indentation: the parent a reader sees."""
    at = tree.index(_line(tree, label))
    depth = len(tree[at]) - len(tree[at].lstrip())
    for line in reversed(tree[:at]):
        if len(line) - len(line.lstrip()) < depth:
            return line.split(" — ")[-1].split(" (")[0]
    return None


def _named_parent(line: str) -> str | None:
    """The id (a prefix) a row names as its parent: ``(child of <id>)``."""
    return line.split("(child of ", 1)[1].split(")")[0] if "(child of " in line else None


@pytest.mark.parametrize("how", ["parent file gone", "parent filtered out"])
async def test_a_row_whose_parent_has_no_row_names_its_parent(tmp_path, how: str) -> None:
    where = str(tmp_path / "st")
    ids = await _store(where)
    args = ["tree", ids["A"]]
    if how == "parent file gone":
        os.unlink(os.path.join(where, "sessions", ids["k1"]))
    else:
        args += ["--label", "[cg]*"]
    tree = ok(where, *args).splitlines()
    assert _drawn_under(tree, "g1") == "c1", tree  # indented under the row above it, which is not its parent:
    named = _named_parent(_line(tree, "g1"))
    assert named is not None and ids["k1"].startswith(named), tree  # so it says whose child it is
    assert [row["parent_id"] for row in json.loads(ok(where, *args, "--json")) if row["id"] == ids["g1"]] == [ids["k1"]]


async def test_rows_under_their_own_parent_name_none(tmp_path) -> None:
    where = str(tmp_path / "st")
    ids = await _store(where)
    tree = ok(where, "tree", ids["A"]).splitlines()
    assert not [line for line in tree if "(child of" in line], tree
    assert _drawn_under(tree, "g1") == "k1" and _drawn_under(tree, "c1") == "A"
