"""How the ``llm`` program ends a turn on replies and records a second probe found it mishandled (127.0.0.1, port 0).

Each test names what the probe saw: a finish reason the program did not know (DeepSeek's
``insufficient_system_resource``) reported ``completed`` with the cut text.
"""

from __future__ import annotations

import pytest

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
