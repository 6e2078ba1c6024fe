"""One-shot children per second with one and with two Supervisor processes on one store.

Run ``python benchmarks/multi_supervisor.py [--quick]``. Everything is
measured in this run, on the repository's file system (``/tmp`` when it
shares the repository's device, else a hidden folder under
``benchmarks/``), and removed afterwards.

Each Supervisor runs in its own host process (``tests/multi/_driver.py``),
with a pool of ``--pool-size`` workers (default 1), durability ``batched``
(fsync at creation and at turn end) and the ``echo`` program. A host runs
``N`` one-shot children (start + result + dispose, at most ``--concurrency``
in flight) under a root of its own; every host starts at the same instant (a
barrier file), after a warm-up burst. The figure is the total number of
children over the wall time from the barrier to the last host's answer:

* **one_supervisor_per_s**: one host, N children (the baseline of this run);
* **two_supervisors_per_s**: two hosts on the same store, N children each;
* **two_supervisors_shared_parent_per_s**: the same, all under ONE parent
  (its children index is then shared by both writers);
* **scaling** = two_supervisors_per_s / one_supervisor_per_s.

Each figure is the median of R rounds (a new store per round). With two
cores and a pool of one worker, each host keeps about two processes busy,
so two hosts saturate the machine: scaling near 2 needs idle cores.
The last stdout line is one JSON object ``{"benchmark": "multi_supervisor", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from _common import temp_base  # noqa: E402  (first: puts the repository on sys.path)

from subagents.store import Store, read_children  # noqa: E402
from tests.multi._driver import Driver  # noqa: E402

NAME = "multi_supervisor"
WARM_UP = 20


def run(base: str, label: str, hosts: int, n: int, *, pool_size: int, concurrency: int, shared_parent: bool) -> float:
    """Children per second of ``hosts`` host processes, ``n`` children each, on one fresh store."""
    folder = tempfile.mkdtemp(prefix=f"{label}-", dir=base)
    st = Store(os.path.join(folder, "store"), durability="batched")
    config = {"pool_size": pool_size, "durability": "batched", "start_method": "forkserver"}
    running = [Driver(st.root, config=config, log_path=os.path.join(folder, f"host{i}.log"), name=f"{label}{i}") for i in range(hosts)]
    try:
        roots = [host.call("open_root", label=label) for host in running]
        for host, root in zip(running, roots):
            host.call("burst", parent=root, count=WARM_UP, concurrency=concurrency, timeout=120)
        if shared_parent:  # one root, opened by the first host; one-shot starts only need its header
            bench_roots = [running[0].call("open_root", label="bench")] * hosts
        else:
            bench_roots = [host.call("open_root", label="bench") for host in running]
        barrier = os.path.join(folder, "go")
        calls = [(host, host.send("burst", parent=root, count=n, concurrency=concurrency, barrier=barrier))
                 for host, root in zip(running, bench_roots)]
        t0 = time.perf_counter()
        with open(barrier, "w"):
            pass
        made = [host.reply(call_id, timeout=600) for host, call_id in calls]
        elapsed = time.perf_counter() - t0
        total = sum(len(ids) for ids in made)
        if total != hosts * n:
            raise RuntimeError(f"{total} children made, expected {hosts * n}")
        indexed = sum(len(read_children(st, root)) for root in set(bench_roots))
        if indexed != total:
            raise RuntimeError(f"the index lists {indexed} children, expected {total}")
        return total / elapsed
    finally:
        for host in running:
            host.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 children per host, 2 rounds (under 60 s on 2 cores)")
    parser.add_argument("--n", type=int, default=0, help="children per host (default 200 quick, 1000 full)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 2 quick, 3 full)")
    parser.add_argument("--pool-size", type=int, default=1, help="workers per supervisor (default 1)")
    parser.add_argument("--concurrency", type=int, default=16, help="children in flight per supervisor (default 16)")
    args = parser.parse_args()
    n = args.n or (200 if args.quick else 1000)
    rounds = args.rounds or (2 if args.quick else 3)
    base = tempfile.mkdtemp(prefix="bench-multi-supervisor-", dir=temp_base())
    print(f"multi_supervisor: {n} one-shot echo children per supervisor, pool {args.pool_size}, "
          f"{args.concurrency} in flight each, durability batched, {rounds} rounds, stores in {base}")
    figures: dict[str, list[float]] = {"one": [], "two": [], "two_shared": []}
    try:
        for round_no in range(rounds):
            common = {"pool_size": args.pool_size, "concurrency": args.concurrency}
            figures["one"].append(run(base, "one", 1, n, shared_parent=False, **common))
            figures["two"].append(run(base, "two", 2, n, shared_parent=False, **common))
            figures["two_shared"].append(run(base, "shared", 2, n, shared_parent=True, **common))
            print(f"  round {round_no}: one {figures['one'][-1]:,.1f}/s, two {figures['two'][-1]:,.1f}/s, "
                  f"two under one parent {figures['two_shared'][-1]:,.1f}/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one = statistics.median(figures["one"])
    two = statistics.median(figures["two"])
    shared = statistics.median(figures["two_shared"])
    print()
    print(f"one supervisor {one:,.1f}/s; two supervisors {two:,.1f}/s (scaling {two / one:.2f}); "
          f"two under one parent {shared:,.1f}/s (scaling {shared / one:.2f}); {os.cpu_count()} cores")
    summary = {
        "benchmark": NAME,
        "quick": args.quick,
        "n_per_supervisor": n,
        "rounds": rounds,
        "pool_size": args.pool_size,
        "concurrency": args.concurrency,
        "cpu_count": os.cpu_count(),
        "one_supervisor_per_s": round(one, 1),
        "two_supervisors_per_s": round(two, 1),
        "two_supervisors_shared_parent_per_s": round(shared, 1),
        "scaling": round(two / one, 3),
        "shared_parent_scaling": round(shared / one, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
