"""A supervisor whose ``async with`` is never left is closed when its event loop ends, in bounded time.

Found by a probe: a host entered ``Supervisor.open(...)`` by hand (``await cm.__aenter__()``), started a
child, and returned from ``main`` without leaving it. At the loop's end asyncio cancelled the
supervisor's tasks, then finalised the context manager in a task of its own, and the close waited
for good for a result that only the cancelled tasks could deliver: the process never exited. Dropped
while the loop still ran, the context manager was collected, and its close cancelled the host's own
``main`` (the task the supervisor's task group was entered in).

Now a supervisor stays open until its loop ends however its context manager is dropped, and the
close at the loop's end stops the workers, releases the roots and writes nothing through tasks that
are gone; a warning says the ``async with`` was never left. The store is left as a crashed host's
is: the next supervisor finds every child settled or resumable.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import anyio
import pytest

from subagents import Supervisor, SupervisorConfig, Provider
from subagents.store import check_store

SCRIPT = """
import gc, json, sys
import anyio
from subagents import Supervisor, SupervisorConfig, Provider, SubagentRequest, ContinuableSpec

store, busy, how = sys.argv[1], sys.argv[2], sys.argv[3]
KEEP = {}

def script(*actions):
    return json.dumps({"script": list(actions)})

async def main():
    cm = Supervisor.open(store=store, config=SupervisorConfig(pool_size=2, durability="none", cancel_grace_s=0.5))
    sup = await cm.__aenter__()
    sup.register_provider(Provider(name="s", program="script", continuable=True))
    root = await sup.open_root(label="main")
    print("root", root.id, flush=True)
    if busy == "continuable":
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="s", label="busy",
                                                               prompt=script({"sleep": 600000})))
    else:
        KEEP["run"] = await sup.start("s", SubagentRequest(parent=root, prompt=script({busy: 600000}), label="busy"))
    idle, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="s", label="idle",
                                                          prompt=script({"return": "ready"})))
    with anyio.fail_after(30):
        await sup.wait_for_message(root)  # the idle child's settlement notice: it is resident, its turn over
    print("workers", *[worker.pid for worker in sup.pool.workers()], flush=True)
    if how == "dropped":
        del cm, sup
        gc.collect()
        await anyio.sleep(1.0)
        print("main survived", flush=True)
    else:
        KEEP["cm"] = cm

anyio.run(main)
print("exited", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("busy", ["sleep", "spin", "continuable"])
@pytest.mark.parametrize("how", ["kept", "dropped"])
def test_a_supervisor_never_closed_is_closed_at_the_loops_end(tmp_path, busy: str, how: str) -> None:
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(SCRIPT))
    store = tmp_path / "st"
    done = subprocess.run([sys.executable, str(script), str(store), busy, how], cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)
    out = done.stdout.splitlines()
    assert done.returncode == 0 and "exited" in out, done.stdout + done.stderr[-4000:]
    if how == "dropped":
        assert "main survived" in out, done.stdout + done.stderr[-4000:]
    assert "was never closed" in done.stderr, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    workers = [int(pid) for pid in next(line for line in out if line.startswith("workers")).split()[1:]]
    assert workers and not any(_alive(pid) for pid in workers)
    root_id = next(line for line in out if line.startswith("root")).split()[1]

    async def next_host() -> list:
        config = SupervisorConfig(pool_size=1, durability="none")
        async with Supervisor.open(store=str(store), config=config) as sup:
            sup.register_provider(Provider(name="s", program="script", continuable=True))
            root = await sup.open_root(id=root_id)  # released at the close: no lease to wait out
            await sup.resume_pending(root)
            with anyio.fail_after(30):
                return await sup.list_children(root)

    children = anyio.run(next_host)
    by_label = {child.label: child for child in children}
    assert set(by_label) == {"busy", "idle"}, children
    assert all(child.status != "running" for child in children), children
    assert check_store(store).clean, check_store(store)
