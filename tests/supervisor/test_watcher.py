"""The store watcher: each hosted child's files are an isolation boundary (issue 14, item 1)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from subagents.store.framing import encode_record
from subagents.supervisor import UserAuthority

from ..conftest import REPO_ROOT, wait_until
from .test_continuable import S, continuable_supervisor, start, turn_ends, turn_started

pytestmark = pytest.mark.anyio


async def test_a_malformed_control_record_of_one_child_never_ends_the_supervisor(tmp_path, caplog):
    """Issue 14 item 1: a CRC-valid control record of the wrong shape for one hosted child is
    logged and skipped; the supervisor and its other children carry on."""
    caplog.set_level(logging.WARNING)
    async with continuable_supervisor(tmp_path, control_poll_s=0.01) as sup:
        root = await sup.open_root(label="host")
        bad, _ = await start(sup, root, S({"sleep": 60_000}), label="bad")
        good, _ = await start(sup, root, S({"sleep": 60_000}), label="good")
        await turn_started(sup, bad)
        await turn_started(sup, good)
        with open(sup.store.path(bad, "control"), "ab") as control:  # CRC-valid framing, wrong field types
            control.write(encode_record({"seq": 0, "id": "01BADCONTROL", "ts": "not a number", "kind": "interrupt", "data": [1, 2, 3]}))
        await wait_until(
            lambda: any(bad in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING),
            what="the watcher to report the bad record",
        )
        # still serving: the other child is interrupted, the damaged one still runs its turn
        await sup.interrupt(good, authority=UserAuthority(parent_session=root.id))
        await wait_until(lambda: turn_ends(sup.store, good) == ["aborted"], what="the other child's turn to be interrupted")
        assert bad in sup.continuation.activations and turn_ends(sup.store, bad) == []
        await sup.interrupt(bad, authority=UserAuthority(parent_session=root.id))
        await wait_until(lambda: turn_ends(sup.store, bad) == ["aborted"], what="the damaged child's turn to be interrupted")


async def test_an_interrupt_read_after_its_turn_ended_does_not_stop_the_next_turn(tmp_path, caplog):
    """A control record written while turn 1 ran, but read only once turn 2 (whose message came
    later) has started, aimed at a turn that is over: turn 2 runs on, and the watcher says why."""
    caplog.set_level(logging.INFO, logger="subagents.supervisor")
    async with continuable_supervisor(tmp_path, control_poll_s=0.01) as sup:
        root = await sup.open_root(label="host")
        child, _ = await start(sup, root, S({"return": "one"}), label="child")
        await wait_until(lambda: turn_ends(sup.store, child) == ["completed"], what="turn 1 to end")
        asked_at = time.time()  # the moment the request was made, before the next message
        await sup.followup(root, child, S({"sleep": 60_000}))
        await turn_started(sup, child, 2)
        with open(sup.store.path(child, "control"), "ab") as control:  # as written then, read now
            control.write(encode_record({"seq": 0, "id": "01STALECONTROL", "ts": asked_at, "kind": "interrupt", "data": {"reason": "user"}}))
        await wait_until(
            lambda: any("01STALECONTROL" in r.getMessage() for r in caplog.records),
            what="the watcher to read the request",
        )
        assert turn_ends(sup.store, child) == ["completed"]  # turn 2 still runs
        result = await sup.interrupt(child, authority=UserAuthority(parent_session=root.id))
        assert result.outcome == "cancelled"
        await wait_until(lambda: turn_ends(sup.store, child) == ["completed", "aborted"], what="turn 2 to be interrupted")


ACCEPT_ELSEWHERE = """
import sys
from subagents.store import IdGenerator, Store, accept
store, child, content = sys.argv[1:4]
print(accept(Store(store), child, source={"kind": "user"}, content=content, ids=IdGenerator()))
"""


async def test_a_message_another_process_writes_over_the_mailbox_padding_wakes_a_waiting_child(tmp_path):
    """A child waiting for its own live child is woken by the watcher when another process accepts a message
    for it. Each acceptance after the first writes over the mailbox's zero padding and leaves the file's size
    as it was: the watcher compares where the data ends, so it still sees every one."""
    async with continuable_supervisor(tmp_path, control_poll_s=0.01) as sup:
        root = await sup.open_root(label="host")
        grandchild_turn = S({"sleep": 60_000})
        child, _ = await start(sup, root, S({"start_continuable": {"prompt": grandchild_turn, "label": "g"}}, {"return": "waiting"}))
        await wait_until(lambda: turn_ends(sup.store, child) == ["completed"], what="the child's first turn to end")
        mailbox = sup.store.path(child, "mailbox")
        size = os.path.getsize(mailbox)
        env = {**os.environ, "PYTHONPATH": REPO_ROOT}
        for n in (2, 3):
            subprocess.run([sys.executable, "-c", ACCEPT_ELSEWHERE, sup.store.root, child, S({"return": f"turn {n}"})],
                           check=True, env=env, capture_output=True, timeout=60)
            assert os.path.getsize(mailbox) == size  # written in place
            await wait_until(lambda: turn_ends(sup.store, child) == ["completed"] * n, what=f"turn {n} of the waiting child")
