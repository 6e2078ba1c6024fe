"""A process forked from a host never tears down the host's supervisor.

Found by a probe: a host forked while a turn ran, and the child left with ``sys.exit(0)``. The child's
copy of the ``async with`` block unwound and ran the supervisor's close with the parent's workers,
pipes and leases: the parent's turn was cancelled or its worker killed, and ``run.result()`` never
came. The close of a supervisor in any process but the one that opened it does nothing now.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = """
import json, os, sys
import anyio
from subagents import Supervisor, SupervisorConfig, Provider, SubagentRequest
from subagents.store import check_store

store, gate = sys.argv[1], sys.argv[2]
parent = os.getpid()

def script(*actions):
    return json.dumps({"script": list(actions)})

async def main():
    async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=2, durability="none")) as sup:
        sup.register_provider(Provider(name="s", program="script"))
        root = await sup.open_root(label="main")
        run = await sup.start("s", SubagentRequest(parent=root, prompt=script({"hold": gate}, {"return": "a"})))
        await anyio.sleep(0.3)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # unwinds the copied async with, in the child
        with anyio.fail_after(30):
            while not os.waitpid(pid, os.WNOHANG)[0]:
                await anyio.sleep(0.05)
        open(gate, "w").close()
        with anyio.fail_after(30):
            first = await run.result()
            again = await sup.start("s", SubagentRequest(parent=root, prompt=script({"return": "b"})))
            second = await again.result()
        await run.dispose()
        await again.dispose()
        print("results", first.stop_reason, first.output, second.stop_reason, second.output, flush=True)
    print("clean", check_store(store).clean, flush=True)

try:
    anyio.run(main)
finally:
    if os.getpid() != parent:
        os._exit(0)
"""


def test_a_forked_child_that_unwinds_leaves_the_hosts_supervisor_alone(tmp_path) -> None:
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "st"), str(tmp_path / "gate")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "results completed a completed b" in lines and "clean True" in lines, done.stdout + done.stderr[-3000:]
