"""Host CPU per continuable child while its root's settlement notices pile up, against taking them as they come.

Run ``python benchmarks/notices.py [--quick]``. Everything is measured in
this run, on the repository's file system, and removed afterwards.

A host that starts a batch of continuable children and collects their
notices at the end leaves them pending in its root's mailbox. Each notice is
an acceptance into that mailbox; what one costs must not grow with the
notices already waiting there.

* **pending**: one ``Supervisor`` (pool of 2, durability ``batched``), one
  root; ``BLOCKS`` blocks of ``BLOCK`` continuable children (``script``,
  returning at once) started one after another, each block run until no turn
  is queued or resident; the root's messages are taken only at the end. The
  host's CPU time (``os.times``: user + system of this process, its workers
  are others) per child is taken per block.
* **baseline**: the same in a second store, the root's messages taken after
  each block (nothing piles up).

``pending_growth`` = the last block's CPU per child over the first's, with
notices pending (goal: at most 1.3, a constant cost); ``baseline_growth`` the
same for the baseline (what the disk and the host's warming up alone do);
``pending_vs_baseline`` = the pending run's last block over the baseline's
last block (goal: at most 1.3).

The last stdout line is one JSON object ``{"benchmark": "notices", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import anyio

from _common import temp_base

from subagents import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

GOAL_GROWTH = 1.3


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def _run(store: str, *, block: int, blocks: int, take_each_block: bool) -> list[float]:
    """CPU ms per child, per block."""
    per_block: list[float] = []
    prompt = json.dumps({"script": [{"return": "r"}]})
    config = SupervisorConfig(pool_size=2, durability="batched")
    async with Supervisor.open(store=store, config=config) as sup:
        sup.register_provider(Provider(name="s", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="notices")
        for number in range(blocks):
            before = _cpu_s()
            for index in range(block):
                await sup.start_continuable(ContinuableSpec(parent=root, provider="s", label=f"c{number}-{index}", prompt=prompt))
            with anyio.fail_after(600):
                while (stats := sup.statistics().pool).queued or stats.resident:
                    await anyio.sleep(0.01)
            per_block.append((_cpu_s() - before) / block * 1000)
            if take_each_block:
                await sup.take_messages(root)
            print(f"  block {number + 1}/{blocks}: {per_block[-1]:.2f} ms of host CPU per child", file=sys.stderr, flush=True)
        await sup.drain([root])
    return per_block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 blocks of 250 children (under 60 s on 2 cores)")
    args = parser.parse_args()
    block, blocks = (250, 4) if args.quick else (500, 6)
    base = tempfile.mkdtemp(prefix="notices-", dir=temp_base())
    try:
        print(f"baseline: {blocks} blocks of {block}, the root's messages taken after each", file=sys.stderr)
        baseline = anyio.run(lambda: _run(os.path.join(base, "baseline"), block=block, blocks=blocks, take_each_block=True))
        print(f"pending: {blocks} blocks of {block}, the root's messages taken at the end", file=sys.stderr)
        pending = anyio.run(lambda: _run(os.path.join(base, "pending"), block=block, blocks=blocks, take_each_block=False))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures = {
        "benchmark": "notices",
        "quick": args.quick,
        "children": block * blocks,
        "pending_cpu_ms_per_child": [round(value, 3) for value in pending],
        "baseline_cpu_ms_per_child": [round(value, 3) for value in baseline],
        "pending_growth": round(pending[-1] / pending[0], 3),
        "baseline_growth": round(baseline[-1] / baseline[0], 3),
        "pending_vs_baseline": round(pending[-1] / baseline[-1], 3),
    }
    figures["goals_met"] = {
        "pending_growth": figures["pending_growth"] <= GOAL_GROWTH,
        "pending_vs_baseline": figures["pending_vs_baseline"] <= GOAL_GROWTH,
    }
    for key in ("pending_growth", "baseline_growth", "pending_vs_baseline"):
        print(f"  {key:22s} {figures[key]:.3f}", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
