"""A supervisor answers on the event loop that opened it; another loop gets an error, not a silent hang.

Found by a probe: ``sup.start(...)`` awaited from a second ``anyio.run`` (in another thread) never
returned and raised nothing: the supervisor's threads hand results back to the loop that opened it.
"""

from __future__ import annotations

import threading

import anyio
import anyio.from_thread
import pytest

from subagents.supervisor import InvalidRequestError, Provider, SubagentRequest, Supervisor, SupervisorConfig


def test_a_call_from_another_event_loop_is_refused_and_a_portal_still_works(tmp_path) -> None:
    opened: dict[str, object] = {}
    ready, done = threading.Event(), threading.Event()

    async def host() -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
                sup.register_provider(Provider(name="echo", program="echo"))
                opened.update(sup=sup, portal=portal, root=await sup.open_root())
                ready.set()
                await anyio.to_thread.run_sync(done.wait)

    thread = threading.Thread(target=anyio.run, args=(host,), daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "the supervisor did not open"
        sup, portal, root = opened["sup"], opened["portal"], opened["root"]

        async def elsewhere() -> None:
            with anyio.fail_after(20):
                with pytest.raises(InvalidRequestError, match="event loop that opened it"):
                    await sup.start("echo", SubagentRequest(parent=root, prompt="x"))  # type: ignore[attr-defined]

        anyio.run(elsewhere)
        run = portal.call(sup.start, "echo", SubagentRequest(parent=root, prompt="through the portal"))  # type: ignore[attr-defined]
        assert portal.call(run.result).output == "through the portal"  # type: ignore[attr-defined]
        portal.call(run.dispose)  # type: ignore[attr-defined]
    finally:
        done.set()
        thread.join(60)
