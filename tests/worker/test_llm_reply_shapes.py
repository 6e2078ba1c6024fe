"""The ``llm`` program against replies of a shape other endpoints send (127.0.0.1, a port the OS picks).

Found by a probe with a fake endpoint: a stream of server-sent events, sent though no stream was asked
for (a proxy that streams every reply), ended the turn "answered with something that is not a chat
completion (str)", which did not say the endpoint streamed (said to be JSON: "a body that is not JSON
(JSONDecodeError)"); a tool call whose arguments were encoded twice
(a JSON string holding the JSON object, as some providers send them) was answered "not a JSON object;
nothing was run" every time, so a model behind such a provider could use no tool at all.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from .test_llm_faults import completion, endpoint, program, run_once  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio


def events_stream(handler: BaseHTTPRequestHandler, content_type: str = "text/event-stream") -> None:
    """A chat completion as server-sent events (``stream: true``'s answer), by default with its own content type."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}]}
    body = f": keep-alive\n\ndata: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


async def test_a_stream_of_events_not_asked_for_is_named_as_such(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.append(events_stream)
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert "stream" not in seen[0]  # nothing asked for a stream
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint {base_url} answered with a stream of server-sent events, not the one "
                 "chat completion asked for: does a proxy before it stream every reply?"), result


async def test_a_stream_of_events_sent_as_json_is_named_as_such(tmp_path, endpoint) -> None:
    """The same stream said to be ``application/json``: the client's parse fails, on a body that is events."""
    base_url, seen, answers = endpoint
    answers.append(lambda handler: events_stream(handler, "application/json"))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.diagnostic) == (
        "error", f"the model endpoint {base_url} answered with a stream of server-sent events, not the one "
                 "chat completion asked for: does a proxy before it stream every reply?"), result


async def test_arguments_encoded_twice_are_taken_as_the_object_they_hold(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers[:] = [completion(calls=[("list_agents", json.dumps(json.dumps({"scope": "children"})))]), completion("done")]
    result, events, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    call = next(e["data"] for e in events if e["type"] == "tool/call")
    assert call["args"] == {"scope": "children"}
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert len(told) == 1 and "not a JSON object" not in told[0] and not told[0].startswith("error"), told


async def test_a_json_string_that_holds_no_object_is_still_refused(tmp_path, endpoint) -> None:
    """Only a string holding a JSON object is unwrapped: one holding a list or plain words is answered as before."""
    base_url, seen, answers = endpoint
    answers[:] = [completion(calls=[("list_agents", json.dumps("[1, 2]")), ("list_agents", json.dumps("children"))]), completion("done")]
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output) == ("completed", "done"), result
    told = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert told == ["the arguments of this list_agents call are not a JSON object; nothing was run"] * 2, told
