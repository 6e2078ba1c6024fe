"""``WorkerPool`` on its own: dispatch, statistics, and turns sent to a worker that already died."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import anyio
import pytest

from subagents.store import Store, acquire_lease, create_session, inspect
from subagents.supervisor.config import RayConfig
from subagents.supervisor.backend import TurnResult
from subagents.supervisor.dispatch import AHEAD_WAIT_S, WITHDRAW_WAIT_S
from subagents.supervisor.errors import SupervisorClosedError
from subagents.supervisor.pool import WorkerPool
from subagents.supervisor.ray_pool import RayPool
from subagents.worker.protocol import TurnSpec

from ..conftest import wait_until

pytestmark = pytest.mark.anyio

DEADLINE_S = 20.0


def echo_spec(st: Store, session_id: str, message: str = "hello") -> TurnSpec:
    create_session(st, session_id)
    epoch = acquire_lease(st, session_id, "01OWNER").epoch
    return TurnSpec(
        session_id=session_id, epoch=epoch, store_root=st.root, durability="none", program="echo", message_id="01M",
        message_source={"kind": "user"}, message=message, log_message=True, depth=1, mode="one-shot",
    )


async def no_rpc(method, args):
    raise AssertionError(f"unexpected rpc {method}")


def block_until_dead(pid: int) -> None:
    """Block the event loop (on purpose) until ``pid`` has exited: the pool cannot notice it meanwhile.

    Every thread of it, not only its main one: a worker has threads, its main thread shows ``Z`` as
    soon as it exits, and its descriptors (its end of the pipe) close only with the last thread. A
    turn sent in between was taken by the pipe of a process still dying, and ended ``error``."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if all(state in ("Z", "X", None) for state in _thread_states(pid)):
            return
        time.sleep(0.001)
    pytest.fail(f"process {pid} did not die")


def _thread_states(pid: int) -> list[str | None]:
    """The state letter of each thread of ``pid`` (``None``: gone while read); none once it is reaped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    states: list[str | None] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                states.append(handle.read().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            states.append(None)
    return states


@pytest.fixture
def st(tmp_path) -> Store:
    return Store(tmp_path / "store", durability="none")


async def test_turn_runs_and_statistics(st):
    pool = WorkerPool(size=2, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        assert len(set(pool.worker_pids())) == 2
        with anyio.fail_after(DEADLINE_S):
            handle = await pool.run_turn(echo_spec(st, "01POOLECHO"), no_rpc)
        assert (handle.outcome.stop_reason, handle.outcome.output, handle.crashed) == ("completed", "hello", False)
        assert handle.dispatched and handle.worker.pid in pool.worker_pids()
        assert pool.workers() == [handle.worker.__class__(handle.worker.host, pid) for pid in pool.worker_pids()]
        stats = pool.statistics()
        assert (stats.size, stats.workers_alive, stats.queued, stats.resident, stats.started, stats.crashed) == (2, 2, 0, 0, 2, 0)
        await pool.aclose()
        tg.cancel_scope.cancel()


async def test_submit_calls_back_with_the_result_and_a_failing_callback_does_not_stop_the_pool(st, caplog):
    """``submit`` hands the result to a callback on the loop; one that raises is logged, and the pool's
    reader (which called it) goes on serving the next turns."""
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    results = []
    ended = anyio.Event()

    def broken(result):
        results.append(result)
        raise RuntimeError("a bug in a run's bookkeeping")

    def fine(result):
        results.append(result)
        ended.set()

    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        pool.submit(echo_spec(st, "01SUBMITA", "first"), no_rpc, on_done=broken)
        pool.submit(echo_spec(st, "01SUBMITB", "second"), no_rpc, on_done=fine)
        with anyio.fail_after(DEADLINE_S):
            await ended.wait()
        assert [(r.outcome.stop_reason, r.outcome.output, r.crashed) for r in results] == [
            ("completed", "first", False), ("completed", "second", False)]
        assert all(r.dispatched for r in results)
        assert "was not handled" in caplog.text and "a bug in a run's bookkeeping" in caplog.text
        await pool.aclose()
        tg.cancel_scope.cancel()


async def wait_started(st: Store, session_id: str) -> None:
    await wait_until(lambda: any(e["type"] == "turn/start" for e in inspect(st, session_id).events), what=f"{session_id}'s turn to start")


def script_spec(st: Store, session_id: str, script: list) -> TurnSpec:
    return dataclasses.replace(echo_spec(st, session_id, json.dumps({"script": script})), program="script", release_owner="01OWNER")


@pytest.mark.parametrize("script, crashed", [
    ([{"sleep": 600_000}], False),  # its worker cancels it at shutdown: closed and released by the worker
    ([{"spin": 600_000}], True),  # it ignores cancellation, so its worker is killed: the caller repairs it
])
async def test_a_turn_resident_at_close_ends_with_the_pool(st, script, crashed):
    """``aclose`` ends every resident turn: a ``submit`` callback is never left without its result."""
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    results = []
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        pool.submit(script_spec(st, "01CLOSING", script), no_rpc, on_done=results.append)
        await wait_started(st, "01CLOSING")
        with anyio.fail_after(DEADLINE_S):
            await pool.aclose()
        assert [(r.outcome.stop_reason, r.crashed) for r in results] == [("aborted", crashed)]
        assert results[0].outcome.released is not crashed
        assert (inspect(st, "01CLOSING").events[-1]["type"] == "turn/end") is not crashed
        tg.cancel_scope.cancel()


async def test_submit_after_close_raises(st):
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        await pool.aclose()
        with pytest.raises(SupervisorClosedError):
            pool.submit(echo_spec(st, "01SUBMITC"), no_rpc, on_done=lambda result: None)
        tg.cancel_scope.cancel()


async def test_turn_sent_to_a_dead_worker_runs_on_the_replacement(st):
    """A turn dispatched before the pool saw its worker die never reached it: it runs on the replacement, not ``error``."""
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        [pid] = pool.worker_pids()
        spec = echo_spec(st, "01POOLDEAD")
        os.kill(pid, signal.SIGKILL)
        block_until_dead(pid)
        with anyio.fail_after(DEADLINE_S):
            handle = await pool.run_turn(spec, no_rpc)
        assert (handle.outcome.stop_reason, handle.outcome.output) == ("completed", "hello"), handle.outcome.diagnostic
        assert handle.crashed is False
        assert handle.worker.pid != pid
        assert [e["type"] for e in inspect(st, "01POOLDEAD").events][-1] == "turn/end"
        assert pool.statistics().crashed == 1
        await pool.aclose()
        tg.cancel_scope.cancel()


async def test_cancel_of_a_queued_turn_never_dispatches_it(st):
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        handles = []

        def started(handle):
            handles.append(handle)
            pool.cancel(handle, "user")

        with anyio.fail_after(DEADLINE_S):
            handle = await pool.run_turn(echo_spec(st, "01POOLCANCEL"), no_rpc, started=started)
        assert len(handles) == 1 and not handle.dispatched
        assert handle.outcome.stop_reason == "aborted"
        assert handle.outcome.diagnostic == "the turn was cancelled (user) before it started"
        assert inspect(st, "01POOLCANCEL").events == []
        await pool.aclose()
        tg.cancel_scope.cancel()


def _closed_pool_of(kind: str, st: Store) -> "WorkerPool | RayPool":
    if kind == "local":
        return WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    pytest.importorskip("ray")
    return RayPool(size=1, ray=RayConfig(), store_root=st.root, durability="none", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)


@pytest.mark.parametrize("kind", ["local", "ray"])
async def test_a_turn_queued_after_close_is_refused_by_either_pool(st, kind):
    """Both pools share one dispatcher: a closed pool refuses a turn with ``SupervisorClosedError``
    (the Ray pool's own copy raised a TypeError: it passed that error a message it does not take)."""
    pool = _closed_pool_of(kind, st)
    await pool.aclose()
    with pytest.raises(SupervisorClosedError):
        await pool.run_turn(echo_spec(st, "01CLOSED"), no_rpc)
    assert pool.statistics().queued == 0


# -- prefetch: a worker is handed a turn ahead of a free slot -------------------------------------------


class Submitted:
    """Turns submitted to ``pool`` by name (``submit(name, spec)``), and their results as they end."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.results: dict[str, TurnResult] = {}

    def __call__(self, name: str, spec: TurnSpec) -> None:
        self.pool.submit(spec, no_rpc, on_done=lambda result: self.results.__setitem__(name, result))


def held_spec(st: Store, session_id: str, gate) -> TurnSpec:
    return script_spec(st, session_id, [{"hold": str(gate)}, {"return": "held"}])


async def test_a_turn_handed_ahead_runs_when_the_worker_frees(st, tmp_path):
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0, prefetch=1)
    gate = tmp_path / "gate"
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        submit = Submitted(pool)
        results = submit.results
        submit("held", held_spec(st, "01HELD", gate))
        submit("ahead", echo_spec(st, "01AHEAD", "next"))
        stats = pool.statistics()
        assert (stats.queued, stats.ahead, stats.resident) == (1, 1, 1)  # handed over ahead: it waits in the worker
        await wait_started(st, "01HELD")
        assert inspect(st, "01AHEAD").events == []  # it waits in the worker
        gate.touch()
        await wait_until(lambda: len(results) >= 2, what="2 turns to end")
        assert results["ahead"].outcome.output == "next" and not results["ahead"].crashed
        assert results["ahead"].worker == results["held"].worker
        await pool.aclose()
        tg.cancel_scope.cancel()


async def test_a_turn_waiting_ahead_is_given_back_to_a_worker_that_falls_idle(st, tmp_path):
    """A short turn never waits behind a long one while a worker idles."""
    pool = WorkerPool(size=2, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0, prefetch=1)
    long_gate, short_gate = tmp_path / "long", tmp_path / "short"
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        submit = Submitted(pool)
        results = submit.results
        submit("long", held_spec(st, "01LONG", long_gate))
        submit("short", held_spec(st, "01SHORT", short_gate))
        # both workers run one: this one goes ahead behind the long turn (the first worker on a tie)
        submit("next", echo_spec(st, "01NEXT", "next"))
        await wait_started(st, "01LONG")
        await wait_started(st, "01SHORT")
        short_gate.touch()
        await wait_until(lambda: "next" in results, what="the next turn to end")
        assert results["next"].outcome.output == "next"
        assert results["next"].worker == results["short"].worker
        assert "long" not in results  # still running: the turn did not wait for it
        assert pool.statistics().withdrawn == 1
        long_gate.touch()
        await wait_until(lambda: "long" in results, what="the long turn to end")
        await pool.aclose()
        tg.cancel_scope.cancel()


async def test_a_turn_waiting_ahead_on_a_worker_that_dies_runs_on_the_replacement(st, tmp_path):
    """The running turn ends ``error`` (crashed); the one that never started is not touched by the
    crash: it runs once, on the replacement."""
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0, prefetch=1)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        [pid] = pool.worker_pids()
        submit = Submitted(pool)
        results = submit.results
        submit("doomed", held_spec(st, "01DOOMED", tmp_path / "never"))
        submit("ahead", echo_spec(st, "01AHEAD", "next"))
        await wait_started(st, "01DOOMED")
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: len(results) >= 2, what="2 turns to end")
        assert (results["doomed"].outcome.stop_reason, results["doomed"].crashed) == ("error", True)
        assert (results["ahead"].outcome.output, results["ahead"].crashed) == ("next", False)
        assert results["ahead"].worker.pid != pid
        assert [e["type"] for e in inspect(st, "01AHEAD").events].count("turn/start") == 1
        await pool.aclose()
        tg.cancel_scope.cancel()


async def test_a_turn_waiting_ahead_too_long_goes_to_the_next_free_slot_before_newer_turns(st, tmp_path):
    """Behind a long turn, a turn handed ahead is given back once it has waited ``AHEAD_WAIT_S`` and
    another worker frees: it runs there before turns queued after it, even while the queue is never empty."""
    pool = WorkerPool(size=2, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0, prefetch=1)
    gates = {name: tmp_path / name for name in ("long", "short", "later")}
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        submit = Submitted(pool)
        results = submit.results

        submit("long", held_spec(st, "01LONG", gates["long"]))  # the first worker
        submit("short", held_spec(st, "01SHORT", gates["short"]))  # the second
        submit("stuck", echo_spec(st, "01STUCK", "stuck"))  # ahead, behind the long turn
        submit("next", echo_spec(st, "01NEXT", "next"))  # ahead, behind the short turn
        submit("later", held_spec(st, "01LATER", gates["later"]))  # queued in the pool
        await wait_started(st, "01LONG")
        await wait_started(st, "01SHORT")
        await anyio.sleep(AHEAD_WAIT_S * 2)  # let the turn ahead of the long one age
        gates["short"].touch()
        await wait_until(lambda: "stuck" in results, what="the stuck turn to end")
        assert results["stuck"].outcome.output == "stuck"
        assert results["stuck"].worker == results["short"].worker
        assert "long" not in results and "later" not in results
        assert pool.statistics().withdrawn >= 1
        for gate in gates.values():
            gate.touch()
        await wait_until(lambda: len(results) >= 5, what="5 turns to end")
        assert all(r.outcome.stop_reason == "completed" for r in results.values())
        await pool.aclose()
        tg.cancel_scope.cancel()


async def test_a_worker_that_cannot_answer_a_withdraw_holds_up_dispatch_only_briefly(st, tmp_path):
    """A turn blocking its worker's event loop (a program calling blocking code from ``async def``)
    leaves a withdraw unanswered: the other worker's free slot waits ``WITHDRAW_WAIT_S`` at most."""
    pool = WorkerPool(size=2, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0, prefetch=1)
    gate = tmp_path / "gate"
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        submit = Submitted(pool)
        results = submit.results

        submit("blocking", script_spec(st, "01BLOCKING", [{"say": "on"}, {"spin": 20_000}]))  # the first worker
        submit("held", held_spec(st, "01HELD", gate))  # the second
        submit("stuck", echo_spec(st, "01STUCK", "stuck"))  # ahead, behind the blocking turn
        submit("ahead", echo_spec(st, "01AHEAD2", "ahead"))  # ahead, behind the held turn
        submit("queued", echo_spec(st, "01QUEUED", "queued"))
        await wait_started(st, "01BLOCKING")
        await wait_started(st, "01HELD")
        await anyio.sleep(AHEAD_WAIT_S * 2)
        gate.touch()
        await wait_until(lambda: "queued" in results, timeout=WITHDRAW_WAIT_S + 5, what="the queued turn to end")  # long before the blocking turn ends
        assert results["queued"].outcome.output == "queued"
        assert "blocking" not in results and "stuck" not in results
        await pool.aclose()  # kills the blocking worker
        tg.cancel_scope.cancel()


async def test_a_turn_no_message_holds_ends_error_and_the_pool_serves_the_next(st):
    """A spec the pipe cannot carry (a lone surrogate: requests are checked before this, so only a bug
    gets here) ends that turn ``error`` saying why; queued behind another turn, its hand-over ran in the
    pool's reader and the exception ended the whole supervisor. Found by a probe."""
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    results: dict[str, TurnResult] = {}
    ended = anyio.Event()

    def keep(name: str):
        def on_done(result: TurnResult) -> None:
            results[name] = result
            if len(results) == 3:
                ended.set()
        return on_done

    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        first = dataclasses.replace(echo_spec(st, "01UNSENDA", "first"), program="script", message='{"script": [{"sleep": 300}, {"return": "first"}]}')
        pool.submit(first, no_rpc, on_done=keep("first"))
        pool.submit(dataclasses.replace(echo_spec(st, "01UNSENDB"), persona="\ud800"), no_rpc, on_done=keep("unsendable"))
        pool.submit(echo_spec(st, "01UNSENDC", "after"), no_rpc, on_done=keep("after"))
        with anyio.fail_after(DEADLINE_S):
            await ended.wait()
        bad = results["unsendable"]
        assert (bad.outcome.stop_reason, bad.dispatched, bad.crashed) == ("error", False, False)
        assert bad.outcome.diagnostic.startswith("the turn could not be sent to a worker: UnicodeEncodeError"), bad.outcome.diagnostic
        assert [(results[n].outcome.stop_reason, results[n].outcome.output) for n in ("first", "after")] == [
            ("completed", "first"), ("completed", "after")]
        await pool.aclose()
        tg.cancel_scope.cancel()
