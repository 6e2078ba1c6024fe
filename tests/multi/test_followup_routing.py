"""``followup`` from the root's own supervisor while another supervisor hosts the child (issue 13, item 5).

One rule for ``followup`` and ``send``: when a live other supervisor holds
the child's lease, the message is accepted into the child's durable mailbox
and that supervisor runs it; nothing is refused as ``NOT_RESUMABLE``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from subagents.store import inspect, read_lease, read_mailbox
from subagents.supervisor import AgentRef, Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig, UserAuthority

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A second supervisor takes the settled child over with a ``send`` whose turn sleeps.
ADOPTER = textwrap.dedent(
    """
    import json, sys, anyio
    from subagents.supervisor import *

    async def main(store, root, child):
        cfg = SupervisorConfig(pool_size=1, durability="none", control_poll_s=0.02)
        async with Supervisor.open(store=store, config=cfg) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            await sup.send(child, json.dumps({"script": [{"sleep": 60000}]}), parent=root)
            print("hosting", flush=True)
            await anyio.sleep(3600)

    anyio.run(main, *sys.argv[1:4])
    """
)


def S(*actions) -> str:
    return json.dumps({"script": list(actions)})


async def _until(predicate, timeout_s: float = 30.0):
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.02)


def _ends(store, child):
    return [(e["epoch"], e["data"]["stop_reason"]) for e in inspect(store, child).events if e["type"] == "turn/end"]


@asynccontextmanager
async def adopted_child(tmp_path) -> AsyncIterator[tuple[Supervisor, AgentRef, str]]:
    """A supervisor with a root and a settled continuable child, which another supervisor (a process) then
    takes over with a ``send`` whose turn sleeps: (this supervisor, the root, the child)."""
    store_path = str(tmp_path / "st")
    cfg = SupervisorConfig(pool_size=1, durability="none", control_poll_s=0.02)
    async with Supervisor.open(store=store_path, config=cfg) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="own")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=S({"return": "one"}), label="c"))
        await sup.wait_for_message(root, timeout_s=30)  # settled: its lease is released
        env = {**os.environ, "PYTHONPATH": REPO}
        adopter = subprocess.Popen([sys.executable, "-c", ADOPTER, store_path, root.id, child], stdout=subprocess.PIPE,
                                   text=True, env=env, cwd=REPO)
        try:
            assert adopter.stdout.readline().strip() == "hosting"
            yield sup, root, child
        finally:
            adopter.kill()
            adopter.wait(10)


@pytest.mark.anyio
async def test_followup_reaches_a_child_hosted_by_another_supervisor(tmp_path) -> None:
    async with adopted_child(tmp_path) as (sup, root, child):
        await _until(lambda: len([e for e in inspect(sup.store, child).events if e["type"] == "turn/start"]) == 2)
        other = read_lease(sup.store, child).owner
        assert other != sup.runtime.owner_id

        message_id = await sup.followup(root, child, S({"return": "routed"}))
        assert message_id in [m.id for m in read_mailbox(sup.store, child)]  # durable before the ack
        await sup.interrupt(child, authority=UserAuthority(parent_session=root.id))
        await _until(lambda: _ends(sup.store, child)[-1:] == [(2, "completed")])
        assert _ends(sup.store, child) == [(1, "completed"), (2, "aborted"), (2, "completed")]
        assert read_lease(sup.store, child).owner == other  # the other supervisor ran it


@pytest.mark.anyio
async def test_a_send_routed_to_another_host_is_acknowledged_exactly_when_accepted_under_cancellation(tmp_path) -> None:
    """Found by a probe: a ``send`` (or ``followup``) cancelled right after the message was durably accepted into
    the mailbox of a child another supervisor hosts raised the cancellation, with no id, while the message ran:
    a caller that retried ran it twice. Cancelled at any instant, a send now either returns the id of an accepted
    message or accepted none."""
    async with adopted_child(tmp_path) as (sup, root, child):
        acked: set[str] = set()
        for n in range(1, 61):  # deadlines of 0.1 to 6 ms: before, at and after the acceptance
            with anyio.move_on_after(n / 10_000):
                acked.add(await sup.send(child, S({"return": f"m{n}"}), parent=root.id))
        held = [m.id for m in read_mailbox(sup.store, child)]
        # every message the mailbox holds beside the two of the set-up (its first prompt, the taker's) was acknowledged
        assert set(held[2:]) == acked, f"{len(set(held[2:]) - acked)} accepted but not acknowledged"
