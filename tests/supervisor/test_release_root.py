"""``release_root``: a supervisor lets go of a root it opened, without closing.

A probe ran a root per conversation in one long-lived supervisor: every root stayed open until
the supervisor closed (1,000 roots: 1,000 live agents, ~1.4 KB each, and 1,000 held leases, so
``gc`` collected none of their trees). A released root's lease is released, it is no parent here
until it is opened again, and its children are left as they are.
"""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import collect, read_lease, read_mailbox
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, UnauthorizedError

from ..conftest import DEADLINE_S, open_supervisor

pytestmark = pytest.mark.anyio


def S(*actions: dict) -> str:
    return json.dumps({"script": list(actions)})


async def test_a_released_root_is_let_go_and_can_be_opened_again(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="conversation")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cont", label="c", prompt=S({"return": "one"})))
        with anyio.fail_after(DEADLINE_S):
            await sup.wait_for_message(root)
        await sup.release_root(root)

        assert sup.statistics().roots == 0
        assert read_lease(sup.store, root.id).state == "released"
        with pytest.raises(UnauthorizedError):
            await sup.followup(root, child, S({"return": "two"}))
        with pytest.raises(UnauthorizedError):
            await sup.release_root(root)
        # its tree is settled and nobody holds it: gc may take it now, as after a close
        assert [r.id for r in collect(sup.store, older_than_s=0, dry_run=True).collected] == [root.id]

        again = await sup.open_root(id=root.id)
        await sup.followup(again, child, S({"return": "two"}))
        with anyio.fail_after(DEADLINE_S):
            assert "two" in (await sup.wait_for_message(again))[0].content


async def test_a_drained_root_released_and_opened_again_takes_children_again(tmp_path) -> None:
    """A drain keeps a root closed to new children until it is disposed, and roots never were."""
    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="conversation")
        await sup.drain([root])
        await sup.release_root(root)
        again = await sup.open_root(id=root.id)
        await sup.start_continuable(ContinuableSpec(parent=again, provider="cont", label="c", prompt=S({"return": "one"})))


async def test_a_wait_for_message_under_way_ends_when_its_root_is_released_or_the_supervisor_closes(tmp_path) -> None:
    """Found by a probe: a waiter with no timeout checked its root and the supervisor once, at its start, and
    then only looked again when the mailbox moved, which nothing did any more: it polled for good. It now
    ends as a new call would: ``UNAUTHORIZED`` once its root is released, ``SUPERVISOR_CLOSED`` once closed."""
    from subagents.supervisor import SubagentError

    codes: list[str] = []

    async def wait(sup, root) -> None:
        try:
            await sup.wait_for_message(root)
        except SubagentError as exc:
            codes.append(exc.code)

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            async with open_supervisor(tmp_path) as sup:
                released = await sup.open_root(label="released")
                kept = await sup.open_root(label="kept")
                tg.start_soon(wait, sup, released)
                tg.start_soon(wait, sup, kept)
                await anyio.sleep(0.2)
                await sup.release_root(released)
                with anyio.fail_after(5):
                    while not codes:
                        await anyio.sleep(0.01)
                assert codes == ["UNAUTHORIZED"]
    assert codes == ["UNAUTHORIZED", "SUPERVISOR_CLOSED"]


@pytest.mark.parametrize("then", ["released", "reopened", "closed"])
async def test_a_take_under_way_as_its_root_is_let_go_says_so_not_fenced(tmp_path, monkeypatch, then) -> None:
    """Found by a probe: a ``take_messages`` (or a ``wait_for_message``'s take) whose thread had begun as the
    same supervisor released its root raised ``FENCED`` ("was taken over"), which says another supervisor
    took the root: nobody did. It now ends as a new call would: ``UNAUTHORIZED`` once the root is released,
    ``SUPERVISOR_CLOSED`` once the supervisor closed, and a root opened again meanwhile is taken at its new
    epoch (the message waiting there is returned, consumed once)."""
    import threading

    from subagents.supervisor import SubagentError, service

    entered, gate = threading.Event(), threading.Event()
    real = service.LogWriter

    class Gated:
        """``LogWriter`` whose first ``open`` waits, in the take's thread, until the root was let go."""

        @staticmethod
        def open(*args, **kwargs):
            if not entered.is_set():
                entered.set()
                gate.wait(DEADLINE_S)
            return real.open(*args, **kwargs)

    monkeypatch.setattr(service, "LogWriter", Gated)
    outcome: list[object] = []

    async def take(sup, root) -> None:
        try:
            outcome.append([m.content for m in await sup.take_messages(root)])
        except SubagentError as exc:
            outcome.append(exc.code)

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            async with open_supervisor(tmp_path) as sup:
                sup.register_provider(Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True))
                root = await sup.open_root(label="conversation")
                tg.start_soon(take, sup, root)
                await anyio.to_thread.run_sync(entered.wait, DEADLINE_S)
                if then != "closed":
                    await sup.release_root(root)
                if then == "reopened":
                    root = await sup.open_root(id=root.id)
                    await sup.start_continuable(ContinuableSpec(parent=root, provider="cont", label="c", prompt=S({"return": "one"})))
                    while not read_mailbox(sup.store, root.id):  # its settlement notice, waiting in the root's mailbox
                        await anyio.sleep(0.01)
                if then != "closed":
                    gate.set()
                    while not outcome:
                        await anyio.sleep(0.01)
                    if then == "reopened":
                        assert await sup.take_messages(root) == []  # the notice was taken once, by the take under way
            gate.set()
    expected = {"released": "UNAUTHORIZED", "closed": "SUPERVISOR_CLOSED"}.get(then)
    if expected is not None:
        assert outcome == [expected]
    else:
        assert len(outcome) == 1 and isinstance(outcome[0], list) and len(outcome[0]) == 1, outcome
