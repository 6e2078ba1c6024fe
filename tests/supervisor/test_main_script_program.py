"""A program defined in the user's own script (``__main__``) runs with that script's imports and globals.

Found by a probe: ``Provider(program=my_program)``, with ``my_program`` written at the top of a script that
imports ``json`` and defines a constant and a helper, ended every turn ``NameError: name 'json' is not
defined``: dill carried the function but not what it refers to, and the worker's ``__main__`` is not the
script. A callable now travels with the globals it refers to (modules by name, values by value); one that
refers to something no pickle carries is refused when it is registered, naming it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ..conftest import REPO_ROOT

SCRIPT = """
import json, sys, threading
import anyio
from subagents import Supervisor, SupervisorConfig, Provider, SubagentRequest, SubagentError

PREFIX = "answer"
LOCK = threading.Lock()
NUMBERS = (n for n in range(3))  # a generator: no pickle carries one

def helper(x):
    return x * 2

async def my_program(ctx):
    return json.dumps({PREFIX: helper(21)})

async def locked(ctx):
    with LOCK:  # dill carries a lock (a new one, unlocked)
        return "locked"

async def counting(ctx):
    return str(next(NUMBERS))

async def main(store):
    async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="mine", program=my_program))
        root = await sup.open_root(label="main")
        sup.register_provider(Provider(name="locked", program=locked))
        for name in ("mine", "locked"):
            run = await sup.start(name, SubagentRequest(parent=root, prompt="go"))
            print(name, (await run.result()).output)
            await run.dispose()
        try:
            sup.register_provider(Provider(name="counting", program=counting))
        except SubagentError as exc:
            print("counting", exc.code, exc.message)
        else:
            print("counting registered")

anyio.run(main, sys.argv[1])
"""


def test_a_program_written_in_the_users_script_runs_with_its_imports_and_globals(tmp_path) -> None:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "st")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert 'mine {"answer": 42}' in lines, done.stdout + done.stderr[-3000:]
    assert "locked locked" in lines, done.stdout
    counting = next(line for line in lines if line.startswith("counting"))
    assert counting.startswith('counting INVALID_REQUEST the program of provider "counting" cannot be carried') and "generator" in counting, counting
