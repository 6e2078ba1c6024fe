"""Nested and fan-out delegation never deadlock the pool (parked turns free their worker)."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import inspect, list_children
from subagents.supervisor import ContinuableSpec, Provider, SubagentRequest, UserAuthority

from ..conftest import HELPERS, last_turn_end, open_supervisor, wait_until
from .test_continuable import S, continuable_supervisor, turn_ends, turn_started

pytestmark = pytest.mark.anyio


def chain(levels: int) -> list[dict]:
    """A script that delegates synchronously ``levels`` times; the leaf's text bubbles up."""
    script: list[dict] = [{"say": "leaf"}]
    for level in range(levels):
        script = [{"spawn": {"prompt": script, "provider": "script", "label": f"level-{levels - level}"}}]
    return script


async def test_depth_five_chain_on_one_worker(tmp_path):
    """Five nested synchronous spawns complete with ``pool_size=1``."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        with anyio.fail_after(20):
            run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(chain(5)), label="top"))
            result = await run.result()
            await run.dispose()
        assert (result.stop_reason, result.output) == ("completed", "leaf")
        rows = await sup.list_descendants(root.id)
        assert [r.depth for r in rows] == [1, 2, 3, 4, 5, 6]
        assert [r.entry.label for r in rows] == ["top", "level-1", "level-2", "level-3", "level-4", "level-5"]
        assert all(r.entry.status == "complete" for r in rows)
        assert [r.parent_id for r in rows] == [root.id] + [r.entry.id for r in rows[:-1]]
        stats = sup.statistics()
        assert (stats.pool.resident, stats.pool.parked, stats.runs_live) == (0, 0, 0)


async def test_fan_out_fifty_background_children(tmp_path):
    """One parent starts 50 background children then waits for all, with ``pool_size=2``."""
    spawns = [{"spawn": {"prompt": f"child-{i}", "provider": "echo", "wait": False}} for i in range(50)]
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        root = await sup.open_root()
        with anyio.fail_after(30):
            run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(spawns + [{"wait": "all"}])))
            result = await run.result()
            await run.dispose()
        assert result.stop_reason == "completed"
        assert result.output.split("\n") == [f"child-{i}" for i in range(50)]
        children = await sup.list_children(run.id)
        assert len(children) == 50
        assert all(c.status == "complete" and c.mode == "one-shot" for c in children)
        assert sup.statistics().pool.resident == 0


async def test_fan_out_of_nested_children_on_one_worker(tmp_path):
    """Background children that each wait on a grandchild, all on a single worker."""
    child = [{"spawn": {"prompt": "grandchild", "provider": "echo"}}]
    spawns = [{"spawn": {"prompt": child, "provider": "script", "wait": False}} for _ in range(5)]
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        with anyio.fail_after(20):
            run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(spawns + [{"wait": "all"}])))
            result = await run.result()
            await run.dispose()
        assert result.stop_reason == "completed"
        assert result.output.split("\n") == ["grandchild"] * 5
        assert len(await sup.list_descendants(root.id)) == 11


async def test_background_children_are_awaited_implicitly(tmp_path):
    """A script that never says ``wait`` still waits for its background children at its end."""
    spawns = [{"spawn": {"prompt": f"c{i}", "provider": "echo", "wait": False}} for i in range(3)]
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        with anyio.fail_after(20):
            run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(spawns)))
            result = await run.result()
            await run.dispose()
        assert result.stop_reason == "completed"
        assert [c.status for c in await sup.list_children(run.id)] == ["complete"] * 3


async def test_cancelling_a_parent_aborts_its_waiting_child(tmp_path):
    """Disposing a parent parked on a sleeping child cancels the child, and returns only once the child is done."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        prompt = [{"spawn": {"prompt": "30000", "provider": "pid-then-sleep"}}]
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(prompt)))

        async def child_started():
            kids = await sup.list_children(run.id)
            return kids and any(e["type"] == "assistant/message" for e in inspect(sup.store, kids[0].id).events)

        await wait_until(child_started, what="the grandchild to start")
        with anyio.fail_after(20):
            await run.dispose()
        assert (await run.result()).stop_reason == "aborted"
        [child] = await sup.list_children(run.id)
        assert last_turn_end(sup.store, child.id)["stop_reason"] == "aborted"
        assert child.status == "complete"


async def test_disposed_runs_are_not_kept(tmp_path):
    """A disposed run (and its nested children) is dropped by the supervisor: memory does not grow per run."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        for prompt in ("a", json.dumps([{"spawn": {"prompt": "b", "provider": "echo"}}])):
            run = await sup.start("script" if prompt != "a" else "echo", SubagentRequest(parent=root, prompt=prompt))
            with anyio.fail_after(20):
                await run.result()
                await run.dispose()
        assert sup.runs.runs == {}


@pytest.mark.parametrize("parent_running", [False, True], ids=["parent-finished", "parent-still-running"])
async def test_a_settlement_notice_to_a_one_shot_parent_is_dropped_not_written_as_damage(tmp_path, caplog, parent_running):
    """Found by a README probe: a one-shot child starts a continuable grandchild and returns; when the grandchild
    settles, its notice was accepted into the one-shot's mailbox, which has none (its prompt is in its log, never in
    a mailbox): the acceptance failed ``CORRUPT_SESSION`` with a traceback and left an empty mailbox that ``store
    fsck`` then called damaged. A one-shot takes no message after its turn: the notice is dropped and said so."""
    import logging

    from subagents.store import check_store
    from subagents.store.fsck import fsck
    from subagents.supervisor import Capabilities, Provider

    def script(*actions):
        return json.dumps({"script": list(actions)})

    caplog.set_level(logging.INFO, logger="subagents")
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        kid_gate, parent_gate = tmp_path / "kid-gate", tmp_path / "parent-gate"
        kid = script({"hold": str(kid_gate)}, {"return": "late"})
        actions = [{"start_continuable": {"prompt": kid, "label": "kid", "provider": "cont"}}]
        if parent_running:  # the grandchild settles while the one-shot's turn still runs
            actions.append({"hold": str(parent_gate)})
        run = await sup.start("cont", SubagentRequest(parent=root, prompt=script(*actions, {"return": "parent done"}), label="one-shot"))
        if not parent_running:
            with anyio.fail_after(20):
                assert (await run.result()).output == "parent done"
        [kid] = await wait_until(lambda: sup.list_children(run.id), what="the grandchild")
        kid_gate.write_text("")
        await wait_until(lambda: any(e["type"] == "turn/end" for e in inspect(sup.store, kid.id).events), what="the grandchild's turn")
        await wait_until(lambda: any("one-shot" in r.getMessage() and kid.id in r.getMessage() for r in caplog.records),
                         what="the dropped notice's log line")
        parent_gate.write_text("")
        with anyio.fail_after(20):
            assert (await run.result()).output == "parent done"
        await run.dispose()
        store = sup.store
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "notice" in r.getMessage()]
    assert not __import__("os").path.lexists(store.path(run.id, "mailbox"))
    assert check_store(store).clean
    assert [f for f in fsck(store, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] != "clean"] == []


@pytest.mark.parametrize("how", ["interrupt", "timeout_ms"])
async def test_a_continuable_turn_stopped_while_it_waits_on_a_one_shot_child_stops_that_child(tmp_path, how):
    """Found by a probe: a continuable turn interrupted (or out of its ``timeout_ms``) while it waited in
    ``ctx.spawn`` ended, and the one-shot child it started ran on to its end, holding a worker for a result
    nobody would read. The child belongs to the turn, as a one-shot parent's does: it is stopped too."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        waits = S({"spawn": {"prompt": S({"say": "up"}, {"sleep": 60_000}), "provider": "script", "label": "gc"}}, {"return": "never"})
        budget = {"budget": {"timeout_ms": 1000}} if how == "timeout_ms" else {}
        child_id, _ = await sup.start_continuable(_spec(root, waits, **budget))
        await turn_started(sup, child_id)
        grandchild = await wait_until(lambda: _only_child(sup, child_id), what="the one-shot child to start")
        await wait_until(lambda: "up" in [e["data"].get("text") for e in inspect(sup.store, grandchild).events], what="it to run")
        if how == "interrupt":
            await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await wait_until(lambda: turn_ends(sup.store, child_id), what="the continuable turn to end")
        await wait_until(lambda: turn_ends(sup.store, grandchild), what="the one-shot child to stop", timeout=10)
        assert turn_ends(sup.store, grandchild) == ["aborted"]


async def test_a_program_that_gives_up_on_a_spawn_stops_the_child(tmp_path):
    """Found by a probe: a program's own timeout around ``ctx.spawn(wait=True)`` gave up the wait, and the
    child, whose id the program never got, ran on to its end (it held a worker all the while). The worker
    tells the host the wait was given up (``CancelRpc``); the host stops serving it, and the child with it."""
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        sup.register_provider(Provider(name="quitter", program=f"{HELPERS}:gives_up_on_a_spawn"))
        root = await sup.open_root()
        run = await sup.start("quitter", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(20):
            assert (await run.result()).output == "gave up"
        [child] = [row.id for row in list_children(sup.store, run.id)]
        await wait_until(lambda: turn_ends(sup.store, child), what="the given-up child to stop", timeout=10)
        assert turn_ends(sup.store, child) == ["aborted"]
        await run.dispose()


def _spec(root, prompt, **fields):
    return ContinuableSpec(parent=root, provider="script", prompt=prompt, label="waits", **fields)


def _only_child(sup, parent_id):
    rows = list_children(sup.store, parent_id)
    return rows[0].id if rows else None
