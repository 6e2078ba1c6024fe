"""Two ``take_messages`` of one root at once (a ``wait_for_message`` poller beside a direct call) each read the
pending messages, then each appended them as consumed: both returned the same notice, the log consumed it twice,
and every later take, listing and check called the root's mailbox corrupt ("mailbox and log disagree"). Found by
a probe. A take now reads what is pending under the writer it consumes with, and consumes it only if no other
take appended first (the log's next seq); the loser reads again."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.supervisor import Capabilities, ContinuableSpec, Provider
from subagents.testing import check_store

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio

ROUNDS = 25
TAKERS = 3


async def test_concurrent_takes_return_each_message_once_and_leave_the_mailbox_sound(tmp_path) -> None:
    async with open_supervisor(tmp_path, pool_size=1, providers=False) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="r")
        taken: list[str] = []
        for i in range(ROUNDS):
            await sup.start_continuable(ContinuableSpec(
                parent=root, provider="script", label=f"c{i}", prompt=json.dumps({"script": [{"return": f"r{i}"}]}),
            ))
            with anyio.fail_after(20):
                while len(taken) <= i:
                    got: list[list[str]] = []

                    async def take() -> None:
                        got.append([m.id for m in await sup.take_messages(root)])

                    async with anyio.create_task_group() as tg:
                        for _ in range(TAKERS):
                            tg.start_soon(take)
                    for ids in got:
                        taken.extend(ids)
                    await anyio.sleep(0.005)
        assert len(taken) == len(set(taken)) == ROUNDS, taken
        assert await sup.take_messages(root) == []
    report = check_store(tmp_path / "store")
    assert report.clean, report
