"""CPU-heavy children on one worker against two: do children really run in parallel?

Run ``python benchmarks/parallel.py [--quick]``. Everything is measured in
this run, on the repository's file system, and removed afterwards.

What is measured: ``N`` children (4 with ``--quick``, 8 without), each the
``script`` program ``[{"cpu": 500}]`` (500 ms of pure-Python CPU in the
worker), all started at once under one root, first on a supervisor with
``pool_size=1`` (the baseline: the children run one after another), then
with ``pool_size=2``. Each figure is the wall time from the first ``start``
to the last result (``start`` + ``result`` + ``dispose`` of every child),
best of ``--rounds`` rounds, and the two configurations alternate round by
round so machine load hits both alike. ``speedup = one_worker_s /
two_workers_s`` (goal >= 1.8 on 2 free cores; the worker pids of each run
are checked: with two workers both are used).

Durability is ``none``: the store's fsyncs are not what this measures.

The last stdout line is one JSON object ``{"benchmark": "parallel", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from _common import temp_base  # noqa: E402  (first: puts the repository on sys.path)

import anyio  # noqa: E402

from subagents.supervisor import Provider, SubagentRequest, Supervisor, SupervisorConfig  # noqa: E402

NAME = "parallel"
CPU_MS = 500
GOAL = 1.8


async def cpu_then_pid(ctx: Any) -> str:
    """Carried to the worker by dill: the ``script`` action ``cpu``, then the worker's pid."""
    import os as _os

    from subagents.worker.programs.script import script

    await script(ctx)
    return str(_os.getpid())


async def one_round(base: str, pool_size: int, n: int, index: int) -> tuple[float, set[int]]:
    config = SupervisorConfig(pool_size=pool_size, durability="none")
    async with Supervisor.open(store=os.path.join(base, f"store-{pool_size}-{index}"), config=config) as sup:
        sup.register_provider(Provider(name="cpu", program=cpu_then_pid))
        root = await sup.open_root(label="bench")
        prompt = json.dumps([{"cpu": CPU_MS}])
        # warm: each worker loads the program once before the clock starts
        warm = [await sup.start("cpu", SubagentRequest(parent=root, prompt=json.dumps([{"cpu": 1}]))) for _ in range(pool_size)]
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
    try:
        print(f"parallel: {n} children of {CPU_MS} ms CPU each, {rounds} rounds, os.cpu_count()={os.cpu_count()}")
        for index in range(rounds):
            for pool_size in (1, 2):
                elapsed, pids = await one_round(base, pool_size, n, index)
                times[pool_size].append(elapsed)
                used[pool_size] = pids
                print(f"  round {index + 1}: pool_size={pool_size}: {elapsed:.3f} s on {len(pids)} worker(s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one, two = min(times[1]), min(times[2])
    speedup = one / two
    ideal = n * CPU_MS / 1000
    print(f"one worker:  {one:.3f} s (ideal {ideal:.2f} s)")
    print(f"two workers: {two:.3f} s (ideal {ideal / 2:.2f} s), workers used: {len(used[2])}")
    print(f"speedup {speedup:.2f}  goal >= {GOAL}  {'met' if speedup >= GOAL else 'NOT met'}")
    return {
        "benchmark": NAME,
        "quick": args.quick,
        "n": n,
        "cpu_ms": CPU_MS,
        "rounds": rounds,
        "one_worker_s": round(one, 3),
        "two_workers_s": round(two, 3),
        "speedup": round(speedup, 3),
        "two_workers_used": len(used[2]),
        "goals_met": {"speedup": speedup >= GOAL},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 children, 2 rounds (under 60 s on 2 cores)")
    parser.add_argument("--n", type=int, default=0, help="children per configuration (default 4 quick, 8 full)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per configuration (best is kept)")
    args = parser.parse_args()
    summary = anyio.run(amain, args)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
