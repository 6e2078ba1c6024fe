"""``llm``: an agent loop over an OpenAI-compatible chat-completions endpoint.

Each step sends the conversation (rebuilt from this session's own log, so a
resumed continuable child keeps its transcript) with the model-facing tools
of ``worker/model_tools.py`` as function tools; tool calls are recorded in the
log and answered; a reply without tool calls ends the turn. ``finish_reason
== "length"`` ends it ``max-tokens``.

The endpoint is the DeepSeek API shape (``POST {base_url}/chat/completions``
with a bearer key). The key is read from the environment variable named by
``api_key_env`` at call time, sent only in the ``Authorization`` header, and
never written to the store, the logs or an error message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..context import TurnContext, TurnResult
from ..model_tools import DelegationConfig, ToolOutcome, model_tools, tool_arguments

__all__ = ["DELEGATION_TEXT", "REPORT_TEXT", "LlmProgram", "llm"]

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
    max_steps: int = 32
    delegation: DelegationConfig = field(default_factory=DelegationConfig)
    report_delivery: str = "wakeup"

    @classmethod
    def from_environment(cls) -> "LlmProgram":
        """``SUBAGENTS_LLM_BASE_URL``, ``SUBAGENTS_LLM_MODEL``, ``SUBAGENTS_LLM_API_KEY_ENV`` (read at the program boundary)."""
        defaults = cls()
        return cls(
            base_url=os.environ.get("SUBAGENTS_LLM_BASE_URL", defaults.base_url),
            model=os.environ.get("SUBAGENTS_LLM_MODEL", defaults.model),
            api_key_env=os.environ.get("SUBAGENTS_LLM_API_KEY_ENV", defaults.api_key_env),
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
        import httpx

        tools = {t.name: t for t in model_tools(ctx, delegation=self.delegation, report_delivery=self.report_delivery)}  # type: ignore[arg-type]
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt(ctx)}]
        messages += _transcript(await ctx.history())
        key = os.environ.get(self.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        model = ctx.spec.agent_model or self.model
        async with httpx.AsyncClient(base_url=self.base_url.rstrip("/"), timeout=self.timeout_s, headers=headers) as client:
            for _ in range(self.max_steps):
                await ctx.step()
                response = await client.post(
                    "/chat/completions",
                    json={"model": model, "messages": messages, "tools": [t.schema() for t in tools.values()]},
                )
                if response.status_code >= 400:
                    return TurnResult(stop_reason="error", diagnostic=f"the model endpoint answered HTTP {response.status_code}: {response.text[:500]}")
                choice = response.json()["choices"][0]
                message = choice.get("message") or {}
                calls = message.get("tool_calls") or []
                if not calls:
                    content = message.get("content") or ""
                    if content:
                        await ctx.say(content)
                    if choice.get("finish_reason") == "length":
                        return TurnResult(output=content, stop_reason="max-tokens", diagnostic="the model hit its token limit")
                    return content
                messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
                for call in calls:
                    name = call.get("function", {}).get("name", "")
                    args = tool_arguments(call.get("function", {}).get("arguments"))
                    tool = tools.get(name)
                    if tool is None:
                        outcome = ToolOutcome(f'unknown tool "{name}"', is_error=True)
                    else:
                        async def run(t: Any = tool, a: dict[str, Any] = args) -> dict[str, Any]:
                            done = await t.run(ctx, a)
                            return {"text": done.text, "is_error": done.is_error}

                        recorded = await ctx.recorded_call(name, args, run)
                        outcome = ToolOutcome(recorded["text"], recorded["is_error"])
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": outcome.text})
        return TurnResult(stop_reason="error", diagnostic=f"the model made more than {self.max_steps} calls in one turn")


async def llm(ctx: TurnContext) -> str | TurnResult:
    """The built-in ``llm`` program, configured from the environment."""
    return await LlmProgram.from_environment()(ctx)
