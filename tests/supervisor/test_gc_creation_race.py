"""A one-shot ``start`` under a parent no live agent holds races ``gc`` safely (found by a probe).

``start`` takes any parent session the store holds, without opening it. A gc collecting that
parent's subtree re-read its children index under the parent's lock, and a child published and
indexed outside that lock could fall between the re-read and the rename: the parent went, the child
stayed, listed nowhere and never collected (9 and 10 orphans in two runs of the probe's loop). The
child is now created under the parent's lock: here gc holds it (a descriptor of the test), moves the
parent away, and the waiting ``start`` is refused ``NO_PARENT`` with nothing written.
"""

from __future__ import annotations

import fcntl
import os

import anyio
import pytest

from subagents.store import SubagentError, create_session
from subagents.supervisor import SubagentRequest

from ..conftest import DEADLINE_S, open_supervisor
from ..store.test_retention import opened_elsewhere, to_trash

pytestmark = pytest.mark.anyio


async def test_a_start_under_a_parent_gc_removes_meanwhile_is_refused(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        create_session(sup.store, "rOld", label="old")  # a root no supervisor holds
        before = set(os.listdir(sup.store.sessions_dir))
        holder = os.open(sup.store.session_path("rOld"), os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)
        refused: list[BaseException] = []

        async def start() -> None:
            try:
                await sup.start("echo", SubagentRequest(parent="rOld", prompt="hi"))
            except SubagentError as exc:
                refused.append(exc)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                with anyio.fail_after(DEADLINE_S):
                    while not opened_elsewhere(sup.store.session_path("rOld"), holder):
                        await anyio.sleep(0.005)
                to_trash(sup.store, "rOld")
                os.close(holder)
                holder = -1
        finally:
            if holder >= 0:
                os.close(holder)
        assert [e.code for e in refused] == ["NO_PARENT"], refused
        assert set(os.listdir(sup.store.sessions_dir)) == before - {"rOld"}  # no child left behind


async def test_a_start_under_a_settled_root_runs(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        create_session(sup.store, "rOld", label="old")
        run = await sup.start("echo", SubagentRequest(parent="rOld", prompt="hi"))
        with anyio.fail_after(DEADLINE_S):
            assert (await run.result()).output == "hi"
        await run.dispose()
        assert [c.id for c in await sup.list_children("rOld")] == [run.id]
