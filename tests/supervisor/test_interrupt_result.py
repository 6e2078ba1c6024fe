"""What ``Supervisor.interrupt`` did, as a value (issue #13): ``cancelled``, ``requested`` or ``no_turn_running``.

A user interrupt reaches every running turn this supervisor hosts, one-shot
or continuable, and says which turn it cancelled; an interrupt that finds
nothing running says so instead of reporting success. Another process's
children are reached through their control file: tests/multi/test_store_control.py
and tests/supervisor/test_cli_interrupt.py.
"""

from __future__ import annotations

import time

import anyio
import pytest

from subagents import InterruptResult
from subagents import store
from subagents.store import IdGenerator, inspect, list_children
from subagents.store.control import read_controls
from subagents.store.control import request as control_request
from subagents.supervisor import AncestorAuthority, SubagentRequest, UserAuthority
from subagents.supervisor.interrupts import Interrupts

from ..conftest import DEADLINE_S, events_of, open_supervisor, said, wait_until
from .test_continuable import S, continuable_supervisor, settled, start, turn_ends, turn_started

pytestmark = pytest.mark.anyio

UNKNOWN = "01UNKNOWNTARGET"


def turn_end_of(st, session_id: str) -> dict:
    ends = [e["data"] for e in events_of(st, session_id) if e["type"] == "turn/end"]
    assert len(ends) == 1, ends
    return ends[0]


def first_message_id(st, session_id: str) -> str:
    return next(e["data"]["message_id"] for e in events_of(st, session_id) if e["type"] == "turn/start")


async def test_a_locally_hosted_one_shot_child_is_cancelled_by_a_user_interrupt(tmp_path):
    """The one-shot turn ends aborted by the user long before its sleep would; the result names the turn."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "awake"}, {"sleep": 60_000})))
        await wait_until(lambda: said(sup.store, run.id) == ["awake"], what="the one-shot child to start")
        began = time.monotonic()
        result = await sup.interrupt(run.id, authority=UserAuthority(root.id))
        assert isinstance(result, InterruptResult)
        assert (result.outcome, result.child_id, result.turn) == ("cancelled", run.id, 1)
        assert result.message_id == first_message_id(sup.store, run.id)
        assert result.host is None  # here
        assert (await run.result()).stop_reason == "aborted"
        assert time.monotonic() - began < DEADLINE_S
        end = turn_end_of(sup.store, run.id)
        assert (end["stop_reason"], end.get("cause")) == ("aborted", "user")
        await run.dispose()

        again = await sup.interrupt(run.id, authority=UserAuthority(root.id))
        assert again.outcome == "no_turn_running" and again.detail


async def test_a_one_shot_child_interrupted_before_a_worker_took_it_is_listed_aborted(tmp_path):
    """Its result said ``aborted`` while every listing said ``not-started``: nothing reached its log."""
    async with continuable_supervisor(tmp_path, pool_size=1, worker_prefetch=0) as sup:
        root = await sup.open_root()
        busy = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "awake"}, {"sleep": 60_000}), label="busy"))
        await wait_until(lambda: said(sup.store, busy.id) == ["awake"], what="the busy child to start")
        queued = await sup.start("script", SubagentRequest(parent=root, prompt=S({"return": "never"}), label="queued"))
        assert (await sup.interrupt(queued.id, authority=UserAuthority(root.id))).outcome == "cancelled"
        assert (await queued.result()).stop_reason == "aborted"
        await queued.dispose()
        [entry] = [e for e in await sup.list_children(root) if e.id == queued.id]
        assert entry.outcome == "aborted"
        end = turn_end_of(sup.store, queued.id)
        assert (end["stop_reason"], end.get("cause")) == ("aborted", "user")
        assert said(sup.store, queued.id) == []
        await sup.interrupt(busy.id, authority=UserAuthority(root.id))
        await busy.result()
        await busy.dispose()


async def test_a_one_shot_child_keeps_the_reference_rule_for_ancestors(tmp_path):
    """An ancestor interrupt reaches continuable activations only (the model-facing tool's rule): a no-op, said as such."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "awake"}, {"sleep": 60_000})))
        await wait_until(lambda: said(sup.store, run.id) == ["awake"], what="the one-shot child to start")
        result = await sup.interrupt(run.id, authority=AncestorAuthority(root))
        assert result.outcome == "no_turn_running"
        assert not run.done
        await run.dispose()


async def test_a_wrong_parent_is_unauthorized_for_a_one_shot_child(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root, other = await sup.open_root(), await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"sleep": 60_000})))
        with pytest.raises(Exception) as caught:
            await sup.interrupt(run.id, authority=UserAuthority(other.id))
        assert getattr(caught.value, "code", None) == "UNAUTHORIZED"
        assert not run.done
        await run.dispose()


async def test_a_continuable_turn_cancelled_here_is_named(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, message_id = await start(sup, root, S({"say": "awake"}, {"sleep": 60_000}))
        await turn_started(sup, child_id)
        result = await sup.interrupt(child_id, authority=UserAuthority(root.id))
        assert (result.outcome, result.turn, result.message_id, result.host) == ("cancelled", 1, message_id, None)
        await settled(sup, root, child_id)
        end = turn_end_of(sup.store, child_id)
        assert (end["stop_reason"], end.get("cause")) == ("aborted", "user")


async def test_nothing_running_is_said(tmp_path):
    """A settled child, an unknown id, and (for ancestors) an unknown target: ``no_turn_running`` with a reason."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "done"}))
        await settled(sup, root, child_id)
        for target, authority in ((child_id, UserAuthority(root.id)), (child_id, AncestorAuthority(root)),
                                  (UNKNOWN, UserAuthority(root.id)), (UNKNOWN, AncestorAuthority(root))):
            result = await sup.interrupt(target, authority=authority)
            assert (result.outcome, result.child_id, result.turn) == ("no_turn_running", target, None), result
            assert result.detail


async def test_a_one_shot_run_carries_out_a_control_record_past_damage(tmp_path):
    """What another process does (an ``interrupt`` control record) reaches the run through its
    control file, after bytes that are no record: they are stepped over, never end the supervisor."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "awake"}, {"sleep": 60_000})))
        await wait_until(lambda: said(sup.store, run.id) == ["awake"], what="the one-shot child to start")
        with open(sup.store.path(run.id, "control"), "ab") as junk:
            junk.write(b"\x00not a record\xff" * 4)
        control_request(sup.store, run.id, "interrupt", {"reason": "user"}, ids=IdGenerator())
        with anyio.fail_after(DEADLINE_S):
            assert (await run.result()).stop_reason == "aborted"
        end = turn_end_of(sup.store, run.id)
        assert (end["stop_reason"], end.get("cause")) == ("aborted", "user")
        await run.dispose()


async def test_a_turn_that_ignores_the_interrupt_here_is_recorded_as_stopped_by_it(tmp_path):
    """``spin`` blocks its worker's loop, so the worker is killed past ``cancel_grace_s``: the repaired
    ``turn/end`` carries the interrupt's cause, the same as when another process asked
    (tests/multi/test_remote_interrupt.py), and a turn whose worker died on its own carries none."""
    async with continuable_supervisor(tmp_path, cancel_grace_s=0.3) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "spinning"}, {"spin": 60_000})))
        child_id, _ = await start(sup, root, S({"say": "spinning"}, {"spin": 60_000}))
        crashing = await sup.start("script", SubagentRequest(parent=root, prompt=S({"say": "exiting"}, {"exit": 3})))
        for session_id in (run.id, child_id):
            await wait_until(lambda: said(sup.store, session_id) == ["spinning"], what="the spin to start")
            result = await sup.interrupt(session_id, authority=UserAuthority(root.id))
            assert (result.outcome, result.turn) == ("cancelled", 1), result
        stopped = await run.result()
        assert stopped.stop_reason == "aborted"
        await settled(sup, root, child_id)
        crashed = await crashing.result()
        assert crashed.stop_reason == "error" and crashed.diagnostic.startswith("worker process ")
        # the repaired turn/end says how the worker died, in the words the caller got (found by a README probe:
        # the caller read "exited with code 3", `tree` only "interrupted by a crash")
        killed = stopped.diagnostic.removeprefix("the turn was cancelled (user); ")
        assert killed.startswith("worker process ") and "SIGKILL" in killed, stopped.diagnostic
        # a worker killed for ignoring the interrupt is no crash (found by a probe: the caller got ``aborted``, the
        # listing said "interrupted", "the turn was interrupted by a crash"): the log says what the caller got
        assert turn_end_of(sup.store, run.id) == {"stop_reason": "interrupted", "diagnostic": stopped.diagnostic, "cause": "user"}
        assert turn_end_of(sup.store, child_id)["diagnostic"].startswith("the turn was cancelled (user); worker process ")
        crash = "the turn was interrupted by a crash ({})"
        assert turn_end_of(sup.store, crashing.id) == {"stop_reason": "interrupted", "diagnostic": crash.format(crashed.diagnostic)}
        rows = {row.id: row for row in list_children(sup.store, root.id)}
        assert (rows[run.id].outcome, rows[run.id].error) == ("aborted", stopped.diagnostic)
        assert rows[child_id].outcome == "aborted" and rows[child_id].error.startswith("the turn was cancelled (user); ")
        assert rows[crashing.id].outcome == "interrupted"
        for done in (run, crashing):
            await done.dispose()


async def test_a_second_interrupt_of_a_continuable_turn_being_stopped_says_it_stopped_nothing(tmp_path):
    """A turn that ignores its cancel runs on until ``cancel_grace_s``; interrupts in that window
    stopped nothing, and said ``cancelled`` (a probe found it: the one-shot path already said
    ``no_turn_running``). Whoever asks again, user or ancestor, hears that the turn is being stopped."""
    async with continuable_supervisor(tmp_path, cancel_grace_s=5.0) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"say": "spinning"}, {"spin": 60_000}))
        await wait_until(lambda: said(sup.store, child_id) == ["spinning"], what="the spin to start")
        first = await sup.interrupt(child_id, authority=UserAuthority(root.id))
        assert (first.outcome, first.turn) == ("cancelled", 1), first
        for authority in (UserAuthority(root.id), AncestorAuthority(root)):
            again = await sup.interrupt(child_id, authority=authority)
            assert again.outcome == "no_turn_running", again
            assert "already being stopped" in again.detail, again
        await settled(sup, root, child_id)
        assert [e["type"] for e in events_of(sup.store, child_id)].count("turn/end") == 1


async def test_an_ancestor_interrupt_names_the_turn_it_stopped(tmp_path, monkeypatch):
    """The ancestor path read the open turn after its cancel, and a turn that ended quickly was
    reported stopped "before a worker took it", with no turn: it now reads it first, as the user path
    does. The read is held until the turn has ended (or 2 s), which is what a fast turn did to it."""
    read_open_turn = Interrupts._open_turn

    def after_the_turn_ended(self, target_id):
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and "turn/end" not in [e["type"] for e in events_of(sup.store, target_id)]:
            time.sleep(0.01)
        return read_open_turn(self, target_id)

    monkeypatch.setattr(Interrupts, "_open_turn", after_the_turn_ended)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, message_id = await start(sup, root, S({"say": "awake"}, {"sleep": 60_000}))
        await wait_until(lambda: said(sup.store, child_id) == ["awake"], what="the turn to start")
        result = await sup.interrupt(child_id, authority=AncestorAuthority(root))
        assert (result.outcome, result.turn, result.message_id) == ("cancelled", 1, message_id), result
        assert "before a worker took it" not in result.detail
        await settled(sup, root, child_id)


async def test_a_one_shot_turn_that_completed_before_its_interrupt_took_reads_completed_everywhere(tmp_path):
    """Interrupted just after ``start``, a short turn may end before its worker reads the cancel: its
    log says ``completed``, and so do its result and its listing (a cancelled run reads ``aborted`` only
    when its turn did not complete, as the reference maps it). The result said ``aborted`` with the
    completed output beside it, while ``list_children`` said ``completed``. Found by a probe."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        completed = 0
        for attempt in range(40):
            run = await sup.start("script", SubagentRequest(parent=root, prompt='{"script": [{"return": "x"}]}'))
            await sup.interrupt(run.id, authority=UserAuthority(parent_session=root.id))
            result = await run.result()
            await run.dispose()
            logged = [e["data"]["stop_reason"] for e in inspect(sup.store, run.id).events if e["type"] == "turn/end"]
            row = next(r for r in await sup.list_children(root.id) if r.id == run.id)
            if logged == ["completed"]:
                completed += 1
                assert (result.stop_reason, result.output, row.outcome) == ("completed", "x", "completed"), (attempt, result, row)
            else:
                assert (result.stop_reason, row.outcome) in {("aborted", "aborted"), ("aborted", "not-started")}, (attempt, logged, result, row)
        assert completed, "no turn outran its interrupt: the race this test is about did not happen"


async def test_a_turn_another_host_starts_after_the_request_is_named_when_it_stops(tmp_path):
    """A request written while the holder ran no turn aims at the next one; when the holder stops that
    turn, the answer names it (number and message), read from the log. Before, it said ``cancelled``
    with neither (a probe saw it in 4 runs of 5). The holder here is this test, writing as another
    supervisor would through the store: its lease, its control file read, the turn's records."""
    async with continuable_supervisor(tmp_path) as first:
        root = await first.open_root()
        child, _ = await start(first, root, S({"return": "first"}))
        await settled(first, root, child)
        root_id = root.id
    st = first.store
    holder = IdGenerator().new()
    store.register_owner(st, holder, ttl=600.0)  # this test process: alive
    lease = store.acquire_lease(st, child, holder)
    async with continuable_supervisor(tmp_path) as asker:
        async with anyio.create_task_group() as tg:
            answers = []

            async def ask() -> None:
                answers.append(await asker.interrupt(child, authority=UserAuthority(root_id), wait_s=DEADLINE_S))

            tg.start_soon(ask)
            [request] = await wait_until(lambda: read_controls(st, child), what="the interrupt request")
            assert request.data.get("after_message_id") == first_message_id(st, child)
            with store.LogWriter.open(st, child, epoch=lease.epoch) as writer:
                writer.append([("turn/start", {"message_id": "01M00000000000000000000NXT"})], commit=True)
                writer.append([("turn/end", {"stop_reason": "aborted", "cause": "user"})], commit=True)
    [answer] = answers
    assert (answer.outcome, answer.turn, answer.message_id, answer.host) == ("cancelled", 2, "01M00000000000000000000NXT", holder)


async def test_a_request_aimed_after_a_message_never_stops_a_turn_whose_message_came_after_it(tmp_path):
    """A request written while its child ran no turn aims "after the last consumed message". A message
    accepted after the request, whose turn is in flight when the holder reads the request, is not the
    turn it asked to stop (as for a turn not yet dispatched): that turn runs to its end. The child
    stays hosted between its turns (idle, waiting on a grandchild); the holder reads its control
    files only when the test says (``runtime.control.poll``)."""
    gate = tmp_path / "gate"
    async with continuable_supervisor(tmp_path, control_poll_s=3600) as sup:
        root = await sup.open_root()
        child, _ = await start(sup, root, S({"start_continuable": {"prompt": S({"sleep": 60_000}), "label": "g"}}, {"return": "t1"}))
        await wait_until(lambda: turn_ends(sup.store, child) == ["completed"], what="the first turn to end")
        last = [e["data"]["message_id"] for e in events_of(sup.store, child) if e["type"] == "turn/start"][-1]
        control_request(sup.store, child, "interrupt", {"reason": "user", "after_message_id": last}, ids=IdGenerator())
        await sup.followup(root, child, S({"hold": str(gate)}, {"return": "t2"}))  # accepted after the request
        await turn_started(sup, child, 2)
        await sup.runtime.control.poll()  # read only now, with the second turn in flight
        gate.touch()
        await wait_until(lambda: len(turn_ends(sup.store, child)) == 2, what="the second turn to end")
        assert turn_ends(sup.store, child) == ["completed", "completed"]


async def test_an_id_no_session_can_have_is_refused_whatever_the_authority(tmp_path):
    """``../x`` was ``INVALID_SESSION_ID`` with a ``UserAuthority`` and ``no_turn_running`` with an
    ``AncestorAuthority``: the id is checked at the boundary, before the authority is asked."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        for authority in (UserAuthority(parent_session=root.id), AncestorAuthority(root)):
            with pytest.raises(store.InvalidSessionIdError):
                await sup.interrupt("../x", authority=authority)


@pytest.mark.parametrize("authority", ["user", "ancestor"])
async def test_an_interrupt_whose_turn_ended_as_it_was_read_names_the_turn_it_stopped(tmp_path, monkeypatch, authority):
    """Found by a probe (interrupts racing a queue of short turns): the answer named the turn the log showed
    open before the cancel, but that turn completed while it was read and the cancel stopped the next one:
    ``cancelled`` named a message that ran to its end (a caller that sent it again ran it twice), and not the
    one it stopped. It now names the turn the cancel reached."""
    gate = tmp_path / "gate"
    read_open_turn = Interrupts._open_turn
    reads = 0

    def as_the_next_turn_starts(self, target_id):
        nonlocal reads
        reads += 1
        seen = read_open_turn(self, target_id)
        if reads == 1:  # the first turn ends, and the next one starts, between the read and the cancel
            gate.touch()
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline and [e["type"] for e in events_of(sup.store, target_id)].count("turn/start") < 2:
                time.sleep(0.01)
        return seen

    monkeypatch.setattr(Interrupts, "_open_turn", as_the_next_turn_starts)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, first = await start(sup, root, S({"say": "awake"}, {"hold": str(gate)}, {"return": "first"}))
        second = await sup.followup(root, child_id, S({"say": "again"}, {"sleep": 60_000}))
        await wait_until(lambda: said(sup.store, child_id) == ["awake"], what="the first turn to start")
        who = UserAuthority(root.id) if authority == "user" else AncestorAuthority(root)
        result = await sup.interrupt(child_id, authority=who)
        await settled(sup, root, child_id)
        assert turn_ends(sup.store, child_id) == ["completed", "aborted"]
        assert (result.outcome, result.message_id) == ("cancelled", second), result
        assert result.turn in (2, None), result
