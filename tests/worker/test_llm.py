"""The ``llm`` program against a fake OpenAI-compatible server on 127.0.0.1.

The fake answers from a script keyed on the conversation it receives: the
top agent (TASK:A) delegates in the foreground, starts a continuable helper,
sends it a message, lists its agents, reports, and finishes. Every request is
recorded, so the test checks what the model was shown (tool renderings, the
delegation prompt) and that the API key never reached the store.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import anyio
import pytest

from subagents.store import inspect
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig
from subagents.worker.model_tools import DelegationConfig
from subagents.worker.programs.llm import DELEGATION_TEXT, LlmProgram

SECRET = "sk-test-secret-never-stored"
# Set at import, before any pool starts: forkserver workers inherit the environment of the
# forkserver, which starts with the first pool of the process and never sees later changes.
os.environ.setdefault("FAKE_LLM_KEY", SECRET)


def _reply(content: str | None = None, calls: list[tuple[str, dict[str, Any]]] | None = None, finish: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call-{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)
        ]
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else finish}]}


def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    users = [m["content"] for m in messages if m["role"] == "user"]
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    task = users[-1] if users else ""
    if task.startswith("Background subagent "):
        return _reply("noted")  # a settlement notice woke the agent for a turn of its own
    if users and "TASK:A" in users[0]:
        step = len(tools)
        if step == 0:
            return _reply(calls=[("subagent", {"description": "helper", "prompt": "TASK:B", "run_in_background": False})])
        if step == 1:
            return _reply(calls=[("subagent", {"description": "background", "prompt": "TASK:C", "run_in_background": True})])
        if step == 2:
            child = tools[1].split()[-1]
            return _reply(calls=[("send_message", {"subagent_id": child, "message": "TASK:D"})])
        if step == 3:
            return _reply(calls=[("list_agents", {})])
        if step == 4:
            return _reply(calls=[("report", {"output": "A progress"})])
        return _reply("A finished")
    if "TASK:B" in task:
        return _reply("B done")
    if "TASK:D" in task:
        return _reply("D done")
    if "TASK:C" in task:
        return _reply("C done")
    if "TASK:LONG" in task:
        return _reply("cut", finish="length")
    return _reply("?")


@pytest.fixture
def fake_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            payload = json.dumps(script(body["messages"])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def _all_bytes(root: str) -> bytes:
    blob = b""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                blob += handle.read()
    return blob


@pytest.mark.anyio
async def test_llm_conversation_delegates_sends_lists_and_reports(tmp_path, fake_server) -> None:
    """A scripted model delegates, messages a continuable child, lists agents and reports."""
    base_url, seen = fake_server
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="FAKE_LLM_KEY",
                         delegation=DelegationConfig(provider="llm", background_mode="continuable"))
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=2, durability="none")) as sup:
        sup.register_provider(Provider(name="llm", program=program, capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root(label="host")
        child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="llm", prompt="TASK:A", label="top"))
        texts: list[str] = []
        with anyio.fail_after(30):
            while not any(f"Background subagent {child_id} finished" in t for t in texts):
                texts += [m.content for m in await sup.wait_for_message(root, timeout_s=30)]
        assert f"Background subagent {child_id} reported:\nA progress" in texts
        assert any(t.startswith(f"Background subagent {child_id} finished") and t.endswith("Its closing message:\nnoted") for t in texts)

    requests = [r["body"]["messages"] for r in seen]
    tool_texts = [m["content"] for msgs in requests for m in msgs if m["role"] == "tool"]
    assert "B done" in tool_texts
    started = next(t for t in tool_texts if t.startswith("started subagent "))
    background_id = started.split()[-1]
    assert f"message queued as the next turn for subagent {background_id}" in tool_texts
    listing = next(t for t in tool_texts if background_id in t and "—" in t)
    assert f"{background_id} [" in listing and "] — background" in listing
    assert any(t.startswith("report accepted by the agent that started you as message ") for t in tool_texts)
    # the delegated agents were told they are delegated; the key went only into the header
    assert all(DELEGATION_TEXT in msgs[0]["content"] for msgs in requests)
    assert {r["auth"] for r in seen} == {f"Bearer {SECRET}"}
    assert {r["body"]["model"] for r in seen} == {"fake-model"}
    assert SECRET.encode() not in _all_bytes(str(tmp_path / "st"))
    # the background child ran TASK:C then the sent TASK:D, one turn each
    events = inspect(sup.store, background_id).events
    assert [e["data"]["content"] for e in events if e["type"] == "message/accepted"] == ["TASK:C", "TASK:D"]


@pytest.mark.anyio
async def test_llm_length_finish_is_max_tokens(tmp_path, fake_server) -> None:
    """finish_reason "length" ends the run with stop_reason max-tokens."""
    from subagents.supervisor import SubagentRequest

    base_url, _seen = fake_server
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="NO_SUCH_KEY_VARIABLE")
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="llm", program=program))
        root = await sup.open_root()
        run = await sup.start("llm", SubagentRequest(parent=root, prompt="TASK:LONG"))
        with anyio.fail_after(30):
            result = await run.result()
        await run.dispose()
    assert result.stop_reason == "max-tokens"
    assert result.output == "cut"
