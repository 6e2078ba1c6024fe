"""fsck reads a settled child's log against its settled row, as ``show`` and listings do (found by a probe).

The row's ``end`` says where the child's committed records end. A last ``turn/end`` cut short (or
changed in place) reads like a torn tail on its own: fsck called it torn, and ``fsck --repair`` cut it
and closed the turn as interrupted, turning a child that completed into a crash.
"""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store.fsck import fsck
from subagents.supervisor import SubagentRequest

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


async def test_fsck_repair_leaves_a_settled_childs_cut_turn_end_alone(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="done"))
        assert (await run.result()).output == "done"
        await run.dispose()
    path = os.path.join(tmp_path, "store", "sessions", run.id)
    with open(path, "rb") as handle:
        data = handle.read().rstrip(b"\0")
    with open(path, "r+b") as handle:
        handle.truncate(len(data) - 20)  # the last 20 bytes of its turn/end
    with open(path, "rb") as handle:
        damaged = handle.read()
    st = store.Store(str(tmp_path / "store"), create=False)
    report = fsck(st, repair=True, lease_ttl_s=5.0)
    assert run.id in report["corrupt"] and run.id not in report["torn"], report["findings"]
    [finding] = [f for f in report["findings"] if f["id"] == run.id]
    assert "repair" not in finding
    with open(path, "rb") as handle:
        assert handle.read() == damaged
