"""Exactly-once delivery of accepted messages across ``kill -9`` of the supervisor.

A driver process (a supervisor in a subprocess) opens a root, starts a
continuable child and sends it followups, printing each message id once
``followup`` has returned it (the message is *accepted*). The test kills the
driver (its pool has two workers) with SIGKILL at a random point — after a random number of printed ids,
plus a random sub-turn delay, so kills land between acceptances, inside an
acceptance, inside a turn, inside a settlement — waits until the driver's
workers are gone (they exit on end-of-file of their pipe), then a new
supervisor in the test process opens the root by id and sends one final
followup. Once the child settles on it, the child's log must consume every
mailbox message exactly once, in mailbox (acceptance) order, and nothing else:
so every printed id is delivered exactly once, and none that was never
accepted.

Each test function runs several kill points (``KILLS_PER_TEST``) on one store,
one root per kill point; the default suite runs ``len(SEEDS) * KILLS_PER_TEST``
of them. Set ``SUBAGENTS_CRASH_KILLS`` to run more per test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from subagents.store import inspect, read_mailbox
from subagents.supervisor import Capabilities, Provider

from ..conftest import REPO_ROOT, open_supervisor

pytestmark = pytest.mark.anyio

SEEDS = [11, 23, 37, 41]
# the pool's default (forkserver), and fork, whose workers inherit their supervisor's pipe ends
START_METHODS = ["forkserver", "fork", "forkserver", "fork"]
KILLS_PER_TEST = int(os.environ.get("SUBAGENTS_CRASH_KILLS", "6"))
FOLLOWUPS = 8
DRIVER_DEADLINE_S = 20.0

DRIVER = textwrap.dedent(
    """
    import json, sys
    import anyio
    from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

    store, count, durability, start_method = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

    def S(*actions):
        return json.dumps({"script": list(actions)})

    async def main():
        config = SupervisorConfig(pool_size=2, durability=durability, start_method=start_method)
        async with Supervisor.open(store=store, config=config) as sup:
            sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
            root = await sup.open_root(label="crash")
            print("root", root.id, flush=True)
            print("workers", *sup.pool.worker_pids(), flush=True)
            child, first = await sup.start_continuable(ContinuableSpec(
                parent=root, provider="script", label="victim", prompt=S({"sleep": 20}, {"return": "t0"})))
            print("child", child, flush=True)
            print("accepted", first, flush=True)
            for i in range(1, count + 1):
                message_id = await sup.followup(root, child, S({"sleep": 3 * (i % 4)}, {"say": f"t{i}"}, {"return": f"t{i}"}))
                print("accepted", message_id, flush=True)
            print("all-accepted", flush=True)
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


def S(*actions) -> str:
    return json.dumps({"script": list(actions)})


def gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie counts as gone: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return True
    return raw[raw.rfind(b")") + 2 :].split()[:1] == [b"Z"]


def run_driver_and_kill(driver: Path, store: Path, rng: random.Random, durability: str, start_method: str) -> dict:
    """Start the driver, SIGKILL it at a random point, reap it; what it printed before dying."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(store), str(FOLLOWUPS), durability, start_method],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    seen = {"root": None, "child": None, "workers": [], "accepted": [], "all": False}
    kill_after = rng.randint(1, FOLLOWUPS + 2)  # printed acceptances; FOLLOWUPS + 2: after the last, mid-turns
    # none, inside the next acceptance or turn, or far into the turns (settlements, cold resumes)
    extra_delay = rng.choice([0.0, 0.0, rng.uniform(0.0, 0.03), rng.uniform(0.03, 0.3)])
    deadline = time.monotonic() + DRIVER_DEADLINE_S
    try:
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break  # the driver died on its own: the assertions below will say what it left
            word, *rest = line.split()
            if word == "root":
                seen["root"] = rest[0]
            elif word == "workers":
                seen["workers"] = [int(p) for p in rest]
            elif word == "child":
                seen["child"] = rest[0]
            elif word == "accepted":
                seen["accepted"].append(rest[0])
            elif word == "all-accepted":
                seen["all"] = True
            if len(seen["accepted"]) >= kill_after or seen["all"]:
                break
        if extra_delay:
            time.sleep(extra_delay)  # chaos, not synchronisation: moves the kill inside whatever runs now
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    seen["kill_after"], seen["delay"] = kill_after, extra_delay
    return seen


async def wait_gone(pids: list[int], *, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not all(gone(pid) for pid in pids):
            await anyio.sleep(0.01)


def consumption(st, session_id: str) -> list[str]:
    events = inspect(st, session_id).events
    return [e["data"]["message_id"] for e in events if e["type"] in ("message/accepted", "message/discarded")]


@pytest.mark.parametrize(("seed", "start_method"), list(zip(SEEDS, START_METHODS)))
async def test_accepted_messages_survive_kill_9_exactly_once(tmp_path, seed, start_method):
    rng = random.Random(seed)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    store = tmp_path / "store"
    runs = [
        run_driver_and_kill(driver, store, rng, rng.choice(["none", "none", "batched"]), start_method)
        for _ in range(KILLS_PER_TEST)
    ]
    workers = [pid for run in runs for pid in run["workers"]]
    await wait_gone(workers)  # no orphan worker outlives its supervisor to write after the takeover

    async with open_supervisor(tmp_path, pool_size=2, providers=False) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        for run in runs:
            context = f"seed {seed}, kill after {run['kill_after']} acceptances (+{run['delay']:.3f}s)"
            assert run["child"] is not None, f"the driver died before starting its child ({context})"
            root = await sup.open_root(id=run["root"])
            child = run["child"]
            final = await sup.followup(root, child, S({"return": "final"}))
            with anyio.fail_after(20):
                while True:
                    taken = await sup.wait_for_message(root, timeout_s=20)
                    if any(m.source.get("kind") == "subagent-settled" and m.content.endswith("\nfinal") for m in taken):
                        break
            mailbox = [m.id for m in read_mailbox(sup.store, child)]
            consumed = consumption(sup.store, child)
            printed = run["accepted"] + [final]
            # every accepted message consumed exactly once, in acceptance order, and nothing else
            assert consumed == mailbox, context
            assert len(set(consumed)) == len(consumed), context
            assert [m for m in consumed if m in set(printed)] == printed, context
            assert set(printed) <= set(mailbox), context
            # every turn is balanced (crash repair closes the one the kill interrupted)
            kinds = [e["type"] for e in inspect(sup.store, child).events]
            assert kinds.count("turn/start") == kinds.count("turn/end"), context
