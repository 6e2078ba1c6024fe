"""``llm``: an agent loop over an OpenAI-compatible chat-completions endpoint (the official ``openai`` SDK).

Each step sends the conversation (rebuilt from this session's own log, so a
resumed continuable child keeps its transcript) with the model-facing tools
of ``worker/model_tools.py`` as function tools; tool calls are recorded in the
log and answered; a reply without tool calls ends the turn. ``finish_reason
== "length"`` ends it ``max-tokens``, ``"content_filter"`` ends it ``refusal``.

The client is ``openai.AsyncOpenAI`` with ``base_url`` (DeepSeek and any
compatible endpoint): it brings the timeout, retries with exponential backoff
on 429, 5xx, timeouts and dropped connections (``max_retries``, honouring
``Retry-After``), and typed errors. Every failure ends the turn with stop
reason ``error`` and a diagnostic that says what happened (rate limited,
server error, timeout, unreachable, key refused, request rejected), never
an exception out of the program.

The key is read from the environment variable named by ``api_key_env`` at
call time, stripped of surrounding whitespace (a CRLF ``.env`` file leaves a
trailing ``\r``), checked to be a value an HTTP header can carry, and sent
only in the ``Authorization`` header. Every diagnostic passes a ``Redactor``
(``worker/redaction.py``) before it is returned, so neither the key nor an
endpoint's echo of it is ever written to the store, a log or a result.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..context import TurnContext, TurnResult
from ..model_tools import DelegationConfig, ToolOutcome, model_tools, tool_arguments
from ..redaction import Redactor

__all__ = ["DELEGATION_TEXT", "REPORT_TEXT", "ApiKeyError", "LlmProgram", "llm", "load_api_key"]

log = logging.getLogger(__name__)

# An error body is quoted in a diagnostic up to this many characters (after redaction).
_BODY_CHARS = 300
# What an HTTP header value may hold: visible ASCII, no whitespace inside a key.
_KEY_SHAPE = re.compile(r"[\x21-\x7e]+")


class ApiKeyError(ValueError):
    """Raised when the API key variable holds a value no HTTP header can carry (the value is never quoted)."""


def load_api_key(variable: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The key in ``variable``, stripped; ``None`` when unset or blank; ``ApiKeyError`` when malformed.

    Stripping removes what editors and ``.env`` files leave around a key (``\r``, ``\n``, spaces);
    anything else outside visible ASCII would make an illegal header that HTTP libraries
    quote back in their exceptions — key included — so it is refused here instead.
    """
    raw = (os.environ if environ is None else environ).get(variable)
    if raw is None or not raw.strip():
        return None
    key = raw.strip()
    if not _KEY_SHAPE.fullmatch(key):
        raise ApiKeyError(f"the API key in ${variable} holds whitespace or characters an HTTP header cannot carry")
    return key

DELEGATION_TEXT = (
    "You are a delegated subagent: your permission scope was fixed when you were started and cannot be widened from "
    "inside this session — operations that require approval are rejected automatically. When the task needs access "
    "beyond that scope, do not retry the denied operation; state the limitation in your reply so the delegating agent "
    "can handle it."
)
REPORT_TEXT = (
    "Deliver your result with the report tool before you finish: reporting never ends your turn, so keep working "
    "after it while there is more to do."
)


def _transcript(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """User and assistant messages of earlier and current turns, in log order."""
    out: list[dict[str, Any]] = []
    for event in events:
        data = event.get("data") or {}
        if event["type"] == "message/accepted":
            content = data.get("content")
            out.append({"role": "user", "content": content if isinstance(content, str) else json.dumps(content)})
        elif event["type"] == "assistant/message" and data.get("text"):
            out.append({"role": "assistant", "content": data["text"]})
    return out


@dataclass
class LlmProgram:
    """A configured LLM agent program (a callable object, so dill carries it to workers)."""

    base_url: str = "https://api.deepseek.com"
    model: str = "deepseek-chat"
    api_key_env: str = "DEEPSEEK_API_KEY"
    timeout_s: float = 120.0
    max_retries: int = 3  # the SDK's retries on 429 / 5xx / timeouts, with exponential backoff
    max_steps: int = 32
    delegation: DelegationConfig = field(default_factory=DelegationConfig)
    report_delivery: str = "wakeup"

    @classmethod
    def from_environment(cls) -> "LlmProgram":
        """``SUBAGENTS_LLM_BASE_URL``, ``_MODEL``, ``_API_KEY_ENV``, ``_TIMEOUT_S``, ``_MAX_RETRIES`` (read at the program boundary)."""
        defaults = cls()
        env = os.environ
        return cls(
            base_url=env.get("SUBAGENTS_LLM_BASE_URL", defaults.base_url),
            model=env.get("SUBAGENTS_LLM_MODEL", defaults.model),
            api_key_env=env.get("SUBAGENTS_LLM_API_KEY_ENV", defaults.api_key_env),
            timeout_s=float(env.get("SUBAGENTS_LLM_TIMEOUT_S", defaults.timeout_s)),
            max_retries=int(env.get("SUBAGENTS_LLM_MAX_RETRIES", defaults.max_retries)),
        )

    def system_prompt(self, ctx: TurnContext) -> str:
        parts = []
        if ctx.persona:
            parts.append(ctx.persona)
        if ctx.depth > 0:
            parts.append(DELEGATION_TEXT)
        if ctx.spec.mode == "continuable":
            parts.append(REPORT_TEXT)
        return "\n\n".join(parts) or "You are a helpful agent."

    async def __call__(self, ctx: TurnContext) -> str | TurnResult:
        import openai

        try:
            key = load_api_key(self.api_key_env)
        except ApiKeyError as exc:
            return TurnResult(stop_reason="error", diagnostic=str(exc))
        redact = Redactor([key, os.environ.get(self.api_key_env)])
        tools = {t.name: t for t in model_tools(ctx, delegation=self.delegation, report_delivery=self.report_delivery)}  # type: ignore[arg-type]
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt(ctx)}]
        messages += _transcript(await ctx.history())
        model = ctx.spec.agent_model or self.model
        # a keyless local endpoint gets no Authorization header at all (the SDK wants a key object)
        client = openai.AsyncOpenAI(
            api_key=key or "unused", base_url=self.base_url.rstrip("/"), timeout=self.timeout_s, max_retries=self.max_retries,
        )
        extra = {} if key else {"extra_headers": {"Authorization": openai.omit}}
        try:
            for _ in range(self.max_steps):
                await ctx.step()
                try:
                    response = await client.chat.completions.create(
                        model=model, messages=messages, tools=[t.schema() for t in tools.values()], **extra,  # type: ignore[arg-type]
                    )
                except openai.OpenAIError as exc:
                    return TurnResult(stop_reason="error", diagnostic=redact(self._diagnostic(exc)))
                if not response.choices:
                    return TurnResult(stop_reason="error", diagnostic="the model endpoint answered with no choices")
                choice = response.choices[0]
                message = choice.message
                calls = message.tool_calls or []
                if not calls:
                    content = message.content or ""
                    if content:
                        await ctx.say(content)
                    if choice.finish_reason == "length":
                        return TurnResult(output=content, stop_reason="max-tokens", diagnostic="the model hit its token limit")
                    if choice.finish_reason == "content_filter":
                        return TurnResult(output=content, stop_reason="refusal", diagnostic="the endpoint's content filter stopped the reply")
                    return content
                messages.append({"role": "assistant", "content": message.content,
                                 "tool_calls": [c.model_dump(mode="json", exclude_none=True) for c in calls]})
                for call in calls:
                    function = getattr(call, "function", None)
                    name = getattr(function, "name", "") or ""
                    args = tool_arguments(getattr(function, "arguments", None))
                    tool = tools.get(name)
                    if tool is None:
                        outcome = ToolOutcome(f'unknown tool "{name}"', is_error=True)
                    else:
                        async def run(t: Any = tool, a: dict[str, Any] = args) -> dict[str, Any]:
                            done = await t.run(ctx, a)
                            return {"text": done.text, "is_error": done.is_error}

                        recorded = await ctx.recorded_call(name, args, run)
                        outcome = ToolOutcome(recorded["text"], recorded["is_error"])
                    messages.append({"role": "tool", "tool_call_id": call.id or "", "content": outcome.text})
        finally:
            await client.close()
        return TurnResult(stop_reason="error", diagnostic=f"the model made more than {self.max_steps} calls in one turn")

    def _diagnostic(self, exc: Exception) -> str:
        """What went wrong, in words an operator acts on (redacted by the caller before it is returned)."""
        import openai

        retried = f" (after {self.max_retries} retries)" if self.max_retries else ""
        if isinstance(exc, openai.APITimeoutError):
            return f"the model endpoint did not answer within timeout_s={self.timeout_s:g}{retried}"
        if isinstance(exc, openai.APIConnectionError):
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "connection error"
            return f"the model endpoint {self.base_url} is unreachable ({cause}){retried}"
        if isinstance(exc, openai.APIStatusError):
            body = _body_text(exc)
            status = exc.status_code
            if isinstance(exc, openai.RateLimitError):
                what = f"the model endpoint is rate limiting (HTTP 429){retried}"
            elif status >= 500:
                what = f"the model endpoint failed (HTTP {status}){retried}"
            elif isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
                what = f"the model endpoint refused the API key from ${self.api_key_env} (HTTP {status})"
            else:
                what = f"the model endpoint rejected the request (HTTP {status})"
            return f"{what}: {body}" if body else what
        log.warning("llm call failed", exc_info=exc)
        return f"the model call failed: {type(exc).__name__}"


def _body_text(exc: Any) -> str:
    """The endpoint's error message (not the whole body), bounded."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message") if isinstance(inner, dict) and isinstance(inner.get("message"), str) else json.dumps(body)
    elif isinstance(body, str):
        text = body
    else:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= _BODY_CHARS else text[:_BODY_CHARS] + "…"


async def llm(ctx: TurnContext) -> str | TurnResult:
    """The built-in ``llm`` program, configured from the environment."""
    return await LlmProgram.from_environment()(ctx)
