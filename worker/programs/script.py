"""``script``: a program driven by a small action list, so tests and the demo need no model.

The turn's message is the script: a JSON string or a map ``{"script": [...]}``
(or the list itself), or TOML with one ``[[script]]`` table per action
(``[[script]]`` / ``say = "hi"``). Actions run in order; each is a one-key map:

    {"say": "text"}                 record an assistant message (the output, if last)
    {"step": n}                     count n steps (default 1)
    {"sleep": ms}                   wait, cancellable
    {"cpu": ms}                     burn CPU in a thread, checking cancellation every ~5 ms
    {"cpu_iters": n}                a fixed amount of CPU work (n loop iterations, the same on any
                                    machine or load), in a thread, checking cancellation
    {"hold": path}                  wait until the file at path exists (a test opens the gate), cancellable
    {"spin": ms}                    burn CPU ignoring cancellation (tests of the kill grace)
    {"spawn": {...}}                one-shot child: prompt, provider, label, wait (default true),
                                    max_steps, timeout_ms, output_schema, tool_filter, persona, sandbox
    {"wait": "all"}                 wait for every background child of this turn, in start order
    {"fail": "message"}             raise (the turn ends ``error``)
    {"tool": "name", "args": {...}} call a visible tool
    {"report": "text", "delivery": "quiet" | "wakeup"}
    {"send": {"to": id | "$last", "message": ...}}
    {"start_continuable": {"prompt": ..., "label": ..., "provider": ...}}
    {"list": "children" | "descendants"}   say the rendered listing
    {"interrupt": id | "$last"}
    {"return": "text"}              end the turn with this output
    {"structured": {...}}           end the turn with this structured output
    {"exit": code}                  kill the worker process (tests of crash handling)

A child's prompt given as a map or list is sent as JSON, so scripts nest. A
turn woken by a child's settlement notice or report runs no script: it ends
``completed`` with ``noted: `` and the notice's first line.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from typing import Any

import anyio

from ..context import RunResult, TurnContext, TurnResult
from ..listing import render_rows

__all__ = ["script", "parse_script", "iterations_per_ms"]


def parse_script(message: Any) -> list[dict[str, Any]]:
    """The action list of a message: JSON (a list or ``{"script": [...]}``) or TOML (``[[script]]`` tables)."""
    value = message
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            try:
                value = tomllib.loads(value)
            except tomllib.TOMLDecodeError:
                raise ValueError("a script is JSON or TOML") from None
    if isinstance(value, dict):
        value = value.get("script")
    if not isinstance(value, list) or not all(isinstance(a, dict) and len(a) >= 1 for a in value):
        raise ValueError("a script is a list of one-key action maps")
    return value


def _burn(ms: float, ctx: Any | None) -> int:
    deadline = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < deadline:
        for i in range(20000):
            x = (x * 31 + i) % 1000003
        if ctx is not None:
            ctx.check()
    return x


def _iterate(n: int, ctx: Any | None) -> int:
    x = 0
    for start in range(0, n, 20000):
        for i in range(start, min(n, start + 20000)):
            x = (x * 31 + i) % 1000003
        if ctx is not None:
            ctx.check()
    return x


def iterations_per_ms(sample_s: float = 0.1, rounds: int = 5) -> float:
    """How many ``cpu_iters`` iterations this process runs per millisecond on a free core: the best of
    ``rounds`` timings of about ``sample_s / rounds`` each (the best, as timings are: a slow round is one the
    core was taken from, or its clock still ramping). ``subagents demo`` sizes its children's work with
    it, so their speedup is that work's, not the clock's."""
    def timed(n: int) -> float:
        began = time.perf_counter()
        _iterate(n, None)
        return time.perf_counter() - began

    n = 20_000
    while timed(n) < sample_s / rounds:  # one round grown to its share of the sample
        n *= 2
    return max(n / (timed(n) * 1000.0) for _ in range(rounds))


# how often a ``hold`` looks for its file: a gate opened by a test is seen within this
HOLD_POLL_S = 0.005


async def _hold(path: str) -> None:
    while not os.path.exists(path):
        await anyio.sleep(HOLD_POLL_S)


def _prompt(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


# the waking messages a child sends its parent: prose, not a script (``TurnContext.message_source``)
NOTICE_KINDS = frozenset({"subagent-settled", "subagent-report"})


async def script(ctx: TurnContext) -> str | TurnResult:
    if ctx.message_source.get("kind") in NOTICE_KINDS:
        # a script that delegated is woken by its children's notices: it takes note, as a model
        # would read one, instead of failing to parse it (which ended every such parent ``error``)
        return "noted: " + ctx.text.splitlines()[0] if ctx.text else "noted"
    actions = parse_script(ctx.message)
    background: list[str] = []
    last_child: str | None = None
    results: list[RunResult] = []
    for action in actions:
        name = next(iter(action))
        arg = action[name]
        if name == "say":
            await ctx.say(str(arg))
        elif name == "step":
            for _ in range(int(arg or 1)):
                await ctx.step()
        elif name == "sleep":
            await anyio.sleep(float(arg) / 1000.0)
        elif name == "cpu":
            await anyio.to_thread.run_sync(_burn, float(arg), ctx)  # ``ctx.check`` is thread-safe
        elif name == "cpu_iters":
            await anyio.to_thread.run_sync(_iterate, int(arg), ctx)
        elif name == "hold":
            await _hold(str(arg))
        elif name == "spin":
            _burn(float(arg), None)
        elif name == "spawn":
            spec = dict(arg)
            wait = bool(spec.pop("wait", True))
            spec["prompt"] = _prompt(spec.get("prompt", ""))
            got = await ctx.spawn(spec.pop("prompt"), wait=wait, **spec)
            if isinstance(got, RunResult):
                results.append(got)
                last_child = got.id
                await ctx.say(got.output)
            else:
                background.append(got)
                last_child = got
        elif name == "wait":
            for run_id in background:
                results.append(await ctx.wait(run_id))
            background.clear()
            await ctx.say("\n".join(r.output for r in results))
        elif name == "fail":
            raise RuntimeError(str(arg))
        elif name == "tool":
            value = await ctx.call_tool(str(arg), **dict(action.get("args") or {}))
            await ctx.say(str(value))
        elif name == "report":
            await ctx.report(arg, delivery=action.get("delivery", "quiet"))
        elif name == "send":
            to = arg.get("to", "$last")
            await ctx.send_message(last_child if to == "$last" else to, _prompt(arg.get("message", "")))
        elif name == "start_continuable":
            spec = dict(arg)
            child_id, _ = await ctx.start_continuable(_prompt(spec.pop("prompt", "")), **spec)
            last_child = child_id
        elif name == "list":
            scope = arg or "children"
            await ctx.say(render_rows(await ctx.list_agents(scope=scope), descendants=scope == "descendants"))
        elif name == "interrupt":
            await ctx.interrupt(last_child if arg == "$last" else arg)
        elif name == "return":
            return str(arg)
        elif name == "structured":
            return TurnResult(output=json.dumps(arg), structured=arg)
        elif name == "exit":
            os._exit(int(arg))
        else:
            raise ValueError(f"unknown script action {name!r}")
    for run_id in background:
        results.append(await ctx.wait(run_id))
    return ctx.last_output
