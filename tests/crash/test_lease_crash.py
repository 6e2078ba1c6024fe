"""kill -9 of a process that acquires, changes and releases a session's lease in a loop (format 2).

The lease lives in two slots of the session's file, rewritten in place
(``store/session_file.py``). A child (``tests/store/_child.py lease-cycler``)
acquires under ``strict`` durability, runs a turn, sets the lease idle and
running, releases it, and again; it prints ``ACQ EPOCH`` once an
acquisition returned. The test kills it after a random number of
acquisitions and a random delay, then checks that the session's file still
reads (preamble, header, a clean or torn log), that the lease read back is
at least the last acquisition that returned, and that the next owner takes
the epoch after it; the next round's child goes on from there. At the end
``check_store`` finds no epoch that went backwards and no two writers in one
turn.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from subagents import store
from subagents.store import check_store
from tests.store._support import ONE_SHOT, Child


def run_kills(tmp_path, kills: int, seed: int) -> None:
    st = store.Store(tmp_path / "store", durability="strict")
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    rng = random.Random(seed)
    store.register_owner(st, "taker", ttl=600.0)
    last = 0
    for n in range(kills):
        with Child("lease-cycler", st.root, "s1", f"cycler{n}") as child:
            acquired = [int(child.expect("ACQ ")[0]) for _ in range(rng.randint(1, 5))]
            time.sleep(rng.uniform(0.0, 0.02))  # not a synchronisation: the random moment of the kill
            os.kill(child.pid, signal.SIGKILL)
            assert child.close() == -signal.SIGKILL
        assert acquired[0] > last and acquired == list(range(acquired[0], acquired[0] + len(acquired)))
        header = store.read_header(st, "s1")
        assert header.id == "s1"
        assert store.inspect(st, "s1").status in ("clean", "torn")
        lease = store.read_lease(st, "s1")
        assert lease is not None and lease.epoch >= acquired[-1], (lease, acquired)
        taken = store.acquire_lease(st, "s1", "taker")  # the killed owner's process is dead: a takeover
        assert taken.epoch == lease.epoch + 1
        with store.LogWriter.open(st, "s1", epoch=taken.epoch) as writer:  # the repair of a killed turn
            assert writer.projection.open_turn is None
        store.release_lease(st, "s1", "taker", taken.epoch)
        last = taken.epoch
    report = check_store(st)
    assert report.clean, str(report)


def test_kill_9_while_the_lease_changes_never_lowers_the_epoch(tmp_path):
    run_kills(tmp_path, 5, seed=12)


@pytest.mark.stress
def test_kill_9_while_the_lease_changes_stress(tmp_path):
    run_kills(tmp_path, 100, seed=13)
