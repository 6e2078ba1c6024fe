"""The store root: its STORE marker, its layout, and file modes."""

from __future__ import annotations

import os
import stat

import msgpack
import pytest

from subagents import store

from ._support import ONE_SHOT, make_child, write_file


def test_marker_and_layout(tmp_path):
    """Opening an absent folder creates the marker and the three top-level folders."""
    st = store.Store(tmp_path / "s")
    assert msgpack.unpackb(open(os.path.join(st.root, "STORE"), "rb").read()) == {"format": "subagents-store", "version": 4, "max_record_bytes": 16 * 1024 * 1024}
    assert (store.STORE_FORMAT, store.STORE_VERSION) == ("subagents-store", 4)
    for sub in ("sessions", "owners", os.path.join("index", "children")):
        assert os.path.isdir(os.path.join(st.root, sub))
    again = store.Store(tmp_path / "s", create=False)
    assert again.root == st.root


@pytest.mark.parametrize(
    "marker",
    [msgpack.packb({"format": "other", "version": 4}), msgpack.packb({"format": "subagents-store", "version": 5}),
     msgpack.packb({"format": "subagents-store", "version": 1}), msgpack.packb({"format": "subagents-store", "version": 2}),
     msgpack.packb({"format": "subagents-store", "version": 3}),
     msgpack.packb({"format": "subagents-store", "version": 2, "migrating": 2}),
     msgpack.packb({"format": "subagents-store", "version": 3, "migrating": 3}),
     msgpack.packb({"format": "subagents-store", "version": 4, "migrating": 4}),
     msgpack.packb({"format": "subagents-store", "version": True}), msgpack.packb([1]), b"\xc1garbage"],
)
def test_foreign_marker_is_refused(tmp_path, marker):
    """Another format, another version or garbage in STORE is StoreFormatError; an older version (or
    one whose conversion stopped) is told how to convert it, a newer one is not."""
    store.Store(tmp_path / "s")
    write_file(str(tmp_path / "s" / "STORE"), marker)
    with pytest.raises(store.StoreFormatError) as info:
        store.Store(tmp_path / "s")
    assert info.value.code == "STORE_FORMAT"
    older = marker in (msgpack.packb({"format": "subagents-store", "version": 1}), msgpack.packb({"format": "subagents-store", "version": 2}),
                       msgpack.packb({"format": "subagents-store", "version": 3}),
                       msgpack.packb({"format": "subagents-store", "version": 2, "migrating": 2}),
                       msgpack.packb({"format": "subagents-store", "version": 3, "migrating": 3}),
                       msgpack.packb({"format": "subagents-store", "version": 4, "migrating": 4}))
    assert ("subagents store migrate" in info.value.message) == older, info.value.message


def test_non_empty_folder_without_marker_is_refused(tmp_path):
    """A folder holding other files is never turned into a store."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(store.StoreFormatError):
        store.Store(tmp_path / "s")
    assert sorted(os.listdir(tmp_path / "s")) == ["notes.txt"]
    with pytest.raises(store.StoreFormatError):
        store.Store(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()


def test_a_missing_store_and_a_file_are_named(tmp_path):
    """No marker without create: StoreNotFoundError; a file, or a folder below one: StoreFormatError naming the file (issue #13)."""
    (tmp_path / "empty").mkdir()
    for where in ("empty", "absent"):
        with pytest.raises(store.StoreNotFoundError, match="there is no store at"):
            store.Store(tmp_path / where, create=False)
    (tmp_path / "file").write_text("mine")
    for where in ("file", "file/sub", "file/sub/deeper"):
        with pytest.raises(store.StoreFormatError, match=f"{tmp_path / 'file'} is a file") as info:
            store.Store(tmp_path / where)
        assert info.value.code == "STORE_FORMAT"
    assert (tmp_path / "file").read_text() == "mine"


def test_require_writable_sees_a_read_only_folder(tmp_path):
    """require_writable names the store read-only when this process may not write it (a mode check; root bypasses modes)."""
    st = store.Store(tmp_path / "s")
    st.require_writable()
    if os.geteuid() == 0:
        pytest.skip("root writes through file modes; the CLI tests use a read-only mount instead")
    os.chmod(st.owners_dir, 0o500)
    try:
        with pytest.raises(store.ReadOnlyStoreError, match="is read-only"):
            st.require_writable()
    finally:
        os.chmod(st.owners_dir, 0o700)


def test_unknown_durability_is_refused(tmp_path):
    """Only strict, batched and none exist."""
    with pytest.raises(ValueError):
        store.Store(tmp_path / "s", durability="sometimes")
    assert store.Store(tmp_path / "t").durability.name == "batched"
    assert [store.durability_policy(n).name for n in ("strict", "batched", "none")] == ["strict", "batched", "none"]


def test_files_0600_and_folders_0700(tmp_path, umask_022):
    """Every file the store writes is 0600 and every folder 0700, whatever the umask allows."""
    st = store.Store(tmp_path / "s", durability="strict")
    store.create_session(st, "root1")
    make_child(st, "root1", "kid1", descriptor=ONE_SHOT, events=[("turn/start", {})])
    ids = store.IdGenerator()
    store.accept(st, "kid1", source={"kind": "test"}, content="hi", ids=ids)
    store.request(st, "kid1", "interrupt", {}, ids=ids)
    owner = store.register_owner(st, "owner1", ttl=60)
    store.heartbeat(st, owner)
    store.acquire_lease(st, "kid1", "owner1")
    with store.LogWriter.open(st, "kid1", epoch=1) as writer:
        # a log of CACHE_LAG_BYTES: only a log that long has an identity cache
        writer.append([("assistant/message", {"text": "x" * store.log.CACHE_LAG_BYTES}),
                       ("turn/end", {"stop_reason": "completed"})], commit=True)
    store.reindex(st)
    seen_files = set()
    for folder, dirs, files in os.walk(st.root):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for name in files:
            path = os.path.join(folder, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
            seen_files.add(os.path.relpath(path, st.root))
    assert {"STORE", "sessions/kid1", "sessions/kid1.identity", "sessions/kid1.mailbox", "sessions/kid1.control",
            "owners/owner1", "index/children/root1"} <= seen_files


def test_a_session_has_one_file_and_three_companion_names(tmp_path):
    """``sessions/<id>`` is the session; ``path`` names only its companions (mailbox, control,
    identity) beside it, and refuses the files of format 1 (log, header, lease, .lock)."""
    st = store.Store(tmp_path / "s")
    assert st.session_path("s1") == os.path.join(st.sessions_dir, "s1")
    for name in ("mailbox", "control", "identity"):
        assert st.path("s1", name) == os.path.join(st.sessions_dir, f"s1.{name}")
    for name in ("log", "header", "lease", ".lock", "", "mailbox/x"):
        with pytest.raises(ValueError):
            st.path("s1", name)
    store.create_session(st, "s1")
    assert os.listdir(st.sessions_dir) == ["s1"] and st.exists("s1")  # one inode: no companion until needed


def test_a_folder_of_other_files_is_not_a_store_rather_than_no_store(tmp_path):
    """Issue c: a non-empty folder without a marker exists but is not a store: STORE_FORMAT, naming what it holds."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(store.StoreFormatError) as info:
        store.Store(tmp_path / "mine", create=False)
    assert type(info.value) is store.StoreFormatError and info.value.code == "STORE_FORMAT"
    assert str(info.value) == f"{tmp_path / 'mine'} is not a store: it holds notes.txt and no STORE marker"
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    # a store being created (its folders, no marker yet) is still one that is not there yet
    (tmp_path / "young" / "sessions").mkdir(parents=True)
    with pytest.raises(store.StoreNotFoundError):
        store.Store(tmp_path / "young", create=False)


@pytest.mark.parametrize("content, reason", [
    (b"\xc1garbage", "its 8 bytes are not msgpack (FormatError)"),
    (b"", "it is empty"),
    (b"\x92\x01", "its 2 bytes are not msgpack (Unpack failed: incomplete input)"),
])
def test_a_garbage_marker_says_what_is_wrong(tmp_path, content, reason):
    """Issue c: a marker that does not decode ended its message with an empty reason."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "STORE").write_bytes(content)
    for create in (True, False):
        with pytest.raises(store.StoreFormatError) as info:
            store.Store(tmp_path / "s", create=create)
        assert str(info.value) == f"{tmp_path / 's' / 'STORE'} is unreadable: {reason}"


def test_a_store_path_that_is_a_dangling_link_is_named_as_one(tmp_path) -> None:
    """Found by a probe: ``--store`` naming a link to nothing said its parent folder "is a file, not a folder"."""
    link = tmp_path / "dl"
    os.symlink(tmp_path / "nowhere", link)
    with pytest.raises(store.StoreFormatError) as caught:
        store.Store(str(link))
    assert caught.value.message == f"cannot make a store at {link}: {link} is a symbolic link to {tmp_path / 'nowhere'}, which does not exist"


CEILING = 64 * 1024 * 1024


@pytest.mark.parametrize("limit, why", [
    (-5, "below the minimum of 1024"), (0, "below the minimum of 1024"), (1023, "below the minimum of 1024"),
    (CEILING + 1, f"above the format's ceiling of {CEILING}"), (4096.0, "not an integer"), (True, "not an integer"),
    ("4096", "not an integer"),
])
def test_a_record_limit_out_of_range_says_what_is_wrong_with_it(tmp_path, limit, why):
    """Found by a probe: a marker holding ``max_record_bytes -5`` said "not an integer up to 67108864", as if -5
    were no integer or too large. The marker's limit and the one a creator asks for are checked by one rule
    (1024 to the format's ceiling), and the refusal says which bound the value missed."""
    st = store.Store(tmp_path / "s")
    marker = os.path.join(st.root, "STORE")
    info = msgpack.unpackb(open(marker, "rb").read())
    with open(marker, "wb") as handle:
        handle.write(msgpack.packb({**info, "max_record_bytes": limit}))
    with pytest.raises(store.StoreFormatError) as read:
        store.Store(st.root, create=False)
    assert read.value.message == f"{marker} holds max_record_bytes {limit!r}: {why}"
    with pytest.raises(store.StoreFormatError) as made:
        store.Store(tmp_path / "new", max_record_bytes=limit)
    assert made.value.message == f"max_record_bytes {limit!r}: {why}"
    assert not os.path.exists(tmp_path / "new")
