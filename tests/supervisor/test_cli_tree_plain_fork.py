"""``tree ID`` of a plain fork heads it as a fork, not as a subagent.

Found by a probe of forks: ``subagents tree`` of a session made with a
parent and no ``origin`` (a plain fork of its parent's log, which listings
walk but never list) headed it ``(subagent of PARENT)``, while ``show`` of
the same session said ``identity none (not a subagent)``. The heading now
says ``(fork of PARENT)``; a subagent's stays ``(subagent of PARENT)``.
"""

from __future__ import annotations

import pytest

from subagents.store import create_session, inspect, new_id
from subagents.supervisor import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig

from .test_cli_control import ok

pytestmark = pytest.mark.anyio


async def test_tree_heads_a_plain_fork_as_a_fork(tmp_path) -> None:
    path = str(tmp_path / "st")
    async with Supervisor.open(store=path, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="e", program="echo", capabilities=Capabilities.all()))
        root = await sup.open_root(label="A")
        run = await sup.start("e", SubagentRequest(parent=root.id, prompt="hi", label="child"))
        await run.result()
        await run.dispose()
        prefix = [{"type": e["type"], "data": e["data"], "ts": e["ts"]} for e in inspect(sup.store, run.id).events]
        fork = new_id()
        create_session(sup.store, fork, parent_session=run.id, seed=prefix)  # a plain fork: no origin
    heading = ok(path, "tree", fork).splitlines()[0]
    assert heading.startswith(f"{fork[:8]}") and f"(fork of {run.id[:8]}" in heading, heading
    assert "subagent of" not in heading, heading
    child_heading = ok(path, "tree", run.id).splitlines()[0]
    assert f"(subagent of {root.id[:8]}" in child_heading and child_heading.endswith(" — child"), child_heading
