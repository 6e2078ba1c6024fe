"""A start cancelled by the caller's cancel scope while the child is being made leaves no child the caller
cannot name: a one-shot child made meanwhile is deleted before the cancellation goes on (it never ran), and a
continuable child made meanwhile is returned, its ids in hand, the cancellation raised at the caller's next
await. (Checked by the edge probes with a sweep of deadlines around both calls: every child in the store was one
the caller was given, and the store checked clean.) A native cancellation (a Ctrl-C through ``asyncio.run``)
is ``tests/supervisor/test_host_ctrl_c.py``'s.
"""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import check_store
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, SubagentRequest

from ..conftest import DEADLINE_S, open_supervisor

pytestmark = pytest.mark.anyio


async def test_a_continuable_start_cancelled_once_its_child_is_made_returns_the_ids(tmp_path) -> None:
    """The scope is cancelled from inside the acceptance (a setup contribution, run once the child and its
    prompt are stored): the call still returns both ids, the scope catches the cancellation after it, and
    the child runs its prompt and settles."""
    async with open_supervisor(tmp_path, providers=False) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        scope = anyio.CancelScope()
        sup.register_continuable_setup(lambda info: scope.cancel())
        ids: tuple[str, str] | None = None
        with scope:
            ids = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", label="w",
                                                              prompt=json.dumps({"script": [{"return": "done"}]})))
            await anyio.sleep(0)
        assert scope.cancelled_caught and ids is not None
        child_id, _ = ids
        with anyio.fail_after(DEADLINE_S):
            while True:
                notices = await sup.wait_for_message(root, timeout_s=DEADLINE_S)
                if any(m.source.get("sender_session_id") == child_id for m in notices):
                    break
        [child] = await sup.list_children(root)
        assert (child.id, child.status) == (child_id, "complete"), child


async def test_one_shot_starts_cut_by_deadlines_leave_only_the_children_returned(tmp_path) -> None:
    """Starts under deadlines of 0 to 10 ms: each returns a run or is cancelled, and the store holds exactly the
    children returned (those made and then cancelled were deleted), and checks clean."""
    returned: list[str] = []
    cancelled = 0
    async with open_supervisor(tmp_path, durability="batched") as sup:
        root = await sup.open_root()
        for i in range(40):
            run = None
            with anyio.move_on_after((i % 20) * 0.0005):
                run = await sup.start("echo", SubagentRequest(parent=root, prompt="p"))
            if run is None:
                cancelled += 1
                continue
            returned.append(run.id)
            with anyio.fail_after(DEADLINE_S):
                await run.result()
            await run.dispose()
        assert sorted(c.id for c in await sup.list_children(root)) == sorted(returned)
        assert cancelled > 0
    report = check_store(tmp_path / "store")
    assert report.clean, report.violations
