"""``drain`` and ``drain_children``: teardown below a parent, child-first, admission closed.

``drain(roots)`` stops every continuable descendant of the roots, discards
their pending mailboxes (``message/discarded``), closes admission below the
roots (``DRAINING``) and leaves unrelated forests alone. ``drain_children``
disposes only the selected direct children and keeps admission open.
"""

from __future__ import annotations

import os
import time

import anyio
import pytest

from subagents.store import Store, read_lease, read_mailbox
from subagents.supervisor import SubagentError, UserAuthority

from ..conftest import DEADLINE_S, disk_snapshot, events_of, said, wait_until
from .test_continuable import (
    S,
    accepted_ids,
    continuable_supervisor,
    is_notice,
    only_child_of,
    record_ends,
    settled,
    settled_all,
    start,
    turn_ends,
    turn_started,
)

pytestmark = pytest.mark.anyio

SLEEP = S({"say": "awake"}, {"sleep": 60_000})


async def sleeping(sup, parent, **spec) -> str:
    child_id, _ = await start(sup, parent, SLEEP, **spec)
    await turn_started(sup, child_id)
    return child_id


def discarded(st, session_id) -> list[str]:
    return [e["data"]["message_id"] for e in events_of(st, session_id) if e["type"] == "message/discarded"]


async def left_by_a_closed_host(tmp_path) -> tuple[str, str, str, str]:
    """A root whose host closed, leaving a child whose turn was running with a followup queued behind
    it, and a child that settled: the root's id, the first child, its queued message, the second."""
    async with continuable_supervisor(tmp_path) as host:
        root = await host.open_root(label="host")
        running = await sleeping(host, root)
        queued = await host.followup(root, running, S({"return": "queued"}))
        done, _ = await start(host, root, S({"return": "done"}))
        await settled(host, root, done)
    return root.id, running, queued, done


async def draining(call) -> str:
    with pytest.raises(SubagentError) as caught:
        await call
    assert caught.value.code == "DRAINING"
    return str(caught.value)


async def test_drain_stops_descendants_and_closes_admission_below_the_root(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root, other = await sup.open_root(), await sup.open_root()
        c1 = await sleeping(sup, root)
        c2 = await sleeping(sup, root)
        queued = await sup.followup(root, c2, S({"return": "never runs"}))
        unrelated, _ = await start(sup, other, SLEEP)  # queued: both workers are busy

        await sup.drain([root])

        assert c1 not in sup.continuation.activations and c2 not in sup.continuation.activations
        assert turn_ends(sup.store, c1) == ["aborted"] and turn_ends(sup.store, c2) == ["aborted"]
        assert discarded(sup.store, c2) == [queued]
        # who dropped it, as a drain of a child nobody hosts says (found by a docs probe: a host's own drain said nothing)
        assert [e["data"].get("cause") for e in events_of(sup.store, c2) if e["type"] == "message/discarded"] == ["drain"]
        assert read_lease(sup.store, c1).state == "released"
        assert {e.id: e.status for e in await sup.list_children(root.id)} == {c1: "complete", c2: "complete"}
        notices = await settled_all(sup, root, [c1, c2])
        for child_id, notice in notices.items():
            assert notice.content == f"Background subagent {child_id} was stopped before it finished.\nIts closing message:\nawake"
            assert notice.wake is False  # the parent's lineage is closing: delivered quiet
        assert sorted(e["id"] for e in ends) == sorted([c1, c2])

        before = disk_snapshot(sup.store)
        expected = f'continuable subagents below parent "{root.id}" are draining; the operation was not admitted'
        assert await draining(start(sup, root, S({"return": "x"}))) == expected
        assert await draining(sup.followup(root, c1, S({"return": "x"}))) == expected
        assert disk_snapshot(sup.store) == before

        # the unrelated forest keeps working: its turn takes a freed worker
        assert unrelated in sup.continuation.activations
        await turn_started(sup, unrelated)
        await sup.followup(other, unrelated, S({"return": "still here"}))
        await sup.interrupt(unrelated, authority=UserAuthority(other.id))
        notice, _ = await settled(sup, other, unrelated)
        assert notice.content.endswith("Its closing message:\nstill here")
        fresh, _ = await start(sup, other, S({"return": "new"}))
        await settled(sup, other, fresh)


async def test_drain_is_child_first_and_top_down(tmp_path):
    """A grandchild is disposed before its parent; the grandchild's notice reaches the closing parent
    quiet and is discarded with the rest of its mailbox."""
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        child_id, _ = await start(
            sup, root,
            S({"start_continuable": {"prompt": SLEEP, "label": "g", "provider": "script"}}, {"sleep": 60_000}),
            provider="nest",
        )
        grand_id = await only_child_of(sup, child_id)
        await turn_started(sup, grand_id)

        await sup.drain([root])

        assert [e["id"] for e in ends] == [grand_id, child_id]
        assert [e["stop_reason"] for e in ends] == ["aborted", "aborted"]
        assert turn_ends(sup.store, grand_id) == ["aborted"] and turn_ends(sup.store, child_id) == ["aborted"]
        [grand_notice] = [m for m in read_mailbox(sup.store, child_id) if m.source.get("kind") == "subagent-settled"]
        assert grand_notice.wake is False
        assert grand_notice.content.startswith(f"Background subagent {grand_id} was stopped before it finished.")
        assert discarded(sup.store, child_id) == [grand_notice.id]
        assert sup.continuation.activations == {}
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.startswith(f"Background subagent {child_id} was stopped before it finished.")


async def test_a_parent_waits_for_its_childs_settlement_notice_before_discarding_its_mailbox(tmp_path, monkeypatch):
    """The grandchild leaves the table before its notice is accepted. The child, whose turn ends
    later (it ignores the cancel for a while), must still wait for that notice, so the notice is
    discarded with the child's mailbox instead of landing after the child's disposal read it."""
    import subagents.supervisor.continuable.delivery as delivery

    real_accept = delivery.accept

    def slow_notice(store, recipient, *, source, **kwargs):
        if source.get("kind") == "subagent-settled" and source.get("sender_session_id") == grand_id:
            time.sleep(2.0)  # holds the grandchild between leaving the table and its notice landing
        return real_accept(store, recipient, source=source, **kwargs)

    monkeypatch.setattr(delivery, "accept", slow_notice)
    gate = tmp_path / "gate"
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        child_id, _ = await start(
            sup, root,
            S({"start_continuable": {"prompt": SLEEP, "label": "g", "provider": "script"}},
              {"hold": str(gate)}, {"say": "spinning"}, {"spin": 800}, {"sleep": 60_000}),
            provider="nest",
        )
        grand_id = await only_child_of(sup, child_id)
        await turn_started(sup, grand_id)
        gate.touch()
        await wait_until(lambda: "spinning" in said(sup.store, child_id), what="the child to spin")

        await sup.drain([root])

        assert [e["id"] for e in ends] == [grand_id, child_id]
        [grand_notice] = [m for m in read_mailbox(sup.store, child_id) if m.source.get("kind") == "subagent-settled"]
        assert discarded(sup.store, child_id) == [grand_notice.id]


async def test_drain_children_disposes_only_the_selected_child(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        c1 = await sleeping(sup, root)
        c2 = await sleeping(sup, root)
        first = accepted_ids(sup.store, c1)
        queued = await sup.followup(root, c1, S({"return": "dropped"}))

        await sup.drain_children(root, [c1, c1, "01UNKNOWNCHILD"])

        assert c1 not in sup.continuation.activations
        assert c2 in sup.continuation.activations and turn_ends(sup.store, c2) == []
        assert discarded(sup.store, c1) == [queued]
        notice, _ = await settled(sup, root, c1)
        assert notice.content.startswith(f"Background subagent {c1} was stopped before it finished.")
        assert notice.wake is True  # the parent is not closing

        # admission stays open: the drained child resumes, its discarded message stays consumed
        again = await sup.followup(root, c1, S({"return": "back"}))
        notice, _ = await settled(sup, root, c1)
        assert notice.content.endswith("Its closing message:\nback")
        assert accepted_ids(sup.store, c1) == first + [again]
        fresh, _ = await start(sup, root, S({"return": "new"}))
        await settled(sup, root, fresh)
        await sup.interrupt(c2, authority=UserAuthority(root.id))
        await settled(sup, root, c2)


async def test_drain_children_authority(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root, other = await sup.open_root(), await sup.open_root()
        child_id = await sleeping(sup, root)
        with pytest.raises(SubagentError) as caught:
            await sup.drain_children("01NOTLIVEPARENT", [child_id])
        assert (caught.value.code, str(caught.value)) == ("UNAUTHORIZED", "selected child teardown requires the exact live parent agent")
        with pytest.raises(SubagentError) as caught:
            await sup.drain_children(other, [child_id])
        assert (caught.value.code, str(caught.value)) == (
            "UNAUTHORIZED", f'subagent "{child_id}" is not a direct child of agent "{other.id}"'
        )
        assert child_id in sup.continuation.activations and turn_ends(sup.store, child_id) == []
        await sup.drain_children(other, ["01UNKNOWNCHILD"])  # not resident: skipped
        await sup.drain_children(root, [child_id])
        assert child_id not in sup.continuation.activations


async def test_concurrent_drains_converge(tmp_path):
    """Two drains of one root (and a selected teardown among them) dispose each child exactly once."""
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        children = [await sleeping(sup, root) for _ in range(2)]
        waiting, prompt = await start(sup, root, SLEEP)  # queued behind the two busy workers
        children.append(waiting)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.drain, [root])
                tg.start_soon(sup.drain, [root])
                tg.start_soon(sup.drain_children, root, [children[0]])
        assert sorted(e["id"] for e in ends) == sorted(children)
        assert sup.continuation.activations == {}
        for child_id in children[:2]:
            assert turn_ends(sup.store, child_id) == ["aborted"]
        assert turn_ends(sup.store, waiting) == [] and discarded(sup.store, waiting) == [prompt]
        taken = await sup.take_messages(root)
        senders = [m.source["sender_session_id"] for m in taken if m.source.get("kind") == "subagent-settled"]
        assert sorted(senders) == sorted(children)


async def test_drain_of_a_root_without_children_still_closes_admission(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        await sup.drain([root])
        await draining(start(sup, root, S({"return": "x"})))


async def test_a_start_racing_a_drain_is_either_rolled_back_or_drained(tmp_path):
    """Whatever the interleaving, nothing below the root survives the drain."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        outcome: list[object] = []

        async def racing_start() -> None:
            try:
                outcome.append(await start(sup, root, SLEEP))
            except SubagentError as exc:
                outcome.append(exc.code)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(racing_start)
                await anyio.lowlevel.checkpoint()
                tg.start_soon(sup.drain, [root])
        [result] = outcome
        if result == "DRAINING":
            assert await sup.list_children(root.id) == []
        else:
            child_id, _ = result
            await wait_until(lambda: child_id not in sup.continuation.activations, what="the started child to be drained")
            assert read_lease(sup.store, child_id).state == "released"
        assert sup.continuation.activations == {}


async def test_admission_below_a_drained_continuable_parent_reopens_once_it_is_disposed(tmp_path):
    """A drained parent keeps admission closed below it only while it lives: once disposed, a
    resumed activation of it may start children again (the drained set no longer only grows)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        parent, _ = await start(sup, root, SLEEP)
        await turn_started(sup, parent)
        await sup.drain([parent])
        await draining(start(sup, parent, S({"return": "x"})))
        await sup.interrupt(parent, authority=UserAuthority(parent_session=root.id))
        await settled(sup, root, parent)
        await wait_until(lambda: parent not in sup.continuation.activations, what="the drained parent to be disposed")
        await sup.followup(root, parent, SLEEP)  # a cold resume: a new activation of the same child
        child, _ = await start(sup, parent, S({"return": "admitted again"}))
        await wait_until(lambda: turn_ends(sup.store, child) == ["completed"], what="the new child's turn")


# -- children this supervisor does not host ------------------------------------------------------


async def test_drain_children_discards_what_a_closed_host_left_pending(tmp_path):
    """A child nobody hosts (its host closed with two followups queued) is drained here: its pending
    messages are discarded, so a later resume_pending runs none of them. Before, a non-resident child
    was skipped in silence and the "drained" work ran at the next resume."""
    async with continuable_supervisor(tmp_path) as first:
        root = await first.open_root(label="host")
        child = await sleeping(first, root)
        queued = [await first.followup(root, child, S({"return": f"m{n}"})) for n in (1, 2)]
        root_id = root.id
    async with continuable_supervisor(tmp_path) as second:
        root = await second.open_root(id=root_id)
        await second.drain_children(root, [child])
        assert discarded(second.store, child) == queued
        assert await second.resume_pending(root) == []
        assert said(second.store, child) == ["awake"]  # neither m1 nor m2 ever ran


async def test_drain_children_asks_the_host_of_a_child_hosted_elsewhere(tmp_path):
    """A child another supervisor hosts (its send resumed it there) gets a durable drain request and is
    torn down by its host: its turn stopped, its queued message discarded."""
    async with continuable_supervisor(tmp_path) as holder, continuable_supervisor(tmp_path) as other:
        root = await holder.open_root(label="host")
        child, _ = await start(holder, root, S({"return": "first"}))
        await settled(holder, root, child)
        await other.send(child, SLEEP, parent=root.id)  # cold-resumed in ``other``
        await turn_started(other, child, 2)
        queued = await other.send(child, S({"return": "never"}), parent=root.id)
        await holder.drain_children(root, [child])
        await wait_until(lambda: child not in other.continuation.activations, what="the host to drain the child")
        assert discarded(holder.store, child) == [queued]
        assert turn_ends(holder.store, child) == ["completed", "aborted"]
        assert read_lease(holder.store, child).state == "released"


async def test_drain_children_refuses_a_non_resident_child_of_another_parent(tmp_path):
    """Reaching children this supervisor does not host keeps the rule for resident ones: a child of
    another parent is UNAUTHORIZED, before anything is drained."""
    async with continuable_supervisor(tmp_path) as first:
        root, other = await first.open_root(label="a"), await first.open_root(label="b")
        child = await sleeping(first, root)
        await first.followup(root, child, S({"return": "m"}))
        ids = root.id, other.id
    async with continuable_supervisor(tmp_path) as second:
        root, other = await second.open_root(id=ids[0]), await second.open_root(id=ids[1])
        before = disk_snapshot(second.store)
        with pytest.raises(SubagentError) as caught:
            await second.drain_children(other, [child])
        assert (caught.value.code, str(caught.value)) == (
            "UNAUTHORIZED", f'subagent "{child}" is not a direct child of agent "{other.id}"'
        )
        assert disk_snapshot(second.store) == before
        assert discarded(second.store, child) == []
        await second.take_messages(root)  # the notice of the turn the close stopped
        assert await second.resume_pending(root) == [child]
        await settled(second, root, child)
        assert said(second.store, child) == ["awake", "m"]  # the queued message ran: nothing was drained


async def test_drain_reaches_descendants_hosted_elsewhere_and_nowhere(tmp_path):
    """``drain(roots)`` tears down the root's continuable descendants wherever they are: one another
    supervisor hosts gets a drain request; one nobody hosts has its pending messages discarded here."""
    root_id, left, left_queued, moved = await left_by_a_closed_host(tmp_path)
    async with continuable_supervisor(tmp_path) as holder, continuable_supervisor(tmp_path) as other:
        root = await holder.open_root(id=root_id)
        await other.send(moved, SLEEP, parent=root_id)
        await turn_started(other, moved, 2)
        await holder.drain([root])
        await wait_until(lambda: moved not in other.continuation.activations, what="the host to drain its child")
        assert turn_ends(holder.store, moved) == ["completed", "aborted"]
        assert discarded(holder.store, left) == [left_queued]
        assert await holder.resume_pending(root) == []


@pytest.mark.parametrize("call", ["drain", "drain_remote", "drain_children"])
async def test_a_drain_that_cannot_reach_a_damaged_child_drains_the_rest_then_says_which(tmp_path, call):
    """Found by a probe: a continuable child whose mailbox no longer reads (a folder in its place) was
    only logged by the library's drains, which returned as if all were torn down (``subagents drain``
    alone named it and exited 1). Now each drain does all it can, then raises ``ACTIVATION_TEARDOWN_FAILED``
    naming the child and why, as the reference's drain does after every branch settled."""
    root_id, fine, queued, broken = await left_by_a_closed_host(tmp_path)
    mailbox = Store(tmp_path / "store", create=False).path(broken, "mailbox")
    os.replace(mailbox, mailbox + ".kept")
    os.mkdir(mailbox)
    async with continuable_supervisor(tmp_path) as second:
        root = await second.open_root(id=root_id)
        with pytest.raises(SubagentError) as caught:
            if call == "drain":
                await second.drain([root])
            elif call == "drain_remote":
                await second.drain_remote(root)
            else:
                await second.drain_children(root, [fine, broken])
        error = caught.value
        assert error.code == "ACTIVATION_TEARDOWN_FAILED", error
        scope = "selected" if call == "drain_children" else "scoped"
        assert error.message.startswith(f'continuable subagent teardown failed for 1 {scope} activation(s): subagent "{broken}" '
                                        "activation teardown failed: SESSION_UNAVAILABLE: "), error.message
        assert list(error.failed) == [broken]
        assert discarded(second.store, fine) == [queued]  # the rest was drained before the error
        if call == "drain_remote":
            assert error.reached == [fine]


async def test_a_drain_drops_every_followup_acknowledged_as_it_began(tmp_path):
    """Found by a probe: followups accepted while a drain began (their acceptance in flight as the activation
    was torn down) were acknowledged, then neither run nor logged ``message/discarded``: left pending, they ran
    when a later host resumed the drained child. Each acknowledged one is now dropped with the rest."""
    async with continuable_supervisor(tmp_path) as sup:
        for _ in range(5):
            root = await sup.open_root()
            child = await sleeping(sup, root)
            acked: list[str] = []

            async def send(i: int) -> None:
                try:
                    acked.append(await sup.followup(root, child, S({"return": f"f{i}"})))
                except SubagentError as exc:
                    assert exc.code in ("DRAINING", "ACTIVATION_CLOSING"), exc

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(send, i)
                await anyio.sleep(0)
                await sup.drain([root])
            assert acked, "no followup was acknowledged: the race was not run"
            left = {m.id for m in read_mailbox(sup.store, child)} - set(discarded(sup.store, child)) - set(accepted_ids(sup.store, child))
            assert not set(acked) & left, f"{len(set(acked) & left)} acknowledged followups left pending by the drain"


async def test_a_call_made_in_a_scope_already_cancelled_does_nothing(tmp_path):
    """Found by a probe: ``followup`` under a scope already cancelled accepted the message (and returned its id
    to nobody), and ``drain`` tore the tree down, then raised the cancellation. anyio's convention, which the
    other calls keep: a call in a cancelled scope has no effect."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child = await sleeping(sup, root)
        before = [m.id for m in read_mailbox(sup.store, child)]
        calls = [
            lambda: sup.followup(root, child, S({"return": "never"})),
            lambda: sup.send(child, S({"return": "never"}), parent=root.id),
            lambda: sup.drain([root]),
            lambda: sup.drain_children(root, [child]),
            lambda: sup.drain_remote(root),
            lambda: sup.interrupt(child, authority=UserAuthority(parent_session=root.id)),
        ]
        for call in calls:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await call()
            assert scope.cancelled_caught
        assert [m.id for m in read_mailbox(sup.store, child)] == before
        assert child in sup.continuation.activations and turn_ends(sup.store, child) == []  # still running its first turn


async def drain_beside_a_followup(sup, root, child: str, call: str, first, prompt: str) -> dict[str, object]:
    """``call`` (``drain_children`` of ``child``, or ``drain_remote`` of ``root``) and, once ``first()`` returns,
    a followup of ``child`` with ``prompt``, at once: their answers."""
    answers: dict[str, object] = {}

    async def drain() -> None:
        answers["drain"] = await (sup.drain_children(root, [child]) if call == "drain_children" else sup.drain_remote(root))

    async def followup() -> None:
        await first()
        answers["followup"] = await sup.followup(root, child, prompt)

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            tg.start_soon(followup)
    return answers


async def notice_saying(sup, root, child: str, text: str) -> None:
    """Take the root's messages until a settlement notice of ``child`` says ``text`` (notices before it are passed)."""
    notices: list = []
    with anyio.move_on_after(DEADLINE_S):
        while not any(text in m.content for m in notices):
            notices += [m for m in await sup.wait_for_message(root) if is_notice(m, child)]
    assert any(text in m.content for m in notices), [m.content for m in notices]


@pytest.mark.parametrize("call", ["drain_children", "drain_remote"])
async def test_a_drain_reaching_an_unhosted_child_never_fences_its_own_supervisors_resume_of_it(tmp_path, monkeypatch, call):
    """Found by a probe: a drain's reach of a child nobody hosted (pending messages a closed host left) looked
    at this supervisor's activations, then took the child's lease to drain it; a followup's cold resume of the
    child in between installed an activation, whose lease the drain then took again as the same owner (epoch + 1).
    The live activation was fenced ("taken over by another supervisor"), its running turn was closed by the
    drain's repair as a crash (``interrupted``), and the root never got the activation's settlement notice.
    Now a lease this supervisor holds is not taken by its own drain: the child, hosted here after all, is left
    to its activation, which runs and settles as usual."""
    from subagents.supervisor.continuable import teardown

    root_id, child, queued, _ = await left_by_a_closed_host(tmp_path)
    real = teardown.drain_unhosted

    def after_the_resume(store, child_id, owner_id, drains):
        deadline = time.monotonic() + DEADLINE_S  # the followup's resume installs the activation meanwhile
        while child_id == child and time.monotonic() < deadline and read_lease(store, child_id).state == "released":
            time.sleep(0.01)
        return real(store, child_id, owner_id, drains)

    monkeypatch.setattr(teardown, "drain_unhosted", after_the_resume)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(id=root_id)
        ends = record_ends(sup)

        async def looked() -> None:
            await anyio.sleep(0.1)  # the drain has looked, and found nobody hosting the child

        answers = await drain_beside_a_followup(sup, root, child, call, looked, S({"sleep": 300}, {"return": "after"}))
        await notice_saying(sup, root, child, "after")
        assert [e.get("taken_over") for e in ends if e["id"] == child] == [None]
        assert turn_ends(sup.store, child)[-1] == "completed", turn_ends(sup.store, child)
        assert answers["followup"] in accepted_ids(sup.store, child)


@pytest.mark.parametrize("call", ["drain_children", "drain_remote"])
async def test_a_resume_never_fences_its_own_supervisors_drain_of_the_child(tmp_path, monkeypatch, call):
    """The same race the other way round, found by the same probe: the drain of a child nobody hosted had taken
    its lease (as this supervisor) and was writing the discards when a followup's cold resume took the lease
    again as the same owner (epoch + 1). The drain was fenced (``ACTIVATION_TEARDOWN_FAILED ... FENCED``) and
    the messages it was to discard ran. Now the resume waits for this supervisor's drain to let the child go,
    then resumes it: the drain discards what was queued, and the followup's message runs after it."""
    from subagents.supervisor.continuable import unhosted

    root_id, child, queued, _ = await left_by_a_closed_host(tmp_path)
    real = unhosted.LogWriter

    class SlowWriter:
        """The drain's writer, opened late: the lease is taken, the discards not yet written."""

        @staticmethod
        def open(*args, **kwargs):
            time.sleep(0.5)
            return real.open(*args, **kwargs)

    monkeypatch.setattr(unhosted, "LogWriter", SlowWriter)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(id=root_id)
        ends = record_ends(sup)

        async def held() -> None:
            await wait_until(lambda: read_lease(sup.store, child).state != "released")  # the drain holds it

        answers = await drain_beside_a_followup(sup, root, child, call, held, S({"return": "after"}))
        await notice_saying(sup, root, child, "after")
        assert discarded(sup.store, child) == [queued]
        assert answers["followup"] in accepted_ids(sup.store, child) and queued not in accepted_ids(sup.store, child)
        assert turn_ends(sup.store, child)[-1] == "completed", turn_ends(sup.store, child)
        assert [e.get("taken_over") for e in ends if e["id"] == child] == [None]


async def test_drain_children_of_a_child_whose_start_is_still_writing_drains_it(tmp_path, monkeypatch):
    """Found by a probe: ``drain_children`` naming a child (its id reserved by the caller) whose
    ``start_continuable`` was still writing found its header but no row in the parent's index yet, and said
    ``UNAUTHORIZED`` ("is not a direct child"), though its header names that parent; the child then started
    and ran. The drain now waits for that start, and drains the child it published."""
    from subagents.supervisor.continuable import materialization

    real_accept = materialization.accept

    def slow_accept(*args, **kwargs):
        time.sleep(0.3)  # the header is written; the index row and the activation come after the prompt's acceptance
        return real_accept(*args, **kwargs)

    monkeypatch.setattr(materialization, "accept", slow_accept)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id = "reservedchild0001"
        started: list[object] = []

        async def starting() -> None:
            started.append(await start(sup, root, SLEEP, child_id=child_id))

        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(starting)
                await wait_until(lambda: sup.store.exists(child_id), what="the child's header")
                await sup.drain_children(root, [child_id])
                assert child_id not in sup.continuation.activations
            (_, prompt), = started
        assert prompt in discarded(sup.store, child_id) + accepted_ids(sup.store, child_id)
        assert turn_ends(sup.store, child_id) in ([], ["drained"], ["aborted"]), turn_ends(sup.store, child_id)
        assert read_lease(sup.store, child_id).state == "released"
