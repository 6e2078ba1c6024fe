"""A child whose accepted, unconsumed messages were damaged behind the store's back refuses new ones.

Audit defect: the acceptance read such damage as a torn tail and cut it (or, through the mailbox
a resident child keeps open, appended after it where no reader finds the message), acknowledging
the new message while accepted ones were lost. Now ``send`` and ``followup`` fail with
``CORRUPT_SESSION`` and write nothing, and the listing gives that child — only that one — a
diagnostic row; its sibling goes on as before.
"""

from __future__ import annotations

from pathlib import Path

import anyio

import pytest

from subagents.store import read_mailbox
from subagents.store.catalog import ChildEntry, DiagnosticEntry
from subagents.supervisor import SubagentError

from .test_continuable import S, continuable_supervisor, settled, start, turn_started

pytestmark = pytest.mark.anyio


async def test_send_to_a_child_whose_queued_messages_are_damaged_fails_and_only_its_row_says_so(tmp_path):
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        victim, _ = await start(sup, root, S({"sleep": 60_000}), label="victim")
        sibling, _ = await start(sup, root, S({"sleep": 60_000}), label="sibling")
        await turn_started(sup, victim)
        await turn_started(sup, sibling)
        # queued behind the running turn: accepted, acknowledged, not consumed
        for i in range(3):
            await sup.followup(root, victim, S({"return": f"t{i}"}))
        await sup.send(sibling, S({"return": "fine"}), parent=root.id)
        path = Path(sup.store.path(victim, "mailbox"))
        prompt, first_queued, *_ = read_mailbox(sup.store, victim)
        data = bytearray(path.read_bytes())
        data[prompt.end + 20] ^= 0x5A  # in place, inside the first queued message: the file keeps its size
        path.write_bytes(bytes(data))

        for deliver in (lambda: sup.send(victim, S({"return": "lost"}), parent=root.id),
                        lambda: sup.followup(root, victim, S({"return": "lost"}))):
            with pytest.raises(SubagentError) as info:
                await deliver()
            assert info.value.code == "CORRUPT_SESSION"
            assert path.read_bytes() == bytes(data)

        rows = {row.id: row for row in await sup.list_children(root.id)}
        assert rows[victim] == DiagnosticEntry(victim, "corrupt")
        assert isinstance(rows[sibling], ChildEntry) and rows[sibling].status == "running"
        await sup.send(sibling, S({"return": "still fine"}), parent=root.id)
        assert [m.content for m in read_mailbox(sup.store, sibling)][-2:] == [S({"return": "fine"}), S({"return": "still fine"})]


async def test_a_fifo_put_in_a_resident_child_s_mailbox_never_stalls_the_supervisor(tmp_path):
    """The store watcher looks at every resident child's mailbox each poll, on the event loop; its
    ``open`` of a FIFO put there waited for a writer, and the whole supervisor with it (no timer,
    no other child, no request ran). Now that child's mailbox is unreadable and skipped, and the
    supervisor goes on: its sibling still takes messages, and the loop never stalls."""
    import os
    import threading
    import time

    import anyio

    async with continuable_supervisor(tmp_path, control_poll_s=0.02) as sup:
        root = await sup.open_root()
        victim, _ = await start(sup, root, S({"sleep": 60_000}), label="victim")
        sibling, _ = await start(sup, root, S({"sleep": 60_000}), label="sibling")
        await turn_started(sup, victim)
        await turn_started(sup, sibling)
        path = sup.store.path(victim, "mailbox")
        os.replace(path, path + ".kept")
        os.mkfifo(path, 0o600)
        released = threading.Event()

        def release_after(seconds: float) -> None:
            # a loop stuck in the FIFO's open cannot time itself out: its writer frees it, and the test fails
            if not released.wait(seconds):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

        watchdog = threading.Thread(target=release_after, args=(10,), daemon=True)
        watchdog.start()
        try:
            longest = 0.0
            until = time.monotonic() + 1.0  # many watcher polls
            while time.monotonic() < until:
                began = time.monotonic()
                await anyio.sleep(0.01)
                longest = max(longest, time.monotonic() - began)
            await sup.send(sibling, S({"return": "fine"}), parent=root.id)
        finally:
            released.set()
            watchdog.join()
        assert longest < 5, f"the event loop stalled for {longest:.1f} s"
        assert [m.content for m in read_mailbox(sup.store, sibling)][-1] == S({"return": "fine"})
        os.unlink(path)
        os.replace(path + ".kept", path)
        await sup.drain_children(root, [victim, sibling])


async def test_damage_in_a_consumed_message_refuses_a_followup_and_sends_no_notice(tmp_path):
    """A record the log consumed, damaged in place, read as a torn tail to a process that had not written
    it: the followup was written over it and acknowledged, no turn ever took it, and the parent got a
    notice for a resumption that ran nothing. Now the followup is ``CORRUPT_SESSION``, the mailbox keeps
    its bytes, and no notice comes."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "x" * 40}))
        await settled(sup, root, child_id)
        path = Path(sup.store.path(child_id, "mailbox"))
    data = bytearray(path.read_bytes())
    data[0x30:0x34] = b"\xde\xad\xbe\xef"  # inside the consumed prompt
    path.write_bytes(bytes(data))
    async with continuable_supervisor(tmp_path) as sup:  # another host: it knows nothing of where the records end
        root = await sup.open_root(id=root.id)
        with pytest.raises(SubagentError) as caught:
            await sup.followup(root, child_id, S({"return": "never"}))
        assert caught.value.code == "CORRUPT_SESSION"
        assert path.read_bytes() == bytes(data)
        await anyio.sleep(0.5)  # a resumption that settles again would notify within this
        assert await sup.take_messages(root) == []


async def test_a_notice_a_damaged_parent_mailbox_refuses_is_one_line_naming_the_code(tmp_path, caplog):
    """It was logged with a traceback of the store's internals (27 lines under `subagents send`)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child_id)
        Path(sup.store.path(root.id, "mailbox")).write_bytes(b"")  # the consumed notice is gone
        caplog.clear()
        await sup.followup(root, child_id, S({"return": "again"}))
        with anyio.fail_after(20):
            while not [r for r in caplog.records if "settlement notice was not delivered" in r.getMessage()]:
                await anyio.sleep(0.02)
    [record] = [r for r in caplog.records if "settlement notice was not delivered" in r.getMessage()]
    assert record.exc_info is None and "CORRUPT_SESSION" in record.getMessage(), record.getMessage()


async def test_a_roots_mailbox_damaged_in_its_consumed_part_is_reported_to_the_host_that_takes(tmp_path):
    """Found by a corruption probe: with a byte of the root's last consumed notice flipped, every later notice
    was refused (a log line), while ``take_messages`` read only past the consumed part, found nothing and
    returned ``[]``, and ``wait_for_message`` waited out its timeout, for good without one. A take that finds
    nothing now checks what acceptances check and says ``CORRUPT_SESSION``."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "ready"}))
        await settled(sup, root, child_id)
        path = Path(sup.store.path(root.id, "mailbox"))
        data = bytearray(path.read_bytes())
        end = len(data.rstrip(b"\0"))
        data[end - 3] ^= 0xFF  # inside the consumed notice
        path.write_bytes(bytes(data))
        await sup.followup(root, child_id, S({"return": "second"}))  # runs; its notice cannot be accepted
        with pytest.raises(SubagentError) as caught:
            await sup.wait_for_message(root, timeout_s=30)
        assert caught.value.code == "CORRUPT_SESSION" and root.id in str(caught.value)
        with pytest.raises(SubagentError) as caught:
            await sup.take_messages(root)
        assert caught.value.code == "CORRUPT_SESSION"
