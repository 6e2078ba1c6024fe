"""``subagents gc`` through the real CLI in a subprocess (issue 15, retention).

Stores are built with the store's own API (real files, no workers) and aged
by setting their files' modification times back, which is what gc measures
(last activity, not creation). One test has a real Supervisor in another
process hold a subtree while gc runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store import Store, check_store, create_session

from ..conftest import REPO_ROOT
from ..session_bytes import age, files_of
from ..store._support import tree_state, wait_until

DAY = 86400.0
ONE_SHOT = {"version": 1, "mode": "one-shot", "provider": "script"}
ENDED = [("turn/start", {}), ("turn/end", {"stop_reason": "completed"})]
FAILED = [("turn/start", {}), ("turn/end", {"stop_reason": "error", "diagnostic": "RuntimeError: boom"})]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env.update(PYTHONPATH=REPO_ROOT, SUBAGENTS_DURABILITY="none", SUBAGENTS_POOL_SIZE="1", SUBAGENTS_CONTROL_POLL_S="0.02")
    return env


def run_cli(st: Store | str, *args: str) -> subprocess.CompletedProcess[str]:
    where = st.root if isinstance(st, Store) else st
    return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", where, *args],
                          cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=60)


def ok(st: Store | str, *args: str) -> str:
    done = run_cli(st, *args)
    assert done.returncode == 0, f"subagents {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done.stdout






def subtree(st: Store, root: str, *, root_events=(), old: float | None = 8 * DAY) -> list[str]:
    """A root with two one-shot children, aged ``old`` seconds."""
    create_session(st, root, label=f"job-{root}", events=list(root_events))
    ids = [root]
    for i in range(2):
        cid = f"{root}c{i}"
        create_session(st, cid, parent_session=root, origin="subagent", delegation_depth=1,
                       events=[("subagent/descriptor", {**ONE_SHOT, "label": f"part-{i}"}), *ENDED])
        ids.append(cid)
    for sid in ids if old is not None else ():
        age(st, sid, old)
    return ids


def contents(st: Store, session_id: str) -> dict[str, bytes]:
    """The bytes of the session's file and companions (taking its lock writes nothing)."""
    out = {}
    for path in files_of(st, session_id):
        with open(path, "rb") as handle:
            out[path] = handle.read()
    return out


def exists(st: Store, ids: list[str]) -> list[bool]:
    return [os.path.lexists(os.path.join(st.sessions_dir, sid)) for sid in ids]


@pytest.fixture
def st(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", durability="none")


@pytest.mark.parametrize("args, message", [
    (["--older-than", "7x"], "error: INVALID_QUERY: --older-than: '7x' is not an age such as 30s, 15m, 12h, 7d or 2w"),
    (["--older-than=-3d"], "error: INVALID_QUERY: --older-than: '-3d' is not an age such as 30s, 15m, 12h, 7d or 2w"),
    (["--older-than", "7d", "--outcome", "completed,bogus"], "error: INVALID_QUERY: --outcome is one of"),
])
def test_bad_ages_and_outcomes_are_clean_errors(st: Store, args: list[str], message: str) -> None:
    """A bad age or outcome is one `error: CODE: message` line, exit 2, no traceback, nothing touched."""
    subtree(st, "rA")
    before = tree_state(st.root)
    done = run_cli(st, "gc", *args)
    assert done.returncode == 2 and done.stderr.startswith(message) and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "" and tree_state(st.root) == before


NOT_AN_AGE = ["1e3d", "1e999d", "1_000d", "1 d", " 7d", "7d ", "5.h", "\u0663d", "infd", "7", "d", "-3d", "7x"]
LONGER = "9" * 400 + "d"  # digits past any float: was inf, "not an age"


@pytest.mark.parametrize("age", NOT_AN_AGE)
def test_an_age_is_digits_with_an_optional_fraction_and_a_unit(st: Store, age: str) -> None:
    """Found by a probe: ``--older-than`` took ``1e3d``, ``1_000d`` and ``1 d`` (what ``float`` takes) while ``ls --since``
    took none of them; both now read one grammar (``store.parse_age``)."""
    subtree(st, "rA")
    before = tree_state(st.root)
    done = run_cli(st, "gc", f"--older-than={age}")
    assert done.returncode == 2 and done.stderr == f"error: INVALID_QUERY: --older-than: {age!r} is not an age such as 30s, 15m, 12h, 7d or 2w\n", done.stderr
    since = run_cli(st, "ls", f"--since={age}")
    assert since.returncode == 2 and since.stderr.startswith("error: USAGE: argument --since: ") and "is neither a duration" in since.stderr, since.stderr
    assert tree_state(st.root) == before


def test_an_age_written_past_any_float_is_longer_than_1000_years(st: Store) -> None:
    done = run_cli(st, "gc", "--older-than", LONGER, "--dry-run")
    assert done.returncode == 2 and done.stderr.startswith(f"error: INVALID_QUERY: --older-than: {LONGER!r} is longer than 1000 years"), done.stderr
    since = run_cli(st, "ls", "--since", LONGER)
    assert since.returncode == 2 and f"{LONGER!r} is longer than 1000 years" in since.stderr, since.stderr


@pytest.mark.parametrize("age, seconds", [("30s", 30), ("15m", 900), ("90min", 5400), ("12h", 43200), ("7d", 7 * DAY),
                                          ("2w", 14 * DAY), ("0.5h", 1800), (".5h", 1800), ("0s", 0)])
def test_gc_and_ls_take_the_same_ages(st: Store, age: str, seconds: float) -> None:
    """Every documented form, ``min`` (which only ``ls --since`` took) and a fraction with no digit before its point."""
    doc = json.loads(ok(st, "gc", "--older-than", age, "--dry-run", "--json"))
    assert doc["older_than_s"] == seconds
    now = time.time()
    old, fresh = store.new_id(), store.new_id()
    create_session(st, old, created_at=now - seconds - 600)
    create_session(st, fresh, created_at=now)
    listed = [r["id"] for r in json.loads(ok(st, "ls", "--since", age, "--json"))["roots"]]
    assert listed == ([fresh] if seconds else [])


def test_help_documents_the_options_with_an_example(st: Store) -> None:
    text = ok(st, "gc", "--help")
    for needle in ("--older-than AGE", "--outcome O[,O]", "--dry-run", "--json", "example:", "subagents gc --older-than 7d --dry-run"):
        assert needle in text


def test_dry_run_lists_what_would_go_and_deletes_nothing(st: Store) -> None:
    old = subtree(st, "rOld")
    subtree(st, "rNew", old=None)
    before = tree_state(st.root)
    text = ok(st, "gc", "--older-than", "7d", "--dry-run")
    lines = text.splitlines()
    assert any(line.startswith("would delete") and "rOld" in line and "3 sessions" in line for line in lines), text
    assert "rNew" not in text
    assert lines[-1].startswith("would delete 1 subtree, 3 sessions") and "kept 1 active within 7d" in lines[-1]
    assert lines[-1].endswith("nothing was changed (--dry-run)")
    doc = json.loads(ok(st, "gc", "--older-than", "7d", "--dry-run", "--json"))
    assert doc["dry_run"] and [c["id"] for c in doc["collected"]] == ["rOld"] and doc["sessions"] == 3 and doc["young"] == 1
    assert doc["collected"][0]["last_active"].endswith("Z") and doc["cutoff"].endswith("Z")
    assert tree_state(st.root) == before and all(exists(st, old))


def test_old_roots_go_young_stay_outcome_filters_and_listings_stay_clean(st: Store) -> None:
    """--outcome picks by the root's outcome; afterwards ls, tree, summary, top, fsck and check are clean."""
    done = subtree(st, "rDone", root_events=ENDED)
    fail = subtree(st, "rFail", root_events=FAILED)
    plain = subtree(st, "rPlain")
    young = subtree(st, "rYoung", old=None)
    doc = json.loads(ok(st, "gc", "--older-than", "7d", "--outcome", "error", "--outcome", "none", "--json"))
    assert sorted(c["id"] for c in doc["collected"]) == ["rFail", "rPlain"] and doc["other_outcome"] == 1
    assert not any(exists(st, fail + plain)) and all(exists(st, done + young))
    text = ok(st, "gc", "--older-than", "7d")
    assert text.splitlines()[0].split() == ["ROOT", "SESSIONS", "SIZE", "ACTIVE", "OUTCOME", "LABEL", "/", "WHY", "KEPT"]
    assert text.splitlines()[1].split()[:4] == ["deleted", "rDone", "3", "sessions"]
    assert text.splitlines()[-1].startswith("deleted 1 subtree, 3 sessions")
    assert not any(exists(st, done)) and all(exists(st, young))
    assert [r["id"] for r in json.loads(ok(st, "ls", "--json"))["roots"]] == ["rYoung"]
    assert "rYoungc0" in ok(st, "tree", "rYoung")
    assert "2 subagents below 1 top-level session" in ok(st, "summary")
    ok(st, "top", "--once")
    fsck = json.loads(ok(st, "store", "fsck", "--json"))
    assert fsck["corrupt"] == [] and fsck["findings"] == []
    check = json.loads(ok(st, "store", "check", "--json"))
    assert check["clean"], check
    assert sorted(os.listdir(st.trash_dir)) == [".lock", ".reserve"]
    again = ok(st, "gc", "--older-than", "7d")
    assert again.splitlines() == [again.splitlines()[-1]] and again.startswith("deleted 0 subtrees")


def test_undelivered_mail_keeps_the_subtree_and_says_why(st: Store) -> None:
    ids = subtree(st, "rMail")
    store.accept(st, "rMailc1", source={"kind": "user"}, content="later", ids=store.IdGenerator())
    age(st, "rMailc1", 8 * DAY)
    text = ok(st, "gc", "--older-than", "7d")
    kept = [line for line in text.splitlines() if line.startswith("kept")]
    assert len(kept) == 1 and "rMail" in kept[0] and "mail" in kept[0] and "rMailc1 has 1 undelivered message(s)" in kept[0]
    assert all(exists(st, ids))


HOST = textwrap.dedent(
    """
    import json, sys, anyio
    from subagents.supervisor import *

    async def main(store):
        cfg = SupervisorConfig(pool_size=1, durability="none")
        async with Supervisor.open(store=store, config=cfg) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="host")
            first = json.dumps({"script": [{"say": "done"}]})
            child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=first, label="reviewer"))
            print(json.dumps({"root": root.id, "child": child}), flush=True)
            await anyio.sleep(3600)

    anyio.run(main, sys.argv[1])
    """
)


def test_a_subtree_a_supervisor_in_another_process_holds_is_kept(st: Store) -> None:
    """A root a supervisor in another process holds (its lease live, idle) keeps its subtree even when
    old by its files' times (reason `held`), byte for byte; the settled subtree beside it goes."""
    old = subtree(st, "rOld")
    proc = subprocess.Popen([sys.executable, "-c", HOST, st.root], stdout=subprocess.PIPE, text=True, env=_env(), cwd=REPO_ROOT)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, "the host supervisor did not start"
        ids = json.loads(line)
        held = [ids["root"], ids["child"]]
        # the child's turn ends, it settles (lease released) and its notice reaches the root's mailbox;
        # the host keeps holding the root (idle: nothing more is written)
        wait_until(lambda: store.session_status(st, ids["child"]) == "complete" and len(store.read_mailbox(st, ids["root"])) == 1
                   and store.session_status(st, ids["root"]) == "idle", what="the child to settle")
        for sid in held:
            age(st, sid, 8 * DAY)
        before = {sid: contents(st, sid) for sid in held}
        doc = json.loads(ok(st, "gc", "--older-than", "7d", "--json"))
        assert [c["id"] for c in doc["collected"]] == ["rOld"] and not any(exists(st, old))
        (kept,) = doc["skipped"]
        assert (kept["id"], kept["session"], kept["reason"]) == (ids["root"], ids["root"], "held")
        text = ok(st, "gc", "--older-than", "7d")
        assert any(line.split()[:3] == ["kept", ids["root"], "held"] for line in text.splitlines()), text
        assert {sid: contents(st, sid) for sid in held} == before
        assert json.loads(ok(st, "store", "check", "--json"))["clean"]
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def _read_only_mounts(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {probe} {probe} && mount -o remount,ro,bind {probe} && "
                           f"! sh -c 'echo x >> {probe}' 2>/dev/null"], capture_output=True)
    probe.unlink()
    return done.returncode == 0


@pytest.mark.parametrize("where", ["index/roots", "index/children/rOld", "index/children/rOldc0", "index"])
def test_gc_checks_it_can_write_the_indexes_before_it_deletes_anything(st: Store, tmp_path: Path, where: str) -> None:
    """Audit defect 9: with an index gc must update read-only (a read-only bind mount: root writes through
    file modes), gc used to delete the subtree, then fail at its index update with the trash left behind.
    Now nothing moves: with the roots index (or all indexes) read-only gc refuses with STORE_READ_ONLY; with
    one subtree's children index read-only it keeps that subtree (``unwritable``), as any other it may not
    write, and says why."""
    if shutil.which("unshare") is None or not _read_only_mounts(tmp_path):
        pytest.skip("cannot make a read-only bind mount here (needs unshare -m and mount)")
    ids = subtree(st, "rOld")
    create_session(st, "rOldc0g", parent_session="rOldc0", origin="subagent", delegation_depth=2,
                   events=[("subagent/descriptor", dict(ONE_SHOT)), *ENDED])
    age(st, "rOldc0g", 8 * DAY)
    target = os.path.join(st.root, where)
    assert os.path.exists(target)
    before = [tree_state(st.sessions_dir), tree_state(st.index_dir)]
    prefix = ["unshare", "-m", "sh", "-c", f'mount --bind {target} {target} && mount -o remount,ro,bind {target} && exec "$@"', "sh"]
    done = subprocess.run([*prefix, sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root, "gc", "--older-than", "7d"],
                          cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    if where.startswith("index/children/"):
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert "rOld" in done.stdout and "unwritable" in done.stdout and "read-only file system" in done.stdout, done.stdout
    else:
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == f"error: STORE_READ_ONLY: the store at {st.root} is read-only (a read-only file system)"
    assert all(exists(st, ids + ["rOldc0g"]))
    # gc's lock, taken first (and the reserve of a gc that ran to its end): no session was moved
    assert not os.path.exists(st.trash_dir) or set(os.listdir(st.trash_dir)) <= {".lock", ".reserve"}
    assert [tree_state(st.sessions_dir), tree_state(st.index_dir)] == before
    assert [c["id"] for c in json.loads(ok(st, "gc", "--older-than", "7d", "--json"))["collected"]] == ["rOld"]


@pytest.mark.anyio
async def test_supervisor_gc_keeps_its_own_roots(tmp_path: Path) -> None:
    """`Supervisor.gc` is `store.collect` in a thread: the supervisor's own (held) root stays, even
    when old by its files' times; an old settled subtree beside it goes."""
    from ..conftest import open_supervisor

    async with open_supervisor(tmp_path) as sup:
        st = Store(tmp_path / "store", durability="none")
        old = subtree(st, "rOld")
        mine = await sup.open_root(label="mine")
        age(st, mine.id, 8 * DAY)
        report = await sup.gc(7 * DAY)
        assert [c.id for c in report.collected] == ["rOld"] and not any(exists(st, old))
        assert [(s.id, s.reason) for s in report.skipped] == [(mine.id, "held")] and st.exists(mine.id)
        dry = await sup.gc(0.0, dry_run=True)
        assert dry.dry_run and not dry.collected and st.exists(mine.id)


@pytest.mark.anyio
async def test_a_supervisor_start_makes_the_reserve_gc_spends_on_a_full_disk(tmp_path: Path) -> None:
    """The reserve (store/reserve.py) must be there before a disk fills, so every start makes it when
    the disk has room, with gc's lock beside it; a second start finds both. (Spending it on a full
    disk: ``tests/crash/test_disk_full.py``.)"""
    from subagents.store.reserve import RESERVE_BYTES, reserve_path

    from ..conftest import open_supervisor

    async with open_supervisor(tmp_path) as sup:
        assert os.path.getsize(reserve_path(sup.store)) == RESERVE_BYTES
        assert sorted(os.listdir(sup.store.trash_dir)) == [".lock", ".reserve"]
    async with open_supervisor(tmp_path) as sup:
        assert sorted(os.listdir(sup.store.trash_dir)) == [".lock", ".reserve"]
    assert check_store(Store(tmp_path / "store")).clean


def test_gc_and_fsck_name_a_strangers_folder_gc_set_aside(st: Store) -> None:
    """A folder of another program where gc was about to delete (what ``e2fsck -y`` can leave after
    an interrupted gc and a power loss) is moved to ``trash/.foreign.*``: ``gc`` warns of it on every
    run and ``store fsck`` names it, until an operator removes it."""
    subtree(st, "rOld")
    os.makedirs(os.path.join(st.children_index_path("rOldc1"), "photos"))
    first = ok(st, "gc", "--older-than", "7d")
    assert "warning: 1 folder of another program left in trash/.foreign.*" in first, first
    assert json.loads(ok(st, "gc", "--older-than", "7d", "--json"))["set_aside"] == 1
    (name,) = st.set_aside()
    assert os.path.isdir(os.path.join(st.trash_dir, name, "photos"))
    assert f"set-aside       {name}  a folder gc found" in ok(st, "store", "fsck")


def test_gc_says_it_removed_the_temporary_file_of_an_interrupted_write(st: Store) -> None:
    subtree(st, "rOld")
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    left = os.path.join(st.children_index_dir, f"rOld.tmp.{int(done.stdout)}.7f00")  # its writer has exited
    with open(left, "wb"):
        pass
    os.utime(left, (1e9, 1e9))
    assert "interrupted-write" in ok(st, "store", "fsck")
    assert "would remove 1 temporary file of writes a kill interrupted" in ok(st, "gc", "--older-than", "7d", "--dry-run")
    assert "removed 1 temporary file of writes a kill interrupted" in ok(st, "gc", "--older-than", "7d")
    assert not os.path.exists(left)
