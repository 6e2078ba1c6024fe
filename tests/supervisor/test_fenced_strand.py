"""A message a supervisor accepted for a child another process had taken over runs, not left waiting.

Found by a chaos probe: host A, paused past its lease, woke with a ``send`` already waiting for it. The
child was still resident in A, so A accepted the message into the child's mailbox and acknowledged it;
then A learned it had been fenced (host B took the child over, ran its own message and let go) and
dropped the activation. Nobody ran the acknowledged message while both hosts lived: it waited, pending,
until some later send woke the child. A fenced activation's disposal now looks at the mailbox as any
disposal does (one of the two processes sees it), and the message is run where nobody holds the child.
"""

from __future__ import annotations

import os

import anyio
import pytest

from subagents.store import LogWriter, acquire_lease, check_store, new_id, register_owner, release_lease, remove_owner

from ..conftest import said
from .test_continuable import S, continuable_supervisor, start, turn_ends

pytestmark = pytest.mark.anyio


def _take_over_and_let_go(store, child: str, holder: str) -> None:
    """What a second host does once the first one's heartbeat lapsed: take the lease, write, release. The
    first one's owner record is removed to make it read dead at once (a lapse, without waiting a TTL)."""
    os.remove(store.owner_path(holder))
    taker = new_id()
    register_owner(store, taker, ttl=30.0)
    taken = acquire_lease(store, child, taker)
    with LogWriter.open(store, child, epoch=taken.epoch):
        pass
    release_lease(store, child, taker, taken.epoch)
    remove_owner(store, taker)


async def test_a_message_accepted_by_a_host_that_was_taken_over_is_run_once_nobody_holds_the_child(tmp_path) -> None:
    gate = tmp_path / "gate"
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"say": "one"}, {"hold": str(gate)}, {"return": "first"}))
        with anyio.fail_after(30):
            while not said(sup.store, child):
                await anyio.sleep(0.02)
        assert child in sup.continuation.activations, "resident: its turn runs"
        _take_over_and_let_go(sup.store, child, sup.lease_keeper.owner_id)  # its open turn closed "interrupted"
        await sup.followup(root, child, S({"return": "second"}))  # accepted for the stale activation, acknowledged
        gate.touch()  # the stale turn's next write is fenced: the activation is dropped
        with anyio.fail_after(30):
            while turn_ends(sup.store, child) != ["interrupted", "completed"]:
                await anyio.sleep(0.02)
    assert said(sup.store, child) == ["one", "second"]  # the held turn wrote nothing more once fenced
    report = check_store(sup.store.root)
    assert report.clean, str(report)


@pytest.mark.parametrize("effect", [
    {"spawn": {"prompt": S({"return": "job"}), "label": "job", "wait": False}},
    {"start_continuable": {"prompt": S({"return": "helper"}), "label": "helper"}},
    {"report": "stale", "delivery": "wakeup"},
])
async def test_a_turn_whose_lease_was_taken_over_has_no_more_effects_through_its_host(tmp_path, effect) -> None:
    """Found by a probe: host A, stopped past its lease while its child's worker went on, woke with the worker's
    request to spawn a child waiting on the pipe, and served it: a child created under a session another host
    had taken over and settled (``store check``: its settled row said it had no children). A turn's request
    that acts (starts a child, reports, sends, interrupts) is refused once its lease is not its own."""
    gate = tmp_path / "gate"
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"say": "one"}, {"hold": str(gate)}, effect, {"return": "first"}))
        with anyio.fail_after(30):
            while not said(sup.store, child):
                await anyio.sleep(0.02)
        _take_over_and_let_go(sup.store, child, sup.lease_keeper.owner_id)
        gate.touch()  # the worker asks its host to act for a turn that is no longer this host's
        with anyio.fail_after(30):
            while child in sup.continuation.activations:
                await anyio.sleep(0.02)
        assert await sup.list_children(child) == []
        assert "stale" not in [message.content for message in await sup.take_messages(root)]
    report = check_store(sup.store.root)
    assert report.clean, str(report)
