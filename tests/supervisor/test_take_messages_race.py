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


async def test_a_take_whose_root_is_released_after_it_consumed_still_returns_what_it_consumed(tmp_path, monkeypatch) -> None:
    """Found by a probe (takes beside a ``release_root``/``open_root`` loop lost a notice now and then): a take
    appended the messages as consumed, then its commit point (the identity cache's refresh, due once the root's
    log passes 64 KiB) checked the fence again and raised ``FENCED`` because the root had been released in
    between. The messages were consumed in the log and returned to nobody: lost for good. What a take consumed
    is now returned, whatever happens to the root after its write."""
    import threading

    from subagents.store import IdGenerator, LogWriter, accept, read_mailbox
    from subagents.supervisor import SubagentError

    async with open_supervisor(tmp_path, pool_size=1, providers=False) as sup:
        root = await sup.open_root(label="r")
        ids = IdGenerator()
        accept(sup.store, root.id, source={"kind": "user"}, content="x" * 70_000, ids=ids)
        assert len(await sup.take_messages(root)) == 1  # the root's log is past 64 KiB now: commits refresh its cache
        wanted = accept(sup.store, root.id, source={"kind": "user"}, content="the notice", ids=ids)

        written, released = threading.Event(), threading.Event()
        real_sync = LogWriter._sync_at_commit

        def released_meanwhile(self) -> None:
            """The take's commit point, after its append wrote: the root is released before the fence is checked."""
            if not written.is_set():
                written.set()
                released.wait(10)
            real_sync(self)

        monkeypatch.setattr(LogWriter, "_sync_at_commit", released_meanwhile)
        outcome: list[object] = []

        async def take() -> None:
            try:
                outcome.append([m.id for m in await sup.take_messages(root)])
            except SubagentError as exc:
                outcome.append(exc.code)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                await anyio.to_thread.run_sync(written.wait, 10)
                await sup.release_root(root)
                released.set()
        consumed = [m.id for m in read_mailbox(sup.store, root.id)][-1]
        assert consumed == wanted
        assert outcome == [[wanted]], outcome
        report = check_store(sup.store.root)
        assert report.clean, str(report)
