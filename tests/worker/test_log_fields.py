"""What a program logs in its worker names the child and epoch of its turn.

Found by a probe: every record a worker logged during a turn (a model call's, a program's own) said
``[child=- epoch=-]``: the filter that fills in ``-`` for records logged outside any turn ran before the one
that adds the turn's fields, which then kept the ``-`` as if the record had set it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HOST = textwrap.dedent(
    """
    import sys, anyio
    from subagents import Provider, SubagentRequest, Supervisor, SupervisorConfig

    async def main(store):
        async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
            sup.register_provider(Provider(name="logs", program="tests.programs_for_tests:logs_a_warning"))
            root = await sup.open_root()
            run = await sup.start("logs", SubagentRequest(parent=root, prompt="go"))
            assert (await run.result()).output == "logged"
            print(run.id, flush=True)
            await run.dispose()

    anyio.run(main, sys.argv[1])
    """
)


def test_a_programs_log_records_name_its_child_and_epoch(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", HOST, str(tmp_path / "store")], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    child = done.stdout.split()[0]
    lines = [line for line in done.stderr.splitlines() if "tests.program" in line]
    assert lines == [f"WARNING tests.program: from the task [child={child} epoch=1]",
                     f"WARNING tests.program: from a thread [child={child} epoch=1]"], done.stderr[-3000:]
