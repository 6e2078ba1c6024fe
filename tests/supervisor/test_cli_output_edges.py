"""The CLI's stdout when it is not an ordinary file or pipe: closed (``>&-``) or failing its writes (``/dev/full``).

Each test runs the real CLI in a subprocess through ``sh``, which sets up stdout as a user's shell would, with
Python's default, buffered stdout (``PYTHONUNBUFFERED`` unset), since the interpreter's last flush at exit
is where a failing stdout spoke up a second time.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .test_cli_mistakes import CLI, DEADLINE_S, FAST, cli, refused

BUFFERED = {k: v for k, v in FAST.items() if k != "PYTHONUNBUFFERED"}
VERBS = [("ls",), ("ls", "--json"), ("tree",), ("summary",), ("config", "show"), ("store", "check"), ("top", "--once"),
         ("run", "echo", "--prompt", "hi")]


def _through_sh(redirection: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI run by ``sh -c 'exec CLI ARGS REDIRECTION'``, with a buffered stdout."""
    return subprocess.run(["sh", "-c", f'exec "$@" {redirection}', "sh", *CLI, *args], cwd=cwd, env=BUFFERED,
                          capture_output=True, text=True, timeout=DEADLINE_S)


def _seeded(tmp_path: Path) -> None:
    """A store in ``tmp_path/st`` holding one finished run, so that every listing has a row to print."""
    done = cli("--store", "st", "run", "echo", "--prompt", "seed", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("verb", VERBS, ids=[" ".join(v) for v in VERBS])
def test_a_verb_with_stdout_closed_runs_with_its_output_discarded(tmp_path: Path, verb: tuple[str, ...]) -> None:
    """``subagents ls >&-`` (a daemon or a cron job may start it so) was ``INTERNAL``: ``sys.stdout`` is ``None``
    there, and ``Output`` asked it ``isatty()``. The verb runs as with ``> /dev/null``."""
    _seeded(tmp_path)
    done = _through_sh(">&-", "--store", "st", *verb, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_stdout_whose_writes_fail_is_one_os_error_line(tmp_path: Path) -> None:
    """``subagents ls --json > /dev/full`` printed its ``OS_ERROR`` line, then the interpreter's own complaint
    (``Exception ignored in: <_io.TextIOWrapper name='<stdout>'``) as its last flush failed again, and exited
    120. What stdout still held is dropped, as for a closed pipe: one line, exit 2."""
    _seeded(tmp_path)
    done = _through_sh(">/dev/full", "--store", "st", "ls", "--json", cwd=tmp_path)
    assert os.strerror(28) in refused(done, "OS_ERROR")
