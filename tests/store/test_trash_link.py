"""A ``trash/`` that is a symbolic link is refused, never followed: gc deletes what it finds there.

Found by a probe: with ``trash/`` linked to another folder (``/tmp``, say), ``store check`` and
``fsck`` said clean, every supervisor start wrote ``.lock`` and ``.reserve`` into that folder, and
``gc`` deleted its files and folders whose names hold a dot, and renamed the others. The other
layout folders may be links (a folder moved to another disk and linked back), but gc empties
``trash/``, so it must be the store's own folder.
"""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store.fsck import fsck
from subagents.store.reserve import keep_reserve


def _decoy(tmp_path) -> tuple[str, set[str]]:
    decoy = tmp_path / "decoy"
    (decoy / "jobs.0" / "a1").mkdir(parents=True)
    (decoy / "jobs.0" / "a1" / "out").write_text("keep")
    (decoy / "backup.deadbeef").mkdir()
    (decoy / "backup.deadbeef" / "session").write_text("keep")
    (decoy / "notes.txt").write_text("keep")
    return str(decoy), _tree(str(decoy))


def _tree(path: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), path) for d, dirs, files in os.walk(path) for n in dirs + files}


@pytest.fixture
def linked(tmp_path) -> tuple[store.Store, str, set[str]]:
    st = store.Store(tmp_path / "store", durability="batched")
    store.create_session(st, "s1")
    decoy, before = _decoy(tmp_path)
    if os.path.lexists(st.trash_dir):
        for name in os.listdir(st.trash_dir):
            os.remove(os.path.join(st.trash_dir, name))
        os.rmdir(st.trash_dir)
    os.symlink(decoy, st.trash_dir)
    return st, decoy, before


@pytest.mark.parametrize("dry_run", [False, True])
def test_gc_refuses_a_trash_that_is_a_link_and_touches_nothing_behind_it(linked, dry_run: bool) -> None:
    st, decoy, before = linked
    with pytest.raises(store.StoreFormatError) as caught:
        store.collect(st, older_than_s=0, dry_run=dry_run)
    assert f"{st.trash_dir} is a symbolic link" in caught.value.message and "move it away" in caught.value.message
    assert _tree(decoy) == before
    assert store.inspect(st, "s1").status == "clean"


def test_no_reserve_is_made_behind_a_linked_trash(linked) -> None:
    st, decoy, before = linked
    assert keep_reserve(st) is False
    store.Store(st.root)  # a supervisor's start keeps the reserve too
    assert _tree(decoy) == before


def test_check_and_fsck_name_a_linked_trash(linked) -> None:
    st, _decoy_path, _ = linked
    report = store.check_store(st)
    assert [(v.session_id, v.kind) for v in report.violations] == [("trash", "trash-damaged")], str(report)
    assert "symbolic link" in report.violations[0].evidence
    found = fsck(st, repair=True, lease_ttl_s=5.0)
    assert [(f["id"], f["kind"]) for f in found["findings"] if f["kind"] != "clean"] == [("trash", "trash-damaged")]


def test_a_trash_that_is_the_stores_own_folder_is_no_finding(tmp_path) -> None:
    st = store.Store(tmp_path / "store", durability="batched")
    store.create_session(st, "s1")
    keep_reserve(st)
    assert store.check_store(st).clean
    assert store.collect(st, older_than_s=0).sessions >= 0

