"""Concurrent starts share creation work; a one-shot child's lease is released by its worker."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

import subagents.supervisor.creator
import subagents.supervisor.oneshot
from subagents import supervisor
from subagents.store import IndexEntry, SessionExistsError, Store, check_store, create_session, read_children, read_index, read_lease
from subagents.store.session import NewSession
from subagents.supervisor import SubagentRequest
from subagents.supervisor.creator import SessionCreator
from subagents.supervisor.errors import SupervisorClosedError

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


async def test_concurrent_starts_are_created_in_few_hops(tmp_path, monkeypatch):
    """40 starts at once: every child is created, published, run and listed, in far fewer thread hops and commits."""
    batches: list[int] = []
    real = supervisor.creator.publish_sessions

    def counting(store, requests, **kwargs):
        batches.append(len(requests))
        return real(store, requests, **kwargs)

    monkeypatch.setattr(supervisor.creator, "publish_sessions", counting)
    async with open_supervisor(tmp_path, pool_size=2, durability="batched") as sup:
        root = await sup.open_root()
        outputs: dict[int, str | None] = {}

        async def one(i: int) -> None:
            run = await sup.start("echo", SubagentRequest(parent=root, prompt=f"hello {i}"))
            outputs[i] = (await run.result()).output
            await run.dispose()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(one, i)
        assert outputs == {i: f"hello {i}" for i in range(40)}
        assert sum(batches) == 40 and len(batches) < 40 and max(batches) > 1
        created = sup.statistics().creation
        assert created.sessions == 40 and created.hops == len(batches) and created.commits <= created.hops
        listed = await sup.list_children(root.id)
        assert len(listed) == 40 and {c.status for c in listed} == {"complete"}
        assert len(read_children(sup.store, root.id)) == 40


def test_drains_that_publish_during_a_commit_share_the_next_one(tmp_path, monkeypatch):
    """Issue #12, item 2: sessions published while a commit runs are committed together, in one
    fsync of ``sessions/`` and one index append, however many drain threads published them."""
    st = Store(tmp_path / "store", durability="batched")
    create_session(st, "root")
    group = supervisor.creator._GroupCommit(st)
    first_commit_entered, release_first = threading.Event(), threading.Event()
    commits: list[list[str]] = []
    real = supervisor.creator.commit_sessions

    def commit(store, requests, outcomes):
        commits.append([r.session_id for r in requests])
        if len(commits) == 1:
            first_commit_entered.set()
            assert release_first.wait(30)
        return real(store, requests, outcomes)

    monkeypatch.setattr(supervisor.creator, "commit_sessions", commit)
    results: dict[str, str] = {}

    def create(sid: str) -> None:
        [outcome] = group.create([NewSession(sid, parent_session="root")])
        results[sid] = outcome.id

    first = threading.Thread(target=create, args=("a",))
    first.start()
    assert first_commit_entered.wait(30)
    followers = [threading.Thread(target=create, args=(sid,)) for sid in ("b", "c", "d")]
    for thread in followers:
        thread.start()
    deadline = time.monotonic() + 30
    while group.waiting() < 3:  # each follower has published and waits for the next commit
        assert time.monotonic() < deadline
        time.sleep(0.001)
    release_first.set()
    for thread in [first, *followers]:
        thread.join(30)
    assert results == {"a": "a", "b": "b", "c": "c", "d": "d"}
    assert commits[0] == ["a"] and sorted(commits[1]) == ["b", "c", "d"] and len(commits) == 2
    assert sorted(e.id for e in read_children(st, "root")) == ["a", "b", "c", "d"]
    assert group.commits == 2 and group.sessions == 4


async def test_a_busy_store_thread_takes_what_queued_meanwhile_in_one_batch(tmp_path, monkeypatch):
    """Issue #12, items 2 and 4: starts that arrive while the store thread works are not each handed
    to a thread of their own; the thread takes them all as its next batch."""
    st = Store(tmp_path / "store", durability="batched")
    create_session(st, "root")
    entered, release = threading.Event(), threading.Event()
    batches: list[list[str]] = []
    real = supervisor.creator.publish_sessions

    def publish(store, requests, **kwargs):
        batches.append([r.session_id for r in requests])
        if len(batches) == 1:
            entered.set()
            assert release.wait(30)
        return real(store, requests, **kwargs)

    monkeypatch.setattr(supervisor.creator, "publish_sessions", publish)
    creator = SessionCreator(st, threads=1)
    created: list[str] = []

    async def one(sid: str) -> None:
        created.append((await creator.create(NewSession(sid, parent_session="root"))).id)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a")
            while not entered.is_set():
                await anyio.sleep(0.001)
            for sid in ("b", "c", "d", "e", "f"):
                tg.start_soon(one, sid)
            while creator.statistics().queued < 5:
                await anyio.sleep(0.001)
            release.set()
    await creator.aclose()
    assert batches == [["a"], ["b", "c", "d", "e", "f"]]
    assert sorted(created) == ["a", "b", "c", "d", "e", "f"]
    stats = creator.statistics()
    assert (stats.sessions, stats.hops, stats.commits, stats.queued) == (6, 2, 2, 0)
    with pytest.raises(SupervisorClosedError):
        await creator.create(NewSession("late", parent_session="root"))


async def test_a_failing_request_fails_alone_in_its_batch(tmp_path):
    """A taken id raises for its own caller; the requests created with it in one batch succeed."""
    st = Store(tmp_path / "store", durability="batched")
    create_session(st, "root")
    create_session(st, "taken", parent_session="root")
    results: dict[str, object] = {}
    creator = SessionCreator(st, threads=1)
    async with anyio.create_task_group() as tg:

        async def one(sid: str) -> None:
            try:
                results[sid] = (await creator.create(NewSession(sid, parent_session="root"))).id
            except SessionExistsError as exc:
                results[sid] = exc.code

        for sid in ("c1", "taken", "c2", "c3"):
            tg.start_soon(one, sid)
    await creator.aclose()
    assert results == {"c1": "c1", "taken": "SESSION_EXISTS", "c2": "c2", "c3": "c3"}
    assert sorted(e.id for e in read_children(st, "root")) == ["c1", "c2", "c3", "taken"]


async def test_the_worker_releases_a_one_shot_lease(tmp_path, monkeypatch):
    """After the turn's commit the worker releases the child's lease; the supervisor never has to."""
    host_releases: list[str] = []
    real = supervisor.oneshot.release_lease
    monkeypatch.setattr(supervisor.oneshot, "release_lease", lambda st, sid, *a: host_releases.append(sid) or real(st, sid, *a))
    async with open_supervisor(tmp_path, durability="batched") as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="x"))
        assert (await run.result()).output == "x"
        lease = read_lease(sup.store, run.id)
        assert lease is not None and lease.state == "released" and lease.epoch == 1
        await run.dispose()
    assert host_releases == []


class HeldGrandchildCreation:
    """Holds the creation of any session whose parent is not one of ``roots`` (a grandchild) until
    ``unblock`` is set; ``entered`` says one is being held. The real creation runs after."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.unblock = threading.Event(), threading.Event()
        self.roots: list[str] = []
        real = supervisor.creator.publish_sessions

        def publish(store, requests, **kwargs):
            if any(r.parent_session not in self.roots for r in requests):
                self.entered.set()
                assert self.unblock.wait(30)
            return real(store, requests, **kwargs)

        monkeypatch.setattr(supervisor.creator, "publish_sessions", publish)


async def test_a_child_cancelled_while_its_own_child_is_created_is_released_after_that_creation(tmp_path, monkeypatch):
    """A turn stopped during ``spawn`` must not release its lease (and write its catalog row) before the
    grandchild's creation lands in its children index: the row would say it has no children while its
    index lists one (``store check``: index-row). The worker leaves that release to the supervisor, which
    waits for the start; the late grandchild is cancelled with its parent's turn."""
    held = HeldGrandchildCreation(monkeypatch)
    async with open_supervisor(tmp_path, pool_size=2, durability="batched") as sup:
        root = await sup.open_root()
        held.roots.append(root.id)
        prompt = '{"script": [{"spawn": {"prompt": "{\\"script\\": [{\\"return\\": \\"g\\"}]}", "provider": "script"}}]}'
        run = await sup.start("script", SubagentRequest(parent=root, prompt=prompt))
        with anyio.fail_after(30):
            while not held.entered.is_set():
                await anyio.sleep(0.001)
            run.cancel()
            while sup.statistics().pool.resident:  # the worker has ended the turn (and, before, would have released)
                await anyio.sleep(0.001)
        held.unblock.set()
        result = await run.result()
        await run.dispose()
        assert result.stop_reason == "aborted"
        [entry] = read_children(sup.store, run.id)
        [row] = [e for e in read_index(sup.store, root.id).entries if e.id == run.id]
        assert row.settled is not None and row.settled.has_children, row
        assert read_lease(sup.store, entry.id).state == "released"
    report = check_store(tmp_path / "store")
    assert report.clean, str(report)


async def test_a_continuable_child_interrupted_while_its_own_child_is_created_settles_after_that_creation(tmp_path, monkeypatch):
    """The continuable twin of the test above: a turn interrupted during ``spawn`` ends, but the child
    settles (releases its lease and writes its catalog row) only once the grandchild's creation has
    landed in its children index, so the row's ``has_children`` is true and ``store check`` is clean."""
    from subagents.supervisor import ContinuableSpec, UserAuthority

    from .test_continuable import S, continuable_supervisor

    held = HeldGrandchildCreation(monkeypatch)
    async with continuable_supervisor(tmp_path, durability="batched") as sup:
        root = await sup.open_root()
        held.roots.append(root.id)
        grandchild = S({"return": "g"})
        child_id, _ = await sup.start_continuable(ContinuableSpec(
            parent=root, provider="script", label="parent", prompt=S({"spawn": {"prompt": grandchild, "provider": "script"}})))
        with anyio.fail_after(30):
            while not held.entered.is_set():
                await anyio.sleep(0.001)
            result = await sup.interrupt(child_id, authority=UserAuthority(parent_session=root.id))
            assert result.outcome == "cancelled"
            while sup.statistics().pool.resident:  # the worker has ended the turn
                await anyio.sleep(0.001)
            await anyio.sleep(0.2)  # room for a settlement that does not wait (the bug this pins)
        held.unblock.set()

        def settled_row() -> IndexEntry | None:
            [row] = [e for e in read_index(sup.store, root.id).entries if e.id == child_id]
            return row if row.settled is not None else None

        # the release writes the lease, then the row, in one critical section of the session lock,
        # which a reader does not take: a lease read released may still have its row to come
        with anyio.fail_after(30):
            while (row := settled_row()) is None:
                await anyio.sleep(0.01)
        assert row.settled is not None and row.settled.has_children, row
        assert read_lease(sup.store, child_id).state == "released"
    report = check_store(tmp_path / "store")
    assert report.clean, str(report)
