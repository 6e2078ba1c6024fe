"""What a program logs in its worker names the child and epoch of its turn.

Found by a probe: every record a worker logged during a turn (a model call's, a program's own) said
``[child=- epoch=-]``: the filter that fills in ``-`` for records logged outside any turn ran before the one
that adds the turn's fields, which then kept the ``-`` as if the record had set it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HOST = textwrap.dedent(
    """
    import sys, anyio
    from subagents import Provider, SubagentRequest, Supervisor, SupervisorConfig

    async def main(store, as_json):
        config = SupervisorConfig(pool_size=1, durability="none", worker_log_json=as_json == "json")
        async with Supervisor.open(store=store, config=config) as sup:
            sup.register_provider(Provider(name="logs", program="tests.programs_for_tests:logs_a_warning"))
            root = await sup.open_root()
            run = await sup.start("logs", SubagentRequest(parent=root, prompt="go"))
            assert (await run.result()).output == "logged"
            print(run.id, root.id, flush=True)
            await run.dispose()

    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


def host(tmp_path: Path, form: str) -> tuple[str, str, list[str]]:
    done = subprocess.run([sys.executable, "-c", HOST, str(tmp_path / "store"), form], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    child, root = done.stdout.split()
    return child, root, [line for line in done.stderr.splitlines() if "tests.program" in line]


def test_a_programs_log_records_name_its_child_parent_and_epoch(tmp_path: Path) -> None:
    """The parent too, as the supervisor's own records do (found by a docs probe: the worker's format left it out)."""
    child, root, lines = host(tmp_path, "text")
    assert lines == [f"WARNING tests.program: from the task [child={child} parent={root} epoch=1]",
                     f"WARNING tests.program: from a thread [child={child} parent={root} epoch=1]"], lines


def test_a_worker_logs_json_lines_when_its_supervisor_is_told_to(tmp_path: Path) -> None:
    """Found by a docs probe: ``--log-json`` reached the supervisor's records only; a worker's stayed text."""
    child, root, lines = host(tmp_path, "json")
    docs = [json.loads(line) for line in lines]
    assert [(d["level"], d["logger"], d["message"], d["child"], d["parent"], d["epoch"]) for d in docs] == [
        ("WARNING", "tests.program", "from the task", child, root, 1), ("WARNING", "tests.program", "from a thread", child, root, 1)], lines


def test_the_cli_log_json_reaches_the_workers(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", str(tmp_path / "st"), "--log-json",
                           "run", "tests.programs_for_tests:logs_a_warning", "--prompt", "go", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout)["id"]
    docs = [json.loads(line) for line in done.stderr.splitlines() if "tests.program" in line]
    assert [(d["message"], d["child"]) for d in docs] == [("from the task", child), ("from a thread", child)], done.stderr[-3000:]
