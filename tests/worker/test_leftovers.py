"""The tasks a program leaves running: only the turn's own are cancelled, and one that ignores it is left."""

from __future__ import annotations

import asyncio
import logging

import pytest

from subagents.worker.leftovers import cancel_leftovers, tracked, untracked


async def _forever() -> None:
    await asyncio.sleep(3600)


async def _stubborn(stopped: asyncio.Event) -> None:
    while not stopped.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            continue  # ignores its cancellation


def test_only_the_tasks_created_inside_the_block_are_cancelled() -> None:
    async def main() -> None:
        outside = asyncio.create_task(_forever())
        with tracked() as owned:
            inside = asyncio.create_task(_forever())
            finished = asyncio.create_task(asyncio.sleep(0))
            await finished
        assert set(owned) == {inside, finished}
        assert await cancel_leftovers(owned, who="turn") == 1
        assert inside.cancelled() and not outside.done()
        outside.cancel()

    asyncio.run(main())


def test_a_task_that_ignores_its_cancellation_is_logged_and_left(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        stopped = asyncio.Event()
        with tracked() as owned:
            task = asyncio.create_task(_stubborn(stopped))
            await asyncio.sleep(0)
        with caplog.at_level(logging.WARNING, logger="subagents.worker.leftovers"):
            assert await cancel_leftovers(owned, who="turn of X", grace_s=0.05) == 1
        assert not task.done()
        stopped.set()
        await task

    asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "turn of X: the program left 1 task(s) running (_stubborn): cancelled",
        "turn of X: 1 task(s) ignored their cancellation for 0.05 s and run on: _stubborn",
    ]


def test_a_task_the_worker_starts_from_a_turns_code_is_not_that_turns() -> None:
    """A parked turn lets the worker start the next waiting turn from its own call: cancelling that as the
    parked turn's leftover killed nested children on a one-worker pool (caught by the suite)."""
    async def main() -> None:
        with tracked() as owned:
            with untracked():
                workers = asyncio.create_task(_forever())
            mine = asyncio.create_task(_forever())
            await asyncio.sleep(0)
        assert set(owned) == {mine}
        assert await cancel_leftovers(owned, who="turn") == 1
        assert mine.cancelled() and not workers.done()
        workers.cancel()

    asyncio.run(main())
