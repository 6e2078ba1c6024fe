"""Trust at the edges, through the real ``subagents`` CLI: bad input refused in one line, damage kept to its session.

A black-box audit ran every verb against missing, file, unreadable and empty
store folders; malformed and unknown ids; one session file damaged beside
healthy ones (truncated, garbage, zero-length, a folder, a symbolic link, a
FIFO); and bad option values. Each test here is a case that printed a
traceback, exited 0 on an error, or reported a damaged session as healthy.
Stores are made by the real CLI (``demo --quick``) and damaged in a private
copy; healthy sessions are compared byte for byte after every command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cli import FAST, cli, snapshot
from .test_cli_mistakes import refused


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    """``demo --quick`` once: its store, its root, and its four children (the last one continuable)."""
    cwd = tmp_path_factory.mktemp("edge")
    done = cli("--store", "st", "demo", "--quick", cwd=cwd, env=FAST)
    assert done.returncode == 0, done.stderr
    root = re.search(r"^demo root (\S+):", done.stdout, re.M)
    assert root is not None, done.stdout
    children = sorted(name for name in os.listdir(cwd / "st" / "sessions") if "." not in name and name != root.group(1))
    assert len(children) == 4, children
    return cwd / "st", root.group(1), children


@pytest.fixture
def copy(demo_store: tuple[Path, str, list[str]], tmp_path: Path) -> tuple[Path, str, list[str]]:
    """A private copy of the demo store in ``tmp_path/st``, for tests that write or damage it."""
    path, root, children = demo_store
    shutil.copytree(path, tmp_path / "st", symlinks=True)
    return tmp_path / "st", root, children


def raw_cli(*args: str | bytes, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The CLI with arguments as bytes (what a shell passes when they are not UTF-8)."""
    return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", *args], cwd=cwd, env=FAST, input=stdin,
                          capture_output=True, timeout=90.0)


def text(done: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


# -- text that is not UTF-8 ------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["run --prompt", "run --label", "run --prompt -", "send MESSAGE", "send -"])
def test_text_that_is_not_utf8_is_refused_before_anything_is_written(copy: tuple[Path, str, list[str]], case: str) -> None:
    """Undecodable bytes in a prompt, label or message (argv or stdin) were an INTERNAL traceback from
    msgpack; ``send`` had by then taken the child's lease and written its row, ``run`` left an empty root."""
    path, root, children = copy
    before = snapshot(path)
    bad = b"caf\xe9"
    args: list[str | bytes] = {
        "run --prompt": ["run", "echo", "--prompt", bad],
        "run --label": ["run", "echo", "--prompt", "hi", "--label", bad],
        "run --prompt -": ["run", "echo", "--prompt", "-"],
        "send MESSAGE": ["send", children[-1], bad, "--parent", root],
        "send -": ["send", children[-1], "-", "--parent", root],
    }[case]
    done = text(raw_cli("--store", "st", *args, cwd=path.parent, stdin=bad if "-" in args else b""))
    assert "not valid UTF-8" in refused(done, "USAGE")
    assert snapshot(path) == before



@pytest.mark.parametrize("case", ["run --prompt -", "send -"])
def test_a_message_from_a_closed_stdin_is_refused_before_anything_is_written(copy: tuple[Path, str, list[str]], case: str) -> None:
    """``--prompt -`` or ``send CHILD -`` with stdin closed (``<&-``) was an ``INTERNAL`` traceback: Python has no
    ``sys.stdin`` there, and it was read all the same. There is nothing to read: a ``USAGE`` line, as for a
    stdin that is not UTF-8."""
    path, root, children = copy
    before = snapshot(path)
    args = {"run --prompt -": ["run", "echo", "--prompt", "-"], "send -": ["send", children[-1], "-", "--parent", root]}[case]
    done = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", *args],
                          cwd=path.parent, env=FAST, capture_output=True, text=True, timeout=90.0)
    assert "stdin" in refused(done, "USAGE")
    assert snapshot(path) == before

# -- a session file that is no regular file ------------------------------------------------------


def _replace(path: Path, session_id: str, kind: str) -> None:
    """Put a folder, a dangling symbolic link or a FIFO where ``session_id``'s file was."""
    where = path / "sessions" / session_id
    where.unlink()
    if kind == "folder":
        where.mkdir()
    elif kind == "symlink":
        where.symlink_to("/nonexistent/session")
    else:
        os.mkfifo(where)


@pytest.mark.parametrize("which", ["child", "root"])
@pytest.mark.parametrize("kind", ["folder", "symlink", "fifo"])
def test_store_check_reports_a_session_that_is_no_regular_file(copy: tuple[Path, str, list[str]], kind: str, which: str) -> None:
    """``ls`` lists such a session as a diagnostic, but ``store check`` read only regular files
    (``Store.session_ids``) and called the store clean, exit 0."""
    path, root, children = copy
    bad = children[1] if which == "child" else root
    _replace(path, bad, kind)
    healthy = {k: v for k, v in snapshot(path).items() if not k.startswith(f"sessions/{bad}")}
    done = cli("--store", "st", "store", "check", "--json", cwd=path.parent)
    assert done.returncode == 1, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert [(v["session_id"], v["kind"]) for v in report["violations"]] == [(bad, "unreadable")], report["violations"]
    assert {k: v for k, v in snapshot(path).items() if not k.startswith(f"sessions/{bad}")} == healthy


@pytest.mark.parametrize("kind", ["folder", "symlink", "fifo"])
def test_fsck_says_reindex_keeps_the_entry_of_a_session_that_is_no_regular_file(copy: tuple[Path, str, list[str]], kind: str) -> None:
    """fsck called the child's index entry ``index-stale`` ("harmless; reindex drops it"), but reindex keeps
    it (its header does not read: ``index-unproven``); and a link was counted corrupt but not checked
    ("checked 4 sessions: 4 clean, ..., 1 corrupt")."""
    path, root, children = copy
    bad = children[1]
    _replace(path, bad, kind)
    done = cli("--store", "st", "store", "fsck", "--json", cwd=path.parent)
    report = json.loads(done.stdout)
    assert report["sessions"] == sum(report["counts"].values()), report
    about = {f["kind"] for f in report["findings"] if f["id"] == bad}
    assert "index-unproven" in about and "index-stale" not in about, report["findings"]
    assert cli("--store", "st", "store", "reindex", cwd=path.parent).returncode == 0
    rows = {row["id"]: row for row in json.loads(cli("--store", "st", "ls", root, "--json", cwd=path.parent).stdout)}
    assert set(rows) == {*children} and rows[bad]["kind"] == "diagnostic", rows


@pytest.mark.parametrize("kind", ["folder", "symlink", "fifo"])
def test_gc_names_a_root_that_is_no_regular_file(copy: tuple[Path, str, list[str]], kind: str) -> None:
    """gc read headers of regular files only: a root whose file is a folder, link or FIFO was in no
    row of its report ("would delete 0 subtrees; kept 0"), while a zero-length one is kept as
    unreadable, with why. Its healthy children stay either way."""
    path, root, children = copy
    _replace(path, root, kind)
    healthy = {k: v for k, v in snapshot(path).items() if not k.startswith(f"sessions/{root}") and not k.startswith("trash")}
    for dry in (["--dry-run"], []):
        done = cli("--store", "st", "gc", "--older-than", "0s", *dry, "--json", cwd=path.parent)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert [(s["id"], s["reason"]) for s in report["skipped"]] == [(root, "unreadable")], report
        assert report["collected"] == []
    assert {k: v for k, v in snapshot(path).items() if not k.startswith(f"sessions/{root}") and not k.startswith("trash")} == healthy


# -- option values -------------------------------------------------------------------------------


@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_gc_refuses_an_age_longer_than_any_date(copy: tuple[Path, str, list[str]], dry: list[str]) -> None:
    """``--older-than 99999999999w`` passed parse_age, ran the whole gc, then its report's cutoff (a year
    before 1) did not format: INTERNAL with a traceback, after the pass. Now INVALID_QUERY, before it."""
    path, _, _ = copy
    before = snapshot(path)
    for age in ("99999999999w", "1000000000000000s"):
        message = refused(cli("--store", "st", "gc", "--older-than", age, *dry, cwd=path.parent), "INVALID_QUERY")
        assert message.startswith(f"--older-than: '{age}' is longer than"), message
    assert snapshot(path) == before


# -- a header from no writer ------------------------------------------------------------------------


def test_a_header_created_after_the_year_9999_is_one_damaged_session(copy: tuple[Path, str, list[str]]) -> None:
    """A child's header saying it was created in the year 31690708 (a valid frame and CRC) passed the
    header rules (finite, non-negative), and ``ls --json`` / ``tree --json`` of the whole store ended in an
    INTERNAL traceback formatting it. Now it is header-corrupt: a diagnostic row, the others listed."""
    from subagents.store import Store

    from ..session_bytes import header_map, write_header_value

    path, root, children = copy
    bad = children[1]
    st = Store(path, create=False)
    header = header_map(st, bad)
    assert isinstance(header, dict)
    write_header_value(st, bad, {**header, "created_at": 1e15})
    healthy = {k: v for k, v in snapshot(path).items() if not k.startswith(f"sessions/{bad}")}
    listed = cli("--store", "st", "ls", root, "--json", cwd=path.parent)
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == set(children) and rows[bad]["kind"] == "diagnostic", rows
    tree = cli("--store", "st", "tree", "--json", cwd=path.parent)
    assert tree.returncode == 0, tree.stderr
    assert "created_at" in refused(cli("--store", "st", "show", bad, "--json", cwd=path.parent), "CORRUPT_SESSION")
    done = cli("--store", "st", "store", "check", "--json", cwd=path.parent)
    assert [(v["session_id"], v["kind"]) for v in json.loads(done.stdout)["violations"]] == [(bad, "header-corrupt")]
    assert {k: v for k, v in snapshot(path).items() if not k.startswith(f"sessions/{bad}")} == healthy


def test_log_prints_an_event_whose_time_no_clock_gives(copy: tuple[Path, str, list[str]]) -> None:
    """An event with ``ts`` 1e20 (finite, as the record rules ask) made ``log``'s text an INTERNAL traceback
    (``time.localtime`` overflows); ``--json`` printed it. The text now prints the number as it is."""
    from subagents.store import Store, inspect
    from subagents.store.framing import encode_record

    from ..session_bytes import append_log

    path, root, _ = copy
    st = Store(path, create=False)
    events = inspect(st, root).events
    append_log(st, root, encode_record({**events[-1], "seq": len(events), "ts": 1e20}))
    done = cli("--store", "st", "log", root, cwd=path.parent)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines()[-1].split()[:2] == [str(len(events)), "1e+20"], done.stdout


# -- a damaged root ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_roots(demo_store: tuple[Path, str, list[str]], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The demo store and a second, newer root (``run echo``): its store, the demo root and the new root."""
    path, root, _ = demo_store
    cwd = tmp_path_factory.mktemp("roots")
    shutil.copytree(path, cwd / "st", symlinks=True)
    done = cli("--store", "st", "run", "echo", "--prompt", "hi", cwd=cwd, env=FAST)
    assert done.returncode == 0, done.stderr
    newer = re.search(r"\(root (\S+)\)", done.stdout)
    assert newer is not None, done.stdout
    return cwd / "st", root, newer.group(1)


@pytest.fixture
def roots_copy(two_roots: tuple[Path, str, str], tmp_path: Path) -> tuple[Path, str, str]:
    path, root, newer = two_roots
    shutil.copytree(path, tmp_path / "st", symlinks=True)
    return tmp_path / "st", root, newer


def _named(short: str, *ids: str) -> str:
    """The id among ``ids`` that a table's short id starts."""
    [found] = [i for i in ids if i.startswith(short)]
    return found


ROOT_DAMAGE = ["truncated", "zero-length", "garbage", "header"]


def _damage(path: Path, session_id: str, how: str) -> None:
    """Cut ``session_id``'s file inside its header, empty it, fill it with text, or flip a header byte."""
    from ..session_bytes import HEADER_AT

    where = path / "sessions" / session_id
    if how == "truncated":
        os.truncate(where, HEADER_AT + 8)
    elif how == "zero-length":
        os.truncate(where, 0)
    elif how == "garbage":
        where.write_bytes(b"this is not a session file\n" * 200)
    else:
        raw = bytearray(where.read_bytes())
        raw[HEADER_AT + 11] ^= 0xFF
        where.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ROOT_DAMAGE)
def test_ls_and_tree_show_a_damaged_root_as_a_diagnostic_row(roots_copy: tuple[Path, str, str], how: str) -> None:
    """``ls`` of the top-level sessions showed a damaged root as ``complete`` with outcome ``corrupt``
    (``diagnostic`` beside a status in ``--json``), and ``tree`` as a plain root; a damaged child is a
    ``diagnostic`` row. Now the root's row is that same diagnostic, and the healthy root stays listed."""
    path, root, newer = roots_copy
    _damage(path, root, how)
    listed = cli("--store", "st", "ls", "--json", cwd=path.parent)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["roots"]
    assert [r["id"] for r in rows] == [newer, root], rows
    assert {k: v for k, v in rows[1].items() if k != "created_at"} == {"id": root, "reason": "corrupt", "kind": "diagnostic"}, rows
    assert (rows[0]["kind"], rows[0]["status"], rows[0]["label"]) == ("root", "complete", "run"), rows
    text = cli("--store", "st", "ls", cwd=path.parent)
    assert text.returncode == 0, text.stderr
    cells = {_named(line.split()[0], root, newer): line.split()[1:] for line in text.stdout.splitlines()[1:]}
    assert cells[root] == ["diagnostic", "corrupt"], text.stdout
    assert cells[newer][0] == "complete", text.stdout

    tree = cli("--store", "st", "tree", "--json", cwd=path.parent)
    assert tree.returncode == 0, tree.stderr
    forest = {t["root"]: t for t in json.loads(tree.stdout)["rows"]}
    assert (forest[root]["kind"], forest[root]["reason"]) == ("diagnostic", "corrupt"), forest[root]
    assert len(forest[root]["descendants"]) == 4 and "kind" not in forest[newer], forest
    drawn = cli("--store", "st", "tree", cwd=path.parent)
    assert drawn.returncode == 0, drawn.stderr
    heads = {_named(line.split()[0], root, newer): line for line in drawn.stdout.splitlines() if "(root)" in line}
    assert heads[root].endswith(" (root) [diagnostic: corrupt]") and "diagnostic" not in heads[newer], drawn.stdout


@pytest.mark.parametrize("how", ["zero-length", "header"])
def test_summary_counts_a_damaged_root(roots_copy: tuple[Path, str, str], how: str) -> None:
    """``summary`` counted damaged subagents but said nothing of a damaged top-level session: a store whose
    root no longer reads summed up as healthy. It counts it now, by reason, as it counts a damaged child."""
    path, root, newer = roots_copy
    _damage(path, root, how)
    done = cli("--store", "st", "summary", "--json", cwd=path.parent)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["roots"], doc["subagents"], doc["diagnostics"], doc["root_diagnostics"]) == (2, 5, {}, {"corrupt": 1}), doc
    text = cli("--store", "st", "summary", cwd=path.parent)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^damaged\s+top-level: 1 corrupt$", text.stdout, re.M), text.stdout
    healthy = json.loads(cli("--store", "st", "summary", newer, "--json", cwd=path.parent).stdout)
    assert healthy["root_diagnostics"] == {}, healthy


# -- a store path that is a file --------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["store", "migrate"], ["store", "check"], ["ls"]])
def test_store_migrate_says_a_file_is_no_store_folder_as_every_verb_does(tmp_path: Path, verb: list[str]) -> None:
    """``store migrate`` at a regular file said ``STORE_NOT_FOUND: there is no store at ...`` while every other
    verb says ``STORE_FORMAT: ... is a file, not a store folder``; the file is left as it was."""
    (tmp_path / "st").write_bytes(b"notes\n")
    message = refused(cli("--store", "st", *verb, cwd=tmp_path), "STORE_FORMAT")
    assert message == f"{tmp_path / 'st'} is a file, not a store folder", message
    assert (tmp_path / "st").read_bytes() == b"notes\n"


# -- store check and the clock ----------------------------------------------------------------------


def test_store_check_reports_an_unbacked_index_entry_dated_in_the_future(copy: tuple[Path, str, list[str]]) -> None:
    """A children-index entry with no session file and a ``created_at`` an hour ahead was "a creation in
    flight" (its age, negative, is below ``in_flight_s``) on every run, forever: ``store check`` said clean.
    A creation is in flight only for a bounded time after it: such an entry is the stale entry it is."""
    import time

    from subagents.store import Store, add_child, check_store, new_id

    path, root, _ = copy
    ghost = new_id()
    add_child(Store(path, create=False), root, ghost, created_at=time.time() + 3600.0, origin="subagent")
    for _ in range(2):
        done = cli("--store", "st", "store", "check", "--json", cwd=path.parent)
        assert done.returncode == 1, (done.stdout, done.stderr)
        report = json.loads(done.stdout)
        assert [(v["session_id"], v["kind"]) for v in report["violations"]] == [(ghost, "index-stale")], report
        assert report["counts"]["in_flight"] == 0, report
    # within the allowance for clocks that disagree (as long as a creation may be in flight), it still is in flight
    near = check_store(Store(path, create=False), in_flight_s=7200.0)
    assert near.clean and near.counts.in_flight == 1, str(near)


def test_store_check_reports_a_root_missing_from_the_index_dated_in_the_future(copy: tuple[Path, str, list[str]]) -> None:
    """The same for a top-level header dated an hour ahead that ``index/roots`` does not list: counted in
    flight on every run, where it is a root the listings miss (``index-missing``)."""
    import time

    from subagents.store import Store, create_session, new_id
    from subagents.store.roots import remove_root

    path, _, _ = copy
    st = Store(path, create=False)
    ahead = new_id()
    create_session(st, ahead, created_at=time.time() + 3600.0)
    remove_root(st, ahead)
    done = cli("--store", "st", "store", "check", "--json", cwd=path.parent)
    assert done.returncode == 1, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert [(v["session_id"], v["kind"]) for v in report["violations"]] == [(ahead, "index-missing")], report
