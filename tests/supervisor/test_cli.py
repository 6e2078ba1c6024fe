"""The ``subagents`` CLI, run as a real subprocess against real stores in ``tmp_path``.

One ``demo --quick`` store is built per module (per xdist worker) and only
read by the listing tests; tests that damage or rewrite a store work on a
copy. Every subprocess has a deadline; a hang fails with its output.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store import LogWriter, Store, create_session, inspect, list_children, list_descendants, read_lease, resolve_id, short_ids
from subagents.supervisor.cli import columns, render
from subagents.supervisor.config_loader import load_config
from subagents.store.framing import data_end
from tests.session_bytes import HEADER_AT, append_log, log_bytes, log_data, patch, write_log

DEADLINE_S = 90.0
ROW = re.compile(r"^(\S+)\s+complete\s+completed\s+one-shot\s+.+\s+part-(\d)$")  # a row of the `ls` table
CHILD = re.compile(r"^(\S+) \[complete, completed\] — (part-\d|reviewer)$")  # a line of `tree`
LS_HEADER = ["ID", "STATUS", "OUTCOME", "MODE", "CREATED", "LABEL", "ERROR"]


def iso_times(row: dict) -> dict:
    """A listing row as `--json` prints it: times in ISO 8601."""
    return {k: (columns.iso(v) if k in ("created_at", "active_since") and v is not None else v) for k, v in row.items()}


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any SUBAGENTS_* of the outer shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env.update(extra)
    return env


# runs that start workers skip fsync: the format is the same, and a busy disk must not slow the suite
FAST = _env(SUBAGENTS_DURABILITY="none")


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "subagents.supervisor.cli", *args], cwd=cwd, env=env or _env(), input=stdin,
            capture_output=True, text=True, timeout=DEADLINE_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"subagents {' '.join(args)} hung; stdout={exc.stdout!r} stderr={exc.stderr!r}")


def ok(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = cli(*args, cwd=cwd, env=env)
    assert done.returncode == 0, f"subagents {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done.stdout


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@dataclasses.dataclass(frozen=True)
class DemoStore:
    cwd: Path
    path: Path
    root: str
    children: list[str]
    stdout: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoStore:
    """``demo --quick`` in a fresh folder: one root, three complete one-shot parts and a continuable reviewer."""
    cwd = tmp_path_factory.mktemp("demo")
    out = ok("--store", "st", "demo", "--quick", cwd=cwd, env=FAST)
    root = re.search(r"^demo root (\S+):", out, re.M)
    assert root is not None, out
    lines = out.splitlines()
    shown = next(line for line in lines if line.startswith("$ subagents ls "))
    listing = lines[lines.index(shown) + 2 :][:4]  # under the header row
    st = Store(cwd / "st", create=False)
    children = [resolve_id(st, line.split()[0]) for line in listing if line.split()[1:3] == ["complete", "completed"]]
    assert len(children) == 4, out
    return DemoStore(cwd, cwd / "st", root.group(1), children, out)


@pytest.fixture
def demo_copy(demo: DemoStore, tmp_path: Path) -> DemoStore:
    """A private copy of the demo store, for tests that damage or rewrite it."""
    shutil.copytree(demo.path, tmp_path / "st")
    return dataclasses.replace(demo, cwd=tmp_path, path=tmp_path / "st")


# -- demo ------------------------------------------------------------------------------------


def test_demo_quick_lists_three_complete_children(demo: DemoStore) -> None:
    """demo --quick prints a line per finished child, the timing, then `ls` with 3 `[complete]` parts (and the reviewer) and the tree."""
    lines = demo.stdout.splitlines()
    assert sum(1 for line in lines if re.match(r"^\[\d/3\] \S+ part-\d completed after", line)) == 3
    assert any(line.startswith("speedup") for line in lines)
    short = short_ids(Store(demo.path, create=False), [demo.root])[demo.root]
    assert lines[lines.index(f"$ subagents ls {short}") + 1].split() == LS_HEADER
    listing = lines[lines.index(f"$ subagents ls {short}") + 2 :][:3]
    assert [ROW.match(line).group(2) for line in listing] == ["1", "2", "3"]  # type: ignore[union-attr]
    tree = lines[lines.index(f"$ subagents tree {short}") + 1 :]
    assert tree[0] == f"{short} (root) — demo"
    assert [CHILD.match(line.strip()).groups() for line in tree[1:4]] == [  # type: ignore[union-attr]
        (line.split()[0], f"part-{i}") for i, line in enumerate(listing, 1)]
    assert all(line.startswith("  ") for line in tree[1:4])


def test_the_demo_shows_what_its_ls_and_tree_commands_print(demo: DemoStore) -> None:
    """Found by a docs probe: the demo's `$ subagents ls` / `$ subagents tree` blocks showed whole ids and no root
    label, where the commands it names print shortest prefixes and `— demo`."""
    lines = demo.stdout.splitlines()
    ls_at = next(i for i, line in enumerate(lines) if line.startswith("$ subagents ls "))
    tree_at = next(i for i, line in enumerate(lines) if line.startswith("$ subagents tree "))
    shown_ls, shown_tree = lines[ls_at + 1 : tree_at - 1], lines[tree_at + 1 :]
    now_ls = ok("--store", "st", *lines[ls_at].split()[2:], cwd=demo.cwd).splitlines()
    assert [line.split()[:4] for line in shown_ls] == [line.split()[:4] for line in now_ls]  # CREATED is relative: it moves
    assert [line.split()[-1] for line in shown_ls] == [line.split()[-1] for line in now_ls]
    assert shown_tree == ok("--store", "st", *lines[tree_at].split()[2:], cwd=demo.cwd).splitlines()


def test_demo_json_as_the_console_script(tmp_path: Path) -> None:
    """The installed `subagents` script runs the demo (workers never re-run its __main__)."""
    script = Path(sys.executable).with_name("subagents")
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    done = subprocess.run([str(script), "--store", "st", "demo", "--children", "2", "--cpu-ms", "50", "--json"],
                          cwd=tmp_path, env=FAST, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [r["stop_reason"] for r in doc["results"]] == ["completed", "completed"]
    assert [(r["label"], r["mode"], r["status"]) for r in doc["listing"]] == [
        ("part-1", "one-shot", "complete"), ("part-2", "one-shot", "complete"), ("reviewer", "continuable", "complete")
    ]
    assert doc["wall_s"] > 0 and doc["busy_s"] > 0
    # the continuable half: a report, then one settlement notice per epoch (the first prompt and two follow-ups)
    kinds = [m["kind"] for m in doc["conversation"]]
    assert kinds.count("subagent-report") == 1 and kinds.count("subagent-settled") == 3
    assert doc["conversation"][-1]["content"].endswith("follow-up 2 answered: and summarise everything in one line")


def test_the_demos_speedup_is_about_one_on_one_cpu(tmp_path: Path) -> None:
    """Found by a probe: pinned to one CPU the demo still said ``speedup 1.94×``: each child burned CPU *for* a
    wall-clock time, so two workers sharing one core each took their full time, and the sum of turn times over
    the wall time measured the clock, not parallel work. Each child now does a fixed amount of work (iterations
    calibrated on this host), and the speedup is that work's time alone, times the children, over the wall."""
    if shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two CPUs")
    done = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m", "subagents.supervisor.cli",
                           "--store", "st", "demo", "--children", "4", "--cpu-ms", "150", "--json"],
                          cwd=tmp_path, env={**FAST, "SUBAGENTS_POOL_SIZE": "2"}, capture_output=True, text=True, timeout=DEADLINE_S * 2)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    # about 1 when the measure is right, about 2 when it measures the clock (the defect); the work's time alone is
    # calibrated while the suite's other processes share the core, which put a right measure at 1.39 once: the
    # line between the two is drawn halfway
    assert 0 < doc["speedup"] < 1.5, {k: doc[k] for k in ("speedup", "wall_s", "work_s", "busy_s")}


def test_each_demo_child_is_timed_when_it_finished_not_when_its_result_was_read(tmp_path: Path) -> None:
    """Found by a probe: with 600 children every line said about the same ``completed after`` time: results were
    read only once every child had been started. The first child done is read (and timed) while others start."""
    done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "demo", "--children", "120",
                           "--cpu-ms", "0", "--json"], cwd=tmp_path, env=FAST, capture_output=True, text=True, timeout=DEADLINE_S * 2)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    first = min(r["elapsed_s"] for r in doc["results"])
    assert first < doc["wall_s"] / 2, (first, doc["wall_s"])


# -- ls / tree -------------------------------------------------------------------------------


def test_ls_json_equals_the_library_listing(demo: DemoStore) -> None:
    """ls PARENT --json is the library's list_children, as dataclass dicts with ISO 8601 times (issue 15)."""
    rows = json.loads(ok("--store", "st", "ls", demo.root, "--json", cwd=demo.cwd))
    expected = [iso_times(dataclasses.asdict(e)) for e in list_children(Store(demo.path, create=False), demo.root)]
    assert rows == expected
    assert [r["id"] for r in rows] == [r["id"] for r in expected]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["created_at"]) for r in rows)


ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_every_json_document_gives_its_times_in_iso_8601(demo: DemoStore) -> None:
    """Found by a README probe ("--json gives ... ISO 8601 times in UTC"): ``show``, ``log`` and ``store check``
    gave seconds since the epoch where listings gave ISO. Every moment is ISO now; what a record's ``data``
    holds is the record's own and stays as written; durations stay numbers."""
    child = demo.children[0]
    shown = json.loads(ok("--store", "st", "show", child, "--json", cwd=demo.cwd))
    moments = [shown["header"]["created_at"], shown["lease"]["acquired_at"]]
    moments += [m for m in (shown["timing"]["active_since"], shown["timing"]["active_through"]) if m is not None]
    if shown["owner"] is not None:
        moments += [shown["owner"]["started_at"], shown["owner"]["heartbeat_at"]]
    assert all(isinstance(m, str) and ISO.fullmatch(m) for m in moments), moments
    assert isinstance(shown["timing"]["settled_ms"], (int, float))
    events = json.loads(ok("--store", "st", "log", child, "--json", cwd=demo.cwd))["events"]
    assert events and all(ISO.fullmatch(e["ts"]) for e in events)
    checked = json.loads(ok("--store", "st", "store", "check", "--json", cwd=demo.cwd))
    assert ISO.fullmatch(checked["checked_at"]), checked["checked_at"]


def test_the_settled_rows_of_real_workers_name_their_files_times(demo: DemoStore) -> None:
    """Each release by a real worker writes its ``settled`` row after its last write to the child's file:
    the row's ``mtime_ns`` is the file's time, so a listing takes the row after one ``lstat``
    (tests/store/test_settled_mtime.py). A row written before that write would never list fast."""
    st = Store(demo.path, create=False)
    settled = [e for e in store.read_children(st, demo.root) if e.settled is not None]
    assert len(settled) == 4, store.read_children(st, demo.root)
    assert [e.settled.mtime_ns for e in settled] == [os.lstat(st.session_path(e.id)).st_mtime_ns for e in settled]


def test_ls_text_is_a_table_with_short_ids_and_outcomes(demo: DemoStore) -> None:
    """Plain ls PARENT: a header row, then per child a unique id prefix (taken back by `show`), status,
    outcome, mode, relative creation time and label (issues 13 and 15)."""
    rows = json.loads(ok("--store", "st", "ls", demo.root, "--json", cwd=demo.cwd))
    header, *lines = ok("--store", "st", "ls", demo.root, cwd=demo.cwd).splitlines()
    assert header.split() == LS_HEADER
    assert len(lines) == len(rows)
    for row, line in zip(rows, lines):
        cells = line.split()
        # at most the whole id: children made in one millisecond get consecutive ids (the generator
        # increments the random part), which share all but their last character
        assert row["id"].startswith(cells[0]) and 8 <= len(cells[0]) <= len(row["id"])
        assert cells[1:4] == [row["status"], row["outcome"], row["mode"]]
        assert line.endswith(row["label"])
        assert re.search(r"  (just now|\d+ (s|min|h|d) ago)  ", line), line
        shown = json.loads(ok("--store", "st", "show", cells[0], "--json", cwd=demo.cwd))
        assert shown["header"]["id"] == row["id"]


def test_ls_of_an_unknown_parent_is_session_not_found(demo: DemoStore) -> None:
    """An id nobody has is SESSION_NOT_FOUND, so a typo never looks like an empty parent (issue #13)."""
    for args in (["ls", "01UNKNOWNPARENT0000000000"], ["ls", "01UNKNOWNPARENT0000000000", "--json"]):
        done = cli("--store", "st", *args, cwd=demo.cwd)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr.startswith("error: SESSION_NOT_FOUND: ")


def test_ls_without_parent_lists_roots_with_child_counts(demo: DemoStore) -> None:
    """ls with no PARENT lists the top-level sessions and their subagent counts."""
    doc = json.loads(ok("--store", "st", "ls", "--json", cwd=demo.cwd))
    roots = doc["roots"]
    assert doc["next_cursor"] is None
    assert [(r["id"], r["label"], r["children"], r["status"]) for r in roots] == [(demo.root, "demo", 4, "complete")]
    header, line = ok("--store", "st", "ls", cwd=demo.cwd).splitlines()
    assert header.split() == ["ID", "STATUS", "OUTCOME", "CHILDREN", "CREATED", "LABEL"]
    cells = line.split()
    assert demo.root.startswith(cells[0]) and cells[1:4] == ["complete", "-", "4"] and cells[-1] == "demo"


def test_global_options_after_the_command(demo: DemoStore) -> None:
    """--store is accepted after the command name too."""
    assert ok("ls", demo.root, "--store", "st", "--json", cwd=demo.cwd) == ok("--store", "st", "ls", demo.root, "--json", cwd=demo.cwd)


def test_tree(demo: DemoStore) -> None:
    """tree ROOT indents by depth; --json is list_descendants flattened; no ROOT walks every root."""
    text = ok("--store", "st", "tree", demo.root, cwd=demo.cwd).splitlines()
    assert demo.root.startswith(text[0].removesuffix(" (root) — demo"))
    shown = [CHILD.match(line.removeprefix("  ")).group(1) for line in text[1:]]  # type: ignore[union-attr]
    assert len(shown) == len(demo.children) and all(c.startswith(s) for c, s in zip(demo.children, shown))
    rows = json.loads(ok("--store", "st", "tree", demo.root, "--json", cwd=demo.cwd))
    expected = [iso_times({**dataclasses.asdict(r.entry), "parent_id": r.parent_id, "depth": r.depth})
                for r in list_descendants(Store(demo.path, create=False), demo.root)]
    assert rows == expected
    forest = json.loads(ok("--store", "st", "tree", "--json", cwd=demo.cwd))
    assert forest == {"rows": [{"root": demo.root, "label": "demo", "descendants": expected}], "next_cursor": None}


def test_tree_heads_its_tree_with_what_the_session_is(demo: DemoStore) -> None:
    """Found by a probe: `tree` printed `<id> (root) — demo`, `tree ROOT` dropped the label, and `tree CHILD`
    called the child `(root)`. The heading is the same with or without ROOT; a child is named as one."""
    everything = ok("--store", "st", "tree", cwd=demo.cwd).splitlines()
    one = ok("--store", "st", "tree", demo.root, cwd=demo.cwd).splitlines()
    assert one[0] == everything[0] and re.fullmatch(r"\S+ \(root\) — demo", one[0]), one[0]
    child = json.loads(ok("--store", "st", "tree", demo.root, "--json", cwd=demo.cwd))[0]
    heading = ok("--store", "st", "tree", child["id"], cwd=demo.cwd).splitlines()[0]
    found = re.fullmatch(r"(\S+) \(subagent of (\S+)\) — (\S+)", heading)
    assert found is not None, heading
    assert child["id"].startswith(found.group(1)) and demo.root.startswith(found.group(2))
    assert found.group(3) == child["label"]


# -- show / log ---------------------------------------------------------------------------------


def test_show(demo: DemoStore) -> None:
    """show ID: header, descriptor, status, lease, timing, event count and log status."""
    child = demo.children[0]
    doc = json.loads(ok("--store", "st", "show", child, "--json", cwd=demo.cwd))
    found = inspect(Store(demo.path, create=False), child)
    assert doc["header"]["id"] == child and doc["header"]["parent_session"] == demo.root
    assert doc["descriptor"]["label"] == "part-1" and doc["descriptor"]["mode"] == "one-shot"
    assert doc["status"] == "complete"
    assert doc["lease"]["state"] == "released" and doc["lease"]["epoch"] == 1
    assert doc["timing"]["settled_ms"] > 0
    assert doc["events"] == len(found.events) and doc["log"]["status"] == "clean"
    assert doc["last_stop_reason"] == "completed" and doc["children"] == 0
    text = ok("--store", "st", "show", child, cwd=demo.cwd)
    assert re.search(r"^label\s+part-1$", text, re.M)
    assert re.search(rf"^log\s+{len(found.events)} events, clean, ", text, re.M)
    assert re.search(r"^status\s+complete$", text, re.M)


def test_show_of_a_root_prints_its_label(demo: DemoStore) -> None:
    """Found by a probe: a root's label (in its header, not in an identity) was only in ``--json``."""
    text = ok("--store", "st", "show", demo.root, cwd=demo.cwd)
    assert re.search(r"^label\s+demo$", text, re.M), text


def test_show_of_a_damaged_mailbox_says_what_it_cannot_count(demo_copy: DemoStore) -> None:
    """Found by a probe: a mailbox damaged where accepted records lie printed Python's ``None`` for
    the count it could not make. Both counts read ``?``, beside the damage."""
    reviewer = json.loads(ok("--store", "st", "ls", demo_copy.root, "--json", cwd=demo_copy.cwd))
    [child] = [row["id"] for row in reviewer if row.get("mode") == "continuable"]
    mailbox = demo_copy.path / "sessions" / f"{child}.mailbox"
    raw = bytearray(mailbox.read_bytes())
    raw[20] ^= 0xFF
    mailbox.write_bytes(bytes(raw))
    text = ok("--store", "st", "show", child, cwd=demo_copy.cwd)
    [line] = [line for line in text.splitlines() if line.startswith("mailbox")]
    assert re.match(r"^mailbox\s+\? accepted, \? pending \(.*damaged", line), line
    assert "None" not in text


def test_show_unknown_session_is_an_error(demo: DemoStore) -> None:
    done = cli("--store", "st", "show", "01NOSUCHSESSION", cwd=demo.cwd)
    assert done.returncode == 2
    assert done.stderr.startswith("error: SESSION_NOT_FOUND: ")


def test_commands_refuse_a_folder_that_is_not_a_store(tmp_path: Path) -> None:
    """Read commands never create a store: a missing one is STORE_NOT_FOUND, exit 2."""
    done = cli("--store", "nothing-here", "ls", cwd=tmp_path)
    assert done.returncode == 2 and "error: STORE_NOT_FOUND: " in done.stderr
    assert not (tmp_path / "nothing-here").exists()


def test_log(demo: DemoStore) -> None:
    """log ID prints one line per event (seq, time, type, data); --json carries the events, their times in ISO 8601."""
    child = demo.children[1]
    found = inspect(Store(demo.path, create=False), child)
    lines = ok("--store", "st", "log", child, cwd=demo.cwd).splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(len(found.events)))
    assert lines[-1].split()[2] == "turn/end"
    doc = json.loads(ok("--store", "st", "log", child, "--json", cwd=demo.cwd))
    assert doc["log_status"] == "clean"
    assert doc["events"] == json.loads(json.dumps([{**e, "ts": columns.iso(e["ts"])} for e in found.events]))


def test_log_of_an_empty_log_says_so(tmp_path: Path) -> None:
    """Found by a probe: `log ROOT` printed nothing at all (a top-level session `run` or the API made records
    nothing until a child reports to it), which reads as a hang or a bug; it now says where the work is."""
    st = Store(tmp_path / "st", durability="none")
    root = store.new_id()
    create_session(st, root, events=[])
    doc = json.loads(ok("--store", "st", "log", root, "--json", cwd=tmp_path))
    assert doc["events"] == [] and doc["log_status"] == "clean"
    text = ok("--store", "st", "log", root, cwd=tmp_path)
    assert text.strip() == f"(no events: a top-level session's work is in its children (`subagents tree {root}`))"


def test_log_follow_of_a_finished_one_shot_child_ends(demo: DemoStore) -> None:
    """Found by a probe: `log --follow` of a one-shot child whose turn had ended waited forever; such a log
    never grows again, so following it ends with 0 after its last event, in text and JSON Lines alike."""
    child = demo.children[0]
    events = len(inspect(Store(demo.path, create=False), child).events)
    done = cli("--store", "st", "log", child, "--follow", cwd=demo.cwd)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == events and lines[-1].split()[2] == "turn/end"
    done = cli("--store", "st", "log", child, "--follow", "--json", cwd=demo.cwd)
    assert done.returncode == 0 and [json.loads(line)["seq"] for line in done.stdout.splitlines()] == list(range(events))


class _Lines:
    """stdout of a running process, read by a thread so every wait has a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self._proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._queue.put(line)

    def next(self, timeout: float = 20.0) -> str:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            self._proc.kill()
            pytest.fail(f"no output within {timeout} s; stderr={self._proc.stderr.read() if self._proc.stderr else ''}")


def test_log_follow_prints_new_events_until_interrupted(tmp_path: Path) -> None:
    """log --follow prints the log, then each appended event; SIGINT ends it with 0."""
    st = Store(tmp_path / "st", durability="none")
    session = store.new_id()
    create_session(st, session, events=[("approval/policy", {"policy": "never", "source": "test"})])
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "log", session, "--follow"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _Lines(proc)
        assert "approval/policy" in lines.next()
        with LogWriter.open(st, session, epoch=0) as writer:
            writer.append([("turn/start", {"message_id": "m1"})], commit=True)
        assert lines.next().split()[:3:2] == ["1", "turn/start"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()



@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_log_follow_json_stopped_while_its_reader_lags_ends_with_a_whole_line(tmp_path: Path, signum: int) -> None:
    """A stop signal that lands while ``log --follow --json`` is blocked writing a line into a full pipe
    (its reader is slow) lets that line out whole: it exited 0 with the line cut mid-document, the rest
    of it dropped, so its last line was no JSON."""
    st = Store(tmp_path / "st", durability="none")
    session = store.new_id()
    create_session(st, session, events=[("approval/policy", {"policy": "never", "source": "test"})])
    with LogWriter.open(st, session, epoch=0) as writer:
        writer.append([("turn/start", {"message_id": "m1"})] + [("assistant/message", {"text": c * 2_000_000}) for c in "xyz"],
                      commit=True)
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "log", session, "--follow", "--json"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _blocked_in_a_full_pipe(proc)  # nobody reads: the follower blocks in the write of a 2 MB line, far past a pipe's buffer
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    cut = out.rsplit(b"\n", 1)[-1]
    assert not cut, f"the last line was cut after {len(cut)} bytes"
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))


def _blocked_in_a_full_pipe(proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``proc``, nobody reading its stdout, is blocked writing into it: the pipe holds at least half
    its buffer and stopped growing (a full pipe may hold less than its size: a small write can leave a page
    part empty). A deadline fails a writer that never got there."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    deadline = time.monotonic() + DEADLINE_S
    held = -1
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"the pipe never filled: {held} bytes of {size}"
        now = int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)
        if now == held and now >= size // 2:
            return
        held = now
        time.sleep(0.25)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("json_mode", [True, False], ids=["json", "table"])
def test_top_stopped_while_its_reader_lags_ends_with_a_whole_refresh(tmp_path: Path, signum: int, json_mode: bool) -> None:
    """A stop signal that lands while ``top`` (``--json``: one compact list per refresh; else the plain table
    a pipe gets) is blocked writing a refresh larger than the pipe's buffer lets that refresh out whole: it
    exited 0 with its last line cut mid-document (``--json``: no JSON) or mid-row, the rest of it dropped."""
    st = Store(tmp_path / "st", durability="none")
    owner = store.new_id()
    store.register_owner(st, owner, ttl=3600.0)  # this test's process holds the sessions: `top` lists them
    labels = [c * 100_000 for c in "abc"]  # one row is past a pipe's buffer (64 KiB), a refresh three times that
    for label in labels:
        create_session(st, store.new_id(), lease_owner=owner,
                       events=[("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "p", "label": label})])
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "top", *(["--json"] if json_mode else [])],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _blocked_in_a_full_pipe(proc)  # nobody reads: `top` blocks in the write of its first refresh
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # as a Ctrl-C ends `top` (README: exit codes)
    cut = out.rsplit(b"\n", 1)[-1]
    assert not cut, f"the last line was cut after {len(cut)} bytes"
    lines = out.decode().splitlines()
    if json_mode:
        refreshes = [json.loads(line) for line in lines]
        assert [sorted(row["label"] for row in rows) for rows in refreshes] == [labels] * len(refreshes)
    else:  # per refresh: its time line, the columns' names, a row per session (the label whole, the owner last)
        assert lines and len(lines) % 5 == 0, [line[:80] for line in lines]
        rows = lines[-3:]
        assert sorted(row.split()[4] for row in rows) == labels and all(row.endswith(owner) for row in rows)


# -- store fsck / reindex ----------------------------------------------------------------------------


def _damage(st: DemoStore) -> tuple[str, str, bytes]:
    """Tear one child's log (garbage after its last record), corrupt another (a flipped byte in record 0)."""
    torn, corrupt = st.children[0], st.children[1]
    opened = Store(st.path, create=False)
    original = log_data(opened, torn)  # its records: the append drops the padding after them
    append_log(opened, torn, b"\x17\x00\x00\x00garbage")
    data = bytearray(log_bytes(opened, corrupt))
    data[12] ^= 0xFF  # inside the payload of the first record; the log ends with a turn/end
    write_log(opened, corrupt, bytes(data))
    return torn, corrupt, original


def test_fsck_clean_store(demo_copy: DemoStore) -> None:
    done = cli("--store", "st", "store", "fsck", "--json", cwd=demo_copy.cwd)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["counts"] == {"clean": 5, "torn": 0, "corrupt": 0, "unsupported": 0, "unreadable": 0}
    assert report["findings"] == []


def test_fsck_reports_torn_and_corrupt_and_changes_nothing(demo_copy: DemoStore) -> None:
    """Without --repair fsck is read-only: both damaged sessions reported, exit 1, every byte kept."""
    torn, corrupt, original = _damage(demo_copy)
    before = snapshot(demo_copy.path)
    done = cli("--store", "st", "store", "fsck", "--json", cwd=demo_copy.cwd)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["torn"] == [torn] and report["corrupt"] == [corrupt] and report["repaired"] == []
    kinds = {f["id"]: f for f in report["findings"]}
    assert kinds[corrupt]["damage"]["reason"] == "crc-mismatch" and kinds[corrupt]["damage"]["offset"] == 0
    assert kinds[torn]["damage"]["offset"] == len(original)
    # the bytes after the valid prefix are the records' up to the log's last non-zero byte, not its zero padding
    # (a probe saw "3230 bytes after the valid prefix" where 364 bytes of records followed)
    opened = Store(demo_copy.path, create=False)
    records = data_end(log_bytes(opened, corrupt))
    assert len(log_bytes(opened, corrupt)) > records and kinds[corrupt]["damage"]["dropped"] == records
    assert f"{records} bytes after the valid prefix" in kinds[corrupt]["detail"]
    shown = cli("--store", "st", "log", corrupt, cwd=demo_copy.cwd)
    assert f"(corrupt log: crc-mismatch at byte 0, {records} bytes after the valid prefix)" in shown.stdout, shown
    text = cli("--store", "st", "store", "fsck", cwd=demo_copy.cwd)
    assert text.returncode == 1
    assert re.search(rf"^torn\s+{torn}\s", text.stdout, re.M) and re.search(rf"^corrupt\s+{corrupt}\s", text.stdout, re.M)
    assert snapshot(demo_copy.path) == before


def test_fsck_repair_fixes_the_torn_session_only(demo_copy: DemoStore) -> None:
    """--repair truncates the torn tail (under a fresh lease epoch) and never touches the corrupt log."""
    torn, corrupt, original = _damage(demo_copy)
    opened = Store(demo_copy.path, create=False)
    corrupt_bytes = log_bytes(opened, corrupt)
    done = cli("--store", "st", "store", "fsck", "--repair", "--json", cwd=demo_copy.cwd)
    assert done.returncode == 1, done.stderr  # the corrupt session remains
    report = json.loads(done.stdout)
    assert report["repaired"] == [torn]
    assert log_bytes(opened, torn) == original
    assert log_bytes(opened, corrupt) == corrupt_bytes
    lease = read_lease(Store(demo_copy.path, create=False), torn)
    assert lease is not None and lease.epoch == 2 and lease.state == "released"
    again = json.loads(cli("--store", "st", "store", "fsck", "--json", cwd=demo_copy.cwd).stdout)
    assert again["torn"] == [] and again["corrupt"] == [corrupt]


def test_fsck_repair_respects_live_owners_and_reports_every_folder(tmp_path: Path) -> None:
    """A torn log without a lease is repaired at epoch 0; one leased by a live owner is left alone;
    a creation's leftover temporary file and a garbage header are findings, never a crash (the latter is corrupt)."""
    st = Store(tmp_path / "st", durability="none")
    free, held = store.new_id(), store.new_id()
    for session in (free, held):
        create_session(st, session, events=[("approval/policy", {"policy": "never", "source": "test"})])
        append_log(st, session, b"\x05\x00\x00\x00tear")
    owner = store.new_id()
    store.register_owner(st, owner, ttl=600.0)  # this test process: alive
    store.acquire_lease(st, held, owner)
    Path(st.sessions_dir, f".{store.new_id()}.new.1.ab12").write_bytes(b"SAS2")  # a creation that never published its file
    broken = store.new_id()
    create_session(st, broken)
    patch(st, broken, HEADER_AT + 8, b"\xc1")  # the header's first byte: not msgpack (and its CRC no longer matches)
    held_bytes = log_bytes(st, held)
    done = cli("--store", "st", "store", "fsck", "--repair", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    kinds = sorted(f["kind"] for f in report["findings"])
    assert kinds == ["header-corrupt", "no-header", "torn", "torn"]
    assert report["repaired"] == [free] and report["corrupt"] == [broken]
    repairs = {f["id"]: f["repair"] for f in report["findings"] if f["kind"] == "torn"}
    assert repairs[free].startswith("repaired at epoch 0")
    assert repairs[held].startswith(f"not repaired: owner {owner} is alive")
    assert log_bytes(st, held) == held_bytes
    assert inspect(st, free).status == "clean" and read_lease(st, free) is None


def test_reindex_rebuilds_a_lost_index(demo_copy: DemoStore) -> None:
    """fsck notices children missing from the index; reindex rebuilds it from headers."""
    (demo_copy.path / "index" / "children" / demo_copy.root).unlink()
    report = json.loads(ok("--store", "st", "store", "fsck", "--json", cwd=demo_copy.cwd))
    assert sorted(f["id"] for f in report["findings"] if f["kind"] == "index-missing") == demo_copy.children
    doc = json.loads(ok("--store", "st", "store", "reindex", "--json", cwd=demo_copy.cwd))
    assert doc == {"parents": {demo_copy.root: demo_copy.children}, "children": 4, "roots": 1,
                   "put_back": {demo_copy.root: demo_copy.children}, "left_out": {}, "kept_unacknowledged": {}}
    assert [r["id"] for r in json.loads(ok("--store", "st", "ls", demo_copy.root, "--json", cwd=demo_copy.cwd))] == demo_copy.children


# -- run ----------------------------------------------------------------------------------------------


def test_run_prints_output_and_stop_reason(tmp_path: Path) -> None:
    """run PROGRAM starts one child under a new root; a failed child exits 1 with its stop reason."""
    env = _env(SUBAGENTS_POOL_SIZE="1", SUBAGENTS_DURABILITY="none")  # one child: one worker is enough
    out = ok("--store", "st", "run", "echo", "--prompt", "hello there", "--label", "greet", cwd=tmp_path, env=env)
    assert out.splitlines()[:2] == ["hello there", "stop reason: completed"]
    failed = cli("--store", "st", "run", "script", "--prompt", json.dumps({"script": [{"fail": "boom"}]}), "--json", cwd=tmp_path, env=env)
    assert failed.returncode == 1, failed.stderr
    doc = json.loads(failed.stdout)
    assert doc["stop_reason"] == "error" and "boom" in (doc["diagnostic"] or "")
    labels = [r["label"] for r in json.loads(ok("--store", "st", "tree", "--json", cwd=tmp_path))["rows"] for r in r["descendants"]]
    assert labels == [None, "greet"]  # tree with no ROOT: the newest top-level sessions first


def test_what_a_program_prints_goes_to_stderr_so_run_json_stays_one_document(tmp_path: Path) -> None:
    """Found by a probe: a program's print() landed on the CLI's stdout before the JSON document (workers shared
    its stdout), and `run --json | jq` failed. A worker's stdout is its stderr: what it prints is still shown."""
    (tmp_path / "printer.py").write_text("async def f(ctx):\n    print('hello from the program', flush=True)\n    return 'done'\n")
    env = _env(SUBAGENTS_POOL_SIZE="1", SUBAGENTS_DURABILITY="none")
    done = cli("--store", "st", "run", "printer:f", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "done"
    assert "hello from the program" in done.stderr


# -- config ------------------------------------------------------------------------------------------------


def test_config_show_json_is_the_default(tmp_path: Path) -> None:
    doc = json.loads(ok("config", "show", "--json", cwd=tmp_path))
    assert {k: v for k, v in doc.items() if k not in ("sources", "llm")} == load_config(env={}).config.model_dump(mode="json")
    assert doc["llm"]["model"] == "deepseek-chat" and doc["llm"]["max_steps"] == 32  # the llm program's own defaults
    assert set(doc["sources"].values()) == {"default"}
    assert doc["store"]["path"] == "./.subagents"


def test_config_show_text_loads_back(tmp_path: Path) -> None:
    """The text form names its sources and is itself a valid deployment file."""
    text = ok("--store", "elsewhere", "config", "show", cwd=tmp_path, env=_env(SUBAGENTS_POOL_SIZE="1"))
    assert "# from environment variable SUBAGENTS_POOL_SIZE" in text and "# from --store" in text
    (tmp_path / "again.toml").write_text(text)
    loaded = load_config(tmp_path / "again.toml", env={}).config
    assert loaded.supervisor.pool_size == 1 and loaded.store.path == "elsewhere"


def test_env_override_shows_in_config_show(tmp_path: Path) -> None:
    doc = json.loads(ok("config", "show", "--json", cwd=tmp_path, env=_env(SUBAGENTS_POOL_SIZE="1", SUBAGENTS_DURABILITY="none")))
    assert doc["supervisor"]["pool_size"] == 1 and doc["supervisor"]["durability"] == "none"


def test_unknown_config_key_exits_2_naming_key_and_file(tmp_path: Path) -> None:
    bad = tmp_path / "deploy.toml"
    bad.write_text("[supervisor]\npool_sise = 2\n")
    done = cli("--config", str(bad), "config", "show", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error: CONFIG_INVALID: ")
    assert "supervisor.pool_sise" in done.stderr and str(bad) in done.stderr


def test_config_file_from_the_environment_applies_to_commands(tmp_path: Path) -> None:
    """SUBAGENTS_CONFIG names the deployment file; its store path is used by listings."""
    (tmp_path / "deploy.toml").write_text('[store]\npath = "from-file"\n')
    done = cli("ls", cwd=tmp_path, env=_env(SUBAGENTS_CONFIG="deploy.toml"))
    assert done.returncode == 2 and "from-file" in done.stderr  # not a store yet: named in the error


@pytest.mark.parametrize("group, verbs", [((), ("demo", "run", "ls", "store", "config")), (("store",), ("fsck", "check", "reindex", "migrate")),
                                          (("config",), ("show",))], ids=["subagents", "store", "config"])
def test_no_command_is_one_usage_line_naming_the_commands(tmp_path: Path, group: tuple[str, ...], verbs: tuple[str, ...]) -> None:
    """`subagents`, `subagents store`, `subagents config` printed their whole usage and exited 2 with no
    `error:` line, where every other refusal is one `error: CODE: message` line. They say what to go on with."""
    done = cli(*group, cwd=tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: USAGE: "), done.stderr
    assert all(verb in lines[0] for verb in verbs) and f"`{' '.join(('subagents', *group))} --help`" in lines[0], lines[0]
    assert done.stdout == ""


# -- terminal rendering ----------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_renderings_keep_brackets_and_ids(demo: DemoStore) -> None:
    """On a terminal, tables and trees show every id, and `[complete]` is text, not rich markup."""
    st = Store(demo.path, create=False)
    rows = [dataclasses.asdict(e) for e in list_children(st, demo.root)]
    tree_rows = [{**dataclasses.asdict(r.entry), "parent_id": r.parent_id, "depth": r.depth} for r in list_descendants(st, demo.root)]
    screen = _Terminal()
    out = render.Output(screen)
    assert out.rich
    render.render_listing(out, rows + [{"kind": "diagnostic", "id": "01BROKEN", "reason": "corrupt"}])
    render.render_tree(out, [{"root": demo.root, "descendants": tree_rows}])
    text = screen.getvalue()
    assert all(child in text for child in demo.children) and re.search(r"01BROKEN\s+diagnostic\s+corrupt", text)
    assert text.count("[complete, completed] — part-") == 3  # the tree lines
    assert not render.Output(_Terminal(), json_mode=True).rich
