"""``reindex`` never lists a child nobody was given, and never loses one somebody was.

A child's creation returns its id only after its index entry is appended; a
header without an entry and without any use is a creation its creator never
finished (``store/acknowledgment.py``). ``reindex`` leaves such a child out
(``keep_unacknowledged`` keeps it), puts back a child whose use proves its
entry was lost, and reads the index again under its lock before replacing it,
so an entry a creator appends meanwhile is kept. The real ``kill -9`` of a
creator is ``tests/crash/test_reindex_crash.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from subagents import store
from subagents.store.acknowledgment import evidence_of_use
from subagents.store.fsck import fsck
from subagents.store.index import remove_child
from subagents.store.index_file import IndexFile
from subagents.store.session import NewSession, commit_sessions, publish_sessions

from ._support import CONTINUABLE, ONE_SHOT, blocked_on, make_child, read_file, wait_until, write_file

OLD = time.time() - 600


def listed(st: store.Store, parent: str) -> list[str]:
    return [row.id for row in store.list_children(st, parent)]


def unlisted_child(st: store.Store, root: str, *, one_shot: bool = True) -> str:
    """A child created as a supervisor creates one (leased to its creator; a one-shot child with its
    prompt in its log, a continuable one without), whose entry is then tombstoned and whose creator is
    gone: the index reads as if its creator had died before appending it."""
    child = store.new_id()
    owner = dead_owner(st)
    prompt = [("message/accepted", {"message_id": store.new_id(), "source": {"kind": "user"}, "content": "hi"})]
    make_child(st, root, child, created_at=OLD, lease_owner=owner, descriptor=ONE_SHOT if one_shot else CONTINUABLE,
               events=prompt if one_shot else ())
    remove_child(st, root, child)
    return child


def dead_owner(st: store.Store) -> str:
    """An owner registered by a process that has exited (a creator killed: its record stays)."""
    owner = store.new_id()
    code = "import sys\nfrom subagents import store\nstore.register_owner(store.Store(sys.argv[1]), sys.argv[2], ttl=30.0)\n"
    subprocess.run([sys.executable, "-c", code, st.root, owner], check=True, timeout=60)
    return owner


@pytest.fixture
def root(st: store.Store) -> str:
    root = store.new_id()
    store.create_session(st, root, created_at=OLD)
    return root


@pytest.fixture
def acknowledged(st: store.Store, root: str) -> str:
    child = store.new_id()
    make_child(st, root, child, created_at=OLD)
    return child


def test_an_unacknowledged_child_is_left_out_and_reported(st, root, acknowledged):
    child = unlisted_child(st, root)
    assert listed(st, root) == [acknowledged]
    assert evidence_of_use(st, child) is None
    report = store.reindex(st)
    assert listed(st, root) == [acknowledged]
    assert report.parents == {root: [acknowledged]}
    assert report.left_out == {root: [child]} and report.put_back == {}
    assert st.exists(child), "the session file is left alone: only the index is derived"
    report = store.reindex(st)  # idempotent: still unlisted, still left out
    assert report.left_out == {root: [child]} and listed(st, root) == [acknowledged]


def test_keep_unacknowledged_keeps_it(st, root, acknowledged):
    child = unlisted_child(st, root)
    report = store.reindex(st, keep_unacknowledged=True)
    assert sorted(listed(st, root)) == sorted([acknowledged, child])
    assert report.left_out == {} and report.kept_unacknowledged == {root: [child]}


def test_a_parent_left_with_no_child_keeps_no_entry(st, root):
    child = unlisted_child(st, root)
    report = store.reindex(st)
    assert listed(st, root) == [] and report.left_out == {root: [child]} and root not in report.parents


def _turn_ran(st: store.Store, child: str) -> None:
    lease = store.acquire_lease(st, child, _owner(st))
    with store.LogWriter.open(st, child, epoch=lease.epoch) as writer:
        writer.append([("turn/start", {"message_id": "m"})])
        writer.append([("turn/end", {"stop_reason": "completed", "diagnostic": None})], commit=True)


def _message_accepted(st: store.Store, child: str) -> None:
    store.accept(st, child, source={"kind": "user"}, content="more", ids=store.IdGenerator())


def _lease_taken(st: store.Store, child: str) -> None:
    store.acquire_lease(st, child, _owner(st))


def _lease_released(st: store.Store, child: str) -> None:
    lease = store.read_lease(st, child)
    assert lease is not None
    store.release_lease(st, child, lease.owner, lease.epoch)


def _has_children(st: store.Store, child: str) -> None:
    make_child(st, child, store.new_id(), created_at=OLD)


def _owner(st: store.Store) -> str:
    owner = store.new_id()
    store.register_owner(st, owner, ttl=30.0)
    return owner


@pytest.mark.parametrize("use", [_turn_ran, _message_accepted, _lease_taken, _lease_released, _has_children])
def test_a_used_child_whose_entry_was_lost_is_put_back(st, root, acknowledged, use):
    child = unlisted_child(st, root, one_shot=False)
    use(st, child)
    assert evidence_of_use(st, child, has_children=use is _has_children) is not None
    report = store.reindex(st)
    assert sorted(listed(st, root)) == sorted([acknowledged, child])
    assert report.put_back == {root: [child]} and report.left_out == {}


def test_a_seed_with_turns_is_not_use(st, root):
    """A forked child's seed copies its parent's turns: they were written by its creation."""
    child = store.new_id()
    seed = [{"type": "turn/start", "data": {}}, {"type": "turn/end", "data": {"stop_reason": "completed"}}]
    store.create_session(st, child, parent_session=root, origin="subagent", created_at=OLD, seed=seed,
                         events=[("subagent/descriptor", dict(CONTINUABLE))])
    remove_child(st, root, child)
    assert evidence_of_use(st, child) is None
    assert store.reindex(st).left_out == {root: [child]}


def test_a_damaged_index_keeps_every_child_its_headers_prove(st, root, acknowledged):
    """A skipped record may have listed any of them: none is left out on a guess. Here the skipped record is
    the entry of a child that was acknowledged and never used."""
    child = unlisted_child(st, root)
    path = st.children_index_path(root)
    buf = bytearray(read_file(path))
    buf[store.scan(bytes(buf)).offsets[0] + 12] ^= 0xFF
    write_file(path, bytes(buf))
    assert store.read_index(st, root).needs_reindex and store.read_index(st, root).entries == []
    # until the reindex, listings read the headers beside the damaged index, and show both as it will
    assert sorted(listed(st, root)) == sorted([acknowledged, child])
    report = store.reindex(st)
    assert sorted(listed(st, root)) == sorted([acknowledged, child]) and report.left_out == {}
    assert report.put_back == {root: sorted([acknowledged, child])}


def test_fsck_and_check_name_it_unacknowledged(st, root, acknowledged):
    child = unlisted_child(st, root, one_shot=False)
    findings = fsck(st, repair=False, lease_ttl_s=30.0)["findings"]
    assert [(f["id"], f["kind"]) for f in findings] == [(child, "unacknowledged")]
    assert "--keep-unacknowledged" in findings[0]["detail"]
    report = store.check_store(st)
    assert report.clean and report.counts.creations_interrupted == 1, str(report)
    _message_accepted(st, child)
    findings = fsck(st, repair=False, lease_ttl_s=30.0)["findings"]
    assert [(f["id"], f["kind"]) for f in findings] == [(child, "index-missing")]
    assert [v.kind for v in store.check_store(st).violations] == ["index-missing"]


def test_an_entry_appended_while_reindex_waits_for_the_lock_is_kept(st, root, acknowledged):
    """A creator publishes a child after reindex read the headers and appends its entry before reindex
    replaces the index: the rebuilt index lists it (the lock is held here so that the creator's append
    and reindex's replacement meet at it)."""
    done: dict[str, store.ReindexReport] = {}
    lock = IndexFile(st.children_index_path(root), owner=root, key=f"index/children/{root}")
    lock.acquire()
    try:
        rebuild = threading.Thread(target=lambda: done.setdefault("report", store.reindex(st)))
        rebuild.start()
        time.sleep(0.5)  # reindex reads every header, then polls for the lock held here
        child = store.new_id()
        request = NewSession(child, parent_session=root, origin="subagent", lease_owner=_owner(st),
                             events=[("subagent/descriptor", dict(ONE_SHOT))])
        published = publish_sessions(st, [request])
        outcomes: list = []
        creator = threading.Thread(target=lambda: outcomes.extend(commit_sessions(st, [request], published)))
        creator.start()
        wait_until(lambda: blocked_on(os.getpid(), st.children_index_path(root)), what="the creator to wait for the lock")
    finally:
        lock.close()
    creator.join(30)
    rebuild.join(30)
    assert not isinstance(outcomes[0], BaseException)
    wait_until(lambda: "report" in done, what="reindex")
    assert sorted(listed(st, root)) == sorted([acknowledged, child])
    assert child not in done["report"].left_out.get(root, [])
