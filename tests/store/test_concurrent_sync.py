"""The fsyncs of a creation batch issued at once (``ConcurrentSync``): each file keeps its own outcome,
nothing waits on a closed pool, and a batch created this way is whole (``check_store``)."""

from __future__ import annotations

import os
import threading

from subagents import store
from subagents.store.atomic import NewFile, write_unnamed
from subagents.store.concurrent_sync import ConcurrentSync
from subagents.store.errors import DurabilityError
from subagents.store.session import NewSession, commit_sessions, publish_sessions


def _linked(tmp_path, count: int) -> list[NewFile]:
    files = []
    for i in range(count):
        new_file = write_unnamed(str(tmp_path / f"f{i}"), b"x" * 100)
        new_file.publish()
        files.append(new_file)
    return files


def _refuse_fsync(path: str) -> None:
    """The descriptor open on ``path`` made a pipe's (``dup2``): its fsync fails with EINVAL, a real refusal."""
    [fd] = [int(fd) for fd in os.listdir("/proc/self/fd") if _points_at(fd, path)]
    read_end, write_end = os.pipe()
    os.dup2(read_end, fd)
    os.close(read_end)
    os.close(write_end)


def _points_at(fd: str, path: str) -> bool:
    try:
        return os.stat(int(fd)).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def _fsync_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("subagents-fsync")]


def test_a_failed_fsync_is_reported_for_its_own_file_in_the_batchs_order(tmp_path):
    files = _linked(tmp_path, 7)
    _refuse_fsync(str(tmp_path / "f2"))  # these two fail, the others do not
    _refuse_fsync(str(tmp_path / "f5"))
    syncs = ConcurrentSync(threads=3)
    try:
        outcomes = syncs.sync_all(files)
    finally:
        syncs.close()
        for new_file in files:
            new_file.discard()
    assert [type(o) for o in outcomes] == [type(None)] * 2 + [DurabilityError] + [type(None)] * 2 + [DurabilityError, type(None)]
    assert str(tmp_path / "f2") in str(outcomes[2])


def test_a_closed_pool_syncs_in_the_callers_thread_and_leaves_no_thread(tmp_path):
    syncs = ConcurrentSync(threads=4)
    files = _linked(tmp_path, 5)
    try:
        assert syncs.sync_all(files) == [None] * 5
        assert len(_fsync_threads()) == 4
        syncs.close()
        assert _fsync_threads() == []
        assert syncs.sync_all(files) == [None] * 5  # after close: one after another, here
        assert _fsync_threads() == []
    finally:
        for new_file in files:
            new_file.discard()


def test_a_batch_published_with_concurrent_fsyncs_is_created_whole(tmp_path):
    st = store.Store(tmp_path / "store", durability="batched")
    store.create_session(st, "root")
    requests = [NewSession(f"c{i}", parent_session="root", origin="subagent", delegation_depth=1) for i in range(12)]
    syncs = ConcurrentSync()
    try:
        outcomes = commit_sessions(st, requests, publish_sessions(st, requests, syncs=syncs))
    finally:
        syncs.close()
    assert [o.id for o in outcomes if not isinstance(o, BaseException)] == [r.session_id for r in requests]
    assert sorted(e.id for e in store.read_children(st, "root")) == sorted(r.session_id for r in requests)
    assert store.check_store(st).violations == ()
