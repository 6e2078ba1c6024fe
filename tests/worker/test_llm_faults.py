"""The ``llm`` program against an endpoint that misbehaves, on 127.0.0.1 (a port the OS picks).

Found by a probe that drove the program against a scriptable fake endpoint: a reply that
trickles bytes never timed out; diagnostics claimed retries never made; a 200 whose body is no
chat completion ended in a raw ``JSONDecodeError`` or ``AttributeError``; text sent beside a tool
call was never logged, and later turns lost the tool calls from their transcript; a reply cut
at the token limit still ran its (cut) tool call with ``{}``; an ``output_schema`` never reached
the model; a key holding ``"`` leaked through a JSON echo; a bad setting was a bare ``ValueError``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import anyio
import pytest

from subagents.store import inspect
from subagents.supervisor import Capabilities, Provider, RunBudget, SubagentRequest, Supervisor, SupervisorConfig
from subagents.worker.programs.llm import SCHEMA_TEXT, LlmProgram, _transcript
from subagents.worker.redaction import Redactor

ECHOED_KEY = "not-shaped-like-a-key-2718281828"
# Set at import, before any pool starts: forkserver workers inherit the forkserver's environment.
os.environ.setdefault("FAKE_LLM_ECHOED_KEY", ECHOED_KEY)

# One answer: ``(status, headers, body bytes)``, or a callable writing the reply itself (a trickle).
Answer = tuple[int, dict[str, str], bytes] | Callable[[BaseHTTPRequestHandler], None]


def completion(content: str | None = None, calls: list[tuple[str, Any]] | None = None, finish: str = "stop") -> Answer:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": f"call-{i}", "type": "function",
                                  "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)}}
                                 for i, (n, a) in enumerate(calls)]
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish if not calls or finish == "length" else "tool_calls"}]}
    return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()


def trickle(handler: BaseHTTPRequestHandler) -> None:
    """Headers at once, then a space every 0.2 s for 30 s: every read answers, the reply never ends."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "1000000")
    handler.end_headers()
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass  # the client gave up: what the test wants


def cut_mid_reply(handler: BaseHTTPRequestHandler) -> None:
    """Headers promising 1,000 bytes, 20 of them, then the connection closed."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    handler.wfile.write(b'{"id": "c", "choices"')
    handler.wfile.flush()
    handler.close_connection = True


def send_answer(handler: BaseHTTPRequestHandler, answer: tuple[int, dict[str, str], bytes]) -> None:
    """Write one ``(status, headers, body)`` answer (a callable answer writes its own, often with this)."""
    status, headers, body = answer
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), **headers}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[dict[str, Any]], list[Answer]]]:
    """A fake endpoint answering request N with ``answers[N]`` (the last one repeats); every request is kept."""
    seen: list[dict[str, Any]] = []
    answers: list[Answer] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.request_json = json.loads(self.rfile.read(int(self.headers["Content-Length"])))  # a callable answer's
            seen.append(self.request_json)
            answer = answers[min(len(seen), len(answers)) - 1]
            if callable(answer):
                answer(self)
                return
            send_answer(self, answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen, answers
    finally:
        server.shutdown()
        server.server_close()


async def run_once(tmp_path, program: LlmProgram, **request: Any) -> tuple[Any, list[dict[str, Any]], float]:
    async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="llm", program=program, capabilities=Capabilities.all()))
        root = await sup.open_root()
        started = time.monotonic()
        run = await sup.start("llm", SubagentRequest(parent=root, prompt="go", **request))
        with anyio.fail_after(60):
            result = await run.result()
        took = time.monotonic() - started
        events = inspect(sup.store, run.id).events
        await run.dispose()
    return result, events, took


def program(base_url: str, **settings: Any) -> LlmProgram:
    return LlmProgram(base_url=base_url, model="fake", api_key_env="NO_SUCH_KEY_VARIABLE", **settings)


pytestmark = pytest.mark.anyio


async def test_a_reply_that_trickles_forever_is_cut_off_at_timeout_s(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.append(trickle)
    result, _, took = await run_once(tmp_path, program(base_url, timeout_s=1.0, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == ("error", "the model endpoint did not answer within timeout_s=1")
    assert took < 15 and len(seen) == 1


async def test_a_reply_cut_off_mid_body_is_named_as_such_not_as_unreachable(tmp_path, endpoint) -> None:
    """Found by a probe: an endpoint that answered, then closed the connection halfway through its body, was
    reported as "unreachable (RemoteProtocolError)", which sends an operator to the network instead of the server.
    It is retried like any broken connection."""
    base_url, seen, answers = endpoint
    answers.append(cut_mid_reply)
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=1))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint {base_url} broke off its reply (RemoteProtocolError) (after 1 retries)"), result
    assert len(seen) == 2


async def test_retries_are_counted_as_made_and_the_endpoint_may_refuse_them(tmp_path, endpoint) -> None:
    """``x-should-retry: false`` is one request, and no retry is claimed; a Retry-After of an hour is not waited for."""
    base_url, seen, answers = endpoint
    answers.append((503, {"x-should-retry": "false", "Content-Type": "application/json"}, b'{"error": {"message": "down"}}'))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=3))
    assert (result.stop_reason, result.diagnostic, len(seen)) == ("error", "the model endpoint failed (HTTP 503): down", 1)
    seen.clear()
    answers[:] = [(429, {"Retry-After": "3600", "Content-Type": "application/json"}, b'{"error": {"message": "quota"}}')]
    result, _, took = await run_once(tmp_path / "b", program(base_url, max_retries=3))
    assert result.diagnostic == ("the model endpoint is rate limiting (HTTP 429) (it asked to be retried in 3600 s, more than "
                                 "a turn waits): quota")
    assert len(seen) == 1 and took < 15


@pytest.mark.parametrize("answer, said", [
    ((200, {"Content-Type": "application/json"}, b"{not json"), "answered with a body that is not JSON"),
    ((200, {"Content-Type": "text/html"}, b"<html>maintenance</html>"), "answered with something that is not a chat completion"),
    ((200, {"Content-Type": "application/json"}, b'{"choices": [{"index": 0, "finish_reason": "stop"}]}'),
     "answered with a choice that has no message"),
    ((200, {"Content-Type": "application/json"}, b'{"error": {"message": "upstream overloaded"}}'),
     "answered with no choices: upstream overloaded"),
], ids=["not-json", "html", "no-message", "error-object"])
async def test_a_reply_that_is_no_chat_completion_is_named_as_such(tmp_path, endpoint, answer, said) -> None:
    base_url, seen, answers = endpoint
    answers.append(answer)
    result, events, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert result.stop_reason == "error" and said in result.diagnostic, result.diagnostic
    assert "Error:" not in result.diagnostic.split(said)[0]  # no raw exception text ahead of what happened
    assert events[-1]["type"] == "turn/end"


async def test_text_beside_a_tool_call_is_logged_and_rebuilt_with_the_call_for_later_turns(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers += [completion("Let me look at my agents first.", calls=[("list_agents", {})]), completion("done after the tool")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done after the tool")
    said = [e["data"]["text"] for e in events if e["type"] == "assistant/message"]
    assert said == ["Let me look at my agents first.", "done after the tool"]
    rebuilt = _transcript(events)
    call = next(m for m in rebuilt if m.get("tool_calls"))
    assert call["content"] == "Let me look at my agents first." and call["tool_calls"][0]["function"]["name"] == "list_agents"
    answer = rebuilt[rebuilt.index(call) + 1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == call["tool_calls"][0]["id"] and answer["content"]
    # what a later turn sends is what this turn sent (its second request, after the system prompt), the
    # call ids aside: the log names a call by its own id, used by both the call and its answer
    def without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**{k: v for k, v in m.items() if k != "tool_call_id"},
                 **({"tool_calls": [{**c, "id": "-"} for c in m["tool_calls"]]} if m.get("tool_calls") else {})} for m in messages]

    sent = seen[1]["messages"][1:]
    assert without_ids(rebuilt[: len(sent)]) == without_ids(sent)


async def test_a_reply_cut_at_the_token_limit_runs_none_of_its_tool_calls(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.append(completion(calls=[("subagent", '{"description": "research", "prompt": "Investigate the full hist')], finish="length"))
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert result.stop_reason == "max-tokens"
    assert not [e for e in events if e["type"] == "tool/call"] and len(seen) == 1


async def test_arguments_that_are_not_a_json_object_are_answered_as_an_error_not_run(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("list_agents", "{cut")]), completion("gave up")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "gave up")
    # never run, but logged with its answer (probe): a later turn's transcript is what the model saw
    assert [(e["type"], e["data"].get("args")) for e in events if e["type"] in ("tool/call", "tool/result")] == [
        ("tool/call", "{cut"), ("tool/result", None)]
    tool = [m for m in seen[1]["messages"] if m["role"] == "tool"]
    assert len(tool) == 1 and "not a JSON object" in tool[0]["content"]


async def test_an_output_schema_is_given_to_the_model(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.append(completion('{"answer": 42}'))
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    result, _, _ = await run_once(tmp_path, program(base_url), output_schema=schema)
    assert (result.stop_reason, result.structured) == ("completed", {"answer": 42})
    assert SCHEMA_TEXT + json.dumps(schema) in seen[0]["messages"][0]["content"]


async def test_a_reply_that_echoes_the_key_never_gets_it_into_the_log(tmp_path, endpoint, monkeypatch) -> None:
    """The key is only ever sent in the Authorization header; a proxy echoing the request back as the reply
    would put it in the model's text, which is logged. Key-shaped words of the model's own stay."""
    base_url, seen, answers = endpoint
    answers.append(completion(f"you sent {ECHOED_KEY}; an example key looks like sk-EXAMPLEKEY123"))
    result, events, _ = await run_once(tmp_path, LlmProgram(base_url=base_url, model="fake", api_key_env="FAKE_LLM_ECHOED_KEY"))
    assert result.output == "you sent [redacted]; an example key looks like sk-EXAMPLEKEY123"
    assert ECHOED_KEY.encode() not in b"".join(open(os.path.join(d, f), "rb").read()
                                              for d, _, files in os.walk(tmp_path / "st") for f in files)


def test_a_key_quoted_in_a_json_body_is_redacted_in_its_escaped_form_too() -> None:
    key = 'abcd"SECRETKEYtail123'
    echoed = json.dumps({"detail": f"got {key}"})
    assert "SECRETKEY" not in Redactor([key])(echoed)


@pytest.mark.parametrize("name, value, what", [
    ("SUBAGENTS_LLM_TIMEOUT_S", "abc", "a finite number of seconds above 0"),
    ("SUBAGENTS_LLM_TIMEOUT_S", "nan", "a finite number of seconds above 0"),
    ("SUBAGENTS_LLM_MAX_RETRIES", "2.0", "a whole number from 0 to 100"),
    ("SUBAGENTS_LLM_MAX_RETRIES", "-1", "a whole number from 0 to 100"),
])
def test_a_bad_setting_names_its_variable(name: str, value: str, what: str) -> None:
    with pytest.raises(ValueError) as info:
        LlmProgram.from_environment({name: value})
    assert str(info.value) == f"{name} must be {what}, not {value!r}"


def test_settings_read_back_from_the_environment() -> None:
    got = LlmProgram.from_environment({"SUBAGENTS_LLM_TIMEOUT_S": "2.5", "SUBAGENTS_LLM_MAX_RETRIES": "0"})
    assert (got.timeout_s, got.max_retries) == (2.5, 0)
    assert os.environ.get("NO_SUCH_KEY_VARIABLE") is None  # the tests' key variable: no key, no Authorization header


def test_a_call_an_older_log_left_without_a_result_is_answered_in_the_transcript() -> None:
    """A turn stopped while a call waited left no ``tool/result`` in logs written before the turn's end
    answered it: the transcript answers it where the conversation moves on, or every later request
    of that child is refused ("tool_calls must be followed by tool messages"). Found by a probe."""
    events = [
        {"type": "message/accepted", "data": {"content": "first"}},
        {"type": "step/start", "data": {}},
        {"type": "tool/call", "data": {"call_id": "m1-1", "name": "subagent", "args": {"prompt": "x"}}},
        {"type": "turn/end", "data": {"stop_reason": "aborted"}},
        {"type": "message/accepted", "data": {"content": "again"}},
    ]
    assert _transcript(events) == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "m1-1", "type": "function", "function": {"name": "subagent", "arguments": '{"prompt": "x"}'}}]},
        {"role": "tool", "tool_call_id": "m1-1", "content": "error: its outcome is unknown: the turn ended before it returned"},
        {"role": "user", "content": "again"},
    ]


@pytest.mark.parametrize("asked", ["-3", "nan", "-1e9"])
async def test_a_retry_after_that_is_no_wait_is_retried_with_backoff(tmp_path, endpoint, asked) -> None:
    """A negative ``Retry-After`` ended the turn with ``ValueError: delay must be a non-negative number``
    and ``nan`` was not retried at all (found by a probe): a wait that is no wait is ignored, and the
    usual backoff applies."""
    base_url, seen, answers = endpoint
    answers[:] = [(429, {"Retry-After": asked, "Content-Type": "application/json"}, b'{"error": {"message": "slow down"}}'),
                  completion("fine")]
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=2))
    assert (result.stop_reason, result.output, len(seen)) == ("completed", "fine", 2), result


def _calls_forever() -> Answer:
    return completion(None, [("add", {"a": 1, "b": 2})], finish="tool_calls")


async def test_a_model_that_calls_tools_forever_ends_on_its_step_budget(tmp_path, endpoint) -> None:
    """The program's own cap (``max_steps``, 32; ``SUBAGENTS_LLM_MAX_STEPS``) ended a runaway tool loop
    ``error``, and overrode a caller's larger ``max_steps`` (found by a probe): it is the turn's step
    budget when the caller set none, and ends it ``budget-exhausted`` as a caller's does."""
    base_url, seen, answers = endpoint
    answers[:] = [_calls_forever()]
    result, _, _ = await run_once(tmp_path, program(base_url, max_steps=4))
    assert (result.stop_reason, result.diagnostic, len(seen)) == ("budget-exhausted", "the turn exceeded max_steps=4", 4), result
    seen.clear()
    result, _, _ = await run_once(tmp_path / "b", program(base_url, max_steps=4), budget=RunBudget(max_steps=6))
    assert (result.stop_reason, result.diagnostic, len(seen)) == ("budget-exhausted", "the turn exceeded max_steps=6", 6), result


def test_the_step_cap_is_configurable() -> None:
    assert LlmProgram.from_environment({"SUBAGENTS_LLM_MAX_STEPS": "100"}).max_steps == 100
    with pytest.raises(ValueError, match="SUBAGENTS_LLM_MAX_STEPS"):
        LlmProgram.from_environment({"SUBAGENTS_LLM_MAX_STEPS": "0"})


async def test_credentials_in_the_endpoint_url_never_reach_the_store(tmp_path, endpoint) -> None:
    """A proxy's user and password in ``SUBAGENTS_LLM_BASE_URL`` were quoted in every diagnostic naming the
    endpoint, and so written to the session's log and its parent's index (found by a probe)."""
    base_url, seen, answers = endpoint
    answers[:] = [(200, {"Content-Type": "application/json"}, b'{"choices": []}')]
    with_credentials = base_url.replace("http://", "http://proxyuser:Pr0xyPassw0rd@")
    result, _, _ = await run_once(tmp_path, program(with_credentials, max_retries=0))
    shown = base_url.replace("http://", "http://[redacted]@")
    assert (result.stop_reason, result.diagnostic) == ("error", f"the model endpoint {shown} answered with no choices"), result
    for folder, _, files in os.walk(tmp_path / "st"):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                assert b"Pr0xyPassw0rd" not in handle.read(), os.path.join(folder, name)


async def test_a_refusal_the_model_states_ends_the_turn_refused_with_its_words(tmp_path, endpoint) -> None:
    """An OpenAI-style ``message.refusal`` (no content, finish ``stop``) ended the turn ``completed`` with
    an empty output, its words dropped (found by a probe)."""
    base_url, seen, answers = endpoint
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "fake", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": None, "refusal": "I can't help with that."}}]}
    answers[:] = [(200, {"Content-Type": "application/json"}, json.dumps(body).encode())]
    result, events, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output, result.diagnostic) == ("refusal", "I can't help with that.", "the model declined the request")
    assert [e["data"]["text"] for e in events if e["type"] == "assistant/message"] == ["I can't help with that."]
