"""Catalog cost against corpus size: ``list_children`` must cost O(children), not O(store).

Run ``python benchmarks/catalog_scale.py [--quick]``.

Two stores hold the same family — a root parent with 1,000 subagent children
(half one-shot, half continuable; 2% of them with a child of their own; 100
with a live lease, ``running`` or ``idle``, and 100 with a released one) — and
differ only in what else they hold:

* small: the family alone (about 1,000 sessions);
* large: the family plus unrelated roots with their own children (every log
  holding a finished turn) up to 100,000 sessions (10,000 with ``--quick``),
  including a root with a tree of 1,010 descendants for ``list_descendants``.

Every child whose turns a writer appended lived as a real one does: created
leased to its creator (``create_session(lease_owner=...)``), its turns
appended at epoch 1, its lease released — which writes its ``settled`` row
into the parent's children index (``store/rows.py``). So a settled child is
listed from the index alone, and the 100 live ones from their own files.

The stores are built directly in the real format (``encode_record``,
``SessionHeader``, ``Projection``, ``Lease``, the index record layout),
because the API costs several locks and fsyncs per child. Before the timing,
a self-check builds a small tree both ways — through ``create_session`` +
``LogWriter`` + ``release_lease`` and through the fast builder, with the
same ids and a frozen clock — and requires the two stores to be identical
byte for byte (paths, modes, contents; a ``settled`` row's ``mtime_ns`` is
compared as "the child's file's time", which no two builds share) and
``check_store`` to find every row true; the benchmark stores are then checked
through ``store.list_children``.

Goals (issue 12): ``list_children`` of the 1,000 children in the large store
(100,000 sessions) <= 25 ms (``large_ms``, ``goal_large_met``), and <= 1.2x
the same in the small store (``ratio``, ``goal_ratio_met``).

Timings are medians over several warm-cache runs, small and large
interleaved. The last stdout line is one JSON object
``{"benchmark": "catalog_scale", ...}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import stat
import statistics
import tempfile
import time
import types
from collections import Counter
from typing import Any, Callable, Sequence

from _common import REPO, temp_base  # noqa: E402  (first: puts the repository on sys.path)


import subagents.store.lease as store_lease  # noqa: E402
import subagents.store.log as store_log  # noqa: E402
from subagents.store.index import IndexEntry, Settled  # noqa: E402
from subagents.store.lease_record import Lease  # noqa: E402
from subagents.store.outcome import outcome_of  # noqa: E402
from subagents.store.session_file import SessionFile, block_padding, encode_session  # noqa: E402
import subagents.store.session as store_session  # noqa: E402
from subagents.store import (  # noqa: E402
    ChildEntry,
    IdGenerator,
    LogWriter,
    Projection,
    Store,
    acquire_lease,
    create_session,
    encode_record,
    find_roots,
    list_children,
    list_descendants,
    read_children,
    register_owner,
    release_lease,
)
from subagents.store.check import check_store  # noqa: E402
from subagents.store.framing import scan  # noqa: E402
from subagents.store.roots import roots_index_path  # noqa: E402

NAME = "catalog_scale"
FAMILY_CHILDREN = 1_000
GOAL_RATIO = 1.2
GOAL_LARGE_MS = 25.0  # issue 12 item 5: list_children of 1,000 children in the large store (100,000 sessions)
GOAL_ROOTS_MS = 50.0  # issue 15: a store of 100,000 sessions lists its 20 newest roots in <= 50 ms
FILE_MODE = 0o600
CREATOR = "bench-creator"  # the owner every settled child was created leased to (never registered: it is gone)

Event = tuple[str, Any]


# -- what the sessions hold ------------------------------------------------------


def descriptor(i: int) -> dict[str, Any]:
    if i % 2:
        return {"version": 1, "mode": "one-shot", "provider": "echo", "label": f"task {i}"}
    return {
        "version": 1,
        "mode": "continuable",
        "provider": "llm",
        "label": f"helper {i}",
        "agent_provider": "anthropic",
        "agent_model": "claude-sonnet",
        "persona": "reviewer",
        "tool_filter": {"allow": ["read", "grep"], "deny": ["shell"]},
    }


def child_creation_events(i: int) -> list[Event]:
    events: list[Event] = [("subagent/descriptor", descriptor(i))]
    if i % 2 == 0:
        events.append(("sandbox/mode", {"mode": "read-only"}))
    return events


def turn_events(i: int, turns: int = 1) -> list[Event]:
    """What a writer appends later: finished turns with a step each."""
    out: list[Event] = []
    for t in range(turns):
        out += [
            ("turn/start", {"turn": t}),
            ("step/start", {"step": 0}),
            ("assistant/message", {"text": f"answer {i}.{t} " + "x" * 80}),
            ("step/end", {"step": 0}),
            ("turn/end", {"stop_reason": "completed"}),
        ]
    return out


# -- the fast builder -------------------------------------------------------------


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class Builder:
    """Writes sessions in the real format, as ``create_session`` followed by one
    ``LogWriter`` (epoch 0) append + commit of ``later`` would, without the
    per-file tmp/rename, the index lock and the index rescan per child.

    Index files are written by ``finish()``.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index: dict[str, list[bytes]] = {}
        self.roots: list[bytes] = []
        self.root_ids: list[str] = []  # in creation order (the clock is strictly increasing)
        self.unsettled: dict[str, tuple[str, Projection, float]] = {}  # created leased, lease not yet released
        self.count = 0

    def session(
        self,
        session_id: str,
        *,
        created_at: float,
        ts: float,
        parent_session: str | None = None,
        origin: str | None = None,
        delegation_depth: int = 0,
        events: Sequence[Event] = (),
        later: Sequence[Event] = (),
        settle: bool = True,
    ) -> None:
        # the header create_session would publish
        header = store_session.NewSession(
            session_id, parent_session=parent_session, origin=origin, delegation_depth=delegation_depth, created_at=created_at,
        ).header()
        settles = _settles(origin, later)
        # the log: creation events at epoch 0, then what the writer appended (epoch 1 when it held the lease)
        projection = Projection(seed_length=0)
        created = None  # the identity create_session's own fold of the creation events names (the index entry's mode, label)
        chunks: list[bytes] = []
        offset = 0
        for seq, (kind, data) in enumerate(list(events) + list(later)):
            row = {"seq": seq, "ts": ts, "type": kind, "data": data, "epoch": 1 if settles and seq >= len(events) else 0}
            chunk = encode_record(row)
            projection.apply(row, offset, offset + len(chunk))
            chunks.append(chunk)
            offset += len(chunk)
            if seq == len(events) - 1:
                created = projection.identity
        # one file (store/session_file.py): created leased (epoch 1, running) when a writer appends
        # later, released at the end (a write into the other lease slot, as release_lease does)
        lease = Lease(CREATOR, 1, "running", ts) if settles else None
        blob = encode_session(header.to_record(), lease, b"".join(chunks))
        # padded to a block as every writer leaves it (FORMAT.md §3.4)
        _write_new(self.store.session_path(session_id), blob + block_padding(len(blob)))
        if parent_session is not None:
            entries = self.index.setdefault(parent_session, [])
            mode = label = None
            if origin == "subagent" and created is not None and not isinstance(created, str):
                mode, label = created.mode, created.label
            # store/index.py add_child: IndexEntry.creation_record() + "seq"
            entries.append(encode_record({**IndexEntry(session_id, header.created_at, origin, mode, label).creation_record(),
                                          "seq": len(entries)}))
            if settles:
                self.unsettled[session_id] = (parent_session, projection, ts)
                if settle:
                    self.settle(session_id)
        else:
            # store/roots.py add_root: {"id", "created_at"} + "seq"
            self.roots.append(encode_record({"id": session_id, "created_at": header.created_at, "seq": len(self.roots)}))
            self.root_ids.append(session_id)
            # store/index.py prepare_index: a root's children index is made, empty, with the root
            self.index.setdefault(session_id, [])
        self.count += 1

    def settle(self, session_id: str) -> None:
        """``release_lease`` of a child created leased: its ``settled`` row (store/rows.py note_settled)."""
        parent_session, projection, ts = self.unsettled.pop(session_id)
        with SessionFile.open(session_id, self.store.session_path(session_id), write=True) as file:
            file.write_lease(file.read_slots(), Lease(CREATOR, 1, "released", ts), synced=False)
            end = file.data_start + projection.end_offset  # where its log's records end (the row's ``end``)
            mtime_ns = os.fstat(file.fd).st_mtime_ns  # the file's time after the release's write (``mtime_ns``)
        verdict = outcome_of(projection, held=False)
        has_children = bool(self.index.get(session_id))  # every child the builder writes is a subagent
        settled = Settled(verdict.outcome, verdict.error_code, verdict.error, projection.last_ts, has_children, end, mtime_ns)
        entries = self.index[parent_session]
        entries.append(encode_record({"id": session_id, "state": "settled", **settled.to_record(), "seq": len(entries)}))

    def finish(self) -> None:
        for parent_id, entries in self.index.items():
            path = self.store.children_index_path(parent_id)
            _write_new(path, b"".join(entries))  # its own lock: no lock file beside it (format 4)
        self.index.clear()
        if self.roots:
            path = roots_index_path(self.store)
            _write_new(path, b"".join(self.roots))
            self.roots.clear()


def _settles(origin: str | None, later: Sequence[Event]) -> bool:
    """A subagent child whose turns a writer appended: created leased, its lease released after them."""
    return origin == "subagent" and bool(later)


class RealBuilder:
    """The same calls through the public API (``create_session`` + ``LogWriter``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.count = 0

    def session(
        self,
        session_id: str,
        *,
        created_at: float,
        ts: float,
        parent_session: str | None = None,
        origin: str | None = None,
        delegation_depth: int = 0,
        events: Sequence[Event] = (),
        later: Sequence[Event] = (),
        settle: bool = True,
    ) -> None:
        clock = types.SimpleNamespace(time=lambda: ts)
        saved = store_session.time, store_log.time, store_lease.time
        store_session.time = store_log.time = store_lease.time = clock  # type: ignore[assignment]
        settles = _settles(origin, later)
        try:
            create_session(
                self.store, session_id, parent_session=parent_session, origin=origin,
                delegation_depth=delegation_depth, events=events, created_at=created_at,
                lease_owner=CREATOR if settles else None,
            )
            if later:
                with LogWriter.open(self.store, session_id, epoch=1 if settles else 0) as writer:
                    writer.append(later, commit=True)
            if settles and settle:
                release_lease(self.store, session_id, CREATOR, 1)
        finally:
            store_session.time, store_log.time, store_lease.time = saved
        self.count += 1

    def settle(self, session_id: str) -> None:
        release_lease(self.store, session_id, CREATOR, 1)

    def finish(self) -> None:
        pass


class Clock:
    """Strictly increasing creation times and time-ordered ids."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.ids = IdGenerator()

    def next(self) -> tuple[str, float]:
        self.now += 0.001
        return self.ids.new(), self.now


# -- populations ------------------------------------------------------------------------


def build_family(b: Builder | RealBuilder, clock: Clock, children: int, *, grandchild_every: int = 50) -> tuple[str, list[str]]:
    """A root parent with ``children`` subagent children; every ``grandchild_every``-th child has one child."""
    parent, at = clock.next()
    b.session(parent, created_at=at, ts=at, later=turn_events(0))
    kids = []
    for i in range(children):
        kid, at = clock.next()
        grandchild = bool(grandchild_every) and i % grandchild_every == grandchild_every - 1
        # a child settles after its own children were created (they are created during its turn)
        b.session(kid, created_at=at, ts=at, parent_session=parent, origin="subagent", delegation_depth=1,
                  events=child_creation_events(i), later=turn_events(i, 1 + i % 2), settle=not grandchild)
        kids.append(kid)
        if grandchild:
            grand, at = clock.next()
            b.session(grand, created_at=at, ts=at, parent_session=kid, origin="subagent", delegation_depth=2,
                      events=child_creation_events(i + 1), later=turn_events(i))
            b.settle(kid)
    return parent, kids


def build_tree(b: Builder | RealBuilder, clock: Clock, fanout: Sequence[int]) -> tuple[str, int]:
    """A root with a tree of subagents; ``fanout[d]`` children per node at depth d. Returns (root, descendants)."""
    root, at = clock.next()
    b.session(root, created_at=at, ts=at, later=turn_events(0))
    level, total, levels = [root], 0, []
    for depth, width in enumerate(fanout, start=1):
        nxt = []
        for node in level:
            for i in range(width):
                kid, at = clock.next()
                b.session(kid, created_at=at, ts=at, parent_session=node, origin="subagent", delegation_depth=depth,
                          events=child_creation_events(i), later=turn_events(i), settle=False)
                nxt.append(kid)
        total += len(nxt)
        levels.append(nxt)
        level = nxt
    for nodes in reversed(levels):  # each node settles after its children were created, as a real one does
        for node in nodes:
            b.settle(node)
    return root, total


def build_filler(b: Builder | RealBuilder, clock: Clock, sessions: int, progress: Callable[[int], None]) -> None:
    """Unrelated roots with 0..15 children each, every log holding finished turns.

    Their events are written at creation (``create_session(events=...)``), so
    they have no ``.lock`` file: one file fewer to create and remove per
    session than a session a LogWriter has opened; the catalog reads neither.
    """
    made, r = 0, 0
    while made < sessions:
        root, at = clock.next()
        b.session(root, created_at=at, ts=at, events=turn_events(r, 1 + r % 3))
        made += 1
        for i in range(min(r % 16, sessions - made)):
            kid, at = clock.next()
            b.session(kid, created_at=at, ts=at, parent_session=root, origin="subagent", delegation_depth=1,
                      events=child_creation_events(i) + turn_events(i, 1 + i % 2))
            made += 1
        r += 1
        if r % 500 == 0:
            progress(made)


def lease_family(store: Store, kids: list[str]) -> None:
    """Through the real lease API: 50 running + 50 idle (live owner), 100 released again.

    Each acquisition appends the child's ``active`` row and each release its ``settled`` row
    (``store/rows.py``): 100 children are then listed from their own files, 900 from the index."""
    owner = "bench-owner-" + IdGenerator().new()
    register_owner(store, owner, ttl=3600.0)
    for i, kid in enumerate(kids[:200]):
        lease = acquire_lease(store, kid, owner, state="running" if i % 2 else "idle")
        if i >= 100:
            release_lease(store, kid, owner, lease.epoch)


# -- self-check: the builder writes what the API writes ---------------------------------


def snapshot(root: str) -> dict[str, tuple[str, int, bytes]]:
    """Every path's kind, mode and bytes; in a children index, a ``settled`` row's ``mtime_ns`` (a
    time two builds never share) must be its child's file's time, as the release leaves it (else no
    listing takes the row), and is compared as that."""
    out = {}
    children = os.path.join(root, "index", "children")
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
            data = b""
            if kind == "file":
                with open(path, "rb") as handle:
                    data = handle.read()
                if folder == children:
                    data = b"".join(encode_record(_timeless(root, record)) for record in scan(data).records)
            out[os.path.relpath(path, root)] = (kind, stat.S_IMODE(st.st_mode), data)
    return out


def _timeless(root: str, record: dict[str, Any]) -> dict[str, Any]:
    if "mtime_ns" not in record:
        return record
    if os.lstat(os.path.join(root, "sessions", record["id"])).st_mtime_ns != record["mtime_ns"]:
        raise SystemExit(f"{NAME}: the settled row of {record['id']} names a time its file does not have: no listing takes it")
    return {**record, "mtime_ns": "its file's time"}


def self_check(base: str) -> str:
    """Build one small population both ways with the same ids and a frozen clock; compare every byte."""
    roots = []
    try:
        snaps = []
        listings = []
        for cls in (RealBuilder, Builder):
            root = tempfile.mkdtemp(prefix=".bench-catalog-check-", dir=base)
            roots.append(root)
            store = Store(root, durability="none")
            b = cls(store)
            clock = Clock(1_700_000_000.0)
            clock.ids = _FixedIds()
            parent, _ = build_family(b, clock, 12, grandchild_every=5)
            tree, _ = build_tree(b, clock, (2, 2))
            build_filler(b, clock, 20, lambda made: None)
            b.finish()
            snaps.append(snapshot(root))
            listings.append((list_children(store, parent), list_descendants(store, tree)))
            report = check_store(store)
            if not report.clean:  # every row the builders wrote says what the children's files say
                raise SystemExit(f"{NAME}: the self-check store is not clean:\n{report}")
        real, fast = snaps
        if real != fast:
            diff = sorted(k for k in set(real) | set(fast) if real.get(k) != fast.get(k))
            raise SystemExit(f"{NAME}: the fast builder differs from create_session + LogWriter at: {diff[:10]}")
        if listings[0] != listings[1] or len(listings[0][0]) != 12 or len(listings[0][1]) != 6:
            raise SystemExit(f"{NAME}: listings of the self-check stores differ or are incomplete")
        return f"identical ({len(real)} paths)"
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


class _FixedIds:
    """Deterministic ids for the self-check (both builds must use the same ids)."""

    def __init__(self) -> None:
        self.n = 0

    def new(self) -> str:
        self.n += 1
        return f"01CHECK{self.n:019d}"


# -- measurement ---------------------------------------------------------------------------


def median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times


def create_child_us(base: str, indexed: int, samples: int) -> float:
    """Median cost of one ``create_session`` of a child (durability none) whose parent already has ``indexed`` children."""
    root = tempfile.mkdtemp(prefix=".bench-catalog-create-", dir=base)
    try:
        store = Store(root, durability="none")
        b = Builder(store)
        clock = Clock(time.time())
        parent, _ = build_family(b, clock, indexed, grandchild_every=0)
        b.finish()
        times = []
        for i in range(samples):
            kid, at = clock.next()
            t0 = time.perf_counter()
            create_session(store, kid, parent_session=parent, origin="subagent", delegation_depth=1,
                           events=child_creation_events(i), created_at=at)
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s on 2 cores); 10,000 sessions in the large store")
    args = parser.parse_args()
    large_target = 10_000 if args.quick else 100_000
    runs = 7 if args.quick else 15

    base = temp_base()
    print(f"{NAME}: temp folders under {base} (same file system as {REPO}: {os.stat(base).st_dev == os.stat(REPO).st_dev})")
    t0 = time.perf_counter()
    print(f"self-check, fast builder vs create_session + LogWriter: {self_check(base)} ({time.perf_counter() - t0:.1f} s)")
    # the index append cost of a creation, measured on a quiet disk before the big stores exist
    os.sync()
    create_first = create_child_us(base, 0, 20)
    os.sync()
    create_at = create_child_us(base, FAMILY_CHILDREN, 20)

    small_root = tempfile.mkdtemp(prefix=".bench-catalog-small-", dir=base)
    large_root = tempfile.mkdtemp(prefix=".bench-catalog-large-", dir=base)
    try:
        t0 = time.perf_counter()
        small = Store(small_root, durability="none")
        sb = Builder(small)
        small_parent, small_kids = build_family(sb, Clock(time.time() - 86400), FAMILY_CHILDREN)
        sb.finish()
        lease_family(small, small_kids)
        small_sessions = sb.count
        print(f"small store: {small_sessions:,} sessions (parent + {FAMILY_CHILDREN:,} children + grandchildren), "
              f"built in {time.perf_counter() - t0:.1f} s")

        t0 = time.perf_counter()
        large = Store(large_root, durability="none")
        lb = Builder(large)
        clock = Clock(time.time() - 86400)
        tree_root, tree_size = build_tree(lb, clock, (10, 10, 9))
        filler = large_target - small_sessions - (1 + tree_size)

        shown = [0]

        def progress(made: int) -> None:
            if lb.count - shown[0] >= 20_000:
                shown[0] = lb.count
                print(f"  large store: {lb.count:,} sessions written ({time.perf_counter() - t0:.0f} s)", flush=True)

        build_filler(lb, clock, filler // 2, progress)
        large_parent, large_kids = build_family(lb, clock, FAMILY_CHILDREN)
        build_filler(lb, clock, filler - filler // 2, progress)
        lb.finish()
        lease_family(large, large_kids)
        large_sessions = lb.count
        print(f"large store: {large_sessions:,} sessions (the same family, a {tree_size:,}-descendant tree, "
              f"unrelated roots with children), built in {time.perf_counter() - t0:.1f} s")

        # no os.sync() here: files removed before writeback never get blocks (or, with the
        # 'discard' mount option, discards), which keeps the clean-up cheap; the timed
        # listings only read the page cache

        # correctness of what we time
        for label, st, parent in (("small", small, small_parent), ("large", large, large_parent)):
            rows = list_children(st, parent)
            kinds = Counter(r.status if isinstance(r, ChildEntry) else "diagnostic" for r in rows)
            with_kids = sum(1 for r in rows if isinstance(r, ChildEntry) and r.has_children)
            if len(rows) != FAMILY_CHILDREN or kinds["diagnostic"]:
                raise SystemExit(f"{NAME}: {label} listing is wrong: {len(rows)} rows, {dict(kinds)}")
            print(f"  {label}: list_children -> {len(rows):,} children {dict(sorted(kinds.items()))}, {with_kids} with children")
        desc_rows = list_descendants(large, tree_root)
        if len(desc_rows) != tree_size:
            raise SystemExit(f"{NAME}: list_descendants found {len(desc_rows)} of {tree_size}")
        print(f"  large: list_descendants -> {len(desc_rows):,} rows, max depth {max(r.depth for r in desc_rows)}")
        newest = find_roots(large, limit=20)
        times = [r.created_at for r in newest.rows]
        if [r.id for r in newest.rows] != lb.root_ids[::-1][:20] or times != sorted(times, reverse=True) or newest.next_cursor is None:
            raise SystemExit(f"{NAME}: find_roots is wrong: {[r.id for r in newest.rows][:3]}..., newest roots {lb.root_ids[::-1][:3]}")
        print(f"  large: find_roots(limit=20) -> the 20 newest of the store's roots (index/roots, "
              f"{os.path.getsize(roots_index_path(large)):,} bytes)")

        # warm caches, then interleave
        for _ in range(2):
            list_children(small, small_parent)
            list_children(large, large_parent)
            list_descendants(large, tree_root)
        small_times: list[float] = []
        large_times: list[float] = []
        for _ in range(runs):
            small_times += median_ms(lambda: list_children(small, small_parent), 1)[1]
            large_times += median_ms(lambda: list_children(large, large_parent), 1)[1]
        small_ms, large_ms = statistics.median(small_times), statistics.median(large_times)
        descendants_ms, _ = median_ms(lambda: list_descendants(large, tree_root), max(3, runs // 2))
        index_ms, _ = median_ms(lambda: read_children(large, large_parent), runs)
        roots_ms, _ = median_ms(lambda: find_roots(large, limit=20), runs)
    finally:
        t0 = time.perf_counter()
        shutil.rmtree(small_root, ignore_errors=True)
        shutil.rmtree(large_root, ignore_errors=True)
        print(f"removed the stores ({time.perf_counter() - t0:.1f} s)")

    ratio = large_ms / small_ms
    print()
    print(f"list_children, {FAMILY_CHILDREN:,} children, median of {runs} warm runs:")
    print(f"  store of {small_sessions:>7,} sessions: {small_ms:8.1f} ms  ({small_ms * 1e3 / FAMILY_CHILDREN:.0f} us per child; "
          f"runs {min(small_times):.1f}..{max(small_times):.1f})")
    print(f"  store of {large_sessions:>7,} sessions: {large_ms:8.1f} ms  ({large_ms * 1e3 / FAMILY_CHILDREN:.0f} us per child; "
          f"runs {min(large_times):.1f}..{max(large_times):.1f})")
    print(f"  of which reading the index alone: {index_ms:.2f} ms")
    print(f"list_descendants of a root with {tree_size:,} descendants (large store): {descendants_ms:.1f} ms")
    print(f"the 20 newest top-level sessions (find_roots, what `subagents ls` shows; large store): {roots_ms:.2f} ms "
          f"(goal <= {GOAL_ROOTS_MS:g} ms: {'met' if roots_ms <= GOAL_ROOTS_MS else 'NOT met'})")
    print(f"create_session of a child (durability none): {create_first:.0f} us for a parent's first children, "
          f"{create_at:.0f} us with {FAMILY_CHILDREN:,} children already indexed")
    print()
    print(f"goal: ratio large/small <= {GOAL_RATIO}: {ratio:.3f} -> {'met' if ratio <= GOAL_RATIO else 'NOT met'}")
    print(f"goal: list_children in the large store <= {GOAL_LARGE_MS:g} ms: {large_ms:.1f} -> "
          f"{'met' if large_ms <= GOAL_LARGE_MS else 'NOT met'}{'' if not args.quick else ' (quick: 10,000 sessions, not the goal size)'}")
    print(json.dumps({
        "benchmark": NAME,
        "quick": args.quick,
        "children": FAMILY_CHILDREN,
        "small_sessions": small_sessions,
        "large_sessions": large_sessions,
        "runs": runs,
        "small_ms": round(small_ms, 2),
        "large_ms": round(large_ms, 2),
        "ratio": round(ratio, 3),
        "descendants": tree_size,
        "descendants_ms": round(descendants_ms, 2),
        "index_read_ms": round(index_ms, 3),
        "roots_newest_20_ms": round(roots_ms, 2),
        "goal_roots_met": roots_ms <= GOAL_ROOTS_MS,
        "create_child_us_first": round(create_first, 1),
        "create_child_us_at_1000": round(create_at, 1),
        "goal_ratio_met": ratio <= GOAL_RATIO,
        "goal_large_met": large_ms <= GOAL_LARGE_MS,
    }))


if __name__ == "__main__":
    main()
