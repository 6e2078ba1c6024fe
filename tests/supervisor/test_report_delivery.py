"""Where a report goes when its parent has no activation here: the same rule as a settlement notice.

A root or a continuable parent takes it in its durable mailbox (consumed by ``take_messages``, or at the
parent's next turn), wherever it is held; a one-shot parent, which never has a next turn and has no mailbox,
refuses it with ``PARENT_UNAVAILABLE``. Found by a probe: a continuable child of a running one-shot child that
reported made a mailbox for that parent whose log had consumed its prompt from none, so the report failed
``CORRUPT_SESSION`` naming the healthy parent (and so did every later turn of the child); and a child that
``subagents send`` cold-resumed in a process not holding its root could not report (``PARENT_UNAVAILABLE``)
while its settlement notice reached the same root's mailbox.
"""

from __future__ import annotations

import os

import anyio
import pytest

from subagents.store import inspect
from subagents.supervisor import SubagentRequest
from subagents.testing import check_store

from .test_continuable import S, continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio

HELPER = {"script": [{"report": "progress", "delivery": "wakeup"}, {"return": "helper done"}]}


async def test_a_report_to_a_running_one_shot_parent_is_refused_and_damages_nothing(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        coordinator = S({"start_continuable": {"prompt": HELPER, "label": "helper", "provider": "script"}}, {"sleep": 1500}, {"return": "ok"})
        run = await sup.start("oneshot-only", SubagentRequest(parent=root, prompt=coordinator))
        with anyio.fail_after(20):
            assert (await run.result()).output == "ok"
        [helper] = await sup.list_children(run.id)
        ends = [e["data"] for e in inspect(sup.store, helper.id).events if e["type"] == "turn/end"]
        assert ends[0]["stop_reason"] == "error"
        assert ends[0]["diagnostic"] == "PARENT_UNAVAILABLE: direct parent is not live; report was not delivered", ends
        assert not os.path.exists(sup.store.path(run.id, "mailbox"))  # none was made for the one-shot parent
        await run.dispose()
    report = check_store(tmp_path / "store")
    assert report.clean, report


async def test_a_child_resumed_where_its_root_is_not_held_reports_into_the_roots_mailbox(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child_id, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child_id)
    async with continuable_supervisor(tmp_path) as other:  # holds no root: it cold-resumes the child
        await other.send(child_id, S({"report": "from elsewhere", "delivery": "quiet"}, {"return": "second"}), parent=root.id)
        with anyio.fail_after(20):
            while not [e for e in inspect(other.store, child_id).events if e["type"] == "turn/end"][1:]:
                await anyio.sleep(0.02)
        ends = [e["data"] for e in inspect(other.store, child_id).events if e["type"] == "turn/end"]
        assert ends[1]["stop_reason"] == "completed", ends
    async with continuable_supervisor(tmp_path) as sup:
        again = await sup.open_root(id=root.id)
        texts = [m.content for m in await sup.take_messages(again)]
        assert any("reported:\nfrom elsewhere" in str(t) for t in texts), texts
