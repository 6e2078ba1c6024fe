"""``subagents log ROOT --follow`` of a top-level session with no events yet.

Found by a probe: plain ``log ROOT`` says where a top-level session's work is (its
children), since an empty screen reads as a hang or a bug; ``log ROOT --follow``
printed nothing at all and waited, the very empty screen. It says the same first
now, then follows as before (a root's log grows when it takes messages).
"""

from __future__ import annotations

import select
import signal
import subprocess
import sys
from pathlib import Path

from subagents import store
from subagents.store import Store, create_session

from .test_cli import FAST

FIRST_LINE_S = 20.0


def test_log_follow_of_an_empty_root_says_where_the_work_is_then_follows(tmp_path: Path) -> None:
    st = Store(tmp_path / "st", durability="none")
    root = store.new_id()
    create_session(st, root, events=[])
    proc = subprocess.Popen([sys.executable, "-m", "subagents.supervisor.cli", "--store", "st", "log", root, "--follow"],
                            cwd=tmp_path, env=FAST, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], FIRST_LINE_S)
        assert ready, f"log --follow printed nothing in {FIRST_LINE_S:.0f} s"
        first = proc.stdout.readline()
        assert first.strip() == f"(no events: a top-level session's work is in its children (`subagents tree {root}`))"
        assert proc.poll() is None  # still following
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
