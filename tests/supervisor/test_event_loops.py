"""A supervisor answers on the event loop that opened it; another loop gets an error, not a silent hang.

Found by a probe: ``sup.start(...)`` awaited from a second ``anyio.run`` (in another thread) never
returned and raised nothing: the supervisor's threads hand results back to the loop that opened it.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import anyio
import anyio.from_thread
import pytest

from subagents.supervisor import InvalidRequestError, Provider, SubagentRequest, Supervisor, SupervisorConfig


@contextlib.contextmanager
def hosted_in_a_thread(store: Path, config: SupervisorConfig, setup: Callable[[Supervisor], Awaitable[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """A supervisor open in a thread of its own, on its loop, behind a portal: what ``setup`` made, with
    ``sup`` and ``portal``, until the block ends."""
    opened: dict[str, Any] = {}
    ready, done = threading.Event(), threading.Event()

    async def host() -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            async with Supervisor.open(store=store, config=config) as sup:
                opened.update(await setup(sup), sup=sup, portal=portal)
                ready.set()
                await anyio.to_thread.run_sync(done.wait)

    thread = threading.Thread(target=anyio.run, args=(host,), daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "the supervisor did not open"
        yield opened
    finally:
        done.set()
        thread.join(60)


def test_a_call_from_another_event_loop_is_refused_and_a_portal_still_works(tmp_path) -> None:
    async def setup(sup: Supervisor) -> dict[str, Any]:
        sup.register_provider(Provider(name="echo", program="echo"))
        return {"root": await sup.open_root()}

    with hosted_in_a_thread(tmp_path / "st", SupervisorConfig(pool_size=1, durability="none"), setup) as opened:
        sup, portal, root = opened["sup"], opened["portal"], opened["root"]

        async def elsewhere() -> None:
            with anyio.fail_after(20):
                with pytest.raises(InvalidRequestError, match="event loop that opened it"):
                    await sup.start("echo", SubagentRequest(parent=root, prompt="x"))

        anyio.run(elsewhere)
        run = portal.call(sup.start, "echo", SubagentRequest(parent=root, prompt="through the portal"))
        assert portal.call(run.result).output == "through the portal"
        portal.call(run.dispose)


def test_a_run_cancelled_from_a_plain_thread_stops_and_its_result_is_refused_on_another_loop(tmp_path) -> None:
    """Found by a probe: ``run.cancel()`` (a plain ``def``, as a UI thread calls it) from a thread raised anyio's
    ``NoEventLoopError`` after it had marked the run cancelled, so the worker kill after ``cancel_grace_s`` was
    never armed and no later cancel did anything; ``run.result()`` awaited on another loop waited in silence.
    A cancel from a thread is handed to the supervisor's loop; ``result`` and ``dispose`` elsewhere are refused."""

    async def setup(sup: Supervisor) -> dict[str, Any]:
        sup.register_provider(Provider(name="script", program="script"))
        root = await sup.open_root()
        return {"run": await sup.start("script", SubagentRequest(parent=root, prompt='{"script": [{"spin": 60000}]}'))}

    config = SupervisorConfig(pool_size=1, durability="none", cancel_grace_s=1.0)
    with hosted_in_a_thread(tmp_path / "st", config, setup) as opened:
        portal, run = opened["portal"], opened["run"]

        async def elsewhere() -> None:
            with anyio.fail_after(20):
                with pytest.raises(InvalidRequestError, match="event loop that opened it"):
                    await run.result()
                with pytest.raises(InvalidRequestError, match="event loop that opened it"):
                    await run.dispose()

        anyio.run(elsewhere)

        async def cancel_from_a_thread_the_loop_joins() -> None:
            stopper = threading.Thread(target=run.cancel, args=("user pressed stop",))
            stopper.start()
            stopper.join(20)  # blocking the loop, as a careless UI does: a cancel that waited for the loop deadlocked
            assert not stopper.is_alive()

        portal.call(cancel_from_a_thread_the_loop_joins)

        async def bounded_result() -> Any:
            with anyio.fail_after(30):  # the worker is killed cancel_grace_s after the cancel: it ignores it
                return await run.result()

        result = portal.call(bounded_result)
        assert result.stop_reason == "aborted", result
        assert run.cancelled == "user pressed stop"
        portal.call(run.dispose)


def test_trio_is_refused_where_the_supervisor_opens_before_anything_is_made(tmp_path) -> None:
    """Found by a probe: under trio ``Supervisor.open`` and ``open_root`` worked, then every ``start`` failed with a
    bare ``RuntimeError: no running event loop`` (the worker pool runs on asyncio). Refused at ``open`` now, with
    a code and what to do, before the store is made."""
    from subagents.supervisor import SubagentError

    async def main() -> None:
        async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1)):
            raise AssertionError("opened under trio")

    with pytest.raises(SubagentError) as caught:
        anyio.run(main, backend="trio")
    assert caught.value.code == "INVALID_REQUEST" and 'backend="asyncio"' in caught.value.message, caught.value
    assert not (tmp_path / "st").exists()


def test_a_cancel_from_a_thread_as_the_loop_closes_says_supervisor_closed(recwarn) -> None:
    """Found by a probe (a thread calling ``run.cancel()`` while the host's ``anyio.run`` ended): the loop
    closed between ``on_loop``'s look (``is_closed``) and its hand-over, and the cancel raised asyncio's bare
    ``RuntimeError: Event loop is closed``, with a ``coroutine '_called' was never awaited`` warning. It is
    ``SUPERVISOR_CLOSED``, as for a loop already closed, and leaves no coroutine behind."""
    import asyncio
    import gc

    from subagents.supervisor import SupervisorClosedError
    from subagents.supervisor.event_loop import on_loop

    closed = asyncio.new_event_loop()
    closed.close()

    class ClosingAsItIsLookedAt:
        """A loop that was still open when first looked at, and closed before the hand-over."""

        looks = 0

        def is_closed(self) -> bool:
            self.looks += 1
            return self.looks > 1

        def call_soon_threadsafe(self, *args: Any, **kwargs: Any) -> Any:
            return closed.call_soon_threadsafe(*args, **kwargs)

    token = anyio.lowlevel.EventLoopToken(type(None), ClosingAsItIsLookedAt())  # type: ignore[arg-type]
    called: list[str] = []
    with pytest.raises(SupervisorClosedError):
        on_loop(token, called.append, "never")
    gc.collect()
    assert called == []
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
