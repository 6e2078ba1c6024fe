"""Operating a store (issue 15), through the real CLI in a subprocess: read a result, filter, page, sort, count, short ids.

The store is built with the store's own API (real files, no workers): roots
created hours and days apart, children whose logs end with each kind of
``turn/end``. Each test runs ``python -m subagents.supervisor.cli`` on it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subagents import store
from subagents.store import Query, Store, create_session, find_roots, list_children, list_descendants

from ..conftest import REPO_ROOT
from ..session_bytes import HEADER_AT, header_map, patch, write_header_value, write_slot

ONE_SHOT = {"version": 1, "mode": "one-shot", "provider": "script"}
HOUR = 3600.0


def run_cli(st: Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = REPO_ROOT
    return subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root, *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


def ok(st: Store, *args: str) -> str:
    done = run_cli(st, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def child(st: Store, parent: str, cid: str, label: str, created_at: float, end: dict | None, *, say: str | None = None) -> None:
    events: list[tuple[str, object]] = [("subagent/descriptor", {**ONE_SHOT, "label": label}),
                                        ("message/accepted", {"message_id": f"m-{cid}", "source": {"kind": "user"}, "content": "go"})]
    if end is not None:
        events.append(("turn/start", {"message_id": f"m-{cid}"}))
        if say:
            events.append(("assistant/message", {"text": say}))
        events.append(("turn/end", end))
    create_session(st, cid, parent_session=parent, origin="subagent", delegation_depth=1, created_at=created_at, events=events)


@pytest.fixture
def st(tmp_path: Path) -> Store:
    """Roots r0..r4 created 4 days, 2 days, 5 h, 2 h and 1 min ago; r3 has five children of different outcomes."""
    s = Store(tmp_path / "store", durability="none")
    now = time.time()
    for i, age in enumerate((4 * 24 * HOUR, 2 * 24 * HOUR, 5 * HOUR, 2 * HOUR, 60.0)):
        create_session(s, f"r{i}AAAAAAAAAA", label=f"job-{i}", created_at=now - age)
    parent = "r3AAAAAAAAAA"
    child(s, parent, "c0000000AAAA", "review-a", now - 110 * 60, {"stop_reason": "completed", "diagnostic": None},
          say="the closing message\nwith a second line")
    child(s, parent, "c0000000AAAB", "review-b", now - 100 * 60,
          {"stop_reason": "error", "diagnostic": "RuntimeError: boom\n  at line 3\n" + "x" * 300})
    child(s, parent, "c0000000AAAC", "build-1", now - 90 * 60, {"stop_reason": "budget-exhausted", "diagnostic": "the turn exceeded timeout_ms=50", "cause": "timeout"})
    child(s, parent, "c0000000AAAD", "build-2", now - 30 * 60, {"stop_reason": "aborted", "diagnostic": "the turn was cancelled (user)", "cause": "user"})
    child(s, parent, "c0000000AAAE", "idle", now - 10 * 60, None)
    return s


def test_show_prints_the_result_the_outcome_and_the_failure(st: Store) -> None:
    """show: the closing message whole, the outcome, and the failure text whole (issue 15 'read a result')."""
    text = ok(st, "show", "c0000000AAAA")
    assert re.search(r"^outcome\s+completed$", text, re.M)
    assert "result    the closing message\nwith a second line" in text or re.search(r"^result\s+the closing message\nwith a second line$", text, re.M)
    doc = json.loads(ok(st, "show", "c0000000AAAB", "--json"))
    assert (doc["outcome"], doc["error_code"], doc["error"]) == ("error", "RuntimeError", "RuntimeError: boom")
    assert doc["failure"].endswith("x" * 300)  # whole, never cut
    assert re.search(r"^failure\s+RuntimeError: boom$", ok(st, "show", "c0000000AAAB"), re.M)


def test_show_takes_the_result_from_the_last_finished_turn_never_from_an_open_one(st: Store) -> None:
    """Found by a probe: show printed an open (or crashed) turn's last message as the child's ``result``, e.g.
    "starting" for a one-shot child killed mid-turn. A result is a finished turn's closing message."""
    parent = "r3AAAAAAAAAA"
    events = [("subagent/descriptor", {**ONE_SHOT, "label": "crashed"}),
              ("message/accepted", {"message_id": "m-x", "source": {"kind": "user"}, "content": "go"}),
              ("turn/start", {"message_id": "m-x"}), ("assistant/message", {"text": "starting"})]
    create_session(st, "c0000000AAAF", parent_session=parent, origin="subagent", delegation_depth=1, events=events)
    doc = json.loads(ok(st, "show", "c0000000AAAF", "--json"))
    assert (doc["outcome"], doc["result"]) == ("crashed", None), doc
    assert not re.search(r"^result\s", ok(st, "show", "c0000000AAAF"), re.M)
    # a later turn, open: the result stays the finished turn's
    with store.LogWriter.open(st, "c0000000AAAA", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "half-way"})], commit=True)
    assert json.loads(ok(st, "show", "c0000000AAAA", "--json"))["result"] == "the closing message\nwith a second line"


def test_show_gives_no_result_when_the_last_turn_left_no_closing_message(st: Store) -> None:
    """Found by a probe: a continuable child whose last turn failed before it said anything was shown with an
    earlier turn's closing message as its ``result``, beside the last turn's ``error`` outcome (its settlement
    notice said "It left no closing message."). The result is the last finished turn's closing message only."""
    with store.LogWriter.open(st, "c0000000AAAA", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "error", "diagnostic": "RuntimeError: boom"})], commit=True)
    doc = json.loads(ok(st, "show", "c0000000AAAA", "--json"))
    assert (doc["outcome"], doc["failure"], doc["result"]) == ("error", "RuntimeError: boom", None), doc
    assert not re.search(r"^result\s", ok(st, "show", "c0000000AAAA"), re.M)

def test_log_full_and_json_are_never_cut(st: Store) -> None:
    """log cuts data at 96 characters; --full and --json print it whole."""
    cut = ok(st, "log", "c0000000AAAB")
    assert "x" * 300 not in cut and "…" in cut
    assert "x" * 300 in ok(st, "log", "c0000000AAAB", "--full")
    events = json.loads(ok(st, "log", "c0000000AAAB", "--json"))["events"]
    assert events[-1]["data"]["diagnostic"].endswith("x" * 300)


def test_filters_on_ls_tree_and_the_library(st: Store) -> None:
    """--status, --outcome, --label (glob), --since / --until on ls and tree, and the same Query on the catalog calls."""
    parent = "r3AAAAAAAAAA"

    def ids(*args: str) -> list[str]:
        return [r["id"] for r in json.loads(ok(st, "ls", parent, "--json", *args))]

    assert ids("--outcome", "error,timeout") == ["c0000000AAAB", "c0000000AAAC"]
    assert ids("--outcome", "not-started") == ["c0000000AAAE"]
    assert ids("--label", "review-*") == ["c0000000AAAA", "c0000000AAAB"]
    assert ids("--since", "95m") == ["c0000000AAAC", "c0000000AAAD", "c0000000AAAE"]
    assert ids("--since", "95m", "--until", "20m") == ["c0000000AAAC", "c0000000AAAD"]
    assert ids("--status", "running") == []
    assert [r["id"] for r in json.loads(ok(st, "tree", parent, "--json", "--outcome", "aborted"))] == ["c0000000AAAD"]
    text = ok(st, "ls", parent, "--label", "build-?", "--outcome", "timeout")
    assert len(text.splitlines()) == 2 and "timeout" in text
    # the library takes the same filters
    query = Query(outcome=frozenset({"error", "aborted"}))
    assert [e.id for e in list_children(st, parent, query)] == ["c0000000AAAB", "c0000000AAAD"]
    assert [r.entry.id for r in list_descendants(st, parent, Query(label="review-b"))] == ["c0000000AAAB"]
    # a bad value is a usage error before anything is read
    done = run_cli(st, "ls", parent, "--outcome", "exploded")
    assert done.returncode == 2 and "--outcome" in done.stderr
    done = run_cli(st, "ls", parent, "--since", "yesterday-ish")
    assert done.returncode == 2 and "duration" in done.stderr


def test_top_level_ls_is_newest_first_paged_with_a_cursor(st: Store) -> None:
    """ls with no PARENT: the newest roots first, --limit, and next_cursor in --json continues the listing."""
    first = json.loads(ok(st, "ls", "--json", "--limit", "2"))
    assert [r["id"][:2] for r in first["roots"]] == ["r4", "r3"]
    assert all(r["created_at"].endswith("Z") for r in first["roots"])
    second = json.loads(ok(st, "ls", "--json", "--limit", "2", "--cursor", first["next_cursor"]))
    assert [r["id"][:2] for r in second["roots"]] == ["r2", "r1"]
    third = json.loads(ok(st, "ls", "--json", "--limit", "2", "--cursor", second["next_cursor"]))
    assert [r["id"][:2] for r in third["roots"]] == ["r0"] and third["next_cursor"] is None
    text = ok(st, "ls", "--limit", "2")
    assert text.splitlines()[-1] == f"(more sessions: --cursor {first['next_cursor']})"
    assert "1 min ago" in text and "2 h ago" in text  # relative times in tables
    by_label = json.loads(ok(st, "ls", "r3AAAAAAAAAA", "--json", "--sort", "label", "--limit", "3"))
    assert [r["label"] for r in by_label["rows"]] == ["build-1", "build-2", "idle"]
    rest = json.loads(ok(st, "ls", "r3AAAAAAAAAA", "--json", "--sort", "label", "--cursor", by_label["next_cursor"]))
    assert [r["label"] for r in rest["rows"]] == ["review-a", "review-b"]
    assert [r.id[:2] for r in find_roots(st, limit=3).rows] == ["r4", "r3", "r2"]
    done = run_cli(st, "ls", "--cursor", "garbage!")
    assert done.returncode != 0 and "INVALID_QUERY" in done.stderr


def test_tree_without_root_pages_and_sorts_the_roots_as_ls_does(st: Store) -> None:
    """Found by a probe: `tree` with no ROOT took --limit but printed a plain list with no next_cursor (and no
    "(more ...)" line), and ignored --sort: its pages of top-level sessions are the ones `ls` pages."""
    for sort in ("created", "label", "status"):
        listed, drawn, ls_cursor, tree_cursor = [], [], [], []
        for _ in range(3):
            ls_page = json.loads(ok(st, "ls", "--json", "--sort", sort, "--limit", "2", *(["--cursor", ls_cursor[-1]] if ls_cursor else [])))
            tree_page = json.loads(ok(st, "tree", "--json", "--sort", sort, "--limit", "2", *(["--cursor", tree_cursor[-1]] if tree_cursor else [])))
            listed.append([r["id"] for r in ls_page["roots"]])
            drawn.append([t["root"] for t in tree_page["rows"]])
            ls_cursor.append(ls_page["next_cursor"])
            tree_cursor.append(tree_page["next_cursor"])
        assert drawn == listed and tree_cursor == ls_cursor and tree_cursor[-1] is None, (sort, drawn, listed)
    by_label = json.loads(ok(st, "tree", "--json", "--sort", "label", "--limit", "4"))
    assert [t["label"] for t in by_label["rows"]] == ["job-0", "job-1", "job-2", "job-3"]
    assert [r["id"] for r in by_label["rows"][3]["descendants"]] == [r.entry.id for r in list_descendants(st, "r3AAAAAAAAAA")]
    text = ok(st, "tree", "--limit", "2").splitlines()
    first = json.loads(ok(st, "tree", "--json", "--limit", "2"))["next_cursor"]
    assert text[0].startswith("r4AAAAAA (root)") and text[-1] == f"(more sessions: --cursor {first})"
    done = run_cli(st, "tree", "--sort", "label", "--cursor", first)
    assert done.returncode != 0 and "INVALID_QUERY" in done.stderr


def test_tree_without_root_filters_subagents_and_shows_only_the_roots_above_a_match(st: Store) -> None:
    """Found by a probe: `tree --status running` printed every top-level session, each "(no subagents)". A filter
    picks subagents, as with `tree ROOT`; with no ROOT a top-level session is shown when a subagent below it
    matches, and pages count those."""
    child(st, "r1AAAAAAAAAA", "c1000000AAAA", "fix-1", time.time() - 30 * HOUR, {"stop_reason": "error", "diagnostic": "RuntimeError: no"})
    child(st, "r1AAAAAAAAAA", "c1000000AAAB", "fix-2", time.time() - 29 * HOUR, {"stop_reason": "completed", "diagnostic": None})

    def trees(*args: str) -> dict[str, list[str]]:
        return {t["root"]: [r["id"] for r in t["descendants"]] for t in json.loads(ok(st, "tree", "--json", *args))["rows"]}

    assert trees("--outcome", "error") == {"r3AAAAAAAAAA": ["c0000000AAAB"], "r1AAAAAAAAAA": ["c1000000AAAA"]}
    assert trees("--label", "fix-*") == {"r1AAAAAAAAAA": ["c1000000AAAA", "c1000000AAAB"]}
    assert trees("--status", "complete", "--outcome", "aborted,completed") == {
        "r3AAAAAAAAAA": ["c0000000AAAA", "c0000000AAAD"], "r1AAAAAAAAAA": ["c1000000AAAB"]}
    assert trees("--status", "running") == {}
    assert ok(st, "tree", "--status", "running") == "(no sessions)\n"
    for root, below in trees("--outcome", "error").items():  # each tree is what `tree ROOT` shows with the filter
        assert [r["id"] for r in json.loads(ok(st, "tree", root, "--json", "--outcome", "error"))] == below
    first = json.loads(ok(st, "tree", "--json", "--outcome", "error", "--limit", "1"))
    assert [t["root"] for t in first["rows"]] == ["r3AAAAAAAAAA"] and first["next_cursor"] is not None
    rest = json.loads(ok(st, "tree", "--json", "--outcome", "error", "--limit", "1", "--cursor", first["next_cursor"]))
    assert [t["root"] for t in rest["rows"]] == ["r1AAAAAAAAAA"] and rest["next_cursor"] is None
    by_label = json.loads(ok(st, "tree", "--json", "--outcome", "error", "--sort", "label", "--limit", "1"))
    assert [t["label"] for t in by_label["rows"]] == ["job-1"]
    assert "only the top-level sessions with a match below them" in " ".join(ok(st, "tree", "--help").split())


def test_roots_index_is_rebuilt_by_reindex(st: Store) -> None:
    """index/roots is derived: lost, the listing falls back to headers; `store reindex` writes it again."""
    path = os.path.join(st.root, "index", "roots")
    assert os.path.exists(path)
    os.unlink(path)
    assert [r["id"][:2] for r in json.loads(ok(st, "ls", "--json"))["roots"]] == ["r4", "r3", "r2", "r1", "r0"]
    assert "5 roots" in ok(st, "store", "reindex")
    assert os.path.exists(path)
    assert [r["id"][:2] for r in json.loads(ok(st, "ls", "--json"))["roots"]] == ["r4", "r3", "r2", "r1", "r0"]


@pytest.mark.parametrize("damage", [b"garbage, not one record\n", b"\x00" * 64], ids=["text", "zeros"])
def test_a_roots_index_damaged_from_its_start_does_not_empty_the_listing(st: Store, damage: bytes) -> None:
    """An index/roots that holds no readable record is ignored with a warning naming `store reindex`;
    the listing comes from the headers instead of saying the store is empty."""
    with open(os.path.join(st.root, "index", "roots"), "wb") as handle:
        handle.write(damage)
    done = run_cli(st, "ls")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()[1:]] == ["r4AAAAAA", "r3AAAAAA", "r2AAAAAA", "r1AAAAAA", "r0AAAAAA"]
    assert "subagents store reindex" in done.stderr and "index/roots" in done.stderr


def test_a_roots_index_changed_at_its_end_does_not_drop_roots(st: Store) -> None:
    """It read as a torn end: ``ls`` showed one root fewer, with no warning. A whole record that fails
    its CRC is a committed root."""
    path = os.path.join(st.root, "index", "roots")
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(size - 6)
        handle.write(b"XXXX")
    done = run_cli(st, "ls")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()[1:]] == ["r4AAAAAA", "r3AAAAAA", "r2AAAAAA", "r1AAAAAA", "r0AAAAAA"]
    assert "subagents store reindex" in done.stderr and "index/roots" in done.stderr


def test_fsck_and_show_say_that_a_lease_does_not_read(st: Store) -> None:
    """It exited 0 and counted the session clean, beside a lease-unreadable finding."""
    for slot in (0, 1):
        write_slot(st, "c0000000AAAA", slot, b"\xc1 not a lease")
    done = run_cli(st, "store", "fsck", "--json")
    kinds = [f["kind"] for f in json.loads(done.stdout)["findings"] if f["id"] == "c0000000AAAA"]
    assert done.returncode == 1 and "lease-unreadable" in kinds, (done.returncode, kinds)
    # show said "lease (none)", as for a session never leased
    shown = ok(st, "show", "c0000000AAAA")
    assert re.search(r"^lease\s+unreadable \(CORRUPT_SESSION: ", shown, re.M)
    # and "status complete" (with its outcome), where ls shows a diagnostic row: whether a live owner holds it is unknown
    assert re.search(r"^status\s+unknown: its lease does not read$", shown, re.M), shown
    doc = json.loads(ok(st, "show", "c0000000AAAA", "--json"))
    assert doc["lease"] is None and doc["lease_problem"].startswith("CORRUPT_SESSION: ")
    assert doc["status"] is None and doc["outcome"] == "completed"  # what its log says: its last turn completed


def test_fsck_names_the_children_of_a_removed_root_and_exits_1(st: Store) -> None:
    """Found by a probe: with a root's file removed, fsck was silent about its children and exited 0."""
    os.remove(st.session_path("r3AAAAAAAAAA"))
    done = run_cli(st, "store", "fsck", "--json")
    orphans = [f["id"] for f in json.loads(done.stdout)["findings"] if f["kind"] == "parent-missing"]
    assert done.returncode == 1 and len(orphans) == 5, (done.returncode, orphans)


def test_a_root_whose_header_is_damaged_is_listed_as_a_diagnostic(st: Store) -> None:
    """A listed root whose header no longer reads shows as a `corrupt` row; it never silently disappears."""
    patch(st, "r2AAAAAAAAAA", HEADER_AT + 8, b"junk")
    doc = json.loads(ok(st, "ls", "--json"))
    rows = {r["id"][:2]: r for r in doc["roots"]}
    assert list(rows) == ["r4", "r3", "r2", "r1", "r0"]
    assert (rows["r2"]["kind"], rows["r2"]["reason"]) == ("diagnostic", "corrupt") and rows["r3"]["kind"] == "root"
    line = [line for line in ok(st, "ls").splitlines() if line.startswith("r2AAAAAA")][0]
    assert "corrupt" in line.split()


def test_summary_counts_by_status_and_outcome(st: Store) -> None:
    """summary ROOT: counts by status and outcome; summary alone covers the whole store."""
    doc = json.loads(ok(st, "summary", "r3AAAAAAAAAA", "--json"))
    assert doc["subagents"] == 5 and doc["by_status"] == {"complete": 5}
    assert doc["by_outcome"] == {"completed": 1, "error": 1, "timeout": 1, "aborted": 1, "not-started": 1}
    assert doc["supervisors"] == []
    text = ok(st, "summary")
    assert text.startswith("5 subagents below 5 top-level sessions")
    assert re.search(r"^outcome\s+1 aborted, 1 completed, 1 error, 1 not-started, 1 timeout$", text, re.M)
    assert json.loads(ok(st, "summary", "--json")) == {**doc, "root": None, "roots": 5}


def test_short_ids_are_unique_prefixes_taken_back(st: Store) -> None:
    """Tables show the shortest unique prefix (at least 8 characters); verbs take it back; an ambiguous one is refused."""
    lines = ok(st, "ls", "r3AAAAAAAAAA").splitlines()[1:]
    shown = [line.split()[0] for line in lines]
    assert shown == ["c0000000AAAA", "c0000000AAAB", "c0000000AAAC", "c0000000AAAD", "c0000000AAAE"]  # they share 11 characters
    assert [line.split()[0] for line in ok(st, "ls").splitlines()[1:]] == ["r4AAAAAA", "r3AAAAAA", "r2AAAAAA", "r1AAAAAA", "r0AAAAAA"]
    assert json.loads(ok(st, "show", "r3AAAA", "--json"))["header"]["id"] == "r3AAAAAAAAAA"
    done = run_cli(st, "show", "c0000000")
    assert done.returncode != 0 and "AMBIGUOUS_ID" in done.stderr
    # ids read case-insensitively when the text as typed names none (ULIDs are): found by a probe
    assert json.loads(ok(st, "show", "R3aaaa", "--json"))["header"]["id"] == "r3AAAAAAAAAA"
    assert json.loads(ok(st, "show", "c0000000aaac", "--json"))["header"]["id"] == "c0000000AAAC"
    assert "AMBIGUOUS_ID" in run_cli(st, "show", "C0000000").stderr
    assert store.short_ids(st, ["r3AAAAAAAAAA"]) == {"r3AAAAAAAAAA": "r3AAAAAA"}


def test_fsck_names_sessions_whose_parents_loop_and_exits_1(st: Store) -> None:
    """Seen by hand: a header edited to name its own child as its parent dropped both from every listing,
    and fsck was silent, exit 0."""
    child = next(row.id for row in store.list_children(st, "r3AAAAAAAAAA"))
    value = dict(header_map(st, "r3AAAAAAAAAA"))
    value.update(parent_session=child, origin="subagent", delegation_depth=1)
    write_header_value(st, "r3AAAAAAAAAA", value)
    done = run_cli(st, "store", "fsck", "--json")
    looped = sorted(f["id"] for f in json.loads(done.stdout)["findings"] if f["kind"] == "parent-cycle")
    assert done.returncode == 1 and looped == sorted(["r3AAAAAAAAAA", child]), (done.returncode, looped)


def test_tree_without_root_prints_its_page_with_a_cursor_in_json_as_ls_does(st: Store) -> None:
    """Found by a docs probe: with no ROOT and no --limit, `tree --json` printed a bare list of the 20 newest
    trees and no `next_cursor`, so a script never learned of the rest (the text form said `(more sessions: ...)`)."""
    now = time.time()
    for i in range(17):
        create_session(st, f"s{i:02d}AAAAAAAAA", label=f"extra-{i}", created_at=now - 30 + i)
    doc = json.loads(ok(st, "tree", "--json"))
    assert isinstance(doc, dict) and len(doc["rows"]) == 20 and doc["next_cursor"], doc
    rest = json.loads(ok(st, "tree", "--json", "--cursor", doc["next_cursor"]))
    assert [t["root"] for t in rest["rows"]] == ["r1AAAAAAAAAA", "r0AAAAAAAAAA"] and rest["next_cursor"] is None
    assert [t["root"] for t in doc["rows"]] == [r["id"] for r in json.loads(ok(st, "ls", "--json"))["roots"]]


def test_an_ambiguous_prefix_says_how_many_ids_it_starts(st: Store) -> None:
    """Found by a docs probe: a prefix of 40 ids was said to start 6 (the lookup stopped counting there)."""
    for i in range(12):
        create_session(st, f"q{i:02d}AAAAAAAAA", created_at=time.time() - 1000 + i)
    with pytest.raises(store.AmbiguousIdError) as caught:
        store.resolve_id(st, "q0")
    assert caught.value.message == '"q0" starts 10 session ids (q00AAAAAAAAA, q01AAAAAAAAA, q02AAAAAAAAA, q03AAAAAAAAA, q04AAAAAAAAA, …); type more of it'
    with pytest.raises(store.AmbiguousIdError) as caught:
        store.resolve_id(st, "Q1")  # case-insensitive: also counted whole
    assert caught.value.message.startswith('"Q1" starts 2 session ids (q10AAAAAAAAA, q11AAAAAAAAA)')
    assert "starts 12 session ids" in run_cli(st, "show", "q").stderr
