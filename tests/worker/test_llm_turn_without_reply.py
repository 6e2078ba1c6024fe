"""A continuable ``llm`` child's next turn after one that ended with no reply (127.0.0.1, a port the OS picks).

Found by a probe against a fake endpoint: a turn the endpoint failed (a 500, a 429, a timeout) or an
interrupt stopped before the model answered left the child's prompt in its log with nothing after it,
and the next turn's transcript sent two user messages in a row. Endpoints whose chat template wants
the roles to alternate (vLLM and llama.cpp serving Mistral or Gemma models, DeepSeek's reasoner)
refuse that with a 400, every time: the child could never work again. The fake endpoint here refuses
such a conversation as they do.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import anyio
import pytest

from subagents.store import inspect
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

from .test_llm_faults import completion, endpoint, program, send_answer  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio

JSON = {"Content-Type": "application/json"}


def alternating(handler: BaseHTTPRequestHandler) -> None:
    """Answer as a strict chat template does: a 400 for two user messages in a row, else a reply."""
    roles = [m["role"] for m in handler.request_json["messages"] if m["role"] != "system"]  # type: ignore[attr-defined]
    if any(a == b == "user" for a, b in zip(roles, roles[1:])):
        body = {"error": {"message": "Conversation roles must alternate user/assistant/user/assistant/...", "code": 400}}
        send_answer(handler, (400, JSON, json.dumps(body).encode()))
        return
    send_answer(handler, completion("fine now"))


async def test_the_turn_after_one_the_endpoint_failed_keeps_the_roles_alternating(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [(500, JSON, b'{"error": {"message": "upstream down"}}'), alternating]
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="llm", program=program(base_url, max_retries=0), capabilities=Capabilities.all(),
                                       continuable=True))
        root = await sup.open_root()
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="llm", prompt="first task", label="C"))
        with anyio.fail_after(30):
            await sup.wait_for_message(root)
        await sup.followup(root, child_id, "try again")
        with anyio.fail_after(30):
            await sup.wait_for_message(root)
        ends = [e["data"] for e in inspect(sup.store, child_id).events if e["type"] == "turn/end"]
    assert [(end["stop_reason"], end["diagnostic"]) for end in ends] == [
        ("error", "the model endpoint failed (HTTP 500): upstream down"), ("completed", None)], ends
    sent = [m for m in seen[1]["messages"] if m["role"] != "system"]
    assert sent == [
        {"role": "user", "content": "first task"},
        {"role": "assistant", "content": "(no reply: that turn ended error: the model endpoint failed (HTTP 500): upstream down)"},
        {"role": "user", "content": "try again"},
    ]


def test_messages_taken_together_are_one_user_message() -> None:
    """Quiet messages (a child's report, a settlement notice) taken with the message that wakes the agent
    come one after another in its log, with no reply between: as two user messages in a row, a strict chat
    template refuses them (found by the same probe). They are sent as one user message, in log order."""
    from subagents.worker.programs.llm import _transcript

    events = [
        {"type": "message/accepted", "data": {"content": "first task"}},
        {"type": "assistant/message", "data": {"text": "started a helper"}},
        {"type": "turn/end", "data": {"stop_reason": "completed"}},
        {"type": "message/accepted", "data": {"content": "Background subagent X reported:\nhalf done"}},
        {"type": "message/accepted", "data": {"content": {"kind": "structured"}}},
        {"type": "message/accepted", "data": {"content": "go on"}},
    ]
    assert _transcript(events) == [
        {"role": "user", "content": "first task"},
        {"role": "assistant", "content": "started a helper"},
        {"role": "user", "content": 'Background subagent X reported:\nhalf done\n\n{"kind": "structured"}\n\ngo on'},
    ]
