"""Readers under damage (issue #14): a damaged file is a value about its own session, never an exception.

Listings are covered by ``test_index_catalog.py::test_one_bad_child_never_hides_its_siblings``;
here: the readers one by one, ``fsck``, control records and the children index.
"""

from __future__ import annotations

import logging
import os
import shutil

import msgpack
import pytest

from subagents import store
from subagents.store.control import INVALID, read_controls
from subagents.store.fsck import fsck
from subagents.store.index import read_index

from subagents.store.framing import FRAME, encode_record

from ..session_bytes import (
    SLOT_SIZE, SLOTS_AT, append_log, file_bytes, header_map, log_data, log_start, newest_slot, slot_bytes, synced_slot, write_header,
    write_header_value, write_log, write_slot,
)
from ._support import ONE_SHOT, make_child, read_file, records_blob, tree_state, write_file

TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]


def lease_bytes(**fields):
    """A lease slot that frames and passes its CRC, whatever its fields say."""
    return slot_bytes({"gen": 1, "owner": "o1", "epoch": 1, "state": "running", "acquired_at": 1.0, **fields})


def flipped(slot: bytes) -> bytes:
    """A slot whose frame no longer checks (one payload bit flipped: a torn or rotted write)."""
    buf = bytearray(slot)
    buf[FRAME.size + 3] ^= 0x10
    return bytes(buf)


# -- leases and owners ------------------------------------------------------------------


DAMAGED_SLOTS = [lease_bytes(epoch=float("inf")), lease_bytes(epoch=2.5), lease_bytes(state=["x"]),
                 lease_bytes(acquired_at=float("nan")), lease_bytes(gen=-1), lease_bytes(gen="1"), slot_bytes({"gen": 1}),
                 # counters no write could continue (the next gen or epoch would not pack): damage, not an OverflowError
                 lease_bytes(gen=2**64 - 1), lease_bytes(epoch=2**64 - 1),
                 b"\xc1", flipped(lease_bytes()), b"\xff" * SLOT_SIZE]


@pytest.mark.parametrize("slot", DAMAGED_SLOTS)
def test_a_damaged_lease_reads_as_none_checks_as_corrupt_and_is_never_taken(st, slot):
    """Both slots hold bytes and neither decodes: read_lease never raises; check_lease names the damage;
    acquire refuses instead of restarting the epoch, and writes nothing."""
    store.create_session(st, "s1")
    write_slot(st, "s1", 0, slot)
    write_slot(st, "s1", 1, flipped(lease_bytes(epoch=7)))
    before = file_bytes(st, "s1")
    assert store.read_lease(st, "s1") is None
    assert store.session_status(st, "s1") == "complete"
    with pytest.raises(store.CorruptSessionError):
        store.check_lease(st, "s1")
    with pytest.raises(store.CorruptSessionError):
        store.acquire_lease(st, "s1", "o2")
    with pytest.raises(store.FencedError):
        store.LogWriter.open(st, "s1", epoch=0)
    assert file_bytes(st, "s1") == before


@pytest.mark.parametrize("slot", DAMAGED_SLOTS)
def test_a_torn_lease_slot_falls_back_to_the_other(st, slot):
    """The newest slot damaged (a state change torn by a crash): readers take the other slot, the
    acquisition it holds; the next acquisition continues from its epoch and writes over the damage."""
    store.create_session(st, "s1")
    store.register_owner(st, "o1", ttl=60)
    first = store.acquire_lease(st, "s1", "o1")
    store.set_lease_state(st, "s1", "o1", first.epoch, "idle")
    newest = newest_slot(st, "s1")
    assert newest != synced_slot(st, "s1")
    write_slot(st, "s1", newest, slot)
    assert store.read_lease(st, "s1") == store.check_lease(st, "s1") == first  # running: the state change is lost
    kept = file_bytes(st, "s1")[SLOTS_AT + (1 - newest) * SLOT_SIZE : SLOTS_AT + (2 - newest) * SLOT_SIZE]
    store.set_lease_state(st, "s1", "o1", first.epoch, "idle")  # the holder goes on: over the damage
    assert newest_slot(st, "s1") == newest and store.read_lease(st, "s1").state == "idle"
    assert file_bytes(st, "s1")[SLOTS_AT + (1 - newest) * SLOT_SIZE : SLOTS_AT + (2 - newest) * SLOT_SIZE] == kept
    second = store.acquire_lease(st, "s1", "o1")
    assert second.epoch == first.epoch + 1 and store.read_lease(st, "s1") == second
    assert newest_slot(st, "s1") == synced_slot(st, "s1") == newest  # the damaged slot was the one written


@pytest.mark.parametrize("slot", DAMAGED_SLOTS)
def test_rot_in_the_newest_acquisition_never_hands_its_epoch_out_again(st, slot):
    """The slot holding the newest acquisition rots (a flipped bit, not a crash: that slot is never
    written again while it is the newest synced one). Readers fall back to the acquisition before it,
    one epoch lower, and its holder may still run. The next acquisition must not take the rotted
    epoch again, or that holder's appends would pass the fence check beside the new holder's."""
    store.create_session(st, "s1")
    for owner in ("o1", "o2", "o3"):
        store.register_owner(st, owner, ttl=60)
    first = store.acquire_lease(st, "s1", "o1")
    store.release_lease(st, "s1", "o1", first.epoch)
    held = store.acquire_lease(st, "s1", "o2")  # o2 holds, then freezes (alive, its writer open)
    rotted = synced_slot(st, "s1")
    write_slot(st, "s1", rotted, slot)
    assert store.read_lease(st, "s1").epoch == first.epoch  # what a reader falls back to
    for owner in ("o1", "o2"):  # both read as dead (the fallback is o1's lease before its release)
        store.remove_owner(st, owner)
    taken = store.acquire_lease(st, "s1", "o3")
    assert taken.epoch > held.epoch
    with pytest.raises(store.FencedError):
        store.LogWriter.open(st, "s1", epoch=held.epoch)  # the frozen holder wakes: fenced
    with store.LogWriter.open(st, "s1", epoch=taken.epoch) as writer:
        writer.append([("notice/received", {"n": 1})], commit=True)


@pytest.mark.parametrize("slot", DAMAGED_SLOTS)
def test_a_torn_first_acquisition_reads_as_never_leased(st, slot):
    """A session is created with a synced "never leased" record in slot 0, so its first
    acquisition writes slot 1; when that write tore: no lease, nothing corrupt. The next
    acquisition takes epoch 2: rot in a first acquisition that returned looks the same, and its
    holder may hold epoch 1."""
    store.create_session(st, "s1")
    write_slot(st, "s1", 1, slot)
    assert store.read_lease(st, "s1") is None and store.check_lease(st, "s1") is None
    store.register_owner(st, "o1", ttl=60)
    assert store.acquire_lease(st, "s1", "o1").epoch == 2


@pytest.mark.parametrize("slot", DAMAGED_SLOTS)
def test_the_creation_record_damaged_beside_an_empty_slot_is_damage(st, slot):
    """No write tears the slot holding the newest synced record, so a damaged slot 0 beside an
    empty slot 1 can only be rot or stray bytes: a damaged lease (never guessed to be epoch 0)."""
    store.create_session(st, "s1")
    write_slot(st, "s1", 0, slot)
    assert store.read_lease(st, "s1") is None
    with pytest.raises(store.CorruptSessionError):
        store.check_lease(st, "s1")
    store.register_owner(st, "o1", ttl=60)
    with pytest.raises(store.CorruptSessionError):
        store.acquire_lease(st, "s1", "o1")


@pytest.mark.parametrize("how", ["folder", "loop", "fifo"])
def test_an_unreadable_lease_is_unavailable(st, how):
    """The lease lives in the session's file: when that cannot be read, neither can the lease."""
    store.create_session(st, "s1")
    path = st.session_path("s1")
    os.unlink(path)
    {"folder": lambda: os.mkdir(path), "loop": lambda: os.symlink("s1", path), "fifo": lambda: os.mkfifo(path, 0o600)}[how]()
    assert store.read_lease(st, "s1") is None
    with pytest.raises(store.UnavailableSessionError):
        store.check_lease(st, "s1")
    with pytest.raises(store.UnavailableSessionError):
        store.acquire_lease(st, "s1", "o1")


@pytest.mark.parametrize("fields", [{"pid": float("inf")}, {"ttl": float("inf")}, {"heartbeat_at": "now"}, {"host": 3}])
def test_a_damaged_owner_is_dead(st, fields):
    """An owner record that does not check proves nothing: its leases can be taken."""
    record = store.register_owner(st, "o1", ttl=60.0)
    write_file(st.owner_path("o1"), msgpack.packb({**record.to_record(), **fields}))
    assert store.read_owner(st, "o1") is None
    assert store.owner_alive(store.read_owner(st, "o1")) is False


# -- header and log -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["folder", "fifo"])
def test_a_folder_in_place_of_a_file_is_unavailable_not_an_os_error(st, how):
    """The session's file (header and log) replaced by something that is not a regular file."""
    store.create_session(st, "s1")
    path = st.session_path("s1")
    os.unlink(path)
    os.mkdir(path) if how == "folder" else os.mkfifo(path, 0o600)
    for read in (lambda: store.inspect(st, "s1"), lambda: store.read_header(st, "s1"),
                 lambda: store.LogWriter.open(st, "s1", epoch=0)):
        with pytest.raises(store.UnavailableSessionError) as info:
            read()
        assert info.value.code == "SESSION_UNAVAILABLE" and "file" in info.value.message


def test_an_event_with_a_list_type_is_damage_not_a_type_error(st):
    """A CRC-valid event whose type is a list: the valid prefix ends there (torn at the tail, corrupt before a turn/end)."""
    store.create_session(st, "r")
    make_child(st, "r", "c", events=TURN)
    events = store.inspect(st, "c").events
    bad = [dict(e) for e in events] + [{"seq": len(events), "ts": 1.0, "type": ["x"], "data": {}, "epoch": 0}]
    write_log(st, "c", records_blob(bad)[0])
    found = store.inspect(st, "c")
    assert found.status == "torn" and found.damage.reason == "not-a-record" and "type" in found.damage.detail
    bad[1]["type"] = {"a": 1}
    write_log(st, "c", records_blob(bad)[0])
    assert store.inspect(st, "c").status == "corrupt"


# -- control records ----------------------------------------------------------------------


def control_blob(records):
    return records_blob([{"seq": i, **r} for i, r in enumerate(records)])


def test_a_bad_control_record_is_reported_and_skipped(st):
    """Issue #14 defect 1: {ts: "not a number", data: [1, 2, 3]} once killed the hosting supervisor."""
    store.create_session(st, "s1")
    good = {"id": "a", "ts": 1.0, "kind": "interrupt", "data": {"reason": "user"}}
    blob, offsets = control_blob([good, {"id": "b", "ts": "not a number", "kind": "interrupt", "data": [1, 2, 3]},
                                  {**good, "id": "c"}])
    write_file(st.path("s1", "control"), blob)
    found = read_controls(st, "s1")
    assert [(r.seq, r.kind) for r in found] == [(0, "interrupt"), (1, INVALID), (2, "interrupt")]
    assert "ts" in found[1].problem
    assert [r.seq for r in read_controls(st, "s1", after_seq=1)] == [2]
    # a run of garbage bytes in the middle: the records after it are still read
    buf = bytearray(blob)
    buf[offsets[1] + 9] ^= 0xFF
    write_file(st.path("s1", "control"), bytes(buf))
    found = read_controls(st, "s1")
    assert [(r.seq, r.kind) for r in found] == [(0, "interrupt"), (1, INVALID), (2, "interrupt")]
    assert "crc-mismatch" in found[1].problem
    # a later request appends after the damage, and is read
    store.request(st, "s1", "interrupt", {}, ids=store.IdGenerator())
    assert [r.seq for r in read_controls(st, "s1", after_seq=2)] == [3]


def test_an_unreadable_control_file_reads_as_nothing(st):
    store.create_session(st, "s1")
    os.mkdir(st.path("s1", "control"))
    assert read_controls(st, "s1") == []


# -- the children index -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["wrong-types", "crc", "not-a-map"])
def test_a_bad_index_record_never_drops_the_children_after_it(st, how):
    """Issue #14 defect 3: the bad record is skipped, the rest read, and fsck flags the file for reindex."""
    store.create_session(st, "r", created_at=1.0)
    for i, cid in enumerate(["c1", "c2", "c3"]):
        make_child(st, "r", cid, descriptor={**ONE_SHOT, "label": cid}, created_at=10.0 + i)
    path = st.children_index_path("r")
    found = store.scan(read_file(path))
    records = found.records
    if how == "wrong-types":
        records[1] = {**records[1], "created_at": "yesterday", "origin": ["subagent"]}
        blob = records_blob(records)[0]
    elif how == "not-a-map":
        blob = records_blob(records)[0]
        cut = records_blob(records[:1])[0]
        rest = records_blob(records[2:])[0]
        blob = cut + records_blob([{"seq": 1}])[0][:8] + b"\x93\x01\x02\x03" + rest
        body = b"\x93\x01\x02\x03"
        import zlib
        blob = cut + len(body).to_bytes(4, "little") + zlib.crc32(body).to_bytes(4, "little") + body + rest
    else:
        buf = bytearray(read_file(path))
        buf[found.offsets[1] + 12] ^= 0xFF
        blob = bytes(buf)
    write_file(path, blob)
    read = read_index(st, "r")
    assert [e.id for e in read.entries] == ["c1", "c3"] and read.needs_reindex
    # the listing reads the headers that name the parent too: a damaged index drops no child from it
    assert [r.id for r in store.list_children(st, "r")] == ["c1", "c2", "c3"]
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    assert any(f["kind"] == "index-damaged" and f["id"] == "r" and "reindex" in f["detail"] for f in report["findings"])
    make_child(st, "r", "c4", created_at=20.0)  # an append after the damage is read too
    assert [e.id for e in read_index(st, "r").entries] == ["c1", "c3", "c4"]
    store.reindex(st)
    read = read_index(st, "r")
    assert [e.id for e in read.entries] == ["c1", "c2", "c3", "c4"] and not read.needs_reindex


def test_an_index_file_with_no_readable_record_is_damage_not_an_empty_parent(st):
    """A children index that is garbage from its first byte is not a torn tail: it is flagged for
    reindex (listings warn, fsck reports it) rather than read as a parent with no children."""
    store.create_session(st, "r", created_at=1.0)
    make_child(st, "r", "c1", descriptor={**ONE_SHOT, "label": "c1"}, created_at=10.0)
    write_file(st.children_index_path("r"), b"garbage, not one record\n")
    read = read_index(st, "r")
    assert read.entries == [] and read.needs_reindex
    # nor is the child dropped from its parent's listing: its header names the parent (found by a probe:
    # `ls PARENT` said "(no subagents)" until a reindex, though listings promise to read around damage)
    assert [(r.id, r.label) for r in store.list_children(st, "r")] == [("c1", "c1")]
    # nor from the count `ls` and `show` print beside the parent (it read the damaged index alone: 0)
    assert store.subagent_count(st, "r") == 1
    assert [(row.id, row.children) for row in store.list_roots(st)] == [("r", 1)]
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    assert any(f["kind"] == "index-damaged" and f["id"] == "r" for f in report["findings"])
    store.reindex(st)
    assert [e.id for e in read_index(st, "r").entries] == ["c1"]


# -- fsck ---------------------------------------------------------------------------------


def _damage_everything(st):
    """One session per kind of damage fsck once crashed on, plus a healthy one."""
    store.create_session(st, "ok")
    store.create_session(st, "hdir")
    os.unlink(st.session_path("hdir"))
    os.mkdir(st.session_path("hdir"))  # a folder where a session's file belongs (a format-1 session)
    store.create_session(st, "hloop")
    os.unlink(st.session_path("hloop"))
    os.symlink("hloop", st.session_path("hloop"))
    store.create_session(st, "hfifo")
    os.unlink(st.session_path("hfifo"))
    os.mkfifo(st.session_path("hfifo"), 0o600)
    store.create_session(st, "htrunc")
    os.truncate(st.session_path("htrunc"), log_start(st, "htrunc") - 3)
    store.create_session(st, "linf")
    for slot in (0, 1):
        write_slot(st, "linf", slot, lease_bytes(epoch=float("inf")))
    store.create_session(st, "ldir")
    for slot in (0, 1):
        write_slot(st, "ldir", slot, b"\xc1 not a lease")
    make_child(st, "ok", "evlist", events=TURN)
    events = [dict(e) for e in store.inspect(st, "evlist").events]
    events[1]["type"] = ["turn/start"]
    write_log(st, "evlist", records_blob(events)[0])
    os.unlink(st.children_index_path("ldir"))  # the empty one made with the root
    os.mkdir(st.children_index_path("ldir"))
    store.create_session(st, "ctl")
    os.mkdir(st.path("ctl", "control"))
    write_file(os.path.join(st.sessions_dir, ".new1.new.77.0badf00d"), file_bytes(st, "ok"))  # a creation that died
    write_file(st.path("gone", "mailbox"), b"")  # a companion whose session gc moved away


def test_fsck_reports_and_never_crashes(st):
    _damage_everything(st)
    before = tree_state(st.root)
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    assert tree_state(st.root) == before
    kinds = {(f["id"], f["kind"]) for f in report["findings"]}
    assert {("hdir", "stray"), ("hloop", "unreadable"), ("hfifo", "unreadable"), ("htrunc", "header-corrupt"),
            ("linf", "lease-unreadable"), ("ldir", "lease-unreadable"), ("evlist", "corrupt"), ("ldir", "index-damaged"),
            ("ctl", "control-unreadable"), (".new1.new.77.0badf00d", "no-header"), ("gone.mailbox", "stray")} <= kinds
    assert "ok" not in {f["id"] for f in report["findings"]}
    assert {"hloop", "hfifo", "htrunc"} <= set(report["corrupt"])
    (evlist,) = [f for f in report["findings"] if f["id"] == "evlist"]  # offsets count from the log's start
    found = store.inspect(st, "evlist")
    assert evlist["damage"]["offset"] == found.damage.offset == found.end == len(records_blob(found.events)[0]) > 0
    assert st.session_ids() == sorted(["ok", "htrunc", "linf", "ldir", "evlist", "ctl"])  # regular files only
    assert fsck(st, repair=True, lease_ttl_s=5.0)["counts"] == report["counts"]


def test_fsck_repairs_a_torn_tail_by_what_the_lease_slots_say(st):
    """Repair at epoch 0 only when the slots say the session was never leased; under a new epoch
    (above the acquisition the slots keep, even when the newest slot tore: then one more, past the
    epoch the torn slot could hide) when a dead owner held it; never when both slots are damaged
    (the epoch is unknown: nothing is written)."""
    torn = encode_record({"seq": 99, "type": "turn/start"})[:7]
    store.create_session(st, "never", events=[("subagent/descriptor", ONE_SHOT)])
    store.create_session(st, "dead", events=[("subagent/descriptor", ONE_SHOT)], lease_owner="gone-owner")
    store.create_session(st, "tornslot", events=[("subagent/descriptor", ONE_SHOT)])
    store.register_owner(st, "short", ttl=60)
    first = store.acquire_lease(st, "tornslot", "short")
    second = store.acquire_lease(st, "tornslot", "short")
    store.set_lease_state(st, "tornslot", "short", second.epoch, "idle")
    store.remove_owner(st, "short")  # its owner died
    write_slot(st, "tornslot", newest_slot(st, "tornslot"), b"\xc1" * 30)  # the state change tore
    store.create_session(st, "garbled", events=[("subagent/descriptor", ONE_SHOT)], lease_owner="gone-owner")
    for slot in (0, 1):
        write_slot(st, "garbled", slot, b"\xc1 not a lease")
    for sid in ("never", "dead", "tornslot", "garbled"):
        append_log(st, sid, torn)
    garbled = file_bytes(st, "garbled")
    report = fsck(st, repair=True, lease_ttl_s=5.0)
    repairs = {f["id"]: f.get("repair", "") for f in report["findings"] if f["kind"] == "torn"}
    assert repairs["never"].startswith("repaired at epoch 0") and store.read_lease(st, "never") is None
    assert repairs["dead"].startswith("repaired under lease epoch 2")
    assert repairs["tornslot"].startswith(f"repaired under lease epoch {second.epoch + 2}") and first.epoch < second.epoch
    assert repairs["garbled"].startswith("not repaired") and file_bytes(st, "garbled") == garbled
    for sid in ("never", "dead", "tornslot"):
        assert store.inspect(st, sid).status == "clean"
    assert store.read_lease(st, "tornslot").epoch == second.epoch + 2


def test_a_session_file_copied_under_another_id_is_corrupt(st):
    """A whole session file put at another id's name (a hand copy, a restore gone wrong) is not
    that session: its lease is refused as well as its log, never taken over under the wrong id."""
    store.create_session(st, "c2")
    store.create_session(st, "c3")
    shutil.copyfile(st.session_path("c2"), st.session_path("c3"))
    for read in (store.check_lease, store.read_header, store.inspect):
        with pytest.raises(store.CorruptSessionError, match="names session 'c2'"):
            read(st, "c3")
    store.register_owner(st, "o1", ttl=60)
    with pytest.raises(store.CorruptSessionError):
        store.acquire_lease(st, "c3", "o1")
    assert store.read_lease(st, "c3") is None and store.check_lease(st, "c2") is None


# -- a settled child's row beside its damaged file ------------------------------------------------


def settled_children(st, *ids):
    """Children of ``r`` run and released as a supervisor does: each release writes its ``settled`` row."""
    store.create_session(st, "r")
    store.register_owner(st, "o1", ttl=60.0)
    for cid in ids:
        make_child(st, "r", cid)
        lease = store.acquire_lease(st, cid, "o1")
        with store.LogWriter.open(st, cid, epoch=lease.epoch) as writer:
            writer.append(TURN, commit=True)
        store.release_lease(st, cid, "o1", lease.epoch)
    assert all(e.settled is not None for e in read_index(st, "r").entries)


@pytest.mark.parametrize("cut", ["empty", "header", "last-record"])
def test_a_settled_child_whose_file_is_truncated_lists_as_damaged_and_reindex_keeps_it(st, cut):
    """Audit defect 10: a settled child whose file was truncated listed as healthy from its row, fsck
    called its row harmless and `reindex` dropped it from every listing. Now its row is a diagnostic,
    fsck reports the damage and no harmless row, and reindex keeps its entry; its sibling is untouched."""
    settled_children(st, "c1", "c2")
    sibling = store.list_children(st, "r")[1]
    size = {"empty": 0, "header": log_start(st, "c1") - 5,
            "last-record": log_start(st, "c1") + len(log_data(st, "c1")) - 3}[cut]
    os.truncate(st.session_path("c1"), size)
    expected = [store.DiagnosticEntry("c1", "corrupt"), sibling]
    assert store.list_children(st, "r") == expected
    assert [row.entry for row in store.list_descendants(st, "r")] == expected
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert "c1" in found["corrupt"] or any(f["id"] == "c1" and f["kind"] != "clean" for f in found["findings"])
    assert not [f for f in found["findings"] if f["id"] == "c1" and ("harmless" in f["detail"] or "drops it" in f["detail"])]
    if cut != "last-record":  # its header reads: the entry is proven, the log's damage is the finding
        assert [f["kind"] for f in found["findings"] if f["id"] == "c1"][-1] == "index-unproven"
    store.reindex(st)
    assert [e.id for e in read_index(st, "r").entries] == ["c1", "c2"]
    rows = store.list_children(st, "r")
    assert [row.id for row in rows] == ["c1", "c2"] and rows[1] == sibling
    if cut != "last-record":  # a log cut inside its last record, without the row, reads as a torn tail: its files say
        assert rows[0] == store.DiagnosticEntry("c1", "corrupt")


def test_a_settled_row_of_a_file_cut_only_in_its_padding_stays_as_it_is(st):
    """The zeros after a log's records are not data (FORMAT.md §3.4): cutting them is no damage."""
    settled_children(st, "c1")
    before = store.list_children(st, "r")
    os.truncate(st.session_path("c1"), log_start(st, "c1") + len(log_data(st, "c1")))
    assert store.list_children(st, "r") == before and before[0].kind == "child"


# -- index/roots ----------------------------------------------------------------------------------


def roots_of(st):
    return [r.id for r in store.find_roots(st, limit=None).rows]


GARBAGE = bytes(range(7, 250)) * 2


@pytest.mark.parametrize("where", ["whole", "after-first"])
def test_a_damaged_roots_index_is_rebuilt_by_the_next_root_and_reported_until_then(st, where):
    """Audit defect 8: with index/roots damaged, the next root's creation cut the damage as a torn tail
    (or appended after it) and listings showed the new root alone, without the warning shown before;
    check and fsck said clean. Now fsck and check report the damage, and the next creation rebuilds the
    index from the headers: every root is listed."""
    from subagents.store.roots import roots_index_path

    for rid in ("r1", "r2", "r3"):
        store.create_session(st, rid, created_at=float(rid[1]))
    path = roots_index_path(st)
    kept = read_file(path)[: len(encode_record({"id": "r1", "created_at": 1.0, "seq": 0}))] if where == "after-first" else b""
    write_file(path, kept + GARBAGE)
    # bytes after the first record that are no torn tail (whole frames fail) are damage: listings read the headers
    damaged = [("roots", "index-damaged")]
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert [(f["id"], f["kind"]) for f in found["findings"] if f["kind"] != "clean"] == damaged, found["findings"]
    report = store.check_store(st, in_flight_s=0.0)
    assert [(v.session_id, v.kind) for v in report.violations] == damaged, str(report)
    store.create_session(st, "r4", created_at=4.0)
    assert roots_of(st) == ["r4", "r3", "r2", "r1"]
    assert store.check_store(st).clean
    assert [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] != "clean"] == []


def _two_roots_none_listed(st, left: str) -> None:
    """Roots r1 and r2 (r1 with a child), their index/roots then ``empty`` or left with tombstones alone."""
    from subagents.store.roots import remove_root, roots_index_path

    for rid in ("r1", "r2"):
        store.create_session(st, rid, created_at=float(rid[1]))
    store.create_session(st, "c1", parent_session="r1", origin="subagent")
    if left == "empty":
        os.truncate(roots_index_path(st), 0)
    else:
        for rid in ("r1", "r2"):
            remove_root(st, rid)


@pytest.mark.parametrize("left", ["empty", "tombstones-only"])
def test_a_roots_index_that_lists_no_root_beside_sessions_is_read_around(st, caplog, left):
    """Found by a probe: an index/roots emptied behind the store's back made `ls`, `tree` and `summary`
    show an empty store, silently. An index that lists no root while sessions/ holds sessions is read
    around (the headers, as before the index existed), with a warning naming reindex once a root has
    been missing from it longer than a creation takes."""
    _two_roots_none_listed(st, left)
    with caplog.at_level(logging.WARNING, logger="subagents.store.roots"):
        assert roots_of(st) == ["r2", "r1"]
        assert [r.id for r in store.list_roots(st)] == ["r1", "r2"]
        assert [r.id for r in store.find_roots(st, limit=1).rows] == ["r2"]
    assert any("store reindex" in r.getMessage() for r in caplog.records), caplog.records


def _flip_roots_record(st, index: int, at: int = 5) -> None:
    """Flip byte ``at`` (5: inside its CRC, as the probe did) of record ``index`` of ``index/roots``."""
    from subagents.store.framing import scan
    from subagents.store.roots import roots_index_path

    path = roots_index_path(st)
    data = bytearray(read_file(path))
    data[scan(bytes(data)).offsets[index] + at] ^= 0xFF
    write_file(path, bytes(data))


@pytest.mark.parametrize("record", [0, 1])
def test_one_damaged_record_of_the_roots_index_drops_no_root(st, caplog, record):
    """Found by a probe: one flipped byte in a record of ``index/roots`` dropped that root from `ls`, `tree`
    and `summary` (a warning, then the other roots), while a wholly garbage index fell back to the headers
    and listed every root. The listing now reads the headers beside an index whose records it stepped over,
    as a damaged children index is read (until a reindex; only then), so no root whose header reads drops
    out. ``indexed_roots`` still says what the index lists: check and fsck name the root it lost."""
    from subagents.store.roots import indexed_roots

    for rid in ("r1", "r2", "r3"):
        store.create_session(st, rid, created_at=float(rid[1]))
    store.create_session(st, "c1", parent_session=f"r{record + 1}", origin="subagent")
    _flip_roots_record(st, record)
    with caplog.at_level(logging.WARNING, logger="subagents.store.roots"):
        assert roots_of(st) == ["r3", "r2", "r1"]
        assert [r.id for r in store.list_roots(st)] == ["r1", "r2", "r3"]
        first = store.find_roots(st, limit=2)
        assert [r.id for r in first.rows] == ["r3", "r2"] and first.next_cursor is not None
        assert [r.id for r in store.find_roots(st, limit=2, cursor=first.next_cursor).rows] == ["r1"]
        assert (store.summarize(st).roots, store.summarize(st).subagents) == (3, 1)
    assert any("store reindex" in r.getMessage() for r in caplog.records), caplog.records
    assert indexed_roots(st) == {"r1", "r2", "r3"} - {f"r{record + 1}"}
    missing = [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "index-missing"]
    assert [f["id"] for f in missing] == [f"r{record + 1}"]
    assert "listings miss it" not in missing[0]["detail"] and "read around" in missing[0]["detail"], missing


def test_a_damaged_record_in_the_window_a_page_reads_drops_no_root(st, caplog):
    """The same in an index longer than the first window a newest-first page reads from its end: the
    damaged record lies inside the window, and the page that reaches it lists its root."""
    from subagents.store.roots import _FIRST_WINDOW, roots_index_path

    count = 700
    for i in range(count):
        store.create_session(st, f"r{i:04d}", created_at=float(i + 1))
    assert os.path.getsize(roots_index_path(st)) > _FIRST_WINDOW  # a page of 20 reads the end alone
    _flip_roots_record(st, count - 10)
    with caplog.at_level(logging.WARNING, logger="subagents.store.roots"):
        page = store.find_roots(st, limit=20)
        assert [r.id for r in page.rows] == [f"r{i:04d}" for i in range(count - 1, count - 21, -1)]
        assert [r.id for r in store.find_roots(st, limit=20, cursor=page.next_cursor).rows] == [
            f"r{i:04d}" for i in range(count - 21, count - 41, -1)]
        assert len(roots_of(st)) == count
    assert any("store reindex" in r.getMessage() for r in caplog.records), caplog.records


def test_a_first_root_between_publication_and_entry_is_listed_without_a_warning(st, caplog):
    """The state of an index that lists no root beside a session is also that of a store whose first root
    is being created: that root is listed, and no damage is claimed for it."""
    from subagents.store.roots import roots_index_path

    store.create_session(st, "r1")
    os.truncate(roots_index_path(st), 0)  # as if its entry were not appended yet
    with caplog.at_level(logging.WARNING, logger="subagents.store.roots"):
        assert roots_of(st) == ["r1"]
    assert not caplog.records


def test_a_root_missing_from_the_roots_index_is_reported(st):
    """A top-level header the roots index does not list is missed by every listing that reads the index:
    check and fsck name it (index-missing) for `store reindex`."""
    from subagents.store.roots import remove_root

    for rid in ("r1", "r2"):
        store.create_session(st, rid, created_at=float(rid[1]))
    remove_root(st, "r1")  # the index forgets r1, its header stays
    assert roots_of(st) == ["r2"]
    assert [v.session_id for v in store.check_store(st, in_flight_s=0.0).of_kind("index-missing")] == ["r1"]
    assert [f["id"] for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "index-missing"] == ["r1"]
    store.rebuild_roots(st)
    assert roots_of(st) == ["r2", "r1"]


@pytest.mark.parametrize("left", ["empty", "tombstones-only"])
def test_a_roots_index_that_lists_no_root_beside_sessions_is_reported(st, caplog, left):
    """Found by a probe: with index/roots emptied (or left with tombstones alone) every listing warned
    that it lists no root and named reindex, but check and fsck said clean: the roots it misses were
    compared with the headers' own list, which listings read around it with. Each root it does not
    list is ``index-missing``, as a single damaged record already made it; reindex ends it (without the
    listings' warning that tells to run it)."""
    _two_roots_none_listed(st, left)
    report = store.check_store(st, in_flight_s=0.0)
    assert [(v.session_id, v.kind) for v in report.violations] == [("r1", "index-missing"), ("r2", "index-missing")], str(report)
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert [(f["id"], f["kind"]) for f in found["findings"] if f["kind"] != "clean"] == [
        ("r1", "index-missing"), ("r2", "index-missing")], found["findings"]
    with caplog.at_level(logging.WARNING, logger="subagents.store.roots"):
        assert store.rebuild_roots(st) == ["r1", "r2"]
    assert not caplog.records, caplog.records
    assert store.check_store(st, in_flight_s=0.0).clean
    assert [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] != "clean"] == []


def test_a_first_root_between_publication_and_entry_is_in_flight_for_check(st):
    """The other state of an index that lists no root beside a session: the first root of a store whose
    index was compacted empty, between its header and its entry. ``check`` counts it in flight."""
    from subagents.store.roots import roots_index_path

    store.create_session(st, "r1")
    os.truncate(roots_index_path(st), 0)  # as if its entry were not appended yet
    report = store.check_store(st)
    assert report.clean and report.counts.in_flight == 1, str(report)


def test_rebuilding_the_roots_index_keeps_a_root_whose_header_does_not_read(st):
    """`store reindex` keeps a listed root whose header is damaged (a diagnostic row), as it keeps a
    damaged child: rebuilding from headers alone dropped it from every listing."""
    for rid in ("r1", "r2"):
        store.create_session(st, rid, created_at=float(rid[1]))
    write_header(st, "r1", b"\xc1 not msgpack")
    before = store.find_roots(st, limit=None).rows
    assert [(r.id, r.kind, getattr(r, "reason", None)) for r in before] == [("r2", "root", None), ("r1", "diagnostic", "corrupt")]
    store.rebuild_roots(st)
    assert store.find_roots(st, limit=None).rows == before


def test_a_fifo_in_the_roots_index_s_place_blocks_no_listing(st):
    """A listing of roots opened ``index/roots`` without ``O_NONBLOCK``: a FIFO in its place made it wait
    for a writer, forever (``subagents ls`` hung, and a supervisor's listing on its store thread). Now the
    index is unreadable at once and the listing reads the headers, as for any index it cannot read."""
    import threading

    from subagents.store.roots import roots_index_path

    for rid in ("r1", "r2"):
        store.create_session(st, rid, created_at=float(rid[1]))
    path = roots_index_path(st)
    os.unlink(path)
    os.mkfifo(path, 0o600)
    found: list[list[str]] = []
    thread = threading.Thread(target=lambda: found.append(roots_of(st)), daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # its writer: the blocked open goes on
        thread.join(10)
        pytest.fail("the listing blocked on the FIFO in index/roots")
    assert found == [["r2", "r1"]]


def test_fsck_reports_no_stale_entry_for_a_child_created_after_it_listed_the_sessions(st):
    """A host creating children beside ``fsck``: a child whose file came after fsck's listing of
    ``sessions/`` and whose entry came before fsck read the index was ``index-stale`` ("reindex drops
    it"), though it exists and reindex keeps it (found by a probe: 80 findings in 27 runs)."""
    from subagents.store.fsck import _index_findings

    store.create_session(st, "r", created_at=1.0)
    listed_before = st.session_ids()
    make_child(st, "r", "c1", descriptor={**ONE_SHOT, "label": "c1"}, created_at=10.0)
    assert _index_findings(st, listed_before) == []
    os.unlink(st.session_path("c1"))  # an entry no header proves: stale, as before
    assert [f["kind"] for f in _index_findings(st, st.session_ids())] == ["index-stale"]


def test_fsck_reports_damage_in_a_log_as_the_logs_not_its_mailboxs(st):
    """Found by a probe: zeros in the middle of a child's log (its mailbox untouched) were reported twice, as
    ``corrupt`` and as ``mailbox-damaged`` ("messages sent to it are refused", in ``damaged_mailboxes``): the
    mailbox check reads the log's projection first, and took the log's damage for the mailbox's."""
    from ..session_bytes import patch

    store.create_session(st, "r", created_at=1.0)
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    make_child(st, "r", "c", descriptor={"version": 1, "mode": "continuable", "provider": "p", "label": "c"}, created_at=2.0, lease_owner=owner)
    with store.LogWriter.open(st, "c", epoch=1) as writer:
        writer.append(TURN, commit=True)  # committed: damage before it is corruption, not a torn tail
    store.release_lease(st, "c", owner, 1)
    store.accept(st, "c", source={"kind": "user"}, content="waiting", ids=store.IdGenerator())
    mailbox = read_file(st.path("c", "mailbox"))
    found = store.inspect(st, "c")
    patch(st, "c", log_start(st, "c") + found.offsets[1] + FRAME.size + 8, b"\0" * 20)
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    assert [f["kind"] for f in report["findings"] if f["id"] == "c"] == ["corrupt"], report["findings"]
    assert report["damaged_mailboxes"] == []
    assert read_file(st.path("c", "mailbox")) == mailbox
    # damage in the mailbox itself is still its own finding beside the log's
    write_file(st.path("c", "mailbox"), b"\x13" * 64)
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    assert sorted(f["kind"] for f in report["findings"] if f["id"] == "c") == ["corrupt", "mailbox-damaged"], report["findings"]


@pytest.mark.parametrize("which", ["roots", "children"])
def test_an_index_file_replaced_by_a_folder_is_refused_before_reindex_or_gc_changes_anything(tmp_path, which):
    """Found by a probe: with ``index/roots`` a folder, ``reindex`` failed with SESSION_UNAVAILABLE naming
    a session "roots", and ``gc`` moved every session it collects to its trash, then failed the same way,
    every time after too. Both now refuse first (``STORE_FORMAT``, naming the path and what to do)."""
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "r", created_at=1.0)
    make_child(st, "r", "c", created_at=2.0)
    path = os.path.join(st.index_dir, "roots") if which == "roots" else st.children_index_path("r")
    os.remove(path)
    os.mkdir(path)
    before = tree_state(st.root)
    with pytest.raises(store.StoreFormatError, match="move it out of the store") as refused:
        store.reindex(st)
        store.rebuild_roots(st)
    assert os.path.relpath(path, st.root) in refused.value.message
    if which == "roots":
        with pytest.raises(store.StoreFormatError, match="move it out of the store"):
            store.collect(st, 0)
    assert tree_state(st.root) == before
    os.rmdir(path)  # as the error says: then reindex, and gc, go through
    store.reindex(st, keep_unacknowledged=True)  # the child was never used: only its lost entry proved it was handed out
    store.rebuild_roots(st)
    assert [row.id for row in store.list_children(st, "r")] == ["c"]
    assert store.collect(st, 0).sessions == 2


def test_fsck_reports_a_session_whose_parent_is_gone(st):
    """Found by a probe: with a root's file removed, its child dropped out of every listing; ``store check``
    said so (``parent-missing``), but fsck was silent and exited 0."""
    store.create_session(st, "r", created_at=1.0)
    make_child(st, "r", "c", created_at=2.0)
    make_child(st, "c", "g", created_at=3.0, delegation_depth=2)
    os.remove(st.session_path("r"))
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    assert [(f["id"], f["kind"]) for f in report["findings"] if f["kind"] == "parent-missing"] == [("c", "parent-missing")], report["findings"]


def test_fsck_and_check_report_sessions_whose_parents_loop(st):
    """Seen by hand: headers edited into a loop of parents (``a`` under ``b`` under ``a``, ``s`` under itself)
    dropped those sessions from every listing, and neither ``fsck`` nor ``store check`` said so."""
    from subagents.store.check import check_store

    store.create_session(st, "r", created_at=1.0)
    make_child(st, "r", "a", created_at=2.0)
    make_child(st, "a", "b", created_at=3.0, delegation_depth=2)
    make_child(st, "b", "d", created_at=4.0, delegation_depth=3)  # hangs below the loop: reached once it is mended
    make_child(st, "r", "s", created_at=5.0)
    for session_id, parent in (("a", "b"), ("s", "s")):
        value = dict(header_map(st, session_id))
        value["parent_session"] = parent
        write_header_value(st, session_id, value)
    report = fsck(st, repair=False, lease_ttl_s=5.0)
    looped = [(f["id"], f["kind"]) for f in report["findings"] if f["kind"] == "parent-cycle"]
    assert looped == [("a", "parent-cycle"), ("b", "parent-cycle"), ("s", "parent-cycle")], report["findings"]
    assert "a → b → a" in next(f["detail"] for f in report["findings"] if f["id"] == "a" and f["kind"] == "parent-cycle")
    violations = check_store(st, in_flight_s=0.0)
    assert sorted((v.session_id, v.kind) for v in violations.of_kind("parent-cycle")) == [("a", "parent-cycle"), ("b", "parent-cycle"), ("s", "parent-cycle")], str(violations)


def test_a_folder_in_place_of_the_roots_index_is_named_when_a_root_is_made(tmp_path) -> None:
    """Found by a probe: with ``index/roots`` replaced by a folder, making a root failed ``SESSION_UNAVAILABLE:
    stored session "roots" is unavailable`` (no session is called that), and ``check``'s advice, ``reindex``,
    refused. It is the store's format now, saying to move the folder out first."""
    st = store.Store(str(tmp_path / "st"))
    store.create_session(st, "first")
    os.remove(st.roots_index_path)
    os.mkdir(st.roots_index_path)
    with pytest.raises(store.StoreFormatError) as caught:
        store.create_session(st, "second")
    assert "index/roots in the store at" in caught.value.message and "is a folder" in caught.value.message
    assert "move it out of the store, then run `subagents store reindex`" in caught.value.message
    assert not st.exists("second"), "a root that is in no index is rolled back"
