"""A one-shot child costs its store one new file (its session file) and frees none."""

from __future__ import annotations

import os

import pytest

from subagents.supervisor import SubagentRequest

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


def files_under(folder: str) -> set[tuple[int, str]]:
    """Every file and folder below ``folder`` as (inode, relative path)."""
    found: set[tuple[int, str]] = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            found.add((os.lstat(path).st_ino, os.path.relpath(path, folder)))
    return found


async def test_a_roots_first_child_adds_only_its_session_file(tmp_path):
    """The root's children index exists from the root's creation: its first child, like every later
    one, adds its session file and nothing else, and no file is removed (a removed inode is one a
    later creation on ext4 pays to skip)."""
    async with open_supervisor(tmp_path, pool_size=1, durability="batched") as sup:
        root = await sup.open_root(label="one-inode")
        store_dir = str(tmp_path / "store")
        for _ in range(3):
            before = files_under(store_dir)
            run = await sup.start("echo", SubagentRequest(parent=root, prompt="hello"))
            assert (await run.result()).output == "hello"
            await run.dispose()
            after = files_under(store_dir)
            assert before - after == set()
            assert {path for _, path in after - before} == {os.path.join("sessions", run.id)}
