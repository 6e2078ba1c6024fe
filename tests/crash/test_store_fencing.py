"""Fencing across processes: a stopped lease holder that is taken over can never write again.

The old owner (``tests/store/_child.py fenced-appender``) holds the lease at
epoch 1 and appends in a loop. The test stops it with SIGSTOP — outside its
critical section, checked by probing the session's flock — waits for its
heartbeat to outlive its small TTL, takes the lease over (epoch 2), appends
as the new owner, and resumes the old one with SIGCONT. Its next append must
raise ``FencedError``, and no record after the takeover point may carry
epoch 1.
"""

from __future__ import annotations

import os
import signal

from subagents import store
from tests.store._support import Child, flocked, wait_until

TTL_S = 0.3


def stop_outside_the_lock(child: Child, st: store.Store, sid: str) -> None:
    """SIGSTOP the child at a moment it does not hold the session's flock."""
    log = st.session_path(sid)  # the log is the end of the session's file: its size grows with it
    for _ in range(500):
        os.kill(child.pid, signal.SIGSTOP)
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        if not flocked(st.session_path(sid)):  # the session's lock: flock on its file
            return
        # stopped inside an append: resume it until its log grows (it really ran), then retry
        size = os.path.getsize(log)
        os.kill(child.pid, signal.SIGCONT)
        wait_until(lambda: os.path.getsize(log) > size, what="the appender to make progress")
    child.fail("never stopped outside its critical section")


def test_stopped_owner_is_fenced_after_takeover(tmp_path):
    """SIGSTOP, stale heartbeat, takeover, SIGCONT: the old writer gets FencedError and writes nothing more."""
    st = store.Store(tmp_path / "store", durability="none")
    store.create_session(st, "s1")
    with Child("fenced-appender", st.root, "s1", "old-owner", str(TTL_S)) as child:
        acked = []
        while len(acked) < 20:
            seq, epoch = child.expect("ACK ")
            assert epoch == "1"
            acked.append(int(seq))
        stop_outside_the_lock(child, st, "s1")
        try:
            wait_until(lambda: not store.owner_alive(store.read_owner(st, "old-owner")), what="the stale heartbeat")
            lease = store.acquire_lease(st, "s1", "new-owner")
            assert lease.epoch == 2
            takeover = store.inspect(st, "s1").next_seq
            with store.LogWriter.open(st, "s1", epoch=lease.epoch) as writer:
                mine = writer.append([("assistant/message", {"from": "new"}) for _ in range(3)], commit=True)
            assert [r["seq"] for r in mine] == [takeover, takeover + 1, takeover + 2]
        finally:
            os.kill(child.pid, signal.SIGCONT)
        while True:
            line = child.next_line()
            if line is None:
                child.fail("exited without reporting FENCED")
            if line.startswith("ACK "):
                acked.append(int(line.split()[1]))
                continue
            assert line == "FENCED 1 2"
            break
        assert child.close() == 0, child.stderr()
    assert max(acked) < takeover, "the old owner appended after the takeover"
    found = store.inspect(st, "s1")
    assert found.status == "clean"
    assert all(e["epoch"] == 1 for e in found.events[:takeover])
    assert [e["epoch"] for e in found.events[takeover:]] == [2, 2, 2]
    with store.LogWriter.open(st, "s1", epoch=2) as writer:
        assert writer.append([("notice/received", {})])[0]["seq"] == takeover + 3
