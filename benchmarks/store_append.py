"""Single-event appends through ``store.LogWriter`` against raw fsync and SQLite.

Run ``python benchmarks/store_append.py [--quick]``. Everything is measured in
this run, on the same file system as the repository (the temp folder is
``/tmp`` when it shares the repository's device, else a hidden folder under
``benchmarks/``), and removed afterwards.

What is measured (one event per ``append`` call: ``("assistant/message",
{"text": "x" * 100})``):

* ``strict`` / ``batched`` / ``none`` durability: appends per second. Under
  ``batched`` the loop calls ``writer.commit()`` (a commit point: fsync +
  identity cache) after every 64 appends, and that cost is included.
* raw baselines with records of the same byte size: ``os.write`` +
  ``os.fsync`` per record, and ``os.write`` per record + one ``fsync`` per 64.
* SQLite (stdlib ``sqlite3``), WAL, one transaction per inserted event, with
  ``synchronous=FULL`` (durable at every commit: the peer of ``strict``) and
  with ``synchronous=NORMAL`` (durable at checkpoints: the peer a user would
  pick for "durable at commit points", i.e. of ``batched``).

The goal against raw ``write`` + one ``fsync`` per 64 records is withdrawn:
reaching it needs user-space buffering of events, which a ``kill -9`` would
turn into lost ``tool/call`` records. That figure is still printed.
* contended: two processes appending to ONE session at epoch 0 under
  ``strict``, per-append latency, p99.9.
* lock comparison: two processes running ``lock + os.write + fsync +
  unlock`` with ``filelock`` (1 ms poll, the 30 s timeout the store's polled
  locks use) versus ``fcntl.flock`` on a held descriptor (what
  ``LogWriter.append`` and the index appends use); plus the uncontended cost
  of one acquire + release of each.

Throughputs are the median over rounds (the measurements are interleaved
round by round so disk drift hits every contender alike); latency
percentiles pool every sample of every round.

The last stdout line is one JSON object ``{"benchmark": "store_append", ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import multiprocessing
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from typing import Any, Callable, Iterator

from _common import REPO, percentile, temp_base  # noqa: E402  (first: puts the repository on sys.path)

import filelock  # noqa: E402
import msgpack  # noqa: E402

from subagents.store import LogWriter, Store, create_session, delete_session, encode_record, inspect, new_id  # noqa: E402
from subagents.store.projection import write_cache  # noqa: E402

NAME = "store_append"
EVENT_TYPE = "assistant/message"
EVENT_DATA = {"text": "x" * 100}
GROUP = 64  # batched: one commit point per GROUP appends; raw group: one fsync per GROUP writes

GOALS = {
    "strict_vs_sqlite": ">= 1.0",
    "batched_vs_sqlite_normal": ">= 1.0",
    "strict_p50_overhead_us": "<= 25",
    "contended_p999_ms": "<= 5",
}


# -- helpers -----------------------------------------------------------------------


def make_filelock(path: str) -> filelock.FileLock:
    """A ``filelock.FileLock`` as a polling lock would be set up: 30 s timeout, 1 ms poll, never deleted."""
    return filelock.FileLock(path, timeout=30.0, mode=0o600, thread_local=False, poll_interval=0.001,
                             preserve_lock_file=True, fallback_to_soft=False)


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    with make_filelock(path):
        yield


def record_bytes() -> bytes:
    """One framed record as the writer frames it (seq in the range the runs reach)."""
    return encode_record({"seq": 10_000, "ts": time.time(), "type": EVENT_TYPE, "data": EVENT_DATA, "epoch": 0})


class Result:
    def __init__(self, count: int, elapsed: float, latencies_ns: list[int], ends_ns: list[int] | None = None) -> None:
        self.count = count
        self.elapsed = elapsed
        self.latencies_ns = latencies_ns
        self.ends_ns = ends_ns or []

    @property
    def per_s(self) -> float:
        return self.count / self.elapsed


def timed_loop(seconds: float, op: Callable[[int], None], ends: list[int] | None = None) -> Result:
    """Call ``op(i)`` until ``seconds`` passed; time each call (and keep end times in ``ends``)."""
    lat: list[int] = []
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    start = clock()
    i = 0
    while True:
        t0 = clock()
        op(i)
        t1 = clock()
        lat.append(t1 - t0)
        if ends is not None:
            ends.append(t1)
        i += 1
        if t1 >= deadline:
            break
    return Result(i, (clock() - start) / 1e9, lat)


# -- contenders (single process) ---------------------------------------------------


def run_store(root: str, durability: str, seconds: float) -> Result:
    store = Store(root, durability=durability)
    sid = new_id()
    create_session(store, sid)
    writer = LogWriter.open(store, sid, epoch=0)
    batch = [(EVENT_TYPE, EVENT_DATA)]
    try:
        if durability == "batched":

            def op(i: int) -> None:
                writer.append(batch)
                if i % GROUP == GROUP - 1:
                    writer.commit()

        else:

            def op(i: int) -> None:
                writer.append(batch)

        result = timed_loop(seconds, op)
        writer.commit()
    finally:
        writer.close()
        delete_session(store, sid)
    return result


def run_raw_fsync(root: str, size: int, seconds: float, group: int = 1) -> Result:
    path = os.path.join(root, f"raw-{new_id()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    blob = b"r" * size
    try:
        if group == 1:

            def op(i: int) -> None:
                os.write(fd, blob)
                os.fsync(fd)

        else:

            def op(i: int) -> None:
                os.write(fd, blob)
                if i % group == group - 1:
                    os.fsync(fd)

        result = timed_loop(seconds, op)
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)
    return result


def run_sqlite(root: str, seconds: float, synchronous: str = "FULL") -> Result:
    path = os.path.join(root, f"sqlite-{new_id()}.db")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        assert mode == "wal", mode
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, ts REAL NOT NULL, type TEXT NOT NULL, data BLOB, epoch INTEGER NOT NULL)")
        insert = "INSERT INTO events (seq, ts, type, data, epoch) VALUES (?, ?, ?, ?, 0)"
        execute = conn.execute

        def op(i: int) -> None:
            execute("BEGIN")
            execute(insert, (i, time.time(), EVENT_TYPE, msgpack.packb(EVENT_DATA)))
            execute("COMMIT")

        return timed_loop(seconds, op)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass


# -- contended (two processes) -----------------------------------------------------


def _worker(kind: str, root: str, target: str, size: int, seconds: float, barrier: Any, out: Any) -> None:
    """One contending process; puts its per-op latencies and end times (ns) on ``out``."""
    ends: list[int] = []
    try:
        if kind == "store":
            store = Store(root, durability="strict", create=False)
            writer = LogWriter.open(store, target, epoch=0)
            batch = [(EVENT_TYPE, EVENT_DATA)]

            def op(i: int) -> None:
                writer.append(batch)

            barrier.wait()
            result = timed_loop(seconds, op, ends)
            writer.close()
        else:
            lock_path = os.path.join(root, "raw.lock")
            fd = os.open(os.path.join(root, target), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            blob = b"c" * size
            if kind == "filelock":

                def op(i: int) -> None:
                    with file_lock(lock_path):
                        os.write(fd, blob)
                        os.fsync(fd)

            else:
                lfd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

                def op(i: int) -> None:
                    fcntl.flock(lfd, fcntl.LOCK_EX)
                    try:
                        os.write(fd, blob)
                        os.fsync(fd)
                    finally:
                        fcntl.flock(lfd, fcntl.LOCK_UN)

            barrier.wait()
            result = timed_loop(seconds, op, ends)
            os.close(fd)
        out.put(("ok", os.getpid(), result.count, result.elapsed, result.latencies_ns, ends))
    except BaseException as exc:  # report, never hang the parent
        out.put(("error", os.getpid(), repr(exc), 0.0, [], []))


def run_contended(kind: str, root: str, target: str, size: int, seconds: float) -> list[Result]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, root, target, size, seconds, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        status, pid, count, elapsed, lat, ends = out.get(timeout=seconds + 120)
        if status != "ok":
            raise RuntimeError(f"contended {kind} worker {pid} failed: {count}")
        results.append(Result(count, elapsed, lat, ends))
    for p in procs:
        p.join(timeout=30)
    return results


def settle() -> None:
    """Start each measurement with no dirty pages or pending journal work from the previous one."""
    gc.collect()
    os.sync()


def identity_rewrite_us(root: str, seconds: float) -> float:
    """p50 of one identity-cache rewrite (``store.projection.write_cache``: open + pwrite + close).

    A commit point pays it only when a reader would miss what changed
    (``LogWriter._refresh_cache``), so most group commits here skip it.
    """
    store = Store(os.path.join(root, "store"), durability="batched")
    sid = new_id()
    create_session(store, sid)
    with LogWriter.open(store, sid, epoch=0) as writer:
        writer.append([(EVENT_TYPE, EVENT_DATA)])
        projection = writer.projection
    path = store.path(sid, "identity")
    result = timed_loop(seconds, lambda i: write_cache(path, projection))
    return percentile(result.latencies_ns, 0.5) / 1e3


def longest_run(runs: list[Result]) -> int:
    """Most consecutive operations completed by one process while the other waited (lock fairness).

    ``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, comparable across processes.
    """
    merged = sorted((t, who) for who, r in enumerate(runs) for t in r.ends_ns)
    best = cur = 0
    last = None
    for _, who in merged:
        cur = cur + 1 if who == last else 1
        last = who
        best = max(best, cur)
    return best


def uncontended_lock_us(root: str, seconds: float) -> dict[str, float]:
    """Mean cost of one uncontended acquire + release, µs."""
    path = os.path.join(root, "solo.lock")
    open(path, "ab").close()

    def fresh_filelock(i: int) -> None:
        with file_lock(path):  # a new FileLock per use
            pass

    held = make_filelock(path)

    def reused_filelock(i: int) -> None:
        with held:
            pass

    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def flock(i: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)

    out = {}
    try:
        for name, op in (("filelock", fresh_filelock), ("filelock_reused", reused_filelock), ("flock", flock)):
            timed_loop(0.05, op)  # warm up
            r = timed_loop(seconds, op)
            out[name] = r.elapsed / r.count * 1e6
    finally:
        os.close(fd)
    return out


# -- main ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s on 2 cores)")
    args = parser.parse_args()

    rounds, slice_s, contend_s, lock_s = (2, 1.0, 2.0, 0.3) if args.quick else (5, 3.0, 8.0, 1.0)
    size = len(record_bytes())
    base = temp_base()
    root = tempfile.mkdtemp(prefix=".bench-store-append-", dir=base)
    same_fs = os.stat(root).st_dev == os.stat(REPO).st_dev
    print(f"{NAME}: temp folder {root} (same file system as {REPO}: {same_fs})")
    print(f"event: ({EVENT_TYPE!r}, {{'text': 'x' * 100}}), framed record = {size} bytes; "
          f"{rounds} rounds x {slice_s:.1f} s per contender{' (quick)' if args.quick else ''}")
    print(f"batched: writer.commit() (a commit point: fsync + identity cache) after every {GROUP} appends; "
          f"raw group baseline: one fsync per {GROUP} writes")
    try:
        contenders: dict[str, Callable[[], Result]] = {
            "raw_fsync": lambda: run_raw_fsync(root, size, slice_s),
            "strict": lambda: run_store(os.path.join(root, "store"), "strict", slice_s),
            "sqlite_full": lambda: run_sqlite(root, slice_s),
            "sqlite_normal": lambda: run_sqlite(root, slice_s, synchronous="NORMAL"),
            "raw_group": lambda: run_raw_fsync(root, size, slice_s, group=GROUP),
            "batched": lambda: run_store(os.path.join(root, "store"), "batched", slice_s),
            "none": lambda: run_store(os.path.join(root, "store"), "none", slice_s),
        }
        rates: dict[str, list[float]] = {k: [] for k in contenders}
        lats: dict[str, list[int]] = {k: [] for k in contenders}
        commit_lat: list[int] = []  # batched appends that carried a commit point
        for r in range(rounds):
            for key, run in contenders.items():
                settle()
                res = run()
                rates[key].append(res.per_s)
                lats[key].extend(res.latencies_ns)
                if key == "batched":
                    commit_lat.extend(res.latencies_ns[GROUP - 1 :: GROUP])
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()))
        per_s = {k: statistics.median(v) for k, v in rates.items()}
        p50_us = {k: percentile(v, 0.5) / 1e3 for k, v in lats.items()}
        p99_us = {k: percentile(v, 0.99) / 1e3 for k, v in lats.items()}
        p999_us = {k: percentile(v, 0.999) / 1e3 for k, v in lats.items()}
        max_us = {k: max(v) / 1e3 for k, v in lats.items()}

        # contended: two processes, one session, epoch 0, strict
        cstore = Store(os.path.join(root, "contended"), durability="strict")
        target = new_id()
        create_session(cstore, target)
        settle()
        store_runs = run_contended("store", cstore.root, target, size, contend_s)
        found = inspect(cstore, target)
        appended = sum(r.count for r in store_runs)
        log_ok = found.status == "clean" and len(found.events) == appended
        store_lat = [x for r in store_runs for x in r.latencies_ns]
        settle()
        fl_runs = run_contended("filelock", root, "raw-filelock", size, contend_s)
        settle()
        fk_runs = run_contended("flock", root, "raw-flock", size, contend_s)
        fl_lat = [x for r in fl_runs for x in r.latencies_ns]
        fk_lat = [x for r in fk_runs for x in r.latencies_ns]
        solo = uncontended_lock_us(root, lock_s)
        settle()
        identity_us = identity_rewrite_us(root, lock_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    strict_vs_sqlite = per_s["strict"] / per_s["sqlite_full"]
    batched_vs_raw_group = per_s["batched"] / per_s["raw_group"]
    batched_vs_sqlite_normal = per_s["batched"] / per_s["sqlite_normal"]
    overhead_us = p50_us["strict"] - p50_us["raw_fsync"]
    contended_p999_ms = percentile(store_lat, 0.999) / 1e6

    print()
    print(f"{'contender':<34}{'per s':>12}{'p50 us':>10}{'p99 us':>10}{'p99.9 us':>10}{'max us':>10}")
    labels = {
        "strict": "store strict (fsync each)",
        "batched": f"store batched (commit / {GROUP})",
        "none": "store none",
        "raw_fsync": "raw write+fsync",
        "raw_group": f"raw write, fsync / {GROUP}",
        "sqlite_full": "sqlite WAL sync=FULL, 1 tx/event",
        "sqlite_normal": "sqlite WAL sync=NORMAL, 1 tx/event",
    }
    for key in ("strict", "batched", "none", "raw_fsync", "raw_group", "sqlite_full", "sqlite_normal"):
        print(f"{labels[key]:<34}{per_s[key]:>12,.0f}{p50_us[key]:>10.1f}{p99_us[key]:>10.1f}"
              f"{p999_us[key]:>10.1f}{max_us[key]:>10.0f}")
    print(f"store CPU cost per append (durability none): {1e6 / per_s['none']:.1f} us; "
          f"batched: an append carrying a commit point p50 {percentile(commit_lat, 0.5) / 1e3:.0f} us, "
          f"an identity-cache rewrite (open + pwrite + close, done only when readers need it) is p50 {identity_us:.0f} us")
    print()
    print(f"contended store (2 processes, 1 session, strict): {appended:,} appends "
          f"({', '.join(f'{r.per_s:,.0f}/s' for r in store_runs)}), "
          f"p50 {percentile(store_lat, 0.5) / 1e6:.3f} ms, p99 {percentile(store_lat, 0.99) / 1e6:.3f} ms, "
          f"p99.9 {contended_p999_ms:.3f} ms, max {max(store_lat) / 1e6:.1f} ms; log afterwards: "
          f"{found.status}, {len(found.events):,} events ({'ok' if log_ok else 'MISMATCH'}); "
          f"longest run of one writer while the other waited: {longest_run(store_runs)} appends")
    for label, runs, lat in (("filelock (1 ms poll)", fl_runs, fl_lat), ("fcntl.flock held fd", fk_runs, fk_lat)):
        print(f"contended raw lock+write+fsync, {label}: "
              f"{', '.join(f'{r.count:,} ops' for r in runs)}, "
              f"p50 {percentile(lat, 0.5) / 1e6:.3f} ms, p99 {percentile(lat, 0.99) / 1e6:.3f} ms, "
              f"p99.9 {percentile(lat, 0.999) / 1e6:.3f} ms, max {max(lat) / 1e6:.1f} ms, "
              f"longest run of one process: {longest_run(runs)} ops")
    print(f"uncontended acquire+release: filelock (new FileLock per use, as the store does) {solo['filelock']:.1f} us, "
          f"filelock (reused object) {solo['filelock_reused']:.1f} us, flock on held fd {solo['flock']:.2f} us")

    figures = {
        "strict_vs_sqlite": strict_vs_sqlite,
        "batched_vs_sqlite_normal": batched_vs_sqlite_normal,
        "strict_p50_overhead_us": overhead_us,
        "contended_p999_ms": contended_p999_ms,
    }
    met = {
        "strict_vs_sqlite": strict_vs_sqlite >= 1.0,
        "batched_vs_sqlite_normal": batched_vs_sqlite_normal >= 1.0,
        "strict_p50_overhead_us": overhead_us <= 25.0,
        "contended_p999_ms": contended_p999_ms <= 5.0,
    }
    print()
    print("goals:")
    for key, goal in GOALS.items():
        print(f"  {key:<26} {figures[key]:>10.3f}  goal {goal:<7} {'met' if met[key] else 'NOT met'}")

    summary = {
        "benchmark": NAME,
        "quick": args.quick,
        "record_bytes": size,
        "batched_commit_every": GROUP,
        "strict_per_s": round(per_s["strict"], 1),
        "batched_per_s": round(per_s["batched"], 1),
        "none_per_s": round(per_s["none"], 1),
        "raw_fsync_per_s": round(per_s["raw_fsync"], 1),
        "raw_group_per_s": round(per_s["raw_group"], 1),
        "sqlite_full_per_s": round(per_s["sqlite_full"], 1),
        "sqlite_normal_per_s": round(per_s["sqlite_normal"], 1),
        "strict_vs_sqlite": round(strict_vs_sqlite, 3),
        "batched_vs_raw_group": round(batched_vs_raw_group, 3),
        "batched_vs_sqlite_normal": round(batched_vs_sqlite_normal, 3),
        "strict_p50_us": round(p50_us["strict"], 1),
        "raw_fsync_p50_us": round(p50_us["raw_fsync"], 1),
        "strict_p50_overhead_us": round(overhead_us, 1),
        "contended_p999_ms": round(contended_p999_ms, 3),
        "contended_appends": appended,
        "contended_longest_run": longest_run(store_runs),
        "contended_log_ok": log_ok,
        "filelock_contended_p999_ms": round(percentile(fl_lat, 0.999) / 1e6, 3),
        "flock_contended_p999_ms": round(percentile(fk_lat, 0.999) / 1e6, 3),
        "filelock_uncontended_us": round(solo["filelock"], 2),
        "filelock_reused_uncontended_us": round(solo["filelock_reused"], 2),
        "flock_uncontended_us": round(solo["flock"], 2),
        "batched_commit_append_p50_us": round(percentile(commit_lat, 0.5) / 1e3, 1),
        "identity_rewrite_p50_us": round(identity_us, 1),
        "goals_met": met,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
