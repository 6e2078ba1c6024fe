"""The children index and the catalog: order, diagnostics, forks, reindex, read-only listings."""

from __future__ import annotations

import errno
import os
import stat
import sys

import pytest

from subagents import store
import subagents.store.atomic
import subagents.store.durability
import subagents.store.session
from subagents.store.framing import scan

from .. import session_bytes as raw
from ._support import CONTINUABLE, ONE_SHOT, make_child, read_file, records_blob, tree_state, write_file

TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]


@pytest.fixture
def tree(st):
    """r ─┬─ f1 (plain fork, t=5) ── g2 (subagent)
          ├─ c1 (one-shot, t=10) ── g1 (subagent)
          ├─ c2 (continuable, t=10)
          └─ c0 (one-shot, t=20)"""
    store.create_session(st, "r", created_at=1.0)
    store.create_session(st, "f1", parent_session="r", created_at=5.0)
    make_child(st, "r", "c1", descriptor={**ONE_SHOT, "label": "one"}, created_at=10.0, events=TURN)
    make_child(st, "r", "c2", descriptor={**CONTINUABLE, "label": "two"}, created_at=10.0, events=TURN)
    make_child(st, "r", "c0", descriptor={**ONE_SHOT, "label": "zero"}, created_at=20.0, events=TURN)
    make_child(st, "c1", "g1", created_at=30.0)
    make_child(st, "f1", "g2", created_at=31.0)
    return st


def ids(rows):
    return [r.id for r in rows]


def desc(rows):
    return [(r.entry.id, r.parent_id, r.depth, r.entry.kind) for r in rows]


# -- the index ------------------------------------------------------------------------


def test_index_records_and_order(tree):
    """Entries carry id, created_at and origin; reads sort by (created_at, id)."""
    st = tree
    records = scan(read_file(st.children_index_path("r"))).records
    assert [(r["seq"], r["id"], r["origin"]) for r in records] == [(0, "f1", None), (1, "c1", "subagent"), (2, "c2", "subagent"),
                                                                  (3, "c0", "subagent")]
    assert [(e.id, e.created_at, e.origin) for e in store.read_children(st, "r")] == [
        ("f1", 5.0, None), ("c1", 10.0, "subagent"), ("c2", 10.0, "subagent"), ("c0", 20.0, "subagent")]
    assert store.read_children(st, "nobody") == []


def test_index_ignores_bad_ids_and_torn_tails(st):
    """Records with invalid ids are skipped; a torn tail reads as the prefix and is cut by the next append."""
    store.create_session(st, "p")
    blob, _ = records_blob([{"seq": 0, "id": "../evil", "created_at": 1.0, "origin": "subagent"},
                            {"seq": 1, "id": "ok", "created_at": 2.0, "origin": "subagent"},
                            {"seq": 2, "id": "ok", "created_at": 9.0, "origin": "subagent"}])
    write_file(st.children_index_path("p"), blob + b"\x10\x00\x00")
    assert [(e.id, e.created_at) for e in store.read_children(st, "p")] == [("ok", 2.0)]  # the first entry wins
    store.add_child(st, "p", "new", created_at=3.0, origin=None)
    result = scan(read_file(st.children_index_path("p")))
    assert result.damage is None and result.records[-1]["seq"] == 3


def test_index_append_fsyncs_unless_none(any_st, monkeypatch):
    """An index append is a commit point: fsync'd under strict and batched."""
    synced = []

    class SpyOS:
        def __getattr__(self, name):
            return getattr(os, name)

        def fsync(self, fd):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            return os.fsync(fd)

    monkeypatch.setattr(store.durability, "os", SpyOS())
    store.add_child(any_st, "p", "c", created_at=1.0, origin="subagent")
    assert len([p for p in synced if p.endswith("/index/children/p")]) == (0 if any_st.durability.name == "none" else 1)


# -- list_children ----------------------------------------------------------------------


def test_children_in_creation_order_with_ties_and_no_forks(tree):
    """Direct subagent children by (created_at, id); the plain fork is left out silently."""
    rows = store.list_children(tree, "r")
    assert rows == [
        store.ChildEntry("c1", "one", "one-shot", "complete", True, outcome="completed", created_at=10.0),
        store.ChildEntry("c2", "two", "continuable", "complete", False, outcome="completed", created_at=10.0),
        store.ChildEntry("c0", "zero", "one-shot", "complete", False, outcome="completed", created_at=20.0),
    ]
    assert ids(store.list_children(tree, "f1")) == ["g2"]  # a plain session can have subagent children
    assert ids(store.list_children(tree, "c1")) == ["g1"]
    assert store.list_children(tree, "unknown") == []


def test_plain_forks_do_not_make_has_children(tree):
    """has_children counts subagent children only: a plain fork below a child does not."""
    store.create_session(tree, "f2", parent_session="r", created_at=40.0)
    store.create_session(tree, "f3", parent_session="c2", created_at=41.0)
    assert [(r.id, r.has_children) for r in store.list_children(tree, "r")] == [("c1", True), ("c2", False), ("c0", False)]
    make_child(tree, "c2", "g3", descriptor={"version": 99})  # a diagnostic grandchild still counts
    assert [r.has_children for r in store.list_children(tree, "r")] == [True, True, False]


def test_status_follows_the_lease(tree):
    """running / idle while a live owner holds the lease; complete once released."""
    owner = store.register_owner(tree, "o1", ttl=60)
    lease = store.acquire_lease(tree, "c2", owner.owner_id)
    assert [r.status for r in store.list_children(tree, "r")] == ["complete", "running", "complete"]
    store.set_lease_state(tree, "c2", "o1", lease.epoch, "idle")
    assert [r.status for r in store.list_children(tree, "r")] == ["complete", "idle", "complete"]
    store.release_lease(tree, "c2", "o1", lease.epoch)
    assert [r.status for r in store.list_children(tree, "r")] == ["complete"] * 3


def test_seeded_child_lists_under_its_own_descriptor(st):
    """A child whose seed holds an ancestor descriptor is listed under the last one (its own once written)."""
    store.create_session(st, "p")
    seed = [{"type": "subagent/descriptor", "data": {**ONE_SHOT, "label": "ancestor"}}, {"type": "turn/start"},
            {"type": "turn/end", "data": {"stop_reason": "completed"}}]
    store.create_session(st, "own", parent_session="p", origin="subagent", seed=seed, created_at=1.0,
                         events=[("subagent/descriptor", {**CONTINUABLE, "label": "mine"}), ("session/end-seed", {})])
    store.create_session(st, "window", parent_session="p", origin="subagent", seed=seed, created_at=2.0)
    assert [(r.id, r.label, r.mode) for r in store.list_children(st, "p")] == [
        ("own", "mine", "continuable"), ("window", "ancestor", "one-shot")]


# -- diagnostics --------------------------------------------------------------------------


def drop_cache(st, sid):
    if os.path.lexists(st.path(sid, "identity")):
        os.unlink(st.path(sid, "identity"))


def corrupt_log(st, sid):
    found = store.inspect(st, sid)
    buf = bytearray(raw.log_bytes(st, sid))
    buf[found.offsets[1] + 10] ^= 0xFF  # the turn/start: a turn/end follows it
    raw.write_log(st, sid, bytes(buf))
    drop_cache(st, sid)


def unknown_event(st, sid):
    found = store.inspect(st, sid)
    blob, _ = records_blob([{"seq": found.next_seq, "ts": 1.0, "type": "future/event", "data": {}, "epoch": 0}])
    raw.append_log(st, sid, blob)
    drop_cache(st, sid)


def with_cache(st, sid):
    """Grow the log to CACHE_LAG_BYTES and commit: the identity cache a shorter log never has."""
    with store.LogWriter.open(st, sid, epoch=0) as writer:
        writer.append([("notice/received", {"padding": "x" * store.log.CACHE_LAG_BYTES})], commit=True)
    assert os.path.isfile(st.path(sid, "identity"))


def no_descriptor(st, sid):
    os.unlink(st.session_path(sid))
    store.create_session(st, sid, parent_session="r", origin="subagent", created_at=10.0, events=TURN)


def rewrite_header(**changes):
    def damage(st, sid):
        header = dict(raw.header_map(st, sid))
        header.update(changes)
        raw.write_header_value(st, sid, header)
    return damage


def descriptor_child(payload):
    def damage(st, sid):
        os.unlink(st.session_path(sid))
        store.create_session(st, sid, parent_session="r", origin="subagent", created_at=10.0,
                             events=[("subagent/descriptor", payload)] + TURN)
    return damage


def session_path_or(name, st, sid):
    return st.session_path(sid) if name == "session" else st.path(sid, name)


def replace_with_folder(name):
    def damage(st, sid):
        if name == "identity":
            with_cache(st, sid)
        path = session_path_or(name, st, sid)
        os.unlink(path) if os.path.lexists(path) else None
        os.mkdir(path, 0o700)
    return damage


def replace_with_loop(name):
    def damage(st, sid):
        path = session_path_or(name, st, sid)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(os.path.basename(path), path)  # a link to itself: ELOOP
    return damage


def replace_with_fifo(st, sid):
    os.unlink(st.session_path(sid))
    os.mkfifo(st.session_path(sid), 0o600)


def truncate_at(where):
    """The session's file cut inside its preamble, its lease slots or its header."""
    def damage(st, sid):
        end = {"preamble": 6, "slots": raw.SLOTS_AT + 100, "header": raw.log_start(st, sid) - 2}[where]
        os.truncate(st.session_path(sid), end)
    return damage


def lease_record(**fields):
    """Both lease slots hold a CRC-valid record that does not check: no slot to fall back to."""
    def damage(st, sid):
        record = {"gen": 1, "owner": "o1", "epoch": 1, "state": "running", "acquired_at": 1.0, **fields}
        for slot in (0, 1):
            raw.write_slot(st, sid, slot, raw.slot_bytes(record))
    return damage


def lease_garbage(st, sid):
    for slot in (0, 1):
        raw.write_slot(st, sid, slot, b"\xc1")


def newest_lease_slot_torn(st, sid):
    """A lease acquired (durably), then changed in place, then that change torn: the other slot holds."""
    store.register_owner(st, "o1", ttl=600)
    lease = store.acquire_lease(st, sid, "o1")
    store.set_lease_state(st, sid, "o1", lease.epoch, "idle")
    raw.write_slot(st, sid, raw.newest_slot(st, sid), b"\xc1" * 40)
    assert store.read_lease(st, sid) == lease


def creation_leftover(st, sid):
    """A creation of this id that died before its link: a whole file under a temporary name."""
    write_file(os.path.join(st.sessions_dir, f".{sid}.new.4242.0badf00d"), b"SAS2 half a session")


def cache_with(**fields):
    def damage(st, sid):
        from subagents.store.projection import read_cache
        with_cache(st, sid)
        record = read_cache(st.path(sid, "identity")).to_record()
        record.update(fields)
        write_file(st.path(sid, "identity"), store.encode_record({"seq": 0, "projection": record}))
    return damage


def event_envelope(**fields):
    """A CRC-valid event of the wrong shape before a committed turn/end (the log is then corrupt)."""
    def damage(st, sid):
        found = store.inspect(st, sid)
        records = [dict(e) for e in found.events]
        records[1].update(fields)
        blob, _ = records_blob(records)
        raw.write_log(st, sid, blob)
        drop_cache(st, sid)
    return damage


DAMAGES = {
    "garbage-header": (lambda st, sid: raw.write_header(st, sid, b"\xc1\xc1"), "corrupt"),
    "header-frame-overwritten": (lambda st, sid: raw.patch(st, sid, raw.HEADER_AT, b"\xc1" * 12), "corrupt"),
    "header-breaks-rules": (rewrite_header(delegation_depth=-1), "corrupt"),
    "corrupt-log-no-cache": (corrupt_log, "corrupt"),
    "malformed-descriptor": (descriptor_child({"version": 1, "mode": "continuable", "provider": "p"}), "corrupt"),
    "no-descriptor": (no_descriptor, "corrupt"),
    "header-version-2": (rewrite_header(version=2), "unsupported"),
    "descriptor-version-99": (descriptor_child({"version": 99, "mode": "future"}), "unsupported"),
    "unknown-event-type": (unknown_event, "unsupported"),
    # issue #14: each of these raised out of the listing and hid every sibling
    "session-file-is-a-directory": (replace_with_folder("session"), "unavailable"),
    "session-file-is-a-link-loop": (replace_with_loop("session"), "unavailable"),
    "session-file-is-a-fifo": (replace_with_fifo, "unavailable"),
    "file-cut-in-its-preamble": (truncate_at("preamble"), "corrupt"),
    "file-cut-in-its-lease-slots": (truncate_at("slots"), "corrupt"),
    "file-cut-in-its-header": (truncate_at("header"), "corrupt"),
    "magic-overwritten": (lambda st, sid: raw.patch(st, sid, 0, b"SAS1"), "corrupt"),
    "lease-epoch-inf": (lease_record(epoch=float("inf")), "corrupt"),
    "lease-epoch-string": (lease_record(epoch="7"), "corrupt"),
    "lease-is-garbage": (lease_garbage, "corrupt"),
    "lease-newest-slot-torn": (newest_lease_slot_torn, None),
    "creation-leftover-beside-it": (creation_leftover, None),
    "cache-identity-unknown-string": (cache_with(identity="bogus", identity_seq=0), None),
    "cache-seq-inf": (cache_with(seq=float("inf")), None),
    "cache-is-a-directory": (replace_with_folder("identity"), None),
    "event-type-is-a-list": (event_envelope(type=["turn/start"]), "corrupt"),
    "event-ts-is-a-string": (event_envelope(ts="yesterday"), "corrupt"),
    "own-index-is-a-directory": (lambda st, sid: os.mkdir(st.children_index_path(sid), 0o700), None),
}


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_one_bad_child_never_hides_its_siblings(tree, name):
    """Each kind of damage yields its diagnostic in the child's place; the siblings stay healthy."""
    damage, reason = DAMAGES[name]
    damage(tree, "c2")
    rows = store.list_children(tree, "r")
    if reason is None:  # damage of a derived file: the log is the authority, the child stays healthy
        assert rows[1].kind == "child" and rows[1].label == "two"
        return
    assert rows[1] == store.DiagnosticEntry("c2", reason)
    assert [(r.id, r.kind) for r in rows] == [("c1", "child"), ("c2", "diagnostic"), ("c0", "child")]
    assert rows[0].label == "one" and rows[2].label == "zero"
    d = desc(store.list_descendants(tree, "r"))
    assert ("c2", "r", 1, "diagnostic") in d and ("c1", "r", 1, "child") in d and ("g1", "c1", 2, "child") in d
    make_child(tree, "c2", "gc", created_at=51.0)  # a damaged child never hides its own children either
    assert ("gc", "c2", 2, "child") in desc(store.list_descendants(tree, "r"))


def test_diagnostics_never_expose_descriptor_content(tree):
    """A diagnostic row holds only the id, the reason and its index entry's creation time."""
    descriptor_child({"version": 99, "secret": "do-not-show"})(tree, "c2")
    row = store.list_children(tree, "r")[1]
    assert row == store.DiagnosticEntry("c2", "unsupported") and set(vars(row)) == {"id", "reason", "created_at", "kind"}


def test_index_entries_not_proven_by_headers_are_not_listed(tree):
    """An entry whose header is missing, names another parent, or lacks the subagent origin is left out."""
    st = tree
    store.add_child(st, "r", "ghost", created_at=11.0, origin="subagent")  # no header at all
    store.add_child(st, "r", "g1", created_at=12.0, origin="subagent")  # g1's header names c1
    store.create_session(st, "liar", parent_session="c1", created_at=13.0)
    store.add_child(st, "r", "liar", created_at=13.0, origin="subagent")  # plain session claimed as subagent
    assert ids(store.list_children(st, "r")) == ["c1", "c2", "c0"]
    assert ids(store.list_children(st, "c1")) == ["g1"]


# -- rollback ----------------------------------------------------------------------------


def test_rolled_back_creation_is_never_listed(tree, monkeypatch):
    """A creation that fails after publishing its file leaves no session file, no companion and no listed entry."""
    st = tree
    real = store.session.add_child

    def failing(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError("disk full right after the index entry")

    monkeypatch.setattr(store.session, "add_child", failing)
    with pytest.raises(OSError):
        make_child(st, "r", "c5", created_at=15.0)
    monkeypatch.undo()
    assert not [n for n in os.listdir(st.sessions_dir) if "c5" in n]  # no file, no leftover, no companion
    assert ids(store.list_children(st, "r")) == ["c1", "c2", "c0"]
    assert "c5" not in [e.id for e in store.read_children(st, "r")]
    assert scan(read_file(st.children_index_path("r"))).records[-1] == {"seq": 5, "id": "c5", "removed": True}
    with pytest.raises(store.SessionNotFoundError):
        store.inspect(st, "c5")
    store.delete_session(st, "c0", parent_session="r")
    assert ids(store.list_children(st, "r")) == ["c1", "c2"]
    assert "c0" not in [r.entry.id for r in store.list_descendants(st, "r")]
    make_child(st, "r", "c5", created_at=15.0)  # the id is free again
    assert ids(store.list_children(st, "r")) == ["c1", "c2", "c5"]


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "temporary-name"])
@pytest.mark.parametrize("fail", ["write", "link"])
def test_creation_that_fails_before_publishing_leaves_nothing(st, monkeypatch, fail, unnamed):
    """A failure while writing the session's file (half of it written), or while linking it to its
    name, leaves no file and no temporary one; nothing is indexed. Both ways of publishing: an
    unnamed file, and the temporary name of systems without unnamed files."""
    store.create_session(st, "r")
    real_write, real_link = store.atomic._write_whole, os.link

    def failing_write(fd, data, path, **kwargs):
        real_write(fd, data[: len(data) // 2], path, **kwargs)
        raise OSError(errno.ENOSPC, "no space")

    def failing_link(src, dst, *args, **kwargs):
        if os.path.basename(dst) == "c1":
            raise OSError(errno.EIO, "injected")
        return real_link(src, dst, *args, **kwargs)

    if not unnamed:
        monkeypatch.setattr(store.atomic, "_open_unnamed", lambda folder: None)
    if fail == "write":
        monkeypatch.setattr(store.atomic, "_write_whole", failing_write)
    else:
        monkeypatch.setattr(store.atomic.os, "link", failing_link)
    with pytest.raises(OSError):
        make_child(st, "r", "c1")
    monkeypatch.undo()
    assert sorted(os.listdir(st.sessions_dir)) == ["r"]
    assert store.read_children(st, "r") == [] and store.list_children(st, "r") == []
    make_child(st, "r", "c1")  # the id is free
    assert ids(store.list_children(st, "r")) == ["c1"]


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "temporary-name"])
def test_creation_publishes_one_name_and_refuses_a_taken_one(st, monkeypatch, unnamed):
    """A created session's file is its one name in ``sessions/`` (no temporary name is left, or
    made at all where the system has unnamed files), mode 0600; creating a taken id fails with
    ``SessionExistsError`` and leaves the first session's file as it was."""
    made: list[str] = []
    real_open = store.atomic._open_temporary
    monkeypatch.setattr(store.atomic, "_open_temporary", lambda path: made.append(path) or real_open(path))
    if not unnamed:
        monkeypatch.setattr(store.atomic, "_open_unnamed", lambda folder: None)
    store.create_session(st, "r")
    make_child(st, "r", "c1")
    assert sorted(os.listdir(st.sessions_dir)) == ["c1", "r"]
    assert os.stat(st.session_path("c1")).st_mode & 0o777 == 0o600
    assert (made == []) == (unnamed and store.atomic._UNNAMED_FLAG != 0)
    before = read_file(st.session_path("c1"))
    with pytest.raises(store.SessionExistsError):
        store.create_session(st, "c1", parent_session="r", origin="subagent")
    other = store.atomic.write_unnamed(st.session_path("c1"), b"another file")
    try:
        with pytest.raises(FileExistsError):  # the link itself refuses a taken name (two creators racing)
            other.publish()
    finally:
        other.discard()
    assert read_file(st.session_path("c1")) == before
    assert sorted(os.listdir(st.sessions_dir)) == ["c1", "r"]
    assert ids(store.list_children(st, "r")) == ["c1"]


def test_creation_clears_the_companions_a_former_session_of_its_id_left(st, monkeypatch):
    """A session created with an id a former session had (a gc killed mid-move left its companions in
    ``sessions/``) starts without them; a creation of a freshly generated id (``fresh_id``, as a
    supervisor's children are made) has nothing to clear and does not look."""
    store.create_session(st, "r")
    for name in ("mailbox", "control", "identity"):
        write_file(st.path("c1", name), b"a former session's")
    make_child(st, "r", "c1")
    assert sorted(os.listdir(st.sessions_dir)) == ["c1", "r"]

    def looked(*args):
        raise AssertionError("a fresh id's creation looked for companions")

    monkeypatch.setattr(store.session, "_clear_companions", looked)
    fresh = store.IdGenerator().new()
    request = store.session.NewSession(fresh, parent_session="r", origin="subagent", events=[("subagent/descriptor", ONE_SHOT)],
                                       fresh_id=True)
    [outcome] = store.session.create_sessions(st, [request])
    assert outcome.id == fresh and ids(store.list_children(st, "r")) == ["c1", fresh]


def test_a_creation_that_clears_companions_fsyncs_its_file_before_sessions(st, monkeypatch):
    """Clearing a former session's companions fsyncs ``sessions/`` (a durable removal), which also
    writes the new session's name: its file is fsync'd first, so that no power loss leaves that
    name on the disk before the inode it names (a name of an unwritten inode: cleared by
    ``e2fsck``, unreadable without it, a damaged session that holds ``gc`` back)."""
    store.create_session(st, "r")
    write_file(st.path("c1", "mailbox"), b"a former session's")
    sessions = os.lstat(st.sessions_dir).st_ino
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.fstat(fd).st_ino)
        return real_fsync(fd)

    monkeypatch.setattr(store.atomic.os, "fsync", fsync)
    make_child(st, "r", "c1")
    assert not os.path.lexists(st.path("c1", "mailbox"))
    child = os.lstat(st.session_path("c1")).st_ino
    assert child in synced and synced.index(child) < synced.index(sessions)


def test_batch_creation_fails_per_request_and_shares_the_index_append(st, monkeypatch):
    """``create_sessions``: a bad id or a taken id fails alone and leaves nothing; the rest is
    created, durable and listed in order, with one index append for all children of a parent."""
    store.create_session(st, "r")
    store.create_session(st, "taken", parent_session="r", created_at=1.0)
    appends = []
    real = store.session.add_children
    monkeypatch.setattr(store.session, "add_children", lambda *a, **k: appends.append(a[1]) or real(*a, **k))
    desc = [("subagent/descriptor", ONE_SHOT)]
    requests = [
        store.session.NewSession("a1", parent_session="r", origin="subagent", created_at=2.0, events=desc, lease_owner="o"),
        store.session.NewSession("../bad", parent_session="r", origin="subagent", created_at=3.0, events=desc),
        store.session.NewSession("taken", parent_session="r", origin="subagent", created_at=4.0, events=desc),
        store.session.NewSession("a2", parent_session="r", origin="subagent", created_at=5.0, events=desc),
        store.session.NewSession("solo"),
    ]
    outcomes = store.session.create_sessions(st, requests)
    assert [type(o).__name__ for o in outcomes] == ["SessionHeader", "InvalidSessionIdError", "SessionExistsError", "SessionHeader", "SessionHeader"]
    assert appends == ["r"]  # a1 and a2 in one append
    assert ids(store.list_children(st, "r")) == ["a1", "a2"]  # "taken" has no descriptor: a plain fork
    assert [e.id for e in store.read_children(st, "r")] == ["taken", "a1", "a2"]
    assert store.read_header(st, "solo").parent_session is None
    assert store.read_lease(st, "a1").epoch == 1 and store.read_lease(st, "a2") is None
    assert sorted(os.listdir(st.sessions_dir)) == ["a1", "a2", "r", "solo", "taken"]


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "temporary-name"])
def test_batch_creation_names_every_file_then_syncs_each_and_fails_alone_on_a_failed_fsync(st, monkeypatch, unnamed):
    """A batch writes its files, names each, then fsyncs each: after its link, so that the fsync
    writes the file's link count (``tests/crash/test_power_loss.py``). A file whose fsync fails
    loses its name again, its request reports ``DurabilityError``, and the rest of the batch is
    created."""
    store.create_session(st, "r")
    steps: list[str] = []
    real_fsync, real_link = os.fsync, os.link
    syncing = set()

    def spying_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            steps.append("sync folder")
            return real_fsync(fd)
        steps.append("sync")
        if len(syncing) == 1:  # the batch's second file
            syncing.add(fd)
            raise OSError(errno.EIO, "injected")
        syncing.add(fd)
        return real_fsync(fd)

    def spying_link(src, dst, *args, **kwargs):
        steps.append(f"link {os.path.basename(dst)}")
        return real_link(src, dst, *args, **kwargs)

    if not unnamed:
        monkeypatch.setattr(store.atomic, "_open_unnamed", lambda folder: None)
    monkeypatch.setattr(store.atomic.os, "fsync", spying_fsync)
    monkeypatch.setattr(store.atomic.os, "link", spying_link)
    desc = [("subagent/descriptor", ONE_SHOT)]
    requests = [store.session.NewSession(f"c{n}", parent_session="r", origin="subagent", created_at=float(n), events=desc) for n in (1, 2, 3)]
    outcomes = store.session.publish_sessions(st, requests)
    monkeypatch.undo()
    # the failed file's removal is made durable once every fsync of the batch has ended (they may run at
    # once: ``ConcurrentSync``), then its inode written as deleted (FORMAT.md §1, removals)
    assert steps == ["link c1", "link c2", "link c3", "sync", "sync", "sync", "sync folder", "sync"]
    assert [type(o).__name__ for o in outcomes] == ["CreatedSession", "DurabilityError", "CreatedSession"]
    outcomes = store.session.commit_sessions(st, requests, outcomes)
    assert ids(store.list_children(st, "r")) == ["c1", "c3"]
    assert sorted(os.listdir(st.sessions_dir)) == ["c1", "c3", "r"]  # no temporary name is left


def test_batch_creation_rolls_back_the_members_of_a_failed_index_append(st, monkeypatch):
    """When a parent's shared index append fails, each of its children is rolled back; other parents' children stay."""
    store.create_session(st, "p1")
    store.create_session(st, "p2")

    def failing(store_, parent, entries):
        raise OSError("disk full")

    monkeypatch.setattr(store.session, "add_children", failing)
    requests = [store.session.NewSession(f"{p}-{n}", parent_session=p, created_at=float(n)) for p in ("p1", "p2") for n in (1, 2)]
    requests[2:] = [store.session.NewSession("p2-1", parent_session="p2", created_at=1.0)]  # p2 has one child: add_child
    outcomes = store.session.create_sessions(st, requests)
    assert [isinstance(o, OSError) for o in outcomes] == [True, True, False]
    assert sorted(os.listdir(st.sessions_dir)) == ["p1", "p2", "p2-1"]
    assert [e.id for e in store.read_children(st, "p2")] == ["p2-1"]


# -- reindex -------------------------------------------------------------------------------


def test_reindex_rebuilds_the_same_listing(tree):
    """A rebuild from headers lists exactly what the index listed, in index order, without tombstones."""
    st = tree
    store.delete_session(st, "c0", parent_session="r")
    store.add_child(st, "r", "ghost", created_at=2.0, origin="subagent")
    parents = ["r", "c1", "c2", "f1", "g1"]
    before = {p: store.list_children(st, p) for p in parents}
    before_desc = store.list_descendants(st, "r")
    result = store.reindex(st).parents
    assert result == {p: [e.id for e in store.read_children(st, p)] for p in result}
    assert result == {"r": ["f1", "c1", "c2"], "c1": ["g1"], "f1": ["g2"]}
    assert {p: store.list_children(st, p) for p in parents} == before
    assert store.list_descendants(st, "r") == before_desc
    assert all(not r.get("removed") for r in scan(read_file(st.children_index_path("r"))).records)
    for name in os.listdir(st.children_index_dir):
        os.unlink(os.path.join(st.children_index_dir, name))
    # every entry lost: the children that were used (a turn, children of their own) come back; g1 and
    # g2 never ran, so nothing tells them from creations nobody was told of, unless asked to keep them
    lost = store.reindex(st)
    assert lost.put_back == {"r": ["f1", "c1", "c2"]} and lost.left_out == {"c1": ["g1"], "f1": ["g2"]}
    assert store.reindex(st, keep_unacknowledged=True).parents == result
    assert {p: store.list_children(st, p) for p in parents} == before


def test_reindex_drops_files_of_parents_without_children(st):
    """A parent whose every child was rolled back loses its index file."""
    store.create_session(st, "r")
    make_child(st, "r", "c1")
    store.delete_session(st, "c1", parent_session="r")
    assert os.path.exists(st.children_index_path("r"))
    assert store.reindex(st).parents == {}
    assert not os.path.exists(st.children_index_path("r"))


# -- list_descendants ------------------------------------------------------------------------


def test_descendants_pre_order_with_parent_and_depth(tree):
    """Pre-order in sibling order, through the plain fork (which counts as a level but is not a row)."""
    assert desc(store.list_descendants(tree, "r")) == [
        ("g2", "f1", 2, "child"),
        ("c1", "r", 1, "child"),
        ("g1", "c1", 2, "child"),
        ("c2", "r", 1, "child"),
        ("c0", "r", 1, "child"),
    ]
    assert desc(store.list_descendants(tree, "c1")) == [("g1", "c1", 1, "child")]
    assert store.list_descendants(tree, "g1") == [] and store.list_descendants(tree, "unknown") == []


def test_descendants_survive_cycles(tree):
    """Hand-written index records forming cycles (and a self-loop) neither loop nor repeat a row."""
    st = tree
    store.add_child(st, "g1", "c1", created_at=0.0, origin="subagent")
    store.add_child(st, "g1", "r", created_at=0.0, origin="subagent")
    store.add_child(st, "c2", "c2", created_at=0.0, origin="subagent")
    store.add_child(st, "g2", "f1", created_at=0.0, origin=None)
    rows = desc(store.list_descendants(st, "r"))
    assert rows == [("g2", "f1", 2, "child"), ("c1", "r", 1, "child"), ("g1", "c1", 2, "child"), ("c2", "r", 1, "child"),
                    ("c0", "r", 1, "child")]


def test_deep_chain(tmp_path):
    """A chain deeper than the recursion limit allows is walked iteratively."""
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "n0")
    depth = 400
    for i in range(1, depth + 1):
        make_child(st, f"n{i-1}", f"n{i}", created_at=float(i))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)  # a recursive walk of 400 levels could not finish under this limit
    try:
        rows = store.list_descendants(st, "n0")
    finally:
        sys.setrecursionlimit(limit)
    assert [(r.entry.id, r.parent_id, r.depth) for r in rows] == [(f"n{i}", f"n{i-1}", i) for i in range(1, depth + 1)]


# -- read-only ----------------------------------------------------------------------------


def test_listing_changes_no_byte_and_no_mtime(tree):
    """Listings (healthy, diagnostic, leased, cache-less) leave every file and folder as they were."""
    st = tree
    corrupt_log(st, "c2")
    with_cache(st, "c1")  # one child listed from its identity cache, the others folded in memory
    assert not os.path.exists(st.path("c0", "identity"))  # an in-memory fold must not write a cache
    owner = store.register_owner(st, "o1", ttl=60)
    store.acquire_lease(st, "c1", owner.owner_id)
    before = tree_state(st.root)
    for _ in range(2):
        store.list_children(st, "r")
        store.list_descendants(st, "r")
        store.list_children(st, "c1")
        store.read_identity(st, "c0", 0)
    assert tree_state(st.root) == before
