"""``subagents store check [--json]`` (issue 16): ``check_store`` from a shell, exit 1 on a violation."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from subagents import store

from .test_cli import cli, snapshot

OLD = time.time() - 600


def small_store(path: Path) -> tuple[str, str]:
    st = store.Store(path)
    root, child = store.new_id(), store.new_id()
    store.create_session(st, root, created_at=OLD)
    store.create_session(st, child, parent_session=root, origin="subagent", created_at=OLD, events=[
        ("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "p"}),
        ("turn/start", {}), ("turn/end", {"stop_reason": "completed"}),
    ])
    return root, child


def test_a_clean_store(tmp_path: Path) -> None:
    small_store(tmp_path / "st")
    before = snapshot(tmp_path / "st")
    done = cli("--store", "st", "store", "check", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["clean"] is True and report["violations"] == [] and report["counts"]["sessions"] == 2
    text = cli("--store", "st", "store", "check", cwd=tmp_path)
    assert text.returncode == 0 and ": clean; 2 sessions" in text.stdout
    assert snapshot(tmp_path / "st") == before, "check is read-only"


def test_a_violation_exits_1_and_names_the_session(tmp_path: Path) -> None:
    root, child = small_store(tmp_path / "st")
    os.unlink(tmp_path / "st" / "index" / "children" / root)
    done = cli("--store", "st", "store", "check", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    [violation] = json.loads(done.stdout)["violations"]
    assert (violation["session_id"], violation["kind"]) == (child, "index-missing")
    text = cli("--store", "st", "store", "check", cwd=tmp_path)
    assert text.returncode == 1 and re.search(rf"^index-missing\s+{child}\s", text.stdout, re.M), text.stdout


def test_not_a_store(tmp_path: Path) -> None:
    done = cli("--store", "nothing-here", "store", "check", cwd=tmp_path)
    assert done.returncode != 0 and "error:" in done.stderr
