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

import pytest

from subagents.store import Store, read_header
from subagents.testing import check_store

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "test_parallel_stress.py"


def run_example(tmp_path: Path, *, lanes: int, children: int, workers: int, timeout: float) -> None:
    env = {**os.environ, "STRESS_CHILDREN": str(children), "STRESS_LANES": str(lanes)}
    basetemp = tmp_path / "basetemp"
    command = [sys.executable, "-m", "pytest", "-n", str(workers), "-p", "xdist", "-q", "-p", "no:cacheprovider",
               f"--basetemp={basetemp}", str(EXAMPLE)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{lanes} passed" in done.stdout, done.stdout[-2000:]
    shared = basetemp / "subagents-shared-store"
    st = Store(shared, create=False)
    roots = sorted(read_header(st, s).label for s in st.session_ids() if read_header(st, s).parent_session is None)
    assert roots == [f"lane-{n}" for n in range(lanes)], "every lane wrote into the one shared store"
    report = check_store(shared)
    assert report.clean and report.counts.sessions == lanes * (1 + children), str(report)


def test_the_readme_example_runs(tmp_path: Path) -> None:
    """Two lanes of four children under random kills, one shared store, clean at the end."""
    run_example(tmp_path, lanes=2, children=4, workers=2, timeout=600)


@pytest.mark.stress
def test_the_readme_example_at_full_size(tmp_path: Path) -> None:
    """As the README runs it: four xdist workers, 50 children each (minutes on two cores)."""
    run_example(tmp_path, lanes=4, children=50, workers=4, timeout=1800)


def test_the_readme_quotes_the_example() -> None:
    """The README's example is the file CI runs, not a copy that can drift."""
    readme = (REPO / "README.md").read_text()
    body = EXAMPLE.read_text()
    start = body.index("@pytest.mark.anyio")
    assert body[start:].strip() in readme
