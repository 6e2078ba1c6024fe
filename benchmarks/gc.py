"""What a ``gc`` costs: old roots, each with a few children, collected by one ``store.collect``.

Run ``python benchmarks/gc.py [--quick]``. Everything is measured in this run,
on the same file system as the repository (``_common.temp_base``), and
removed afterwards.

Each store holds ``N`` roots (200 with ``--quick``, 2,000 without), each with
``CHILDREN`` children, made through ``create_session`` (under durability
``none``, then the file system is synced, so a measured run starts with
nothing dirty); the collection is asked with a clock an hour ahead, so every
subtree is old. What a collected session costs: its file is renamed into a
folder of ``trash/``, its children index (every root has one) and the folder
are removed, each file and folder held open until its folder is fsync'd and
then fsync'd as deleted (``atomic.Removal``: what makes the boot's
``e2fsck -p`` pass after a power loss on an ext4 without a journal).

* ``gc_ms`` / ``sessions_per_s``: ``collect`` under the default durability
  (``batched``: every removal durable), and ``fsyncs`` counted in this
  process during it (``os.fsync`` calls, folders included);
* ``gc_none_ms``: the same store built the same way, collected under
  durability ``none`` (no fsync at all);
* ``rmtree_ms``: ``shutil.rmtree`` of a folder laid out as gc's trash is (one
  folder per session holding a copy of its file) plus a copy of each children
  index: the same inodes, removed with no durability; ``rmtree_syncfs_ms``:
  that plus one ``syncfs`` of the file system, the cheapest way to make such
  a deletion durable (it also writes whatever else is dirty there).

Rounds: 2, the durable and the ``none`` run in A B then B A order; each
figure is the median (of two: their mean). The last stdout line is one JSON
object ``{"benchmark": "gc", ...}``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from _common import new_file_us, temp_base  # noqa: E402  (first: puts the repository on sys.path)

from subagents.store import Store, collect, create_session  # noqa: E402

NAME = "gc"
CHILDREN = 3
ROUNDS = 2


def build(root: str, roots: int) -> Store:
    """A store of ``roots`` roots with ``CHILDREN`` children each, on the device when it returns."""
    made = Store(root, durability="none")
    for r in range(roots):
        create_session(made, f"r{r}")
        for c in range(CHILDREN):
            create_session(made, f"r{r}c{c}", parent_session=f"r{r}")
    os.sync()
    return made


def timed_gc(root: str, durability: str, sessions: int) -> tuple[float, int]:
    """Milliseconds of one ``collect`` of every subtree of the store at ``root``, and the fsyncs it made."""
    store = Store(root, durability=durability, create=False)
    real_fsync = os.fsync
    calls = [0]

    def counting(fd: int) -> None:
        calls[0] += 1
        real_fsync(fd)

    os.fsync = counting  # every store module calls os.fsync through the module
    try:
        t0 = time.perf_counter()
        report = collect(store, 600.0, now=time.time() + 3600.0)
        elapsed = (time.perf_counter() - t0) * 1e3
    finally:
        os.fsync = real_fsync
    assert report.sessions == sessions and not report.skipped, report
    assert store.session_ids() == [], "every session collected"
    return elapsed, calls[0]


def trash_like(store: Store, folder: str) -> int:
    """A folder laid out as gc's trash of ``store`` (a folder per session with a copy of its file) plus
    a copy of every children index; the number of files and folders in it. Synced to the device."""
    os.mkdir(folder)
    count = 0
    for session_id in store.session_ids():
        inner = os.path.join(folder, f"{session_id}.0")
        os.mkdir(inner)
        shutil.copyfile(store.session_path(session_id), os.path.join(inner, "session"))
        count += 2
    for name in os.listdir(store.children_index_dir):
        shutil.copyfile(os.path.join(store.children_index_dir, name), os.path.join(folder, f"index-{name}"))
        count += 1
    os.sync()
    return count


def syncfs(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs failed")
    finally:
        os.close(fd)


def run(base: str, roots: int) -> dict[str, Any]:
    sessions = roots * (1 + CHILDREN)
    durable_ms: list[float] = []
    none_ms: list[float] = []
    fsyncs: list[int] = []
    rmtree_ms: list[float] = []
    rmtree_syncfs_ms: list[float] = []
    probe = new_file_us(base)
    for round_no in range(ROUNDS):
        order = ("batched", "none") if round_no % 2 == 0 else ("none", "batched")
        for durability in order:
            root = os.path.join(base, f"store-{round_no}-{durability}")
            t0 = time.perf_counter()
            built = build(root, roots)
            print(f"  round {round_no + 1}: built {sessions:,} sessions in {time.perf_counter() - t0:.1f} s", flush=True)
            if durability == "batched":
                copy = os.path.join(base, f"rmtree-{round_no}")
                inodes = trash_like(built, copy)
                t0 = time.perf_counter()
                shutil.rmtree(copy)
                rmtree_ms.append((time.perf_counter() - t0) * 1e3)
                syncfs(base)
                rmtree_syncfs_ms.append((time.perf_counter() - t0) * 1e3)
                print(f"  round {round_no + 1}: rmtree of {inodes:,} files and folders {rmtree_ms[-1]:.0f} ms, "
                      f"with syncfs {rmtree_syncfs_ms[-1]:.0f} ms", flush=True)
            elapsed, calls = timed_gc(root, durability, sessions)
            (durable_ms if durability == "batched" else none_ms).append(elapsed)
            if durability == "batched":
                fsyncs.append(calls)
            print(f"  round {round_no + 1}: gc ({durability}) of {sessions:,} sessions {elapsed:.0f} ms, {calls:,} fsyncs", flush=True)
            shutil.rmtree(root)
    gc_ms = statistics.median(durable_ms)
    gc_none = statistics.median(none_ms)
    return {
        "benchmark": NAME,
        "roots": roots,
        "children_per_root": CHILDREN,
        "sessions": sessions,
        "rounds": ROUNDS,
        "gc_ms": round(gc_ms, 1),
        "sessions_per_s": round(sessions / gc_ms * 1e3),
        "fsyncs": int(statistics.median(fsyncs)),
        "fsyncs_per_session": round(statistics.median(fsyncs) / sessions, 2),
        "gc_none_ms": round(gc_none, 1),
        "gc_none_sessions_per_s": round(sessions / gc_none * 1e3),
        "durable_over_none": round(gc_ms / gc_none, 2),
        "rmtree_ms": round(statistics.median(rmtree_ms), 1),
        "rmtree_syncfs_ms": round(statistics.median(rmtree_syncfs_ms), 1),
        "gc_ms_runs": [round(x, 1) for x in durable_ms],
        "gc_none_ms_runs": [round(x, 1) for x in none_ms],
        "new_file_us_before": round(probe, 1),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 roots (under 60 s on 2 cores); 2,000 without")
    args = parser.parse_args()
    roots = 200 if args.quick else 2000
    base = tempfile.mkdtemp(prefix=".bench-gc-", dir=temp_base())
    print(f"{NAME}: temp folder {base}{' (quick)' if args.quick else ''}; {roots:,} roots of {CHILDREN} children each")
    try:
        result = run(base, roots)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["quick"] = args.quick
    print()
    print(f"gc of {result['sessions']:,} sessions: {result['gc_ms']:.0f} ms durable ({result['sessions_per_s']:,}/s, "
          f"{result['fsyncs']:,} fsyncs, {result['fsyncs_per_session']} per session), {result['gc_none_ms']:.0f} ms under "
          f"durability none ({result['durable_over_none']}x)")
    print(f"rmtree of the same files and folders: {result['rmtree_ms']:.0f} ms, {result['rmtree_syncfs_ms']:.0f} ms with one syncfs")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
