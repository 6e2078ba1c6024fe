"""An index append's fsync runs after its lock is released, as a log's commit does.

The children index of a parent is appended to by its creators (one entry per
child, fsync'd before ``start`` returns) and by the workers that settle its
children (a ``settled`` row each, not fsync'd). Holding the index's lock
through the device flush made every worker settling a sibling wait for it,
blocked in ``flock``: with 3,000 echo children on this disk a worker waited
115–176 µs per settled row on average, and 18–39 µs with the flush after the
release (the throughput, bound by the host, did not change). The order is read from the system calls of a real
process (``strace``): on the index's descriptor, ``flock(LOCK_UN)`` comes
before ``fsync``, and the fsync still comes before the call returns.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from ..conftest import REPO_ROOT

CREATE = """
import sys
from subagents import store
st = store.Store(sys.argv[1], durability="batched")
store.create_session(st, "p")
print("child", flush=True)
store.create_session(st, "c", parent_session="p")
print("returned", flush=True)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_creations_index_entry_is_fsynced_after_the_index_lock_is_released(tmp_path) -> None:
    trace = tmp_path / "trace"
    root = tmp_path / "store"
    subprocess.run(["strace", "-f", "-qq", "-yy", "-e", "trace=flock,fsync,fdatasync,write", "-o", str(trace),
                    sys.executable, "-c", CREATE, str(root)], check=True, timeout=60, cwd=REPO_ROOT,
                   env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdout=subprocess.DEVNULL)
    lines = trace.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "write(1" in line and "child" in line)
    on_index = re.compile(rf"^\d+\s+(flock|fsync|fdatasync)\(\d+<{re.escape(str(root / 'index' / 'children' / 'p'))}>(?:, (LOCK_\w+))?")
    ops = [m.group(2) or m.group(1) for line in lines[start:] if (m := on_index.match(line))]
    assert ops == ["LOCK_EX", "LOCK_UN", "fsync"], ops
    returned = next(i for i, line in enumerate(lines) if "write(1" in line and "returned" in line)
    assert returned > max(i for i, line in enumerate(lines) if on_index.match(line)), "the call returned before its fsync"
