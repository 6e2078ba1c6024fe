"""A store missing a folder its marker promises, or with something else in one's place: ``STORE_FORMAT`` naming it.

Found by a probe that damaged store files (probeG, case 2): ``Supervisor.open`` on a store whose
``sessions/``, ``owners/``, ``index/`` or ``index/children/`` was deleted raised a bare
``FileNotFoundError`` from ``require_writable``, ``subagents ls`` on a store without ``sessions/``
printed "(no sessions)" (its sessions' loss unsaid), a file named ``sessions`` was ``OS_ERROR``
"[Errno 20] Not a directory", and an ``index/`` this user may not enter (``chmod 000``) was a bare
``PermissionError``. Nothing is made again in a missing folder's place: the marker says the store was
complete, and an empty ``sessions/`` would pass a data loss off as an empty store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from subagents import store
from subagents.supervisor import Supervisor

from ..other_user import as_nobody, shared_folder
from ..supervisor.test_cli_mistakes import CLI, DEADLINE_S, FAST, cli, refused
from ._support import CONTINUABLE, make_child

# every folder a store has from its creation, as FORMAT.md §1 lays them out
FOLDERS = ("sessions", "owners", "index", "index/children")


def _store_with_a_child(where: Path) -> store.Store:
    """A store holding a root, its child and one owner record: every folder of the layout holds something."""
    st = store.Store(where)
    store.create_session(st, "root1")
    make_child(st, "root1", "kid1", descriptor=CONTINUABLE)
    store.register_owner(st, "owner1", ttl=60)
    return st


def _open_supervisor(root: str) -> None:
    """Open a supervisor on ``root`` and close it at once (the call a host makes first)."""
    async def main() -> None:
        async with Supervisor.open(store=root):
            pass

    anyio.run(main)


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_missing_folder_is_named_and_not_made_again(tmp_path: Path, folder: str) -> None:
    """Opening, with or without create, and a supervisor's open: ``STORE_FORMAT`` naming the folder; it stays missing."""
    st = _store_with_a_child(tmp_path / "s")
    shutil.rmtree(os.path.join(st.root, folder))
    for open_store in (lambda: store.Store(st.root, create=False), lambda: store.Store(st.root), lambda: _open_supervisor(st.root)):
        with pytest.raises(store.StoreFormatError) as info:
            open_store()
        assert type(info.value) is store.StoreFormatError and info.value.code == "STORE_FORMAT"
        assert f"has no {folder}/ folder" in info.value.message, info.value.message
        assert info.value.fields["path"] == st.root
        assert not os.path.exists(os.path.join(st.root, folder))


def test_a_missing_sessions_folder_is_not_read_as_an_empty_store(tmp_path: Path) -> None:
    """The hint says where the sessions went wrong, not how to make an empty store."""
    st = _store_with_a_child(tmp_path / "s")
    shutil.rmtree(st.sessions_dir)
    with pytest.raises(store.StoreFormatError) as info:
        store.Store(st.root, create=False)
    assert str(info.value) == (
        f"the store at {st.root} has no sessions/ folder (moved or deleted?): its sessions are not there; "
        f"put the folder back (an empty one would hide their loss)"
    )


def test_a_missing_children_index_folder_is_rebuilt_as_its_message_says(tmp_path: Path) -> None:
    """Derived state only: made again as the message says, a reindex lists the child again."""
    st = _store_with_a_child(tmp_path / "s")
    shutil.rmtree(st.children_index_dir)
    with pytest.raises(store.StoreFormatError, match="run `subagents store reindex`"):
        store.Store(st.root, create=False)
    os.mkdir(st.children_index_dir, 0o700)
    again = store.Store(st.root, create=False)
    store.reindex(again, keep_unacknowledged=True)
    assert [e.id for e in store.read_index(again, "root1").entries] == ["kid1"]


@pytest.mark.parametrize("folder", ["sessions", "owners", "index", "index/children"])
def test_a_file_in_a_folder_s_place_is_named(tmp_path: Path, folder: str) -> None:
    """It was ``OS_ERROR`` "[Errno 20] Not a directory" for ``sessions``, a bare ``NotADirectoryError`` in a supervisor."""
    st = _store_with_a_child(tmp_path / "s")
    path = os.path.join(st.root, folder)
    shutil.rmtree(path)
    Path(path).write_text("not a folder")
    for open_store in (lambda: store.Store(st.root, create=False), lambda: _open_supervisor(st.root)):
        with pytest.raises(store.StoreFormatError) as info:
            open_store()
        assert info.value.code == "STORE_FORMAT"
        assert info.value.message == f"the store at {st.root} is damaged: {path} is not a folder"
    assert Path(path).read_text() == "not a folder"


@pytest.mark.parametrize("damage", [*(f"rm {f}" for f in FOLDERS), "file sessions"])
def test_the_cli_says_the_code_on_one_line(tmp_path: Path, damage: str) -> None:
    """``subagents ls`` (a reader) and ``subagents drain`` (a writer): ``error: STORE_FORMAT: ...``, exit 2, no traceback."""
    st = _store_with_a_child(tmp_path / "s")
    how, folder = damage.split()
    shutil.rmtree(os.path.join(st.root, folder))
    if how == "file":
        Path(st.root, folder).write_text("not a folder")
    for verb in (["ls"], ["drain", "root1"]):
        message = refused(cli("--store", st.root, *verb, cwd=tmp_path), "STORE_FORMAT")
        assert os.path.join(st.root, folder) in message or f"no {folder}/ folder" in message, message


def _reachable_by_all(st: store.Store) -> None:
    """Every folder of the store open to every user, every file readable and writable by all."""
    for folder, _, files in os.walk(st.root):
        os.chmod(folder, 0o777)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o666)


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_this_user_may_not_enter_is_a_read_only_store_for_a_supervisor(folder: str) -> None:
    """``chmod 000`` on one folder of a store every user may write: a supervisor's open is ``STORE_READ_ONLY``
    (it writes there from its first step), never a bare ``PermissionError`` (``index/``: the ``statvfs`` of
    ``index/children`` behind it was refused). Run as nobody: root passes every permission bit."""
    with shared_folder() as shared:
        st = _store_with_a_child(Path(shared) / "s")
        _reachable_by_all(st)
        os.chmod(os.path.join(st.root, folder), 0)
        outcome = as_nobody(lambda: _open_supervisor(st.root))
        assert outcome[0] == "error", outcome
        name, code, message = outcome[1]
        assert (name, code) == ("ReadOnlyStoreError", "STORE_READ_ONLY"), outcome
        assert message.startswith(f"the store at {st.root} is read-only ("), message


def test_top_says_the_code_when_the_sessions_folder_goes_while_it_runs(tmp_path: Path) -> None:
    """Found by a probe: ``subagents top`` running while ``sessions/`` was removed ended ``error: OS_ERROR:
    [Errno 2] No such file or directory``, where a verb started after the removal says ``STORE_FORMAT``
    and names the folder. Listing the sessions of a store whose folder has gone now says the same."""
    st = _store_with_a_child(tmp_path / "s")
    top = subprocess.Popen([*CLI, "--store", st.root, "top", "--interval", "0.1"], cwd=tmp_path, env=FAST,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert top.stdout is not None and top.stdout.readline(), "top printed nothing"
        shutil.rmtree(st.sessions_dir)
        _, err = top.communicate(timeout=DEADLINE_S)
    finally:
        top.kill()
        top.wait(10)
    assert top.returncode == 2, err
    assert err.startswith(f"error: STORE_FORMAT: the store at {st.root} has no sessions/ folder (moved or deleted?)"), err
    assert len(err.strip().splitlines()) == 1, err
