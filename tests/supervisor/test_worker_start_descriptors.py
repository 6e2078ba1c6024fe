"""A host with too few file descriptors to start a worker says so in one line, and leaves no traceback.

Found by a probe (``ulimit -n 16; subagents run echo``): the forkserver's connection takes a socket
and two pipes at once, and when a pipe failed (``EMFILE``) after the socket had connected, the
forkserver read an end of file where it expected descriptors, printed multiprocess's ``EOFError``
traceback on the host's stderr and died, before the host's own ``error: WORKER_START_FAILED`` line.
The pool now makes sure the descriptors are there before it asks the forkserver.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from subagents.store import check_store

from .test_cli import FAST


def _limited(limit: int):  # type: ignore[no-untyped-def]
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return set_limit


def test_a_run_short_of_descriptors_fails_in_one_line_and_leaves_the_store_clean(tmp_path: Path) -> None:
    outcomes = {}
    for limit in range(14, 20):  # from "no worker starts" up to "the run completes", through the window between
        store = tmp_path / f"st{limit}"
        done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", str(store), "run", "echo", "--prompt", "hi"],
                              env=FAST, capture_output=True, text=True, timeout=60, preexec_fn=_limited(limit))
        outcomes[limit] = done.returncode
        if done.returncode != 0:
            assert done.returncode == 2, (limit, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: WORKER_START_FAILED: "), (limit, done.stderr)
            assert "file descriptor" in lines[0], (limit, done.stderr)
        if (store / "STORE").exists():
            report = check_store(str(store))
            assert report.clean, (limit, str(report))
    assert 2 in outcomes.values(), outcomes  # the limits reached the failure at all


REPLACEMENT_HOST = """
import json, os, resource, sys
import anyio
from subagents import Capabilities, Provider, SubagentError, SubagentRequest, Supervisor, SupervisorConfig

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
said = []

async def one(sup, root, provider, prompt):
    try:
        with anyio.fail_after(30):
            run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt))
            result = await run.result()
            await run.dispose()
            return result.stop_reason
    except SubagentError as exc:
        return exc.code

async def main():
    async with Supervisor.open(store=sys.argv[1], config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="echo", program="echo", capabilities=Capabilities.all()))
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all()))
        root = await sup.open_root(label="r")
        said.append(await one(sup, root, "echo", "warm"))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for _ in range(3):  # enough to start a turn, too few to start a worker
            os.close(held.pop())
        said.append(await one(sup, root, "script", json.dumps({"script": [{"exit": 1}]})))  # its worker dies
        await anyio.sleep(1.0)  # the replacement fails meanwhile
        said.append(sup.statistics().pool.workers_alive)
        for fd in held:
            os.close(fd)
        said.append(await one(sup, root, "echo", "after"))
    print(json.dumps(said))

anyio.run(main)
"""


def test_a_worker_that_cannot_be_replaced_for_want_of_descriptors_leaves_the_supervisor_running(tmp_path: Path) -> None:
    """Found by the same probe: the replacement of a dead worker raised ``WORKER_START_FAILED`` out of the
    pool's watch task, which took the supervisor's task group down: the host's ``async with`` raised an
    ``ExceptionGroup``. The pool now tries the replacement again, with backoff, until it starts."""
    script = tmp_path / "host.py"
    script.write_text(REPLACEMENT_HOST)
    store = tmp_path / "st"
    done = subprocess.run([sys.executable, str(script), str(store)], env=FAST, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    warm, killer, alive, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert (warm, killer, alive, after) == ("completed", "error", 0, "completed"), done.stdout
    assert "could not be replaced" in done.stderr, done.stderr[-3000:]
    report = check_store(str(store))
    assert report.clean, str(report)
