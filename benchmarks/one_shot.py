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

* **cost per child**: ``cpu_ms_per_child`` is the CPU time (user + system)
  of the host process and every process below it (workers, forkserver) over
  the children run, divided by N. ``inodes_per_child`` (inodes allocated per
  child), ``inodes_freed_per_child`` and ``fsyncs_per_child`` come from a
  second, smaller run (``COUNT_N`` children after a warm-up) repeated under
  ``strace -f`` and replayed on a model of the store folder's names
  (``_syscounts.py``); absent when ``strace`` is missing.
* **Ray**: ``ray_tasks_per_s``: trivial Ray tasks (``ray.init`` with 2 CPUs,
  32 in flight), run in the same benchmark inside a private network
  namespace (``unshare -n``, loopback only) with usage stats off; the key is
  absent when Ray or the namespace is not available.

``new_file_us_before`` / ``new_file_us_after``: what one new empty file
cost in this file system just before and just after the children ran
(``_common.new_file_us``). A child makes one file, and on an ext4 without a
journal (this machine's) a new file costs several times more for minutes
after many files were deleted anywhere near it (a test run, an earlier
benchmark's clean-up): read a low ``children_per_s`` beside these.

``sessions_per_commit``: children created per group commit (one fsync of
``sessions/`` and one index append), from ``Supervisor.statistics()``.

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
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import new_file_us, percentile, temp_base  # noqa: E402  (first: puts the repository on sys.path)
from _syscounts import TRACED_SYSCALLS, begin_marker, count_trace, end_marker, strace_available  # noqa: E402

import anyio  # noqa: E402

from subagents.store import inspect  # noqa: E402
from subagents.supervisor import Provider, SubagentRequest, Supervisor, SupervisorConfig  # noqa: E402

NAME = "one_shot"
POOL_SIZE = 2
GOALS = {
    "ratio": ">= 0.2",
    "respawn_ms": "<= 150",
    "children_per_s": ">= 1000",
    "cpu_ms_per_child": "<= 1.4",
    "inodes_per_child": "<= 1",
    "children_vs_ray": ">= 1.0",
}
COUNT_N = 100  # children of the strace'd counting run (strace slows every call; the counts do not change)
RAY_TASKS = 2000
RAY_SCRIPT = """
import json, os, sys, time
import ray
ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)

@ray.remote
def trivial(i):
    return i

n, in_flight = int(sys.argv[1]), 32
ray.get([trivial.remote(i) for i in range(64)])
t0 = time.perf_counter()
pending, sent = [], 0
while sent < n or pending:
    while sent < n and len(pending) < in_flight:
        pending.append(trivial.remote(sent))
        sent += 1
    done, pending = ray.wait(pending, num_returns=1)
    ray.get(done)
print(json.dumps({"ray_tasks_per_s": n / (time.perf_counter() - t0)}))
ray.shutdown()
"""


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


# -- cost per child ----------------------------------------------------------------


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live process below it (from /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    stack.extend(int(c) for c in handle.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


async def count_pass(base: str, n: int) -> None:
    """The run repeated under strace: a warm-up, then ``n`` children between the two marker opens."""
    config = SupervisorConfig(pool_size=POOL_SIZE, durability="batched")
    async with Supervisor.open(store=os.path.join(base, "store"), config=config) as sup:
        sup.register_provider(Provider(name="echo", program="echo"))
        await run_children(sup, await sup.open_root(label="warm-up"), 20, 32)
        root = await sup.open_root(label="counted")
        for marker in (begin_marker(base), None, end_marker(base)):
            if marker is None:
                got = await run_children(sup, root, n, 32)
                if got["failures"]:
                    raise RuntimeError(got["failures"][0])
                continue
            try:
                os.open(marker, os.O_RDONLY)
            except FileNotFoundError:
                pass


def measure_counts(parent: str) -> dict[str, float] | None:
    """inodes and fsyncs per child from an strace of ``count_pass``; None without strace."""
    if not strace_available():
        print("strace not found: inode and fsync counts skipped")
        return None
    base = tempfile.mkdtemp(prefix="bench-one-shot-count-", dir=parent)
    trace = os.path.join(base, "trace")
    try:
        cmd = ["strace", "-f", "-qq", "-yy", "-e", f"trace={TRACED_SYSCALLS}", "-o", trace,
               sys.executable, os.path.abspath(__file__), "--count-pass", base, "--n", str(COUNT_N)]
        subprocess.run(cmd, check=True, timeout=300, stdout=subprocess.DEVNULL)
        counts = count_trace(trace, os.path.join(base, "store"), base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "inodes_per_child": counts.inodes_created / COUNT_N,
        "inodes_freed_per_child": counts.inodes_freed / COUNT_N,
        "fsyncs_per_child": counts.fsyncs / COUNT_N,
    }


def measure_ray() -> float | None:
    """Trivial Ray tasks per second, in a private network namespace; None when Ray cannot run here."""
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray not installed: ray_tasks_per_s skipped")
        return None
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        print("unshare or ip missing: ray_tasks_per_s skipped (Ray must run in a private network namespace)")
        return None
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    inner = f"ip link set lo up && exec {sys.executable} -c \"$0\" {RAY_TASKS}"
    try:
        done = subprocess.run(["unshare", "-n", "sh", "-c", inner, RAY_SCRIPT], capture_output=True, text=True,
                              timeout=300, env=env)
    except subprocess.TimeoutExpired:
        print("ray run timed out: ray_tasks_per_s skipped")
        return None
    if done.returncode != 0:
        print(f"ray run failed: ray_tasks_per_s skipped ({done.stderr.strip()[-300:]})")
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["ray_tasks_per_s"])


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
    """True once ``pid`` is gone, or a zombie whose every thread has exited (its pipes are closed).

    A worker has more than one thread (one waits for its supervisor's hang-up):
    its main thread shows ``Z`` as soon as it exits, while another thread may
    still hold the descriptors. A thread that has exited leaves ``task/``.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return False
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
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
            disk_before = new_file_us(base)
            cpu0 = tree_cpu_s(os.getpid())
            got = await run_children(sup, root, n, args.concurrency)
            cpu_ms_per_child = (tree_cpu_s(os.getpid()) - cpu0) * 1000 / n
            disk_after = new_file_us(base)
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
        counts = measure_counts(args.dir or temp_base())
        ray_per_s = measure_ray()
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
        "cpu_ms_per_child": cpu_ms_per_child,
    }
    met = {
        "ratio": figures["ratio"] >= 0.2,
        "respawn_ms": figures["respawn_ms"] <= 150,
        "children_per_s": figures["children_per_s"] >= 1000,
        "cpu_ms_per_child": cpu_ms_per_child <= 1.4,
    }
    if counts is not None:
        figures.update(counts)
        met["inodes_per_child"] = counts["inodes_per_child"] <= 1 and counts["inodes_freed_per_child"] == 0
    if ray_per_s is not None:
        figures["ray_tasks_per_s"] = ray_per_s
        figures["children_vs_ray"] = got["per_s"] / ray_per_s
        met["children_vs_ray"] = figures["children_vs_ray"] >= 1.0
    print(f"children: {n} in {got['elapsed']:.2f} s = {figures['children_per_s']:,.1f}/s "
          f"(first half {got['first_half_per_s']:,.1f}/s, second half {got['second_half_per_s']:,.1f}/s)")
    print(f"the disk: a new empty file took {disk_before:.1f} us before the children and {disk_after:.1f} us after "
          "(~10-40 us on a quiet disk here; several times that while it is slow to allocate inodes, and every figure above with it)")
    print(f"with turns_per_worker=4: {got4['per_s']:,.1f}/s")
    print(f"start->result latency: p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, max {max(lat_ms):.1f} ms")
    print("one child, median per phase (sampled):")
    for phase, ms in phases.items():
        print(f"  {phase:<30} {ms:8.2f} ms")
    print(f"respawn (kill -9 -> a child completed on the replacement): {', '.join(f'{x:.1f}' for x in respawn)} ms; "
          f"kill -> pool whole again: {', '.join(f'{x:.1f}' for x in ready)} ms")
    print(f"pool: started {stats.pool.started} workers, {stats.pool.crashed} crashed (the killed ones)")
    creation = stats.creation
    print(f"creation: {creation.sessions} children in {creation.hops} store-thread batches and {creation.commits} commits "
          f"({creation.sessions_per_commit:.1f} per commit: one fsync of sessions/ and one index append each)")
    print()
    print("goals:")
    for key, goal in GOALS.items():
        if key in figures:
            print(f"  {key:<16} {figures[key]:>12,.3f}  goal {goal:<8} {'met' if met[key] else 'NOT met'}")
    extra = {k: round(figures[k], 3) for k in ("cpu_ms_per_child", "inodes_per_child", "inodes_freed_per_child",
                                               "fsyncs_per_child", "ray_tasks_per_s", "children_vs_ray") if k in figures}
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
        "sessions_per_commit": round(stats.creation.sessions_per_commit, 2),
        "first_half_children_per_s": round(got["first_half_per_s"], 1),
        "second_half_children_per_s": round(got["second_half_per_s"], 1),
        "store_dir": args.dir or "repository file system",
        "new_file_us_before": round(disk_before, 1),
        "new_file_us_after": round(disk_after, 1),
        "phase_ms": {k: round(v, 2) for k, v in phases.items()},
        **extra,
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
    parser.add_argument("--count-pass", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count_pass:
        anyio.run(count_pass, args.count_pass, args.n or COUNT_N)
        return
    summary = anyio.run(amain, args)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
