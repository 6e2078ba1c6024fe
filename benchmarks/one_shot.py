"""Durable one-shot children per second against a plain process pool, and worker respawn time.

Run ``python benchmarks/one_shot.py [--quick]``. Everything is measured in
this run, on the repository's file system (the temp folder is ``/tmp`` when
it shares the repository's device, else a hidden folder under
``benchmarks/``), and removed afterwards.

What is measured:

* **children**: a ``Supervisor`` with a pool of 2 workers, durability
  ``batched`` (the default: fsync at creation and at turn end), provider
  program ``echo``. ``N`` children (200 with ``--quick``, 2000 without) are
  started by concurrent tasks, at most ``--concurrency`` in flight (default
  32); each does ``start`` + ``result`` + ``dispose``. ``children_per_s`` is
  N over the wall time; ``p50_ms``/``p99_ms`` are start→result latencies.
  All children hang under one root, as a host delegating from one agent
  would do.
* **baseline**: ``concurrent.futures.ProcessPoolExecutor(2)`` round trips of
  a trivial function, driven the same way (asyncio tasks, the same number in
  flight, ``run_in_executor``). ``ratio = children_per_s / pool_tasks_per_s``.
* **respawn**: one worker is kept busy by a sleeping child, the other is
  killed with SIGKILL, and an ``echo`` child is started at once: it can only
  run on the replacement. ``respawn_ms`` is the median time from the kill to
  that child's result (``replacement_ready_ms``: kill → the pool counts two
  live workers again).

A breakdown of where one child's time goes (from the host's clock and the
``ts`` of its own log events) is printed for a sample of children.

The last stdout line is one JSON object ``{"benchmark": "one_shot", ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import percentile, temp_base  # noqa: E402  (first: puts the repository on sys.path)

import anyio  # noqa: E402

from subagents.store import inspect  # noqa: E402
from subagents.supervisor import Provider, SubagentRequest, Supervisor, SupervisorConfig  # noqa: E402

NAME = "one_shot"
POOL_SIZE = 2
GOALS = {"ratio": ">= 0.2", "respawn_ms": "<= 150", "children_per_s": ">= 1000"}


# -- helpers -----------------------------------------------------------------------


def trivial(i: int) -> int:
    return i


async def pid_then_sleep(ctx: Any) -> str:
    """Carried to the worker by dill: says its worker's pid, then sleeps until cancelled."""
    import os as _os

    import anyio as _anyio

    await ctx.say(str(_os.getpid()))
    await _anyio.sleep(3600)
    return "woke"


# -- baseline ----------------------------------------------------------------------


async def run_baseline(n: int, concurrency: int) -> float:
    """Round trips per second of a trivial function through ProcessPoolExecutor(2)."""
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(POOL_SIZE) as executor:
        await asyncio.gather(*(loop.run_in_executor(executor, trivial, i) for i in range(POOL_SIZE * 4)))  # warm
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                assert await loop.run_in_executor(executor, trivial, i) == i

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t0)


# -- children ----------------------------------------------------------------------


async def run_children(sup: Supervisor, root: Any, n: int, concurrency: int) -> dict[str, Any]:
    sem = anyio.Semaphore(concurrency)
    latencies: list[float] = []
    samples: list[tuple[str, float, float, float]] = []  # id, t_start, t_published, t_result (wall clock)
    ends: list[float] = []
    failures: list[str] = []

    async def one(i: int) -> None:
        async with sem:
            w0, t0 = time.time(), time.perf_counter()
            run = await sup.start("echo", SubagentRequest(parent=root, prompt=f"message {i}"))
            w1 = time.time()
            result = await run.result()
            t2 = time.perf_counter()
            latencies.append(t2 - t0)
            ends.append(t2)
            if result.stop_reason != "completed" or result.output != f"message {i}":
                failures.append(f"{run.id}: {result.stop_reason} {result.diagnostic}")
            if i % max(1, n // 50) == 0:
                samples.append((run.id, w0, w1, time.time()))
            await run.dispose()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    elapsed = time.perf_counter() - t0
    ends.sort()
    half = ends[len(ends) // 2] - t0
    return {
        "elapsed": elapsed,
        "per_s": n / elapsed,
        "first_half_per_s": (len(ends) // 2) / half if half > 0 else float("nan"),
        "second_half_per_s": (len(ends) - len(ends) // 2) / (elapsed - half) if elapsed > half else float("nan"),
        "latencies": latencies,
        "samples": samples,
        "failures": failures,
    }


def breakdown(sup: Supervisor, samples: list[tuple[str, float, float, float]]) -> dict[str, float]:
    """Median ms of each phase of a child, from the host's clock and its log's timestamps."""
    phases: dict[str, list[float]] = {"create (start returns)": [], "dispatch (to turn/start)": [], "turn": [], "return (turn/end to result)": []}
    for child_id, w0, w1, w3 in samples:
        ts = {e["type"]: e["ts"] for e in inspect(sup.store, child_id).events}
        phases["create (start returns)"].append(w1 - w0)
        phases["dispatch (to turn/start)"].append(ts["turn/start"] - w1)
        phases["turn"].append(ts["turn/end"] - ts["turn/start"])
        phases["return (turn/end to result)"].append(w3 - ts["turn/end"])
    return {k: statistics.median(v) * 1000 for k, v in phases.items() if v}


# -- respawn -----------------------------------------------------------------------


def exited(pid: int) -> bool:
    """True once ``pid`` is a zombie or gone (its pipes are closed)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone between open and read
        return True


async def measure_respawn(sup: Supervisor, root: Any, rounds: int) -> tuple[list[float], list[float]]:
    """Kill the worker not held by a sleeper; time until an echo child completes on its replacement."""
    totals: list[float] = []
    ready: list[float] = []
    for _ in range(rounds):
        with anyio.fail_after(30):
            while sup.statistics().pool.workers_alive < POOL_SIZE:
                await anyio.sleep(0.001)
            sleeper = await sup.start("pid-sleep", SubagentRequest(parent=root, prompt=""))
            while True:
                said = [e["data"]["text"] for e in inspect(sup.store, sleeper.id).events if e["type"] == "assistant/message"]
                if said:
                    break
                await anyio.sleep(0.001)
            busy = int(said[0])
            [victim] = [pid for pid in sup.pool.worker_pids() if pid != busy]
            t0 = time.perf_counter()
            os.kill(victim, signal.SIGKILL)
            # SIGKILL is asynchronous: start the next child once the victim has exited, so it
            # cannot be handed to the dying worker in the instant before its pipe closes
            while not exited(victim):
                await anyio.sleep(0.0005)
            run = await sup.start("echo", SubagentRequest(parent=root, prompt="after the kill"))
            result = await run.result()
            totals.append((time.perf_counter() - t0) * 1000)
            if result.stop_reason != "completed":
                raise RuntimeError(f"the run after the kill ended {result.stop_reason}: {result.diagnostic}")
            while sup.statistics().pool.workers_alive < POOL_SIZE:
                await anyio.sleep(0.0005)
            ready.append((time.perf_counter() - t0) * 1000)
            if victim in sup.pool.worker_pids():
                raise RuntimeError("the killed worker is still listed")
            await run.dispose()
            await sleeper.dispose()
    return totals, ready


# -- main --------------------------------------------------------------------------


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or (200 if args.quick else 2000)
    rounds = 3 if args.quick else 10
    base = tempfile.mkdtemp(prefix="bench-one-shot-", dir=args.dir or temp_base())
    try:
        print(f"one_shot: {n} children, {args.concurrency} in flight, pool of {POOL_SIZE}, durability batched, store in {base}")
        pool_per_s = await run_baseline(n, args.concurrency)
        print(f"baseline ProcessPoolExecutor({POOL_SIZE}) round trips: {pool_per_s:,.0f}/s")

        config = SupervisorConfig(pool_size=POOL_SIZE, durability="batched", cancel_grace_s=1.0)
        async with Supervisor.open(store=os.path.join(base, "store"), config=config) as sup:
            sup.register_provider(Provider(name="echo", program="echo"))
            sup.register_provider(Provider(name="pid-sleep", program=pid_then_sleep))
            warm_root = await sup.open_root(label="warm-up")
            await run_children(sup, warm_root, 20, args.concurrency)
            root = await sup.open_root(label="bench")
            got = await run_children(sup, root, n, args.concurrency)
            if got["failures"]:
                raise RuntimeError(f"{len(got['failures'])} children failed, e.g. {got['failures'][0]}")
            phases = breakdown(sup, got["samples"])
            respawn, ready = await measure_respawn(sup, root, rounds)
            stats = sup.statistics()
        # the same children when each worker may run 4 turns at once (SupervisorConfig.turns_per_worker):
        # what an I/O-bound program (an LLM call) gets; the default 1 is for CPU-bound programs
        shared = SupervisorConfig(pool_size=POOL_SIZE, durability="batched", cancel_grace_s=1.0, turns_per_worker=4)
        async with Supervisor.open(store=os.path.join(base, "store"), config=shared) as sup:
            sup.register_provider(Provider(name="echo", program="echo"))
            root4 = await sup.open_root(label="bench-4-turns-per-worker")
            got4 = await run_children(sup, root4, n, args.concurrency)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    lat_ms = [x * 1000 for x in got["latencies"]]
    figures = {
        "children_per_s": got["per_s"],
        "pool_tasks_per_s": pool_per_s,
        "ratio": got["per_s"] / pool_per_s,
        "p50_ms": percentile(lat_ms, 0.5),
        "p99_ms": percentile(lat_ms, 0.99),
        "respawn_ms": statistics.median(respawn),
    }
    met = {
        "ratio": figures["ratio"] >= 0.2,
        "respawn_ms": figures["respawn_ms"] <= 150,
        "children_per_s": figures["children_per_s"] >= 1000,
    }
    print(f"children: {n} in {got['elapsed']:.2f} s = {figures['children_per_s']:,.1f}/s "
          f"(first half {got['first_half_per_s']:,.1f}/s, second half {got['second_half_per_s']:,.1f}/s)")
    print(f"with turns_per_worker=4: {got4['per_s']:,.1f}/s")
    print(f"start->result latency: p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, max {max(lat_ms):.1f} ms")
    print("one child, median per phase (sampled):")
    for phase, ms in phases.items():
        print(f"  {phase:<30} {ms:8.2f} ms")
    print(f"respawn (kill -9 -> a child completed on the replacement): {', '.join(f'{x:.1f}' for x in respawn)} ms; "
          f"kill -> pool whole again: {', '.join(f'{x:.1f}' for x in ready)} ms")
    print(f"pool: started {stats.pool.started} workers, {stats.pool.crashed} crashed (the killed ones)")
    print()
    print("goals:")
    for key, goal in GOALS.items():
        print(f"  {key:<16} {figures[key]:>12,.3f}  goal {goal:<8} {'met' if met[key] else 'NOT met'}")
    return {
        "benchmark": NAME,
        "quick": args.quick,
        "n": n,
        "concurrency": args.concurrency,
        "pool_size": POOL_SIZE,
        "durability": "batched",
        "children_per_s": round(figures["children_per_s"], 1),
        "pool_tasks_per_s": round(figures["pool_tasks_per_s"], 1),
        "ratio": round(figures["ratio"], 4),
        "p50_ms": round(figures["p50_ms"], 2),
        "p99_ms": round(figures["p99_ms"], 2),
        "respawn_ms": round(figures["respawn_ms"], 1),
        "replacement_ready_ms": round(statistics.median(ready), 1),
        "children_per_s_4_turns_per_worker": round(got4["per_s"], 1),
        "first_half_children_per_s": round(got["first_half_per_s"], 1),
        "second_half_children_per_s": round(got["second_half_per_s"], 1),
        "store_dir": args.dir or "repository file system",
        "phase_ms": {k: round(v, 2) for k, v in phases.items()},
        "goals_met": met,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 children, 3 respawns (under 60 s on 2 cores)")
    parser.add_argument("--n", type=int, default=0, help="number of children (default 200 quick, 2000 full)")
    parser.add_argument("--concurrency", type=int, default=32, help="children (and baseline tasks) in flight")
    parser.add_argument(
        "--dir", default="",
        help="parent folder of the store (default: the repository's file system); e.g. /dev/shm to tell the "
             "runtime's own cost from the file system's",
    )
    args = parser.parse_args()
    summary = anyio.run(amain, args)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
