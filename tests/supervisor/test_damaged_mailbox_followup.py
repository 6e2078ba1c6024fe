"""A message to a continuable child nobody hosts whose mailbox was deleted: refused before its lease is taken.

Found by a probe that damaged store files (probeG, case 4): the caller got ``CORRUPT_SESSION``, but the
cold resume had taken the child's lease first (a new epoch, left behind released) and launched its
driver, whose first read of the mailbox failed and was logged with a traceback ("driver of ... failed").
The mailbox is now read, against what the log says was consumed, before the lease, as the log is: the
caller still gets ``CORRUPT_SESSION``, the lease keeps its epoch, and no driver runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from subagents.store import read_lease
from subagents.supervisor import SubagentError

from ..conftest import events_of, wait_until
from .test_continuable import S, continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("verb", ["followup", "send"])
async def test_a_message_to_a_child_whose_mailbox_was_deleted_takes_no_lease_and_logs_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, verb: str,
) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child_id)
        mailbox = sup.store.path(child_id, "mailbox")
    os.unlink(mailbox)  # its consumed prompt gone with it: the log and the mailbox disagree
    caplog.set_level(logging.INFO)
    async with continuable_supervisor(tmp_path) as sup:  # another host: the child is resumed from the store
        root = await sup.open_root(id=root.id)
        before = read_lease(sup.store, child_id)
        caplog.clear()
        with pytest.raises(SubagentError) as info:
            if verb == "followup":
                await sup.followup(root, child_id, S({"return": "never"}))
            else:
                await sup.send(child_id, S({"return": "never"}), parent=root.id)
        assert info.value.code == "CORRUPT_SESSION", info.value
        assert "mailbox and log disagree" in info.value.message
    # the supervisor is closed: any driver it launched has ended, and logged what it met
    assert read_lease(sup.store, child_id) == before
    assert not os.path.exists(mailbox)
    assert [r.getMessage() for r in caplog.records if r.exc_info is not None] == []
    assert not [r for r in caplog.records if "driver of" in r.getMessage() or "activation of" in r.getMessage()]


async def test_a_hosted_child_whose_mailbox_is_deleted_mid_turn_stops_with_its_code_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Its driver's next read of the mailbox fails ``CORRUPT_SESSION``: a diagnosed condition, logged as one
    error line with its code, not a traceback (that is kept for bugs)."""
    caplog.set_level(logging.INFO)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"sleep": 500}, {"return": "first"}))
        await wait_until(lambda: "turn/start" in [e["type"] for e in events_of(sup.store, child_id)], what="its turn to start")
        os.unlink(sup.store.path(child_id, "mailbox"))
        await wait_until(lambda: any("driver of" in r.getMessage() for r in caplog.records), what="its driver to stop")
    stopped = [r for r in caplog.records if "driver of" in r.getMessage()]
    assert [r.exc_info for r in stopped] == [None], [r.getMessage() for r in stopped]
    assert "CORRUPT_SESSION" in stopped[0].getMessage() and stopped[0].levelno == logging.ERROR, stopped[0].getMessage()
