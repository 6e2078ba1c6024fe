"""``store.collect`` (issue 15, retention): old settled root subtrees go whole and child-first; nothing else moves.

Stores are built with the store's own API (real files); a session is made old
by setting its files' modification times back (``age``), which is what
``collect`` measures. Live leases are held by owners registered in this
process (alive: its pid runs), as a supervisor's are.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Callable

import pytest

from subagents import store
from subagents.store import Store, check_store, collect
from subagents.store.fsck import fsck
from subagents.store.index import read_children, remove_child
from subagents.store.roots import find_roots, list_roots

from subagents.store.root import COMPANIONS

from ..session_bytes import age, files_of, slot_bytes, write_header, write_slot
from ._support import ONE_SHOT, read_file, tree_state, wait_until

DAY = 86400.0
ENDED = [("turn/start", {}), ("turn/end", {"stop_reason": "completed"})]
FAILED = [("turn/start", {}), ("turn/end", {"stop_reason": "error", "diagnostic": "RuntimeError: boom"})]






def to_trash(st: Store, session_id: str, *, companions: bool = True) -> str:
    """What gc does to a session under its lock: its file into ``trash/<id>.<hex>/session``, then its
    companions beside it (``companions=False``: a gc killed between the two)."""
    os.makedirs(st.trash_dir, exist_ok=True)
    folder = os.path.join(st.trash_dir, f"{session_id}.0badcafe")
    os.mkdir(folder, 0o700)
    os.rename(st.session_path(session_id), os.path.join(folder, "session"))
    for name in COMPANIONS if companions else ():
        if os.path.lexists(st.path(session_id, name)):
            os.rename(st.path(session_id, name), os.path.join(folder, name))
    return folder


def subtree(st: Store, root: str, children: int = 2, *, root_events=(), child_events=ENDED, label: str | None = None,
            old: float | None = 8 * DAY) -> list[str]:
    """A root with ``children`` one-shot children (the first with one grandchild), aged ``old`` seconds."""
    store.create_session(st, root, label=label or root, events=list(root_events))
    ids = [root]
    for i in range(children):
        cid = f"{root}c{i}"
        store.create_session(st, cid, parent_session=root, origin="subagent", delegation_depth=1,
                             events=[("subagent/descriptor", dict(ONE_SHOT)), *child_events])
        ids.append(cid)
        if i == 0:
            gid = f"{cid}g"
            store.create_session(st, gid, parent_session=cid, origin="subagent", delegation_depth=2,
                                 events=[("subagent/descriptor", dict(ONE_SHOT)), *child_events])
            ids.append(gid)
    if old is not None:
        for sid in ids:
            age(st, sid, old)
    return ids


def opened_elsewhere(path: str, mine: int) -> bool:
    """Whether another descriptor of this process (a thread's lock) has ``path`` open."""
    real = os.path.realpath(path)
    for name in os.listdir("/proc/self/fd"):
        if int(name) == mine:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{name}") == real:
                return True
        except OSError:
            continue
    return False


def gone(st: Store, ids: list[str]) -> bool:
    """No file of any of these sessions is left in ``sessions/`` (nor a companion)."""
    return not any(files_of(st, sid) for sid in ids)


def assert_clean(st: Store) -> None:
    report = check_store(st)
    assert report.clean, str(report)
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert found["corrupt"] == [] and not [f for f in found["findings"] if f["kind"] != "clean"], found["findings"]


@pytest.fixture
def st(tmp_path) -> Store:
    return Store(tmp_path / "store", durability="batched")


def test_dry_run_changes_nothing(st: Store) -> None:
    """A dry run reports the subtrees that would go and leaves every byte (and mtime) as it was."""
    subtree(st, "rA")
    subtree(st, "rB")
    before = tree_state(st.root)
    report = collect(st, 7 * DAY, dry_run=True)
    assert [c.id for c in report.collected] == ["rA", "rB"] and report.sessions == 8 and report.dry_run
    assert tree_state(st.root) == before


def test_old_settled_subtrees_go_and_young_ones_stay(st: Store) -> None:
    """Age is the subtree's last activity: an old root with one recently active grandchild stays whole."""
    old = subtree(st, "rOld")
    young = subtree(st, "rYoung", old=None)
    mixed = subtree(st, "rMixed")
    age(st, "rMixedc0g", 60.0)  # active a minute ago, below an 8-day-old root
    report = collect(st, 7 * DAY)
    assert [c.id for c in report.collected] == ["rOld"] and report.young == 2
    (done,) = report.collected
    assert done.sessions == 4 and done.bytes > 0 and done.last_active < time.time() - 7 * DAY
    assert gone(st, old)
    assert all(st.exists(sid) for sid in young + mixed)
    assert sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]
    assert_clean(st)


def test_indexes_and_listings_forget_the_deleted(st: Store) -> None:
    """The roots index and every children index of the subtree drop it; listings and check stay clean."""
    old = subtree(st, "rOld")
    subtree(st, "rKeep", old=None)
    collect(st, 7 * DAY)
    assert [r.id for r in list_roots(st)] == ["rKeep"]
    assert [r.id for r in find_roots(st).rows] == ["rKeep"]
    with open(store.roots.roots_index_path(st), "rb") as handle:  # compacted: no tombstone is left at its end
        assert [r["id"] for r in store.scan(handle.read()).records] == ["rKeep"]
    assert store.rebuild_roots(st) == ["rKeep"]  # the index equals one rebuilt from headers
    for sid in old:
        assert not os.path.lexists(st.children_index_path(sid))
        assert not os.path.lexists(st.children_index_path(sid) + ".lock")
    assert [e.id for e in read_children(st, "rKeep")] == ["rKeepc0", "rKeepc1"]
    assert store.list_descendants(st, "rKeep")
    assert_clean(st)


def test_a_live_lease_anywhere_in_the_subtree_keeps_it_whole(st: Store) -> None:
    """A grandchild held by a live supervisor (an owner whose process runs) keeps its whole root subtree."""
    ids = subtree(st, "rHeld", child_events=[])
    store.register_owner(st, "ownerLive", ttl=60.0)
    store.acquire_lease(st, "rHeldc0g", "ownerLive", state="idle")
    age(st, "rHeldc0g", 8 * DAY)
    report = collect(st, 7 * DAY)
    (kept,) = report.skipped
    assert (kept.id, kept.session, kept.reason) == ("rHeld", "rHeldc0g", "held") and "ownerLive" in kept.detail
    assert all(st.exists(sid) for sid in ids) and not report.collected


def test_an_owner_with_a_late_heartbeat_whose_process_runs_still_holds(st: Store) -> None:
    """Stricter than `status`: a stopped supervisor (heartbeat past its TTL, process alive) is not dead to gc."""
    ids = subtree(st, "rStopped", child_events=[])
    store.register_owner(st, "ownerLate", ttl=0.001)
    store.acquire_lease(st, "rStoppedc1", "ownerLate", state="running")
    age(st, "rStoppedc1", 8 * DAY)
    wait_until(lambda: store.session_status(st, "rStoppedc1") == "complete", what="the heartbeat to expire")
    report = collect(st, 7 * DAY)
    assert [(s.session, s.reason) for s in report.skipped] == [("rStoppedc1", "held")]
    assert all(st.exists(sid) for sid in ids)


def test_a_dead_owners_lease_does_not_hold(st: Store) -> None:
    """A lease whose owner record is gone proves no holder (status complete): the subtree goes."""
    ids = subtree(st, "rDead", child_events=[])
    store.register_owner(st, "ownerGone", ttl=60.0)
    store.acquire_lease(st, "rDeadc1", "ownerGone")
    store.remove_owner(st, "ownerGone")
    age(st, "rDeadc1", 8 * DAY)
    assert [c.id for c in collect(st, 7 * DAY).collected] == ["rDead"] and gone(st, ids)


@pytest.mark.parametrize("damage", ["empty", "garbage", "a folder"])
def test_a_lease_whose_owner_record_does_not_read_keeps_the_subtree(st: Store, damage: str) -> None:
    """An owner file that is there but does not read proves neither a holder nor its death: its
    supervisor may still run (a probe emptied a live host's file, and gc deleted the subtree that
    host was still writing). gc keeps the subtree as unreadable, naming the owner's file."""
    ids = subtree(st, "rBlur", child_events=[])
    store.register_owner(st, "ownerBlur", ttl=60.0)
    store.acquire_lease(st, "rBlurc1", "ownerBlur")
    age(st, "rBlurc1", 8 * DAY)
    path = st.owner_path("ownerBlur")
    os.unlink(path)
    if damage == "a folder":
        os.mkdir(path)
    else:
        with open(path, "wb") as handle:
            handle.write(b"" if damage == "empty" else b"\xc1 not an owner")
    report = collect(st, 7 * DAY)
    assert [(s.session, s.reason) for s in report.skipped] == [("rBlurc1", "unreadable")]
    assert "ownerBlur" in report.skipped[0].detail and "owners/" in report.skipped[0].detail
    assert all(st.exists(sid) for sid in ids) and not report.collected


def test_undelivered_mail_keeps_the_subtree(st: Store) -> None:
    """A message accepted and not taken into a turn keeps its session, and so the whole subtree."""
    ids = subtree(st, "rMail")
    store.accept(st, "rMailc1", source={"kind": "user"}, content="later", ids=store.IdGenerator())
    age(st, "rMailc1", 8 * DAY)
    report = collect(st, 7 * DAY)
    assert [(s.id, s.session, s.reason) for s in report.skipped] == [("rMail", "rMailc1", "mail")]
    assert "1 undelivered" in report.skipped[0].detail
    assert all(st.exists(sid) for sid in ids)


def test_outcome_filters_by_the_roots_outcome(st: Store) -> None:
    """`outcomes` keeps roots of other outcomes ("none": a root that never finished a turn)."""
    subtree(st, "rNone")
    subtree(st, "rDone", root_events=ENDED)
    subtree(st, "rFail", root_events=FAILED)
    report = collect(st, 7 * DAY, outcomes=["error", "none"])
    assert sorted(c.id for c in report.collected) == ["rFail", "rNone"] and report.other_outcome == 1
    assert {c.id: c.outcome for c in report.collected} == {"rFail": "error", "rNone": None}
    assert st.exists("rDone")
    with pytest.raises(store.InvalidQueryError):
        collect(st, 7 * DAY, outcomes=["bogus"])
    with pytest.raises(store.InvalidQueryError, match="not the string 'completed'"):  # was read as c, o, m, p, ...
        collect(st, 7 * DAY, outcomes="completed")
    with pytest.raises(store.InvalidQueryError):
        collect(st, -1.0)
    assert_clean(st)


def test_a_child_whose_header_does_not_read_keeps_the_subtree(st: Store) -> None:
    """Damage is never deleted around: a corrupt child keeps its root (fsck reports it)."""
    ids = subtree(st, "rBad")
    write_header(st, "rBadc1", b"\xc1 not msgpack")
    age(st, "rBadc1", 8 * DAY)
    report = collect(st, 7 * DAY)
    assert [(s.session, s.reason) for s in report.skipped] == [("rBadc1", "unreadable")]
    assert all(os.path.isfile(st.session_path(sid)) for sid in ids)


def test_forks_belong_to_their_sources_subtree(st: Store) -> None:
    """A fork (parent_session, no origin) goes with its source's root: no session is left naming a deleted parent."""
    ids = subtree(st, "rFork")
    store.create_session(st, "rForkF", parent_session="rForkc1")
    age(st, "rForkF", 8 * DAY)
    (done,) = collect(st, 7 * DAY).collected
    assert done.sessions == 5 and gone(st, ids + ["rForkF"])
    assert_clean(st)


def test_an_interrupted_gc_reads_clean_and_the_next_one_finishes(st: Store) -> None:
    """The state a kill leaves mid-subtree (a child in the trash, the index not yet told) is no
    violation; the next collect drops the stale entries, empties the trash, then takes the rest."""
    ids = subtree(st, "rHalf")
    to_trash(st, "rHalfc0g")
    to_trash(st, "rHalfc0")
    report = check_store(st)
    assert report.clean and report.counts.collecting == 2, str(report)  # rHalfc0 under rHalf, rHalfc0g under rHalfc0
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert found["corrupt"] == [] and {f["kind"] for f in found["findings"]} == {"collecting"}
    assert [e.id for e in store.list_children(st, "rHalf")] == ["rHalfc1"]
    before = tree_state(st.root)
    assert collect(st, 7 * DAY, dry_run=True).finished == 2 and tree_state(st.root) == before
    second = collect(st, 7 * DAY)
    assert second.finished == 2 and [c.id for c in second.collected] == ["rHalf"]
    assert gone(st, ids) and sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]
    assert_clean(st)


def test_a_gc_killed_before_the_companions_followed_is_finished_by_the_next(st: Store) -> None:
    """Killed between moving a session's file and its companions: nothing reads the companions left
    in ``sessions/`` (the session does not exist), fsck names them, and the next collect finishes
    the move; a session created again with that id starts without them."""
    ids = subtree(st, "rComp", children=1)
    ids_ = store.IdGenerator()
    for sid in ids:
        store.accept(st, sid, source={"kind": "user"}, content="old mail", ids=ids_)
        with store.LogWriter.open(st, sid, epoch=0) as writer:  # consumed: the mail does not keep the subtree
            writer.append([("message/accepted", {"message_id": store.read_mailbox(st, sid)[0].id, "content": "old mail"})])
        age(st, sid, 8 * DAY)
    to_trash(st, "rCompc0g")  # child first, as gc moves them
    to_trash(st, "rCompc0", companions=False)
    assert not st.exists("rCompc0") and os.path.exists(st.path("rCompc0", "mailbox"))
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert ("rCompc0.mailbox", "stray") in {(f["id"], f["kind"]) for f in found["findings"]}
    report = collect(st, 7 * DAY)
    assert [c.id for c in report.collected] == ["rComp"] and report.finished == 2
    assert gone(st, ids) and sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]
    assert_clean(st)


def test_a_crash_mid_subtree_never_lists_a_removed_child_from_its_settled_row(st: Store) -> None:
    """Children released by a supervisor have `settled` rows a listing reads without their files. gc
    clears them under the locks before it renames: a parent a kill leaves behind lists only what exists."""
    ids = subtree(st, "rRows", child_events=[])
    store.register_owner(st, "ownerRows", ttl=60.0)
    for sid in ids[1:]:  # what a supervisor does: take the lease, run, release (the release writes the row)
        lease = store.acquire_lease(st, sid, "ownerRows")
        with store.LogWriter.open(st, sid, epoch=lease.epoch) as writer:
            writer.append(ENDED, commit=True)
        store.release_lease(st, sid, "ownerRows", lease.epoch)
        age(st, sid, 8 * DAY)
    assert all(e.settled is not None for e in read_children(st, "rRows"))
    # gc's steps 1-2 for this subtree, then a kill before any rename of the root: what the index holds then
    from subagents.store import retention

    state = retention._Pass(st, time.time() - 7 * DAY)
    headers, children, _ = retention._lineage(st)
    plan = retention._plan(state, headers["rRows"], children, headers, frozenset())
    assert isinstance(plan, retention._Plan)
    steps = retention.Steps(retention.KILL_AFTER_ENV)
    room = retention._Room(st, steps)
    os.makedirs(st.trash_dir)
    assert retention._remove(st, plan, state, 100, headers, steps, room) is None
    root_id, root_folder = room.batch[-1]
    assert root_id == "rRows"  # undo the root's move: as if killed just before it
    os.rename(os.path.join(root_folder, "session"), st.session_path("rRows"))
    for name in os.listdir(root_folder):
        os.rename(os.path.join(root_folder, name), st.path("rRows", name))
    os.rmdir(root_folder)
    assert [e.id for e in store.list_children(st, "rRows")] == []
    assert check_store(st).clean
    second = collect(st, 7 * DAY)
    assert [c.id for c in second.collected] == ["rRows"] and gone(st, ids)
    assert_clean(st)


def test_an_interrupted_gc_never_hides_a_root_recreated_with_its_id(st: Store) -> None:
    """Finishing a trashed root tombstones its index entry only if no session of that id exists again."""
    subtree(st, "rAgain", children=0)
    to_trash(st, "rAgain")
    store.create_session(st, "rAgain", label="second life")
    collect(st, 7 * DAY)
    assert [(r.id, r.label) for r in list_roots(st)] == [("rAgain", "second life")]
    assert [r.id for r in find_roots(st).rows] == ["rAgain"]


def test_a_lease_taken_first_wins_over_gc(st: Store) -> None:
    """The rule: whoever takes the session lock first wins. A takeover holding the lock while gc
    plans leaves a live lease that gc sees under the same lock, and the subtree stays."""
    ids = subtree(st, "rRace", child_events=[])
    store.register_owner(st, "ownerRace", ttl=60.0)
    holder = os.open(st.session_path("rRacec1"), os.O_RDONLY)  # the session's lock: flock on its file
    fcntl.flock(holder, fcntl.LOCK_EX)
    result: list[store.GcReport] = []
    worker = threading.Thread(target=lambda: result.append(collect(st, 7 * DAY)))
    worker.start()
    try:
        # gc planned (no lease then) and now waits for this lock; meanwhile the taker holding it
        # does what acquire_lease does under it: write the lease
        wait_until(lambda: opened_elsewhere(st.session_path("rRacec1"), holder), what="gc to wait on the lock")
        lease = store.Lease("ownerRace", 1, "idle", time.time())
        write_slot(st, "rRacec1", 0, slot_bytes({"gen": 0, **lease.to_record(), "synced": True}))
        assert store.read_lease(st, "rRacec1") == lease
        age(st, "rRacec1", 8 * DAY)
    finally:
        os.close(holder)
    worker.join(30)
    (report,) = result
    assert [(s.session, s.reason) for s in report.skipped] == [("rRacec1", "held")]
    assert all(st.exists(sid) for sid in ids) and sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]


def test_a_lease_taken_after_gc_finds_the_session_gone(st: Store) -> None:
    """A taker that waited on the lock while the session's file moved to the trash gets
    SESSION_NOT_FOUND, and writes no lease into the trashed file (the PinnedLock rule)."""
    subtree(st, "rLate", children=0)
    before = read_file(st.session_path("rLate"))
    outcome, folder = behind_a_gc(st, "rLate", lambda: store.acquire_lease(st, "rLate", "ownerLate"))
    assert isinstance(outcome, store.SessionNotFoundError), outcome
    assert not os.path.lexists(st.session_path("rLate"))
    assert read_file(os.path.join(folder, "session")) == before


def behind_a_gc(st: Store, session_id: str, call: Callable[[], object]) -> tuple[object, str]:
    """``call``'s result, or what it raised, when it runs in a thread while this test holds the session's
    lock as gc does, and moves the session to the trash once ``call`` waits on that lock; and the trash folder."""
    holder = os.open(st.session_path(session_id), os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # recorded for the caller's assertions
            outcome.append(exc)

    waiter = threading.Thread(target=run)
    waiter.start()
    try:
        wait_until(lambda: opened_elsewhere(st.session_path(session_id), holder), what="the call to wait on the lock")
        folder = to_trash(st, session_id)  # what gc does under the lock
    finally:
        os.close(holder)
    waiter.join(30)
    assert len(outcome) == 1, outcome
    return outcome[0], folder


def test_many_roots_are_collected_in_batches(st: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """More sessions than one batch (renames, one fsync, index updates, trash removal per batch)."""
    from subagents.store import retention

    monkeypatch.setattr(retention, "_BATCH_SESSIONS", 8)
    quick = Store(st.root, durability="none")
    for i in range(12):
        subtree(quick, f"r{i:03d}", children=2)
    report = collect(st, 7 * DAY)
    assert len(report.collected) == 12 and report.sessions == 12 * 4
    assert st.session_ids() == [] and sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]
    assert list_roots(st) == []
    assert_clean(st)


def test_a_stale_index_entry_never_drags_another_roots_session_in(st: Store) -> None:
    """Headers are the authority: an index entry under an old root naming a session whose header
    names another parent is not part of that subtree, and that session stays."""
    old = subtree(st, "rOld")
    young = subtree(st, "rYoung", old=None)
    store.add_child(st, "rOld", "rYoungc0", created_at=1.0, origin="subagent")
    (done,) = collect(st, 7 * DAY).collected
    assert done.id == "rOld" and done.sessions == len(old) and gone(st, old)
    assert all(st.exists(sid) for sid in young)


def test_a_session_that_does_not_read_and_no_index_places_keeps_every_old_subtree(st: Store) -> None:
    """Audit defect 9: a session file truncated to 0 bytes that no index places (an index rebuilt, or
    damaged) may descend from any root: gc deletes no subtree around it and says which session and why."""
    a = subtree(st, "rA")
    b = subtree(st, "rB")
    young = subtree(st, "rYoung", old=None)
    with open(st.session_path("rAc1"), "wb"):
        pass  # truncated to 0 bytes: no header says where it belongs
    remove_child(st, "rA", "rAc1")  # and no index entry either
    age(st, "rAc1", 8 * DAY)
    for dry_run in (True, False):
        report = collect(st, 7 * DAY, dry_run=dry_run)
        assert report.collected == () and report.young == 1
        assert sorted((s.id, s.session, s.reason) for s in report.skipped) == [("rA", "rAc1", "unreadable"),
                                                                                 ("rB", "rAc1", "unreadable")]
        assert all("no index" in s.detail and "fsck" in s.detail for s in report.skipped)
        assert all(os.path.isfile(st.session_path(sid)) for sid in a + b + young)
    os.unlink(st.session_path("rAc1"))  # the damage dealt with: gc goes on
    assert sorted(c.id for c in collect(st, 7 * DAY).collected) == ["rA", "rB"]


def test_a_root_whose_header_does_not_read_is_reported_not_passed_over(st: Store) -> None:
    """Audit defect 9: a root whose header is corrupt (the roots index lists it) is a kept subtree with
    its reason, not left out of the report; its children stay; the readable old subtree beside it goes."""
    bad = subtree(st, "rBad")
    good = subtree(st, "rGood")
    write_header(st, "rBad", b"\xc1 not msgpack")
    age(st, "rBad", 8 * DAY)
    report = collect(st, 7 * DAY)
    assert [c.id for c in report.collected] == ["rGood"] and gone(st, good)
    assert [(s.id, s.session, s.reason) for s in report.skipped] == [("rBad", "rBad", "unreadable")]
    assert "fsck" in report.skipped[0].detail
    assert all(os.path.isfile(st.session_path(sid)) for sid in bad)


def test_a_strangers_folder_in_the_trash_or_in_an_index_is_set_aside_and_reported(st: Store) -> None:
    """After a gc killed mid-removal and a power loss, ``e2fsck -y`` may leave a name gc is about to
    delete (a trash folder, a children index) naming another program's folder. gc moves it to
    ``trash/.foreign.*`` and deletes nothing in it; the report, ``fsck`` and ``check`` say so on
    every run until an operator removes it, and later gcs leave it where it is."""
    subtree(st, "rOld", children=1)
    subtree(st, "rTwo", children=1)
    to_trash(st, "rTwoc0g")
    stranger = os.path.join(st.trash_dir, "rTwoc0g.0badcafe")
    with open(os.path.join(stranger, "notes.txt"), "w") as handle:
        handle.write("theirs")  # the trash folder now also holds a stranger's file
    index = st.children_index_path("rOldc0g")
    os.makedirs(os.path.join(index, "photos"))  # a stranger's folder where gc will drop the index
    report = collect(st, 7 * DAY)
    assert sorted(c.id for c in report.collected) == ["rOld", "rTwo"] and report.set_aside == 2, report
    aside = sorted(n for n in os.listdir(st.trash_dir) if n.startswith(".foreign."))
    assert [n.rsplit(".", 1)[0] for n in aside] == [".foreign.rOldc0g", ".foreign.rTwoc0g.0badcafe"]
    assert read_file(os.path.join(st.trash_dir, aside[1], "notes.txt")) == b"theirs"
    assert os.path.isdir(os.path.join(st.trash_dir, aside[0], "photos"))
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    set_aside = [f for f in found["findings"] if f["kind"] == "set-aside"]
    assert sorted(f["id"] for f in set_aside) == aside and all("by hand" in f["detail"] for f in set_aside), found
    checked = check_store(st)
    assert checked.clean and checked.counts.set_aside == 2, str(checked)
    again = collect(st, 7 * DAY)
    assert again.set_aside == 2 and again.finished == 0
    assert sorted(n for n in os.listdir(st.trash_dir) if n.startswith(".foreign.")) == aside


def test_a_roots_index_with_no_room_for_its_rewrite_keeps_its_tombstones(st: Store, monkeypatch, caplog) -> None:
    """The last step of a gc rewrites ``index/roots`` whole (a copy as large as the index): on a disk
    with room for the deletions but not for that copy, gc still returns its report, with a warning;
    the tombstones it appended hide the removed roots until a gc with room compacts them."""
    from subagents.store import retention
    from subagents.store.errors import NoRoomError

    ids = subtree(st, "rOld")

    def no_room(_store: Store) -> None:
        raise NoRoomError("write of index/roots failed: [Errno 28] No space left on device")

    monkeypatch.setattr(retention, "compact_roots", no_room)
    report = collect(st, 7 * DAY)
    assert [c.id for c in report.collected] == ["rOld"] and gone(st, ids)
    assert "the roots index was not compacted: no room on the disk" in caplog.text
    assert [r.id for r in list_roots(st)] == [] and check_store(st).clean


def test_a_child_created_under_a_settled_parent_gc_is_removing_is_refused_not_orphaned(st: Store) -> None:
    """Found by a probe: a one-shot ``start`` under a settled root (allowed without opening it) raced
    ``gc``, whose locked re-check of the root's children index ran between the child's publication and
    its index entry: the root went, the child stayed, listed nowhere and never collected. Created
    under the parent's lock (``create_under_settled_parent``), a child waits for a gc holding it,
    and finds the parent gone (SESSION_NOT_FOUND for the parent), with nothing written."""
    from subagents.store.session import NewSession, create_under_settled_parent

    subtree(st, "rGone", children=0)
    index_before = read_children(st, "rGone")
    request = NewSession("rGoneKid", parent_session="rGone", origin="subagent", delegation_depth=1,
                         events=[("subagent/descriptor", dict(ONE_SHOT))])
    outcome, _folder = behind_a_gc(st, "rGone", lambda: create_under_settled_parent(st, request))
    assert isinstance(outcome, store.SessionNotFoundError), outcome
    assert outcome.fields["session_id"] == "rGone"
    assert not os.path.lexists(st.session_path("rGoneKid"))
    assert read_children(st, "rGone") == index_before == []  # no entry for a child of a parent that is gone


def test_a_child_created_under_a_settled_parent_is_indexed_before_gc_may_look(st: Store) -> None:
    """The other order: the creation holds the parent's lock first, so gc's locked re-check finds the new
    child in the index and keeps the subtree ("changed")."""
    from subagents.store.session import NewSession, create_under_settled_parent

    subtree(st, "rKept", children=0)
    created = create_under_settled_parent(st, NewSession("rKeptKid", parent_session="rKept", origin="subagent", delegation_depth=1,
                                                         events=[("subagent/descriptor", dict(ONE_SHOT))]))
    assert created.id == "rKeptKid" and [e.id for e in read_children(st, "rKept")] == ["rKeptKid"]
    age(st, "rKept", 8 * DAY)
    report = collect(st, 7 * DAY)
    assert report.collected == () and st.exists("rKept") and st.exists("rKeptKid")  # the child is young: the subtree stays


def test_check_names_a_child_whose_parent_the_store_no_longer_holds(st: Store) -> None:
    """What the race above left behind, found by no check (and after `store reindex`, reported clean)."""
    subtree(st, "rLeft", children=1)
    to_trash(st, "rLeft")  # the parent went, its children stayed
    report = check_store(st, in_flight_s=0.0)
    assert [(v.session_id, v.kind) for v in report.of_kind("parent-missing")] == [("rLeftc0", "parent-missing")], str(report)
