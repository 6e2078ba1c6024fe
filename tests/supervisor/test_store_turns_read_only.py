"""A store that stops taking writes while a supervisor runs on it (its owner ran ``chmod -R a-w``, a disk
remounted read-only): what was committed is still returned, and the supervisor keeps going and closes.

Found by a probe run as another user: a one-shot child whose turn committed its output just before the
store turned read-only came back as ``SESSION_UNAVAILABLE`` and its output was never shown (the
supervisor's release of the child's lease raised out of the run, although the child's log says
``completed``); the heartbeat's failure ended the whole supervisor; its close raised the failed release
of its root. The supervisor runs as ``nobody`` (``tests/other_user.py``), so the permission bits bind it.
"""

from __future__ import annotations

import importlib
import json
import os
import time

import anyio
import multiprocess

from subagents import store as st
from subagents.supervisor import ContinuableSpec, Provider, SubagentRequest, Supervisor, SupervisorConfig

from ..other_user import NOBODY, as_nobody, shared_folder


def _chmod_tree(path: str, *, writable: bool) -> None:
    for folder, _, files in os.walk(path):
        os.chmod(folder, 0o755 if writable else 0o555)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644 if writable else 0o444)


def test_a_committed_result_survives_a_store_that_turns_read_only_before_its_release():
    with shared_folder() as folder:
        path = os.path.join(folder, "store")
        gate, child_file = os.path.join(folder, "gate"), os.path.join(folder, "child")
        os.chmod(folder, 0o777)  # the run writes the child's id beside the store
        st.Store(path)
        for sub, _, files in os.walk(path):
            os.chown(sub, NOBODY, NOBODY)
            for name in files:
                os.chown(os.path.join(sub, name), NOBODY, NOBODY)

        async def run_it() -> tuple[str | None, str | None, list[str]]:
            # ``fork``: a worker made by exec would need the interpreter's files, which nobody may not read
            config = SupervisorConfig(pool_size=2, start_method="fork", durability="none", lease_ttl_s=0.6, cancel_grace_s=0.5)
            async with Supervisor.open(store=path, config=config) as sup:
                sup.register_provider(Provider(name="script", program="script"))
                sup.register_provider(Provider(name="cont", program="script", continuable=True))
                root = await sup.open_root()
                # still running when the store turns read-only and when the supervisor closes: its release
                # at close is refused too
                never = json.dumps({"script": [{"hold": os.path.join(folder, "never")}]})
                await sup.start_continuable(ContinuableSpec(parent=root, provider="cont", label="running", prompt=never))
                script = {"script": [{"hold": gate}, {"return": "the output"}]}
                run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps(script)))
                with open(child_file, "w") as handle:
                    handle.write(run.id)
                with anyio.fail_after(30):
                    result = await run.result()
                    await anyio.sleep(1.0)  # heartbeats (every 0.2 s) the store refuses
                    listed = [row.id for row in await sup.list_children(root.id)]
                await run.dispose()
            return result.output, result.stop_reason, listed

        started = []

        def open_the_gate_once_the_turn_runs() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    child = open(child_file).read()
                    if child and any(e["type"] == "turn/start" for e in st.inspect(st.Store(path), child).events):
                        started.append(child)
                        _chmod_tree(path, writable=False)
                        open(gate, "w").close()
                        return
                except (OSError, st.SubagentError):
                    pass
                time.sleep(0.02)

        import threading

        # what the pool and the worker import on first use: nobody may not read the interpreter's own files
        ctx = multiprocess.get_context("fork")
        ctx.Pipe(duplex=True)
        importlib.import_module("multiprocess.popen_fork")
        importlib.import_module("subagents.worker.programs.script")

        opener = threading.Thread(target=open_the_gate_once_the_turn_runs)
        opener.start()
        try:
            outcome = as_nobody(lambda: anyio.run(run_it), timeout_s=60)
        finally:
            opener.join()
            _chmod_tree(path, writable=True)
        assert started, f"the turn never started: {outcome}"
        assert outcome[0] == "ok" and outcome[1][:2] == ("the output", "completed"), outcome
        assert started[0] in outcome[1][2] and len(outcome[1][2]) == 2, outcome  # the one-shot and the running child
