"""A store operation run once per job in a forked process that SIGKILLs itself right after its N-th
change (``store/steps.py``): one interpreter start for every kill. For the crash tests of ``migrate``
and ``reindex``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.store._support import REPO_ROOT

# reads "<store> <kill after>" lines; runs CALL on each store (``path``) in a forked child that kills
# itself after that step (IMPORTS brings the operation's ``KILL_AFTER_ENV``); prints how each ended
_DRIVER = r"""
import json, os, sys
IMPORTS
for line in sys.stdin:
    path, after = line.split()
    pid = os.fork()
    if pid == 0:
        os.environ[KILL_AFTER_ENV] = after
        try:
            CALL
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(json.dumps([path, os.WTERMSIG(status) if os.WIFSIGNALED(status) else None]), flush=True)
"""


def run_killed_after(jobs: list[tuple[Path, int]], *, imports: str, call: str) -> dict[str, int | None]:
    """``call`` on each job's store in a process killed after the job's step; the signal each died of
    (``None``: it finished)."""
    driver = _DRIVER.replace("IMPORTS", imports).replace("CALL", call)
    done = subprocess.run([sys.executable, "-c", driver], input="".join(f"{p} {n}\n" for p, n in jobs), capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(line) for line in done.stdout.splitlines())
