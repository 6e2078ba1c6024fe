"""The pool contract, on the local pool and on the Ray pool alike (real kill -9, real cancellation)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents.store import read_lease
from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import DEADLINE_S, events_of, helper, last_turn_end, said, wait_until
from ._pools import open_pool_supervisor

from .conftest import RAY_TESTS

pytestmark = [pytest.mark.anyio, *RAY_TESTS]


def start_deadline(sup: Any) -> float:
    """How long a replacement worker may take to start: what the pool was given to start its workers
    (``open_pool_supervisor``: generous, as a loaded machine starts a Ray actor in seconds, not ms)."""
    return float(sup.config.worker_ready_timeout_s)


async def first_said(sup: Any, run: Any) -> str:
    texts = await wait_until(lambda: said(sup.store, run.id), what=f"child {run.id} to start")
    return texts[0]


def assert_repaired(st: Any, session_id: str) -> None:
    events = events_of(st, session_id)
    assert events[-1]["type"] == "turn/end" and events[-1]["data"]["stop_reason"] == "interrupted"
    kinds = [e["type"] for e in events]
    assert kinds.count("turn/start") == kinds.count("turn/end") == 1


async def test_kill_9_mid_turn(tmp_path: Path, kind: str) -> None:
    """The turn on the killed worker ends error naming its pid (and node), its log is repaired after a
    fence (epoch + 1), a replacement starts, and the next turn runs."""
    async with open_pool_supervisor(tmp_path, kind, pool_size=2) as sup:
        root = await sup.open_root()
        victim = await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        node, pid = (await first_said(sup, victim)).split()
        epoch_before = read_lease(sup.store, victim.id).epoch
        os.kill(int(pid), signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            result = await victim.result()
        assert result.stop_reason == "error"
        assert f"worker process {pid}" in (result.diagnostic or "")
        if kind == "ray":
            assert f"on node 127.0.0.1/{node[:12]}" in (result.diagnostic or "")
        assert_repaired(sup.store, victim.id)
        repaired_at = events_of(sup.store, victim.id)[-1]["epoch"]
        assert repaired_at == epoch_before + 1  # fenced before the repair
        await wait_until(lambda: sup.statistics().pool.workers_alive == 2, timeout=start_deadline(sup), what="the replacement worker")
        assert sup.statistics().pool.crashed == 1
        assert int(pid) not in sup.pool.worker_pids()
        nxt = await sup.start("node-pid", SubagentRequest(parent=root, prompt="x"))
        with anyio.fail_after(DEADLINE_S):
            assert (await nxt.result()).stop_reason == "completed"
        await nxt.dispose()
        await victim.dispose()


async def test_queued_work_goes_to_the_replacement(tmp_path: Path, kind: str) -> None:
    async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
        root = await sup.open_root()
        running = await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        _node, pid = (await first_said(sup, running)).split()
        queued = await sup.start("node-pid", SubagentRequest(parent=root, prompt="x"))
        await wait_until(lambda: sup.statistics().pool.queued == 1, what="the second turn to queue")
        os.kill(int(pid), signal.SIGKILL)
        with anyio.fail_after(DEADLINE_S):
            assert (await running.result()).stop_reason == "error"
        with anyio.fail_after(start_deadline(sup) + DEADLINE_S):  # the replacement starts, then runs it
            second = await queued.result()
        assert second.stop_reason == "completed"
        assert second.output.split()[1] != pid  # it ran on the replacement
        assert queued.worker is not None and queued.worker.pid == int(second.output.split()[1])  # where the run says it ran
        if kind == "ray":
            assert queued.worker.host.split("/")[1] == second.output.split()[0][:12]
        await running.dispose()
        await queued.dispose()


async def test_parent_and_child_share_one_worker(tmp_path: Path, kind: str) -> None:
    """Nested delegation on a pool of 1: the waiting parent is parked, its children run in the same worker."""
    grandchild = {"script": [{"return": "leaf"}]}
    child = {"script": [{"spawn": {"prompt": grandchild, "provider": "script"}}, {"return": "middle"}]}
    parent = {"script": [{"spawn": {"prompt": child, "provider": "script"}}, {"spawn": {"prompt": child, "provider": "script"}}, {"return": "top"}]}
    async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(parent)))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        assert (result.stop_reason, result.output) == ("completed", "top")
        rows = await sup.list_descendants(root.id)
        assert len(rows) == 5 and sup.statistics().pool.crashed == 0
        await run.dispose()


async def test_a_wait_the_program_gives_up_stops_its_child(tmp_path: Path, kind: str) -> None:
    """A program's own timeout around ``ctx.spawn(wait=True)``: the worker says so (``CancelRpc``) through
    either transport, and the host stops the child the wait was for."""
    from subagents.store import list_children
    from subagents.supervisor import Provider

    from ..conftest import HELPERS

    async with open_pool_supervisor(tmp_path, kind, pool_size=2) as sup:
        sup.register_provider(Provider(name="quitter", program=f"{HELPERS}:gives_up_on_a_spawn"))
        root = await sup.open_root()
        run = await sup.start("quitter", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(DEADLINE_S):
            assert (await run.result()).output == "gave up"
        [child] = [row.id for row in list_children(sup.store, run.id)]
        ends = await wait_until(lambda: [e["data"] for e in events_of(sup.store, child) if e["type"] == "turn/end"],
                                what="the given-up child to stop")
        assert [end["stop_reason"] for end in ends] == ["aborted"], ends
        await run.dispose()


async def test_ignored_cancel_kills_the_worker(tmp_path: Path, kind: str) -> None:
    """A turn spinning on the event loop never sees its cancel: after the grace its worker is killed, the turn aborted."""
    async with open_pool_supervisor(tmp_path, kind, pool_size=1, cancel_grace_s=0.5) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps({"script": [{"say": "spinning"}, {"spin": 60000}]})))
        await first_said(sup, run)
        started = sup.statistics().pool.started
        run.cancel("user")
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        assert result.stop_reason == "aborted"
        await wait_until(lambda: sup.statistics().pool.started == started + 1, timeout=start_deadline(sup), what="the replacement worker")
        assert sup.statistics().pool.crashed == 1
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "interrupted"
        await run.dispose()


async def test_cooperative_cancel(tmp_path: Path, kind: str) -> None:
    async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
        root = await sup.open_root()
        run = await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        await first_said(sup, run)
        run.cancel("user")
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        assert result.stop_reason == "aborted" and sup.statistics().pool.crashed == 0
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "aborted"
        await run.dispose()


async def test_structured_output(tmp_path: Path, kind: str) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
        root = await sup.open_root()
        good = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps({"script": [{"structured": {"n": 3}}]}), output_schema=schema))
        bad = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps({"script": [{"structured": {"n": "x"}}]}), output_schema=schema))
        with anyio.fail_after(DEADLINE_S):
            ok, wrong = await good.result(), await bad.result()
        assert (ok.stop_reason, ok.structured) == ("completed", {"n": 3})
        assert wrong.stop_reason == "error" and "does not match the schema" in (wrong.diagnostic or "")
        await good.dispose()
        await bad.dispose()


async def test_turns_per_worker(tmp_path: Path, kind: str) -> None:
    """With turns_per_worker = 2 one worker runs two sleeping turns at once; the third waits."""
    async with open_pool_supervisor(tmp_path, kind, pool_size=1, turns_per_worker=2) as sup:
        root = await sup.open_root()
        runs = [await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="30000")) for _ in range(3)]
        await wait_until(lambda: sum(1 for r in runs if said(sup.store, r.id)) == 2, what="two turns to run")
        stats = sup.statistics().pool
        assert (stats.resident, stats.queued) == (2, 1)
        for run in runs:
            run.cancel("user")
        with anyio.fail_after(DEADLINE_S):
            for run in runs:
                assert (await run.result()).stop_reason == "aborted"
                await run.dispose()


@pytest.mark.parametrize("how", ["task group", "move_on_after"])
async def test_close_from_a_cancelled_scope_stops_the_turn_promptly(tmp_path: Path, kind: str, how: str) -> None:
    """A supervisor closed because the scope around it was cancelled still reaches its running turn: the
    cancel gets to the worker and its answer is read, so the turn ends ``aborted`` by itself in well under
    the close's bounds (before, on Ray, the pool's tasks were cancelled with the scope: ~12 s, then a repair)."""
    running: list[str] = []
    cancelled_at: list[float] = []

    async def host(ready: anyio.Event) -> None:
        async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
            root = await sup.open_root()
            run = await sup.start("node-then-sleep", SubagentRequest(parent=root, prompt="30000"))
            await first_said(sup, run)
            running.append(run.id)
            ready.set()
            await anyio.sleep(DEADLINE_S)
        running.append(str(sup.store.root))

    ready = anyio.Event()
    with anyio.fail_after(DEADLINE_S * 3):
        if how == "task group":
            async with anyio.create_task_group() as tg:
                tg.start_soon(host, ready)
                await ready.wait()
                cancelled_at.append(anyio.current_time())
                tg.cancel_scope.cancel()
        else:
            with anyio.move_on_after(DEADLINE_S * 2) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(host, ready)
                    await ready.wait()
                    cancelled_at.append(anyio.current_time())
                    scope.cancel()
    took = anyio.current_time() - cancelled_at[0]
    assert took < 3.0, f"the close took {took:.1f}s"
    async with open_pool_supervisor(tmp_path, "local") as sup:  # the store as the turn left it
        assert last_turn_end(sup.store, running[0])["stop_reason"] == "aborted"  # its own end: not a crash repair


async def test_a_turn_committed_before_its_worker_died_reports_what_its_log_says(tmp_path: Path, kind: str) -> None:
    """The worker dies (kill -9) after the turn's closing commit, before the supervisor hears how it ended:
    the caller is told what the log says (completed, its output), as a listing says, not a crash; the
    lease is released and no repair record is written."""
    async with open_pool_supervisor(tmp_path, kind, pool_size=1, durability="strict") as sup:
        root = await sup.open_root()
        run = await sup.start("dies-after-its-commit", SubagentRequest(parent=root, prompt="x"))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        assert (result.stop_reason, result.output) == ("completed", "done"), result.diagnostic
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "completed"
        assert [row.outcome for row in await sup.list_children(root.id)] == ["completed"]
        assert read_lease(sup.store, run.id).state == "released"
        await wait_until(lambda: sup.statistics().pool.crashed == 1, what="the worker's death to be seen")
        await run.dispose()


@pytest.mark.parametrize("program", ["exits_the_worker", "exits_the_worker_from_a_thread"])
async def test_a_program_that_exits_ends_its_turn_and_the_next_runs(tmp_path: Path, kind: str, program: str) -> None:
    """``sys.exit`` in a program ends its worker, which is replaced (README). Found by a probe on Ray: the actor
    took the ``SystemExit`` into its event loop and went on, the turn never ended, the child was listed
    ``running`` for good, and the child queued behind it on the one slot never started."""
    async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
        sup.register_provider(Provider(name="exits", program=helper(program), capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("exits", SubagentRequest(parent=root, prompt="go"))
        behind = await sup.start("echo", SubagentRequest(parent=root, prompt="after"))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
            after = await behind.result()
        assert result.stop_reason == "error", result
        assert (after.stop_reason, after.output) == ("completed", "after"), after
        await run.dispose()
        await behind.dispose()
