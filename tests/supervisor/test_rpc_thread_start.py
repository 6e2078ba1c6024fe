"""A program's request that its host cannot serve for want of a thread says ``THREAD_START_FAILED``, as the
host's public calls do, not ``RPC_FAILED: RuntimeError: can't start new thread`` (found by the edge probes).

The host runs in a process of its own. Once its child's turn runs, it sets its thread stack size past what
the kernel will map (a real ``can't start new thread``) and lets the program ask for its children many times at
once (``list_agents`` reads the store on one of anyio's worker threads, and the host keeps only a few idle),
then sets it back once the program says it has its answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HOST = r'''
import json, os, sys, threading, anyio
from subagents import Supervisor, SupervisorConfig, SubagentRequest
from subagents.supervisor import Provider

async def main(tmp: str) -> None:
    go, done = os.path.join(tmp, "go"), os.path.join(tmp, "done")
    async with Supervisor.open(store=os.path.join(tmp, "store"), config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="lister", program="tests.programs_for_tests:lists_at_a_signal"))
        root = await sup.open_root()
        run = await sup.start("lister", SubagentRequest(parent=root, prompt=f"{go} {done}"))
        threading.stack_size(1 << 40)  # no thread can be made from here on: the kernel maps no 1 TiB stack
        try:
            open(go, "w").close()
            with anyio.fail_after(20):
                while not os.path.exists(done):
                    await anyio.sleep(0.02)
        finally:
            threading.stack_size(0)
        with anyio.fail_after(20):
            result = await run.result()
        await run.dispose()
        print(json.dumps({"stop_reason": result.stop_reason, "output": result.output}), flush=True)

anyio.run(main, sys.argv[1])
'''


def test_a_program_request_that_cannot_make_a_thread_says_thread_start_failed(tmp_path: Path) -> None:
    """Every answer is ``ok`` or ``THREAD_START_FAILED`` (at least one the latter), and the host logs no traceback."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", HOST, str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=root)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    [line] = proc.stdout.splitlines()
    outcome = json.loads(line)
    assert outcome["stop_reason"] == "completed", outcome
    answers = json.loads(outcome["output"])
    assert "THREAD_START_FAILED" in answers and set(answers) <= {"ok", "THREAD_START_FAILED"}, (answers, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
