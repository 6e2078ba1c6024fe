"""A root's settlement notices go through its mailbox held open, as a resident child's followups do.

Found by a scale probe: each notice for a root was appended by a mailbox writer made for it alone,
whose first acceptance checks every message the root has not taken yet (that the mailbox still
holds what the log consumed, and that the rest reads whole). A host that starts a batch of children
and takes their notices at the end paid O(pending) per notice: 3,000 children cost 25 ms of host CPU
each at the end against 5.6 at the start. The root's writer is now kept while the root is held, and
checks again only when another hand touched the file (``benchmarks/notices.py`` measures the cost).
"""

from __future__ import annotations

import anyio
import pytest

from subagents.store import IdGenerator, accept

from .test_continuable import S, continuable_supervisor, start

pytestmark = pytest.mark.anyio


async def _notices(sup, root, count: int) -> list:
    taken: list = []
    with anyio.fail_after(60):
        while len(taken) < count:
            taken += await sup.wait_for_message(root)
    return taken


async def test_a_roots_notices_go_through_its_mailbox_kept_open_until_it_is_released(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        first, _ = await start(sup, root, S({"return": "one"}), label="one")
        with anyio.fail_after(60):
            while sup.continuation.open_mailboxes() == 0:  # the notice is accepted after the child's turn ends
                await anyio.sleep(0.02)
        assert sup.statistics().open_mailboxes == 1  # the root's: the child's first prompt went through no writer
        # another hand writes the mailbox between two notices: the kept writer finds it and appends after it
        await anyio.to_thread.run_sync(lambda: accept(sup.store, root.id, source={"kind": "user"}, content="aside", ids=IdGenerator()))
        second, _ = await start(sup, root, S({"return": "two"}), label="two")
        taken = await _notices(sup, root, 3)
        assert [message.source.get("sender_session_id") for message in taken] == [first, None, second]
        assert taken[1].content == "aside" and "one" in taken[0].content and "two" in taken[2].content
        await sup.release_root(root)
        assert sup.statistics().open_mailboxes == 0
        root = await sup.open_root(id=root.id)
        third, _ = await start(sup, root, S({"return": "three"}), label="three")
        taken = await _notices(sup, root, 1)
        assert [message.source.get("sender_session_id") for message in taken] == [third]
