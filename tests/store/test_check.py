"""``check_store`` (issue 16): each invariant broken on purpose is found, with its session and evidence.

Stores are built through the store's own writers, then damaged by hand: a
record appended with a chosen epoch or message id, a byte flipped, an index
file rewritten, an owner record removed. A clean store, a torn tail and the
leases of a crashed owner are reported clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from subagents import store
from subagents.store.check import check_store
from subagents.store.framing import encode_record

from ..session_bytes import append_log, log_bytes, write_header, write_log, write_slot
from ._support import CONTINUABLE, ONE_SHOT, make_child, read_file, write_file

OLD = time.time() - 600  # created long ago: no discrepancy of these is a creation in flight


def append_events(st: store.Store, session_id: str, *events: tuple[str, Any, int]) -> None:
    """Append ``(type, data, epoch)`` records after the log's valid prefix, bypassing the fence."""
    seq = store.inspect(st, session_id).next_seq
    blob = b"".join(encode_record({"seq": seq + i, "ts": time.time(), "type": kind, "data": data, "epoch": epoch})
                    for i, (kind, data, epoch) in enumerate(events))
    append_log(st, session_id, blob)


def leased(st: store.Store, session_id: str, epochs: int = 1) -> store.Lease:
    """Acquire (and release) the lease ``epochs`` times under a registered owner; the last stays held."""
    owner = store.new_id()
    store.register_owner(st, owner, ttl=30.0)
    lease = store.acquire_lease(st, session_id, owner)
    for _ in range(epochs - 1):
        store.release_lease(st, session_id, owner, lease.epoch)
        lease = store.acquire_lease(st, session_id, owner)
    return lease


def tree(st: store.Store) -> tuple[str, str]:
    root = store.new_id()
    store.create_session(st, root, created_at=OLD)
    child = store.new_id()
    make_child(st, root, child, descriptor=CONTINUABLE, created_at=OLD)
    return root, child


def only(report, kind: str):
    assert [v.kind for v in report.violations] == [kind], str(report)
    return report.violations[0]


def test_a_clean_store_is_clean(st):
    """Roots, children, consumed messages and released leases: no violation, and the counts add up."""
    root, child = tree(st)
    ids = store.IdGenerator()
    first = store.accept(st, child, source={"kind": "user"}, content="hi", ids=ids)
    lease = leased(st, child)
    with store.LogWriter.open(st, child, epoch=lease.epoch) as writer:
        writer.append([("message/accepted", {"message_id": first, "content": "hi"}), ("turn/start", {}),
                       ("turn/end", {"stop_reason": "completed"})], commit=True)
    store.release_lease(st, child, lease.owner, lease.epoch)
    report = check_store(st.root)
    assert report.clean, str(report)
    assert report.counts.sessions == 2
    assert (report.counts.messages_accepted, report.counts.messages_consumed, report.counts.messages_pending) == (1, 1, 0)
    assert report.to_dict()["clean"] is True


def test_a_torn_tail_is_not_a_violation(st):
    """Half a record after the valid prefix is a write that never committed: counted, not reported."""
    _, child = tree(st)
    append_log(st, child, encode_record({"seq": 99, "type": "turn/start"})[:7])
    report = check_store(st)
    assert report.clean, str(report)
    assert report.counts.torn_tails == 1


def test_corruption_in_the_committed_region(st):
    """A flipped byte with a committed turn/end after it: ``log-corrupt``."""
    _, child = tree(st)
    append_events(st, child, ("turn/start", {}, 0), ("turn/end", {"stop_reason": "completed"}, 0))
    found = store.inspect(st, child)
    data = bytearray(log_bytes(st, child))
    data[found.offsets[0] + 10] ^= 0xFF
    write_log(st, child, bytes(data))
    violation = only(check_store(st), "log-corrupt")
    assert violation.session_id == child and "crc-mismatch" in violation.evidence


@pytest.mark.parametrize("record", [0, -1], ids=["corrupt", "torn"])
def test_damage_counts_the_bytes_after_the_valid_prefix_without_the_padding(st, record):
    """Found by a probe: a damaged log said ``3230 bytes after the valid prefix`` when 364 bytes of records
    followed its damage and the rest was the zero padding its writer leaves to the block's end (FORMAT.md
    §3.4), in ``check``, in ``fsck`` (``torn`` too) and in ``subagents log``. The count is the damage's
    ``dropped``: it now ends at the log's last non-zero byte."""
    from subagents.store.fsck import fsck
    from subagents.store.framing import data_end

    _, child = tree(st)
    with store.LogWriter.open(st, child, epoch=0) as writer:  # the real writer: its log ends in padding
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x" * 300}), ("turn/end", {"stop_reason": "completed"})],
                      commit=True)
    found = store.inspect(st, child)
    data = bytearray(log_bytes(st, child))
    records_end = data_end(bytes(data))
    assert len(data) - records_end > 1000, "the log ends in padding"
    at = found.offsets[record]
    data[at + 10] ^= 0xFF
    write_log(st, child, bytes(data))
    damaged = store.inspect(st, child)
    assert (damaged.status, damaged.damage.offset) == (("corrupt", "torn")[record != 0], at), damaged
    assert damaged.damage.dropped == records_end - at
    said = f"{records_end - at} bytes after the valid prefix"
    if record == 0:
        assert said in only(check_store(st), "log-corrupt").evidence
    finding = next(f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["id"] == child)
    assert said in finding["detail"] and finding["damage"]["dropped"] == records_end - at, finding


@pytest.mark.parametrize("record", [0, 1])
def test_a_corrupt_log_without_an_identity_cache_is_one_violation(st, record):
    """A log too short for an identity cache (format 2 writes none below 64 KiB) whose descriptor or a
    later record is damaged: ``log-corrupt`` alone, never also an ``index-row`` mismatch with the
    descriptor the damage hides (the damage is reported with its session, once)."""
    _, child = tree(st)
    append_events(st, child, ("turn/start", {}, 0), ("turn/end", {"stop_reason": "completed"}, 0))
    assert not os.path.exists(st.path(child, "identity"))
    found = store.inspect(st, child)
    data = bytearray(log_bytes(st, child))
    data[found.offsets[record] + 10] ^= 0xFF
    write_log(st, child, bytes(data))
    assert only(check_store(st), "log-corrupt").session_id == child


def test_an_undecodable_header(st):
    _, child = tree(st)
    write_header(st, child, b"\xc1 not msgpack")
    assert only(check_store(st), "header-corrupt").session_id == child


def test_a_regressed_epoch(st):
    """An event at epoch 1 after one at epoch 2: ``epoch-regressed`` at the later seq."""
    _, child = tree(st)
    leased(st, child, epochs=2)
    append_events(st, child, ("turn/start", {}, 2), ("turn/end", {"stop_reason": "completed"}, 2), ("turn/start", {}, 1))
    violation = only(check_store(st), "epoch-regressed")
    assert violation.session_id == child and violation.seq == store.inspect(st, child).next_seq - 1
    assert "epoch 1 after epoch 2" in violation.evidence


def test_an_epoch_no_lease_granted(st):
    _, child = tree(st)
    leased(st, child)
    append_events(st, child, ("turn/start", {}, 3))
    assert "lease is at epoch 1" in only(check_store(st), "epoch-unleased").evidence


def test_two_writers_in_one_epoch_overlap_their_turns(st):
    """A second turn/start before the first turn ends: two writers in one log."""
    _, child = tree(st)
    leased(st, child)
    append_events(st, child, ("turn/start", {}, 1), ("step/start", {}, 1), ("turn/start", {}, 1))
    assert only(check_store(st), "turn-overlap").session_id == child


def test_a_repaired_crash_is_not_an_overlap(st):
    """Crash repair closes the open turn at the new epoch before the next turn: clean."""
    _, child = tree(st)
    first = leased(st, child)
    append_events(st, child, ("turn/start", {}, 1), ("step/start", {}, 1))
    store.remove_owner(st, first.owner)  # the first owner died holding it
    lease = leased(st, child)  # another owner takes over at epoch 2 and resumes
    with store.LogWriter.open(st, child, epoch=lease.epoch) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    report = check_store(st)
    assert report.clean, str(report)


def consume(st: store.Store, child: str, *message_ids: str, epoch: int = 0) -> None:
    append_events(st, child, *[("message/accepted", {"message_id": m}, epoch) for m in message_ids], ("turn/start", {}, epoch))


def test_a_message_consumed_twice(st):
    _, child = tree(st)
    ids = store.IdGenerator()
    m1 = store.accept(st, child, source={"kind": "user"}, content="a", ids=ids)
    consume(st, child, m1)
    append_events(st, child, ("turn/end", {"stop_reason": "completed"}, 0))
    consume(st, child, m1)
    violation = only(check_store(st), "message-duplicated")
    assert m1 in violation.evidence and violation.seq is not None


def test_messages_consumed_out_of_order(st):
    _, child = tree(st)
    ids = store.IdGenerator()
    m1 = store.accept(st, child, source={"kind": "user"}, content="a", ids=ids)
    m2 = store.accept(st, child, source={"kind": "user"}, content="b", ids=ids)
    consume(st, child, m2, m1)
    violation = only(check_store(st), "message-out-of-order")
    assert m2 in violation.evidence and m1 in violation.evidence


def test_a_message_the_mailbox_never_accepted(st):
    _, child = tree(st)
    append_events(st, child, ("turn/start", {}, 0), ("turn/end", {"stop_reason": "completed"}, 0))
    consume(st, child, "01NEVERACCEPTED")
    assert "01NEVERACCEPTED" in only(check_store(st), "message-unknown").evidence


def test_a_one_shot_prompt_is_consumed_inline(st):
    """A one-shot child's prompt is logged at creation without a mailbox record: not unknown."""
    root, _ = tree(st)
    child = store.new_id()
    make_child(st, root, child, descriptor=ONE_SHOT, created_at=OLD,
               events=[("message/accepted", {"message_id": store.new_id(), "content": "go"})])
    report = check_store(st)
    assert report.clean, str(report)


def test_a_stranded_message(st):
    """A pending message in a one-shot child nobody holds: nothing will ever consume it."""
    root, _ = tree(st)
    child = store.new_id()
    make_child(st, root, child, descriptor=ONE_SHOT, created_at=OLD)
    store.accept(st, child, source={"kind": "user"}, content="lost", ids=store.IdGenerator())
    violation = only(check_store(st), "message-stranded")
    assert violation.session_id == child and "1 accepted message(s) pending" in violation.evidence


def test_pending_messages_of_a_resumable_or_held_session_are_not_stranded(st):
    """A continuable child (cold-resumable), a root, and a child a live owner holds may have pending messages."""
    root, continuable = tree(st)
    held = store.new_id()
    make_child(st, root, held, descriptor=ONE_SHOT, created_at=OLD)
    leased(st, held)
    ids = store.IdGenerator()
    for session_id in (root, continuable, held):
        store.accept(st, session_id, source={"kind": "user"}, content="later", ids=ids)
    report = check_store(st)
    assert report.clean, str(report)
    assert report.counts.messages_pending == 3 and report.counts.leases_live == 1


def test_a_corrupt_mailbox(st):
    """Damage with accepted messages after it: ``mailbox-corrupt``."""
    _, child = tree(st)
    ids = store.IdGenerator()
    for text in ("a", "b", "c"):
        store.accept(st, child, source={"kind": "user"}, content=text, ids=ids)
    data = bytearray(read_file(st.path(child, "mailbox")))
    data[12] ^= 0xFF
    write_file(st.path(child, "mailbox"), bytes(data))
    assert only(check_store(st), "mailbox-corrupt").session_id == child


def test_an_index_entry_missing(st):
    """A child that ran a turn, absent from its parent's index."""
    root, child = tree(st)
    append_events(st, child, ("turn/start", {}, 0), ("turn/end", {"stop_reason": "completed"}, 0))
    os.unlink(st.children_index_path(root))
    violation = only(check_store(st), "index-missing")
    assert violation.session_id == child and root in violation.evidence


def test_a_creation_its_creator_never_indexed(st):
    """Created leased by an owner that died before the index append, and never used: counted, not reported."""
    root, _ = tree(st)
    child = store.new_id()
    code = (
        "import os, sys\nfrom subagents import store\n"
        "st = store.Store(sys.argv[1])\nstore.register_owner(st, sys.argv[2], ttl=30.0)\n"
        "store.create_session(st, sys.argv[3], parent_session=sys.argv[4], origin='subagent', created_at=1.0, "
        "lease_owner=sys.argv[2], events=[('subagent/descriptor', {'version': 1, 'mode': 'one-shot', 'provider': 'p'})])\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, st.root, store.new_id(), child, root], check=True, timeout=60)
    index = [e.id for e in store.read_children(st, root)]
    index.remove(child)
    os.unlink(st.children_index_path(root))
    for other in index:
        store.add_child(st, root, other, created_at=OLD, origin="subagent")
    report = check_store(st)
    assert report.clean and report.counts.creations_interrupted == 1, str(report)


def test_a_young_missing_entry_is_a_creation_in_flight(st):
    """The header is published before the entry is appended: a young discrepancy is counted, not reported."""
    root = store.new_id()
    store.create_session(st, root)
    child = store.new_id()
    make_child(st, root, child)
    os.unlink(st.children_index_path(root))
    report = check_store(st)
    assert report.clean and report.counts.in_flight == 1, str(report)


def test_an_index_entry_no_header_proves(st):
    root, _ = tree(st)
    ghost = store.new_id()
    store.add_child(st, root, ghost, created_at=OLD, origin="subagent")
    violation = only(check_store(st), "index-stale")
    assert violation.session_id == ghost and "no header" in violation.evidence


def test_a_lease_left_by_an_owner_that_closed(st):
    """The owner record is gone but the lease was never released."""
    _, child = tree(st)
    lease = leased(st, child)
    store.remove_owner(st, lease.owner)
    violation = only(check_store(st), "lease-expired")
    assert violation.session_id == child and "closed without releasing" in violation.evidence


def test_fsck_reports_a_lease_its_closed_owner_left_and_repair_releases_it(st):
    """Found by a probe: such a lease (a flipped byte in its newest slot brings back the older, held one)
    was a ``store check`` violation nothing could clear. ``fsck`` names it; ``--repair`` takes the lease
    (a new epoch fences whoever still believes it holds it) and releases it."""
    from subagents.store.fsck import fsck
    _, child = tree(st)
    lease = leased(st, child)
    store.remove_owner(st, lease.owner)
    [finding] = [f for f in fsck(st, repair=False, lease_ttl_s=30.0)["findings"] if f["id"] == child]
    assert finding["kind"] == "lease-abandoned" and "closed without releasing" in finding["detail"], finding
    assert only(check_store(st), "lease-expired")
    report = fsck(st, repair=True, lease_ttl_s=30.0)
    [finding] = [f for f in report["findings"] if f["id"] == child]
    assert finding["repair"] == f"released at epoch {lease.epoch + 1}" and child in report["repaired"], finding
    after = store.read_lease(st, child)
    assert after is not None and (after.epoch, after.state) == (lease.epoch + 1, "released")
    assert check_store(st).clean
    assert [f for f in fsck(st, repair=False, lease_ttl_s=30.0)["findings"] if f["id"] == child] == []


def test_a_lease_whose_owner_record_does_not_read_is_named_and_never_released(st):
    """An owner file that is there but does not read (emptied, garbage) is not an owner that closed:
    its supervisor may still run (found by a probe: fsck called it closed). ``store check`` names it
    ``owner-unreadable``; ``fsck`` reports it and ``--repair`` leaves the lease as it is."""
    from subagents.store.fsck import fsck
    _, child = tree(st)
    lease = leased(st, child)
    with open(st.owner_path(lease.owner), "wb") as handle:
        handle.write(b"\xc1 not an owner")
    violation = only(check_store(st), "owner-unreadable")
    assert violation.session_id == child and f"owners/{lease.owner} does not read" in violation.evidence, violation
    report = fsck(st, repair=True, lease_ttl_s=30.0)
    [finding] = [f for f in report["findings"] if f["id"] == child]
    assert finding["kind"] == "owner-unreadable" and not finding.get("repaired") and child not in report["repaired"], finding
    assert store.read_lease(st, child) == lease


def test_a_lease_whose_owner_is_no_id_names_no_owner_file(st):
    """A lease naming an owner that is no id (damage that still decodes) has no record in owners/ to
    be unreadable: it reads as an owner that left, in check, fsck and gc alike. The owner-unreadable
    check first raised INVALID_SESSION_ID here, ending check and fsck."""
    from subagents.store.fsck import fsck
    root, child = tree(st)
    store.acquire_lease(st, child, "not an id!")
    assert only(check_store(st), "lease-expired").session_id == child
    [finding] = [f for f in fsck(st, repair=False, lease_ttl_s=30.0)["findings"] if f["id"] == child]
    assert finding["kind"] == "lease-abandoned", finding
    assert [c.id for c in store.collect(st, 0.0).collected] == [root]


def test_fsck_leaves_alone_a_lease_of_a_live_owner_and_of_a_crashed_one(st):
    """A live owner's lease is its own; a crashed owner's is harmless (the next acquisition takes it)."""
    from subagents.store.fsck import fsck
    _, child = tree(st)
    leased(st, child)
    assert fsck(st, repair=True, lease_ttl_s=30.0)["findings"] == []


def test_a_lease_of_a_live_owner_whose_heartbeat_lapsed(st):
    """This process still runs, but its heartbeat is older than its TTL: a stuck owner."""
    _, child = tree(st)
    owner = store.new_id()
    record = store.register_owner(st, owner, ttl=0.001)
    store.acquire_lease(st, child, owner)
    deadline = time.monotonic() + 5
    while time.time() - record.heartbeat_at <= record.ttl and time.monotonic() < deadline:
        time.sleep(0.001)  # let the tiny TTL run out (not a synchronisation)
    assert "still runs" in only(check_store(st), "lease-expired").evidence


def test_the_leases_of_a_crashed_owner_are_harmless(st):
    """An owner killed with its leases held: they read ``complete`` and anyone may take them over."""
    _, child = tree(st)
    code = (
        "import os, sys\nfrom subagents import store\n"
        "st = store.Store(sys.argv[1])\nstore.register_owner(st, sys.argv[2], ttl=30.0)\n"
        "store.acquire_lease(st, sys.argv[3], sys.argv[2])\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, st.root, store.new_id(), child], check=True, timeout=60)
    report = check_store(st)
    assert report.clean, str(report)
    assert report.counts.leases_dead == 1


def test_not_a_store():
    """A folder that is not a store is an error, not an empty report."""
    with pytest.raises(store.StoreFormatError):
        check_store("/nonexistent/subagents/store")


def test_a_new_writer_inside_an_unrepaired_turn(st):
    """A step written at epoch 2 inside a turn of epoch 1 that no repair closed: two writers in one turn."""
    _, child = tree(st)
    leased(st, child, epochs=2)
    append_events(st, child, ("turn/start", {}, 1), ("step/start", {}, 2))
    assert "inside the turn of epoch 1" in only(check_store(st), "turn-overlap").evidence


def test_an_undecodable_lease(st):
    _, child = tree(st)
    for slot in (0, 1):  # one damaged slot beside an empty one is a first acquisition that tore: no lease
        write_slot(st, child, slot, b"\xc1 not a lease")
    assert only(check_store(st), "lease-unreadable").session_id == child


# -- a gc beside the check (found by a probe: false violations while gc collected) -------------------


def _pass(st: store.Store):
    from subagents.store.check import _Pass
    from subagents.store.lease import host_identity

    return _Pass(st, time.time(), host_identity())


def _collected(st: store.Store, session_id: str) -> None:
    """What a gc leaves of a session once it has moved it away: no file, no companion."""
    for path in (st.session_path(session_id), st.path(session_id, "mailbox")):
        if os.path.exists(path):
            os.unlink(path)


def test_a_session_collected_before_its_lease_is_read_has_vanished(st) -> None:
    from subagents.store.check import _read_lease

    store.create_session(st, "gone")
    state = _pass(st)
    _collected(st, "gone")
    _read_lease(state, "gone")
    assert state.violations == []
    assert state.counts == {"vanished": 1}


def test_a_session_collected_before_its_mailbox_is_read_has_vanished(st) -> None:
    """Its consumed messages were all flagged message-unknown: the mailbox read as empty."""
    from subagents.store.check import _read_mailbox

    store.create_session(st, "gone")
    state = _pass(st)
    _collected(st, "gone")
    assert _read_mailbox(state, "gone") is None
    assert state.counts == {"vanished": 1}
    store.create_session(st, "here")  # a session that is there with no mailbox has none: nothing went
    assert _read_mailbox(state, "here") == []


def test_a_root_collected_after_its_header_was_read_is_not_missing_from_the_index(st) -> None:
    from subagents.store.check import _check_roots

    store.create_session(st, "old", created_at=time.time() - 3600)
    store.create_session(st, "kept", created_at=time.time() - 3600)
    state = _pass(st)
    state.headers = {sid: store.read_header(st, sid) for sid in ("old", "kept")}
    _collected(st, "old")
    from subagents.store.roots import remove_root

    remove_root(st, "old")  # what gc does once the root's file is moved away
    _check_roots(state, in_flight_s=1.0)
    assert state.violations == [] and state.counts.get("vanished") == 1
