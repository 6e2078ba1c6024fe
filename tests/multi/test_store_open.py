"""Several processes opening one fresh store at the same moment.

Regression (multi-supervisor issue): the first process to open a missing
store creates its folders before its ``STORE`` marker; a second process
that looked in between found "a non-empty folder without a marker" and
refused it with ``StoreFormatError``, so several supervisors started
together on a new store failed at random. A folder holding nothing but the
store's own layout is a creation in progress (or one that crashed): it is
completed, never refused. A folder with anything else in it is still refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from subagents.store import Store, StoreFormatError

from ._driver import REPO_ROOT

OPENERS = 5  # processes per store
STORES = 6  # fresh stores, all raced at the same instant (the race lost ~3 rounds in 4 before the fix)

OPEN = textwrap.dedent(
    """
    import sys, time
    from subagents.store import Store
    start = float(sys.argv[2])
    time.sleep(max(0.0, start - time.time() - 0.01))
    while time.time() < start:
        pass
    try:
        Store(sys.argv[1])
        print("ok")
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
    """
)


def test_processes_opening_a_fresh_store_together_all_succeed(tmp_path) -> None:
    """OPENERS processes per store open STORES missing stores at the same instant: every open succeeds."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    start = time.time() + 2.0  # past every interpreter's start-up: they race on the creation itself
    paths = [tmp_path / f"store{i}" for i in range(STORES)]
    procs = [
        subprocess.Popen([sys.executable, "-c", OPEN, str(path), repr(start)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for path in paths
        for _ in range(OPENERS)
    ]
    outputs = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    assert [out for out in outputs if out != "ok"] == []
    for path in paths:
        Store(path, create=False)  # a complete store in the end


def test_a_crashed_creation_is_completed_and_a_foreign_folder_still_refused(tmp_path) -> None:
    """Only the layout's folders, no marker (a creator died before writing it): opened as a new store.
    Any other file in the folder: refused."""
    half = tmp_path / "half"
    for sub in ("sessions", "owners", os.path.join("index", "children")):
        os.makedirs(half / sub)
    Store(half)
    assert (half / "STORE").exists()

    foreign = tmp_path / "foreign"
    os.makedirs(foreign / "sessions")
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreFormatError):
        Store(foreign)
