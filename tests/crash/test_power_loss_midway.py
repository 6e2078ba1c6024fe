"""A power loss while an operation is under way, not after it returned.

``test_power_loss_rewrites.py`` cuts ``migrate`` at each of its steps; here ``gc`` is cut the same
way (``SUBAGENTS_GC_KILL_AFTER``: the process SIGKILLs itself right after its N-th change), with
other stores made on the same file system after each kill, taking the inodes the killed gc freed,
then one power loss. And the promise of the ``strict`` policy, that every append that returned is
on the disk, commit point or not, beside the narrower one of ``batched``.

The boot's check here is ``e2fsck -y``, not ``-p``: ``atomic.Removal`` holds each removed inode
open until the folder that named it is fsync'd, and a kill inside a removal closes those
descriptors at once. The inode is then free (and taken by the next file made) while the name is
still on the disk; or, never reused, it stays written as in use with no name. Either is an
inconsistency preen mode stops at for an operator ("A power loss before the settle ends may still
leave an inode written as in use with no name (for ``e2fsck -y``)", the ``Removal`` docstring); a
process killed mid-call cannot settle anything, and nothing short of a ``syncfs`` after every
removed name would spare the check its question. What is promised, and asserted, is what the store
reads after the check: its own sessions whole, never a stranger's file as its own, and a next gc
that finishes without touching the strangers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from subagents import store
from subagents.store import Store

from tests.session_bytes import age, files_of
from tests.store._support import REPO_ROOT

from ._power_loss import LoopFs, after_power_loss, problems, run, seen
from .test_gc_crash import DAY, OWNER, family

# reads "<store> <kill after> <strangers' folder>" lines; collects each store in a forked child that
# kills itself after that step, then, in this process, makes a new store of sessions with mail in the
# strangers' folder: files and folders that take the inodes the killed gc freed. Stops at the first
# gc that finished (no step N left).
DRIVER = r"""
import json, os, sys
from subagents import store
from subagents.store.retention import KILL_AFTER_ENV
for line in sys.stdin:
    path, after, strangers = line.split()
    pid = os.fork()
    if pid == 0:
        os.environ[KILL_AFTER_ENV] = after
        try:
            store.collect(store.Store(path, create=False, durability="batched"), 7 * 86400.0)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    other = store.Store(strangers)
    ids = store.IdGenerator()
    for i in range(3):
        store.create_session(other, f"x{i}")
        store.accept(other, f"x{i}", source={"kind": "user"}, content="mine", ids=ids)
    signalled = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    print(json.dumps([path, signalled]), flush=True)
    if signalled is None:
        break
"""
MAX_STEPS = 40


def template(path: Path) -> tuple[list[str], list[str], dict[str, bytes]]:
    """An old settled subtree (a root, two children, a grandchild, each with a mailbox: gc moves
    it after the session's file) and the sessions gc keeps: one held by this process's live
    owner, one young. The old ids, the kept ids, and the kept files' bytes by path in the store."""
    st = Store(path, durability="none")
    store.register_owner(st, OWNER, ttl=3600.0)  # this process: alive for the whole test
    old = family(st, "old")
    held = family(st, "keepHeld", events=[("turn/start", {}), ("turn/end", {"stop_reason": "completed"})])
    store.acquire_lease(st, "keepHeldc1", OWNER, state="idle")
    for sid in old + held:
        age(st, sid, 8 * DAY)
    young = family(st, "keepYoung")
    kept = held + young
    return old, kept, {os.path.relpath(p, path): Path(p).read_bytes() for sid in kept for p in files_of(st, sid)}


def run_killed(jobs: list[tuple[Path, int, Path]]) -> dict[str, int | None]:
    done = subprocess.run([sys.executable, "-c", DRIVER], input="".join(f"{p} {n} {o}\n" for p, n, o in jobs),
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(line) for line in done.stdout.splitlines())


def test_a_power_loss_at_any_step_of_gc_leaves_a_store_the_next_gc_finishes(disk: LoopFs, tmp_path: Path):
    """One copy of the store per step on one file system; each copy's gc killed right after its
    step N, one after the other, a new store of three sessions with mail made after each kill; one
    power loss after the last, then ``e2fsck -y`` (the module's docstring says why not ``-p``).
    Then, in each copy: every session present reads as itself (never a stranger's file under its
    name); a session whose move into the trash was made durable (every kill after gc's fsync of
    ``sessions/`` and ``trash/``: the first kill that finds an old session's index dropped, and
    the one before it) is not listed; the kept sessions are there, byte for byte; the next gc
    finishes, collects the rest of the old subtree and empties the trash; and no file of the
    strangers is deleted.

    What it found: the killed gc's freed inodes (an index and a trash folder, whose names were
    still on the disk) were taken by the strangers' files and folders; after ``e2fsck -y`` a trash
    folder's name named a stranger's ``STORE`` file (its second link) and a children index's
    name a stranger's empty folder, and the next gc failed on them on every run
    (``NotADirectoryError``, ``UnavailableSessionError``). ``e2fsck -y`` also gave a stranger's
    whole ``sessions/`` folder to the stale name of an index (it keeps one name of a folder with
    two, here the store's): that gc now moves aside (``trash/.foreign.*``), never deletes. Which
    copies that hits depends on the inodes the file system hands out, so it is not asserted: the
    strangers' files must only exist somewhere."""
    old, kept, kept_bytes = template(tmp_path / "template")
    jobs = []
    for n in range(1, MAX_STEPS + 1):
        shutil.copytree(tmp_path / "template", disk.mount / f"k{n}" / "store")
        jobs.append((disk.mount / f"k{n}" / "store", n, disk.mount / f"o{n}"))
    run("sync", "-f", str(disk.mount))
    died = run_killed(jobs)
    ran = [(p, n) for p, n, _ in jobs if str(p) in died]
    assert died[str(ran[-1][0])] is None, f"gc makes more than {MAX_STEPS} changes: raise MAX_STEPS"
    assert {died[str(p)] for p, _ in ran[:-1]} == {signal.SIGKILL}
    dropped = [n for p, n in ran if not all(os.path.lexists(p / "index" / "children" / sid) for sid in ("old", "oldc0"))]
    durable_from = dropped[0] - 1  # the fsync of sessions/ and trash/ is the step before the first drop
    wrong: dict[int, object] = {}
    moved: list[int] = []  # strangers whose files e2fsck gave to a name of the killed gc's store
    theirs = everything(disk.mount, "o")
    with after_power_loss(disk, "killed.img", "-y", writable=True) as mount:
        for _, n in ran:
            st = seen(mount, f"k{n}")
            present = st.session_ids()
            listed = [r.id for r in store.list_roots(st)]
            found = {
                "strangers' files": problems(st, present),
                "collected but listed": sorted(set(old) & set(present)) if n >= durable_from else [],
                "roots not present": sorted(set(listed) - set(present)),
                "kept lost": sorted(set(kept) - set(present)),
                "kept changed": sorted(k for k, v in kept_bytes.items() if (mount / f"k{n}" / "store" / k).read_bytes() != v),
            }
            try:
                report = store.collect(Store(st.root, create=False, durability="none"), 7 * DAY)
            except (store.SubagentError, OSError) as exc:  # recorded with the rest: every copy is looked at
                wrong[n] = {**found, "gc failed": repr(exc)}
                continue
            found["after gc"] = {
                "present": sorted(set(st.session_ids()) ^ set(kept)),
                "roots": sorted({r.id for r in store.list_roots(st)} ^ {"keepHeld", "keepYoung"}),
                "trash": sorted(n for n in os.listdir(st.trash_dir) if n not in (".lock", ".reserve") and not n.startswith(".foreign.")),
                "problems": problems(st, kept),
                "skipped": sorted(s.id for s in report.skipped if s.id != "keepHeld"),
            }
            try:
                strangers = Store(str(mount / f"o{n}"), create=False)
            except store.StoreFormatError as exc:  # a folder of it went to the killed gc's store: refused, named
                assert " has no " in exc.message and "/ folder" in exc.message, exc.message
                moved.append(n)
            else:
                if problems(strangers, ["x0", "x1", "x2"]):
                    moved.append(n)
            bad = {k: v for k, v in found.items() if v and (k != "after gc" or any(v.values()))}
            if bad:
                wrong[n] = bad
        lost = set(theirs.values()) - set(everything(mount, "").values())
    assert not wrong, "\n".join(f"kill after {n}: {w}" for n, w in wrong.items())
    assert not lost, f"{len(lost)} of the strangers' files deleted (moved by e2fsck -y: {moved})"
    print(f"strangers whose sessions or index folder e2fsck -y gave to the killed gc's store: {moved}")


def everything(top: Path, prefix: str) -> dict[str, bytes]:
    """The bytes of every file under ``top``'s folders named ``prefix...``, by path."""
    out = {}
    for name in os.listdir(top):
        if name.startswith(prefix) and (top / name).is_dir():
            for folder, _, files in os.walk(top / name):
                for file in files:
                    out[os.path.join(folder, file)] = Path(folder, file).read_bytes()
    return out


# -- what an append that returned promises, commit point or not -------------------------------------


TURN = [("turn/start", {}), ("assistant/message", {"text": "a" * 300}), ("tool/call", {"name": "t", "args": {"n": 1}}),
        ("assistant/message", {"text": "b" * 20000})]  # the last outgrows the log's padding: the file's size changes


def logged(records: list[dict]) -> list[tuple[int, str, object]]:
    return [(r["seq"], r["type"], r["data"]) for r in records]


def test_under_strict_every_append_that_returned_survives_a_power_loss_without_a_commit(disk: LoopFs):
    """``durability="strict"`` fsyncs every append (README, "Key settings"): four appends, none a
    commit point, the writer still open (no close, no commit), then the power is lost. Every
    record reads, as the device holds them and after the boot's ``e2fsck -p``."""
    st = store.Store(str(disk.mount / "store"), durability="strict")
    store.create_session(st, "s")
    run("sync", "-f", str(disk.mount))
    with store.LogWriter.open(st, "s", epoch=0) as writer:
        written = [r for kind, data in TURN for r in writer.append([(kind, data)])]
        for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
            with after_power_loss(disk, name, fsck) as mount:
                found = store.inspect(seen(mount), "s", locked=True)
                assert found.status != "corrupt", name
                assert logged(found.events)[-len(written):] == logged(written), name


def test_under_batched_a_commit_point_keeps_everything_before_it(disk: LoopFs):
    """``batched`` fsyncs at commit points (turn end, acceptance, creation: README, "Key settings"):
    a turn appended in three batches, the last a commit, then two appends without one, and the
    power is lost. What is promised, and asserted: every record up to the commit reads, and the log
    is a prefix of what was written (the uncommitted appends may be there, in part, or not at all;
    a cut one is a torn tail, never damage)."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    store.create_session(st, "s")
    run("sync", "-f", str(disk.mount))
    with store.LogWriter.open(st, "s", epoch=0) as writer:
        committed = [r for kind, data in TURN[:3] for r in writer.append([(kind, data)])]
        committed += writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)
        after = [r for kind, data in TURN for r in writer.append([(kind, data)])]
        for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
            with after_power_loss(disk, name, fsck) as mount:
                found = store.inspect(seen(mount), "s", locked=True)
                assert found.status in ("clean", "torn"), (name, found.status, found.damage)
                events = logged(found.events)
                start = events.index(logged(committed)[0])
                assert events[start:start + len(committed)] == logged(committed), name
                rest = events[start + len(committed):]
                assert rest == logged(after)[:len(rest)], name
