"""The ``llm`` program when the model sends more than one store record holds (127.0.0.1, a port the OS picks).

Found by a probe against a fake endpoint: a tool call whose arguments (or name) were larger than the
store's ``max_record_bytes`` ended the whole turn ``RECORD_TOO_LARGE: a "tool/call" event of ...``,
where the program answers every other call the store cannot hold (a number out of range, arguments
nested too deep) and lets the model go on; a reply whose text was that large ended the turn with the
store's message about an ``assistant/message`` event, which named no model and no endpoint. The stores
here are made with a 64 KiB record limit, so the replies stay small.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from subagents.store import inspect
from subagents.store.check import check_store
from subagents.supervisor import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig
from subagents.worker.programs.llm import LlmProgram

from .test_llm_faults import completion, endpoint, program  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio

LIMIT = 64 * 1024


async def run_small(tmp_path, llm: LlmProgram) -> tuple[Any, list[dict[str, Any]], Any]:
    """One one-shot turn on a store whose records hold at most ``LIMIT`` bytes, then a second turn on the same
    worker; the first's result and events, and the second's result (the worker is still fit to work)."""
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none",
                                                                           max_record_bytes=LIMIT)) as sup:
        sup.register_provider(Provider(name="llm", program=llm, capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("llm", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(60):
            result = await run.result()
        events = inspect(sup.store, run.id).events
        await run.dispose()
        again = await sup.start("llm", SubagentRequest(parent=root, prompt="again"))
        with anyio.fail_after(60):
            after = await again.result()
        await again.dispose()
    assert check_store(tmp_path / "st").clean
    return result, events, after


@pytest.mark.parametrize("name, arguments", [
    ("list_agents", json.dumps({"scope": "y" * (2 * LIMIT)})),
    ("n" * (2 * LIMIT), "{}"),
], ids=["arguments", "name"])
async def test_a_tool_call_larger_than_a_record_is_answered_and_the_turn_goes_on(tmp_path, endpoint, name, arguments) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [completion("Looking.", calls=[(name, arguments)]), completion("recovered"), completion("second turn")]
    result, events, after = await run_small(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output) == ("completed", "recovered"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert len(told) == 1 and told[0].startswith(f"this call of {len(name) + len(arguments)} bytes is more than "
                                                 f"the store holds in one record ({LIMIT} bytes); nothing was run"), told
    call = next(e["data"] for e in events if e["type"] == "tool/call")
    assert len(json.dumps(call)) < 1024 and call["name"].startswith(name[:8])  # logged, cut, as the model's later turns see it
    assert [e["type"] for e in events if e["type"].startswith("tool/")] == ["tool/call", "tool/result"]
    assert (after.stop_reason, after.output) == ("completed", "second turn")


async def test_a_reply_larger_than_a_record_ends_the_turn_naming_the_model_reply(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [completion("x" * (2 * LIMIT)), completion("second turn")]
    started = time.monotonic()
    result, _, after = await run_small(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output) == ("error", ""), result
    assert result.diagnostic == (f"the model endpoint {base_url} answered with a reply of {2 * LIMIT} bytes of text, more than the "
                                 f"store holds in one record ({LIMIT} bytes): it was not kept"), result.diagnostic
    assert (after.stop_reason, after.output) == ("completed", "second turn")
    assert time.monotonic() - started < 30
