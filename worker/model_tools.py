"""Model-facing tools: what an LLM program offers its model, with the reference's exact texts.

Each tool is a JSON-schema'd function (``ModelTool.schema()`` gives the
OpenAI ``tools`` entry) whose ``run`` takes the turn's ``TurnContext`` and the
model's arguments and returns a ``ToolOutcome``: the text the model reads and
whether it is an error. Inputs, renderings and error texts are the
reference's, word for word (docs/behaviour.md), so prompts written for it keep working:

* ``list_agents`` (scope children|descendants), ``send_message``,
  ``interrupt_agent``, ``report`` (only inside a continuable child), and the
  delegation tool (``subagent`` by default: description, prompt,
  run_in_background).

Statuses are this project's ``running`` / ``idle`` / ``complete``, true across
processes, instead of the reference's process-local ``ready`` / ``running`` / ``idle``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal

from subagents.store.errors import SubagentError

from .context import AGENT_SCOPES, RunResult, TurnContext
from .listing import render_rows

__all__ = ["ToolOutcome", "ModelTool", "DelegationConfig", "model_tools", "foreground_failure_text"]


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    is_error: bool = False
    value: Any = None


@dataclass(frozen=True)
class ModelTool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[TurnContext | None, dict[str, Any]], Awaitable[ToolOutcome]]

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class DelegationConfig:
    """The reference's ``tool-subagent`` options."""

    provider: str | None = None
    tool_name: str = "subagent"
    enable_run_in_background: bool = True
    background_mode: Literal["one-shot", "continuable"] = "one-shot"
    max_depth: int | None = 3
    # what a call that leaves out ``run_in_background`` does; None: the reference's rule (in the background
    # iff ``background_mode`` is continuable). This project's own option, for a program that offers
    # continuable background children to a model used to waiting on its calls (the ``llm`` program's)
    background_by_default: bool | None = None


def _no_agent(tool: str) -> ToolOutcome:
    return ToolOutcome(f"{tool} requires a calling agent (exec.agent was undefined)", is_error=True)


def _error(exc: SubagentError) -> ToolOutcome:
    return ToolOutcome(f"{exc.code}: {exc}", is_error=True)


async def _list_agents(ctx: TurnContext | None, args: dict[str, Any]) -> ToolOutcome:
    if ctx is None:
        return _no_agent("list_agents")
    scope = args.get("scope", "children")
    if scope not in AGENT_SCOPES:
        return ToolOutcome('scope must be "children" or "descendants"', is_error=True)
    try:
        rows = await ctx.list_agents(scope=scope)
    except SubagentError as exc:
        return _error(exc)
    kept = [r for r in rows if r.get("kind") == "diagnostic" or r.get("mode") != "one-shot"]
    return ToolOutcome(render_rows(kept, descendants=scope == "descendants"), value=kept)


async def _send_message(ctx: TurnContext | None, args: dict[str, Any]) -> ToolOutcome:
    if ctx is None:
        return _no_agent("send_message")
    subagent_id, message = args.get("subagent_id"), args.get("message")
    if not isinstance(subagent_id, str) or not isinstance(message, str):
        return ToolOutcome("send_message needs string subagent_id and message", is_error=True)
    try:
        message_id = await ctx.send_message(subagent_id, message)
    except SubagentError as exc:
        return _error(exc)
    return ToolOutcome(f"message queued as the next turn for subagent {subagent_id}", value={"messageId": message_id})


async def _interrupt_agent(ctx: TurnContext | None, args: dict[str, Any]) -> ToolOutcome:
    if ctx is None:
        return _no_agent("interrupt_agent")
    agent_id = args.get("agent_id")
    if not isinstance(agent_id, str):
        return ToolOutcome("interrupt_agent needs a string agent_id", is_error=True)
    try:
        stopped = await ctx.interrupt(agent_id)
    except SubagentError as exc:
        return _error(exc)
    # the reference answered the same text whatever it found: a model then took an idle or unknown
    # agent for one it had stopped, and waited for a turn that was never running
    found = "" if stopped else ": it had no turn running, so nothing was stopped"
    return ToolOutcome(f"interrupt requested for agent {agent_id}{found}", value={"accepted": True, "interrupted": stopped})


def _report_tool(delivery: Literal["quiet", "wakeup"]) -> Callable[[TurnContext | None, dict[str, Any]], Awaitable[ToolOutcome]]:
    async def run(ctx: TurnContext | None, args: dict[str, Any]) -> ToolOutcome:
        if ctx is None:
            return _no_agent("report")
        output = args.get("output")
        if not isinstance(output, str):
            return ToolOutcome("report needs a string output", is_error=True)
        try:
            message_id = await ctx.report(output, delivery=delivery)
        except SubagentError as exc:
            return _error(exc)
        return ToolOutcome(f"report accepted by the agent that started you as message {message_id}", value={"messageId": message_id})

    return run


_FAILURE_TEXT = {
    "aborted": "subagent run was cancelled",
    "error": "subagent run failed",
    "max-tokens": "subagent run hit its token limit before finishing",
    "refusal": "subagent declined the task",
}


def foreground_failure_text(result: RunResult) -> str:
    """The error a model reads when a foreground delegation did not complete."""
    text = _FAILURE_TEXT.get(result.stop_reason, f"subagent run ended abnormally ({result.stop_reason})")
    if result.diagnostic:
        text += f"\nDiagnostic: {result.diagnostic}"
    if result.output:
        text += f"\nPartial output before the run ended:\n{result.output}"
    return text


def _delegate_tool(config: DelegationConfig) -> ModelTool:
    properties: dict[str, Any] = {
        "description": {"type": "string", "description": "A short label for the task."},
        "prompt": {"type": "string", "description": "The complete task for the subagent."},
    }
    if config.enable_run_in_background:
        said = "Start it and return at once."
        if config.background_mode == "continuable":
            said += " You are told when it settles, and may message it meanwhile."
        properties["run_in_background"] = {"type": "boolean", "description": said}

    async def run(ctx: TurnContext | None, args: dict[str, Any]) -> ToolOutcome:
        if ctx is None:
            return _no_agent(config.tool_name)
        label, prompt = args.get("description"), args.get("prompt")
        if not isinstance(label, str) or not isinstance(prompt, str):
            return ToolOutcome(f"{config.tool_name} needs string description and prompt", is_error=True)
        background = args.get("run_in_background")
        if background is not None and not isinstance(background, bool):  # "false" (a stringified boolean) is truthy: it started one
            return ToolOutcome(f"{config.tool_name} needs a boolean run_in_background", is_error=True)
        if background and not config.enable_run_in_background:
            return ToolOutcome("run_in_background is disabled for this tool instance (enableRunInBackground: false)", is_error=True)
        if background is None:
            by_default = config.background_by_default
            background = config.background_mode == "continuable" if by_default is None else by_default
        try:
            if background and config.background_mode == "continuable":
                child_id, _ = await ctx.start_continuable(prompt, label=label, provider=config.provider, max_depth=config.max_depth)
                return ToolOutcome(f"started subagent {child_id}", value={"id": child_id})
            if background:
                run_id = await ctx.spawn(prompt, provider=config.provider, label=label, wait=False, max_depth=config.max_depth)
                return ToolOutcome(f"started background subagent job {run_id}", value={"jobId": run_id})
            result = await ctx.spawn(prompt, provider=config.provider, label=label, wait=True, max_depth=config.max_depth)
        except SubagentError as exc:
            return _error(exc)
        assert isinstance(result, RunResult)
        if result.stop_reason != "completed":
            return ToolOutcome(foreground_failure_text(result), is_error=True, value={"id": result.id})
        return ToolOutcome(result.output, value={"id": result.id})

    return ModelTool(
        config.tool_name,
        "Delegate a task to a subagent that works in its own process and context.",
        {"type": "object", "properties": properties, "required": ["description", "prompt"], "additionalProperties": False},
        run,
    )


def model_tools(
    ctx: TurnContext, *, delegation: DelegationConfig | None = None, report_delivery: Literal["quiet", "wakeup"] = "wakeup"
) -> list[ModelTool]:
    """The tools offered to the model in this turn (``report`` only for continuable children)."""
    tools = [
        ModelTool(
            "list_agents",
            "List the subagents you started (scope=children) or all below you (scope=descendants). "
            "send_message works only on depth-1 entries; deeper ones accept only interrupt_agent.",
            {"type": "object", "properties": {"scope": {"type": "string", "enum": ["children", "descendants"]}}, "additionalProperties": False},
            _list_agents,
        ),
        ModelTool(
            "send_message",
            "Queue a message as the next turn of one of your continuable subagents.",
            {
                "type": "object",
                "properties": {"subagent_id": {"type": "string"}, "message": {"type": "string"}},
                "required": ["subagent_id", "message"],
                "additionalProperties": False,
            },
            _send_message,
        ),
        ModelTool(
            "interrupt_agent",
            "Stop the current turn of a subagent below you; its queued messages and its own subagents are kept.",
            {"type": "object", "properties": {"agent_id": {"type": "string"}}, "required": ["agent_id"], "additionalProperties": False},
            _interrupt_agent,
        ),
        _delegate_tool(delegation or DelegationConfig()),
    ]
    if ctx.spec.mode == "continuable":
        tools.append(
            ModelTool(
                "report",
                "Deliver your result to the agent that started you; reporting never ends your turn.",
                {"type": "object", "properties": {"output": {"type": "string"}}, "required": ["output"], "additionalProperties": False},
                _report_tool(report_delivery),
            )
        )
    return tools


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_arguments(text: str) -> Any:
    """A model's JSON text parsed, or ``None`` when it is none: NaN and Infinity are refused (no JSON, and
    ``subagents log --json`` printed them as they were), as is nesting too deep for the parser."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None


__all__ += ["parse_arguments"]
