"""A session's file extended with zeros behind the store's back is read for its data, not its size.

``truncate``, ``fallocate`` or a file system's recovery can leave a session's
file far longer than its log, the rest zeros (holes or written out). Zeros
after the last record are the log's padding to every reader (FORMAT.md
§3.4), so nothing is lost, but each reader used to read them all into memory:
``inspect`` (``subagents show``, ``log``), the projection every resume and
acceptance check folds, a writer reopening the log, and every poll of
``log --follow``. They stop now where a record that starts before the last
non-zero byte could still reach (a frame of the store's record limit), and
find the same events; a writer goes on appending over the zeros.
"""

from __future__ import annotations

import os

from subagents import store
from subagents.store import atomic, session_file

from ._support import PreadCounter

LIMIT = 64 << 10  # the store's record limit: what a reader may read past the data's end
EXTENDED = 64 << 20


def make(tmp_path) -> tuple[store.Store, store.Inspection]:
    st = store.Store(tmp_path / "store", durability="none", max_record_bytes=LIMIT)
    store.create_session(st, "s1")
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x" * 3000}), ("turn/end", {"stop_reason": "completed"})])
        writer.append([("turn/start", {}), ("assistant/message", {"text": "\0" * 20000})])  # a last record ending in zeros
        writer.commit()
    return st, store.inspect(st, "s1")


def counted(monkeypatch) -> list[int]:
    """The lengths of every ``pread`` the session file and the whole-file readers make from now on."""
    lengths: list[int] = []
    monkeypatch.setattr(session_file, "os", PreadCounter(lengths))
    monkeypatch.setattr(atomic, "os", PreadCounter(lengths))
    return lengths


def bounded(lengths: list[int], data: int) -> None:
    """At most the data and one record's reach past it, per read: never the file's zeros."""
    assert sum(lengths) <= 2 * (data + 2 * LIMIT + (64 << 10)), f"read {sum(lengths)} bytes of a {EXTENDED >> 20} MiB file"


def test_inspect_and_the_projection_read_the_data_not_the_zeros(tmp_path, monkeypatch):
    st, before = make(tmp_path)
    events = before.events
    projection = store.read_projection(st, "s1")
    data = os.path.getsize(st.session_path("s1"))
    os.truncate(st.session_path("s1"), EXTENDED)
    lengths = counted(monkeypatch)

    found = store.inspect(st, "s1")
    assert (found.events, found.end, found.status) == (events, before.end, before.status)
    bounded(lengths, data)
    assert found.size > EXTENDED - data  # the log's size is still the file's
    lengths.clear()
    assert store.read_projection(st, "s1").end_offset == projection.end_offset
    bounded(lengths, data)


def test_a_writer_reopens_and_appends_over_the_zeros(tmp_path, monkeypatch):
    st, before = make(tmp_path)
    events = before.events
    data = os.path.getsize(st.session_path("s1"))
    os.truncate(st.session_path("s1"), EXTENDED)
    lengths = counted(monkeypatch)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:  # repairs: closes the open turn
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})])
        writer.commit()
    bounded(lengths, data)
    monkeypatch.undo()
    after = store.inspect(st, "s1")
    assert after.events[: len(events)] == events and after.status == "clean"
    added = [e["type"] for e in after.events[len(events):]]
    assert added[-3:] == ["turn/end", "turn/start", "turn/end"]  # the repair's closer, then the new turn
    assert os.path.getsize(st.session_path("s1")) == EXTENDED


def test_follow_polls_read_the_new_bytes_not_the_zeros(tmp_path, monkeypatch):
    st, before = make(tmp_path)
    data = os.path.getsize(st.session_path("s1"))
    tail = store.LogTail(st, "s1", before)
    os.truncate(st.session_path("s1"), EXTENDED)
    lengths = counted(monkeypatch)
    for _ in range(3):
        assert tail.poll() == []
    bounded(lengths, data)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:  # over the zeros: the next poll finds it
        writer.append([("turn/start", {}), ("assistant/message", {"text": "y" * 30000})])
    lengths.clear()
    assert [e["type"] for e in tail.poll()][-2:] == ["turn/start", "assistant/message"]
    bounded(lengths, data + 40000)


def test_a_header_longer_than_the_first_read_is_read_alone_not_with_the_log(tmp_path, monkeypatch):
    """Opening a session reads its first 4 KiB; a header that does not fit (a deep ``cwd``) was then
    read with the whole file behind it, log and zeros, at every open. The preamble says where the
    header ends: that much is read."""
    st = store.Store(tmp_path / "store", durability="none", max_record_bytes=LIMIT)
    cwd = "/" + "/".join(["d" * 200] * 30)  # 6 KiB
    store.create_session(st, "s1", cwd=cwd)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        for _ in range(40):
            writer.append([("assistant/message", {"text": "x" * 50000})])
    os.truncate(st.session_path("s1"), EXTENDED)
    lengths = counted(monkeypatch)
    assert store.read_header(st, "s1").cwd == cwd
    assert sum(lengths) <= 4096 + 8192, f"read {sum(lengths)} bytes to open a session"
