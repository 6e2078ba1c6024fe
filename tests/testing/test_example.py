"""The README's stress-test example runs as written (issue 16), at a small size.

``examples/test_parallel_stress.py`` is run the way a user runs it: a separate
pytest under xdist (two workers here), no conftest, the plugin from the
installed package; ``STRESS_CHILDREN`` / ``STRESS_LANES`` shrink it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from subagents.store import Store, read_header
from subagents.testing import check_store

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "test_parallel_stress.py"


def test_the_readme_example_runs(tmp_path: Path) -> None:
    """Two lanes of four children under random kills, one shared store, clean at the end."""
    env = {**os.environ, "STRESS_CHILDREN": "4", "STRESS_LANES": "2"}
    basetemp = tmp_path / "basetemp"
    command = [sys.executable, "-m", "pytest", "-n", "2", "-p", "xdist", "-q", "-p", "no:cacheprovider",
               f"--basetemp={basetemp}", str(EXAMPLE)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]
    shared = basetemp / "subagents-shared-store"
    st = Store(shared, create=False)
    roots = sorted(read_header(st, s).label for s in st.session_ids() if read_header(st, s).parent_session is None)
    assert roots == ["lane-0", "lane-1"], "both lanes wrote into the one shared store"
    report = check_store(shared)
    assert report.clean and report.counts.sessions == 2 + 2 * 4, str(report)


def test_the_readme_quotes_the_example() -> None:
    """The README's example is the file CI runs, not a copy that can drift."""
    readme = (REPO / "README.md").read_text()
    body = EXAMPLE.read_text()
    start = body.index("@pytest.mark.anyio")
    assert body[start:].strip() in readme
