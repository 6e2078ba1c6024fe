"""The pytest plugin seen from a user's project (issue 16): pytester runs without any conftest.

The plugin comes from the ``pytest11`` entry point of the installed package.
Each run happens in a subprocess (``runpytest_subprocess``), as a user's would.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from subagents.store import Store, read_header

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
PLUGIN_FIXTURES = {"subagents_store", "shared_subagents_store", "supervisor", "subagents_root", "subagents_chaos"}

USER_TESTS = '''
import json
import pytest
from subagents import SubagentRequest
from subagents.testing import check_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.subagents(pool_size=1, durability="none")
async def test_a_child(supervisor, subagents_root, subagents_store):
    prompt = json.dumps({"script": [{"say": "hello"}, {"return": "done"}]})
    run = await supervisor.start("script", SubagentRequest(parent=subagents_root, prompt=prompt))
    assert (await run.result()).output == "done"
    await run.dispose()
    assert check_store(subagents_store).clean


def test_two_stores_are_fresh(subagents_store, tmp_path):
    assert subagents_store.parent == tmp_path
    assert not any((subagents_store / "sessions").iterdir())
'''


def test_fixtures_without_a_conftest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    """``--strict-markers`` accepts ``subagents``; ``--markers`` documents it."""
    pytester.makepyfile(test_m="import pytest\n@pytest.mark.subagents(pool_size=1)\ndef test_x():\n    pass\n")
    pytester.runpytest_subprocess("--strict-markers", "-q").assert_outcomes(passed=1)
    assert any("@pytest.mark.subagents" in line for line in pytester.runpytest_subprocess("--markers").outlines)


SHARED_TESTS = '''
import time
from subagents.store import Store, create_session, new_id, read_header


def test_sees_the_other_worker(shared_subagents_store, worker_id):
    st = Store(shared_subagents_store)
    create_session(st, new_id(), label=worker_id)
    deadline = time.monotonic() + 60
    labels = set()
    while time.monotonic() < deadline and len(labels) < 2:
        labels = {read_header(st, s).label for s in st.session_ids()}
        time.sleep(0.01)  # polling the other worker's writes, under a deadline
    assert labels == {"gw0", "gw1"}
'''


def test_the_shared_store_is_one_store_for_every_xdist_worker(pytester: pytest.Pytester) -> None:
    """Under ``-n 2`` each worker writes a session and sees the other's; the store outlives both workers."""
    pytester.makepyfile(test_shared=SHARED_TESTS)
    basetemp = pytester.path / "basetemp"
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "each", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}")
    result.assert_outcomes(passed=2)
    st = Store(basetemp / "subagents-shared-store", create=False)
    assert sorted(read_header(st, s).label for s in st.session_ids()) == ["gw0", "gw1"]


def test_a_failing_chaos_test_reports_its_seed(pytester: pytest.Pytester) -> None:
    """The seed and the replay command appear in the failure report; ``--subagents-chaos-seed`` fixes it."""
    pytester.makepyfile(test_c='''
import subprocess, sys, time
from subagents.testing import processes

def test_fails(subagents_chaos):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with subagents_chaos({"sleeper": processes(proc)}, interval_s=(0.001, 0.002), actions=("kill",), max_actions=1) as chaos:
            proc.wait(timeout=30)
        assert False, "the chaos killed it"
    finally:
        proc.kill()
        proc.wait()
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "--subagents-chaos-seed=4242")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*subagents chaos*", "*replay: pytest --subagents-chaos-seed=4242 test_c.py::test_fails*",
                                 "*chaos seed=4242 #0 *kill sleeper pid*"])


def test_plugin_fixture_names_are_not_the_projects() -> None:
    """The plugin loads into this project's own runs too: none of its fixtures shadows one of ours."""
    ours = set()
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any("fixture" in ast.unparse(d) for d in node.decorator_list):
                    ours.add(node.name)
    assert ours and not (ours & PLUGIN_FIXTURES), ours & PLUGIN_FIXTURES


def test_without_an_anyio_backend_of_its_own_a_test_runs_on_asyncio_and_its_trio_copy_is_skipped(pytester: pytest.Pytester) -> None:
    """Found by a probe: with trio installed (the test extra has it), anyio's plugin runs each ``@pytest.mark.anyio``
    test on asyncio and on trio, and the README's test, which defines no ``anyio_backend``, errored on trio
    (the supervisor refuses it). The fixture skips that copy, saying how to run on asyncio alone."""
    pytest.importorskip("trio")
    pytester.makepyfile(test_user=USER_TESTS.replace('@pytest.fixture\ndef anyio_backend():\n    return "asyncio"\n', ""))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*the supervisor runs on asyncio*anyio_backend*"])
