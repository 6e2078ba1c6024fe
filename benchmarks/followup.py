"""Followups to continuable children: acceptance, a whole turn, and cold resume by session size.

Run ``python benchmarks/followup.py [--quick]``. Everything is measured in
this run, on the repository's file system (``/tmp`` when it shares the
repository's device, else a hidden folder under ``benchmarks/``), and removed
afterwards. The supervisor runs with ``durability="batched"`` (the default:
an acceptance is fsync'd before ``followup`` returns) and two workers.

What is measured:

* **accept** — ``sup.followup(root, child, ...)`` to a *resident* child whose
  turn is a long sleep, so each followup is only an enqueue: admission,
  authorisation, the durable append to the child's mailbox (lock + fsync),
  the wake. p50 / p99 over N sequential followups. Baseline in the same run,
  one sample after each followup: ``os.write`` + ``os.fsync`` of a
  record-sized blob appended to a file on the same file system
  (``fsync_p50_ms``); and after each followup, one round trip of a no-op
  call through the supervisor's store thread (``hop_p50_ms``: the loop hands
  the call over and is woken with its result, the least any acceptance made
  off the event loop pays). ``accept_floor_ms = fsync_p50_ms + hop_p50_ms``
  is what an acceptance fsync'd off the loop cannot go below here.
  ``accept_call_mean_ms`` is the mean time the store thread spent in each
  acceptance (``StoreThreadStatistics.busy_s``), ``accept_handoff_mean_ms``
  the rest of ``accept_mean_ms``: the hand-over and the loop's own part.
  ``fsync_in_place_p50_ms`` is the same blob written in place over a
  zero-filled file and fsync'd (as an acceptance writes over its mailbox's
  padding: no new size for the fsync to write), sampled right after the
  append baseline, and ``accept_floor_in_place_ms`` the floor with it. The
  no-op round trip understates the hand-over of a real acceptance: on this
  machine's two virtual CPUs each of the two thread wake-ups crosses CPUs,
  and the woken thread runs colder.
* **turn** — followup → settlement notice durably in the root's mailbox, for
  an ``echo`` child that settled after each turn: every followup is a cold
  resume (lease, projection), one turn in a worker, settlement (lease
  release, notice). The end is taken at the ``subagent/end`` event, emitted
  right after the notice is accepted (``wait_for_message`` polls every 20 ms
  and would measure its poll period instead).
* **resume** — followup → ``turn/start`` of the first resumed turn (the
  ``ts`` the worker stamps on that event), for a settled child whose log holds
  ~100 events and one holding ~100,000 events (6 events per turn, the
  mailbox holding one consumed message per turn, as a real history would).
  Both logs are crafted directly with ``create_session`` + ``LogWriter`` at
  epoch 0 under ``durability="none"``, and the identity cache is written as
  the writer does at a commit point. Median over R alternating rounds.

Goals: accept p50 <= 0.25 ms and p99 <= 1 ms (the limit: one fsync is ~0.13-0.18 ms here; first
set at <= 1 / <= 5 when the mailbox was made incremental); resume_ratio (large / small) <= 2. The
last stdout line is one JSON object ``{"benchmark": "followup", ...}``.

What dominates (profiled when this benchmark was written): ``store.mailbox``
reads the *whole* mailbox on every ``accept`` (to find the next ``seq`` and a
torn tail) and on every ``pending`` (the driver's read before and after each
turn), decoding every record: O(messages ever accepted) per followup and per
turn, ~0.1 s for a 16,666-message mailbox. Everything else on the resume
path is O(1) in the history: header, cached projection, lease, the worker's
``LogWriter.open`` from the identity cache (each < 0.2 ms at 100,000 events).
``accept_first_tenth_p50_ms`` / ``accept_last_tenth_p50_ms`` show the growth
within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from _common import percentile, temp_base  # noqa: E402  (first: puts the repository on sys.path)

import anyio  # noqa: E402

from subagents.store import (  # noqa: E402
    ContinuableDescriptor,
    IdGenerator,
    LogWriter,
    Store,
    create_session,
    encode_record,
    read_projection,

    scan,
)
from subagents.store.reader import open_session  # noqa: E402
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig  # noqa: E402

NAME = "followup"
# accept: the limit a durable acceptance allows here (one fsync is ~0.13-0.18 ms, which leaves ~0.1 ms
# for admission, the append and the hop to the store thread); first set at <= 1 / <= 5
GOALS = {"accept_p50_ms": "<= 0.25", "accept_p99_ms": "<= 1", "resume_ratio": "<= 2"}
EVENTS_PER_TURN = 6


class FsyncBaseline:
    """``os.write`` + ``os.fsync`` of one record-sized blob appended to a file, timed in ms; and the same
    blob written in place over a zero-filled file (as an acceptance writes over a mailbox's padding),
    whose fsync writes no new size: ``samples`` and ``in_place``, one of each per ``sample``."""

    SPAN = 1024 * 4096  # the in-place file: written round, never grown

    def __init__(self, folder: str, size: int = 240) -> None:
        self.path = os.path.join(folder, "fsync-baseline")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.blob = b"x" * size
        self.samples: list[float] = []
        self.in_place_path = os.path.join(folder, "fsync-baseline-in-place")
        self.in_place_fd = os.open(self.in_place_path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(self.in_place_fd, b"\0" * self.SPAN)
        os.fsync(self.in_place_fd)
        self.offset = 0
        self.in_place: list[float] = []

    def sample(self) -> None:
        t0 = time.perf_counter()
        os.write(self.fd, self.blob)
        os.fsync(self.fd)
        self.samples.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        os.pwrite(self.in_place_fd, self.blob, self.offset)
        os.fsync(self.in_place_fd)
        self.in_place.append((time.perf_counter() - t0) * 1000)
        self.offset = (self.offset + len(self.blob)) % (self.SPAN - len(self.blob))

    def close(self) -> None:
        for fd, path in ((self.fd, self.path), (self.in_place_fd, self.in_place_path)):
            os.close(fd)
            os.unlink(path)


def craft_session(store: Store, ids: IdGenerator, parent_id: str, turns: int) -> str:
    """A settled continuable ``echo`` child with ``turns`` completed turns and a matching mailbox."""
    child_id = ids.new()
    descriptor = ContinuableDescriptor(provider="echo", label=f"history of {turns} turns")
    create_session(
        store, child_id, parent_session=parent_id, origin="subagent", delegation_depth=1,
        events=[("approval/policy", {"policy": "never", "source": "delegation"}), ("subagent/descriptor", descriptor.to_record())],
    )
    mailbox: list[bytes] = []
    now = time.time()
    with LogWriter.open(store, child_id, epoch=0) as writer:
        batch: list[tuple[str, Any]] = []
        for turn in range(turns):
            message_id = ids.new()
            text = f"message {turn}: " + "x" * 60
            source = {"kind": "coordinator", "form": "relay", "sender_session_id": parent_id}
            mailbox.append(encode_record({"seq": turn, "id": message_id, "ts": now, "source": source, "content": text, "wake": True}))
            batch += [
                ("message/accepted", {"message_id": message_id, "source": source, "content": text}),
                ("turn/start", {"message_id": message_id}),
                ("step/start", {"n": 1}),
                ("assistant/message", {"text": text}),
                ("step/end", {}),
                ("turn/end", {"stop_reason": "completed", "diagnostic": None}),
            ]
            if len(batch) >= 6000:
                writer.append(batch)
                batch = []
        if batch:
            writer.append(batch)
        writer.commit()  # the identity cache, as at a turn's commit point
    with open(store.path(child_id, "mailbox"), "wb") as handle:
        handle.write(b"".join(mailbox))
    return child_id


def log_tail(store: Store, child_id: str, offset: int, start_seq: int) -> list[dict[str, Any]]:
    with open_session(store, child_id) as file:
        return scan(file.read_log(offset), start_seq=start_seq, padded=True).records


class Settlements:
    """``subagent/end`` events by child id, as events to wait on."""

    def __init__(self, sup: Supervisor) -> None:
        self._waiting: dict[str, anyio.Event] = {}
        sup.on("subagent/end", self._on_end)

    def _on_end(self, _name: str, info: dict[str, Any]) -> None:
        event = self._waiting.pop(info["id"], None)
        if event is not None:
            event.set()

    def expect(self, child_id: str) -> anyio.Event:
        event = anyio.Event()
        self._waiting[child_id] = event
        return event


def _noop() -> None:
    return None


async def measure_accept(
    sup: Supervisor, root: Any, count: int, baseline: FsyncBaseline, hops: list[float],
) -> tuple[list[float], int]:
    script = json.dumps({"script": [{"sleep": 3_600_000}]})
    child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=script, label="busy"))
    with anyio.fail_after(30):
        while sup.statistics().pool.resident == 0:  # the busy turn is in a worker
            await anyio.sleep(0.005)
    content = json.dumps({"script": [{"return": "queued work " + "x" * 40}]})
    for _ in range(20):  # warm-up
        await sup.followup(root, child_id, content)
    samples = []
    busy = sup.runtime.store_thread.statistics().busy_s
    for _ in range(count):
        t0 = time.perf_counter()
        await sup.followup(root, child_id, content)
        samples.append((time.perf_counter() - t0) * 1000)
        baseline.sample()  # interleaved, so both see the same disk
        t0 = time.perf_counter()
        await sup.runtime.store_thread.run_uncancellable(_noop)
        hops.append((time.perf_counter() - t0) * 1000)
    # the store thread's own time per followup (the no-op calls add microseconds in all)
    call_mean = (sup.runtime.store_thread.statistics().busy_s - busy) * 1000 / count
    size = os.path.getsize(sup.store.path(child_id, "mailbox")) // (count + 21)
    await sup.drain_children(root, [child_id])  # discards the queued followups: they never run
    return samples, size, call_mean


async def measure_turns(sup: Supervisor, root: Any, settlements: Settlements, count: int) -> list[float]:
    child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="echo", prompt="warm-up", label="echo"))
    done = settlements.expect(child_id)
    with anyio.fail_after(30):
        await done.wait()
    samples = []
    for i in range(count):
        done = settlements.expect(child_id)
        t0 = time.perf_counter()
        await sup.followup(root, child_id, f"ping {i}")
        with anyio.fail_after(30):
            await done.wait()
        samples.append((time.perf_counter() - t0) * 1000)
    await sup.take_messages(root)
    return samples


async def resume_once(sup: Supervisor, root: Any, settlements: Settlements, child_id: str) -> float:
    projection = read_projection(sup.store, child_id)
    offset, seq = projection.end_offset, projection.next_seq
    done = settlements.expect(child_id)
    t0 = time.time()
    await sup.followup(root, child_id, "resume")
    with anyio.fail_after(60):
        await done.wait()
    tail = log_tail(sup.store, child_id, offset, seq)
    starts = [e for e in tail if e["type"] == "turn/start"]
    if len(starts) != 1:
        raise RuntimeError(f"expected one resumed turn in {child_id}, found {[(e['type'], e['data']) for e in tail]}")
    start = starts[0]
    return (start["ts"] - t0) * 1000


async def run(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    accepts, turns, rounds = (400, 30, 5) if args.quick else (3000, 200, 15)
    config = SupervisorConfig(pool_size=2, durability="batched")
    async with Supervisor.open(store=os.path.join(folder, "store"), config=config) as sup:
        caps = Capabilities.all()
        sup.register_provider(Provider(name="script", program="script", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="echo", program="echo", capabilities=caps, continuable=True))
        settlements = Settlements(sup)
        root = await sup.open_root(label="bench")

        baseline = FsyncBaseline(folder)
        try:
            hops: list[float] = []
            accept, record_size, call_mean = await measure_accept(sup, root, accepts, baseline, hops)
        finally:
            baseline.close()
        fsync_p50, hop_p50 = percentile(baseline.samples, 0.5), percentile(hops, 0.5)
        in_place_p50 = percentile(baseline.in_place, 0.5)
        print(f"accept: {accepts} followups to a busy resident child, record ~{record_size} B; "
              f"p50 {percentile(accept, 0.5):.3f} ms, p99 {percentile(accept, 0.99):.3f} ms "
              f"(write+fsync baseline p50 {fsync_p50:.3f} ms, in place {in_place_p50:.3f} ms; "
              f"store-thread round trip p50 {hop_p50:.3f} ms)")
        await sup.take_messages(root)

        turn = await measure_turns(sup, root, settlements, turns)
        print(f"turn: {turns} followups -> settlement (cold resume + echo turn + notice); p50 {percentile(turn, 0.5):.2f} ms")

        t0 = time.perf_counter()
        small = craft_session(sup.store, sup.ids, root.id, 100 // EVENTS_PER_TURN)
        large = craft_session(sup.store, sup.ids, root.id, 100_000 // EVENTS_PER_TURN)
        sizes = {name: read_projection(sup.store, cid).next_seq for name, cid in (("small", small), ("large", large))}
        print(f"resume: crafted sessions of {sizes['small']} and {sizes['large']} events in {time.perf_counter() - t0:.1f} s")
        small_ms, large_ms = [], []
        for _ in range(rounds):
            small_ms.append(await resume_once(sup, root, settlements, small))
            large_ms.append(await resume_once(sup, root, settlements, large))
        await sup.take_messages(root)
        resume_small, resume_large = statistics.median(small_ms), statistics.median(large_ms)
        print(f"resume: followup -> first turn/start, median of {rounds}: {sizes['small']} events {resume_small:.2f} ms, "
              f"{sizes['large']} events {resume_large:.2f} ms")

    return {
        "benchmark": NAME,
        "quick": bool(args.quick),
        "accept_p50_ms": round(percentile(accept, 0.5), 3),
        "accept_p99_ms": round(percentile(accept, 0.99), 3),
        # the same p50 over the first and the last tenth: the mailbox is longer by N records at the end
        "accept_first_tenth_p50_ms": round(percentile(accept[: len(accept) // 10], 0.5), 3),
        "accept_last_tenth_p50_ms": round(percentile(accept[-(len(accept) // 10) :], 0.5), 3),
        "fsync_p50_ms": round(fsync_p50, 3),
        "accept_over_fsync": round(percentile(accept, 0.5) / fsync_p50, 2) if fsync_p50 else None,
        "hop_p50_ms": round(hop_p50, 3),
        "accept_floor_ms": round(fsync_p50 + hop_p50, 3),
        # the same with the fsync of a write in place, as an acceptance's is (no new size to write)
        "fsync_in_place_p50_ms": round(in_place_p50, 3),
        "accept_floor_in_place_ms": round(in_place_p50 + hop_p50, 3),
        # where an acceptance's time goes, as means: its call on the store thread (lock, append, fsync)
        # and the rest, the hand-over between the loop and that thread and the loop's own part
        "accept_mean_ms": round(statistics.fmean(accept), 3),
        "accept_call_mean_ms": round(call_mean, 3),
        "accept_handoff_mean_ms": round(statistics.fmean(accept) - call_mean, 3),
        "turn_p50_ms": round(percentile(turn, 0.5), 2),
        "turn_p99_ms": round(percentile(turn, 0.99), 2),
        "resume_small_events": sizes["small"],
        "resume_large_events": sizes["large"],
        "resume_small_ms": round(resume_small, 2),
        "resume_large_ms": round(resume_large, 2),
        "resume_ratio": round(resume_large / resume_small, 2),
        "resume_measures": "followup -> turn/start of the resumed turn",
        "goals": GOALS,
        "goals_met": {
            "accept_p50_ms": percentile(accept, 0.5) <= 0.25,
            "accept_p99_ms": percentile(accept, 0.99) <= 1,
            "resume_ratio": resume_large / resume_small <= 2,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s on 2 cores)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix=".bench-followup-", dir=temp_base())
    print(f"{NAME}: temp folder {folder}{' (quick)' if args.quick else ''}")
    try:
        result = anyio.run(run, args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
