"""Continuable children: start, FIFO followups, settlement notices, reports, nesting, restart.

The helpers at the top (``S``, ``continuable_supervisor``, ``settled``,
``turn_started``) are shared with ``test_authority.py`` and ``test_drain.py``.
Every wait is on a store condition or on a root's mailbox, under a deadline.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest

from subagents.store import MailboxMessage, inspect, read_header, read_lease, read_mailbox
from subagents.store.errors import InvalidSessionIdError
from subagents.supervisor import (
    Capabilities,
    ContinuableSpec,
    Provider,
    RunBudget,
    SubagentDepthError,
    SubagentError,
    SubagentRequest,
    Supervisor,
    UserAuthority,
)
from subagents.supervisor.continuable import settlement_text

from ..conftest import DEADLINE_S, disk_snapshot, events_of, helper, open_supervisor, types_of, wait_until

pytestmark = pytest.mark.anyio


# -- shared helpers ------------------------------------------------------------------


def S(*actions: dict[str, Any]) -> str:
    """A ``script`` message."""
    return json.dumps({"script": list(actions)})


def continuable_providers() -> list[Provider]:
    caps = Capabilities.all()
    return [
        Provider(name="script", program="script", capabilities=caps, continuable=True),
        Provider(name="echo", program="echo", capabilities=caps, continuable=True),
        Provider(name="nest", program=helper("script_or_notice"), capabilities=caps, continuable=True),
        Provider(name="refuse", program=helper("refuse"), capabilities=caps, continuable=True),
        Provider(name="max-tokens", program=helper("max_tokens"), capabilities=caps, continuable=True),
        Provider(name="oneshot-only", program="script", capabilities=caps),
    ]


@asynccontextmanager
async def continuable_supervisor(tmp_path: Path, *, pool_size: int = 2, **config: Any) -> AsyncIterator[Supervisor]:
    async with open_supervisor(tmp_path, pool_size=pool_size, providers=False, **config) as sup:
        for provider in continuable_providers():
            sup.register_provider(provider)
        yield sup


async def start(sup: Supervisor, parent: Any, prompt: str, *, provider: str = "script", label: str = "worker", **spec: Any) -> tuple[str, str]:
    return await sup.start_continuable(ContinuableSpec(parent=parent, provider=provider, prompt=prompt, label=label, **spec))


def is_notice(message: MailboxMessage, child_id: str) -> bool:
    return message.source.get("kind") == "subagent-settled" and message.source.get("sender_session_id") == child_id


async def settled(sup: Supervisor, root: Any, child_id: str, *, timeout: float = DEADLINE_S) -> tuple[MailboxMessage, list[MailboxMessage]]:
    """Take the root's messages until ``child_id``'s settlement notice: (the notice, every message taken)."""
    taken: list[MailboxMessage] = []
    with anyio.fail_after(timeout):
        while True:
            taken += await sup.wait_for_message(root, timeout_s=timeout)
            notices = [m for m in taken if is_notice(m, child_id)]
            if notices:
                return notices[0], taken


async def settled_all(sup: Supervisor, root: Any, child_ids: list[str], *, timeout: float = DEADLINE_S) -> dict[str, MailboxMessage]:
    """Take the root's messages until every child in ``child_ids`` has sent its settlement notice."""
    found: dict[str, MailboxMessage] = {}
    with anyio.fail_after(timeout):
        while set(found) != set(child_ids):
            for m in await sup.wait_for_message(root, timeout_s=timeout):
                sender = m.source.get("sender_session_id")
                if m.source.get("kind") == "subagent-settled" and sender in child_ids:
                    found.setdefault(sender, m)
    return found


async def turn_started(sup: Supervisor, child_id: str, n: int = 1) -> None:
    await wait_until(lambda: types_of(sup.store, child_id).count("turn/start") >= n, what=f"turn {n} of {child_id} to start")


def accepted_ids(st: Any, session_id: str) -> list[str]:
    return [e["data"]["message_id"] for e in events_of(st, session_id) if e["type"] == "message/accepted"]


def turn_ends(st: Any, session_id: str) -> list[str]:
    return [e["data"]["stop_reason"] for e in events_of(st, session_id) if e["type"] == "turn/end"]


def record_ends(sup: Supervisor) -> list[dict[str, Any]]:
    ends: list[dict[str, Any]] = []
    sup.on("subagent/end", lambda _name, info: ends.append(info))
    return ends


# -- start ---------------------------------------------------------------------------


async def test_start_returns_ids_once_the_prompt_is_in_the_mailbox(tmp_path):
    """``(child_id, message_id)``: the prompt is durably in the mailbox, from the user, before any turn."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        prompt = S({"sleep": 60_000})
        child_id, message_id = await start(sup, root, prompt, label="sleeper")
        mailbox = read_mailbox(sup.store, child_id)
        assert [(m.id, m.source, m.content, m.wake) for m in mailbox] == [(message_id, {"kind": "user"}, prompt, True)]
        header = read_header(sup.store, child_id)
        assert (header.parent_session, header.origin, header.delegation_depth) == (root.id, "subagent", 1)
        descriptor = [e["data"] for e in events_of(sup.store, child_id) if e["type"] == "subagent/descriptor"]
        assert [(d["mode"], d["provider"], d["label"]) for d in descriptor] == [("continuable", "script", "sleeper")]
        await turn_started(sup, child_id)
        assert accepted_ids(sup.store, child_id) == [message_id]
        [entry] = await sup.list_children(root.id)
        assert (entry.id, entry.mode, entry.status, entry.label) == (child_id, "continuable", "running", "sleeper")
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await settled(sup, root, child_id)


async def test_failed_starts_leave_nothing(tmp_path):
    """Each refused start raises its code and leaves no session, index entry, lease or activation."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        before = disk_snapshot(sup.store)
        cases: list[tuple[dict[str, Any], str, str | None]] = [
            (
                {"provider": "oneshot-only"},
                "UNSUPPORTED_CAPABILITY",
                'subagent provider "oneshot-only" does not support continuable children (no prepareContinuable capability)',
            ),
            ({"provider": "nobody"}, "NO_PROVIDER", 'no subagent provider registered for "nobody"'),
            ({"max_depth": -1}, "INVALID_REQUEST", "subagent maxDepth must be a non-negative safe integer"),
            ({"max_depth": 1.5}, "INVALID_REQUEST", "subagent maxDepth must be a non-negative safe integer"),
            ({"max_depth": True}, "INVALID_REQUEST", "subagent maxDepth must be a non-negative safe integer"),
            ({"max_depth": 0}, "DEPTH_EXCEEDED", "subagent depth 1 exceeds maxDepth 0"),
            ({"budget": RunBudget(max_steps=0)}, "INVALID_REQUEST", None),
            ({"tool_filter": {}}, "INVALID_REQUEST", None),
            ({"tool_filter": {"other": ["echo"]}}, "INVALID_REQUEST", None),
            ({"child_id": "../escape"}, InvalidSessionIdError.code, None),
            ({"parent": "01NOSUCHPARENT"}, "UNAUTHORIZED", None),
        ]
        for override, code, message in cases:
            spec = {"parent": root, "provider": "script", "prompt": S({"return": "x"}), "label": "w", **override}
            with pytest.raises(SubagentError) as caught:
                await sup.start_continuable(ContinuableSpec(**spec))
            assert caught.value.code == code, override
            if message is not None:
                assert str(caught.value) == message
            assert disk_snapshot(sup.store) == before, override
            assert sup.continuation.activations == {}
            assert await sup.list_children(root.id) == []


async def test_a_request_bad_in_several_ways_fails_as_the_reference_orders_its_checks(tmp_path):
    """max_depth, then the child id, then the depth, then the provider: the same bad request fails
    with the same code as in the reference (the provider was asked first)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        taken, _ = await start(sup, root, S({"return": "x"}), label="taken")
        before = disk_snapshot(sup.store)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"max_depth": -1, "provider": "nobody"}, "INVALID_REQUEST"),
            ({"max_depth": 0, "provider": "nobody"}, "DEPTH_EXCEEDED"),
            ({"child_id": taken, "provider": "nobody"}, "DUPLICATE_CHILD"),
            ({"child_id": taken, "provider": "oneshot-only"}, "DUPLICATE_CHILD"),
            ({"child_id": taken, "max_depth": 0}, "DUPLICATE_CHILD"),
        ]
        for override, code in cases:
            spec = {"parent": root, "provider": "script", "prompt": S({"return": "x"}), "label": "w", **override}
            with pytest.raises(SubagentError) as caught:
                await sup.start_continuable(ContinuableSpec(**spec))
            assert caught.value.code == code, override
            assert disk_snapshot(sup.store) == before, override


async def test_depth_error_names_attempted_and_max_depth(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        with pytest.raises(SubagentDepthError) as caught:
            await start(sup, root, S({"return": "x"}), max_depth=0)
        assert (caught.value.attempted_depth, caught.value.max_depth) == (1, 0)


async def test_caller_reserved_id_that_exists_is_a_duplicate(tmp_path):
    """A reserved id taken by a live activation, then by a settled stored child: ``DUPLICATE_CHILD``."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"sleep": 60_000}), child_id="reserved-1")
        assert child_id == "reserved-1"
        await turn_started(sup, child_id)
        before = disk_snapshot(sup.store)
        with pytest.raises(SubagentError) as caught:
            await start(sup, root, S({"return": "x"}), child_id="reserved-1")
        assert (caught.value.code, str(caught.value)) == ("DUPLICATE_CHILD", 'subagent "reserved-1" already exists')
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        await settled(sup, root, child_id)
        with pytest.raises(SubagentError) as caught:
            await start(sup, root, S({"return": "x"}), child_id="reserved-1")
        assert caught.value.code == "DUPLICATE_CHILD"
        assert disk_snapshot(sup.store) == before
        assert len(read_mailbox(sup.store, child_id)) == 1


# -- FIFO ----------------------------------------------------------------------------


async def test_followups_each_become_one_turn_in_send_order(tmp_path):
    """Followups sent quickly to a busy child queue; each is one turn, in order, never steering."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, first = await start(sup, root, S({"sleep": 300}, {"return": "t0"}))
        sent = [first]
        for i in range(1, 6):
            sent.append(await sup.followup(root, child_id, S({"return": f"t{i}"})))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.endswith("Its closing message:\nt5")
        events = events_of(sup.store, child_id)
        assert accepted_ids(sup.store, child_id) == sent
        starts = [e["data"]["message_id"] for e in events if e["type"] == "turn/start"]
        assert starts == sent
        assert turn_ends(sup.store, child_id) == ["completed"] * 6
        outputs = [e["data"]["text"] for e in events if e["type"] == "assistant/message"]
        assert outputs == [f"t{i}" for i in range(6)]
        # each turn's input sits right before its start: one message, one turn
        kinds = [e["type"] for e in events if e["type"] in ("message/accepted", "turn/start", "turn/end")]
        assert kinds == ["message/accepted", "turn/start", "turn/end"] * 6


# -- settlement notices ----------------------------------------------------------------


SUMMARY = {
    "completed": "Background subagent {id} finished and will do no further work unless you send it more.",
    "aborted": "Background subagent {id} was stopped before it finished.",
    "error": "Background subagent {id} failed before it finished.",
    "refusal": "Background subagent {id} declined the task.",
    "max-tokens": "Background subagent {id} ran out of room before it finished.",
    "budget-exhausted": "Background subagent {id} ended abnormally (budget-exhausted) before it finished.",
}


@pytest.mark.parametrize(
    ("provider", "prompt", "spec", "reason", "closing", "log_reason"),
    [
        ("script", S({"say": "working"}, {"return": "all done"}), {}, "completed", "all done", "completed"),
        ("script", S({"step": 1}), {}, "completed", None, "completed"),
        ("script", S({"say": "half"}, {"fail": "boom"}), {}, "error", "half", "error"),
        ("script", S({"fail": "boom"}), {}, "error", None, "error"),
        ("refuse", "anything", {}, "refusal", "no", "blocked"),
        ("max-tokens", "anything", {}, "max-tokens", "partial answer", "max-tokens"),
        ("script", S({"step": 3}, {"say": "never"}), {"budget": RunBudget(max_steps=1)}, "budget-exhausted", None, "budget-exhausted"),
    ],
    ids=["completed", "completed-silent", "error", "error-silent", "refusal", "max-tokens", "budget-exhausted"],
)
async def test_settlement_notice_text(tmp_path, provider, prompt, spec, reason, closing, log_reason):
    """The parent's notice: the reference's summary line, then the closing message or its absence."""
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        child_id, _ = await start(sup, root, prompt, provider=provider, **spec)
        notice, taken = await settled(sup, root, child_id)
        summary = SUMMARY[reason].format(id=child_id)
        tail = f"Its closing message:\n{closing}" if closing else "It left no closing message."
        assert notice.content == f"{summary}\n{tail}"
        assert (summary, notice.content) == settlement_text(child_id, reason, closing or "")
        assert notice.source == {"kind": "subagent-settled", "form": "notice", "summary": summary, "sender_session_id": child_id}
        assert notice.wake is True
        assert taken == [notice]
        assert turn_ends(sup.store, child_id) == [log_reason]
        assert [(e["id"], e["stop_reason"]) for e in ends] == [(child_id, reason)]
        [entry] = await sup.list_children(root.id)
        assert entry.status == "complete"


async def test_interrupting_a_sleeping_turn_with_nothing_queued_settles_aborted(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"say": "working"}, {"sleep": 60_000}))
        await wait_until(lambda: "assistant/message" in types_of(sup.store, child_id), what="the child to speak")
        await sup.interrupt(child_id, authority=UserAuthority(root.id))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content == f"Background subagent {child_id} was stopped before it finished.\nIts closing message:\nworking"
        assert turn_ends(sup.store, child_id) == ["aborted"]


async def test_long_summary_is_bounded_in_the_source(tmp_path):
    """The notice's ``summary`` is one line of at most 120 characters (119 + an ellipsis)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        long_id = "c" * 64
        await start(sup, root, S({"return": "x"}), child_id=long_id)
        notice, _ = await settled(sup, root, long_id)
        full = SUMMARY["completed"].format(id=long_id)
        assert len(full) > 120
        assert notice.source["summary"] == full[:119] + "…"
        assert notice.content.startswith(full + "\n")


# -- reports ---------------------------------------------------------------------------


async def test_reports_to_a_root_quiet_and_wakeup(tmp_path):
    """Reports reach the parent's mailbox in order with the reference's prefix; ``quiet`` does not wake."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"report": "q1", "delivery": "quiet"}, {"report": "w1", "delivery": "wakeup"}, {"return": "done"}))
        notice, taken = await settled(sup, root, child_id)
        reports = [m for m in taken if m.source.get("kind") == "subagent-report"]
        assert [(m.content, m.wake) for m in reports] == [
            (f"Background subagent {child_id} reported:\nq1", False),
            (f"Background subagent {child_id} reported:\nw1", True),
        ]
        assert all(m.source == {"kind": "subagent-report", "form": "relay", "sender_session_id": child_id} for m in reports)
        assert taken.index(notice) == 2  # report, report, then the settlement notice
        sent = [e["data"] for e in events_of(sup.store, child_id) if e["type"] == "report/sent"]
        assert [(s["message_id"], s["delivery"]) for s in sent] == [(reports[0].id, "quiet"), (reports[1].id, "wakeup")]


async def test_report_from_a_one_shot_child_is_unauthorized(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"report": "hello"}, {"return": "unreached"})))
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "error"
        assert result.diagnostic == f'UNAUTHORIZED: agent "{run.id}" is not a live continuable subagent and cannot report'
        assert await sup.take_messages(root) == []


async def test_report_from_the_host_for_a_root_is_unauthorized(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        with pytest.raises(SubagentError) as caught:
            await sup.report_from(root.id, "not a child")
        assert caught.value.code == "UNAUTHORIZED"


# -- nesting ---------------------------------------------------------------------------


def grandchild_start(prompt: str) -> dict[str, Any]:
    return {"start_continuable": {"prompt": prompt, "label": "grandchild", "provider": "script"}}


async def only_child_of(sup: Supervisor, parent_id: str) -> str:
    entries = await wait_until(lambda: sup.list_children(parent_id), what=f"a child of {parent_id}")
    [entry] = entries
    return entry.id


@pytest.mark.parametrize("delivery", ["quiet", "wakeup"])
async def test_nested_child_waits_for_its_grandchild_then_settles(tmp_path, delivery):
    """A child that owns a running grandchild is ``idle`` (waiting); a ``quiet`` report waits for the
    next wake, a ``wakeup`` report is a turn; the grandchild's notice wakes the child, which then settles.
    Disposal is child-first: the grandchild's ``subagent/end`` comes before the child's."""
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        grand_prompt = S({"report": "from below", "delivery": delivery}, {"sleep": 60_000})
        child_id, _ = await start(sup, root, S(grandchild_start(grand_prompt), {"return": "started it"}), provider="nest")
        grand_id = await only_child_of(sup, child_id)
        await turn_started(sup, grand_id)

        async def child_idle() -> bool:
            [entry] = await sup.list_children(root.id)
            return entry.status == "idle"

        await wait_until(lambda: len(read_mailbox(sup.store, child_id)) == 2, what="the report in the child's mailbox")
        expected_turns = 1 if delivery == "quiet" else 2
        await wait_until(lambda: len(turn_ends(sup.store, child_id)) == expected_turns, what="the child's turns")
        await wait_until(child_idle, what="the child to wait on its grandchild")
        assert read_lease(sup.store, child_id).state == "idle"
        [grand] = await sup.list_children(child_id)
        assert grand.status == "running"
        rows = await sup.list_descendants(root.id)
        assert [(r.entry.id, r.parent_id, r.depth) for r in rows] == [(child_id, root.id, 1), (grand_id, child_id, 2)]
        assert await sup.take_messages(root) == []  # nothing settled yet

        await sup.interrupt(grand_id, authority=UserAuthority(child_id))
        notice, _ = await settled(sup, root, child_id)

        events = events_of(sup.store, child_id)
        accepted = [e["data"] for e in events if e["type"] == "message/accepted"]
        kinds = [a["source"]["kind"] for a in accepted]
        assert kinds == ["user", "subagent-report", "subagent-settled"]
        assert [bool(a.get("quiet")) for a in accepted] == [False, delivery == "quiet", False]
        outputs = [e["data"]["text"] for e in events if e["type"] == "assistant/message"]
        if delivery == "quiet":
            assert outputs == ["started it", "noted subagent-settled with 1 quiet: subagent-report"]
        else:
            assert outputs == ["started it", "noted subagent-report with 0 quiet: ", "noted subagent-settled with 0 quiet: "]
        assert accepted[-1]["content"].startswith(f"Background subagent {grand_id} was stopped before it finished.")
        assert notice.content.endswith(f"Its closing message:\n{outputs[-1]}")
        assert [e["id"] for e in ends] == [grand_id, child_id]
        assert [e["stop_reason"] for e in ends] == ["aborted", "completed"]
        assert read_header(sup.store, grand_id).delegation_depth == 2


# -- restart ---------------------------------------------------------------------------


async def test_restart_lists_complete_and_followup_cold_resumes(tmp_path):
    """After a restart the child is ``complete``; a followup resumes it under a higher epoch with its transcript."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child_id, first = await start(sup, root, S({"say": "epoch one"}, {"return": "one"}))
        await settled(sup, root, child_id)
    old_events = events_of(sup.store, child_id)
    old_epochs = {e["epoch"] for e in old_events}
    async with continuable_supervisor(tmp_path) as sup2:
        again = await sup2.open_root(id=root.id)
        assert again.id == root.id
        [entry] = await sup2.list_children(root.id)
        assert (entry.id, entry.status, entry.mode, entry.label) == (child_id, "complete", "continuable", "worker")
        second = await sup2.followup(again, child_id, S({"return": "two"}))
        notice, _ = await settled(sup2, again, child_id)
        assert notice.content.endswith("Its closing message:\ntwo")
        events = events_of(sup2.store, child_id)
        assert events[: len(old_events)] == old_events  # the transcript is intact, only appended to
        new = events[len(old_events) :]
        assert accepted_ids(sup2.store, child_id) == [first, second]
        assert [e["type"] for e in events].count("turn/start") == 2
        assert [e["type"] for e in events].count("subagent/descriptor") == 1  # resume never adds one
        assert min(e["epoch"] for e in new) > max(old_epochs)
        assert read_header(sup2.store, child_id).delegation_depth == 1


async def test_followup_to_a_settled_child_cold_resumes_in_the_same_supervisor(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "one"}))
        await settled(sup, root, child_id)
        await sup.followup(root, child_id, S({"return": "two"}))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.endswith("\ntwo")
        assert len({e["run_id"] for e in ends}) == 2  # one start/end pair per residency epoch
        epochs = [e["epoch"] for e in events_of(sup.store, child_id) if e["type"] == "turn/start"]
        assert epochs[1] == epochs[0] + 1


async def test_cold_resume_keeps_the_delegated_sandbox(tmp_path):
    """A read-only child stays read-only when a followup resumes it (the policy is in its log)."""
    target = tmp_path / "written.txt"
    write = S({"tool": "write_file", "args": {"path": str(target), "content": "x"}}, {"return": "wrote"})
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, write, sandbox="read-only")
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.startswith(SUMMARY["error"].format(id=child_id))
    async with continuable_supervisor(tmp_path) as sup2:
        root2 = await sup2.open_root(id=root.id)
        await sup2.followup(root2, child_id, write)
        notice, _ = await settled(sup2, root2, child_id)
        assert notice.content.startswith(SUMMARY["error"].format(id=child_id))
        assert turn_ends(sup2.store, child_id) == ["error", "error"]
        assert not target.exists()


async def test_followup_after_the_provider_is_unregistered(tmp_path):
    """Unregistering stops new starts but never strands a child: a followup still runs its program."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        unregister = sup.register_provider(Provider(name="temp", program=helper("script_or_notice"), continuable=True))
        child_id, _ = await start(sup, root, S({"return": "one"}), provider="temp")
        await settled(sup, root, child_id)
        unregister()
        with pytest.raises(SubagentError) as caught:
            await start(sup, root, S({"return": "x"}), provider="temp")
        assert caught.value.code == "NO_PROVIDER"
        await sup.followup(root, child_id, S({"return": "two"}))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content == f"{SUMMARY['completed'].format(id=child_id)}\nIts closing message:\ntwo"


async def test_followup_after_restart_without_the_provider(tmp_path):
    """After a restart, a child whose provider nobody registered resumes from the program reference its
    descriptor recorded (issue 13: resume never goes through the provider); a provider named after a
    built-in program still resolves. (A program carried by value: tests/supervisor/test_resume_anywhere.py.)"""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        nest_id, _ = await start(sup, root, S({"return": "one"}), provider="nest")
        echo_id, _ = await start(sup, root, "hello", provider="echo")
        await settled_all(sup, root, [nest_id, echo_id])
    async with open_supervisor(tmp_path, providers=False) as bare:
        root2 = await bare.open_root(id=root.id)
        await bare.followup(root2, nest_id, S({"return": "two"}))
        notice, _ = await settled(bare, root2, nest_id)
        assert notice.content.endswith("Its closing message:\ntwo")
        await bare.followup(root2, echo_id, "again")
        notice, _ = await settled(bare, root2, echo_id)
        assert notice.content.endswith("Its closing message:\nagain")


async def test_followup_to_a_one_shot_child_is_not_resumable(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"return": "once"})))
        with anyio.fail_after(DEADLINE_S):
            await run.result()
        await run.dispose()
        with pytest.raises(SubagentError) as caught:
            await sup.followup(root, run.id, "more")
        assert caught.value.code == "NOT_RESUMABLE"
        assert str(caught.value) == (
            f'subagent "{run.id}" has no supported continuation state and cannot be resumed; do not retry send_message with this id'
        )
        assert read_mailbox(sup.store, run.id) == []


async def test_followup_to_an_unknown_child_is_not_resumable(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        with pytest.raises(SubagentError) as caught:
            await sup.followup(root, "01NOSUCHCHILD", "more")
        assert (caught.value.code, str(caught.value)) == ("NOT_RESUMABLE", 'subagent "01NOSUCHCHILD" is unavailable')


def craft_history(sup: Supervisor, parent_id: str, turns: int) -> str:
    """A settled continuable ``echo`` child with ``turns`` completed turns and their consumed mailbox."""
    from subagents.store import ContinuableDescriptor, LogWriter, create_session, encode_record

    child_id = sup.ids.new()
    descriptor = ContinuableDescriptor(provider="echo", label="long history")
    create_session(sup.store, child_id, parent_session=parent_id, origin="subagent", delegation_depth=1,
                   events=[("subagent/descriptor", descriptor.to_record())])
    source = {"kind": "coordinator", "form": "relay", "sender_session_id": parent_id}
    records, batch = [], []
    for turn in range(turns):
        message_id = sup.ids.new()
        records.append(encode_record({"seq": turn, "id": message_id, "ts": 0.0, "source": source, "content": "x" * 100, "wake": True}))
        batch += [
            ("message/accepted", {"message_id": message_id, "source": source, "content": "x" * 100}),
            ("turn/start", {"message_id": message_id}),
            ("turn/end", {"stop_reason": "completed", "diagnostic": None}),
        ]
    with LogWriter.open(sup.store, child_id, epoch=0) as writer:
        writer.append(batch, commit=True)
    Path(sup.store.path(child_id, "mailbox")).write_bytes(b"".join(records))
    return child_id


async def test_a_followup_accepted_while_the_resumed_driver_reads_its_mailbox_still_runs(tmp_path):
    """Regression: the driver of a cold-resumed child read its (long) mailbox while the followup that
    resumed it was being accepted, found no work, saw no delivery in flight any more, and settled
    without running the accepted message (a lost wake)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id = craft_history(sup, root.id, 8_000)
        for i in range(3):
            await sup.followup(root, child_id, f"resumed {i}")
            notice, _ = await settled(sup, root, child_id)
            assert notice.content.endswith(f"Its closing message:\nresumed {i}")


@pytest.mark.anyio
async def test_after_a_failed_turn_the_driver_takes_the_consumed_count_from_the_log(tmp_path) -> None:
    """After an error outcome the driver re-reads what the log consumed (a turn may fail before
    logging its message); here the failed turn did log it, so the next followup runs next, once."""
    import json as _json

    from subagents.store import inspect as _inspect
    from subagents.supervisor import SupervisorConfig

    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        child_id, _ = await sup.start_continuable(
            ContinuableSpec(parent=root, provider="script", label="f", prompt=_json.dumps({"script": [{"fail": "boom"}]}))
        )
        first = await sup.wait_for_message(root, timeout_s=20)
        assert "failed before it finished" in first[-1].content
        await sup.followup(root, child_id, _json.dumps({"script": [{"return": "fine"}]}))
        second = await sup.wait_for_message(root, timeout_s=20)
        assert second[-1].content.endswith("Its closing message:\nfine")
        accepted = [e for e in _inspect(sup.store, child_id).events if e["type"] == "message/accepted"]
        assert len(accepted) == 2


@pytest.mark.parametrize("second", [S({"fail": "boom"}), S({"sleep": 60_000})], ids=["failed", "interrupted"])
async def test_a_later_silent_turn_keeps_the_closing_message(tmp_path, second):
    """Issue 13, item 3: the closing message is the epoch's last non-empty reply, not the last turn's.

    A child answers once; its next turn (queued in the same activation) fails or is interrupted
    without saying anything. The notice and ``subagent/end`` still carry the first answer.
    """
    async with continuable_supervisor(tmp_path) as sup:
        ends = record_ends(sup)
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"sleep": 200}, {"return": "first answer"}))
        await sup.followup(root, child_id, second)
        if "sleep" in second:
            await wait_until(lambda: types_of(sup.store, child_id).count("turn/start") == 2, what="the second turn to start")
            await sup.interrupt(child_id, authority=UserAuthority(root.id))
        notice, _ = await settled(sup, root, child_id)
        assert notice.content.endswith("Its closing message:\nfirst answer")
        assert [e["last_assistant_message"] for e in ends] == ["first answer"]


async def test_a_program_gives_a_continuable_child_its_budget_as_it_gives_a_spawn_one(tmp_path) -> None:
    """Found by a probe: ``ctx.spawn(..., max_steps=2)`` worked, ``ctx.start_continuable(..., max_steps=2)`` was
    ``INVALID_REQUEST ... Extra inputs are not permitted`` (it wanted ``budget={"max_steps": 2}``, said nowhere)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_prompt = S({"step": 3}, {"return": "never"})
        parent, _ = await start(sup, root, S({"start_continuable": {"prompt": json.loads(child_prompt), "label": "capped", "max_steps": 2}},
                                             {"return": "started"}))
        await settled(sup, root, parent)
        [child] = [e.id for e in await sup.list_children(parent)]
        with anyio.fail_after(DEADLINE_S):
            while True:
                ends = [e["data"] for e in inspect(sup.store, child).events if e["type"] == "turn/end"]
                if ends:
                    break
                await anyio.sleep(0.05)
        assert ends[0]["stop_reason"] == "budget-exhausted", ends


async def test_a_script_parent_takes_note_of_its_childs_notice_instead_of_failing(tmp_path):
    """A continuable ``script`` child that starts its own child is woken by that child's notice, which
    is prose: it ended ``error`` (``a script is JSON or TOML``) and its parent heard ``failed``."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        parent, _ = await start(sup, root, S({"start_continuable": {"prompt": {"script": [{"return": "kid done"}]}, "label": "kid"}},
                                             {"return": "parent done"}), label="parent")
        with anyio.fail_after(DEADLINE_S):
            texts = [m.content for m in await sup.wait_for_message(root)]
        kid = next(e.id for e in await sup.list_children(parent))
        # one epoch: the parent settles once its child has (the notice's turn is its last)
        assert texts == [
            f"Background subagent {parent} finished and will do no further work unless you send it more.\nIts closing message:\n"
            f"noted: Background subagent {kid} finished and will do no further work unless you send it more.",
        ]
        rows = {row.entry.label: row.entry.outcome for row in await sup.list_descendants(root.id)}
        assert rows == {"parent": "completed", "kid": "completed"}
