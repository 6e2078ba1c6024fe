"""CPU-heavy children on one worker against two: do children really run in parallel?

Run ``python benchmarks/parallel.py [--quick]``. Everything is measured in
this run, on the repository's file system, and removed afterwards.

What is measured: ``N`` children (4 with ``--quick``, 8 without), each a
fixed amount of pure-Python work (``ITERATIONS`` rounds of an integer loop,
calibrated once at start to take about 500 ms on one free core, then the same
count for every child of every configuration), all started at once under one
root, first on a supervisor with ``pool_size=1`` (the baseline: the children
run one after another), then with ``pool_size=2``. Each figure is the wall
time from the first ``start`` to the last result (``start`` + ``result`` +
``dispose`` of every child), best of ``--rounds`` rounds, and the two
configurations alternate round by round so machine load hits both alike.
``speedup = one_worker_s / two_workers_s`` (goal >= 1.8 on 2 free cores; the
worker pids of each run are checked: with two workers both are used).

The work is fixed, not a wall-clock deadline: a child that burned CPU "for
500 ms" would take 500 ms whether or not it shared its core, so two workers
pinned to one CPU would still show a 2x "speedup". As a control, the script
runs itself again pinned to one CPU (``sched_setaffinity``, inherited by the
workers) and reports that run's speedup as ``pinned_speedup``: about 1.0
proves that the measure sees cores, not clocks.

Durability is ``none``: the store's fsyncs are not what this measures.

The last stdout line is one JSON object ``{"benchmark": "parallel", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import temp_base  # noqa: E402  (first: puts the repository on sys.path)

import anyio  # noqa: E402

from subagents.supervisor import Provider, SubagentRequest, Supervisor, SupervisorConfig  # noqa: E402

NAME = "parallel"
CPU_MS = 500  # the calibration target of one child's work on a free core
GOAL = 1.8


def burn(iterations: int) -> int:
    """A fixed amount of pure-Python CPU work (the GIL holds: one core per worker process)."""
    total = 0
    for i in range(iterations):
        total = (total + i * i) % 1_000_003
    return total


# dill carries the program by value but not the module globals it calls: the worker gets burn
# as a default argument (the same code object the calibration timed)


def calibrate(target_ms: float) -> int:
    """Iterations of ``burn`` that take about ``target_ms`` here, measured before any worker runs."""
    iterations = 100_000
    while True:
        t0 = time.perf_counter()
        burn(iterations)
        elapsed = time.perf_counter() - t0
        if elapsed > 0.05:
            return int(iterations * target_ms / 1000 / elapsed)
        iterations *= 4


def work_then_pid(ctx: Any, burn: Any = burn) -> str:
    """Carried to the worker by dill (a plain ``def``: it runs off the worker's event loop)."""
    import json as _json
    import os as _os

    burn(int(_json.loads(ctx.text)["iterations"]))
    return str(_os.getpid())


async def one_round(base: str, pool_size: int, n: int, index: int, iterations: int) -> tuple[float, set[int]]:
    config = SupervisorConfig(pool_size=pool_size, durability="none")
    async with Supervisor.open(store=os.path.join(base, f"store-{pool_size}-{index}"), config=config) as sup:
        sup.register_provider(Provider(name="cpu", program=work_then_pid))
        root = await sup.open_root(label="bench")
        prompt = json.dumps({"iterations": iterations})
        # warm: each worker loads the program once before the clock starts
        warm = [await sup.start("cpu", SubagentRequest(parent=root, prompt=json.dumps({"iterations": 1}))) for _ in range(pool_size)]
        for run in warm:
            await run.result()
            await run.dispose()
        pids: set[int] = set()
        failures: list[str] = []

        async def child() -> None:
            run = await sup.start("cpu", SubagentRequest(parent=root, prompt=prompt))
            result = await run.result()
            if result.stop_reason != "completed":
                failures.append(f"{result.stop_reason}: {result.diagnostic}")
            else:
                pids.add(int(result.output))
            await run.dispose()

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(child)
        elapsed = time.perf_counter() - t0
        if failures:
            raise RuntimeError(f"{len(failures)} children failed, e.g. {failures[0]}")
        return elapsed, pids


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n or (4 if args.quick else 8)
    rounds = args.rounds or (2 if args.quick else 3)
    base = tempfile.mkdtemp(prefix="bench-parallel-", dir=temp_base())
    times: dict[int, list[float]] = {1: [], 2: []}
    used: dict[int, set[int]] = {1: set(), 2: set()}
    iterations = args.iterations or calibrate(CPU_MS)
    cpus = sorted(os.sched_getaffinity(0))
    try:
        print(f"parallel: {n} children of {iterations:,} iterations each (~{CPU_MS} ms on a free core), "
              f"{rounds} rounds, CPUs {cpus}")
        for index in range(rounds):
            for pool_size in (1, 2):
                elapsed, pids = await one_round(base, pool_size, n, index, iterations)
                times[pool_size].append(elapsed)
                used[pool_size] = pids
                print(f"  round {index + 1}: pool_size={pool_size}: {elapsed:.3f} s on {len(pids)} worker(s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one, two = min(times[1]), min(times[2])
    speedup = one / two
    print(f"one worker:  {one:.3f} s")
    print(f"two workers: {two:.3f} s, workers used: {len(used[2])}")
    print(f"speedup {speedup:.2f}  goal >= {GOAL}  {'met' if speedup >= GOAL else 'NOT met'}")
    return {
        "benchmark": NAME,
        "quick": args.quick,
        "n": n,
        "iterations": iterations,
        "cpus": len(cpus),
        "rounds": rounds,
        "one_worker_s": round(one, 3),
        "two_workers_s": round(two, 3),
        "speedup": round(speedup, 3),
        "two_workers_used": len(used[2]),
    }


def pinned_control(args: argparse.Namespace, iterations: int) -> float | None:
    """The same measure, run again in a child process pinned to one CPU: its speedup (about 1.0)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--pinned", "--iterations", str(iterations),
           "--n", str(args.n or (4 if args.quick else 8)), "--rounds", str(args.rounds or (2 if args.quick else 3))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"pinned control failed: {done.stderr.strip()[-500:]}")
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["speedup"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 children, 2 rounds (under 60 s on 2 cores)")
    parser.add_argument("--n", type=int, default=0, help="children per configuration (default 4 quick, 8 full)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per configuration (best is kept)")
    parser.add_argument("--iterations", type=int, default=0, help="work per child (default: calibrated to ~500 ms)")
    parser.add_argument("--pinned", action="store_true", help="the control run: pin this process (and so its workers) to one CPU")
    args = parser.parse_args()
    if args.pinned:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(json.dumps(anyio.run(amain, args)))
        return
    summary = anyio.run(amain, args)
    print("control: the same run pinned to one CPU")
    pinned = pinned_control(args, summary["iterations"])
    if pinned is not None:
        summary["pinned_speedup"] = round(pinned, 3)
        print(f"pinned speedup {pinned:.2f} (about 1.0 proves the measure)")
    summary["goals_met"] = {"speedup": summary["speedup"] >= GOAL}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
