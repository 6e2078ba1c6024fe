"""The session file of format 2 (``store/session_file.py``): its lease slots, its preamble, its name.

The lease-slot invariant: a writer only ever writes the slot that does *not*
hold the newest ``synced`` record (an acquisition, fsync'd before it
returned), so a state change that tears or is lost in a crash never takes
the epoch back below an acquisition that returned. Checked here as a
property over random sequences of acquisitions, state changes and releases
(through ``store.lease`` and through a log writer's release): after every
step, the synced slot is the last acquisition, no non-durable write touched
it, and any damage to the other slot leaves readers the acquisition's epoch
and the next acquisition the epoch after it. The rest: what a reader makes
of a damaged preamble, and which names in ``sessions/`` are sessions.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from subagents import store
from subagents.store.lease import write_released
from subagents.store.session_file import decode_slots

from ..session_bytes import (
    SLOT_SIZE, SLOTS_AT, file_bytes, log_start, newest_slot, patch, slot_records, synced_slot, write_slot,
)
from ._support import ONE_SHOT, write_file

OPS = ("acquire-o1", "acquire-o2", "idle", "running", "release", "writer-release")
DAMAGES = ("zeros", "random", "flip", "torn-prefix")


def slot_of(st: store.Store, sid: str, index: int) -> bytes:
    return file_bytes(st, sid)[SLOTS_AT + index * SLOT_SIZE : SLOTS_AT + (index + 1) * SLOT_SIZE]


def damage_slot(st: store.Store, sid: str, index: int, how: str, rng: random.Random) -> None:
    """What a torn or lost write (or rot) can leave in one slot."""
    old = slot_of(st, sid, index)
    if how == "zeros":  # the slot's first write never reached the disk
        new = bytes(SLOT_SIZE)
    elif how == "random":
        new = bytes(rng.randrange(256) for _ in range(SLOT_SIZE))
    elif how == "flip":
        buf = bytearray(old)
        buf[rng.randrange(SLOT_SIZE)] ^= 1 << rng.randrange(8)
        new = bytes(buf)
    else:  # a write torn after a prefix: the start of other bytes over the old ones
        cut = rng.randrange(1, SLOT_SIZE)
        new = bytes(rng.randrange(256) for _ in range(cut)) + old[cut:]
    write_slot(st, sid, index, new)


class Model:
    """What the lease must be after each step: the last acquisition's epoch, and who holds it."""

    def __init__(self, epoch: int, holder: str | None) -> None:
        self.epoch = epoch  # the epoch of the last acquisition that returned (0: none)
        self.holder = holder
        self.released = holder is None


def step(st: store.Store, sid: str, op: str, model: Model) -> None:
    if op.startswith("acquire"):
        owner = op.split("-")[1]
        if not model.released and model.holder != owner:
            with pytest.raises(store.LeaseHeldError):
                store.acquire_lease(st, sid, owner)
            return
        lease = store.acquire_lease(st, sid, owner, state="idle" if model.epoch % 2 else "running")
        assert lease.epoch == model.epoch + 1
        model.epoch, model.holder, model.released = lease.epoch, owner, False
        return
    if model.released or model.holder is None:
        return  # nobody holds the lease: no state change to make
    synced = synced_slot(st, sid)
    kept = slot_of(st, sid, synced)
    if op in ("idle", "running"):
        store.set_lease_state(st, sid, model.holder, model.epoch, op)
    elif op == "release":
        store.release_lease(st, sid, model.holder, model.epoch)
        model.released = True
    else:
        with store.LogWriter.open(st, sid, epoch=model.epoch) as writer:
            writer.append([("notice/received", {"epoch": model.epoch})], commit=True)
            writer.release_lease(model.holder, write_released)
        model.released = True
    # a non-durable write never touches the slot of the newest synced record
    assert synced_slot(st, sid) == synced and slot_of(st, sid, synced) == kept, op


def check_invariant(st: store.Store, sid: str, model: Model, how: str, rng: random.Random) -> None:
    """The synced slot holds the last acquisition; damage to the other never lowers the epoch."""
    if model.epoch == 0:
        return
    synced = synced_slot(st, sid)
    assert synced is not None
    record = slot_records(st, sid)[synced]
    assert (record["epoch"], record["owner"]) == (model.epoch, model.holder)
    before = file_bytes(st, sid)
    damage_slot(st, sid, 1 - synced, how, rng)
    lease = store.read_lease(st, sid)
    assert lease is not None and lease.epoch == model.epoch and lease.owner == model.holder
    assert store.check_lease(st, sid) == lease
    with open(st.session_path(sid), "r+b") as handle:  # undamaged again: the sequence goes on
        handle.write(before)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(ops=hst.lists(hst.sampled_from(OPS), min_size=1, max_size=14), held=hst.booleans(),
       how=hst.sampled_from(DAMAGES), seed=hst.integers(0, 2**32 - 1))
def test_damage_to_the_slot_without_the_newest_acquisition_never_lowers_the_epoch(tmp_path_factory, ops, held, how, seed):
    st = store.Store(tmp_path_factory.mktemp("slots") / "store", durability="strict")
    rng = random.Random(seed)
    for owner in ("o1", "o2"):
        store.register_owner(st, owner, ttl=600)
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)], lease_owner="o1" if held else None)
    model = Model(1, "o1") if held else Model(0, None)
    check_invariant(st, "s1", model, how, rng)
    for op in ops:
        step(st, "s1", op, model)
        check_invariant(st, "s1", model, how, rng)
    if model.epoch == 0:
        return
    # then the crash: the other slot damaged for good (a release lost with it reads as the holder's
    # lease), the holder dead; the next owner continues above every epoch handed out
    damage_slot(st, "s1", 1 - synced_slot(st, "s1"), how, rng)
    store.remove_owner(st, model.holder)
    store.register_owner(st, "o3", ttl=600)
    # one more when the damage does not decode (a bit flipped in a slot's padding still does): such
    # a slot could hide an acquisition above the other
    hides = decode_slots(slot_of(st, "s1", 0) + slot_of(st, "s1", 1)).undecodable_beside
    taken = store.acquire_lease(st, "s1", "o3")
    assert taken.epoch == model.epoch + (2 if hides else 1)
    for stale in range(0, model.epoch + 1):
        with pytest.raises(store.FencedError):
            store.LogWriter.open(st, "s1", epoch=stale)


def test_a_state_change_written_twice_alternates_away_from_the_acquisition(st):
    """The slots as bytes: an acquisition is synced in one slot; every state change after it goes to
    the other one (gen after gen), never to the acquisition's; the next acquisition takes the slot
    the state changes used, and the state changes then move to the other."""
    store.create_session(st, "s1")
    store.register_owner(st, "o1", ttl=600)
    first = store.acquire_lease(st, "s1", "o1")
    a = synced_slot(st, "s1")
    for state in ("idle", "running", "idle"):
        store.set_lease_state(st, "s1", "o1", first.epoch, state)
        assert (synced_slot(st, "s1"), newest_slot(st, "s1")) == (a, 1 - a)
    gens = [r["gen"] for r in slot_records(st, "s1")]
    assert gens[1 - a] == gens[a] + 3
    second = store.acquire_lease(st, "s1", "o1")
    assert synced_slot(st, "s1") == newest_slot(st, "s1") == 1 - a
    store.release_lease(st, "s1", "o1", second.epoch)
    assert (synced_slot(st, "s1"), newest_slot(st, "s1")) == (1 - a, a)
    assert store.read_lease(st, "s1") == store.Lease("o1", 2, "released", second.acquired_at)


# -- the preamble ----------------------------------------------------------------------------


@pytest.mark.parametrize("where,data", [(0, b"SAS1"), (0, b"\x00\x00\x00\x00"), (4, b"\x00\x00\x00\x00"),
                                        (4, b"\xff\xff\xff\x7f"), (5, b"\x01")])
def test_a_damaged_preamble_is_corrupt_and_only_that_session(st, where, data):
    """A wrong magic, or a log start that does not match the header's frame: the session is
    CorruptSessionError to every reader and writer, nothing is written, and its sibling reads."""
    store.create_session(st, "ok", events=[("subagent/descriptor", ONE_SHOT)])
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    patch(st, "s1", where, data)
    before = file_bytes(st, "s1")
    for call in (lambda: store.read_header(st, "s1"), lambda: store.inspect(st, "s1"), lambda: store.check_lease(st, "s1"),
                 lambda: store.acquire_lease(st, "s1", "o1"), lambda: store.LogWriter.open(st, "s1", epoch=0),
                 lambda: store.read_projection(st, "s1")):
        with pytest.raises(store.CorruptSessionError):
            call()
    assert store.read_lease(st, "s1") is None and file_bytes(st, "s1") == before
    assert store.inspect(st, "ok").status == "clean" and st.session_ids() == ["ok", "s1"]


def test_a_header_longer_than_the_first_read_is_read_whole(st):
    """A header past the reader's first read (4 KiB) is read in full, not taken for a truncated file."""
    cwd = "/" + "d" * 6000
    store.create_session(st, "s1", cwd=cwd, events=[("subagent/descriptor", ONE_SHOT)])
    assert log_start(st, "s1") > 4096
    assert store.read_header(st, "s1").cwd == cwd and store.inspect(st, "s1").status == "clean"
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    assert [e["type"] for e in store.inspect(st, "s1").events][-1] == "turn/end"


# -- names in sessions/ --------------------------------------------------------------------------


def test_only_published_session_files_are_sessions(st):
    """A creation's temporary file (whole or half written), companions without a session, a folder
    and a link are never listed as sessions, and never block creating that id."""
    store.create_session(st, "real", events=[("subagent/descriptor", ONE_SHOT)])
    whole = file_bytes(st, "real")
    write_file(os.path.join(st.sessions_dir, ".ghost.new.99.0badf00d"), whole)
    write_file(os.path.join(st.sessions_dir, ".half.new.99.0badf00d"), whole[:300])
    write_file(st.path("orphan", "mailbox"), b"")
    os.mkdir(os.path.join(st.sessions_dir, "oldfolder"))
    os.symlink(st.session_path("real"), st.session_path("alias"))
    assert st.session_ids() == ["real"]
    assert [st.exists(sid) for sid in ("ghost", "half", "orphan")] == [False, False, False]
    for sid in ("ghost", "half", "orphan"):
        with pytest.raises(store.SessionNotFoundError):
            store.read_header(st, sid)
        store.create_session(st, sid, created_at=5.0)  # the id is free; creation clears its old companions
        assert store.read_header(st, sid).created_at == 5.0
    assert not os.path.exists(st.path("orphan", "mailbox"))
    assert os.path.exists(os.path.join(st.sessions_dir, ".ghost.new.99.0badf00d"))  # fsck reports it; creation leaves it
    assert st.session_ids() == ["ghost", "half", "orphan", "real"]


def test_creation_of_a_taken_id_changes_nothing(st):
    """Two creators of one id: the second gets SessionExistsError and leaves neither a temporary file
    nor a byte changed in the first's file."""
    store.create_session(st, "s1", created_at=1.0, events=[("subagent/descriptor", ONE_SHOT)])
    before = file_bytes(st, "s1")
    names = sorted(os.listdir(st.sessions_dir))
    with pytest.raises(store.SessionExistsError):
        store.create_session(st, "s1", created_at=2.0)
    assert file_bytes(st, "s1") == before and sorted(os.listdir(st.sessions_dir)) == names
    assert os.stat(st.session_path("s1")).st_nlink == 1  # the temporary name is gone: one name, one inode


def test_a_file_whose_name_is_no_id_is_never_a_session(st):
    """Junk in ``sessions/`` under a name no session can have (a space, a leading dash, too long) is
    never listed: every reader that walks the sessions goes on (format 1 listed only folders with
    a header; a bare file there made ``held_sessions`` raise INVALID_SESSION_ID); fsck names it."""
    from subagents.store.fsck import fsck

    store.create_session(st, "r1", events=[("subagent/descriptor", ONE_SHOT)])
    store.register_owner(st, "o1", ttl=600)
    store.acquire_lease(st, "r1", "o1")
    junk = ["bad name", "-x", "a" * 65]
    for name in junk:
        write_file(os.path.join(st.sessions_dir, name), b"junk")
    assert st.session_ids() == ["r1"]
    assert [h.id for h in store.held_sessions(st)] == ["r1"]
    assert [r.id for r in store.list_roots(st)] == ["r1"]
    assert store.check_store(st).clean
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert {f["id"] for f in found["findings"] if f["kind"] == "stray"} == set(junk)


def _slot(payload: dict) -> bytes:
    frame = store.encode_record(payload)
    return frame + bytes(SLOT_SIZE - len(frame))


LEASE = {"gen": 3, "owner": "o1", "epoch": 2, "state": "idle", "acquired_at": 12.5}


@pytest.mark.parametrize(("change", "problem"), [
    ({}, None),
    ({"acquired_at": 12}, None),  # an integer time reads as that many seconds
    ({"extra": [1, 2]}, None),  # an unknown field is kept out
    ({"owner": 7}, "owner: Input should be a valid string"),
    ({"epoch": True}, "epoch: Input should be a valid integer"),
    ({"epoch": -1}, "epoch: Input should be greater than or equal to 0"),
    ({"epoch": 2.0}, "epoch: Input should be a valid integer"),
    ({"state": "held"}, "state: Input should be 'running', 'idle' or 'released'"),
    ({"acquired_at": float("nan")}, "acquired_at: Input should be a finite number"),
    ({"acquired_at": float("inf")}, "acquired_at: Input should be a finite number"),
    ({"acquired_at": True}, "acquired_at: Input should be a valid number"),
    ({"acquired_at": 2**64 - 1}, None),
    ({"acquired_at": "12.5"}, "acquired_at: Input should be a valid number"),
])
def test_a_lease_slot_reads_as_its_fields_or_the_problem_with_them(change, problem) -> None:
    """What one slot's record says: the lease, or (beside an empty slot) the first problem with its
    fields, as the lease's typed check names it; a slot of the wrong type is damage, never coerced."""
    record = {**LEASE, **change}
    slots = decode_slots(_slot(record) + bytes(SLOT_SIZE))
    if problem is None:
        assert slots.problem is None and slots.gen == 3
        assert slots.lease == store.Lease("o1", 2, "idle", float(record["acquired_at"]))
        assert type(slots.lease.acquired_at) is float
    else:
        assert slots.lease is None and slots.problem == f"lease slots do not decode ({problem})"
