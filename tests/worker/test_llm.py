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


# -- failures, retries and secrets (issue #14) ------------------------------------------------------

CRLF_SECRET = "sk-crlf-secret-from-a-dotenv"
os.environ.setdefault("FAKE_LLM_KEY_CRLF", CRLF_SECRET + "\r\n")
os.environ.setdefault("FAKE_LLM_KEY_BAD", "sk-bad key-with-a-space")


@pytest.fixture
def programmed_server() -> Iterator[tuple[str, list[dict[str, Any]], list[Any]]]:
    """A fake endpoint answering request N with ``answers[N]`` (the last one repeats):
    ``(status, body)`` or a callable of the request headers returning one."""
    seen: list[dict[str, Any]] = []
    answers: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"auth": self.headers.get("Authorization"), "body": body})
            answer = answers[min(len(seen), len(answers)) - 1]
            status, reply = answer(self.headers) if callable(answer) else answer
            payload = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen, answers
    finally:
        server.shutdown()
        server.server_close()


def _completion(content: str | None = None, calls: list[tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "fake-model", **_reply(content, calls)}


async def _run_once(tmp_path, program: LlmProgram, prompt: str = "go") -> Any:
    from subagents.supervisor import SubagentRequest

    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="llm", program=program, capabilities=Capabilities.all()))
        root = await sup.open_root()
        run = await sup.start("llm", SubagentRequest(parent=root, prompt=prompt))
        with anyio.fail_after(60):
            result = await run.result()
        events = inspect(sup.store, run.id).events
        await run.dispose()
    return result, events


@pytest.mark.anyio
async def test_rate_limited_then_answered_completes(tmp_path, programmed_server) -> None:
    """429 (Retry-After: 0) then success: the SDK retries with backoff and the turn completes."""
    base_url, seen, answers = programmed_server
    answers += [(429, {"error": {"message": "slow down"}}), (200, _completion("after the wait"))]
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="FAKE_LLM_KEY")
    result, _events = await _run_once(tmp_path, program)
    assert (result.stop_reason, result.output) == ("completed", "after the wait")
    assert len(seen) == 2


@pytest.mark.anyio
async def test_server_error_mid_conversation_ends_the_turn_with_a_diagnostic(tmp_path, programmed_server) -> None:
    """A tool step succeeds, then the endpoint fails for good: stop reason error, the cause named, the step kept."""
    base_url, seen, answers = programmed_server
    answers += [(200, _completion(calls=[("list_agents", {})])), (503, {"error": {"message": "overloaded"}})]
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="FAKE_LLM_KEY", max_retries=1)
    result, events = await _run_once(tmp_path, program)
    assert result.stop_reason == "error"
    assert result.diagnostic == "the model endpoint failed (HTTP 503) (after 1 retries): overloaded"
    assert len(seen) == 3  # the first call, then the failing one and its retry
    assert [e["data"]["name"] for e in events if e["type"] == "tool/call"] == ["list_agents"]
    assert events[-1]["type"] == "turn/end" and events[-1]["data"]["stop_reason"] == "error"


@pytest.mark.anyio
async def test_an_endpoint_echoing_the_key_never_gets_it_stored(tmp_path, programmed_server) -> None:
    """Issue #14 defect 5: an error body quoting the Authorization header is redacted before it is stored."""
    base_url, seen, answers = programmed_server
    answers.append(lambda headers: (401, {"error": {"message": f"bad credentials: {headers.get('Authorization')}",
                                                     "api_key": SECRET}}))
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="FAKE_LLM_KEY")
    result, events = await _run_once(tmp_path, program)
    assert result.stop_reason == "error"
    assert result.diagnostic.startswith("the model endpoint refused the API key from $FAKE_LLM_KEY (HTTP 401): bad credentials")
    assert SECRET not in result.diagnostic and "[redacted]" in result.diagnostic
    assert seen[0]["auth"] == f"Bearer {SECRET}"
    assert SECRET.encode() not in _all_bytes(str(tmp_path / "st"))
    assert SECRET not in json.dumps(events)


@pytest.mark.anyio
async def test_a_key_with_a_crlf_tail_is_stripped_and_never_stored(tmp_path, programmed_server) -> None:
    """A key from a CRLF .env file once made httpx quote "Bearer <key>\\r" into the stored diagnostic."""
    base_url, seen, answers = programmed_server
    answers.append(lambda headers: (500, {"error": {"message": f"echo {headers.get('Authorization')}"}}))
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="FAKE_LLM_KEY_CRLF", max_retries=0)
    result, _events = await _run_once(tmp_path, program)
    assert seen[0]["auth"] == f"Bearer {CRLF_SECRET}"
    assert result.stop_reason == "error" and CRLF_SECRET not in result.diagnostic
    assert CRLF_SECRET.encode() not in _all_bytes(str(tmp_path / "st"))


@pytest.mark.anyio
async def test_a_malformed_key_is_refused_before_any_request(tmp_path, programmed_server) -> None:
    base_url, seen, answers = programmed_server
    answers.append((200, _completion("never")))
    program = LlmProgram(base_url=base_url, model="fake-model", api_key_env="FAKE_LLM_KEY_BAD")
    result, _events = await _run_once(tmp_path, program)
    assert (result.stop_reason, seen) == ("error", [])
    assert "FAKE_LLM_KEY_BAD" in result.diagnostic and "sk-bad" not in result.diagnostic
    assert b"sk-bad" not in _all_bytes(str(tmp_path / "st"))


@pytest.mark.anyio
async def test_an_unreachable_endpoint_is_a_diagnostic(tmp_path) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    program = LlmProgram(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env="FAKE_LLM_KEY", max_retries=0)
    result, _events = await _run_once(tmp_path, program)
    assert result.stop_reason == "error" and "is unreachable" in result.diagnostic


def test_load_api_key_strips_and_validates() -> None:
    from subagents.worker.programs.llm import ApiKeyError, load_api_key

    assert load_api_key("K", {"K": " sk-abc\r\n"}) == "sk-abc"
    assert load_api_key("K", {"K": "  "}) is None and load_api_key("K", {}) is None
    for bad in ["sk a", "sk-\x00", "sk-é"]:
        with pytest.raises(ApiKeyError) as info:
            load_api_key("K", {"K": bad})
        assert bad not in str(info.value)


def test_redactor_removes_keys_and_key_shapes() -> None:
    from subagents.worker.redaction import Redactor

    redact = Redactor(["sk-known-key\r"])
    text = redact("got Bearer sk-known-key\r and b'Bearer other-token\\r' api_key=xyz123 sk-unknownsecret9 fine")
    assert "sk-known-key" not in text and "other-token" not in text and "xyz123" not in text and "unknownsecret9" not in text
    assert text.endswith("fine")
