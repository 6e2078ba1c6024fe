"""kill -9 of a process appending under ``strict`` durability, at random moments.

A fork server (``tests/store/_child.py crash-server``) forks one appender per
round; the appender prints ``ACK <seq>`` only after ``append`` returned. The
test kills it with SIGKILL after a random number of acks (0 included: a kill
during open or repair), waits for the server to reap it, then checks:

* ``inspect`` reads a valid contiguous prefix, classified clean or torn —
  never corrupt;
* the prefix holds every acknowledged record and every record of the
  previous rounds, byte-identical (committed bytes are never rewritten);
* ``LogWriter.open`` (in most rounds; in the others the next appender does
  it, and may itself be killed mid-repair) truncates the tail, closes the
  open turn once, and appends at the right seq.
"""

from __future__ import annotations

import os
import random
import signal

import pytest

from subagents import store
from tests.store._support import ONE_SHOT, Child

SESSIONS = ("k0", "k1", "k2")


def one_round(st: store.Store, server: Child, sid: str, target: int) -> list[int]:
    """Start an appender on ``sid``, kill it after ``target`` acks; returns every acked seq."""
    server.send(f"RUN {sid} strict")
    pid: int | None = None
    acked: list[int] = []
    while pid is None or len(acked) < target:
        line = server.next_line()
        if line is None:
            server.fail("server output ended")
        kind, *rest = line.split()
        if kind == "PID":
            pid = int(rest[0])
        elif kind == "ACK":
            acked.append(int(rest[0]))
        elif kind == "DEAD":
            server.fail(f"appender died on its own: {line}")
    os.kill(pid, signal.SIGKILL)
    while True:
        line = server.next_line()
        if line is None:
            server.fail("server output ended")
        kind, *rest = line.split()
        if kind == "ACK":
            acked.append(int(rest[0]))  # returned before the kill landed: it must be on disk too
        elif kind == "DEAD":
            assert int(rest[0]) == pid
            status = int(rest[1])
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, server.stderr()
            return acked


def check_and_repair(st: store.Store, sid: str, kept: list[dict], acked: list[int], repair: bool, n: int) -> list[dict]:
    found = store.inspect(st, sid)
    assert found.status in ("clean", "torn"), (n, found.damage)
    assert [e["seq"] for e in found.events] == list(range(len(found.events)))
    assert found.events[: len(kept)] == kept, "a committed record changed"
    assert not acked or max(acked) < len(found.events), f"acked seq {max(acked)} lost (prefix {len(found.events)})"
    if not repair:
        return found.events
    with store.LogWriter.open(st, sid, epoch=0) as writer:
        closers = [r["type"] for r in writer.repaired]
        assert closers == [] or closers[-1] == "turn/end"
        assert writer.next_seq == len(found.events) + len(closers)
        assert writer.projection.open_turn is None
        (record,) = writer.append([("notice/received", {"round": n})], commit=True)
        assert record["seq"] == len(found.events) + len(closers)
    after = store.inspect(st, sid)
    assert after.status == "clean" and after.events[: len(found.events)] == found.events
    return after.events


def run_kills(tmp_path, kills: int, seed: int) -> None:
    st = store.Store(tmp_path / "store", durability="strict")
    for sid in SESSIONS:
        store.create_session(st, sid, events=[("subagent/descriptor", ONE_SHOT)])
    kept = {sid: store.inspect(st, sid).events for sid in SESSIONS}
    rng = random.Random(seed)
    total_acked = 0
    with Child("crash-server", st.root) as server:
        for n in range(kills):
            sid = SESSIONS[n % len(SESSIONS)]
            acked = one_round(st, server, sid, rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 21]))
            total_acked += len(acked)
            kept[sid] = check_and_repair(st, sid, kept[sid], acked, rng.random() < 0.7, n)
        assert server.close() == 0, server.stderr()
    assert total_acked > kills  # the kills landed among real appends, not only at start-up
    for sid in SESSIONS:
        with store.LogWriter.open(st, sid, epoch=0) as writer:
            assert writer.projection.open_turn is None
        assert store.inspect(st, sid).status == "clean"


def test_kill_9_while_appending(tmp_path):
    """60 kills at random moments: every acked record survives and the log always resumes."""
    run_kills(tmp_path, 60, seed=1)


@pytest.mark.stress
def test_kill_9_while_appending_stress(tmp_path):
    """The same, 1,000 kills."""
    run_kills(tmp_path, 1000, seed=2)
