"""Durable mailboxes: acceptance, FIFO pending, and the consumed prefix recorded in the log."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from subagents import store
import subagents.store.durability
from subagents.store.framing import scan
from subagents.store.changes import ChangeWatch
from subagents.store.mailbox import MailboxWriter
from subagents.store.mailbox_read import mailbox_data_end

from ._support import ONE_SHOT, PreadCounter, read_file


@pytest.fixture
def s1(any_st):
    store.create_session(any_st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    return any_st


def accept(st, content, ids, **kw):
    return store.accept(st, "s1", source={"kind": "coordinator", "sender": "p"}, content=content, ids=ids, **kw)


def consume(st, messages, *, kind="message/accepted"):
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([(kind, m.to_event_data() if kind == "message/accepted" else {"message_id": m.id}) for m in messages],
                      commit=True)
        return writer.projection


def test_accept_is_on_disk_before_it_returns(s1):
    """The returned id is already a framed record in the mailbox file, with its source and content."""
    ids = store.IdGenerator()
    mid = accept(s1, {"text": "hello"}, ids, wake=False)
    (record,) = scan(read_file(s1.path("s1", "mailbox")), padded=True).records
    assert record["id"] == mid and record["seq"] == 0
    assert (record["source"], record["content"], record["wake"]) == ({"kind": "coordinator", "sender": "p"}, {"text": "hello"}, False)
    (message,) = store.read_mailbox(s1, "s1")
    assert (message.id, message.content, message.wake) == (mid, {"text": "hello"}, False)
    end = scan(read_file(s1.path("s1", "mailbox")), padded=True).end  # the record's end, before the padding
    assert message.end == end
    assert end - 8 < mailbox_data_end(s1, "s1") <= end  # a bound: the record's own last bytes may be zeros
    assert message.to_event_data() == {
        "message_id": mid, "source": {"kind": "coordinator", "sender": "p"}, "content": {"text": "hello"}, "mailbox_end": end
    }


def test_accept_fsyncs_under_every_syncing_policy(s1, monkeypatch):
    """Acceptance reaches stable storage (an fsync of the mailbox) unless the policy is none."""
    synced = []
    real = os.fsync

    class SpyOS:
        def __getattr__(self, name):
            return getattr(os, name)

        def fsync(self, fd):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            return real(fd)

    monkeypatch.setattr(store.durability, "os", SpyOS())
    accept(s1, "x", store.IdGenerator())
    mailbox_syncs = [p for p in synced if p.endswith("/s1.mailbox")]
    assert len(mailbox_syncs) == (0 if s1.durability.name == "none" else 1)


def test_pending_is_fifo_and_skips_the_consumed_prefix(s1):
    """Pending messages come in acceptance order; those the log consumed are never pending again."""
    ids = store.IdGenerator()
    mids = [accept(s1, f"m{i}", ids) for i in range(5)]
    assert [m.id for m in store.pending(s1, "s1", consumed=0, last_consumed_id=None)] == mids
    messages = store.read_mailbox(s1, "s1")
    projection = consume(s1, messages[:2])
    assert (projection.consumed, projection.last_message_id) == (2, mids[1])
    pend = store.pending(s1, "s1", consumed=projection.consumed, last_consumed_id=projection.last_message_id)
    assert [m.content for m in pend] == ["m2", "m3", "m4"]
    after_crash = store.LogWriter.open(s1, "s1", epoch=0)  # a resumed writer sees the same prefix
    after_crash.close()
    assert (after_crash.projection.consumed, after_crash.projection.last_message_id) == (2, mids[1])


def test_discarded_messages_count_as_consumed(s1):
    """Messages dropped by teardown (message/discarded) are consumed: never pending again, even after resume."""
    ids = store.IdGenerator()
    first = [accept(s1, f"m{i}", ids) for i in range(2)]
    consume(s1, store.read_mailbox(s1, "s1"), kind="message/discarded")
    later = accept(s1, "after", ids)
    with store.LogWriter.open(s1, "s1", epoch=0) as writer:
        p = writer.projection
        assert (p.consumed, p.last_message_id) == (2, first[1])
        assert [m.id for m in store.pending(s1, "s1", consumed=p.consumed, last_consumed_id=p.last_message_id)] == [later]
    projection = consume(s1, store.read_mailbox(s1, "s1")[2:])
    assert store.pending(s1, "s1", consumed=projection.consumed, last_consumed_id=projection.last_message_id) == []


@pytest.mark.parametrize("consumed, last", [(1, "wrong-id"), (3, None), (1, None)])
def test_disagreement_is_corrupt(s1, consumed, last):
    """A log that consumed a different or a longer prefix than the mailbox holds is CorruptSessionError."""
    ids = store.IdGenerator()
    accept(s1, "a", ids)
    accept(s1, "b", ids)
    with pytest.raises(store.CorruptSessionError) as info:
        store.pending(s1, "s1", consumed=consumed, last_consumed_id=last)
    assert "mailbox and log disagree" in info.value.reason


def test_torn_mailbox_tail_is_dropped_by_the_next_acceptance(s1):
    """A half-written acceptance (it never returned) is cut off; the next message gets its seq."""
    ids = store.IdGenerator()
    kept = accept(s1, "kept", ids)
    path = s1.path("s1", "mailbox")
    end = scan(read_file(path), padded=True).end
    with open(path, "r+b") as handle:  # where the next acceptance writes: over the padding
        handle.seek(end)
        handle.write(store.encode_record({"seq": 1, "id": "torn", "content": "never returned"})[:-4])
    assert [m.id for m in store.read_mailbox(s1, "s1")] == [kept]
    nxt = accept(s1, "next", ids)
    records = scan(read_file(path), padded=True).records
    assert [(r["seq"], r["id"]) for r in records] == [(0, kept), (1, nxt)]
    assert scan(read_file(path), padded=True).damage is None


def test_acceptances_overwrite_the_padding_in_place(s1):
    """The first acceptance pads the mailbox to a 4 KiB boundary; the next ones write over the zeros (no size
    change for their fsync to write) and the data end grows with each, which is what a watcher compares."""
    ids = store.IdGenerator()
    path = s1.path("s1", "mailbox")
    first = accept(s1, "one", ids)
    size = os.path.getsize(path)
    assert size == 4096
    ends = [mailbox_data_end(s1, "s1")]
    later = []
    for i in range(5):
        later.append(accept(s1, f"message {i}", ids))
        ends.append(mailbox_data_end(s1, "s1"))
        assert os.path.getsize(path) == size
    assert ends == sorted(set(ends))  # grew with every acceptance
    data = read_file(path)
    result = scan(data, padded=True)
    assert result.damage is None and [r["id"] for r in result.records] == [first, *later]
    assert ends[-1] <= result.end and data[result.end:] == bytes(size - result.end)
    assert [m.id for m in store.read_mailbox(s1, "s1")] == [first, *later]


def test_an_acceptance_that_fills_the_padding_extends_the_file_by_whole_blocks(s1):
    ids = store.IdGenerator()
    path = s1.path("s1", "mailbox")
    accepted = [accept(s1, "x" * 1000, ids) for _ in range(9)]
    result = scan(read_file(path), padded=True)
    assert result.end > 8192 and os.path.getsize(path) == 12288
    assert result.damage is None and [r["id"] for r in result.records] == accepted


def test_a_mailbox_an_older_build_wrote_without_padding_is_read_and_appended_to(s1):
    """Version 2 appended with O_APPEND and no padding: such a file is a valid padded one with no zeros yet."""
    path = s1.path("s1", "mailbox")
    old = [store.encode_record({"seq": i, "id": f"old-{i}", "ts": 1.0, "source": {"kind": "user"}, "content": "c"}) for i in range(2)]
    with open(path, "wb") as handle:
        handle.write(b"".join(old))
    assert [m.id for m in store.read_mailbox(s1, "s1")] == ["old-0", "old-1"]
    assert mailbox_data_end(s1, "s1") == os.path.getsize(path)
    new = accept(s1, "new", store.IdGenerator())
    assert [m.id for m in store.read_mailbox(s1, "s1")] == ["old-0", "old-1", new]
    assert os.path.getsize(path) == 4096


def test_pending_reads_only_the_suffix_when_nothing_but_padding_follows(s1):
    """All consumed: the suffix after ``mailbox_end`` is only zeros, which is 'nothing pending', not a reason to
    read (and check) the whole mailbox: damage before ``mailbox_end`` is not seen."""
    ids = store.IdGenerator()
    accept(s1, "a", ids)
    accept(s1, "b", ids)
    messages = store.read_mailbox(s1, "s1")
    projection = consume(s1, messages)
    path = s1.path("s1", "mailbox")
    with open(path, "r+b") as handle:  # a bad byte in the consumed prefix
        handle.seek(10)
        handle.write(b"\xff")
    assert store.pending(s1, "s1", consumed=projection.consumed, last_consumed_id=projection.last_message_id,
                         mailbox_end=projection.mailbox_end) == []


def test_an_acceptance_never_cuts_damage_in_what_the_log_consumed(s1):
    """Damage in place in the last consumed record read as a torn tail (the frame ends in the record's
    ``seq`` 0, a zero byte, then padding): the next acceptance cut there and wrote over an acknowledged
    record. The log's consumed end proves it committed: refused, nothing written."""
    ids = store.IdGenerator()
    accept(s1, "x" * 40, ids)
    consume(s1, store.read_mailbox(s1, "s1"))
    path = s1.path("s1", "mailbox")
    with open(path, "r+b") as handle:  # four bytes inside the consumed message's content
        handle.seek(0x40)
        handle.write(b"\xde\xad\xbe\xef")
    before = read_file(path)
    another_process = store.Store(s1.root, durability=s1.durability.name)  # knows nothing of where the records end
    with pytest.raises(store.CorruptSessionError):
        accept(another_process, "next", ids)
    assert read_file(path) == before


def test_accept_for_unknown_session(st):
    """A message for a session without a header is refused, and no mailbox appears."""
    with pytest.raises(store.SessionNotFoundError):
        store.accept(st, "ghost", source={}, content="x", ids=store.IdGenerator())
    assert os.listdir(st.sessions_dir) == []
    assert store.read_mailbox(st, "nobody") == []


def test_accept_with_the_callers_lock(s1):
    """A caller holding the session's lock (an flock on its file) passes it in; acceptance still works and keeps it open."""
    from subagents.store.session_file import SessionLock

    lock = SessionLock("s1", s1.session_path("s1"))
    try:
        mid = store.accept(s1, "s1", source={}, content="x", ids=store.IdGenerator(), lock=lock)
        with lock:
            pass
    finally:
        lock.close()
    assert [m.id for m in store.read_mailbox(s1, "s1")] == [mid]
    assert store.read_header(s1, "s1").id == "s1"


def test_pending_reads_only_the_unconsumed_suffix_when_told_where_it_starts(s1):
    """pending(mailbox_end=...) skips the consumed prefix; a wrong offset falls back to the full check."""
    ids = store.IdGenerator()
    mids = [accept(s1, {"n": i}, ids) for i in range(5)]
    messages = store.read_mailbox(s1, "s1")
    fast = store.pending(s1, "s1", consumed=2, last_consumed_id=mids[1], mailbox_end=messages[1].end)
    assert [m.id for m in fast] == mids[2:]
    wrong = store.pending(s1, "s1", consumed=2, last_consumed_id=mids[1], mailbox_end=messages[1].end + 3)
    assert [m.id for m in wrong] == mids[2:]
    assert store.pending(s1, "s1", consumed=5, last_consumed_id=mids[4], mailbox_end=messages[4].end) == []


# -- a writer held open (issue #12: a resident child's followups open nothing each) --------------


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(params=["timestamps", "watched"])
def changes(request):
    """How a held writer learns that another hand touched its mailbox: a ``stat`` of the path at every
    acceptance, or an inotify watch (``store/changes.py``) and a ``stat`` only after an event."""
    if request.param == "timestamps":
        yield None
        return
    watch = ChangeWatch.open()
    if watch is None:
        pytest.skip("no inotify here")
    yield watch
    watch.close()


def _writer(st, changes=None):
    return MailboxWriter(st, "s1", changes=changes)


def test_a_writer_accepts_many_messages_through_descriptors_it_keeps(s1, changes):
    """Two descriptors (the session's file, the mailbox) from the first acceptance to ``close``, none per message."""
    ids = store.IdGenerator()
    before = _open_fds()
    writer = _writer(s1, changes)
    first = writer.accept(source={"kind": "user"}, content="m0", ids=ids)
    held = _open_fds()
    assert len(held - before) == 2
    rest = [writer.accept(source={"kind": "user"}, content=f"m{i}", ids=ids) for i in range(1, 20)]
    assert _open_fds() == held
    writer.close()
    writer.close()  # idempotent
    assert _open_fds() == before
    assert [m.id for m in store.read_mailbox(s1, "s1")] == [first, *rest]


def test_a_writer_refuses_a_session_gc_moved_away(st, tmp_path, changes):
    """``gc`` renames a session's file (and then its companions) away under its lock: a held writer
    accepts nothing more, and no mailbox appears beside the session that is gone."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    writer = _writer(st, changes)
    writer.accept(source={}, content="before", ids=store.IdGenerator())
    trash = tmp_path / "trash"
    trash.mkdir()
    os.rename(st.session_path("s1"), trash / "session")
    os.rename(st.path("s1", "mailbox"), trash / "mailbox")
    with pytest.raises(store.SessionNotFoundError):
        writer.accept(source={}, content="after", ids=store.IdGenerator())
    writer.close()
    assert not os.path.exists(st.path("s1", "mailbox"))
    assert [r["content"] for r in scan(read_file(str(trash / "mailbox"))).records] == ["before"]


def test_a_writer_appends_to_the_mailbox_its_path_names(s1, changes):
    """A mailbox replaced under a held writer (removed here) is opened again: nothing goes to a file nobody reads."""
    ids = store.IdGenerator()
    writer = _writer(s1, changes)
    writer.accept(source={}, content="old", ids=ids)
    os.unlink(s1.path("s1", "mailbox"))
    mid = writer.accept(source={}, content="new", ids=ids)
    writer.close()
    assert [(m.id, m.content) for m in store.read_mailbox(s1, "s1")] == [(mid, "new")]


def test_a_writer_appends_to_the_file_renamed_over_its_mailbox(s1, changes):
    """Another file put at the mailbox's path (renamed over it, as a restore from a backup would) is the
    mailbox from then on: the held writer checks it and appends there, never to the file it replaced."""
    ids = store.IdGenerator()
    writer = _writer(s1, changes)
    writer.accept(source={}, content="old", ids=ids)
    path = s1.path("s1", "mailbox")
    os.link(path, path + ".backup")
    writer.accept(source={}, content="after the backup", ids=ids)
    os.rename(path + ".backup", path)  # its inode is the held one: nothing to reopen, the writer goes on
    os.rename(path, path + ".kept")
    restored = read_file(path + ".kept")
    with open(path + ".restored", "wb") as out:
        out.write(restored)
    os.rename(path + ".restored", path)  # another inode now
    mid = writer.accept(source={}, content="new", ids=ids)
    writer.close()
    assert [m.content for m in store.read_mailbox(s1, "s1")] == ["old", "after the backup", "new"]
    assert read_file(path + ".kept") == restored  # the replaced file got nothing more
    assert store.read_mailbox(s1, "s1")[-1].id == mid


def test_a_watched_writer_reads_no_timestamps_while_only_it_writes(s1, monkeypatch):
    """The point of the watch: no ``stat`` (which would read the timestamps and make the next fsync write the
    inode, ``store/changes.py``) and no check of the log while nobody else touches the mailbox; the first
    acceptance after another process wrote it in place makes both again."""
    watch = ChangeWatch.open()
    if watch is None:
        pytest.skip("no inotify here")
    from subagents.store import mailbox as mailbox_module

    stats: list[str] = []
    checks: list[str] = []
    real_check = mailbox_module.require_consumed_prefix

    class SpyOS:
        def __getattr__(self, name):
            return getattr(os, name)

        def stat(self, *args, **kwargs):
            stats.append("stat")
            return os.stat(*args, **kwargs)

        def fstat(self, fd):
            stats.append("fstat")
            return os.fstat(fd)

    monkeypatch.setattr(mailbox_module, "os", SpyOS())
    monkeypatch.setattr(mailbox_module, "require_consumed_prefix", lambda *a, **k: (checks.append("check"), real_check(*a, **k))[1])
    ids = store.IdGenerator()
    writer = _writer(s1, watch)
    try:
        writer.accept(source={}, content="first", ids=ids)
        assert checks == ["check"]
        stats.clear()
        for i in range(5):
            writer.accept(source={}, content=f"m{i}", ids=ids)
        assert stats == [] and checks == ["check"]
        path = s1.path("s1", "mailbox")
        subprocess.run([sys.executable, "-c", f"import os; fd = os.open({path!r}, os.O_RDWR); os.pwrite(fd, os.pread(fd, 1, 0), 0)"],
                       check=True, timeout=60)  # the same byte written back: nothing damaged, but touched
        writer.accept(source={}, content="after", ids=ids)
        assert checks == ["check", "check"] and stats
        stats.clear()
        writer.accept(source={}, content="quiet again", ids=ids)
        assert stats == [] and checks == ["check", "check"]
    finally:
        writer.close()
        watch.close()
    assert [m.content for m in store.read_mailbox(s1, "s1")][-2:] == ["after", "quiet again"]


def test_an_acceptance_after_one_that_failed_checks_the_mailbox_again(tmp_path, changes, monkeypatch):
    """A failed acceptance (its fsync refused here) leaves the writer trusting nothing it saw: the next one
    checks the mailbox against the log again, as a first acceptance does, and both messages read back
    (the failed one is there, unacknowledged: the caller was told it may not be durable)."""
    import errno

    from subagents.store import mailbox as mailbox_module

    st = store.Store(tmp_path / "store", durability="strict")
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    checks: list[str] = []
    real_check = mailbox_module.require_consumed_prefix
    monkeypatch.setattr(mailbox_module, "require_consumed_prefix", lambda *a, **k: (checks.append("check"), real_check(*a, **k))[1])

    class FsyncFailsOnce:
        armed = True

        def __getattr__(self, name):
            return getattr(os, name)

        def fsync(self, fd):
            if FsyncFailsOnce.armed:
                FsyncFailsOnce.armed = False
                raise OSError(errno.EIO, "injected fsync failure")
            return os.fsync(fd)

    ids = store.IdGenerator()
    writer = _writer(st, changes)
    try:
        writer.accept(source={}, content="first", ids=ids)
        writer.accept(source={}, content="second", ids=ids)
        assert checks == ["check"]
        monkeypatch.setattr(store.durability, "os", FsyncFailsOnce())
        with pytest.raises(store.DurabilityError):
            writer.accept(source={}, content="unsure", ids=ids)
        writer.accept(source={}, content="after", ids=ids)
        assert checks == ["check", "check"]
    finally:
        writer.close()
    assert [m.content for m in store.read_mailbox(st, "s1")] == ["first", "second", "unsure", "after"]


def test_close_never_waits_for_an_acceptance_in_progress(st, changes):
    """``close`` returns at once while an acceptance waits for the lock; that acceptance completes and closes the descriptors."""
    import threading

    from subagents.store.session_file import SessionLock

    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    before = _open_fds()
    writer = _writer(st, changes)
    other = SessionLock("s1", st.session_path("s1"))
    other.acquire()  # another process's critical section
    out: list[str] = []
    thread = threading.Thread(target=lambda: out.append(writer.accept(source={}, content="x", ids=store.IdGenerator())))
    try:
        thread.start()
        thread.join(0.2)
        assert thread.is_alive() and not out  # waiting for the lock
        writer.close()  # returns while the acceptance waits
    finally:
        other.release()
        other.close()
    thread.join(20)
    assert not thread.is_alive() and [m.id for m in store.read_mailbox(st, "s1")] == out
    assert _open_fds() == before


def test_a_closed_writer_still_accepts_and_keeps_nothing_open(s1, changes):
    """An acceptance racing a disposal (after ``close``) is still durable, and opens and closes its own descriptors."""
    before = _open_fds()
    writer = _writer(s1, changes)
    writer.close()
    mid = writer.accept(source={}, content="late", ids=store.IdGenerator())
    assert _open_fds() == before
    assert [m.id for m in store.read_mailbox(s1, "s1")] == [mid]


def test_threads_sharing_a_writer_take_turns_in_the_critical_section(tmp_path):
    """``flock`` belongs to the open file description, so it does not exclude two threads on one
    descriptor: the writer's own mutex does. While one acceptance is inside (held here at its
    commit point), another through the same writer appends nothing."""
    import threading

    from subagents.store.durability import Batched

    inside, go_on = threading.Event(), threading.Event()

    class HeldAtCommit(Batched):
        def commit_append(self, fd: int, what: str) -> None:
            if not inside.is_set():
                inside.set()
                assert go_on.wait(20)
            super().commit_append(fd, what)

    st = store.Store(tmp_path / "store", durability=HeldAtCommit())
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    writer = _writer(st)
    ids = store.IdGenerator()
    made: list[str] = []
    first = threading.Thread(target=lambda: made.append(writer.accept(source={}, content="first", ids=ids)))
    second = threading.Thread(target=lambda: made.append(writer.accept(source={}, content="second", ids=ids)))
    try:
        first.start()
        assert inside.wait(20)
        second.start()
        second.join(0.2)
        assert len(scan(read_file(st.path("s1", "mailbox"))).records) == 1  # the second waits outside
    finally:
        go_on.set()
        first.join(20)
        second.join(20)
    writer.close()
    assert [m.content for m in store.read_mailbox(st, "s1")] == ["first", "second"] and len(made) == 2


def test_stray_bytes_inside_the_padding_are_damage_that_is_never_cut(s1):
    """Bytes that are not zeros further into the padding are no torn tail (an acceptance that never
    returned leaves a prefix of its one frame, then zeros): they may be what is left of an accepted
    message whose first bytes were zeroed. So they are neither written over nor cut: the acceptance
    is refused before a byte is written, the reader says so, and the accepted message stays."""
    from subagents.store.fsck import fsck

    ids = store.IdGenerator()
    path = s1.path("s1", "mailbox")
    accepted = accept(s1, "first", ids)
    end = scan(read_file(path), padded=True).end
    with open(path, "r+b") as handle:
        handle.seek(end + 300)
        handle.write(b"\x07stray")
    data = read_file(path)
    with pytest.raises(store.CorruptSessionError):
        accept(s1, "after", ids)
    assert read_file(path) == data and os.path.getsize(path) == 4096
    with pytest.raises(store.CorruptSessionError):
        store.read_mailbox(s1, "s1")
    assert [f["kind"] for f in fsck(s1, repair=False, lease_ttl_s=5.0)["findings"] if f["id"] == "s1"] == ["mailbox-damaged"]
    assert [r["id"] for r in scan(data, padded=True).records] == [accepted]


@pytest.mark.parametrize("damage", ["empty", "garbage", "first-record-only", "zeroed", "consumed-zeroed"])
def test_an_acceptance_beside_a_mailbox_that_lost_consumed_messages_is_refused(s1, damage):
    """Audit defect 7: a mailbox emptied, overwritten or cut short of the messages its log consumed was
    appended to and the message acknowledged, though no turn could ever take it (the log's consumed
    prefix no longer matches). Now the acceptance is CORRUPT_SESSION, writes nothing, and fsck says why.
    Zeroed in place (a probe found it), the size stays and the unconsumed part reads as padding; with only
    the consumed messages zeroed, the pending one still reads: neither may be appended to."""
    from subagents.store.fsck import fsck

    ids = store.IdGenerator()
    for i in range(3):
        accept(s1, f"m{i}", ids)
    consume(s1, store.read_mailbox(s1, "s1")[:2])
    path = s1.path("s1", "mailbox")
    first_end, second_end = [m.end for m in store.read_mailbox(s1, "s1")[:2]]
    whole = read_file(path)
    data = {"empty": b"", "garbage": bytes(range(7, 250)) * 2, "first-record-only": whole[:first_end],
            "zeroed": bytes(len(whole)), "consumed-zeroed": bytes(second_end) + whole[second_end:]}[damage]
    with open(path, "wb") as handle:
        handle.write(data)
    fresh = store.Store(s1.root, durability=s1.durability)  # another process: no checkpoint of this mailbox
    for writer in (None, MailboxWriter(s1, "s1"), MailboxWriter(fresh, "s1")):
        with pytest.raises(store.CorruptSessionError) as info:
            if writer is None:
                accept(s1, "lost", ids)
            else:
                writer.accept(source={"kind": "user"}, content="lost", ids=ids)
        assert info.value.code == "CORRUPT_SESSION" and "mailbox and log disagree" in info.value.message
        assert read_file(path) == data
    found = fsck(s1, repair=False, lease_ttl_s=5.0)
    assert [f["kind"] for f in found["findings"] if f["id"] == "s1"] == ["mailbox-damaged"]


def test_an_acceptance_after_consumed_messages_still_goes_through(s1):
    """The check the refusal above makes passes for a sound mailbox, with a fresh handle of the store too."""
    ids = store.IdGenerator()
    for i in range(2):
        accept(s1, f"m{i}", ids)
    consume(s1, store.read_mailbox(s1, "s1"))
    fresh = store.Store(s1.root, durability=s1.durability)
    later = store.accept(fresh, "s1", source={"kind": "user"}, content="later", ids=ids)
    projection = store.read_projection(s1, "s1")
    assert [m.id for m in store.pending(s1, "s1", consumed=projection.consumed, last_consumed_id=projection.last_message_id)] == [later]


def _returns_within(fn, seconds: float, release: str):
    """``fn()``'s outcome, or a failure if it is still blocked after ``seconds`` (then the FIFO at
    ``release`` is opened for writing, which lets a reader blocked in its ``open`` go)."""
    import threading

    outcome: list[object] = []

    def run():
        try:
            outcome.append(("returned", fn()))
        except Exception as exc:  # what it raised is the outcome
            outcome.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(release, os.O_WRONLY | os.O_NONBLOCK))  # a blocked reader now has its writer
        thread.join(10)
        pytest.fail(f"blocked for more than {seconds} s on the FIFO at {release}")
    return outcome[0]


@pytest.mark.parametrize("what", ["fifo", "folder"])
def test_a_fifo_in_the_mailbox_s_place_is_no_data_end_and_blocks_nobody(s1, what):
    """The supervisor's watcher asks every poll where each resident child's mailbox ends, on its event
    loop: a FIFO put in a mailbox's place made that ``open`` wait for a writer, forever, and the
    whole supervisor with it. It is unreadable (``OSError``, which the watcher skips) at once, as a
    folder in its place is."""
    path = s1.path("s1", "mailbox")
    os.mkfifo(path, 0o600) if what == "fifo" else os.mkdir(path)
    kind, value = _returns_within(lambda: mailbox_data_end(s1, "s1"), 5, path)
    assert kind == "raised" and isinstance(value, OSError), value


def test_the_data_end_of_a_mailbox_extended_with_zeros_reads_only_around_its_data(tmp_path, monkeypatch):
    """A mailbox made longer with zeros behind the store's back (``truncate``, ``fallocate``: holes, or
    a file system's recovery) ends where its last non-zero byte is, and acceptances still go in
    there. ``mailbox_data_end``, which the supervisor's watcher calls on its event loop every poll,
    read the whole file whenever its last 8 KiB were zeros: 5.6 s and 1.5 GiB of memory for one
    GiB, each poll. It skips the holes now, and reads a bounded window at a time."""
    from subagents.store import extent

    s1 = store.Store(tmp_path / "store", durability="none")
    store.create_session(s1, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    ids = store.IdGenerator()
    accept(s1, "before", ids)
    path = s1.path("s1", "mailbox")
    end = mailbox_data_end(s1, "s1")
    os.truncate(path, 256 << 20)
    read: list[int] = []

    monkeypatch.setattr(extent, "os", PreadCounter(read))
    assert mailbox_data_end(s1, "s1") == end
    assert sum(read) <= 1 << 20, f"read {sum(read)} bytes of a 256 MiB file"
    monkeypatch.undo()
    accept(s1, "after", ids)  # written over the zeros where the data ends, as over padding
    grown = mailbox_data_end(s1, "s1")
    assert grown > end and [m.content for m in store.read_mailbox(s1, "s1")] == ["before", "after"]
    with open(path, "r+b") as handle:  # bytes written as zeros, no hole: read a window at a time
        handle.seek(grown)
        handle.write(b"\0" * (8 << 20))
    read.clear()
    monkeypatch.setattr(extent, "os", PreadCounter(read))
    assert mailbox_data_end(s1, "s1") == grown
    assert max(read) <= 1 << 20


def test_readers_of_a_mailbox_extended_with_zeros_read_its_data_not_its_size(tmp_path, monkeypatch):
    """``read_mailbox`` and ``pending`` (every turn's, and every acceptance's check) read the mailbox
    from where they start to the file's end: all of a mailbox extended with zeros behind the store's
    back, at every turn, into memory. They stop where a record that starts before the last non-zero
    byte could still reach now, and find the same messages."""
    from subagents.store import atomic

    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    ids = store.IdGenerator()
    for i in range(3):
        store.accept(st, "s1", source={}, content=f"m{i}" + "\0" * 5000 * i, ids=ids)  # the last ends in zeros
    before = store.read_mailbox(st, "s1")
    consumed = before[0]
    os.truncate(st.path("s1", "mailbox"), 256 << 20)
    read: list[int] = []

    monkeypatch.setattr(atomic, "os", PreadCounter(read))
    assert store.read_mailbox(st, "s1") == before
    assert store.pending(st, "s1", consumed=1, last_consumed_id=consumed.id, mailbox_end=consumed.end) == before[1:]
    assert sum(read) <= 2 * (st.max_record_bytes + (64 << 10)), f"read {sum(read)} bytes of a 256 MiB mailbox"
    # an acceptance by a process that has no checkpoint for it reads from the start: as far as the data
    from subagents.store import appender

    read.clear()
    monkeypatch.setattr(appender, "os", PreadCounter(read))
    fresh = store.Store(st.root, durability="none")
    store.accept(fresh, "s1", source={}, content="after", ids=ids)
    assert sum(read) <= 3 * (st.max_record_bytes + (64 << 10)), f"read {sum(read)} bytes of a 256 MiB mailbox"
    monkeypatch.undo()
    assert [m.content for m in store.read_mailbox(st, "s1")] == [m.content for m in before] + ["after"]


def test_a_refused_first_acceptance_leaves_no_mailbox_behind(st):
    """A one-shot child's prompt is in its log, never in a mailbox: a message to it is refused (its log consumed
    a message no mailbox holds). The refusal used to leave an empty mailbox, which ``fsck`` then reported as
    damage of a session nobody had touched."""
    from subagents.store.fsck import fsck

    from ._support import ONE_SHOT

    root, child = store.new_id(), store.new_id()
    store.create_session(st, root)
    store.create_session(st, child, parent_session=root, origin="subagent", delegation_depth=1, events=[
        ("subagent/descriptor", dict(ONE_SHOT)),
        ("message/accepted", {"message_id": store.new_id(), "source": {"kind": "user"}, "content": "the prompt"}),
    ])
    with pytest.raises(store.CorruptSessionError):
        store.accept(st, child, source={"kind": "user"}, content="late", ids=store.IdGenerator())
    assert not os.path.lexists(st.path(child, "mailbox"))
    assert [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] != "clean"] == []


def test_a_sound_mailbox_confirms_its_consumed_end_from_one_small_read(s1, monkeypatch):
    """The check above reads the whole mailbox only when the record at the log's end of it is not the
    last consumed message; a sound one is confirmed from the bytes just before that end."""
    from subagents.store import mailbox as mailbox_module
    from subagents.store import mailbox_read

    ids = store.IdGenerator()
    for i in range(40):
        accept(s1, "x" * 200 + str(i), ids)
    consume(s1, store.read_mailbox(s1, "s1")[:39])
    monkeypatch.setattr(mailbox_module, "CONFIRM_WINDOW", 1024)
    whole_reads = []
    read_mailbox = mailbox_read.read_mailbox
    monkeypatch.setattr(mailbox_read, "read_mailbox", lambda *a, **k: whole_reads.append(a) or read_mailbox(*a, **k))
    assert mailbox_module.require_consumed_prefix(s1, "s1") > 0
    assert whole_reads == []
