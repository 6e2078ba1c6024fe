"""A worker that cannot start: ``Supervisor.open`` and the CLI report one typed error, not a group or a traceback.

Each case runs a real host in a subprocess whose environment breaks only the
processes it starts afterwards (its own interpreter is already up): a
``PYTHONHOME`` with no standard library makes a new interpreter exit at
once, and a ``sitecustomize`` that sleeps in a worker makes it hang before
``Ready``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO_ROOT

DEADLINE_S = 60.0

# the host: breaks the environment its workers inherit, opens a supervisor, prints what open raised
HOST = """
import json, os, sys
import anyio
from subagents.store.errors import SubagentError
from subagents.supervisor import Supervisor, SupervisorConfig

store, method, breakage, hang_dir = sys.argv[1:5]
if breakage == "exit":
    os.environ["PYTHONHOME"] = "/nonexistent-python-home"
else:
    os.environ["PYTHONPATH"] = hang_dir

async def main():
    config = SupervisorConfig(pool_size=2, start_method=method, durability="none", worker_ready_timeout_s=1.5)
    try:
        async with Supervisor.open(store, config):
            pass
    except BaseException as exc:
        code = exc.code if isinstance(exc, SubagentError) else None
        fields = exc.fields if isinstance(exc, SubagentError) else None
        print(json.dumps({"type": type(exc).__name__, "code": code, "message": str(exc), "fields": fields}))
    else:
        print(json.dumps({"type": None}))

anyio.run(main)
"""

# the CLI with the same breakage: PYTHONHOME set once the CLI's own interpreter is up
CLI = """
import os, sys
os.environ["PYTHONHOME"] = "/nonexistent-python-home"
from subagents.supervisor.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = REPO_ROOT
    env.update(extra)
    return env


def _open(tmp_path: Path, method: str, breakage: str) -> dict:
    hang_dir = tmp_path / "hang"
    hang_dir.mkdir()
    # only a worker hangs (spawn's resource tracker, started the same way, must not hold the host's stdout)
    (hang_dir / "sitecustomize.py").write_text(
        "import sys, time\nif '--multiprocessing-fork' in sys.orig_argv:\n    time.sleep(30)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", HOST, str(tmp_path / "store"), method, breakage, str(hang_dir)],
        env=_env(), capture_output=True, text=True, timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_that_exits_before_ready_is_a_worker_start_error(tmp_path, method):
    """Issue 11: a worker that cannot start surfaced as ExceptionGroup[TimeoutError] or EOFError."""
    raised = _open(tmp_path, method, "exit")
    assert (raised["type"], raised["code"]) == ("WorkerStartError", "WORKER_START_FAILED"), raised
    if method == "spawn":  # the worker itself started and exited: its pid and exit code are named
        assert raised["message"] == f"worker process {raised['fields']['pid']} exited with code 1 before it was ready"
        assert raised["fields"]["exitcode"] == 1
    else:  # the forkserver that forks the workers died before forking one: the pipe to it says so
        # as EOF on the read or a broken pipe on the write, whichever its death came before
        assert raised["message"] in (
            "a worker process could not be started (start method forkserver): EOFError: unexpected EOF",
            "a worker process could not be started (start method forkserver): BrokenPipeError: [Errno 32] Broken pipe",
        ), raised


def test_a_worker_that_never_announces_itself_is_killed_and_named(tmp_path):
    """Issue 11: a worker hanging before ``Ready`` ends the open after ``worker_ready_timeout_s`` with a typed error."""
    raised = _open(tmp_path, "spawn", "hang")
    assert (raised["type"], raised["code"]) == ("WorkerStartError", "WORKER_START_FAILED"), raised
    pid = raised["fields"]["pid"]
    assert raised["message"] == f"worker process {pid} was not ready within 1.5s (worker_ready_timeout_s) and was killed"
    assert not Path(f"/proc/{pid}").exists()


def test_the_cli_prints_one_error_line_without_a_traceback(tmp_path):
    """Issue 11: the CLI said INTERNAL with a traceback."""
    done = subprocess.run(
        [sys.executable, "-c", CLI, "--store", str(tmp_path / "store"), "run", "echo", "--prompt", "hi"],
        env=_env(SUBAGENTS_START_METHOD="spawn", SUBAGENTS_POOL_SIZE="1", SUBAGENTS_DURABILITY="none"),
        capture_output=True, text=True, timeout=DEADLINE_S, cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # two dying interpreters (the worker, and the helper process its start method spawns) write their
    # fatal-error dumps to the same stderr, in several writes each, before, after or around the CLI's
    # one line: that line can land inside one of theirs, so it is looked for anywhere, exactly once
    found = re.findall(r"error: [A-Z_]+: .*?before it was ready|error: [A-Z_]+: [^\n]*", done.stderr)
    assert len(found) == 1, done.stderr
    assert re.fullmatch(r"error: WORKER_START_FAILED: worker process \d+ exited with code 1 before it was ready", found[0]), done.stderr
