"""The catalog calls of ``Supervisor`` take what the other calls take."""

from __future__ import annotations

import anyio
import pytest

from subagents.supervisor import SubagentRequest

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


async def test_a_listing_takes_the_agent_ref_open_root_returned(tmp_path) -> None:
    """Found by a probe: ``list_children(root)`` with the ``AgentRef`` that ``start`` and ``followup`` take was
    INVALID_SESSION_ID."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="hi"))
        with anyio.fail_after(20):
            await run.result()
        assert [c.id for c in await sup.list_children(root)] == [c.id for c in await sup.list_children(root.id)] == [run.id]
        assert [r.entry.id for r in await sup.list_descendants(root)] == [run.id]
        await run.dispose()
