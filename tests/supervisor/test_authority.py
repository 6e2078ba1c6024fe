"""Who may interrupt or follow up a continuable child, and what an interrupt stops.

``interrupt`` takes a ``UserAuthority`` (the target's recorded parent) or an
``AncestorAuthority`` (a live ancestor recorded when the activation
materialised); ``followup`` only the exact live direct parent. An interrupt
cancels the current turn only: queued messages still run afterwards (our
documented choice, see ``supervisor/continuable/__init__.py``).
"""

from __future__ import annotations

import anyio
import pytest

from subagents.store import read_lease, read_mailbox
from subagents.supervisor import AncestorAuthority, SubagentError, SubagentRequest, UserAuthority

from ..conftest import DEADLINE_S, events_of, said, wait_until
from .test_continuable import S, accepted_ids, continuable_supervisor, only_child_of, settled, start, turn_ends, turn_started

pytestmark = pytest.mark.anyio

UNKNOWN = "01UNKNOWNTARGET"


async def sleeping_child(sup, root, **spec):
    child_id, message_id = await start(sup, root, S({"say": "awake"}, {"sleep": 60_000}), **spec)
    await turn_started(sup, child_id)
    return child_id, message_id


async def unauthorized(call) -> str:
    with pytest.raises(SubagentError) as caught:
        await call
    assert caught.value.code == "UNAUTHORIZED"
    return str(caught.value)


async def test_user_authority_must_name_the_recorded_parent(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root, other = await sup.open_root(), await sup.open_root()
        child_id, _ = await sleeping_child(sup, root)
        message = await unauthorized(sup.interrupt(child_id, authority=UserAuthority(other.id)))
        assert message == f'subagent "{child_id}" belongs to another parent session'
        assert turn_ends(sup.store, child_id) == []  # still running
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        notice, _ = await settled(sup, root, child_id)
        assert turn_ends(sup.store, child_id) == ["aborted"]


async def test_interrupting_an_unknown_or_inactive_target_is_a_no_op(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        assert (await sup.interrupt(UNKNOWN, authority=UserAuthority(root.id))).outcome == "no_turn_running"
        assert (await sup.interrupt(UNKNOWN, authority=AncestorAuthority(root))).outcome == "no_turn_running"
        child_id, _ = await start(sup, root, S({"return": "done"}))
        await settled(sup, root, child_id)
        for authority in (UserAuthority(root.id), AncestorAuthority(root)):  # settled: nothing to stop
            assert (await sup.interrupt(child_id, authority=authority)).outcome == "no_turn_running"
        assert turn_ends(sup.store, child_id) == ["completed"]
        assert sup.continuation.activations == {}


async def test_a_user_interrupt_reaches_a_one_shot_child_and_an_ancestor_interrupt_does_not(tmp_path):
    """A one-shot child has no activation: an ancestor interrupt (the model's tool) is a no-op, as in the
    reference; the host user's interrupt stops its turn (issue #13), which ends aborted by the user."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "awake"}, {"sleep": 60_000})))
        await wait_until(lambda: said(sup.store, run.id) == ["awake"], what="the one-shot child to start")
        assert (await sup.interrupt(run.id, authority=AncestorAuthority(root))).outcome == "no_turn_running"
        assert (await sup.interrupt(run.id, authority=UserAuthority(root.id))).outcome == "cancelled"
        assert (await run.result()).stop_reason == "aborted"
        assert turn_ends(sup.store, run.id) == ["aborted"]
        await run.dispose()


async def test_ancestor_authority_rules(tmp_path):
    """Self, a dead caller and a live non-ancestor are refused; the parent and grandparent may interrupt."""
    async with continuable_supervisor(tmp_path) as sup:
        root, stranger = await sup.open_root(), await sup.open_root()
        child_id, _ = await start(
            sup, root,
            S({"start_continuable": {"prompt": S({"say": "g"}, {"sleep": 60_000}), "label": "g", "provider": "script"}}, {"sleep": 60_000}),
            provider="nest",
        )
        grand_id = await only_child_of(sup, child_id)
        await turn_started(sup, grand_id)

        assert await unauthorized(sup.interrupt(child_id, authority=AncestorAuthority(child_id))) == (
            f'agent "{child_id}" cannot interrupt itself'
        )
        dead = "01NOTALIVEAGENT"
        for target in (child_id, UNKNOWN):
            assert await unauthorized(sup.interrupt(target, authority=AncestorAuthority(dead))) == (
                f'interrupting "{target}" requires the exact live ancestor agent'
            )
        assert await unauthorized(sup.interrupt(child_id, authority=AncestorAuthority(stranger))) == (
            f'subagent "{child_id}" is not a live descendant of agent "{stranger.id}"'
        )
        assert await unauthorized(sup.interrupt(child_id, authority=AncestorAuthority(grand_id))) == (
            f'subagent "{child_id}" is not a live descendant of agent "{grand_id}"'
        )
        assert turn_ends(sup.store, child_id) == [] and turn_ends(sup.store, grand_id) == []

        # the grandparent (the root) may stop the grandchild: only that turn ends
        await sup.interrupt(grand_id, authority=AncestorAuthority(root))
        await wait_until(lambda: turn_ends(sup.store, grand_id) == ["aborted"], what="the grandchild's turn to stop")
        assert turn_ends(sup.store, child_id) == []  # an interrupt never reaches up (or down)
        await sup.interrupt(child_id, authority=AncestorAuthority(root))
        notice, _ = await settled(sup, root, child_id)
        ends = turn_ends(sup.store, child_id)
        assert ends[0] == "aborted"  # then one turn for the grandchild's settlement notice
        assert notice.content.startswith(f"Background subagent {child_id} finished")


async def test_a_child_interrupts_its_own_child_from_a_turn(tmp_path):
    """``ctx.interrupt`` is an ancestor-authority interrupt by the calling child."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(
            sup, root,
            S(
                {"start_continuable": {"prompt": S({"sleep": 60_000}), "label": "g", "provider": "script"}},
                {"interrupt": "$last"},
                {"return": "stopped it"},
            ),
            provider="nest",
        )
        notice, _ = await settled(sup, root, child_id)
        grand_id = await only_child_of(sup, child_id)
        assert turn_ends(sup.store, grand_id) in (["aborted"], [])  # stopped mid-turn, or before it began
        child_events = events_of(sup.store, child_id)
        settled_notice = [e["data"] for e in child_events if e["type"] == "message/accepted"][-1]
        assert settled_notice["source"]["kind"] == "subagent-settled"
        assert settled_notice["content"].startswith(f"Background subagent {grand_id} was stopped before it finished.")


async def test_interrupt_cancels_only_the_current_turn(tmp_path):
    """The running turn ends ``aborted``; a queued followup still runs afterwards, and the child settles on it."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, first = await sleeping_child(sup, root)
        queued = await sup.followup(root, child_id, S({"return": "after"}))
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        notice, taken = await settled(sup, root, child_id)
        assert notice.content == f"Background subagent {child_id} finished and will do no further work unless you send it more.\nIts closing message:\nafter"
        assert turn_ends(sup.store, child_id) == ["aborted", "completed"]
        assert accepted_ids(sup.store, child_id) == [first, queued]
        assert taken == [notice]


async def test_interrupting_a_turn_no_worker_took_yet(tmp_path):
    """A turn interrupted while queued for a worker is consumed unrun (``message/discarded``), once.

    Regression: the driver counted the message as consumed in memory while the
    log never recorded it, so the next cold resume found the mailbox and the log
    disagreeing and the child could never run again.
    """
    async with continuable_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        hog, _ = await sleeping_child(sup, root)  # holds the only worker
        child_id, m0 = await start(sup, root, S({"return": "b0"}))
        await wait_until(
            lambda: (act := sup.continuation.activations.get(child_id)) is not None and act.ticket is not None,
            what="the child's turn to queue",
        )
        m1 = await sup.followup(root, child_id, S({"return": "b1"}))
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await sup.interrupt(hog, authority=UserAuthority(root.id))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.endswith("Its closing message:\nb1")
        m2 = await sup.followup(root, child_id, S({"return": "b2"}))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.endswith("Its closing message:\nb2")
        events = events_of(sup.store, child_id)
        consumed = [(e["type"], e["data"]["message_id"]) for e in events if e["type"] in ("message/accepted", "message/discarded")]
        assert consumed == [("message/discarded", m0), ("message/accepted", m1), ("message/accepted", m2)]
        assert [m.id for m in read_mailbox(sup.store, child_id)] == [m0, m1, m2]
        assert said(sup.store, child_id) == ["b1", "b2"]


async def test_followup_only_from_the_exact_live_direct_parent(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root, other = await sup.open_root(), await sup.open_root()
        child_id, _ = await sleeping_child(sup, root)
        before = len(read_mailbox(sup.store, child_id))
        # resident child
        assert await unauthorized(sup.followup(other, child_id, "hijack")) == f'subagent "{child_id}" belongs to another parent session'
        assert await unauthorized(sup.followup("01NOTALIVEPARENT", child_id, "x")) == (
            f'subagent "{child_id}" delivery requires the exact live parent agent'
        )
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await settled(sup, root, child_id)
        # settled child: the cold path checks the header before resuming
        assert await unauthorized(sup.followup(other, child_id, "hijack")) == f'subagent "{child_id}" belongs to another parent session'
        assert len(read_mailbox(sup.store, child_id)) == before
        assert sup.continuation.activations == {}


async def test_a_grandparent_cannot_follow_up_a_grandchild(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(
            sup, root,
            S({"start_continuable": {"prompt": S({"sleep": 60_000}), "label": "g", "provider": "script"}}, {"return": "ok"}),
            provider="nest",
        )
        grand_id = await only_child_of(sup, child_id)
        await turn_started(sup, grand_id)
        assert await unauthorized(sup.followup(root, grand_id, "skip a level")) == f'subagent "{grand_id}" belongs to another parent session'
        with anyio.fail_after(DEADLINE_S):
            await sup.interrupt(grand_id, authority=AncestorAuthority(root))
        await settled(sup, root, child_id)


@pytest.mark.parametrize("source", ["notadict", 5])
async def test_a_followup_whose_source_is_no_map_is_refused_and_the_child_runs_on(tmp_path, source):
    """Such a followup was acknowledged and written; every reader then refused the record as damage:
    the child never ran again, and every later followup was ``CORRUPT_SESSION``."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await sleeping_child(sup, root)
        before = len(read_mailbox(sup.store, child_id))
        with pytest.raises(SubagentError) as caught:
            await sup.followup(root, child_id, "x", source=source)
        assert caught.value.code == "INVALID_RECORD"
        assert len(read_mailbox(sup.store, child_id)) == before
        await sup.followup(root, child_id, S({"say": "still here"}))
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await wait_until(lambda: "still here" in said(sup.store, child_id))


@pytest.mark.parametrize("how", ["followup source", "followup too large", "send source", "send too large"])
async def test_a_refused_message_to_a_settled_child_does_not_resume_it(tmp_path, how):
    """Such a message resumed the child first and was refused only at its acceptance: the lease's epoch
    went up and the parent got a settlement notice for a resumption that ran no turn."""
    async with continuable_supervisor(tmp_path, max_record_bytes=1 << 16) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "r"}))
        await settled(sup, root, child_id)
        epoch = read_lease(sup.store, child_id).epoch
        big = "x" * (1 << 17)
        calls = {
            "followup source": lambda: sup.followup(root, child_id, "x", source="notadict"),
            "followup too large": lambda: sup.followup(root, child_id, big),
            "send source": lambda: sup.send(child_id, "x", parent=root, source=["l"]),
            "send too large": lambda: sup.send(child_id, big, parent=root),
        }
        with pytest.raises(SubagentError) as caught:
            await calls[how]()
        assert caught.value.code == ("MESSAGE_TOO_LARGE" if "large" in how else "INVALID_RECORD")
        assert read_lease(sup.store, child_id).epoch == epoch
        await anyio.sleep(0.5)  # a wrongly resumed child settles again within this
        assert await sup.take_messages(root) == []
