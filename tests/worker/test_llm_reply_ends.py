"""How the ``llm`` program ends a turn on replies and records a second probe found it mishandled (127.0.0.1, port 0).

Each test names what the probe saw: a finish reason the program did not know (DeepSeek's
``insufficient_system_resource``) reported ``completed`` with the cut text; the answer of a call
whose turn was stopped read to the model as a Python dict repr; an empty reply ended ``completed``,
its output the remark the model made beside an earlier tool call; an empty or scheme-less
``SUBAGENTS_LLM_BASE_URL``, an empty or malformed ``SUBAGENTS_LLM_API_KEY_ENV`` and an empty
``SUBAGENTS_LLM_MODEL`` passed where the configuration loads, and failed every turn instead.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler

import anyio
import pytest

from subagents.store.events import TOOL_OUTCOME_UNKNOWN
from subagents.supervisor.config_loader import ConfigError, load_config
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig, UserAuthority
from subagents.worker.programs.llm import _transcript

from . import test_llm_faults
from .test_llm_faults import completion, program, run_once

endpoint = test_llm_faults.endpoint  # the fake endpoint fixture, shared (an assignment: no unused import)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("finish", ["insufficient_system_resource", "some_future_reason"])
async def test_an_unknown_finish_reason_ends_the_turn_error_keeping_its_partial_text(tmp_path, endpoint, finish) -> None:
    """Any finish reason but ``length`` and ``content_filter`` counted as a normal end: a reply DeepSeek's servers
    cut short (``insufficient_system_resource``) was ``completed``, and its caller took the cut text for an answer."""
    base_url, seen, answers = endpoint
    answers.append(completion("The three steps are: 1. coll", finish=finish))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output, result.diagnostic) == (
        "error", "The three steps are: 1. coll",
        f'the model ended its reply with finish_reason "{finish}", which is no normal end: its text may be cut short'), result


@pytest.mark.parametrize("finish", ["stop", None])
async def test_a_stop_or_absent_finish_reason_still_completes(tmp_path, endpoint, finish) -> None:
    base_url, seen, answers = endpoint
    answers.append(completion("fine", finish=finish))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output, result.diagnostic) == ("completed", "fine", None), result


def test_a_failed_call_whose_error_is_a_record_reads_as_a_sentence() -> None:
    """A call's ``error`` written as a record (``TOOL_OUTCOME_UNKNOWN``, by a stopped turn's end or crash repair)
    was rendered with ``str()``: the model read ``error: {'name': 'ToolOutcomeUnknownError', ...}``."""
    errors = [dict(TOOL_OUTCOME_UNKNOWN), {"code": "NOT_FOUND", "message": "no such agent"}, {"code": "NOT_FOUND"}, {"x": 1},
              "RuntimeError: boom"]
    events = [{"type": "message/accepted", "data": {"content": "go"}}, {"type": "step/start", "data": {}}]
    for n, error in enumerate(errors):
        events += [{"type": "tool/call", "data": {"call_id": f"c{n}", "name": "list_agents", "args": {}}},
                   {"type": "tool/result", "data": {"call_id": f"c{n}", "is_error": True, "error": error}}]
    assert [m["content"] for m in _transcript(events) if m["role"] == "tool"] == [
        "error: its outcome is unknown: the turn ended before it returned", "error: NOT_FOUND: no such agent",
        "error: NOT_FOUND", 'error: {"x": 1}', "error: RuntimeError: boom"]


async def test_the_call_an_interrupt_cut_off_is_answered_in_words_at_the_next_turn(tmp_path, endpoint) -> None:
    """Interrupted while its ``subagent`` call waited, a continuable child's next turn told its model the call's
    answer as ``error: {'name': 'ToolOutcomeUnknownError', 'code': 'TOOL_OUTCOME_UNKNOWN'}``."""
    base_url, seen, answers = endpoint
    asked, release = threading.Event(), threading.Event()

    def held(handler: BaseHTTPRequestHandler) -> None:  # the grandchild's request: answered only at the test's end
        asked.set()
        release.wait(30)
        handler.close_connection = True

    answers += [completion(calls=[("subagent", {"description": "g", "prompt": "GRAND"})]), held, completion("ok")]
    try:
        async with Supervisor.open(store=tmp_path / "st", config=SupervisorConfig(pool_size=2, durability="none")) as sup:
            sup.register_provider(Provider(name="llm", program=program(base_url, max_retries=0), capabilities=Capabilities.all(),
                                           continuable=True))
            root = await sup.open_root()
            child_id, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="llm", prompt="delegate", label="C"))
            assert await anyio.to_thread.run_sync(asked.wait, 30)
            await sup.interrupt(child_id, authority=UserAuthority(root.id), wait_s=5)
            with anyio.fail_after(30):
                await sup.wait_for_message(root)
            await sup.followup(root, child_id, "again")
            with anyio.fail_after(30):
                await sup.wait_for_message(root)
    finally:
        release.set()
    [again] = [request for request in seen if request["messages"][-1] == {"role": "user", "content": "again"}]
    assert [m["content"] for m in again["messages"] if m["role"] == "tool"] == [
        "error: its outcome is unknown: the turn ended before it returned"]


@pytest.mark.parametrize("content", [None, ""])
async def test_an_empty_reply_ends_the_turn_error_not_completed(tmp_path, endpoint, content) -> None:
    """A reply with neither text nor a tool call ended ``completed`` with no output: its caller, or a delegating
    model, took nothing for an answer."""
    base_url, seen, answers = endpoint
    answers.append(completion(content))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output, result.diagnostic) == (
        "error", "", "the model's reply held neither text nor a tool call"), result


async def test_an_empty_reply_after_a_tool_step_does_not_answer_with_the_earlier_remark(tmp_path, endpoint) -> None:
    """The turn's output fell back to the last text said, the remark beside an earlier tool call, which its
    caller then read as the answer."""
    base_url, seen, answers = endpoint
    answers += [completion("Let me look at my subagents first.", calls=[("list_agents", {})]), completion("")]
    result, events, _ = await run_once(tmp_path, program(base_url, max_retries=0))
    assert (result.stop_reason, result.output, result.diagnostic) == (
        "error", "", "the model's reply held neither text nor a tool call"), result
    assert [e["data"]["text"] for e in events if e["type"] == "assistant/message"] == ["Let me look at my subagents first."]


NOT_A_NAME = ("SUBAGENTS_LLM_API_KEY_ENV must be the name of an environment variable, "
              "not the value it holds, not quoted: it may be the key itself")


@pytest.mark.parametrize("name, value, message", [
    ("SUBAGENTS_LLM_BASE_URL", "", "SUBAGENTS_LLM_BASE_URL must be an http or https URL (not http or https), not ''"),
    ("SUBAGENTS_LLM_BASE_URL", "127.0.0.1:8080/v1",
     "SUBAGENTS_LLM_BASE_URL must be an http or https URL (not http or https), not '127.0.0.1:8080/v1'"),
    ("SUBAGENTS_LLM_BASE_URL", "http:///v1", "SUBAGENTS_LLM_BASE_URL must be an http or https URL (no host), not 'http:///v1'"),
    ("SUBAGENTS_LLM_BASE_URL", "ftp://user:Pr0xyPassw0rd@host/v1",
     "SUBAGENTS_LLM_BASE_URL must be an http or https URL (not http or https), not 'ftp://[redacted]@host/v1'"),
    ("SUBAGENTS_LLM_API_KEY_ENV", "", "SUBAGENTS_LLM_API_KEY_ENV must be the name of an environment variable, not ''"),
    ("SUBAGENTS_LLM_API_KEY_ENV", "sk-abc key", NOT_A_NAME),
    ("SUBAGENTS_LLM_API_KEY_ENV", "1KEY", NOT_A_NAME),
    ("SUBAGENTS_LLM_MODEL", "", "SUBAGENTS_LLM_MODEL must be a model name, not ''"),
    ("SUBAGENTS_LLM_MODEL", "  ", "SUBAGENTS_LLM_MODEL must be a model name, not '  '"),
])
def test_a_bad_endpoint_model_or_key_variable_setting_is_config_invalid_where_the_configuration_loads(name, value, message) -> None:
    """README: the ``SUBAGENTS_LLM_*`` settings are ``CONFIG_INVALID`` where the configuration loads. The numbers
    were; the endpoint, the model and the key's variable were not, and every turn failed on them instead."""
    with pytest.raises(ConfigError) as caught:
        load_config(env={name: value})
    assert (caught.value.code, caught.value.message) == ("CONFIG_INVALID", message)
    assert "Pr0xyPassw0rd" not in str(caught.value) and "abc key" not in str(caught.value)


def test_good_endpoint_model_and_key_variable_settings_load() -> None:
    load_config(env={"SUBAGENTS_LLM_BASE_URL": "https://api.deepseek.com", "SUBAGENTS_LLM_MODEL": "deepseek-chat",
                     "SUBAGENTS_LLM_API_KEY_ENV": "_MY_KEY_2"})
