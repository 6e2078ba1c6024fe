"""``Supervisor.resume_pending``: the messages a closed or crashed host left waiting run when a restarted host asks.

Closing a supervisor leaves the pending messages of the children it hosted
in their durable mailboxes ("delivered on the next activation"), and a host
killed mid-turn leaves its child's queued follow-ups the same way. Nothing
ran them until somebody sent that child another message (found by a probe):
a restarted host had no way to say "go on". ``resume_pending(parent)`` does.
"""

from __future__ import annotations

import anyio
import pytest

from subagents.supervisor import ContinuableSpec, InvalidRequestError, UnauthorizedError

from ..conftest import DEADLINE_S, disk_snapshot, events_of
from .test_continuable import S, continuable_supervisor, settled, turn_started

pytestmark = pytest.mark.anyio


def said(st, child_id: str) -> list[str]:
    return [e["data"]["text"] for e in events_of(st, child_id) if e["type"] == "assistant/message"]


async def test_a_restarted_host_runs_what_the_closed_one_left_pending(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as first:
        root = await first.open_root(label="host")
        child, _ = await first.start_continuable(ContinuableSpec(parent=root, provider="script", label="w",
                                                                 prompt=S({"sleep": 60000}, {"return": "never"})))
        idle, _ = await first.start_continuable(ContinuableSpec(parent=root, provider="script", label="idle", prompt=S({"return": "idle"})))
        await settled(first, root, idle)
        await turn_started(first, child)
        for n in (2, 3):
            await first.followup(root, child, S({"return": f"m{n}"}))
        root_id = root.id
    # closed mid-turn: the turn ended aborted, m2 and m3 wait in the child's mailbox
    async with continuable_supervisor(tmp_path) as second:
        root = await second.open_root(id=root_id)
        await second.take_messages(root)  # the notice of the turn the close stopped
        with anyio.fail_after(DEADLINE_S):
            resumed = await second.resume_pending(root)
        assert resumed == [child]  # the idle child has nothing waiting: left alone
        await settled(second, root, child)
        assert said(second.store, child) == ["m2", "m3"]
        assert await second.resume_pending(root) == []  # nothing left: nothing resumed twice


async def test_resume_pending_refuses_what_is_not_its_own_root_and_touches_nothing(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        with pytest.raises(UnauthorizedError):
            await sup.resume_pending("01NOSUCHROOT00000000000000")
        with pytest.raises(InvalidRequestError):
            await sup.resume_pending(5)  # type: ignore[arg-type]
        assert disk_snapshot(sup.store) == before
        assert await sup.resume_pending(root) == []


CRASHING_HOST = """
import json, sys, anyio
from subagents.supervisor import *

async def main(store):
    async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="batched")) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="host")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", label="w",
                                                               prompt=json.dumps({"script": [{"say": "up"}, {"sleep": 60000}]})))
        for n in (2, 3):
            await sup.followup(root, child, json.dumps({"script": [{"return": f"m{n}"}]}))
        while not any(e["type"] == "assistant/message" for e in __import__("subagents.store", fromlist=["inspect"]).inspect(sup.store, child).events):
            await anyio.sleep(0.01)
        print(json.dumps({"root": root.id, "child": child}), flush=True)
        await anyio.sleep(3600)

anyio.run(main, sys.argv[1])
"""


async def test_a_host_killed_mid_turn_leaves_its_follow_ups_to_the_next(tmp_path) -> None:
    """kill -9 of the host: the next host repairs the open turn (``interrupted``) and runs m2 and m3 once, in order."""
    import json
    import subprocess
    import sys

    from .test_cli_control import REPO, cli_env

    proc = subprocess.Popen([sys.executable, "-c", CRASHING_HOST, str(tmp_path / "store")], stdout=subprocess.PIPE, text=True,
                            env=cli_env(), cwd=REPO)
    try:
        ids = json.loads(proc.stdout.readline() or "null")  # type: ignore[union-attr]
        assert ids, "the host did not start"
    finally:
        proc.kill()
        proc.communicate(timeout=DEADLINE_S)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(id=ids["root"])
        with anyio.fail_after(DEADLINE_S):
            assert await sup.resume_pending(root) == [ids["child"]]
        await settled(sup, root, ids["child"])
        assert said(sup.store, ids["child"]) == ["up", "m2", "m3"]
        ends = [e["data"]["stop_reason"] for e in events_of(sup.store, ids["child"]) if e["type"] == "turn/end"]
        assert ends == ["interrupted", "completed", "completed"]
