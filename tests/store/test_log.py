"""The fenced log writer: crash repair, seq checks, fencing, the projection cache, failed writes."""

from __future__ import annotations

import errno
import os
import random

import pytest

from subagents import store
import subagents.store.durability
import subagents.store.log
import subagents.store.session_file
from subagents.store.framing import encode_record
from subagents.store.lease import write_released
from subagents.store.projection import Projection, decode_cache

from subagents.store.reader import open_session

from .. import session_bytes as raw
from ._support import CONTINUABLE, ONE_SHOT, Child, read_file, write_file

DESC = ("subagent/descriptor", ONE_SHOT)
# an event that makes a new log CACHE_LAG_BYTES long: only a log that long has an identity cache
PADDING = ("notice/received", {"padding": "x" * store.log.CACHE_LAG_BYTES})


def new_session(st, sid="s1", events=(DESC,), **kw):
    return store.create_session(st, sid, events=list(events), **kw)


def log_size(st, sid="s1"):
    """The log's length without its zero padding."""
    return raw.log_data_end(st, sid)


def kinds(st, sid="s1"):
    return [e["type"] for e in store.inspect(st, sid).events]


# -- appending -------------------------------------------------------------------


def test_append_writes_the_envelope(any_st):
    """Each record is {seq, ts, type, data, epoch}; one batch shares its ts; seqs continue."""
    new_session(any_st)
    with store.LogWriter.open(any_st, "s1", epoch=0) as writer:
        assert writer.next_seq == 1
        records = writer.append([("turn/start", {}), ("assistant/message", {"text": "hi"})])
    assert [r["seq"] for r in records] == [1, 2]
    assert records[0]["ts"] == records[1]["ts"]
    events = store.inspect(any_st, "s1").events
    assert events[1:] == records
    assert set(events[2]) == {"seq", "ts", "type", "data", "epoch"} and events[2]["epoch"] == 0


def test_seq_mismatch_writes_nothing(st):
    """A batch whose first seq is not the next seq raises SeqMismatchError and leaves the log untouched."""
    new_session(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        before = raw.file_bytes(st, "s1")
        for wrong in (0, 2, 99):
            with pytest.raises(store.SeqMismatchError) as info:
                writer.append([("turn/start", {})], first_seq=wrong)
            assert info.value.code == "SEQ_MISMATCH" and isinstance(info.value, ValueError)
            assert "expected 1, got %d" % wrong in str(info.value)
        assert raw.file_bytes(st, "s1") == before and writer.next_seq == 1
        assert writer.append([("turn/start", {})], first_seq=1)[0]["seq"] == 1


def test_commit_refreshes_the_identity_cache(st):
    """A log shorter than CACHE_LAG_BYTES has no cache (readers fold it whole); from there on a commit
    point rewrites it when a turn ended, a descriptor arrived or the lag grew too big."""
    new_session(st)
    cache = st.path("s1", "identity")
    filler = ("assistant/message", {"text": "x" * 1000})
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})])
        writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)
        while writer.projection.end_offset < store.log.CACHE_LAG_BYTES:
            assert not os.path.exists(cache)
            writer.append([filler], commit=True)
        # the first commit point of a log that long writes it
        assert decode_cache(read_file(cache)) == writer.projection.to_record()
        writer.append([("turn/start", {})])
        assert decode_cache(read_file(cache))["seq"] == writer.projection.seq - 1  # not a commit point
        writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)
        assert decode_cache(read_file(cache)) == writer.projection.to_record()
        # nothing a cache reader needs changed: the commit leaves the cache where it was
        seq = writer.projection.seq
        writer.append([("notice/received", {})])
        writer.commit()
        assert decode_cache(read_file(cache))["seq"] == seq
        assert store.read_projection(st, "s1").seq == seq + 1  # readers fold the suffix after it
        # a new descriptor must reach the catalog, which reads identity from the cache alone
        writer.append([("subagent/descriptor", {**ONE_SHOT, "label": "renamed"})], commit=True)
        assert decode_cache(read_file(cache))["seq"] == seq + 2
        # once the log outgrows the cache by CACHE_LAG_BYTES, a plain commit rewrites it
        cache_end = decode_cache(read_file(cache))["end_offset"]
        lags = []
        while decode_cache(read_file(cache))["seq"] == seq + 2:
            lags.append(writer.projection.end_offset - cache_end)
            writer.append([filler], commit=True)
        assert lags[-1] < store.log.CACHE_LAG_BYTES <= writer.projection.end_offset - cache_end
        assert decode_cache(read_file(st.path("s1", "identity")))["seq"] == writer.projection.seq


def test_two_writers_of_one_epoch_stay_contiguous(st):
    """Two same-epoch writers in one process pick up each other's records before writing."""
    new_session(st)
    a = store.LogWriter.open(st, "s1", epoch=0)
    b = store.LogWriter.open(st, "s1", epoch=0)
    try:
        assert a.append([("assistant/message", {"w": "a"})])[0]["seq"] == 1
        assert b.append([("assistant/message", {"w": "b"}), ("assistant/message", {"w": "b"})])[0]["seq"] == 2
        assert a.append([("assistant/message", {"w": "a"})])[0]["seq"] == 4
        assert a.projection.seq == 4 and b.next_seq == 4  # b learns of seq 4 at its next append
    finally:
        a.close()
        b.close()
    found = store.inspect(st, "s1")
    assert found.status == "clean" and [e["data"].get("w") for e in found.events[1:]] == ["a", "b", "b", "a"]


def test_foreign_damage_or_shrink_under_a_writer_is_corrupt(st):
    """A writer refuses to append after bytes it did not write turn out bad, or the log shrank."""
    new_session(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        raw.append_log(st, "s1", b"\x05\x00\x00\x00garbage")
        size = log_size(st)
        with pytest.raises(store.CorruptSessionError):
            writer.append([("turn/start", {})])
        assert log_size(st) == size
    with store.LogWriter.open(st, "s1", epoch=0) as writer:  # the garbage is a torn tail to a new writer
        writer.append([("turn/start", {})])
        os.truncate(st.session_path("s1"), raw.log_start(st, "s1") + 3)
        with pytest.raises(store.CorruptSessionError, match="shrank"):
            writer.append([("turn/end", {"stop_reason": "completed"})])


# -- crash repair ------------------------------------------------------------------


REPAIR_CASES = {
    "closed-turn": ([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], []),
    "open-turn": ([("turn/start", {})], ["turn/end"]),
    "open-step": ([("turn/start", {}), ("step/start", {})], ["step/end", "turn/end"]),
    "closed-step": ([("turn/start", {}), ("step/start", {}), ("step/end", {})], ["turn/end"]),
    "open-calls": (
        [("turn/start", {}), ("step/start", {}), ("tool/call", {"call_id": "c1"}), ("tool/call", {"call_id": "c2"}),
         ("tool/result", {"call_id": "c1", "is_error": False}), ("tool/call", {"call_id": "c3"})],
        ["tool/result", "tool/result", "step/end", "turn/end"],
    ),
    "answered-call": (
        [("turn/start", {}), ("step/start", {}), ("tool/call", {"call_id": "c1"}), ("tool/result", {"call_id": "c1"}),
         ("step/end", {})],
        ["turn/end"],
    ),
    "second-turn-open": (
        [("turn/start", {}), ("tool/call", {"call_id": "old"}), ("turn/end", {"stop_reason": "error"}), ("turn/start", {})],
        ["turn/end"],
    ),
}


@pytest.mark.parametrize("cache", ["stale", "missing", "current"])
@pytest.mark.parametrize("case", sorted(REPAIR_CASES))
def test_crash_closers_appended_exactly_once(st, case, cache):
    """open closes an open turn (unknown tool outcomes, the open step, the turn) once; a second open adds nothing."""
    batch, expected = REPAIR_CASES[case]
    # a log of CACHE_LAG_BYTES from its creation on, so that it has an identity cache to resume from
    new_session(st, events=(DESC, PADDING))
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        if cache != "missing":
            writer.commit()  # the cache, at the log's end before the batch
            assert os.path.exists(st.path("s1", "identity"))
        writer.append(batch, commit=cache == "current")
    assert os.path.exists(st.path("s1", "identity")) == (cache != "missing")
    before = store.inspect(st, "s1")
    assert kinds(st) == ["subagent/descriptor", PADDING[0]] + [k for k, _ in batch]  # inspect repairs nothing
    with store.LogWriter.open(st, "s1", epoch=0, repair=False) as writer:
        assert writer.repaired == []
    assert store.inspect(st, "s1") == before
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert [r["type"] for r in writer.repaired] == expected
        assert [r["seq"] for r in writer.repaired] == list(range(before.next_seq, before.next_seq + len(expected)))
        assert writer.projection.open_turn is None and writer.projection.open_calls == {}
    events = store.inspect(st, "s1").events
    assert events[: before.next_seq] == before.events
    tail = events[before.next_seq :]
    assert [e["type"] for e in tail] == expected
    calls = {e["data"]["call_id"]: e["seq"] for e in before.events if e["type"] == "tool/call"}
    for result in (e for e in tail if e["type"] == "tool/result"):
        assert result["data"]["is_error"] is True
        assert result["data"]["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
        assert result["data"]["source_seqs"] == [calls[result["data"]["call_id"]]]
    if case == "open-calls":
        assert [e["data"]["call_id"] for e in tail[:2]] == ["c2", "c3"]
    if expected:
        assert tail[-1]["data"] == {"stop_reason": "interrupted", "diagnostic": "the turn was interrupted by a crash"}
        assert decode_cache(read_file(st.path("s1", "identity")))["seq"] == tail[-1]["seq"]  # a commit point
    if "step/end" in expected:
        assert tail[expected.index("step/end")]["data"] == {"repaired": True}
    size = log_size(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert writer.repaired == []
    assert log_size(st) == size


def test_closers_carry_the_writer_epoch(st):
    """Closers are written by the resuming writer, at its epoch."""
    new_session(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})])
    store.register_owner(st, "o1", ttl=60)
    lease = store.acquire_lease(st, "s1", "o1")
    with store.LogWriter.open(st, "s1", epoch=lease.epoch) as writer:
        assert [(r["type"], r["epoch"]) for r in writer.repaired] == [("turn/end", 1)]


def test_torn_tail_inside_an_open_turn_is_cut_then_closed(st):
    """A torn tail is truncated first, then the closers follow the valid prefix."""
    new_session(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("step/start", {})])
        valid = log_size(st)
        writer.append([("tool/call", {"call_id": "lost"})])
    os.truncate(st.session_path("s1"), raw.log_start(st, "s1") + log_size(st) - 2)
    assert store.inspect(st, "s1").status == "torn"
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert [r["type"] for r in writer.repaired] == ["step/end", "turn/end"]
        assert writer.repaired[0]["seq"] == 3
    found = store.inspect(st, "s1")
    assert found.status == "clean" and found.offsets[3] == valid


def test_corrupt_log_is_refused_and_untouched(st):
    """open raises CorruptSessionError for damage before a committed turn/end and changes nothing."""
    new_session(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x" * 20})])
        writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)
    found = store.inspect(st, "s1")
    buf = bytearray(raw.log_bytes(st, "s1"))
    buf[found.offsets[2] + 12] ^= 0xFF
    raw.write_log(st, "s1", bytes(buf))
    assert not os.path.exists(st.path("s1", "identity"))  # a short log has none
    whole = raw.file_bytes(st, "s1")
    with pytest.raises(store.CorruptSessionError) as info:
        store.LogWriter.open(st, "s1", epoch=0)
    assert info.value.offset == found.offsets[2] and "crc-mismatch" in info.value.reason
    assert raw.file_bytes(st, "s1") == whole
    assert not os.path.exists(st.path("s1", "identity"))


# -- fencing -----------------------------------------------------------------------


def test_epoch_zero_writer_is_fenced_by_a_lease(st):
    """A writer without a lease (epoch 0) is fenced the moment a lease is acquired; no byte lands."""
    new_session(st)
    store.register_owner(st, "o1", ttl=60)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})])
        store.acquire_lease(st, "s1", "o1")
        size = log_size(st)
        with pytest.raises(store.FencedError) as info:
            writer.append([("turn/end", {"stop_reason": "completed"})])
        assert (info.value.epoch, info.value.current_epoch, info.value.code) == (0, 1, "FENCED")
        assert log_size(st) == size
        with pytest.raises(store.FencedError):
            writer.append([("notice/received", {})])
    with pytest.raises(store.FencedError):
        store.LogWriter.open(st, "s1", epoch=0)


def test_old_epoch_writer_is_fenced_after_takeover(st):
    """After a release and a new acquisition, the old writer raises FencedError and writes no byte."""
    new_session(st)
    store.register_owner(st, "o1", ttl=60)
    store.register_owner(st, "o2", ttl=60)
    first = store.acquire_lease(st, "s1", "o1")
    old = store.LogWriter.open(st, "s1", epoch=first.epoch)
    try:
        old.append([("turn/start", {})])
        store.release_lease(st, "s1", "o1", first.epoch)
        with pytest.raises(store.FencedError) as released:
            old.append([("assistant/message", {})])
        assert released.value.current_epoch is None
        # found by a probe: it said "lease epoch None" of a lease at a higher epoch, released by its taker
        assert released.value.message.endswith(f"writer epoch {first.epoch}, lease epoch {first.epoch}, released"), released.value.message
        second = store.acquire_lease(st, "s1", "o2")
        assert second.epoch == first.epoch + 1
        with store.LogWriter.open(st, "s1", epoch=second.epoch) as new:
            assert [r["type"] for r in new.repaired] == ["turn/end"]
            new.append([("turn/start", {})])
        before = raw.log_bytes(st, "s1")
        for _ in range(3):
            with pytest.raises(store.FencedError) as info:
                old.append([("assistant/message", {"from": "old"})])
            assert (info.value.epoch, info.value.current_epoch) == (first.epoch, second.epoch)
        assert raw.log_bytes(st, "s1") == before
    finally:
        old.close()
    assert all(e["epoch"] in (0, first.epoch, second.epoch) for e in store.inspect(st, "s1").events)
    with pytest.raises(store.FencedError):
        store.LogWriter.open(st, "s1", epoch=first.epoch)


def test_fencing_survives_inode_reuse_with_coarse_mtimes(tmp_path):
    """A takeover that leaves the session file's inode, size and (coarse) mtime as they were still fences.

    The lease lives in the session file and is rewritten in place: the inode
    never changes, and the size does not either (the slots have a fixed size).
    On a file system with jiffy-grained mtimes a takeover within one tick then
    looks unchanged to a writer that only compares (inode, mtime, size); the
    writer must read the slots' bytes under the lock at every append. utime
    recreates that tick here.
    """
    st = store.Store(tmp_path / "store", durability="none")
    new_session(st)
    store.register_owner(st, "o1", ttl=600)
    path = st.session_path("s1")
    for _ in range(50):
        first = store.acquire_lease(st, "s1", "o1")
        with store.LogWriter.open(st, "s1", epoch=first.epoch) as writer:
            writer.append([("notice/received", {})])  # the writer has read the lease slots
            seen = os.stat(path)
            store.release_lease(st, "s1", "o1", first.epoch)
            second = store.acquire_lease(st, "s1", "o1")  # a takeover: same owner-id length, same size
            now = os.stat(path)
            if (now.st_ino, now.st_size) == (seen.st_ino, seen.st_size):
                os.utime(path, ns=(seen.st_atime_ns, seen.st_mtime_ns))  # the same coarse tick
            with pytest.raises(store.FencedError):
                writer.append([("notice/received", {"stale": True})])
        store.release_lease(st, "s1", "o1", second.epoch)
    assert all(not e["data"].get("stale") for e in store.inspect(st, "s1").events)


def test_writers_leak_no_descriptors(st):
    """Opening, fencing and closing writers (with lease changes between) leaves no file descriptor open."""
    new_session(st)
    store.register_owner(st, "o1", ttl=600)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        lease = store.acquire_lease(st, "s1", "o1")
        with store.LogWriter.open(st, "s1", epoch=lease.epoch) as writer:
            writer.append([("notice/received", {})])
            store.set_lease_state(st, "s1", "o1", lease.epoch, "idle")
            writer.append([("notice/received", {})])
        with pytest.raises(store.FencedError):
            store.LogWriter.open(st, "s1", epoch=lease.epoch - 1)
        store.release_lease(st, "s1", "o1", lease.epoch)
    assert len(os.listdir("/proc/self/fd")) == before


# -- the projection cache ------------------------------------------------------------


def load(st, sid, *, use_cache):
    header = store.read_header(st, sid)
    with open_session(st, sid) as file:
        return store.load_projection(st, sid, header, file, use_cache=use_cache)


def random_batch(rng: random.Random, writer: store.LogWriter, ids: store.IdGenerator):
    p = writer.projection
    if p.open_turn is None:
        choice = rng.choice(["turn", "descriptor", "bad-descriptor", "message", "notice", "discard"])
        if choice == "turn":
            return [("turn/start", {})]
        if choice == "descriptor":
            return [("subagent/descriptor", rng.choice([ONE_SHOT, CONTINUABLE, {**CONTINUABLE, "label": "x"}]))]
        if choice == "bad-descriptor":
            return [("subagent/descriptor", rng.choice([{"version": 99}, {"version": 1, "mode": "one-shot"}]))]
        if choice == "message":
            return [("message/accepted", {"message_id": ids.new(), "source": {}, "content": "m"})]
        if choice == "discard":
            return [("message/discarded", {"message_id": ids.new()})]
        return [("notice/received", {"n": rng.random()})]
    if p.open_calls and rng.random() < 0.5:
        return [("tool/result", {"call_id": next(iter(p.open_calls))})]
    return [rng.choice([("step/start", {}), ("step/end", {}), ("tool/call", {"call_id": f"c{rng.randrange(5)}"}),
                        ("assistant/message", {"t": "x"}), ("turn/end", {"stop_reason": "completed"})])
            for _ in range(rng.randint(1, 3))]


@pytest.mark.parametrize("seed", range(4))
def test_cache_resume_equals_full_fold(st, seed):
    """At every point of a random log, resuming from the identity cache gives the full fold's projection."""
    rng = random.Random(seed)
    ids = store.IdGenerator()
    seeded = [{"type": "subagent/descriptor", "data": CONTINUABLE}, {"type": "turn/start"}, {"type": "turn/end", "data": {}}]
    # half the logs start at CACHE_LAG_BYTES: theirs resume from a cache (a shorter log has none)
    store.create_session(st, "s1", seed=seeded if seed % 2 else (), events=[("session/end-seed", {}), DESC, *([PADDING] if seed < 2 else [])])
    for step in range(40):
        with store.LogWriter.open(st, "s1", epoch=0, repair=rng.random() < 0.3) as writer:
            for _ in range(rng.randint(1, 4)):
                writer.append(random_batch(rng, writer, ids), commit=rng.random() < 0.3)
            live = writer.projection.to_record()
        cached, end_c, status_c = load(st, "s1", use_cache=True)
        full, end_f, status_f = load(st, "s1", use_cache=False)
        assert cached.to_record() == full.to_record() == live, step
        assert (end_c, status_c) == (end_f, status_f) == (log_size(st), "clean")
        if seed < 2 and step and writer.projection.turns:
            assert Projection.from_record(decode_cache(read_file(st.path("s1", "identity")))) is not None


def test_cache_is_ignored_when_it_does_not_match(st):
    """A cache from another seed length, beyond the log, other version or garbage is not used."""
    new_session(st, events=(DESC, PADDING))
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    truth = load(st, "s1", use_cache=False)[0].to_record()
    good = decode_cache(read_file(st.path("s1", "identity")))
    lies = [
        {**good, "seed_length": 5},
        {**good, "end_offset": good["end_offset"] + 100},
        {**good, "last_offset": good["last_offset"] + 1},
        {**good, "version": 2},
        {**good, "turns": "many"},
        {**good, "seq": 7},
    ]
    for lie in lies:
        write_file(st.path("s1", "identity"), encode_record({"seq": 0, "projection": lie}))
        assert load(st, "s1", use_cache=True)[0].to_record() == truth, lie
    write_file(st.path("s1", "identity"), b"\xc1not msgpack")
    assert load(st, "s1", use_cache=True)[0].to_record() == truth


# -- failed writes -------------------------------------------------------------------


class FailingOS:
    """``os`` for one store module, with ``write``/``fsync`` failing on demand."""

    def __init__(self, fail: str) -> None:
        self.fail = fail
        self.armed = False

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self.armed and self.fail in ("write", "partial", "short"):
            self.armed = False
            if self.fail == "short":
                return os.write(fd, bytes(data)[: len(data) // 2])
            if self.fail == "partial":
                os.write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.EIO, "injected write failure")
        return os.write(fd, data)

    def pwrite(self, fd, data, offset):
        if self.armed and self.fail in ("write", "partial", "short"):
            self.armed = False
            if self.fail == "short":
                return os.pwrite(fd, bytes(data)[: len(data) // 2], offset)
            if self.fail == "partial":
                os.pwrite(fd, bytes(data)[: len(data) // 2], offset)
            raise OSError(errno.EIO, "injected write failure")
        return os.pwrite(fd, data, offset)

    def fsync(self, fd):
        if self.armed and self.fail == "fsync":
            self.armed = False
            raise OSError(errno.EIO, "injected fsync failure")
        return os.fsync(fd)


@pytest.mark.parametrize("fail", ["write", "partial", "fsync"])
def test_failed_append_rolls_back_and_breaks_the_writer(tmp_path, monkeypatch, fail):
    """A write that fails with an I/O error, or a failed fsync, cuts the log back to its prior
    length; the writer never writes again (the file's state is not known). A write that only ran
    out of room goes on: ``test_append_short_write.py``."""
    st = store.Store(tmp_path / "store", durability="strict")
    new_session(st)
    fake = FailingOS(fail)
    monkeypatch.setattr(store.session_file, "os", fake)
    monkeypatch.setattr(store.durability, "os", fake)
    writer = store.LogWriter.open(st, "s1", epoch=0)
    try:
        writer.append([("turn/start", {})])
        # the file up to the log's end: the cut drops the failed batch and the padding after it
        before = raw.file_bytes(st, "s1")[: raw.log_start(st, "s1") + writer.projection.end_offset]
        fake.armed = True
        with pytest.raises(store.DurabilityError) as info:
            writer.append([("assistant/message", {"text": "y" * 200}), ("assistant/message", {})])
        assert info.value.code == "DURABILITY_FAILED" and isinstance(info.value, OSError)
        assert raw.file_bytes(st, "s1") == before
        assert writer.next_seq == 2
        for again in (lambda: writer.append([("notice/received", {})]), writer.commit):
            with pytest.raises(store.DurabilityError, match="broken"):
                again()
        assert raw.file_bytes(st, "s1") == before
    finally:
        writer.close()
    with store.LogWriter.open(st, "s1", epoch=0) as fresh:
        assert [r["type"] for r in fresh.repaired] == ["turn/end"]
        assert fresh.repaired[0]["seq"] == 2
    assert store.inspect(st, "s1").status == "clean"


def test_failed_commit_fsync_breaks_the_writer(tmp_path, monkeypatch):
    """Under batched, a failed commit fsync is not retried: the writer is broken."""
    st = store.Store(tmp_path / "store", durability="batched")
    new_session(st)
    fake = FailingOS("fsync")
    monkeypatch.setattr(store.durability, "os", fake)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})])
        fake.armed = True
        with pytest.raises(store.DurabilityError):
            writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)
        with pytest.raises(store.DurabilityError, match="broken"):
            writer.append([("notice/received", {})])


def test_failed_fsync_keeps_a_batch_another_writer_appended_behind(tmp_path, monkeypatch):
    """The strict fsync runs outside the lock: when it fails after a same-epoch writer has
    appended behind the batch, the batch stays (cutting it would cut theirs) and only the
    failing writer breaks; the other goes on, and the log stays one contiguous prefix."""
    st = store.Store(tmp_path / "store", durability="strict")
    new_session(st)
    first = store.LogWriter.open(st, "s1", epoch=0)
    second = store.LogWriter.open(st, "s1", epoch=0)

    class FsyncFailsAfterAnotherAppend(FailingOS):
        def fsync(self, fd):
            if self.armed:
                self.armed = False
                second.append([("notice/received", {"by": "second"})])  # lands behind the unsynced batch
                raise OSError(errno.EIO, "injected fsync failure")
            return os.fsync(fd)

    fake = FsyncFailsAfterAnotherAppend("fsync")
    monkeypatch.setattr(store.durability, "os", fake)
    try:
        fake.armed = True
        with pytest.raises(store.DurabilityError):
            first.append([("assistant/message", {"text": "unsynced"})])
        with pytest.raises(store.DurabilityError, match="broken"):
            first.append([("notice/received", {})])
        (record,) = second.append([("notice/received", {"by": "second, again"})])
        assert record["seq"] == 3
    finally:
        first.close()
        second.close()
    found = store.inspect(st, "s1")
    assert found.status == "clean"
    assert [e["data"] for e in found.events[1:]] == [{"text": "unsynced"}, {"by": "second"}, {"by": "second, again"}]


# -- several processes -----------------------------------------------------------------


def collect(children, done="DONE"):
    seqs: dict[int, list[list[int]]] = {}
    for child in children:
        batches = []
        while True:
            line = child.next_line()
            if line is None:
                child.fail("exited before DONE")
            if line == done:
                break
            _, sid, raw = line.split()
            batches.append((sid, [int(s) for s in raw.split(",")]))
        seqs[child.pid] = batches
    return seqs


def run_appenders(st, sid_lists, n):
    children = [Child("multi-append", st.root, ",".join(sids), str(n)) for sids in sid_lists]
    try:
        for child in children:
            child.expect("READY")
        for child in children:
            child.send("GO")
        seqs = collect(children)
        for child in children:
            assert child.close() == 0, child.stderr()
        return seqs
    finally:
        for child in children:
            child.__exit__()


def check_log(st, sid, reported):
    """Every reported batch is in the log, contiguous, in the writer's order, and nothing else is."""
    found = store.inspect(st, sid)
    assert found.status == "clean"
    events = found.events[1:]
    assert [e["seq"] for e in found.events] == list(range(len(found.events)))
    by_seq = {e["seq"]: e for e in events}
    total = 0
    for pid, batches in reported.items():
        mine = [seqs for s, seqs in batches if s == sid]
        for seqs in mine:
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # a batch is never interleaved
            assert [by_seq[s]["data"]["pid"] for s in seqs] == [pid] * len(seqs)
            assert [by_seq[s]["data"]["k"] for s in seqs] == list(range(len(seqs)))
        flat = [s for seqs in mine for s in seqs]
        assert flat == sorted(flat)
        assert [by_seq[s]["data"]["i"] for s in flat] == sorted(by_seq[s]["data"]["i"] for s in flat)
        total += len(flat)
    assert total == len(events)


def test_four_processes_append_to_one_session(tmp_path):
    """Four processes at epoch 0 append to ONE log: no interleaving, contiguous seqs, every record present."""
    st = store.Store(tmp_path / "store", durability="none")
    new_session(st)
    reported = run_appenders(st, [["s1"]] * 4, 60)
    check_log(st, "s1", reported)
    pids = [e["data"]["pid"] for e in store.inspect(st, "s1").events[1:]]
    assert any(a != b for a, b in zip(pids, pids[1:])), "the writers never overlapped"


def test_many_sessions_in_parallel(tmp_path):
    """Four processes each append to a shared session and two of their own, all at once."""
    st = store.Store(tmp_path / "store", durability="none")
    sids = ["shared"] + [f"own{i}{j}" for i in range(4) for j in range(2)]
    for sid in sids:
        new_session(st, sid)
    reported = run_appenders(st, [["shared", f"own{i}0", f"own{i}1"] for i in range(4)], 25)
    for sid in sids:
        check_log(st, sid, reported)


def test_unknown_event_type_is_refused_before_writing(tmp_path) -> None:
    """A writer never makes a log its readers would refuse (helper-1 finding)."""
    from subagents import store as _store

    st = _store.Store(tmp_path / "s", durability="none")
    _store.create_session(st, "s1")
    size = os.path.getsize(st.session_path("s1"))
    with _store.LogWriter.open(st, "s1", epoch=0) as writer:
        with pytest.raises(_store.UnsupportedFormatError):
            writer.append([("turn/start", {}), ("made/up", {})])
    assert os.path.getsize(st.session_path("s1")) == size
    assert _store.inspect(st, "s1").status == "clean"


# -- attaching to a log its creator just wrote (issue #12, item 3) ------------------------------


def _created(st, sid="s1", owner="o1"):
    request = store.session.NewSession(sid, events=[DESC], lease_owner=owner)
    [created] = store.session.commit_sessions(st, [request], store.session.publish_sessions(st, [request]))
    return created


def test_an_attached_writer_continues_the_log_as_an_opened_one_would(any_st):
    """``attach`` with the creator's projection appends at the right seq and offset, writes the same
    identity cache at commit, and releases the lease on its pinned file."""
    created = _created(any_st)
    writer = store.LogWriter.attach(any_st, "s1", epoch=1, projection=created.projection)
    try:
        records = writer.append([("turn/start", {"message_id": "m"})])
        writer.append([("turn/end", {"stop_reason": "completed", "diagnostic": None})], commit=True)
        writer.release_lease("o1", write_released)
    finally:
        writer.close()
    assert records[0]["seq"] == 1 and kinds(any_st) == ["subagent/descriptor", "turn/start", "turn/end"]
    assert store.read_lease(any_st, "s1").state == "released"
    assert store.read_projection(any_st, "s1").to_record() == writer.projection.to_record()


def test_an_attached_writer_taken_over_is_fenced(st):
    """A zombie attached at epoch 1 gets ``FencedError`` on its first append after a takeover, and
    cannot release the new owner's lease; nothing of it reaches the log."""
    created = _created(st)
    zombie = store.LogWriter.attach(st, "s1", epoch=1, projection=created.projection)
    try:
        assert store.acquire_lease(st, "s1", "o1").epoch == 2  # the owner fences before repair
        size = log_size(st)
        with pytest.raises(store.FencedError):
            zombie.append([("turn/start", {"message_id": "m"})])
        with pytest.raises(store.FencedError):
            zombie.release_lease("o1", write_released)
        assert log_size(st) == size
        assert store.read_lease(st, "s1").epoch == 2 and store.read_lease(st, "s1").state == "running"
    finally:
        zombie.close()


def test_an_attached_writer_refuses_a_log_shorter_than_its_projection(st):
    """The projection is checked, not trusted: a log shorter than it is corrupt, and nothing is written."""
    created = _created(st)
    os.truncate(st.session_path("s1"), raw.log_start(st, "s1") + created.projection.end_offset - 1)
    writer = store.LogWriter.attach(st, "s1", epoch=1, projection=created.projection)
    try:
        with pytest.raises(store.CorruptSessionError):
            writer.append([("turn/start", {"message_id": "m"})])
    finally:
        writer.close()
    assert log_size(st) == created.projection.end_offset - 1


def test_releasing_the_lease_of_another_owner_is_fenced(st):
    """``release_lease`` on the writer checks the owner too, as ``store.release_lease`` does."""
    created = _created(st)
    writer = store.LogWriter.attach(st, "s1", epoch=1, projection=created.projection)
    try:
        writer.append([("turn/start", {"message_id": "m"})])
        with pytest.raises(store.FencedError):
            writer.release_lease("someone-else", write_released)
    finally:
        writer.close()
    assert store.read_lease(st, "s1").state == "running"


def test_an_attached_writer_releases_with_the_catalog_row_its_files_give(st):
    """The settled row written at the writer's release, from the header and projection it was
    attached with, is the row ``store/rows.py`` computes from the child's files."""
    store.create_session(st, "p")
    request = store.session.NewSession("c1", parent_session="p", origin="subagent", events=[DESC], lease_owner="o1")
    [created] = store.session.commit_sessions(st, [request], store.session.publish_sessions(st, [request]))
    writer = store.LogWriter.attach(st, "c1", epoch=1, projection=created.projection, header=created.header)
    try:
        writer.append([("turn/start", {"message_id": "m"})])
        writer.append([("turn/end", {"stop_reason": "error", "diagnostic": "RuntimeError: boom"})], commit=True)
        writer.release_lease("o1", write_released)
    finally:
        writer.close()
    [entry] = store.read_index(st, "p").entries
    assert entry.settled is not None and entry.settled.outcome == "error"
    assert entry.settled == store.rows.settled_row(st, store.read_header(st, "c1"))
