"""A message its mailbox holds and its log cannot: refused at acceptance, discarded if already there.

Found by a probe: a followup within ~50 bytes of the store's record limit was acknowledged, and then
every turn that tried to take it failed before it started (``message/accepted`` frames larger than
the mailbox's record): the worker retried it in a tight loop, and nothing queued behind it ever ran,
even after a restart. Acceptance now frames the log's record too; a mailbox that already holds such a
message (written by an older build) has it discarded unrun, with the turn's error saying why, and
the messages behind it run.
"""

from __future__ import annotations

import pytest

from subagents.store import Store, SubagentError, inspect, read_projection
from subagents.store import mailbox as mailbox_module
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

pytestmark = pytest.mark.anyio

LIMIT = 4096
ECHO = Provider(name="e", program="echo", capabilities=Capabilities.all(), continuable=True)


def _config() -> SupervisorConfig:
    return SupervisorConfig(pool_size=1, durability="none", max_record_bytes=LIMIT)


async def _child(sup: Supervisor):
    sup.register_provider(ECHO)
    root = await sup.open_root(label="r")
    child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="e", label="k", prompt="hello"))
    await sup.wait_for_message(root, timeout_s=30)
    return root, child


async def test_a_followup_its_log_could_not_hold_is_refused_and_the_next_runs(tmp_path) -> None:
    async with Supervisor.open(store=tmp_path / "st", config=_config()) as sup:
        root, child = await _child(sup)
        for size in (3880, 3900, 3920):  # each fits the mailbox's record, not the log's
            with pytest.raises(SubagentError) as refused:
                await sup.followup(root, child, "x" * size)
            assert refused.value.code == "MESSAGE_TOO_LARGE", refused.value
        await sup.followup(root, child, "small")
        [notice] = await sup.wait_for_message(root, timeout_s=30)
        assert notice.content.endswith("Its closing message:\nsmall")


async def test_an_oversized_message_already_in_a_mailbox_is_discarded_and_the_queue_goes_on(tmp_path, monkeypatch) -> None:
    async with Supervisor.open(store=tmp_path / "st", config=_config()) as sup:
        root, child = await _child(sup)
        monkeypatch.setattr(mailbox_module, "LOG_MARGIN", -(1 << 40))  # an older build: the mailbox's record framed alone
        big = await sup.followup(root, child, "x" * 3900)
        monkeypatch.undo()
        await sup.followup(root, child, "small")
        got = await sup.wait_for_message(root, timeout_s=30)
        while not any(str(m.content).endswith("Its closing message:\nsmall") for m in got):
            got += await sup.wait_for_message(root, timeout_s=30)
    projection = read_projection(Store(str(tmp_path / "st"), create=False), child)
    assert projection.consumed == 3  # hello, the oversized one (discarded), small
    events = inspect(Store(str(tmp_path / "st"), create=False), child).events
    [dropped] = [e["data"] for e in events if e["type"] == "message/discarded"]
    assert dropped["message_id"] == big and dropped["cause"] == "too-large"
    failed = [e["data"] for e in events if e["type"] == "turn/end" and e["data"]["stop_reason"] == "error"]
    assert failed and failed[0]["diagnostic"].startswith("MESSAGE_TOO_LARGE: "), failed


async def test_a_closing_message_near_the_limit_reaches_the_parent_cut(tmp_path) -> None:
    """Found by a probe: the notice carries the whole closing message, so one near the limit made a notice no
    mailbox takes (MESSAGE_TOO_LARGE, logged) and the parent heard nothing. It is cut to fit, and says where
    the rest is."""
    async with Supervisor.open(store=tmp_path / "st", config=_config()) as sup:
        root, child = await _child(sup)
        long = "y" * 3800
        await sup.followup(root, child, long)
        [notice] = await sup.wait_for_message(root, timeout_s=30)
    assert notice.content.startswith(f"Background subagent {child} finished"), notice.content[:200]
    head, marker = notice.content.rsplit("\n", 1)
    assert head.endswith("Its closing message:\n" + "y" * (len(head) - len(head.rstrip("y"))))
    assert 0 < len(head) - len(head.rstrip("y")) < len(long)
    assert marker == f"[… cut: the closing message is longer than a notice may be; all of it is in the child's log (`subagents log {child}`)]"
    ends = [e["data"] for e in inspect(Store(str(tmp_path / "st"), create=False), child).events if e["type"] == "assistant/message"]
    assert ends[-1]["text"] == long  # the log has all of it
