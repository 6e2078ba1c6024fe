"""A turn handed to a worker that is stopped, and that it has not started, runs on a worker that takes turns:
one handed ahead (prefetch) before the stop, one handed to its free slot right after; the turn the stopped
worker had started stays with it and ends when it is continued; none runs twice.

Found by a probe: a pool of two with prefetch, a turn waiting ahead behind a long turn on the first worker,
that worker stopped (SIGSTOP) and the second one freed: the turn waited on the stopped worker while the
second idled, for as long as the stop lasted. Asking it back (``Withdraw``) needs an answer a stopped
process cannot give, and the pipe cannot say whether the worker began it just before it was stopped; the
pool now takes such a turn back through its token (``worker/claims.py``), which only one side can take.
"""

from __future__ import annotations

import contextlib
import os
import signal

import anyio
import pytest

from subagents.store import Store, inspect

from ..conftest import wait_until
from .test_pool import Submitted, echo_spec, held_spec, no_rpc, wait_started
from .test_stopped_worker_not_rebalanced_to import started_pool

pytestmark = pytest.mark.anyio


@pytest.fixture
def st(tmp_path) -> Store:
    return Store(tmp_path / "store", durability="none")


def _starts(st: Store, session_id: str) -> int:
    return [e["type"] for e in inspect(st, session_id).events].count("turn/start")


async def test_a_turn_ahead_on_a_stopped_worker_runs_on_the_worker_that_frees(st, tmp_path) -> None:
    gates = {name: tmp_path / name for name in ("long", "short")}
    async with started_pool(2, 1) as pool:
        stopped, running = pool.worker_pids()  # the first takes a turn on a tie: the long one, and the one ahead
        submit = Submitted(pool)
        results = submit.results
        submit("long", held_spec(st, "01LONG", gates["long"]))
        submit("short", held_spec(st, "01SHORT", gates["short"]))
        submit("ahead", echo_spec(st, "01AHEAD", "next"))
        await wait_started(st, "01LONG")
        await wait_started(st, "01SHORT")
        assert pool.statistics().ahead == 1
        try:
            os.kill(stopped, signal.SIGSTOP)
            gates["short"].touch()
            await wait_until(lambda: "ahead" in results, timeout=5, what="the turn ahead to run on the other worker")
            assert (results["ahead"].outcome.output, results["ahead"].worker.pid) == ("next", running)
            assert "long" not in results
        finally:
            gates["long"].touch()
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        await wait_until(lambda: "long" in results, what="the long turn to end where it started")
        assert (results["long"].outcome.output, results["long"].worker.pid) == ("held", stopped)
        submit("after", echo_spec(st, "01AFTER", "after"))  # the continued worker serves on
        await wait_until(lambda: "after" in results, what="a turn after the stop")
        assert _starts(st, "01AHEAD") == 1 and _starts(st, "01LONG") == 1


@pytest.mark.parametrize("prefetch", [0, 1])
async def test_a_turn_handed_to_a_worker_stopped_just_after_it_spoke_runs_on_another(st, prefetch: int) -> None:
    """The pool takes a worker that spoke less than ``QUIET_S`` ago for a running one without reading its state:
    a worker stopped right after its last answer was handed the next turn (to its free slot), which stalled
    there for as long as the stop lasted while the other worker idled. It is taken back once the worker reads
    as stopped, and runs on the other one, once."""
    async with started_pool(2, prefetch) as pool:
        submit = Submitted(pool)
        results = submit.results
        submit("warm", echo_spec(st, "01WARM", "warm"))
        await wait_until(lambda: "warm" in results, what="the first turn to end")
        stopped = results["warm"].worker.pid  # idle, and the first to take a turn on a tie
        os.kill(stopped, signal.SIGSTOP)
        try:
            submit("next", echo_spec(st, "01NEXT", "next"))
            await wait_until(lambda: "next" in results, timeout=5, what="the turn to run on the other worker")
            assert results["next"].outcome.output == "next" and results["next"].worker.pid != stopped
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        submit("after", echo_spec(st, "01AFTER", "after"))  # the continued worker serves on
        await wait_until(lambda: "after" in results, what="a turn after the stop")
        await anyio.sleep(0.2)
        assert _starts(st, "01NEXT") == 1


async def test_cancelling_a_turn_a_stopped_worker_has_not_started_ends_it_there_and_spares_the_worker(st, tmp_path) -> None:
    """With no other worker to run it, a turn stays where it was handed while its worker is stopped; cancelled,
    it ends unstarted at once. The pool told the worker, which could not act on it, and killed it after the
    cancel grace, and the turn the worker had started died with it (``error``, its log to repair)."""
    gate = tmp_path / "gate"
    async with started_pool(1, 1) as pool:  # cancel_grace_s=1.0
        [pid] = pool.worker_pids()
        submit = Submitted(pool)
        results = submit.results
        submit("long", held_spec(st, "01LONG", gate))
        ticket = pool.submit(echo_spec(st, "01AHEAD", "next"), no_rpc, on_done=lambda r: results.__setitem__("ahead", r))
        await wait_started(st, "01LONG")
        os.kill(pid, signal.SIGSTOP)
        try:
            pool.cancel(ticket, "user")
            await wait_until(lambda: "ahead" in results, timeout=5, what="the cancelled turn to end")
            assert results["ahead"].outcome.diagnostic == "the turn was cancelled (user) before it started"
            assert results["ahead"].worker is None
            await anyio.sleep(1.5)  # past the cancel grace
            assert pool.worker_pids() == [pid] and "long" not in results
        finally:
            gate.touch()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await wait_until(lambda: "long" in results, what="the long turn to end where it started")
        assert (results["long"].outcome.stop_reason, results["long"].crashed) == ("completed", False)
        assert _starts(st, "01AHEAD") == 0


async def test_a_turn_whose_worker_died_before_taking_it_runs_on_the_replacement(st) -> None:
    """A turn handed to a worker's free slot whose worker dies before it takes the turn's token never began
    there (the worker takes the token before it starts a turn): it runs on the replacement, once, instead of
    ending ``error`` as a turn that crashed. Here a pool of one (so nothing takes the turn back from the
    stopped worker first) hands a turn to the worker stopped right after it spoke, then the worker is killed."""
    async with started_pool(1, 0) as pool:
        submit = Submitted(pool)
        results = submit.results
        submit("warm", echo_spec(st, "01WARM", "warm"))
        await wait_until(lambda: "warm" in results, what="the first turn to end")
        worker = results["warm"].worker.pid
        os.kill(worker, signal.SIGSTOP)
        try:
            submit("next", echo_spec(st, "01NEXT", "next"))
            await anyio.sleep(0.2)  # handed over: the worker spoke less than QUIET_S ago, so it reads as running
            assert "next" not in results
        finally:
            os.kill(worker, signal.SIGKILL)
        await wait_until(lambda: "next" in results, what="the turn to end")
        assert (results["next"].outcome.stop_reason, results["next"].outcome.output) == ("completed", "next"), results["next"]
        assert results["next"].worker.pid != worker and _starts(st, "01NEXT") == 1
