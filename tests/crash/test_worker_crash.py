"""Worker processes killed under their turns (real ``kill -9``).

Each cell asserts one outcome: the turn on the dead worker ends ``error``
naming the signal (``aborted`` if its cancellation was asked for), its log is
balanced by crash repair (last event ``turn/end`` with ``interrupted``),
siblings on other workers are untouched, a replacement worker starts, and the
next run works.
"""

from __future__ import annotations

import json
import os
import signal

import anyio
import pytest

from subagents.supervisor import Capabilities, ContinuableSpec, Provider, SubagentRequest

from ..conftest import DEADLINE_S, events_of, last_turn_end, open_supervisor, said, wait_until

pytestmark = pytest.mark.anyio


async def started_pid(sup, run) -> int:
    """The pid a ``pid-then-sleep`` child wrote as its first message (waits for it)."""
    texts = await wait_until(lambda: said(sup.store, run.id), what=f"child {run.id} to start")
    return int(texts[0])


def assert_repaired(st, session_id):
    events = events_of(st, session_id)
    assert events[-1]["type"] == "turn/end"
    assert events[-1]["data"]["stop_reason"] == "interrupted"
    kinds = [e["type"] for e in events]
    assert kinds.count("turn/start") == kinds.count("turn/end") == 1
    assert kinds.count("step/start") == kinds.count("step/end")


@pytest.mark.parametrize("durability", ["none", "batched"])
async def test_kill_9_mid_turn(tmp_path, durability):
    async with open_supervisor(tmp_path, pool_size=2, durability=durability) as sup:
        root = await sup.open_root()
        victim = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        sibling = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="200"))
        victim_pid, sibling_pid = await started_pid(sup, victim), await started_pid(sup, sibling)
        assert victim_pid != sibling_pid
        assert set(sup.pool.worker_pids()) == {victim_pid, sibling_pid}

        os.kill(victim_pid, signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            result = await victim.result()
            sibling_result = await sibling.result()
        assert result.stop_reason == "error"
        assert result.diagnostic == f"worker process {victim_pid} killed by signal SIGKILL"
        assert (sibling_result.stop_reason, sibling_result.output) == ("completed", "slept 200")
        assert_repaired(sup.store, victim.id)
        assert last_turn_end(sup.store, sibling.id)["stop_reason"] == "completed"

        await wait_until(lambda: sup.statistics().pool.workers_alive == 2, what="the replacement worker")
        stats = sup.statistics().pool
        assert (stats.crashed, stats.started) == (1, 3)
        assert victim_pid not in sup.pool.worker_pids()
        # the next runs work, on both workers
        runs = [await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="100")) for _ in range(2)]
        with anyio.fail_after(DEADLINE_S):
            for run in runs:
                assert (await run.result()).stop_reason == "completed"
                await run.dispose()
        await victim.dispose()
        await sibling.dispose()
        entries = {c.id: c.status for c in await sup.list_children(root.id)}
        assert entries[victim.id] == "complete"


async def test_kill_9_releases_queued_work_to_the_replacement(tmp_path):
    """With one worker: the running turn dies, the queued one runs on the replacement."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        victim = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        pid = await started_pid(sup, victim)
        queued = await sup.start("echo", SubagentRequest(parent=root, prompt="queued"))
        await wait_until(lambda: sup.statistics().pool.queued == 1, what="the second run to queue")
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            assert (await victim.result()).stop_reason == "error"
            assert (await queued.result()).output == "queued"
        assert_repaired(sup.store, victim.id)
        assert sup.pool.worker_pids() != [pid]


async def test_kill_9_of_a_worker_hosting_parent_and_child(tmp_path):
    """A parked parent and its running child share the killed worker: both end ``error``, both logs repaired."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        parent = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"spawn": {"prompt": "30000", "provider": "pid-then-sleep"}}])))

        async def child_pid():
            kids = await sup.list_children(parent.id)
            return kids and said(sup.store, kids[0].id) and int(said(sup.store, kids[0].id)[0])

        pid = await wait_until(child_pid, what="the child to start")
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            result = await parent.result()
            await parent.dispose()
        assert result.stop_reason == "error"
        assert "SIGKILL" in result.diagnostic
        [child] = await sup.list_children(parent.id)
        assert_repaired(sup.store, parent.id)
        assert_repaired(sup.store, child.id)
        assert child.status == "complete"
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="alive"))
        with anyio.fail_after(DEADLINE_S):
            assert (await run.result()).output == "alive"
        await run.dispose()


async def test_worker_exit_mid_turn(tmp_path):
    """A program that exits its process: ``error`` naming the exit code, log repaired."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"step": 1}, {"exit": 3}])))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
            await run.dispose()
        assert result.stop_reason == "error"
        assert result.diagnostic.endswith("exited with code 3")
        assert result.diagnostic.startswith("worker process ")
        assert_repaired(sup.store, run.id)
        after = await sup.start("echo", SubagentRequest(parent=root, prompt="next"))
        with anyio.fail_after(DEADLINE_S):
            assert (await after.result()).stop_reason == "completed"
        await after.dispose()


async def test_turn_ignoring_cancellation_has_its_worker_killed(tmp_path):
    """``spin`` blocks the worker's loop: past ``cancel_grace_s`` the worker is killed and the run ends ``aborted``."""
    async with open_supervisor(tmp_path, pool_size=1, cancel_grace_s=0.3) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"say": "spinning"}, {"spin": 5000}])))
        await wait_until(lambda: said(sup.store, run.id), what="the spin to start")
        [pid] = sup.pool.worker_pids()
        run.cancel()
        with anyio.fail_after(4.0):  # well under the 5 s spin: the worker was killed, not waited for
            result = await run.result()
        assert result.stop_reason == "aborted"
        assert result.diagnostic == f"the turn was cancelled (user); worker process {pid} killed by signal SIGKILL"
        assert_repaired(sup.store, run.id)
        await run.dispose()
        await wait_until(lambda: sup.statistics().pool.workers_alive == 1, what="the replacement worker")
        assert sup.statistics().pool.crashed == 1
        after = await sup.start("echo", SubagentRequest(parent=root, prompt="next"))
        with anyio.fail_after(DEADLINE_S):
            assert (await after.result()).output == "next"
        await after.dispose()


async def test_a_turn_whose_worker_died_gives_what_it_said_as_its_output(tmp_path):
    """The reply a turn logged before its worker died is its output, as a turn that fails by raising
    gives its last reply: the caller's result, ``subagent/end`` and (below) a continuable child's
    settlement notice said "no closing message" of a reply the log holds."""
    ends: list[tuple[str, str | None]] = []
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.on("subagent/end", lambda name, data: ends.append((data["stop_reason"], data["last_assistant_message"])))
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"say": "my last words"}, {"exit": 3}])))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
            await run.dispose()
        assert (result.stop_reason, result.output) == ("error", "my last words")
        assert result.diagnostic.endswith("exited with code 3")
        assert ends == [("error", "my last words")]
        assert_repaired(sup.store, run.id)


async def test_a_continuable_childs_notice_after_its_worker_died_carries_what_it_said(tmp_path):
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="script-continuable", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        child_id, _ = await sup.start_continuable(ContinuableSpec(
            parent=root, provider="script-continuable", label="c", prompt=json.dumps([{"say": "my last words"}, {"exit": 3}])))
        with anyio.fail_after(DEADLINE_S):
            notices = await sup.wait_for_message(root)
        assert [m.content for m in notices] == [
            f"Background subagent {child_id} failed before it finished.\nIts closing message:\nmy last words"]
