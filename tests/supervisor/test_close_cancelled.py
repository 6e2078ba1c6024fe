"""A supervisor closed by its caller's cancellation closes as fast as one closed by an error.

``Supervisor.open`` runs its own tasks (the pool's pipe readers among them)
inside the caller's scope. When the caller's deadline fired around the
``async with`` while a one-shot child ran, those readers were cancelled
first: the shielded close then waited for workers' answers nobody read, out
to its bounds (``cancel_grace_s + 10`` s: 16 s with a grace of 6 s), against
0.02 s when the body raised. The readers now outlive the caller's
cancellation until the close has the workers' last answers.
"""

from __future__ import annotations

import json
import time

import anyio
import pytest

from subagents.store import check_store
from subagents.supervisor import SubagentRequest

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio

GRACE_S = 6.0


async def test_a_cancelled_caller_closes_the_supervisor_without_waiting_out_its_bounds(tmp_path):
    left = None
    with anyio.move_on_after(30) as outer:  # the caller's deadline
        async with open_supervisor(tmp_path, cancel_grace_s=GRACE_S) as sup:
            root = await sup.open_root()
            run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps({"script": [{"sleep": 60_000}]})))
            await anyio.sleep(0.3)  # its turn runs in the worker
            try:
                outer.cancel()
                await run.result()
            finally:
                left = time.monotonic()
    closed_in = time.monotonic() - left
    assert closed_in < GRACE_S, f"the close took {closed_in:.2f} s"
    assert not check_store(tmp_path / "store").violations


async def test_calls_after_close_say_the_supervisor_is_closed(tmp_path):
    """``take_messages`` and ``wait_for_message`` said ``FENCED`` (the root's lease was released at close);
    ``interrupt`` and the drains went on as if it were open, and the listings still read the store."""
    from subagents.supervisor import SubagentError, UserAuthority

    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
    calls = [
        sup.take_messages(root), sup.wait_for_message(root, timeout_s=0.1), sup.interrupt(root.id, authority=UserAuthority(root.id)),
        sup.drain([root]), sup.drain_remote(root), sup.drain_children(root, []),
        sup.list_children(root.id), sup.list_descendants(root.id),
    ]
    for call in calls:
        with pytest.raises(SubagentError) as caught:
            await call
        assert caught.value.code == "SUPERVISOR_CLOSED"


async def test_a_close_right_after_a_worker_died_does_not_wait_for_its_replacement_forever(tmp_path):
    """Found by a probe (half the runs of a program that killed its worker hung at close): the dead worker's
    replacement was started after the close had listed the workers it shuts down, and nobody shut it down:
    its pipe reader kept the supervisor's task group open for good. The close is bounded again."""
    from subagents.supervisor import SubagentRequest

    for attempt in range(12):
        with anyio.fail_after(30):
            async with open_supervisor(tmp_path / str(attempt), pool_size=1, durability="batched") as sup:
                root = await sup.open_root()
                run = await sup.start("script", SubagentRequest(parent=root, prompt='{"script": [{"exit": 3}]}'))
                assert (await run.result()).stop_reason == "error"
            # leaving the block is the close: it returned
