"""A fork copies its source's events with their ``ignorable`` mark.

Found by a probe of forks: a source whose log held an event a newer writer
marked ``ignorable`` (which this build skips) was forked without the mark, so
the fork held an event this build cannot read: the fork was a session that
``inspect`` and ``store check`` refused (``UNSUPPORTED_FORMAT``), or, since
seeds are checked, a ``start_continuable`` that failed ``INVALID_RECORD``.
"""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import check_store, create_session, inspect, new_id, read_header
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

pytestmark = pytest.mark.anyio

NEWER = {"type": "x/newer-writer", "data": {"note": "skippable"}, "ignorable": True}
TURN = [{"type": "turn/start", "data": {"message_id": "m1"}}, {"type": "turn/end", "data": {"stop_reason": "completed", "diagnostic": None}}]


async def test_a_fork_of_a_log_with_an_ignorable_event_keeps_the_mark_and_runs(tmp_path) -> None:
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        root_id = new_id()
        create_session(sup.store, root_id, seed=[NEWER, *TURN])  # a root a newer writer left
        sup.register_provider(Provider(name="fork", program="script", capabilities=Capabilities.all(), continuable=True,
                                       inherits_parent_context=True))
        root = await sup.open_root(id=root_id)
        child_id, _ = await sup.start_continuable(
            ContinuableSpec(parent=root, provider="fork", label="forked", prompt=json.dumps({"script": [{"return": "done"}]}))
        )
        with anyio.fail_after(20):
            while not any(e["type"] == "turn/end" for e in inspect(sup.store, child_id).events[3:]):
                await anyio.sleep(0.02)
        events = inspect(sup.store, child_id).events
        assert read_header(sup.store, child_id).seed_length == 3
        assert events[0]["type"] == NEWER["type"] and events[0].get("ignorable") is True
        assert events[-1]["type"] == "turn/end" and events[-1]["data"]["stop_reason"] == "completed", events[-1]
    assert not check_store(tmp_path / "st").violations
