"""The supervisor's store thread: one long-lived thread for short blocking store calls (issue #12, item 4)."""

from __future__ import annotations

import contextvars
import json
import os
import threading
import time

import anyio
import pytest

from subagents.store.changes import ChangeWatch
from subagents.store.errors import SessionNotFoundError
from subagents.supervisor import ContinuableSpec
from subagents.store import read_mailbox
from subagents.supervisor.continuable import delivery
from subagents.supervisor.store_thread import StoreThread

from .test_continuable import continuable_supervisor

pytestmark = pytest.mark.anyio


async def test_calls_run_on_one_long_lived_thread_off_the_loop() -> None:
    """Every call runs on the same thread, which is not the event loop's; results come back as returned."""
    st = StoreThread()
    try:
        idents = [await st.run(threading.get_ident) for _ in range(5)]
        assert len(set(idents)) == 1 and idents[0] != threading.get_ident()
        assert await st.run(lambda a, b: a + b, 2, 3) == 5
        assert st.statistics().calls == 6 and st.statistics().overflow == 0
    finally:
        await st.aclose()


async def test_the_statistics_count_the_time_spent_in_calls_apart_from_the_hand_over() -> None:
    """``busy_s`` is the calls' own time on the thread: a call that sleeps 50 ms adds at least that, and
    a call that returns at once adds far less than its caller waited for it."""
    st = StoreThread()
    try:
        assert st.statistics().busy_s == 0.0
        await st.run(time.sleep, 0.05)
        slept = st.statistics().busy_s
        assert 0.05 <= slept < 1.0
        waited = time.perf_counter()
        for _ in range(20):
            await st.run(lambda: None)
        waited = time.perf_counter() - waited
        assert st.statistics().calls == 21
        assert st.statistics().busy_s - slept < waited / 2
    finally:
        await st.aclose()


async def test_a_call_sees_its_callers_context_variables() -> None:
    """As with ``to_thread``: what the calling task bound (the log fields of an activation) is seen by the call."""
    field: contextvars.ContextVar[str] = contextvars.ContextVar("field", default="unbound")
    st = StoreThread()
    try:
        field.set("child-1")
        assert await st.run(field.get) == "child-1"
        field.set("child-2")
        assert await st.run(field.get) == "child-2"
    finally:
        await st.aclose()


async def test_an_exception_in_the_call_is_raised_to_the_caller() -> None:
    """The caller gets the call's own exception object, and the thread keeps serving."""
    st = StoreThread()
    error = SessionNotFoundError("abc")

    def fail() -> None:
        raise error

    try:
        with pytest.raises(SessionNotFoundError) as caught:
            await st.run(fail)
        assert caught.value is error
        assert await st.run(lambda: "still serving") == "still serving"
    finally:
        await st.aclose()


async def test_a_cancelled_caller_waits_for_its_call_to_finish() -> None:
    """Shielded: a call once begun runs to its end and its caller returns only then (an acceptance is never half-done)."""
    st = StoreThread()
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow() -> str:
        started.set()
        release.wait(20)
        finished.append(True)
        return "done"

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                results: list[str] = []

                async def caller(scope: anyio.CancelScope) -> None:
                    with scope:
                        results.append(await st.run(slow))
                        await anyio.sleep(30)  # the pending cancellation is delivered here, after the call

                scope = anyio.CancelScope()
                tg.start_soon(caller, scope)
                await anyio.to_thread.run_sync(started.wait, 20)
                scope.cancel()
                await anyio.sleep(0.05)  # give a wrongly unshielded await the chance to return early
                assert not finished and not results
                release.set()
        assert finished == [True] and results == ["done"]
    finally:
        release.set()
        await st.aclose()


async def test_an_already_cancelled_caller_begins_only_an_uncancellable_call() -> None:
    """``run`` is a checkpoint, as ``to_thread`` is; ``run_uncancellable`` (an acceptance) begins anyway."""
    st = StoreThread()
    ran: list[str] = []
    try:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await st.run(ran.append, "run")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await st.run_uncancellable(ran.append, "uncancellable")
        assert ran == ["uncancellable"]
    finally:
        await st.aclose()


async def test_a_call_made_while_the_thread_is_busy_runs_beside_it() -> None:
    """A slow call never holds a short one behind it: the second runs on another thread at the same time."""
    st = StoreThread()
    first_in, second_done = threading.Event(), threading.Event()

    def first() -> str:
        first_in.set()
        assert second_done.wait(20), "the second call was queued behind the first"
        return "first"

    def second() -> str:
        second_done.set()
        return "second"

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                out: dict[str, str] = {}

                async def call(name: str, fn) -> None:
                    out[name] = await st.run(fn)

                tg.start_soon(call, "first", first)
                await anyio.to_thread.run_sync(first_in.wait, 20)
                tg.start_soon(call, "second", second)
        assert out == {"first": "first", "second": "second"}
        assert st.statistics().calls == 1 and st.statistics().overflow == 1
    finally:
        await st.aclose()


async def test_close_stops_the_thread_and_later_calls_still_run() -> None:
    """``aclose`` joins the thread; a call after it (a late teardown) runs on anyio's worker threads."""
    st = StoreThread()
    thread = await st.run(threading.current_thread)
    await st.aclose()
    assert not thread.is_alive()
    assert await st.run(lambda: 7) == 7
    assert st.statistics().overflow == 1


async def test_followups_to_a_resident_child_are_accepted_on_the_store_thread(tmp_path) -> None:
    """Issue #12, item 4: a followup's durable acceptance takes the supervisor's store thread, not a thread hop each."""
    async with continuable_supervisor(tmp_path, pool_size=1, durability="batched") as sup:
        root = await sup.open_root()
        busy = json.dumps({"script": [{"sleep": 60_000}]})
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=busy, label="busy"))
        with anyio.fail_after(20):
            while sup.statistics().pool.resident == 0:
                await anyio.sleep(0.01)
        before = sup.statistics().store_thread
        for i in range(5):
            await sup.followup(root, child, f"queued {i}")
        after = sup.statistics().store_thread
        assert after.calls - before.calls == 5 and after.overflow == before.overflow
        await sup.drain_children(root, [child])


async def _busy_children(sup, root, count: int) -> list[str]:
    busy = json.dumps({"script": [{"sleep": 60_000}]})
    children = [(await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=busy, label=f"busy {i}")))[0] for i in range(count)]
    with anyio.fail_after(20):
        while sup.statistics().pool.resident < count:
            await anyio.sleep(0.01)
    return children


async def test_a_resident_childs_mailbox_stays_open_from_its_first_followup_to_its_disposal(tmp_path) -> None:
    """Issue #12: a followup to a resident child opens nothing after the first; its disposal closes it."""
    async with continuable_supervisor(tmp_path, pool_size=2, durability="batched") as sup:
        root = await sup.open_root()
        children = await _busy_children(sup, root, 2)
        assert sup.statistics().open_mailboxes == 0
        for child in children:
            for i in range(3):
                await sup.followup(root, child, f"queued {i}")
        assert sup.statistics().open_mailboxes == 2
        assert [len(read_mailbox(sup.store, child)) for child in children] == [4, 4]
        await sup.drain_children(root, children)
        # the children's closed; the root's, which their settlement notices opened, is held until it is released
        assert sup.statistics().open_mailboxes == 1
        await sup.release_root(root)
        assert sup.statistics().open_mailboxes == 0


async def test_open_mailboxes_are_bounded(tmp_path, monkeypatch) -> None:
    """Past ``MAX_OPEN_MAILBOXES`` the least recently delivered-to mailbox is closed; deliveries go on."""
    monkeypatch.setattr(delivery, "MAX_OPEN_MAILBOXES", 1)
    async with continuable_supervisor(tmp_path, pool_size=2, durability="none") as sup:
        root = await sup.open_root()
        children = await _busy_children(sup, root, 2)
        for _ in range(2):
            for child in children:
                await sup.followup(root, child, "queued")
                assert sup.statistics().open_mailboxes == 1
        assert [len(read_mailbox(sup.store, child)) for child in children] == [3, 3]
        await sup.drain_children(root, children)
        assert sup.statistics().open_mailboxes == 1  # the root's, for the children's notices
        await sup.release_root(root)
        assert sup.statistics().open_mailboxes == 0


def _inotify_descriptors() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                found.add(fd)
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
    return found


async def test_held_mailboxes_share_one_change_watch_which_closing_the_supervisor_closes(tmp_path) -> None:
    """The watch that spares a held mailbox a ``stat`` per followup (``store/changes.py``) is one inotify
    instance per supervisor, opened with the first held mailbox, with a kernel watch per held mailbox
    removed with its child's disposal, and closed with the supervisor."""
    probe = ChangeWatch.open()
    if probe is None:
        pytest.skip("no inotify here: held mailboxes compare timestamps")
    probe.close()
    before = _inotify_descriptors()
    async with continuable_supervisor(tmp_path, pool_size=2, durability="none") as sup:
        root = await sup.open_root()
        children = await _busy_children(sup, root, 2)
        assert _inotify_descriptors() == before
        for child in children:
            for i in range(3):
                await sup.followup(root, child, f"queued {i}")
        opened = _inotify_descriptors() - before
        assert len(opened) == 1
        (fd,) = opened

        def watches() -> int:
            with open(f"/proc/self/fdinfo/{fd}") as info:
                return sum(line.startswith("inotify wd:") for line in info)

        assert watches() == 2
        assert [m.content for m in read_mailbox(sup.store, children[0])][1:] == [f"queued {i}" for i in range(3)]
        await sup.drain_children(root, children)
        assert watches() == 1  # the root's mailbox, which the children's settlement notices opened
        await sup.release_root(root)
        assert watches() == 0
    assert _inotify_descriptors() == before
