"""The tool calls of one model reply run at once, and are answered in the model's order.

Found by a probe: a reply asking for two ``subagent`` calls ran them one after the other, so a model's
fan-out (how an LLM agent parallelises: several tool calls in one reply) took as long as the calls
added up, although each child runs in its own worker. The calls now run together; each is logged as
it starts and its result as it ends, and the model gets the answers in the order it asked.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import anyio
import pytest

from subagents.store import inspect
from subagents.supervisor import Capabilities, Provider, SubagentRequest, Supervisor, SupervisorConfig

from . import test_llm_faults
from .test_llm_faults import completion, program, send_answer

endpoint = test_llm_faults.endpoint  # the fake endpoint fixture, shared (an assignment: no unused import)

pytestmark = pytest.mark.anyio


async def test_two_subagent_calls_of_one_reply_run_at_once_and_answer_in_order(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    # each child's request is held until the other's has come too, or 30 s: calls run together pass
    # whatever the machine's load (a fixed 1 s sleep failed when a second worker took longer to start),
    # calls run one after the other end the first request before the second begins
    both = threading.Barrier(2)

    def child(handler: BaseHTTPRequestHandler) -> None:
        prompt = handler.request_json["messages"][-1]["content"]  # type: ignore[attr-defined]
        began = time.monotonic()
        try:
            both.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        with lock:
            spans.append((prompt, began, time.monotonic()))
        send_answer(handler, completion(f"answer to {prompt}"))

    answers += [
        completion(calls=[("subagent", {"description": "a", "prompt": "JOB-A"}), ("subagent", {"description": "b", "prompt": "JOB-B"})]),
        child,
        child,
        completion("both done"),
    ]
    config = SupervisorConfig(pool_size=2, durability="none")
    async with Supervisor.open(store=tmp_path / "st", config=config) as sup:
        sup.register_provider(Provider(name="llm", program=program(base_url, max_retries=0), capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("llm", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(60):
            result = await run.result()
        events = inspect(sup.store, run.id).events
        await run.dispose()
    assert (result.stop_reason, result.output) == ("completed", "both done"), result
    (_, first_began, first_ended), (_, second_began, _) = sorted(spans, key=lambda span: span[1])
    assert second_began < first_ended, f"the second child's request began after the first's ended: {spans}"
    final: list[dict[str, Any]] = seen[-1]["messages"]
    tool_answers = [(m["tool_call_id"], m["content"]) for m in final if m["role"] == "tool"]
    assert tool_answers == [("call-0", "answer to JOB-A"), ("call-1", "answer to JOB-B")]
    calls = [e["data"]["call_id"] for e in events if e["type"] == "tool/call"]
    results = [e["data"]["call_id"] for e in events if e["type"] == "tool/result"]
    assert len(calls) == 2 and sorted(results) == sorted(calls)


def test_results_logged_out_of_order_are_rebuilt_in_the_order_of_the_calls() -> None:
    """A later call may end first; the next turn's transcript answers the calls in the order the model made them,
    as the reply that ran them did, and a call left with no result (a stopped turn) is answered as unknown."""
    from subagents.worker.programs.llm import _UNANSWERED, _transcript

    events = [
        {"type": "message/accepted", "data": {"content": "go"}},
        {"type": "step/start", "data": {}},
        {"type": "tool/call", "data": {"call_id": "c1", "name": "subagent", "args": {"prompt": "a"}}},
        {"type": "tool/call", "data": {"call_id": "c2", "name": "subagent", "args": {"prompt": "b"}}},
        {"type": "tool/call", "data": {"call_id": "c3", "name": "subagent", "args": {"prompt": "c"}}},
        {"type": "tool/result", "data": {"call_id": "c3", "is_error": False, "value": {"text": "three"}}},
        {"type": "tool/result", "data": {"call_id": "c1", "is_error": False, "value": {"text": "one"}}},
        {"type": "step/start", "data": {}},
        {"type": "assistant/message", "data": {"text": "done"}},
    ]
    rebuilt = _transcript(events)
    assert [m.get("tool_call_id") for m in rebuilt if m["role"] == "tool"] == ["c1", "c2", "c3"]
    assert [m["content"] for m in rebuilt if m["role"] == "tool"] == ["one", _UNANSWERED, "three"]
    assert [m["role"] for m in rebuilt] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
