"""A tree of children deeper than Python's recursion limit is stopped, disposed and closed like a shallow one.

Found by a probe: a program that delegated to itself reached 739 levels in 3 s, and the supervisor's
close then hit the recursion limit in ``dispose`` → ``dispose_children`` → ``dispose`` (one frame
chain per level) and in the cancellation cascade, and never finished. The reference walks a
10,000-deep chain in its listings; stopping one must work as well.
"""

from __future__ import annotations

import sys

import anyio
import pytest

from subagents.store import Store, list_descendants
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, SubagentRequest, Supervisor, SupervisorConfig

from ..conftest import helper, open_supervisor, wait_until

pytestmark = pytest.mark.anyio

# past the recursion limit whatever frames each level of a recursive walk takes
LEVELS = sys.getrecursionlimit() + 100


def _descends(name: str, *, continuable: bool = False) -> Provider:
    return Provider(name=name, program=helper(name.replace("-", "_")), capabilities=Capabilities.all(), continuable=continuable)


async def test_a_one_shot_chain_deeper_than_the_recursion_limit_is_cancelled_and_disposed(tmp_path) -> None:
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(_descends("descends"))
        root = await sup.open_root()
        run = await sup.start("descends", SubagentRequest(parent=root, prompt=str(LEVELS), label="top"))
        await wait_until(lambda: sup.statistics().runs_live == LEVELS + 1, timeout=120, what="the whole chain running")
        with anyio.fail_after(120):
            run.cancel("user")
            await run.dispose()
        assert (await run.result()).stop_reason == "aborted"
        assert sup.statistics().runs_live == 0
        rows = await sup.list_descendants(root.id)
        assert len(rows) == LEVELS + 1
        assert {(row.entry.status, row.entry.outcome) for row in rows} == {("complete", "aborted")}


@pytest.mark.parametrize(("stop", "outcome"), [("close", "aborted"), ("drain", "drained")])
async def test_a_continuable_chain_deeper_than_the_recursion_limit_is_drained_and_closed(tmp_path, stop: str, outcome: str) -> None:
    # every level's turn in flight at once, in one worker: the whole chain is live when it is stopped
    config = SupervisorConfig(pool_size=1, durability="none", turns_per_worker=LEVELS + 10)
    with anyio.fail_after(240):
        async with Supervisor.open(store=tmp_path / "store", config=config) as sup:
            sup.register_provider(_descends("descends-continuable", continuable=True))
            root = await sup.open_root()
            await sup.start_continuable(ContinuableSpec(parent=root, provider="descends-continuable", prompt=str(LEVELS), label="top"))
            await wait_until(lambda: sup.statistics().pool.resident == LEVELS + 1, timeout=120, what="every level's turn in flight")
            if stop == "drain":
                await sup.drain([root])
                assert sup.statistics().pool.resident == 0
    rows = list_descendants(Store(tmp_path / "store", create=False), root.id)
    assert len(rows) == LEVELS + 1
    assert {(row.entry.status, row.entry.outcome) for row in rows} == {("complete", outcome)}
