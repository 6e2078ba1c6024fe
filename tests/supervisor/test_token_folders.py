"""The folder of turn tokens of a host that died without closing its pool (``kill -9``, a second Ctrl-C's
quick exit) is removed by the next pool that starts on the machine.

Found by listing ``/dev/shm`` after the supervisor tests ran: six ``subagents-tokens-*`` folders were left,
one by each host that ended without its pool's close (``test_a_second_ctrl_c_quits_without_waiting_for_the_turns``
left one). Each folder is named for its host's pid and start time, and a pool's start removes those of hosts
no longer running. And a forked copy of a host leaves its host's folder alone.
"""

from __future__ import annotations

import glob
import os
import json
import subprocess
import sys

import pytest

from .test_stopped_worker_not_rebalanced_to import started_pool

pytestmark = pytest.mark.anyio

HOST = r'''
import anyio, glob, json, os, signal
from subagents.supervisor.pool import WorkerPool

async def main() -> None:
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=20, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        print(json.dumps({"pid": os.getpid(), "folders": glob.glob(f"/dev/shm/subagents-tokens-{os.getpid()}-*")}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main)
'''


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no memory file system for tokens")
async def test_the_token_folder_of_a_host_killed_without_closing_goes_at_the_next_pools_start() -> None:
    proc = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-2000:])
    left = json.loads(proc.stdout)
    assert len(left["folders"]) == 1, left  # named for its host (another test's pool may have removed it since)
    async with started_pool(1, 0):
        assert glob.glob(f"/dev/shm/subagents-tokens-{left['pid']}-*") == []


FORKING_HOST = r'''
import anyio, atexit, glob, json, os, sys
from subagents.supervisor.pool import WorkerPool

async def main() -> None:
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=20, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        mine = glob.glob(f"/dev/shm/subagents-tokens-{os.getpid()}-*")
        child = os.fork()
        if child == 0:  # the copy's exit hooks run (``process_hooks``), not its copy of the event loop
            atexit._run_exitfuncs()
            os._exit(0)
        os.waitpid(child, 0)
        print(json.dumps({"before": mine, "after": [path for path in mine if os.path.isdir(path)]}), flush=True)
        await pool.aclose()
        tg.cancel_scope.cancel()

anyio.run(main)
'''


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no memory file system for tokens")
def test_a_forked_copy_of_a_host_leaves_the_hosts_token_folder_alone() -> None:
    """A fork of a host has a copy of its pool; the copy's exit removed the host's folder with the tokens of
    the turns the host had handed over, and the host could take none back from then on."""
    proc = subprocess.run([sys.executable, "-c", FORKING_HOST], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    seen = json.loads(proc.stdout)
    assert len(seen["before"]) == 1 and seen["after"] == seen["before"], seen
