"""An exhausted quota is not retried like a rate limit (127.0.0.1, a port the OS picks).

Found by a probe against a fake endpoint: a 429 whose error says the account's quota is used up
(OpenAI's ``insufficient_quota``) was retried with backoff, ``max_retries`` times, as a passing rate limit
is; no wait helps it, each try may cost a request, and the turn ended saying "rate limiting", which sends
an operator to the wrong fix. It now ends at once, saying the quota is used up.
"""

from __future__ import annotations

import pytest

from .test_llm_faults import completion, endpoint, program, run_once  # noqa: F401 (endpoint: a fixture)

pytestmark = pytest.mark.anyio

QUOTA = (b'{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", '
         b'"type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}')


async def test_an_exhausted_quota_ends_the_turn_at_once(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.extend([(429, {"Content-Type": "application/json"}, QUOTA)] * 4)
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=3))
    assert (result.stop_reason, result.diagnostic) == (
        "error", "the model endpoint says the account's quota is used up (HTTP 429, insufficient_quota): "
                 "You exceeded your current quota, please check your plan and billing details."), result
    assert len(seen) == 1, f"{len(seen)} requests: an exhausted quota was retried"


async def test_a_rate_limit_is_still_retried(tmp_path, endpoint) -> None:
    base_url, seen, answers = endpoint
    answers.append((429, {"Content-Type": "application/json", "Retry-After": "0"}, b'{"error": {"message": "slow down", "code": "rate_limit_exceeded"}}'))
    answers.append(completion("done"))
    result, _, _ = await run_once(tmp_path, program(base_url, max_retries=3))
    assert result.stop_reason == "completed", result
    assert len(seen) == 2
