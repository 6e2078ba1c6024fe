"""Child process of the store tests: ``python _child.py MODE ARGS...``.

Every report is one ``os.write`` of one short line to stdout (atomic on a
pipe), so a ``kill -9`` never leaves half a line. Modes:

* ``hold-lease ROOT SID OWNER TTL`` — register, acquire, print ``ACQUIRED
  EPOCH``, then block on stdin until it closes.
* ``fenced-appender ROOT SID OWNER TTL`` — register, acquire, append one
  event at a time printing ``ACK SEQ EPOCH``; on ``FencedError`` print
  ``FENCED EPOCH CURRENT`` and exit 0.
* ``crash-server ROOT`` — a fork server: for each ``RUN SID DURABILITY`` line
  on stdin it forks an appender (prints ``PID P``; the appender prints
  ``OPEN NEXT_SEQ`` then ``ACK SEQ`` after each append returns), reaps it
  once the test has killed it and prints ``DEAD P STATUS``. Forking keeps
  each kill cycle at a few milliseconds instead of an interpreter start.
* ``lease-cycler ROOT SID OWNER`` — register (this process: alive until
  killed), then forever: acquire the lease (print ``ACQ EPOCH`` once it
  returned), open a writer, run a turn, set the lease idle and running again,
  release it (through the writer or ``release_lease``, alternately; print
  ``REL EPOCH``).
* ``multi-append ROOT SIDS N`` — open a writer at epoch 0 on each
  comma-separated session, print ``READY``, wait for ``GO`` on stdin, then
  append N times round-robin (batches of 1-3 events) printing ``SEQS SID
  S1,S2..``, then ``DONE``.
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import traceback

from subagents import store
from subagents.store import FencedError, LogWriter, Store


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def hold_lease(root: str, sid: str, owner: str, ttl: str) -> None:
    st = Store(root)
    store.register_owner(st, owner, ttl=float(ttl))
    lease = store.acquire_lease(st, sid, owner)
    say(f"ACQUIRED {lease.epoch}")
    sys.stdin.read()


def fenced_appender(root: str, sid: str, owner: str, ttl: str) -> None:
    st = Store(root, durability="none")
    store.register_owner(st, owner, ttl=float(ttl))
    lease = store.acquire_lease(st, sid, owner)
    writer = LogWriter.open(st, sid, epoch=lease.epoch)
    for i in range(1_000_000):
        try:
            (record,) = writer.append([("assistant/message", {"i": i})])
        except FencedError as exc:
            say(f"FENCED {exc.epoch} {exc.current_epoch}")
            return
        say(f"ACK {record['seq']} {record['epoch']}")


def lease_cycler(root: str, sid: str, owner: str) -> None:
    from subagents.store.lease import write_released

    st = Store(root, durability="strict")
    store.register_owner(st, owner, ttl=600.0)
    for i in range(1_000_000):
        lease = store.acquire_lease(st, sid, owner)
        say(f"ACQ {lease.epoch}")
        with LogWriter.open(st, sid, epoch=lease.epoch) as writer:
            writer.append([("turn/start", {}), ("assistant/message", {"i": i}), ("turn/end", {"stop_reason": "completed"})],
                          commit=True)
            store.set_lease_state(st, sid, owner, lease.epoch, "idle")
            store.set_lease_state(st, sid, owner, lease.epoch, "running")
            if i % 2:
                writer.release_lease(owner, write_released)
        if not i % 2:
            store.release_lease(st, sid, owner, lease.epoch)
        say(f"REL {lease.epoch}")


def _next_event(writer: LogWriter, last: str | None, steps: int) -> tuple[str, dict]:
    p = writer.projection
    if p.open_turn is None:
        return "turn/start", {}
    if p.open_calls:
        return "tool/result", {"call_id": next(iter(p.open_calls)), "is_error": False}
    if p.open_step is not None:
        if last == "tool/result":
            return "step/end", {}
        return "tool/call", {"call_id": f"c{p.next_seq}", "name": "echo"}
    if steps >= 2:
        return "turn/end", {"stop_reason": "completed"}
    return "step/start", {}


def appender(root: str, sid: str, durability: str) -> None:
    st = Store(root, durability=durability)
    writer = LogWriter.open(st, sid, epoch=0)
    say(f"OPEN {writer.next_seq}")
    last: str | None = None
    steps = 0
    for _ in range(100_000):
        kind, data = _next_event(writer, last, steps)
        if kind == "turn/start":
            steps = 0
        elif kind == "step/start":
            steps += 1
        (record,) = writer.append([(kind, data)], commit=kind == "turn/end")
        last = kind
        say(f"ACK {record['seq']}")


def crash_server(root: str) -> None:
    for line in sys.stdin:
        cmd, sid, durability = line.split()
        assert cmd == "RUN"
        pid = os.fork()
        if pid == 0:
            try:
                appender(root, sid, durability)
            except BaseException:
                traceback.print_exc()
                os._exit(3)
            os._exit(0)
        say(f"PID {pid}")
        _, status = os.waitpid(pid, 0)
        say(f"DEAD {pid} {status}")


def multi_append(root: str, sids: str, n: str) -> None:
    st = Store(root, durability="none")
    writers = {sid: LogWriter.open(st, sid, epoch=0) for sid in sids.split(",")}
    rng = random.Random(os.getpid())
    say("READY")
    assert sys.stdin.readline().strip() == "GO"
    for i in range(int(n)):
        for sid, writer in writers.items():
            batch = [("assistant/message", {"pid": os.getpid(), "i": i, "k": k}) for k in range(rng.randint(1, 3))]
            records = writer.append(batch, commit=i % 7 == 0)
            say(f"SEQS {sid} " + ",".join(str(r["seq"]) for r in records))
    for writer in writers.values():
        writer.close()
    say("DONE")


MODES = {
    "hold-lease": hold_lease,
    "fenced-appender": fenced_appender,
    "crash-server": crash_server,
    "multi-append": multi_append,
    "lease-cycler": lease_cycler,
}

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)
    MODES[sys.argv[1]](*sys.argv[2:])
