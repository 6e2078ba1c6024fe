"""What ``run_in_background`` does in the built-in ``llm`` program: a child its model can follow, or none.

Found by a probe: the program used the delegation tool's defaults, so a background call started a
one-shot job that nothing could reach: ``list_agents`` lists no one-shot child, ``interrupt_agent``
cannot stop one (its spawn handle is the program's, not the model's), ``send_message`` is
``NOT_RESUMABLE``, and no tool waits for a job, so its result was thrown away. In the reference such a
job needs a jobs tool, which this project's models do not have. Unless its delegation is configured,
the program now starts a *continuable* child in the background when its own turn is continuable
(listed, messaged, interrupted, and its settlement notice wakes the model's next turn), and offers no
``run_in_background`` in a one-shot turn (several calls in one reply run at once instead).
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

import anyio
import pytest

from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

from . import test_llm_faults
from .test_llm_faults import completion, program, run_once, send_answer

endpoint = test_llm_faults.endpoint  # the fake endpoint fixture, shared (an assignment: no unused import)

pytestmark = pytest.mark.anyio


def _subagent_tool(request: dict[str, Any]) -> dict[str, Any]:
    return next(t["function"] for t in request["tools"] if t["function"]["name"] == "subagent")


async def test_a_one_shot_turn_offers_no_background_call(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("subagent", {"description": "bg", "prompt": "JOB", "run_in_background": True})]),
                completion("done")]
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    assert "run_in_background" not in _subagent_tool(seen[0])["parameters"]["properties"]
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["run_in_background is disabled for this tool instance (enableRunInBackground: false)"]


async def test_a_continuable_turn_starts_a_continuable_child_whose_notice_wakes_the_model(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint

    def route(handler: BaseHTTPRequestHandler) -> None:
        messages = handler.request_json["messages"]  # type: ignore[attr-defined]
        users = [m["content"] for m in messages if m["role"] == "user"]
        if users[0] == "JOB":
            send_answer(handler, completion("JOB-RESULT-42"))
        elif any("JOB-RESULT-42" in text for text in users):
            send_answer(handler, completion("got the job's result"))
        elif any(m["role"] == "tool" for m in messages):
            send_answer(handler, completion("waiting for my job"))
        else:
            send_answer(handler, completion(calls=[("subagent", {"description": "bg", "prompt": "JOB", "run_in_background": True})]))

    answers.append(route)
    config = SupervisorConfig(pool_size=2, durability="none")
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        sup.register_provider(Provider(name="llm", program=program(base_url, max_retries=0), capabilities=Capabilities.all(),
                                       continuable=True))
        root = await sup.open_root()
        parent, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="llm", prompt="go", label="parent"))
        with anyio.fail_after(60):
            while not any("got the job's result" in request_text for request_text in _replies(sup, parent)):
                await anyio.sleep(0.05)
        children = await sup.list_children(parent)
    assert [(child.label, child.mode) for child in children] == [("bg", "continuable")]
    first = json.dumps([m for m in seen if m["messages"][1]["content"] == "go"][0])
    assert "run_in_background" in first
    told = [m["content"] for request in seen for m in request["messages"] if m["role"] == "tool"]
    assert f"started subagent {children[0].id}" in told


def _replies(sup: Supervisor, session_id: str) -> list[str]:
    from subagents.store import inspect

    return [e["data"].get("text", "") for e in inspect(sup.store, session_id).events if e["type"] == "assistant/message"]
