"""The CLI's first moments: what it says when stopped while it loads, what it loads, and the verbs that need no configuration.

Run through the installed ``subagents`` script in a subprocess, as a user's
shell runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import json
import time
from pathlib import Path

import pytest

from subagents.store import Store, create_session, new_id

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


# What a run of the CLI loaded, in a fresh interpreter: ``subagents.console.main`` with ``argv``, then its exit
# code and the names in ``sys.modules`` written to ``out`` (JSON; ``--version`` and ``--help`` exit 0 by SystemExit).
_LOADED = """
import json, sys
out, sys.argv = sys.argv[1], ["subagents", *sys.argv[2:]]
code = None
try:
    from subagents.console import main
    code = main()
except SystemExit as exc:
    code = exc.code
finally:
    with open(out, "w") as f:
        json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""
# the supervisor's runtime and the worker's: what starts workers and hosts turns
_RUNTIME = ["anyio", "asyncio", "multiprocess", "dill", "openai", "jsonschema", "subagents.supervisor.service",
            "subagents.supervisor.runtime", "subagents.supervisor.pool", "subagents.supervisor.oneshot",
            "subagents.supervisor.continuable", "subagents.worker.main", "subagents.worker.runner", "subagents.worker.turn",
            "subagents.worker.programs"]
# what the maintenance verbs run (the whole-store check, fsck, migration) and shell completion
_MAINTENANCE = ["subagents.store.check", "subagents.store.fsck", "subagents.store.migrate", "argcomplete"]
# the layered configuration (pydantic models) and terminal tables
_CONFIG = ["subagents.supervisor.config_loader", "subagents.supervisor.config", "subagents.supervisor.models", "rich"]
# the store's read path: the records' models and their encoding
_STORE = ["pydantic", "msgpack", "subagents.store.records", "subagents.store.root", "subagents.store.reader",
          "subagents.store.catalog", "subagents.store.roots"]


def _loaded(tmp_path: Path, *argv: str) -> set[str]:
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", _LOADED, str(out), *argv], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert out.exists(), done.stderr
    found = json.loads(out.read_text())
    assert found["code"] in (0, None), done.stderr
    return set(found["modules"])


def _a_session(store: Store) -> str:
    """A root with one finished-looking subagent child; the root's id."""
    root = new_id()
    create_session(store, root)
    create_session(store, new_id(), parent_session=root, origin="subagent",
                   events=[("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "echo"})])
    return root


def _among(loaded: set[str], heavy: list[str]) -> list[str]:
    return sorted(name for name in loaded if any(name == h or name.startswith(h + ".") for h in heavy))


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["ls", "--help"]])
def test_version_and_help_load_no_runtime_no_configuration_and_no_store(tmp_path: Path, argv: list[str]) -> None:
    """``subagents --version`` loaded the supervisor's whole runtime, the worker's and the whole store (~0.4 s before
    the first byte, ~20x a bare Python): the package ``subagents.supervisor`` imported its service on the way to the
    CLI, ``subagents.store`` every module of its own, and the verbs' modules the store's views at their top. What
    these print is known to the parser: no configuration, no store, and ``importlib.metadata`` only for
    ``--version``."""
    heavy = _RUNTIME + _MAINTENANCE + _CONFIG + _STORE + ([] if argv == ["--version"] else ["importlib.metadata"])
    assert _among(_loaded(tmp_path, *argv), heavy) == []


@pytest.mark.parametrize("verb", ["ls", "show", "tree", "log"])
def test_read_only_views_load_no_runtime(tmp_path: Path, verb: str) -> None:
    """The read-only views read the store (its records' models, so pydantic and msgpack) and start no worker:
    neither the supervisor's runtime nor the worker's is loaded for them (shell loops run ``ls`` and ``show``)."""
    store = Store(tmp_path / "store", create=True)
    ids = [] if verb == "ls" else [_a_session(store)]
    loaded = _loaded(tmp_path, "--store", str(tmp_path / "store"), verb, *ids)
    assert "subagents.store.reader" in loaded  # the view did read the store
    assert _among(loaded, _RUNTIME + _MAINTENANCE) == []


@pytest.mark.parametrize("verb", ["ls", "show"])
@pytest.mark.parametrize("where", ["flag", "environment", "default"])
def test_ls_and_show_of_the_default_configuration_build_none_of_its_models(tmp_path: Path, verb: str, where: str) -> None:
    """``ls`` and ``show`` built the whole layered configuration's pydantic models (~30 ms a start, paid once per
    line of a shell loop), though all they read of it is the store's path and durability. With no deployment file
    and no ``SUBAGENTS_*`` variable but ``SUBAGENTS_STORE``, every setting is the embedded default, which is valid:
    those two are read plainly, and the models are built only for a verb that reads more."""
    store = Store(tmp_path / ("store" if where != "default" else ".subagents"), create=True)
    ids = [] if verb == "ls" else [_a_session(store)]
    argv = ["--store", str(tmp_path / "store")] if where == "flag" else []
    env = {**ENV, "SUBAGENTS_STORE": str(tmp_path / "store")} if where == "environment" else ENV
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", _LOADED, str(out), *argv, verb, *ids], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=DEADLINE_S)
    found = json.loads(out.read_text())
    assert found["code"] in (0, None), done.stderr
    loaded = set(found["modules"])
    assert "subagents.store.reader" in loaded  # the view did read the store
    assert _among(loaded, ["subagents.supervisor.config_loader", "subagents.supervisor.config",
                           "subagents.supervisor.models"]) == []
