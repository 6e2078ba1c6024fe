"""Temporary files a kill left behind (``store/leftovers.py``): reported by ``fsck``, removed by ``gc``.

Every file the store replaces whole (a children index ``reindex`` rewrites,
``index/roots`` after a gc, an owner record) is written under a temporary
name and renamed over the old one; a store without unnamed files also
creates a session under a temporary name. A process killed between the two
leaves that name for good. Each leftover here is made by a real process
that SIGKILLs itself at that moment (its ``os.replace`` replaced by a kill),
not planted, except the creation's, which this system never makes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from subagents import store
from subagents.store import Store, collect
from subagents.store.fsck import fsck

from ..conftest import REPO_ROOT

DAY = 86400.0

KILLED_AT_RENAME = """
import os, signal, sys
from subagents import store
from subagents.store.lease import register_owner
from subagents.store.reaper import write_hint
from subagents.store.roots import compact_roots

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

os.replace = die
st = store.Store(sys.argv[1], create=False, durability="batched")
what = sys.argv[2]
if what == "reindex":
    store.reindex(st)
elif what == "owner":
    register_owner(st, "ownerKilled", ttl=5.0)
elif what == "hint":
    write_hint(st, "ownerGone", {"rKept"})
elif what == "roots":
    compact_roots(st)
"""


def killed_at_rename(st: Store, what: str) -> str:
    """Run ``what`` in a process killed right before its rename; the temporary name it left."""
    before = set(everything(st))
    done = subprocess.run([sys.executable, "-c", KILLED_AT_RENAME, st.root, what], cwd=REPO_ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT}, capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    [left] = sorted(set(everything(st)) - before)
    return left


def everything(st: Store) -> list[str]:
    return [os.path.join(folder, name) for folder, _, names in os.walk(st.root) for name in names]


def aged(path: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


@pytest.fixture
def st(tmp_path) -> Store:
    st = Store(tmp_path / "store", durability="batched")
    store.create_session(st, "rKept", label="kept")
    store.create_session(st, "rKeptc0", parent_session="rKept", origin="subagent", delegation_depth=1)
    return st


@pytest.mark.parametrize("what, where", [("reindex", "index/children"), ("owner", "owners"), ("hint", "owners"), ("roots", "index")])
def test_a_rewrite_killed_before_its_rename_leaves_a_name_fsck_reports_and_gc_removes(st: Store, what: str, where: str) -> None:
    left = killed_at_rename(st, what)
    assert os.path.dirname(os.path.relpath(left, st.root)) == where and ".tmp." in left
    findings = [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "interrupted-write"]
    assert [f["id"] for f in findings] == [os.path.relpath(left, st.root)], findings
    assert "the next `subagents gc` removes it" in findings[0]["detail"]
    assert store.check_store(st).counts.interrupted_writes == 1
    young = collect(st, 7 * DAY)
    assert young.leftovers_removed == 0 and os.path.exists(left)  # a minute old at least: never a write under way
    aged(left, 120)
    assert collect(st, 7 * DAY, dry_run=True).leftovers_removed == 1 and os.path.exists(left)
    assert collect(st, 7 * DAY).leftovers_removed == 1 and not os.path.exists(left)
    assert [r.id for r in store.list_roots(st)] == ["rKept"] and [c.id for c in store.list_children(st, "rKept")] == ["rKeptc0"]
    assert not [f for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"] if f["kind"] == "interrupted-write"]


def test_a_temporary_whose_writer_still_runs_is_kept_however_old(st: Store) -> None:
    """A writer stopped between its write and its rename (``SIGSTOP``, a debugger) renames on waking:
    its temporary stays while its process runs on this host."""
    left = os.path.join(st.children_index_dir, f"rKept.tmp.{os.getpid()}.7f00")
    with open(left, "wb"):
        pass
    aged(left, DAY)
    assert collect(st, 7 * DAY).leftovers_removed == 0 and os.path.exists(left)


def test_a_creations_temporary_name_is_removed_like_the_others(st: Store) -> None:
    """Where the system has no unnamed files a creation writes ``.<id>.new.<pid>.<hex>`` first;
    a writer killed before naming it leaves it (planted: this system has unnamed files)."""
    dead = dead_pid()
    left = os.path.join(st.sessions_dir, f".rNever.new.{dead}.0badcafe")
    with open(left, "wb") as handle:
        handle.write(b"half a header")
    aged(left, 120)
    assert [f["kind"] for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"]] == ["no-header"]
    assert collect(st, 7 * DAY).leftovers_removed == 1 and not os.path.exists(left)
    assert store.check_store(st).clean


def test_names_of_other_programs_are_never_touched(st: Store) -> None:
    """Only names of the store's own temporaries go: a file of another shape stays, however old."""
    dead = dead_pid()
    names = [os.path.join(st.children_index_dir, "notes.txt"), os.path.join(st.owners_dir, f"x.tmp.{dead}"),
             os.path.join(st.index_dir, f"roots.tmp.{dead}.zz"), os.path.join(st.owners_dir, f"a/b.tmp.{dead}.1")]
    os.makedirs(os.path.join(st.owners_dir, "a"))
    for name in names:
        with open(name, "wb"):
            pass
        aged(name, DAY)
    assert collect(st, 7 * DAY).leftovers_removed == 0
    assert all(os.path.exists(name) for name in names)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(done.stdout)
