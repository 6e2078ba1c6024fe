"""Lifecycle events: one ``subagent/start`` + ``subagent/end`` pair per one-shot run, sharing a ``run_id``."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.supervisor import SubagentRequest

from ..conftest import DEADLINE_S, open_supervisor, said, wait_until

pytestmark = pytest.mark.anyio


async def test_start_and_end_are_paired_by_run_id(tmp_path):
    """Completed, failed, aborted and nested runs each emit exactly one start then one end."""
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        seen: list[tuple[str, dict]] = []
        sup.on("subagent/start", lambda name, payload: seen.append((name, dict(payload))))
        sup.on("subagent/end", lambda name, payload: seen.append((name, dict(payload))))
        root = await sup.open_root()
        ok = await sup.start("echo", SubagentRequest(parent=root, prompt="fine"))
        bad = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"fail": "x"}])))
        nested = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"spawn": {"prompt": "inner", "provider": "echo"}}])))
        stopped = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        await wait_until(lambda: said(sup.store, stopped.id), what="the sleeper to start")
        with anyio.fail_after(DEADLINE_S):
            await stopped.dispose()
            results = {run.id: await run.result() for run in (ok, bad, nested, stopped)}
            for run in (ok, bad, nested):
                await run.dispose()

        starts = {p["run_id"]: p for n, p in seen if n == "subagent/start"}
        ends = {p["run_id"]: p for n, p in seen if n == "subagent/end"}
        assert len(starts) == len([n for n, _ in seen if n == "subagent/start"]) == 5  # 4 runs + the nested child
        assert starts.keys() == ends.keys()
        order = [(n, p["run_id"]) for n, p in seen]
        for run_id in starts:
            assert order.index(("subagent/start", run_id)) < order.index(("subagent/end", run_id))
        by_child = {p["id"]: p for p in ends.values()}
        for run in (ok, bad, nested, stopped):
            end = by_child[run.id]
            assert end["run_id"] == run.run_id
            assert starts[run.run_id]["id"] == run.id
            assert end["stop_reason"] == results[run.id].stop_reason
        assert [by_child[r.id]["stop_reason"] for r in (ok, bad, nested, stopped)] == ["completed", "error", "completed", "aborted"]
        assert by_child[ok.id]["last_assistant_message"] == "fine"
        assert starts[ok.run_id]["provider"] == "echo"
        inner = [p for p in ends.values() if p["id"] not in results]
        assert len(inner) == 1 and inner[0]["provider"] == "echo" and inner[0]["stop_reason"] == "completed"


async def test_listener_that_raises_is_isolated(tmp_path):
    """A raising start/end listener is logged; the run completes and later listeners still hear both events."""
    async with open_supervisor(tmp_path) as sup:
        heard: list[str] = []

        def explode(name, payload):
            raise RuntimeError(f"listener broke on {name}")

        sup.on("subagent/start", explode)
        sup.on("subagent/end", explode)
        sup.on(None, lambda name, payload: heard.append(name))
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="still fine"))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert (result.stop_reason, result.output) == ("completed", "still fine")
        assert heard == ["subagent/start", "subagent/end"]


async def test_unsubscribed_listener_hears_nothing(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        heard: list[str] = []
        off = sup.on(None, lambda name, payload: heard.append(name))
        off()
        off()
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="x"))
        await run.result()
        await run.dispose()
        assert heard == []


class _OwnBase(BaseException):
    """A listener's own BaseException (not KeyboardInterrupt or SystemExit)."""


@pytest.mark.parametrize("event", ["subagent/start", "subagent/end"])
async def test_a_listener_raising_its_own_base_exception_is_isolated(tmp_path, event):
    """Found by a probe: on ``subagent/start`` it escaped ``start()`` after the child was created and before
    it was submitted (the child stayed not-started, close took 12 s); on ``subagent/end`` it ended the
    whole ``async with`` block with a BaseExceptionGroup. It is logged like any listener's failure."""
    def listener(name, payload):
        raise _OwnBase("boom")

    async with open_supervisor(tmp_path) as sup:
        sup.on(event, listener)
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="still runs"))
        with anyio.fail_after(DEADLINE_S):
            assert (await run.result()).output == "still runs"
        await run.dispose()
        assert sup.statistics().runs_live == 0


async def test_on_refuses_what_could_never_fire_and_answers_closed_after_close(tmp_path):
    from subagents.store import SubagentError

    async with open_supervisor(tmp_path) as sup:
        for event, listener in [("subagent/stop", lambda n, p: None), (12345, lambda n, p: None), ("subagent/end", "not callable"),
                                ("subagent/provider-added", None)]:
            with pytest.raises(SubagentError) as refused:
                sup.on(event, listener)
            assert refused.value.code == "INVALID_REQUEST", (event, refused.value)
        with pytest.raises(SubagentError) as refused:
            sup.register_continuable_setup("not callable")
        assert refused.value.code == "INVALID_REQUEST"
    for call in (lambda: sup.on(None, lambda n, p: None), lambda: sup.register_continuable_setup(lambda info: None)):
        with pytest.raises(SubagentError) as refused:
            call()
        assert refused.value.code == "SUPERVISOR_CLOSED"


STOPPING_HOST = """
import json, sys, anyio
from subagents.supervisor import *

def stop(name, payload):
    if payload.get("provider") == "script":
        raise SystemExit(3) if sys.argv[2] == "exit" else KeyboardInterrupt()

async def main(store):
    cfg = SupervisorConfig(pool_size=2, durability="none")
    async with Supervisor.open(store=store, config=cfg) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        sup.on("subagent/end", stop)
        root = await sup.open_root()
        kept, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", label="kept",
                                                              prompt=json.dumps({"script": [{"sleep": 60000}]})))
        print(kept, flush=True)
        ended, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", label="ends",
                                                               prompt=json.dumps({"script": [{"return": "done"}]})))
        await anyio.sleep(60)
        print("the body went on", flush=True)

anyio.run(main, sys.argv[1])
"""


@pytest.mark.parametrize(("how", "code"), [("exit", 3), ("interrupt", -2)])  # an uncaught KeyboardInterrupt ends Python by SIGINT
def test_a_listener_that_stops_the_process_stops_it_through_an_orderly_close(tmp_path, how, code):
    """Found by a probe: ``SystemExit`` or ``KeyboardInterrupt`` from a ``subagent/end`` listener went on from inside
    the supervisor's own bookkeeping (a disposal, the pool's reader): the close was skipped, a resident child was
    left ``crashed``, and the process hung at exit waiting for idle threads. It now stops the host's program as its
    own code raising it would: the supervisor closes (the resident child ``aborted``), then ``open`` raises it."""
    import subprocess
    import sys

    from subagents.store import Store, check_store, list_roots, list_children

    from ..conftest import REPO_ROOT

    done = subprocess.run([sys.executable, "-c", STOPPING_HOST, str(tmp_path / "st"), how], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin"})
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr[-3000:])
    assert "the body went on" not in done.stdout
    kept = done.stdout.split()[0]
    st = Store(tmp_path / "st", create=False)
    [root] = [r.id for r in list_roots(st)]
    rows = {row.id: row for row in list_children(st, root)}
    assert (rows[kept].status, rows[kept].outcome) == ("complete", "aborted"), rows[kept]
    assert check_store(st).clean
