"""A turn stopped while a recorded tool call waits closes that call in its log.

An interrupt (or its ``timeout_ms``) ended the turn with its ``tool/call`` left
without a ``tool/result``: every later turn of an ``llm`` child replayed a
call with no answer, which model endpoints refuse ("an assistant message with
'tool_calls' must be followed by tool messages"), so the child failed for good
(found by a probe). The turn's closing append now answers each open call
``TOOL_OUTCOME_UNKNOWN``, as crash repair does for a worker that died in one.
"""

from __future__ import annotations

import pytest

from subagents.supervisor import Capabilities, ContinuableSpec, Provider, RunBudget, SubagentRequest, UserAuthority

from ..conftest import events_of, open_supervisor, wait_until
from ..supervisor.test_continuable import settled

pytestmark = pytest.mark.anyio

PROGRAM = "tests.programs_for_tests:hangs_in_a_tool"


def _turns(st, session_id: str) -> list[list[tuple[str, object]]]:
    """Each turn's events from ``tool/call`` on: (type, the call's id or the end's stop reason)."""
    turns, current = [], None
    for e in events_of(st, session_id):
        if e["type"] == "turn/start":
            current = []
            turns.append(current)
        elif current is not None and e["type"] in ("tool/call", "tool/result"):
            current.append((e["type"], e["data"]["call_id"], e["data"].get("error") if e["type"] == "tool/result" else None))
        elif current is not None and e["type"] == "turn/end":
            current.append(("turn/end", e["data"]["stop_reason"], None))
    return turns


UNKNOWN = {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}


async def test_an_interrupted_call_is_answered_and_the_next_turn_runs(tmp_path) -> None:
    async with open_supervisor(tmp_path, providers=False) as sup:
        sup.register_provider(Provider(name="p", program=PROGRAM, capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        child, message_id = await sup.start_continuable(ContinuableSpec(parent=root, provider="p", prompt="hang", label="c"))
        await wait_until(lambda: any(e["type"] == "tool/call" for e in events_of(sup.store, child)), what="the tool call")
        await sup.interrupt(child, authority=UserAuthority(parent_session=root.id))
        await settled(sup, root, child)
        await sup.followup(root, child, "again")
        await settled(sup, root, child)
        call = f"{message_id}-1"
        assert _turns(sup.store, child) == [
            [("tool/call", call, None), ("tool/result", call, UNKNOWN), ("turn/end", "aborted", None)],
            [("turn/end", "completed", None)],
        ]


async def test_a_call_its_timeout_stopped_is_answered(tmp_path) -> None:
    async with open_supervisor(tmp_path, providers=False) as sup:
        sup.register_provider(Provider(name="p", program=PROGRAM, capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("p", SubagentRequest(parent=root, prompt="hang", budget=RunBudget(timeout_ms=200)))
        assert (await run.result()).stop_reason == "budget-exhausted"
        await run.dispose()
        (turn,) = _turns(sup.store, run.id)
        assert [(kind, error) for kind, _, error in turn] == [("tool/call", None), ("tool/result", UNKNOWN), ("turn/end", None)]
