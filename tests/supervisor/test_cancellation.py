"""Cancellation before publication (rolled back, checked on disk) and after (the run ends ``aborted``)."""

from __future__ import annotations

import anyio
import pytest

from subagents.store import read_children
from subagents.supervisor import CancelledBeforeStartError, SubagentRequest

from ..conftest import DEADLINE_S, disk_snapshot, last_turn_end, open_supervisor, said, wait_until

pytestmark = pytest.mark.anyio


class FlipToken:
    """A cancel token that reads unset ``unset_reads`` times, then set: it fires mid-setup, deterministically."""

    def __init__(self, unset_reads: int) -> None:
        self.reads = 0
        self.unset_reads = unset_reads
        self.event = anyio.Event()

    def is_set(self) -> bool:
        self.reads += 1
        if self.reads > self.unset_reads:
            self.event.set()
        return self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


async def test_cancel_already_set_leaves_nothing(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        cancel = anyio.Event()
        cancel.set()
        with pytest.raises(CancelledBeforeStartError) as info:
            await sup.start("echo", SubagentRequest(parent=root, prompt="x"), cancel=cancel)
        assert info.value.code == "CANCELLED"
        assert disk_snapshot(sup.store) == before


async def test_cancel_during_creation_rolls_back(tmp_path):
    """The token fires after the session was written but before publication: the session is deleted."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        events: list[str] = []
        sup.on(None, lambda name, payload: events.append(name))
        sessions_before, _ = disk_snapshot(sup.store)
        token = FlipToken(unset_reads=1)
        with pytest.raises(CancelledBeforeStartError):
            await sup.start("echo", SubagentRequest(parent=root, prompt="x"), cancel=token)
        assert token.reads == 2  # it really was created, then rolled back
        assert disk_snapshot(sup.store)[0] == sessions_before
        assert read_children(sup.store, root.id) == []  # the index entry is tombstoned
        assert await sup.list_children(root.id) == []
        assert events == []  # no subagent/start for an unpublished run
        assert sup.statistics().runs_live == 0


async def test_scope_cancelled_around_start_rolls_back(tmp_path):
    """The caller's cancel scope cancelled while ``start`` runs: the created session is removed, Cancelled propagates."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        sessions_before, _ = disk_snapshot(sup.store)
        reached_end = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            await sup.start("echo", SubagentRequest(parent=root, prompt="x"))
            reached_end = True
        assert scope.cancelled_caught and not reached_end
        assert disk_snapshot(sup.store)[0] == sessions_before
        assert read_children(sup.store, root.id) == []
        assert await sup.list_children(root.id) == []
        # the supervisor is fine afterwards
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="after"))
        assert (await run.result()).output == "after"
        await run.dispose()


async def test_cancel_after_publication_keeps_the_child(tmp_path):
    """After ``start`` returned, cancelling never removes the child: it ends ``aborted`` and stays listed."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        cancel = anyio.Event()
        run = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000", label="kept"), cancel=cancel)
        await wait_until(lambda: said(sup.store, run.id), what="the child to start")
        cancel.set()
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "aborted"
        assert run.id in disk_snapshot(sup.store)[0]
        assert [e.id for e in read_children(sup.store, root.id)] == [run.id]
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "aborted"


async def test_cancel_before_dispatch_on_a_busy_pool(tmp_path):
    """A run cancelled while queued behind another (pool of 1) ends ``aborted`` without running its program."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        busy = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        await wait_until(lambda: said(sup.store, busy.id), what="the first child to occupy the worker")
        queued = await sup.start("echo", SubagentRequest(parent=root, prompt="never"))
        queued.cancel()
        with anyio.fail_after(DEADLINE_S):
            result = await queued.result()
            await queued.dispose()
            await busy.dispose()
        assert result.stop_reason == "aborted"
        assert result.output == ""


async def test_close_disposes_live_runs(tmp_path):
    """Leaving ``Supervisor.open`` cancels and disposes every run still held; their logs end ``aborted``."""
    runs = []
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        root = await sup.open_root()
        for _ in range(2):
            runs.append(await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000")))
        await wait_until(lambda: all(said(sup.store, r.id) for r in runs), what="both children to start")
        st = sup.store
    for run in runs:
        assert run.done
        assert (await run.result()).stop_reason == "aborted"
        assert last_turn_end(st, run.id)["stop_reason"] == "aborted"


async def test_a_dispose_in_a_cancelled_scope_still_forgets_the_run(tmp_path):
    """``try: await run.result() finally: await run.dispose()`` under a deadline, as a request handler
    writes it: the dispose's wait for the cancelled run was a checkpoint, raised before the run was
    forgotten, and the supervisor held every such run (about 7 KB each) until it closed."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        for _ in range(3):
            with anyio.move_on_after(0.05):
                run = await sup.start("script", SubagentRequest(parent=root, prompt='[{"sleep": 20000}]'))
                try:
                    await run.result()
                finally:
                    await run.dispose()
        assert sup.statistics().runs_held == 0
        assert sup.statistics().runs_live == 0
