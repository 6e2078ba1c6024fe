"""The processes a program starts end with its worker: at the supervisor's close, and when a worker is killed
for a turn that ignored its cancellation (when its program exits the worker, on both pools:
``tests/ray/test_pool_process_state.py``).

Found by a probe of misbehaving programs: a ``subprocess.Popen(["sleep", "1000"])`` left running by a
program, or one a plain ``def`` program waited on when its turn was interrupted, outlived its turn, its
worker and the supervisor's close, reparented to init, for good.
"""

from __future__ import annotations


import anyio
import pytest

from subagents.supervisor import Provider, SubagentRequest, UserAuthority

from ..conftest import DEADLINE_S, HELPERS, kill_leftover_sleeps, live_processes, open_supervisor, said, still_running, wait_until

pytestmark = pytest.mark.anyio


def _descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them, running now."""
    table = live_processes()
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
            todo.extend(child for child, process in table.items() if process.ppid == pid)
    return found


async def test_a_process_left_running_by_a_program_ends_at_the_supervisors_close(tmp_path) -> None:
    started: list[int] = []
    try:
        async with open_supervisor(tmp_path, pool_size=1) as sup:
            sup.register_provider(Provider(name="starts", program=f"{HELPERS}:starts_a_process_and_returns"))
            root = await sup.open_root()
            run = await sup.start("starts", SubagentRequest(parent=root, prompt="go"))
            with anyio.fail_after(DEADLINE_S):
                assert (await run.result()).stop_reason == "completed"
            await run.dispose()
            pids = [int(pid) for pid in said(sup.store, run.id)[0].split()]
            started = pids
            # the sleep, the shell and, once the shell has forked it, the shell's sleep
            started = await wait_until(lambda: _descendants(pids) if len(_descendants(pids)) == 3 else None, what="three processes")
            assert sorted(still_running(started, within=0)) == sorted(started), "ended with the turn, not with its worker"
        assert not still_running(started), "left running after the supervisor closed"
    finally:
        kill_leftover_sleeps(started)


async def test_a_process_a_cancelled_program_waits_on_ends_when_its_worker_is_killed(tmp_path) -> None:
    started: list[int] = []
    try:
        async with open_supervisor(tmp_path, pool_size=1, cancel_grace_s=0.3) as sup:
            sup.register_provider(Provider(name="waits", program=f"{HELPERS}:waits_on_a_process"))
            root = await sup.open_root()
            run = await sup.start("waits", SubagentRequest(parent=root, prompt="go"))
            said_pid = await wait_until(lambda: said(sup.store, run.id), what="the sleep's pid")
            started = [int(said_pid[0])]
            outcome = await sup.interrupt(run.id, authority=UserAuthority(parent_session=root.id))
            assert outcome.outcome == "cancelled"
            with anyio.fail_after(DEADLINE_S):
                result = await run.result()
            assert result.stop_reason == "aborted" and "killed by signal SIGKILL" in result.diagnostic, result
            assert not still_running(started), "left running after its worker was killed"
            await run.dispose()
    finally:
        kill_leftover_sleeps(started)
