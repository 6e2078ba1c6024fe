"""The CLI's first moments: what it says when stopped while it loads, and the verbs that need no configuration.

Run through the installed ``subagents`` script in a subprocess, as a user's
shell runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subagents.store import Store

DEADLINE_S = 60.0
SCRIPT = shutil.which("subagents", path=os.path.dirname(sys.executable)) or shutil.which("subagents")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}


def _mapped(pid: int, name: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return name in maps.read()
    except OSError:
        return False


@pytest.mark.skipif(SCRIPT is None or not os.path.exists("/proc/self/maps"), reason="needs the installed script and /proc")
@pytest.mark.parametrize("library", ["pydantic_core", "msgpack"])
def test_ctrl_c_while_the_cli_loads_says_interrupted_without_a_traceback(tmp_path: Path, library: str) -> None:
    """Found by a probe: a Ctrl-C in the first second of any verb printed a KeyboardInterrupt traceback (the
    CLI's modules load before its error boundary). The signal is sent once the process maps ``library``, an
    import the CLI makes while it loads; whenever it lands after that, the answer is ``interrupted``, 130."""
    Store(tmp_path / "store", create=True)
    process = subprocess.Popen([SCRIPT, "--store", str(tmp_path / "store"), "top", "--interval", "1"], cwd=tmp_path,
                               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not _mapped(process.pid, library) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=DEADLINE_S)
    finally:
        process.kill()
        process.wait()
    assert "Traceback" not in err, err
    assert process.returncode == 130, (process.returncode, err)
    assert err.strip().endswith("interrupted"), err


@pytest.mark.skipif(SCRIPT is None, reason="needs the installed script")
@pytest.mark.parametrize("broken", [{"SUBAGENTS_POOL_SIZE": "many"}, {"SUBAGENTS_CONFIG": "/nonexistent/subagents.toml"}])
def test_completion_works_beside_a_broken_configuration(tmp_path: Path, broken: dict[str, str]) -> None:
    """Found by a probe: ``subagents completion bash`` failed with the configuration's error, though it prints
    shell code and reads no setting; a user fixing their configuration still wants completion."""
    done = subprocess.run([SCRIPT, "completion", "bash"], cwd=tmp_path, env={**ENV, **broken}, capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert "complete" in done.stdout
    ls = subprocess.run([SCRIPT, "ls"], cwd=tmp_path, env={**ENV, **broken}, capture_output=True, text=True, timeout=DEADLINE_S)
    assert ls.returncode == 2 and "error: " in ls.stderr, ls.stderr  # a verb that reads settings still says what is wrong
