"""A one-shot ``start`` under a parent no live agent holds races ``gc`` safely (found by a probe).

``start`` takes any parent session the store holds, without opening it. A gc collecting that
parent's subtree re-read its children index under the parent's lock, and a child published and
indexed outside that lock could fall between the re-read and the rename: the parent went, the child
stayed, listed nowhere and never collected (9 and 10 orphans in two runs of the probe's loop). The
child is now created under the parent's lock: here gc holds it (a descriptor of the test), moves the
parent away, and the waiting ``start`` is refused ``NO_PARENT`` with nothing written.
"""

from __future__ import annotations

import fcntl
import os

import anyio
import pytest

from subagents.store import SubagentError, create_session
from subagents.supervisor import SubagentRequest

from ..conftest import DEADLINE_S, open_supervisor
from ..store.test_retention import opened_elsewhere, to_trash

pytestmark = pytest.mark.anyio


async def test_a_start_under_a_parent_gc_removes_meanwhile_is_refused(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        create_session(sup.store, "rOld", label="old")  # a root no supervisor holds
        before = set(os.listdir(sup.store.sessions_dir))
        holder = os.open(sup.store.session_path("rOld"), os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)
        refused: list[BaseException] = []

        async def start() -> None:
            try:
                await sup.start("echo", SubagentRequest(parent="rOld", prompt="hi"))
            except SubagentError as exc:
                refused.append(exc)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                with anyio.fail_after(DEADLINE_S):
                    while not opened_elsewhere(sup.store.session_path("rOld"), holder):
                        await anyio.sleep(0.005)
                to_trash(sup.store, "rOld")
                os.close(holder)
                holder = -1
        finally:
            if holder >= 0:
                os.close(holder)
        assert [e.code for e in refused] == ["NO_PARENT"], refused
        assert set(os.listdir(sup.store.sessions_dir)) == before - {"rOld"}  # no child left behind


async def test_a_start_under_a_settled_root_runs(tmp_path) -> None:
    async with open_supervisor(tmp_path) as sup:
        create_session(sup.store, "rOld", label="old")
        run = await sup.start("echo", SubagentRequest(parent="rOld", prompt="hi"))
        with anyio.fail_after(DEADLINE_S):
            assert (await run.result()).output == "hi"
        await run.dispose()
        assert [c.id for c in await sup.list_children("rOld")] == [run.id]


GC_LOOP = """
import sys, time
from subagents.store import Store, collect
store = Store(sys.argv[1], create=False)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    collect(store, 0.0)
"""


async def test_a_root_being_opened_is_never_collected_by_a_gc_of_any_age(tmp_path) -> None:
    """``open_root`` created its root unleased and took the lease after: a ``gc --older-than 0s`` in another
    process collected it in between, and ``open_root`` failed SESSION_NOT_FOUND for the root it had just
    made (found by a probe: 100 of 660 opens). A new root is created already leased (idle, epoch 1)."""
    import subprocess
    import sys

    from subagents.store import read_lease

    from .test_cli_control import REPO, cli_env

    failures: list[BaseException] = []
    async with open_supervisor(tmp_path) as sup:
        gc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(sup.store.root), "30"], cwd=REPO, env=cli_env(),
                              stdout=subprocess.PIPE, text=True)
        try:
            assert gc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            with anyio.fail_after(DEADLINE_S):
                for _ in range(300):
                    try:
                        root = await sup.open_root(label="new")
                    except SubagentError as exc:
                        failures.append(exc)
                        continue
                    lease = read_lease(sup.store, root.id)
                    assert lease is not None and (lease.epoch, lease.state) == (1, "idle")
        finally:
            gc.kill()
            gc.communicate(timeout=DEADLINE_S)
    assert failures == []
