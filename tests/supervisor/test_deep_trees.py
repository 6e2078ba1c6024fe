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

from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import helper, open_supervisor, wait_until

pytestmark = pytest.mark.anyio

# past the recursion limit whatever frames each level of a recursive walk takes
LEVELS = sys.getrecursionlimit() + 100


def _descends(name: str) -> Provider:
    return Provider(name=name, program=helper(name.replace("-", "_")), capabilities=Capabilities.all())


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
