"""Supervisor memory per persisted idle continuable child: does a settled child stay resident?

Run ``python benchmarks/idle_memory.py [--quick]``. Everything is measured in
this run, on the repository's file system, and removed afterwards.

What is measured, in the supervisor process only (its workers are other
processes), as resident set size from ``/proc/self/statm`` after a full
``gc.collect()``:

* **host**: one ``Supervisor`` opens a root and first settles ``WARM``
  continuable children (every code path, cache and buffer of a start, a turn
  and a settlement is then allocated: the baseline); then it starts ``N``
  more continuable children of the ``echo`` program (10,000; 2,000 with
  ``--quick``), ``CONCURRENCY`` at a time, each until its settlement notice
  reached the root's mailbox (and was taken). ``bytes_per_child`` =
  (RSS after - RSS at the baseline) / N. A settled child is persisted, not
  active: nothing of it should stay resident (goal: under 1 KiB per child).
* **fresh**: a new process opens a ``Supervisor`` on the populated store and
  re-opens the root by id; its RSS against the same on an empty store, per
  child (``fresh_bytes_per_child``): what merely having children costs.

Durability is ``none``: fsyncs change time, not memory. CPython keeps freed
small objects in its arenas, so a high-water mark reached during the run
counts: that is what the process really holds.

The last stdout line is one JSON object ``{"benchmark": "idle_memory", ...}``.
"""

from __future__ import annotations

import argparse
import gc
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

from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig  # noqa: E402

NAME = "idle_memory"
GOAL_BYTES_PER_CHILD = 1024
WARM = 50
CONCURRENCY = 32
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    gc.collect()
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def config() -> SupervisorConfig:
    return SupervisorConfig(pool_size=2, durability="none")


def provider() -> Provider:
    return Provider(name="echo", program="echo", capabilities=Capabilities.all(), continuable=True)


async def settle_children(sup: Supervisor, root: Any, count: int) -> None:
    """Start ``count`` continuable children, at most CONCURRENCY unsettled at once; return when all settled."""
    started = 0
    settled = 0
    while settled < count:
        while started < count and started - settled < CONCURRENCY:
            await sup.start_continuable(ContinuableSpec(parent=root, provider="echo", label=f"idle-{started}", prompt="hello"))
            started += 1
        for message in await sup.wait_for_message(root, timeout_s=60.0):
            if message.source.get("kind") == "subagent-settled":
                settled += 1


async def host(store: str, n: int) -> dict[str, Any]:
    async with Supervisor.open(store=store, config=config()) as sup:
        sup.register_provider(provider())
        root = await sup.open_root(label="idle-memory")
        await settle_children(sup, root, WARM)
        before = rss_bytes()
        t0 = time.perf_counter()
        await settle_children(sup, root, n)
        elapsed = time.perf_counter() - t0
        after = rss_bytes()
        children = len(await sup.list_children(root.id))
        return {"root": root.id, "before": before, "after": after, "elapsed_s": elapsed, "children": children}


async def fresh(store: str, root_id: str | None) -> int:
    async with Supervisor.open(store=store, config=config()) as sup:
        sup.register_provider(provider())
        if root_id is None:
            await sup.open_root(label="empty")
        else:
            await sup.open_root(id=root_id)
        return rss_bytes()


def fresh_rss(store: str, root_id: str | None) -> int:
    """RSS of a new process that opens ``store`` (and the root), run as this script with ``--fresh``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--fresh", store] + ([root_id] if root_id else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 children (under 60 s on 2 cores)")
    parser.add_argument("--n", type=int, default=0, help="children (default 10,000; 2,000 with --quick)")
    parser.add_argument("--fresh", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fresh:
        store, root_id = args.fresh[0], (args.fresh[1] if len(args.fresh) > 1 else None)
        print(anyio.run(fresh, store, root_id))
        return
    n = args.n or (2_000 if args.quick else 10_000)
    base = tempfile.mkdtemp(prefix="bench-idle-memory-", dir=temp_base())
    try:
        store = os.path.join(base, "store")
        print(f"{NAME}: {n} continuable echo children, {CONCURRENCY} unsettled at a time, after {WARM} warm-up children")
        got = anyio.run(host, store, n)
        grown = got["after"] - got["before"]
        per_child = grown / n
        print(f"host: RSS {got['before'] / 2**20:.1f} MiB at the baseline, {got['after'] / 2**20:.1f} MiB after "
              f"{n} settled children ({got['children']} listed, {n / got['elapsed_s']:.0f} children/s): "
              f"{per_child:.0f} bytes per child")
        empty = fresh_rss(os.path.join(base, "empty"), None)
        full = fresh_rss(store, got["root"])
        fresh_per_child = (full - empty) / (n + WARM)
        print(f"fresh supervisor: RSS {empty / 2**20:.1f} MiB on an empty store, {full / 2**20:.1f} MiB on the "
              f"populated one: {fresh_per_child:.0f} bytes per child")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    met = per_child < GOAL_BYTES_PER_CHILD
    print(f"bytes per child {per_child:.0f}  goal < {GOAL_BYTES_PER_CHILD}  {'met' if met else 'NOT met'}")
    print(json.dumps({
        "benchmark": NAME,
        "quick": args.quick,
        "children": n,
        "rss_baseline_bytes": got["before"],
        "rss_after_bytes": got["after"],
        "bytes_per_child": round(per_child, 1),
        "fresh_empty_rss_bytes": empty,
        "fresh_populated_rss_bytes": full,
        "fresh_bytes_per_child": round(fresh_per_child, 1),
        "children_per_s": round(n / got["elapsed_s"], 1),
        "goals_met": {"bytes_per_child": met},
    }))


if __name__ == "__main__":
    main()
