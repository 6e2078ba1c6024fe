"""kill -9 of ``subagents gc`` at random moments (issue 15, retention).

One store is built per test: old settled subtrees (a root, two children, a
grandchild), and beside them sessions gc must never touch: a subtree whose
child a live supervisor holds (an owner registered by this test process,
whose pid runs), one with undelivered mail, one with a running child, one
active recently. Each round copies that store (modification times kept),
runs ``subagents gc --older-than 7d`` in a subprocess, waits until it has
begun (its ``trash/`` exists) and SIGKILLs it after a delay drawn from a
seeded ``random.Random`` over the time one uninterrupted gc took. Then:

* ``store check`` is clean and ``fsck`` finds nothing corrupt, no file in
  ``sessions/`` that is no session's, and nothing but ``collecting`` (entries
  of trashed sessions) and the companions of a session whose file was moved
  just before the kill (``stray``);
* every session is whole (its file reads, its log is clean) or gone; a subtree is never
  cut in the middle while its root is gone;
* the kept sessions are byte-identical to before;
* a second gc (``store.collect``) finishes: the trash is empty, every old
  settled subtree is gone, and check, fsck and the listings are clean.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store import Store, check_store, create_session
from subagents.store.fsck import fsck
from subagents.store.root import COMPANIONS
from tests.session_bytes import age, files_of
from tests.store._support import ONE_SHOT, REPO_ROOT, wait_until

DAY = 86400.0
ENDED = [("turn/start", {}), ("turn/end", {"stop_reason": "completed"})]
OWNER = "gcCrashOwner"






def settle(st: Store, session_id: str) -> None:
    """What a supervisor does with a child: take its lease, deliver it a message (its mailbox: a
    companion file gc moves after the session's file), run a turn, release it (the release writes
    the child's `settled` row into its parent's index, which listings read alone)."""
    message = store.accept(st, session_id, source={"kind": "user"}, content="go", ids=store.IdGenerator())
    lease = store.acquire_lease(st, session_id, OWNER)
    with store.LogWriter.open(st, session_id, epoch=lease.epoch) as writer:
        writer.append([("message/accepted", {"message_id": message, "content": "go"}), *ENDED], commit=True)
    store.release_lease(st, session_id, OWNER, lease.epoch)


def family(st: Store, root: str, *, events=()) -> list[str]:
    """A root, two children, a grandchild below the first; the children settled unless ``events`` says otherwise."""
    create_session(st, root, label=root)
    ids = [root]
    for i in range(2):
        cid = f"{root}c{i}"
        create_session(st, cid, parent_session=root, origin="subagent", delegation_depth=1,
                       events=[("subagent/descriptor", dict(ONE_SHOT)), *events])
        ids.append(cid)
    gid = f"{root}c0g"
    create_session(st, gid, parent_session=f"{root}c0", origin="subagent", delegation_depth=2,
                   events=[("subagent/descriptor", dict(ONE_SHOT))])
    for sid in ([ids[1], ids[2]] if not events else []) + [gid]:
        settle(st, sid)
    return ids + [gid]


def build(path: Path, subtrees: int) -> tuple[dict[str, list[str]], list[str]]:
    """The template store: old settled subtrees by root, and the sessions gc must keep."""
    st = Store(path, durability="none")
    store.register_owner(st, OWNER, ttl=3600.0)  # this process: alive for the whole test
    settled = {f"old{i:03d}": family(st, f"old{i:03d}") for i in range(subtrees)}
    held = family(st, "keepHeld", events=[("turn/start", {}), ("turn/end", {"stop_reason": "completed"})])
    store.acquire_lease(st, "keepHeldc1", OWNER, state="idle")
    running = family(st, "keepRun", events=[("turn/start", {})])
    store.acquire_lease(st, "keepRunc0", OWNER, state="running")
    mail = family(st, "keepMail")
    store.accept(st, "keepMail", source={"kind": "user"}, content="later", ids=store.IdGenerator())
    for sid in [s for ids in settled.values() for s in ids] + held + running + mail:
        age(st, sid, 8 * DAY)
    young = family(st, "keepYoung")
    return settled, held + running + mail + young


def contents(st: Store, ids: list[str]) -> dict[str, bytes]:
    """Every file's bytes of ``ids`` (taking a session's lock, an flock on its file, writes nothing)."""
    out: dict[str, bytes] = {}
    for sid in ids:
        for path in files_of(st, sid):
            with open(path, "rb") as handle:
                out[path] = handle.read()
    return out


def gc(st: Store) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env.update(PYTHONPATH=str(REPO_ROOT), SUBAGENTS_DURABILITY="batched")
    return subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root, "gc", "--older-than", "7d", "--json"],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_sound(st: Store, settled: dict[str, list[str]], kept: list[str], kept_bytes: dict[str, bytes], *, finished: bool) -> None:
    report = check_store(st)
    assert report.clean, str(report)
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert found["corrupt"] == [], found["findings"]
    present = set(st.session_ids())
    # killed between moving a session's file and its companions: those are left, unread (fsck: stray)
    orphans = {n for n in os.listdir(st.sessions_dir) if n.partition(".")[2] in COMPANIONS and n.partition(".")[0] not in present}
    kinds = {f["kind"] for f in found["findings"] if not (f["kind"] == "stray" and f["id"] in orphans)}
    assert kinds <= ({"collecting"} if not finished else set()), found["findings"]
    assert not (finished and orphans), orphans
    assert contents(st, kept) == kept_bytes, "a kept session changed"
    leftovers = [n for n in os.listdir(st.sessions_dir) if n.partition(".")[0] not in present and n not in orphans]
    assert not leftovers, f"files in sessions/ that are no session's: {leftovers}"
    for root, ids in settled.items():
        alive = [sid for sid in ids if sid in present]
        for sid in alive:
            assert store.inspect(st, sid).status == "clean"
        if root not in present:
            assert alive == [], f"{root} is gone but {alive} below it remain"  # child-first: never an orphan
        for parent in alive:  # a listing (settled rows included) names only children that exist
            listed = [e.id for e in store.list_children(st, parent)]
            assert set(listed) <= present, f"ls {parent} lists removed {set(listed) - present}"
        if finished:
            assert alive == []
    listed = {r.id for r in store.list_roots(st)}
    assert listed == {r for r in present if st.exists(r) and store.read_header(st, r).parent_session is None}
    if finished:
        assert sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]


def run_rounds(tmp_path: Path, seeds: range, subtrees: int) -> list[str]:
    template = tmp_path / "template"
    settled, kept = build(template, subtrees)
    kept_bytes = contents(Store(template, create=False), kept)
    # one uninterrupted gc (the library, in this process): the window the kills are drawn from
    full = tmp_path / "full"
    shutil.copytree(template, full, symlinks=True)
    st = Store(full, create=False, durability="batched")
    report = store.collect(st, 7 * DAY)
    assert len(report.collected) == subtrees and {s.id for s in report.skipped} == {"keepHeld", "keepRun", "keepMail"}
    window = report.elapsed_s
    assert_sound(st, settled, kept, {k.replace(str(template), str(full)): v for k, v in kept_bytes.items()}, finished=True)
    outcomes = []
    for seed in seeds:
        where = tmp_path / f"round{seed}"
        shutil.copytree(template, where, symlinks=True)
        st = Store(where, create=False)
        expected = {k.replace(str(template), str(where)): v for k, v in kept_bytes.items()}
        delay = random.Random(seed).uniform(0.0, window)
        proc = gc(st)
        try:
            wait_until(lambda: os.path.isdir(st.trash_dir) or proc.poll() is not None, timeout=60, what="gc to begin")
            time.sleep(delay)  # not a synchronisation: the random moment of the kill
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        left = len([n for n in os.listdir(st.trash_dir) if not n.startswith(".")]) if os.path.isdir(st.trash_dir) else 0
        gone = sum(1 for ids in settled.values() for sid in ids if not os.path.lexists(st.session_path(sid)))
        outcomes.append(f"seed {seed}: kill at {delay * 1000:.0f} ms, exit {proc.returncode}, {gone} sessions gone, {left} in trash")
        assert_sound(st, settled, kept, expected, finished=False)
        second = store.collect(Store(where, create=False, durability="batched"), 7 * DAY)
        assert {s.id for s in second.skipped} == {"keepHeld", "keepRun", "keepMail"}
        assert_sound(st, settled, kept, expected, finished=True)
        shutil.rmtree(where)
    return outcomes


def test_gc_killed_at_random_moments_leaves_a_sound_store_and_a_second_gc_finishes(tmp_path: Path) -> None:
    outcomes = run_rounds(tmp_path, range(3), subtrees=20)
    print("\n".join(outcomes))


@pytest.mark.stress
def test_gc_killed_at_random_moments_many_seeds(tmp_path: Path) -> None:
    outcomes = run_rounds(tmp_path, range(100, 130), subtrees=120)
    print("\n".join(outcomes))
