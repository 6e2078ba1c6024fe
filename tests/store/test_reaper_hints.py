"""An owner's lease hint (``owners/<id>.held``) is only a hint: one that cannot be read or removed
costs a scan, never the pass that met it.

A probe put a folder where a hint of a gone owner was: every ``gc`` of the store failed
(``OS_ERROR: Is a directory``) and every supervisor logged a traceback as it reaped.
"""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store.reaper import reap_owners


def test_a_folder_in_place_of_a_stale_hint_is_left_and_the_pass_goes_on(st: store.Store) -> None:
    store.create_session(st, "s1")
    os.makedirs(st.owners_dir, exist_ok=True)
    hint = os.path.join(st.owners_dir, "01M96YKSDQB97X8GP9D6509F65.held")
    os.mkdir(hint)  # its owner's record is gone: a reaper removes the hint, and cannot
    assert reap_owners(st) == []
    assert os.path.isdir(hint)


@pytest.mark.parametrize("where", ["lock-folder", "trash-file"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_trash_or_gc_lock_that_a_hand_edit_replaced_is_a_store_format_error(st: store.Store, where: str, dry_run: bool) -> None:
    """A folder at ``trash/.lock``, or a file at ``trash/``: gc names it (``STORE_FORMAT``), not ``OS_ERROR: Is a directory``."""
    store.create_session(st, "s1")
    if where == "lock-folder":
        os.makedirs(os.path.join(st.trash_dir, ".lock"))
    else:
        with open(st.trash_dir, "w") as handle:
            handle.write("not a folder")
    if where == "lock-folder" and dry_run:
        assert store.collect(st, older_than_s=0, dry_run=True) is not None  # a dry run takes no lock
        return
    with pytest.raises(store.StoreFormatError) as caught:
        store.collect(st, older_than_s=0, dry_run=dry_run)
    assert "is not what gc keeps there" in str(caught.value)
    assert store.inspect(st, "s1").status == "clean"
