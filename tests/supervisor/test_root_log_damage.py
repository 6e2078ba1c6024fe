"""Damage inside a log's records that a taken message or a discard follows is corruption, not a torn tail.

A probe flipped one bit in the first record of a root's log after the root had taken two notices.
The log's commit points were only its ``turn/end`` records, which a root never writes: the damage
read as a torn tail, ``check`` was clean, and ``open_root`` (or ``fsck --repair``) cut every
record after it, so the two messages already taken were delivered again. A root's takes
(``message/accepted``) and every ``message/discarded`` are committed writes too: records that chain
after damage make it ``corrupt``, a diagnostic for that session, and nothing is cut.
"""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import CorruptSessionError, Store, inspect
from subagents.store.check import check_store
from subagents.supervisor import Capabilities, ContinuableSpec, Provider

from ..conftest import DEADLINE_S, open_supervisor
from ..session_bytes import file_bytes, log_start, patch

pytestmark = pytest.mark.anyio


def S(*actions: dict) -> str:
    return json.dumps({"script": list(actions)})


async def test_a_root_whose_log_rotted_before_its_takes_is_corrupt_and_nothing_taken_comes_again(tmp_path) -> None:
    provider = Provider(name="cont", program="script", capabilities=Capabilities.all(), continuable=True)
    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(provider)
        root = await sup.open_root(label="r")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="cont", label="c", prompt=S({"return": "one"})))
        with anyio.fail_after(DEADLINE_S):
            taken = [m.id for m in await sup.wait_for_message(root)]
            await sup.followup(root, child, S({"return": "two"}))
            taken += [m.id for m in await sup.wait_for_message(root)]
    st = Store(tmp_path / "store", create=False)
    offset = log_start(st, root.id) + 20  # inside the first record's payload
    patch(st, root.id, offset, bytes([file_bytes(st, root.id)[offset] ^ 0x01]))
    size = len(file_bytes(st, root.id))

    assert inspect(st, root.id).status == "corrupt"
    assert [v.session_id for v in check_store(st).of_kind("log-corrupt")] == [root.id]
    async with open_supervisor(tmp_path) as sup:
        again = await sup.open_root(id=root.id)
        with pytest.raises(CorruptSessionError):
            await sup.take_messages(again)
        assert [row.id for row in await sup.list_children(root.id)] == [child]  # the child lists as ever
    assert len(file_bytes(st, root.id)) == size  # nothing cut: the taken messages stay taken
    assert len(taken) == 2
