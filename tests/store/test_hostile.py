"""Hostile input the store must refuse or see through (issue #14).

* records above the store's size limit are refused before anything is written;
* a fenced writer never rewrites the identity cache;
* a frame embedded in a torn record's bytes never makes the tail read as corrupt;
* links planted in the store are never followed.
"""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store.framing import FRAME, encode_record
from subagents.store.projection import read_cache
from subagents.store.session_file import SessionFile

from .. import session_bytes as raw
from ._support import ONE_SHOT, make_child, read_file, tree_state

LIMIT = 64 * 1024


@pytest.fixture
def small(tmp_path) -> store.Store:
    """A store whose writers accept records up to 64 KiB."""
    return store.Store(tmp_path / "store", max_record_bytes=LIMIT)


# -- the record size limit ------------------------------------------------------------------


def test_the_limit_lives_in_the_marker_and_every_handle_reads_it(small, tmp_path):
    assert small.max_record_bytes == LIMIT
    again = store.Store(tmp_path / "store", max_record_bytes=2 * LIMIT)  # an existing store keeps its limit
    assert again.max_record_bytes == LIMIT
    assert store.Store(tmp_path / "other").max_record_bytes == 16 * 1024 * 1024
    with pytest.raises(store.StoreFormatError):
        store.Store(tmp_path / "big", max_record_bytes=store.MAX_RECORD_BYTES + 1)


def test_an_oversize_message_is_refused_before_anything_is_written(small):
    """Issue #14 defect 4: an acknowledged message the readers could not read took the mailbox with it."""
    store.create_session(small, "s1")
    ids = store.IdGenerator()
    first = store.accept(small, "s1", source={"kind": "user"}, content="before", ids=ids)
    before = tree_state(small.root)
    with pytest.raises(store.RecordTooLargeError) as info:
        store.accept(small, "s1", source={"kind": "user"}, content="x" * LIMIT, ids=ids)
    assert info.value.code == "MESSAGE_TOO_LARGE" and str(LIMIT) in info.value.message
    assert tree_state(small.root) == before
    last = store.accept(small, "s1", source={"kind": "user"}, content="y" * (LIMIT - 200), ids=ids)  # just under
    assert [m.id for m in store.read_mailbox(small, "s1")] == [first, last]


def test_an_oversize_event_is_refused_before_anything_is_written(small):
    store.create_session(small, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(small, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})], commit=True)
        before = raw.file_bytes(small, "s1")
        with pytest.raises(store.RecordTooLargeError) as info:
            writer.append([("assistant/message", {"text": "ok"}), ("tool/result", {"text": "z" * LIMIT})])
        assert info.value.code == "RECORD_TOO_LARGE" and "tool/result" in info.value.message
        assert raw.file_bytes(small, "s1") == before
        writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)  # the writer is not broken
    assert store.inspect(small, "s1").status == "clean"


def test_an_oversize_event_names_its_type_in_a_field_and_its_message_is_unchanged(small):
    """A program tells which record was refused by the error's ``event`` field (the ``llm`` program answers a
    refused ``tool/call`` and lets the model go on), never by the words of its message; a record that is no
    event (a control request) has none."""
    store.create_session(small, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(small, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})], commit=True)
        with pytest.raises(store.RecordTooLargeError) as info:
            writer.append([("tool/call", {"call_id": "c1", "name": "n", "args": {"a": "z" * LIMIT}})])
    assert (info.value.code, info.value.fields["event"]) == ("RECORD_TOO_LARGE", "tool/call")
    assert info.value.message == (f'a "tool/call" event of {info.value.fields["size"]} bytes exceeds the store\'s record size '
                                  f"limit of {LIMIT} bytes (max_record_bytes)")
    with pytest.raises(store.RecordTooLargeError) as info:
        make_child(small, "s1", "c1", events=[("assistant/message", {"text": "w" * LIMIT})])
    assert info.value.fields["event"] == "assistant/message"
    with pytest.raises(store.RecordTooLargeError) as info:
        store.request(small, "s1", "interrupt", {"why": "v" * LIMIT}, ids=store.IdGenerator())
    assert info.value.fields.get("event") is None


def test_an_oversize_creation_or_control_request_leaves_no_trace(small):
    store.create_session(small, "p")
    before = tree_state(small.root)
    with pytest.raises(store.RecordTooLargeError):
        make_child(small, "p", "c1", events=[("assistant/message", {"text": "w" * LIMIT})])
    with pytest.raises(store.RecordTooLargeError):
        store.request(small, "p", "interrupt", {"why": "v" * LIMIT}, ids=store.IdGenerator())
    assert tree_state(small.root) == before


def test_a_record_at_the_format_ceiling_is_readable(tmp_path):
    """Whatever a writer accepts, every reader reads: the store's limit is never above the readers' ceiling."""
    st = store.Store(tmp_path / "store", max_record_bytes=store.MAX_RECORD_BYTES)
    store.create_session(st, "s1")
    big = "m" * (store.MAX_RECORD_BYTES - 1024)
    ids = store.IdGenerator()
    first = store.accept(st, "s1", source={"kind": "user"}, content=big, ids=ids)
    second = store.accept(st, "s1", source={"kind": "user"}, content="after", ids=ids)
    assert [m.id for m in store.read_mailbox(st, "s1")] == [first, second]
    with pytest.raises(store.RecordTooLargeError):
        store.accept(st, "s1", source={"kind": "user"}, content=big + "m" * 2048, ids=ids)


# -- a fenced writer and the identity cache -----------------------------------------------------


def test_a_fenced_writer_never_rewrites_the_identity_cache(st):
    """Issue #14 defect 6: frozen between its write and its commit, then taken over, then continued.
    (A log of CACHE_LAG_BYTES: a shorter one has no identity cache to rewrite.)"""
    padding = ("notice/received", {"padding": "x" * store.log.CACHE_LAG_BYTES})
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT), padding])
    store.register_owner(st, "o1", ttl=60)
    store.register_owner(st, "o2", ttl=60)
    first = store.acquire_lease(st, "s1", "o1")
    old = store.LogWriter.open(st, "s1", epoch=first.epoch)
    try:
        old.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})])  # written, not committed: frozen here
        store.remove_owner(st, "o1")  # its heartbeat is gone: a takeover is allowed
        second = store.acquire_lease(st, "s1", "o2")
        with store.LogWriter.open(st, "s1", epoch=second.epoch) as new:
            for _ in range(3):
                new.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
        cache = read_file(st.path("s1", "identity"))
        assert read_cache(st.path("s1", "identity")).turns == 4
        with pytest.raises(store.FencedError):
            old.commit()  # continued after the takeover
        assert read_file(st.path("s1", "identity")) == cache
    finally:
        old.close()
    assert store.list_children  # the catalog reads the new owner's cache
    assert read_cache(st.path("s1", "identity")).turns == store.read_projection(st, "s1").turns == 4


# -- torn tails and frames inside them --------------------------------------------------------


@pytest.mark.parametrize("zeros", [0, 4096], ids=["at-the-end", "in-the-padding"])
@pytest.mark.parametrize("claimed", ["same-seq", "next-seq"])
def test_a_turn_end_inside_a_cut_record_never_reads_corrupt_at_any_offset(st, claimed, zeros):
    """Issue #14 defect 7 (LevelDB style, every offset): the last record carries, as binary tool data,
    the bytes of a valid turn/end frame; cutting it anywhere is a torn tail, and resume truncates it.
    The same with zeros after the cut (a write torn inside the log's padding, FORMAT.md §3.4)."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"}), ("turn/start", {})], commit=True)
        seq = writer.next_seq + (0 if claimed == "same-seq" else 1)
        inner = encode_record({"seq": seq, "ts": 1.0, "type": "turn/end", "data": {"stop_reason": "completed"}, "epoch": 0})
        writer.append([("tool/result", {"call_id": "c", "blob": b"\x00" * 7 + inner + b"\x01" * 5})])
    full = raw.log_data(st, "s1")
    good = store.inspect(st, "s1")
    last_at = good.offsets[-1]
    assert full.find(inner) > last_at
    for cut in range(1, len(full) - last_at):
        raw.write_log(st, "s1", full[: last_at + cut] + bytes(zeros))
        os.unlink(st.path("s1", "identity")) if os.path.exists(st.path("s1", "identity")) else None
        found = store.inspect(st, "s1")
        if zeros and not any(full[last_at + cut:]):  # what the cut lost was zeros (its epoch 0): the padding gives them back
            assert (found.status, found.events) == ("clean", good.events), cut
            continue
        assert (found.status, found.end) == ("torn", last_at), cut
        with store.LogWriter.open(st, "s1", epoch=0) as writer:
            assert [r["type"] for r in writer.repaired] == ["turn/end"]  # the open turn closed as interrupted
        assert raw.log_bytes(st, "s1")[:last_at] == full[:last_at]


def test_real_corruption_before_a_chained_turn_end_still_reads_corrupt(st):
    """The chain rule keeps the promise it guards: committed work after damage is never dropped."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x"}), ("turn/end", {"stop_reason": "completed"})],
                      commit=True)
    full = bytearray(raw.log_bytes(st, "s1"))
    offsets = store.inspect(st, "s1").offsets
    full[offsets[2] + FRAME.size + 2] ^= 0xFF  # the assistant message; the turn/end after it is the last record
    raw.write_log(st, "s1", bytes(full))
    assert store.inspect(st, "s1").status == "corrupt"


# -- links in the store -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["session", "mailbox", "control", "identity"])
def test_a_link_planted_in_a_session_is_never_written_through(st, tmp_path, name):
    """Issue #14 defect 8: every store file is opened with O_NOFOLLOW: the session's file (its log,
    lease, header and lock) and each companion file."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    path = st.session_path("s1") if name == "session" else st.path("s1", name)
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(outside, path)
    ids = store.IdGenerator()
    attempts = [
        lambda: store.accept(st, "s1", source={"kind": "user"}, content="hi", ids=ids),
        lambda: store.request(st, "s1", "interrupt", {}, ids=ids),
        lambda: store.LogWriter.open(st, "s1", epoch=0).close(),
        lambda: store.inspect(st, "s1"),
        lambda: store.read_mailbox(st, "s1"),
        lambda: store.list_children(st, "s1"),
        lambda: store.read_projection(st, "s1"),
    ]
    for attempt in attempts:
        try:
            attempt()
        except store.SubagentError:
            pass
        except OSError as exc:  # a raw ELOOP is acceptable only where nothing maps it (never through)
            assert exc.errno == 40, exc
    assert outside.read_bytes() == b"precious"
    assert os.path.islink(path)


def test_a_session_file_that_is_a_link_is_refused(st, tmp_path):
    """A link in place of a session's file, to a whole valid session file elsewhere, is never followed:
    the session is unavailable (read, accept, resume, lease), listed as a diagnostic, and the file
    behind the link keeps every byte."""
    store.create_session(st, "r")
    make_child(st, "r", "c1")
    make_child(st, "r", "c2")
    elsewhere = tmp_path / "elsewhere"
    os.rename(st.session_path("c2"), elsewhere)
    os.symlink(elsewhere, st.session_path("c2"))
    before = read_file(elsewhere)
    with pytest.raises(store.UnavailableSessionError):
        store.inspect(st, "c2")
    with pytest.raises(store.UnavailableSessionError):
        store.accept(st, "c2", source={"kind": "user"}, content="hi", ids=store.IdGenerator())
    with pytest.raises(store.UnavailableSessionError):
        store.LogWriter.open(st, "c2", epoch=0)
    with pytest.raises(store.UnavailableSessionError):
        store.acquire_lease(st, "c2", "o1")
    with pytest.raises(store.UnavailableSessionError):
        store.read_header(st, "c2")
    assert store.read_lease(st, "c2") is None
    rows = store.list_children(st, "r")
    assert [(r.id, r.kind) for r in rows] == [("c1", "child"), ("c2", "diagnostic")] and rows[1].reason == "unavailable"
    assert "c2" not in st.session_ids()
    assert read_file(elsewhere) == before
    with SessionFile.open("c2", str(elsewhere)) as file:  # what the link points at is a whole session
        assert file.header_map["id"] == "c2"


def test_a_fifo_in_place_of_a_store_file_never_blocks(st):
    """A FIFO opens without a writer only non-blocking: readers and the resume path refuse it at once."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    for path in (st.path("s1", "mailbox"), st.session_path("s1")):
        os.unlink(path) if os.path.lexists(path) else None
        os.mkfifo(path, 0o600)
    with pytest.raises(store.UnavailableSessionError):
        store.inspect(st, "s1")
    with pytest.raises(store.UnavailableSessionError):
        store.read_mailbox(st, "s1")
    with pytest.raises(store.UnavailableSessionError):
        store.LogWriter.open(st, "s1", epoch=0)
    assert [r.kind for r in store.list_children(st, "s1")] == []


@pytest.mark.parametrize("how", ["fifo", "folder", "loop"])
def test_an_append_to_a_file_that_is_not_one_is_unavailable(st, how):
    store.create_session(st, "s1")
    path = st.path("s1", "mailbox")
    {"fifo": lambda: os.mkfifo(path, 0o600), "folder": lambda: os.mkdir(path), "loop": lambda: os.symlink("mailbox", path)}[how]()
    with pytest.raises(store.UnavailableSessionError):
        store.accept(st, "s1", source={"kind": "user"}, content="hi", ids=store.IdGenerator())
