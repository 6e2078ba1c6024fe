"""Arguments of the wrong kind are ``INVALID_REQUEST`` before anything changes (found by a probe).

* ``SubagentRun.cancel(reason)`` with a reason that is no text (``object()``, a set), a lone
  surrogate or 20 MB raised a bare TypeError or UnicodeEncodeError after marking the run cancelled:
  the turn went on to its end, no later cancel or dispose could stop it, and ``result()`` said
  ``aborted`` while the store said ``completed``.
* A list or a dict where a root or parent goes (``take_messages([])``, ``wait_for_message({})``,
  ``list_descendants([])``, ``followup([], ...)``) was ``TypeError: unhashable type``.
* ``followup(..., source=[])`` (or ``{}``) was quietly replaced by the default source; a source
  that is no map is refused as ``send``'s is (``INVALID_RECORD``).
"""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import SubagentError, inspect
from subagents.supervisor import SubagentRequest

from ..conftest import DEADLINE_S, open_supervisor
from .test_continuable import continuable_supervisor, settled, start

pytestmark = pytest.mark.anyio


def script(*actions) -> str:
    return json.dumps({"script": list(actions)})


@pytest.mark.parametrize("reason", [None, 42, object(), {1, 2}, "", "\ud800", "r" * 20_000], ids=["none", "int", "object", "set", "empty", "surrogate", "huge"])
async def test_a_cancel_reason_that_is_no_short_text_is_refused_and_the_run_still_stops(tmp_path, reason) -> None:
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"sleep": 30000}, {"return": "late"}])))
        with pytest.raises(SubagentError) as refused:
            run.cancel(reason)
        assert refused.value.code == "INVALID_REQUEST", refused.value
        assert run.cancelled is None  # nothing changed
        run.cancel("operator")
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        assert result.stop_reason == "aborted"
        await run.dispose()
    ends = [e["data"] for e in inspect(sup.store, run.id).events if e["type"] == "turn/end"]
    assert [e["stop_reason"] for e in ends] == ["aborted"]  # the store says what the result says


async def test_a_root_or_parent_of_another_kind_is_an_invalid_request(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child, _ = await start(sup, root, script({"return": "x"}))
        await settled(sup, root, child)
        calls = {
            "take_messages": lambda: sup.take_messages([]),
            "wait_for_message": lambda: sup.wait_for_message({}, timeout_s=0),
            "list_descendants": lambda: sup.list_descendants([]),
            "list_children": lambda: sup.list_children({}),
            "followup": lambda: sup.followup([], child, "x"),
            "drain_remote": lambda: sup.drain_remote([]),
        }
        for name, call in calls.items():
            with pytest.raises(SubagentError) as refused:
                await call()
            assert refused.value.code == "INVALID_REQUEST", (name, refused.value)


@pytest.mark.parametrize("source", [[], "x"])
async def test_a_followup_source_that_is_no_map_is_refused(tmp_path, source) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        child, _ = await start(sup, root, script({"return": "x"}))
        await settled(sup, root, child)
        before = len(inspect(sup.store, child).events)
        with pytest.raises(SubagentError) as refused:
            await sup.followup(root, child, script({"return": "y"}), source=source)
        assert refused.value.code == "INVALID_RECORD", refused.value
        assert len(inspect(sup.store, child).events) == before  # not resumed for it
