"""Session headers: refused on write before anything is on disk, reported corrupt on read."""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store.header import HEADER_VERSION

from ..session_bytes import HEADER_AT, SLOTS_AT, file_bytes, header_map as header_on_disk, log_start, patch, write_header, write_header_value
from ._support import write_file


def header_map(**over):
    base = {"version": 1, "id": "s1", "created_at": 12.5, "delegation_depth": 0}
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def test_roundtrip_written_fields(st):
    """create_session writes exactly the header fields it was given, absent ones omitted."""
    store.create_session(st, "p0")
    header = store.create_session(st, "s1", parent_session="p0", origin="subagent", delegation_depth=2,
                                  seed=[{"type": "assistant/message", "data": {}}], cwd="/work", created_at=7.0)
    on_disk = header_on_disk(st, "s1")
    assert on_disk == {"version": 1, "id": "s1", "created_at": 7.0, "parent_session": "p0", "origin": "subagent",
                       "delegation_depth": 2, "seed_length": 1, "cwd": "/work"}
    assert store.read_header(st, "s1") == header
    top = header_on_disk(st, "p0")
    assert set(top) == {"version", "id", "created_at", "delegation_depth"} and top["delegation_depth"] == 0
    assert HEADER_VERSION == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"origin": "fork"},
        {"origin": ""},
        {"delegation_depth": -1},
        {"delegation_depth": True},
        {"delegation_depth": 1.5},
        {"delegation_depth": "1"},
        {"cwd": "relative/path"},
        {"cwd": 5},
        {"parent_session": "../up"},
        {"parent_session": ""},
        {"created_at": -1.0},
        {"created_at": float("nan")},
        {"created_at": float("inf")},
        {"created_at": True},
        {"created_at": "now"},
    ],
)
def test_create_refuses_bad_header_before_writing(st, kwargs):
    """A header that breaks a rule raises InvalidHeaderError and leaves nothing on disk."""
    before = sorted(os.walk(st.root))
    with pytest.raises(store.InvalidHeaderError) as info:
        store.create_session(st, "s1", **kwargs)
    assert info.value.code == "INVALID_HEADER" and isinstance(info.value, ValueError)
    assert sorted(os.walk(st.root)) == before
    assert not os.path.lexists(st.session_path("s1"))
    assert os.listdir(st.children_index_dir) == []


def test_create_refuses_bad_id_and_existing_id(st):
    """A bad id is an id error; an id already on disk is SessionExistsError and keeps the original."""
    with pytest.raises(store.InvalidSessionIdError):
        store.create_session(st, "a/b")
    store.create_session(st, "s1", created_at=1.0)
    with pytest.raises(store.SessionExistsError) as info:
        store.create_session(st, "s1", created_at=2.0)
    assert info.value.session_id == "s1"
    assert store.read_header(st, "s1").created_at == 1.0


@pytest.mark.parametrize(
    "data",
    [
        [1, 2],
        "header",
        header_map(id="other"),
        header_map(origin="fork"),
        header_map(delegation_depth=-3),
        header_map(created_at=...),
        header_map(id=...),
        header_map(extra="field"),
        header_map(seed_length=-1),
        header_map(cwd="rel"),
        header_map(parent_session="../x"),
        header_map(created_at="1"),
        header_map(delegation_depth=False),
    ],
)
def test_bad_header_on_disk_is_corrupt(st, data):
    """A header map that breaks the rules reads as CorruptSessionError, everywhere it is read."""
    store.create_session(st, "s1")
    write_header_value(st, "s1", data)
    for read in (lambda: store.read_header(st, "s1"), lambda: store.inspect(st, "s1"),
                 lambda: store.LogWriter.open(st, "s1", epoch=0)):
        with pytest.raises(store.CorruptSessionError) as info:
            read()
        assert info.value.code == "CORRUPT_SESSION" and info.value.session_id == "s1"


@pytest.mark.parametrize("garbage", [b"", b"\xc1", b"\x92\x01", b"\x81\xa1", b"\x19\xd0\xe4\xc1"])
def test_garbage_header_is_corrupt(st, garbage):
    """Bytes that are not msgpack read as CorruptSessionError, not as a crash: framed with a valid CRC,
    or written over the header's frame in place (its length or CRC then no longer match)."""
    store.create_session(st, "s1")
    write_header(st, "s1", garbage)
    with pytest.raises(store.CorruptSessionError) as info:
        store.read_header(st, "s1")
    assert "header" in info.value.reason
    store.create_session(st, "s2")
    patch(st, "s2", HEADER_AT, garbage + b"\xff" * (8 - len(garbage) % 8))
    with pytest.raises(store.CorruptSessionError) as info:
        store.read_header(st, "s2")
    assert "header" in info.value.reason


def test_a_truncated_preamble_or_header_is_corrupt_and_only_that_session(st):
    """A session file cut inside its preamble, its lease slots or its header reads as CorruptSessionError
    (never an OSError or a short read taken for a header); its sibling reads as before."""
    store.create_session(st, "ok", created_at=1.0)
    store.create_session(st, "s1", created_at=2.0)
    whole, start = file_bytes(st, "s1"), log_start(st, "s1")
    for end in (0, 3, 4, 7, SLOTS_AT + 5, HEADER_AT - 1, HEADER_AT, HEADER_AT + 6, start - 1):
        with open(st.session_path("s1"), "r+b") as handle:
            handle.write(whole)
            handle.truncate(end)
        for read in (lambda: store.read_header(st, "s1"), lambda: store.inspect(st, "s1"),
                     lambda: store.LogWriter.open(st, "s1", epoch=0), lambda: store.acquire_lease(st, "s1", "o1")):
            with pytest.raises(store.CorruptSessionError) as info:
                read()
            assert info.value.session_id == "s1", end
        assert store.read_lease(st, "s1") is None
        assert st.session_ids() == ["ok", "s1"]
        assert store.read_header(st, "ok").created_at == 1.0 and store.inspect(st, "ok").status == "clean"


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_other_header_version_is_unsupported(st, version):
    """A header of another version is UnsupportedFormatError, checked before its other fields."""
    store.create_session(st, "s1")
    write_header_value(st, "s1", {"version": version, "id": "nonsense/id", "whatever": 1})
    with pytest.raises(store.UnsupportedFormatError) as info:
        store.read_header(st, "s1")
    assert info.value.code == "UNSUPPORTED_FORMAT"
    with pytest.raises(store.UnsupportedFormatError):
        store.inspect(st, "s1")


def test_missing_header_is_not_found(st):
    """No session file means no session, even beside a creation's temporary file (a whole session
    file that was never linked to its name) and companion files of that id."""
    store.create_session(st, "model")
    write_file(os.path.join(st.sessions_dir, ".ghost.new.123.0badf00d"), file_bytes(st, "model"))
    for name in ("mailbox", "control", "identity"):
        write_file(st.path("ghost", name), b"")
    with pytest.raises(store.SessionNotFoundError) as info:
        store.read_header(st, "ghost")
    assert isinstance(info.value, LookupError)
    assert not st.exists("ghost") and st.session_ids() == ["model"]


def test_parse_header_accepts_int_created_at():
    """An integer created_at is read as float seconds."""
    header = store.parse_header(header_map(created_at=5))
    assert header.created_at == 5.0 and isinstance(header.created_at, float)
    with pytest.raises(store.InvalidHeaderError):
        store.parse_header(header_map(), expected_id="s2")
