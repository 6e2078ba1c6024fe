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
