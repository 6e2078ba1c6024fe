"""The ``llm`` program against model output and settings a probe found it mishandled (127.0.0.1, port 0).

Each test names what the probe saw: the key reaching the store through a tool call's arguments;
model output the store cannot hold (an integer over 64 bits, a lone surrogate, NaN) ending the
turn or making ``log --json`` invalid; ``run_in_background: "false"`` starting a background child;
an unset key variable reported as a refused key; calls to unknown tools or with bad arguments
answered but never logged, so a later turn's history differed from what the model saw; a choice
whose message is a string or a list taken as a completed empty answer; raw exception texts for a
body nested too deep, a false ``Content-Encoding`` and an invalid ``base_url``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from subagents.worker.programs.llm import LlmProgram, _transcript

from .test_llm import _all_bytes
from .test_llm_faults import ECHOED_KEY, completion, endpoint, program, run_once  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio

JSON = {"Content-Type": "application/json"}


def _tool_events(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(e["type"], e["data"]) for e in events if e["type"] in ("tool/call", "tool/result")]


def _without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with call ids blanked: the log names a call by its own id, used by both the call and its answer."""
    return [{**{k: v for k, v in m.items() if k != "tool_call_id"},
             **({"tool_calls": [{**c, "id": "-"} for c in m["tool_calls"]]} if m.get("tool_calls") else {})} for m in messages]


async def test_an_echoed_key_in_tool_arguments_never_reaches_the_store_nor_a_child(tmp_path, endpoint) -> None:
    """Only the reply's text was redacted: an endpoint echoing the key into a call's arguments had it stored as
    written, and a ``subagent`` call would have carried it into a child's prompt."""
    base_url, seen, answers = endpoint
    answers += [
        completion("looking", calls=[("list_agents", {"scope": f"children {ECHOED_KEY}"}),
                                     ("subagent", {"description": "d", "prompt": f"use {ECHOED_KEY}", "run_in_background": False})]),
        completion("child done"),  # the child's own request
        completion("done"),
    ]
    result, events, _ = await run_once(tmp_path, LlmProgram(base_url=base_url, model="fake", api_key_env="FAKE_LLM_ECHOED_KEY"))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    calls = [data for kind, data in _tool_events(events) if kind == "tool/call"]
    assert [c["args"] for c in calls] == [{"scope": "children [redacted]"},
                                          {"description": "d", "prompt": "use [redacted]", "run_in_background": False}]
    assert seen[1]["messages"][-1] == {"role": "user", "content": "use [redacted]"}  # what the child was asked
    assert ECHOED_KEY.encode() not in _all_bytes(str(tmp_path / "st"))


async def test_arguments_with_an_integer_wider_than_64_bits_are_answered_as_an_error(tmp_path, endpoint) -> None:
    """They ended the whole turn ``INVALID_RECORD ... OverflowError``: the store cannot hold such a number."""
    base_url, seen, answers = endpoint
    raw = '{"scope": 123456789012345678901234567890}'
    answers += [completion(calls=[("list_agents", raw)]), completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["the arguments of this list_agents call hold a number out of range; nothing was run"]
    tool = _tool_events(events)
    assert [kind for kind, _ in tool] == ["tool/call", "tool/result"] and tool[0][1]["args"] == raw


async def test_arguments_nested_too_deep_to_store_are_answered_as_an_error(tmp_path, endpoint) -> None:
    """Every string of the arguments is redacted on a walk that recurses: arguments nested near the interpreter's
    recursion limit (which ``json.loads`` still takes) would end the turn with a RecursionError."""
    base_url, seen, answers = endpoint
    raw = '{"scope": ' + "[" * 950 + "]" * 950 + "}"
    answers += [completion(calls=[("list_agents", raw)]), completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["the arguments of this list_agents call are nested deeper than 100; nothing was run"]
    assert [data.get("args") for _, data in _tool_events(events)] == [raw, None]


@pytest.mark.parametrize("raw", ['{"scope": NaN}', '{"scope": -Infinity}', '{"scope": 1e400}'])
async def test_arguments_holding_nan_or_infinity_are_refused_as_bad_json(tmp_path, endpoint, raw) -> None:
    """NaN was stored as a number and ``subagents log --json`` then printed invalid JSON."""
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("list_agents", raw)]), completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"][0]
    assert "nothing was run" in told
    tool = _tool_events(events)
    assert [kind for kind, _ in tool] == ["tool/call", "tool/result"] and tool[0][1]["args"] == raw  # as text, no NaN stored
    json.dumps([data for _, data in tool], allow_nan=False)


async def test_a_reply_text_with_a_lone_surrogate_is_stored_with_it_replaced(tmp_path, endpoint) -> None:
    """A cut emoji (``\\ud83d``) ended the turn ``INVALID_RECORD ... UnicodeEncodeError``."""
    base_url, seen, answers = endpoint
    answers.append((200, JSON, b'{"choices":[{"index":0,"message":{"role":"assistant","content":"cut emoji \\ud83d"},'
                              b'"finish_reason":"stop"}]}'))
    result, events, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output) == ("completed", "cut emoji \ufffd"), result
    assert [e["data"]["text"] for e in events if e["type"] == "assistant/message"] == ["cut emoji \ufffd"]


async def test_a_string_run_in_background_is_an_argument_error_and_starts_nothing(tmp_path, endpoint) -> None:
    """``"false"`` (a stringified boolean) started a background child: any truthy value counted as yes."""
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("subagent", {"description": "ask", "prompt": "CHILD", "run_in_background": "false"})]),
                completion("done")]
    result, _, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    assert len(seen) == 2  # no child asked the endpoint anything
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["subagent needs a boolean run_in_background"]


async def test_an_unset_key_variable_is_named_as_unset_not_as_a_refused_key(tmp_path, endpoint) -> None:
    """No key, no Authorization header: a 401 was reported as "refused the API key from $VAR"."""
    base_url, seen, answers = endpoint
    answers.append((401, JSON, b'{"error": {"message": "You didn\'t provide an API key."}}'))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", "the model endpoint refused the request (HTTP 401): $NO_SUCH_KEY_VARIABLE is not set, so no API key was sent: "
                 "You didn't provide an API key."), result


async def test_calls_to_unknown_tools_or_with_bad_arguments_are_logged_and_rebuilt(tmp_path, endpoint) -> None:
    """They were answered to the model but never logged: a later turn's history dropped them."""
    base_url, seen, answers = endpoint
    answers += [completion("let me look", calls=[("list_agents", {}), ("web_search", {"q": "x"}), ("list_agents", "[1, 2]")]),
                completion("answer")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "answer"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told[1:] == ['unknown tool "web_search"', "the arguments of this list_agents call are not a JSON object; nothing was run"]
    tool = _tool_events(events)
    # the calls of one reply run at once: each is logged as it starts, in the model's order, and its result as it ends
    assert [data.get("name") for kind, data in tool if kind == "tool/call"] == ["list_agents", "web_search", "list_agents"]
    called = [data["call_id"] for kind, data in tool if kind == "tool/call"]
    assert sorted(data["call_id"] for kind, data in tool if kind == "tool/result") == sorted(called)
    sent = seen[1]["messages"][1:]
    assert _without_ids(_transcript(events)[: len(sent)]) == _without_ids(sent)


@pytest.mark.parametrize("message", ["Sorry, upstream overloaded", [{"role": "assistant", "content": "hi"}], 7])
async def test_a_choice_whose_message_is_no_object_is_an_error(tmp_path, endpoint, message) -> None:
    """A string or a list counted as a completed, empty answer."""
    base_url, seen, answers = endpoint
    answers.append((200, JSON, json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint {base_url} answered with a choice whose message is not an object"), result


def _false_gzip(handler: Any) -> None:
    body = b'{"choices": []}'
    handler.send_response(200)
    for name, value in {"Content-Type": "application/json", "Content-Encoding": "gzip", "Content-Length": str(len(body))}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


async def test_a_body_nested_too_deep_is_a_diagnostic(tmp_path, endpoint) -> None:
    """``RecursionError: maximum recursion depth exceeded ...`` came out of the program as it was."""
    base_url, seen, answers = endpoint
    answers.append((200, JSON, b'{"choices":' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
    result, events, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint {base_url} answered with a body nested too deep to read"), result
    assert events[-1]["type"] == "turn/end"


async def test_a_false_content_encoding_is_named_as_such_not_as_unreachable(tmp_path, endpoint) -> None:
    """A body said to be gzip that is not was reported "unreachable (DecodingError)", though the endpoint answered."""
    base_url, seen, answers = endpoint
    answers.append(_false_gzip)
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint {base_url} answered with a body it could not decode (DecodingError)"), result


@pytest.mark.parametrize("url, reason", [
    ("http://127.0.0.1:99999/v1", "Port out of range 0-65535"),
    ("http://[::1/v1", "Invalid IPv6 URL"),
    ("ftp://127.0.0.1/v1", "not http or https"),
    ("127.0.0.1:8080/v1", "not http or https"),
    ("http:///v1", "no host"),
])
async def test_an_invalid_base_url_is_named_as_the_setting(tmp_path, url, reason) -> None:
    """A port out of range gave ``ExceptionGroup: ... OverflowError``, an unclosed IPv6 bracket ``httpx2.InvalidURL``."""
    result, _, _ = await run_once(tmp_path, program(url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"base_url (SUBAGENTS_LLM_BASE_URL) is not a valid http or https URL ({reason}): {url}"), result


async def test_an_invalid_base_url_never_quotes_its_credentials(tmp_path) -> None:
    result, _, _ = await run_once(tmp_path, program("http://user:Pr0xyPassw0rd@127.0.0.1:99999/v1", max_retries=0))
    assert result.stop_reason == "error" and "Pr0xyPassw0rd" not in (result.diagnostic or ""), result


def test_a_false_content_encoding_leaves_no_task_running(endpoint) -> None:
    """The client's half-read body left its closing to a task the loop started after the turn's code returned:
    the turn's end cancelled it as a task the program left running (a warning on every such turn)."""
    import asyncio

    import openai

    from subagents.worker.leftovers import tracked
    from subagents.worker.programs.llm import _close, _Failure

    base_url, seen, answers = endpoint
    answers.append(_false_gzip)
    llm = program(base_url, max_retries=0)

    async def main() -> list[asyncio.Task[Any]]:
        with tracked() as owned:
            client = openai.AsyncOpenAI(api_key="unused", base_url=base_url, max_retries=0)
            failed = await llm._create(client, {"model": "fake", "messages": [{"role": "user", "content": "go"}]})
            await _close(client)
            assert isinstance(failed, _Failure) and "could not decode" in failed.diagnostic
        return [task for task in owned if not task.done() and task is not asyncio.current_task()]

    assert asyncio.run(main()) == []


def test_parsed_arguments_refuse_nan_and_infinity() -> None:
    """``json.loads`` takes NaN and Infinity, which are no JSON: arguments holding them are no object to run with."""
    from subagents.worker.model_tools import parse_arguments

    assert [parse_arguments(raw) for raw in ('{"a": NaN}', '{"a": Infinity}', '{"a": 1}', "[" * 100_000)] == [None, None, {"a": 1}, None]


async def test_a_tool_call_that_failed_is_logged_as_a_failure(tmp_path, endpoint) -> None:
    """A tool that answers its failure (an unknown tool, a refused request) was logged ``is_error: False``,
    the failure only inside the value: a reader of the log took every such call for a success."""
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("no_such_tool", {}), ("list_agents", {})]), completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    results = [data for kind, data in _tool_events(events) if kind == "tool/result"]
    assert [(r["is_error"], r.get("error")) for r in results] == [(True, 'unknown tool "no_such_tool"'), (False, None)]
    assert results[0]["value"] == {"text": 'unknown tool "no_such_tool"', "is_error": True}  # what the transcript rebuilds from


async def test_interrupt_agent_says_when_it_found_no_turn_to_stop(tmp_path, endpoint) -> None:
    """It answered ``interrupt requested`` whatever it found (the reference's text), so a model took an idle
    or unknown agent for one it had stopped; the text now says nothing was stopped, and ``interrupted`` false."""
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("interrupt_agent", {"agent_id": "01NOSUCHAGENT0000000000000"})]), completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["interrupt requested for agent 01NOSUCHAGENT0000000000000: it had no turn running, so nothing was stopped"]
    [answer] = [data for kind, data in _tool_events(events) if kind == "tool/result"]
    assert answer["value"]["is_error"] is False


async def test_interrupt_agent_with_a_malformed_id_is_invalid_session_id_as_send_message_is(tmp_path, endpoint) -> None:
    """An id no session can have is the caller's mistake: ``interrupt_agent`` answered it as a well-formed
    id it found idle (``interrupt requested ...: nothing was stopped``), while ``send_message`` and the
    public ``Supervisor.interrupt`` said ``INVALID_SESSION_ID`` (found by a probe). A well-formed absent id
    is still the no-op above."""
    base_url, seen, answers = endpoint
    answers += [completion(calls=[("interrupt_agent", {"agent_id": "../x"}), ("send_message", {"subagent_id": "../x", "message": "hi"})]),
                completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["INVALID_SESSION_ID: invalid session id '../x'"] * 2
    assert [data["is_error"] for kind, data in _tool_events(events) if kind == "tool/result"] == [True, True]
