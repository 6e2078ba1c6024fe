"""``llm``: an agent loop over an OpenAI-compatible chat-completions endpoint (the official ``openai`` SDK).

Each step sends the conversation (rebuilt from this session's own log, so a
resumed continuable child keeps its transcript) with the model-facing tools
of ``worker/model_tools.py`` as function tools; tool calls are recorded in the
log and answered; a reply without tool calls ends the turn. ``finish_reason
== "length"`` ends it ``max-tokens``, ``"content_filter"`` ends it ``refusal``,
and any other but ``stop`` and ``tool_calls`` (DeepSeek's ``insufficient_system_resource``)
ends it ``error``, its text kept as the output; so does a reply with neither text nor
tool calls (its output empty, never a remark made beside an earlier call).

The client is ``openai.AsyncOpenAI`` with ``base_url`` (DeepSeek and any
compatible endpoint), for its typed errors. The program makes the attempts
itself: each one whole within ``timeout_s`` (a reply that trickles bytes
forever is cut off there, which the client's read timeout alone never does),
retried with exponential backoff on 429 (not an exhausted quota), 5xx, timeouts and dropped
connections up to ``max_retries`` times, honouring ``Retry-After`` and
``x-should-retry`` (an endpoint asking for more than a minute's wait is not
waited for: the turn ends saying so). Every failure ends the turn with stop
reason ``error`` and a diagnostic that says what happened (rate limited,
server error, timeout, unreachable, key refused, request rejected, no chat
completions at the URL asked, a reply that is no chat completion, a stream of
events not asked for) and how many retries were made, never an exception out
of the program; an error page in HTML is quoted by its title, not its markup. Every body is read through a cap
(``reply_cap.py``): a reply past twice the store's record limit and a megabyte
ends the turn ``error`` as it passes it (not retried), and an error body is
read to its first 16 KiB, so no endpoint fills the worker's memory.

Text the model sends beside tool calls is recorded (``assistant/message``),
and the transcript rebuilt for a later turn keeps the tool calls and their
results, so a resumed child knows what it did (the ids of children it
started); a turn that ended before the model answered is said so there, as
the assistant's part, so the roles alternate as strict chat templates want.
A reply cut off at the token limit ends the turn ``max-tokens`` without
running the tool calls it holds (their arguments may be cut too);
arguments that are not a JSON object are answered as an error, never run as
``{}`` (a JSON string holding an object's text, as some providers encode them,
is that object). Every call is logged with its answer, the failed ones too (an unknown
tool, arguments that are no JSON object or hold a number the store cannot
hold, NaN among them, or a call larger than one store record, logged cut):
a later turn's rebuilt transcript is what the model saw. A reply whose text is
larger than one record ends the turn ``error`` saying so (the store's own
refusal named an event, not the model).
An ``output_schema`` is given to the model in the system prompt.

The key is read from the environment variable named by ``api_key_env`` at
call time, stripped of surrounding whitespace (a CRLF ``.env`` file leaves a
trailing ``\r``), checked to be a value an HTTP header can carry, and sent
only in the ``Authorization`` header. Every diagnostic passes a ``Redactor``
(``worker/redaction.py``) before it is returned, so neither the key nor an
endpoint's echo of it is ever written to the store, a log or a result;
every text the model sends back (its reply, a tool's name, each string in a
call's arguments, which become a child's prompt or a report) has the key
removed, and lone surrogates (a cut emoji, which no record can hold)
replaced with U+FFFD, before it is recorded or used. An unset key variable
sends no ``Authorization`` header, and a refusal then says so.

The module is over 500 lines because the endpoint's failures and the model's
malformed output are each named here, beside the loop that meets them.
"""

from __future__ import annotations

import email.utils
import html
import json
import logging
import math
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel

from subagents.store.errors import RecordTooLargeError
from subagents.store.events import TOOL_OUTCOME_UNKNOWN

from ..context import TurnContext, TurnResult
from ..model_tools import DelegationConfig, ModelTool, ToolOutcome, model_tools, parse_arguments
from ..redaction import Redactor
from .reply_cap import ACCEPT_ENCODING, ReplyTooLarge, capping_hook

__all__ = ["DELEGATION_TEXT", "REPORT_TEXT", "SCHEMA_TEXT", "MAX_RETRY_WAIT_S", "ApiKeyError", "LlmProgram", "llm", "load_api_key"]

log = logging.getLogger(__name__)

# An error body is quoted in a diagnostic up to this many characters (after redaction).
_BODY_CHARS = 300
# The longest wait a Retry-After gets inside a turn; an endpoint asking for more ends the turn saying so.
MAX_RETRY_WAIT_S = 60.0
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
SCHEMA_TEXT = "Your final reply must be one JSON document, and nothing else, valid against this JSON Schema: "


def _transcript(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation of earlier and current turns, in log order: user and assistant messages, and each
    step's tool calls as one assistant message (with the text the model sent beside them) followed by
    the calls' results in the order of the calls, as the chat-completions format wants them (the calls
    of one reply run at once, and each result is logged as its call ends)."""
    out: list[dict[str, Any]] = []
    open_step: dict[str, Any] | None = None  # the assistant message of the current step, which its calls join
    calls: list[str] = []  # the current step's calls, in the model's order
    answered: dict[str, dict[str, Any]] = {}  # their answers, as they were logged

    def close_step() -> None:
        # a log written before a stopped turn's end answered its waiting calls (TOOL_OUTCOME_UNKNOWN) has
        # none: endpoints refuse a conversation whose tool calls are not each followed by an answer
        out.extend(answered.pop(call_id, None) or {"role": "tool", "tool_call_id": call_id, "content": _UNANSWERED}
                   for call_id in calls)
        calls.clear()
        answered.clear()

    for event in events:
        kind, data = event["type"], event.get("data") or {}
        if kind == "message/accepted":
            close_step()
            content = data.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            if out and out[-1]["role"] == "user":
                # taken together with no reply between (quiet reports and notices, then the message that woke the
                # agent): one user message, for strict chat templates refuse two in a row
                out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{text}"}
            else:
                out.append({"role": "user", "content": text})
            open_step = None
        elif kind == "step/start":
            close_step()
            open_step = None
        elif kind == "assistant/message" and data.get("text"):
            close_step()
            open_step = {"role": "assistant", "content": data["text"]}
            out.append(open_step)
        elif kind == "tool/call" and isinstance(data, dict):
            if open_step is None:
                open_step = {"role": "assistant", "content": None}
                out.append(open_step)
            args = data.get("args")
            # a call whose arguments were unusable is logged with their text, as the model sent it
            arguments = args if isinstance(args, str) else json.dumps(args if isinstance(args, dict) else {})
            open_step.setdefault("tool_calls", []).append(
                {"id": str(data.get("call_id")), "type": "function", "function": {"name": str(data.get("name")), "arguments": arguments}})
            calls.append(str(data.get("call_id")))
        elif kind == "tool/result" and isinstance(data, dict):
            call_id = str(data.get("call_id"))
            answer = {"role": "tool", "tool_call_id": call_id, "content": _result_text(data)}
            if call_id in calls:
                answered[call_id] = answer
            else:
                out.append(answer)
        elif kind == "turn/end" and out and out[-1]["role"] == "user":
            # a turn that ended before the model answered (the endpoint failed, an interrupt): said so, for the next
            # turn's message would follow the prompt directly, which endpoints whose roles must alternate refuse for good
            out.append({"role": "assistant", "content": _no_reply(data)})
    close_step()
    return out


def _no_reply(end: dict[str, Any]) -> str:
    """What the transcript says in place of the reply a turn ended without (its stop reason and diagnostic)."""
    why = end.get("diagnostic")
    return f"(no reply: that turn ended {end.get('stop_reason')}{f': {why}' if isinstance(why, str) and why else ''})"


# the finish reasons of a reply that ended as the model meant it to (``None``: an endpoint that sends none);
# ``length``, ``content_filter`` and ``refusal`` have their own stop reasons, and any other is an error
_NORMAL_ENDS = frozenset({"stop", "tool_calls", "function_call", None})

_UNANSWERED = "error: its outcome is unknown: the turn ended before it returned"


async def _run_calls(ctx: TurnContext, calls: list[dict[str, Any]], tools: dict[str, ModelTool], clean: Callable[[str], str]) -> list[str]:
    """Run the tool calls of one reply at once; what each answered, in the model's order.

    A model fans out by asking for several calls in one reply (two ``subagent`` calls: two children in
    their own workers), and run one after the other they took as long as they added up. Each call is
    logged as it starts and its result as it ends (the transcript pairs them by id). A call that fails
    outside its tool (the turn told to stop, a store failure) lets the others end, then its error ends
    the turn, as it did when it came first; the first such failure, in the model's order, is raised.
    """
    answers: list[str] = [""] * len(calls)
    failures: list[tuple[int, Exception]] = []

    async def one(index: int, name: str, args: Any, text: str, tool: ModelTool | None, wrong: str | None) -> None:
        # every call is logged with its answer, a refused one too: the transcript of a later turn is rebuilt from the log
        def answer(wrong: str | None) -> Callable[[], Awaitable[dict[str, Any]]]:
            async def run() -> dict[str, Any]:
                done = ToolOutcome(wrong, is_error=True) if wrong is not None or tool is None else await tool.run(ctx, args)
                return {"text": done.text, "is_error": done.is_error}
            return run

        try:
            try:
                recorded = await ctx.recorded_call(name, args, answer(wrong), failed=_failure)
            except RecordTooLargeError as exc:
                if exc.code != RecordTooLargeError.code or exc.fields.get("event") != "tool/call":  # the record refused
                    raise  # the call was logged: what the tool did is no model output to answer
                # nothing was logged nor run: the call is logged cut, and answered, so the model can send less
                size = len(name.encode()) + len(text.encode())
                too_large = (f"this call of {size} bytes is more than the store holds in one record "
                             f"({exc.fields.get('limit')} bytes); nothing was run")
                recorded = await ctx.recorded_call(_cut(name, _CUT_NAME), _cut(text, _CUT_ARGUMENTS), answer(too_large), failed=_failure)
        except Exception as exc:  # noqa: BLE001 (raised once the others ended: below)
            failures.append((index, exc))
            return
        answers[index] = recorded["text"]

    async with anyio.create_task_group() as tg:
        for index, call in enumerate(calls):
            name = clean(call["function"]["name"])
            raw = call["function"]["arguments"]
            args, wrong = _call_arguments(raw, name, clean)
            tool = tools.get(name)
            if tool is None:
                wrong = f'unknown tool "{name}"'
            tg.start_soon(one, index, name, args, clean(raw) if isinstance(raw, str) else "", tool, wrong)
    if failures:
        raise min(failures, key=lambda failure: failure[0])[1]
    return answers


# how much of a call too large for one record is logged: its name and the start of its arguments, so the
# transcript of a later turn shows the model which call was refused
_CUT_NAME = 64
_CUT_ARGUMENTS = 200


def _cut(text: str, keep: int) -> str:
    """``text`` if it is at most ``keep`` characters, else its start saying how long it was."""
    return text if len(text) <= keep else f"{text[:keep]}… [cut: {len(text)} characters]"


def _result_text(data: dict[str, Any]) -> str:
    """What the model was told a call returned (the recorded ``{"text": ...}``), or the error it met."""
    value = data.get("value")
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return value["text"]
    if data.get("is_error"):
        return _error_text(data.get("error"))
    return json.dumps(value)


def _error_text(error: Any) -> str:
    """A call's logged ``error`` as a sentence: a record (``TOOL_OUTCOME_UNKNOWN``, written by a stopped turn's
    end and by crash repair) was rendered with ``str()``, and the model read a Python dict."""
    if isinstance(error, str) and error:
        return f"error: {error}"
    if isinstance(error, dict):
        if error.get("code") == TOOL_OUTCOME_UNKNOWN["code"]:
            return _UNANSWERED
        said = ": ".join(part for part in (error.get("code"), error.get("message")) if isinstance(part, str) and part)
        return f"error: {said or json.dumps(error, default=str)}"
    return "error: the call failed"



def _delegation_for(ctx: TurnContext) -> DelegationConfig:
    """The delegation tool's options for a turn of a program that configured none.

    A background call needs something that brings its result back to the model. A one-shot job
    has nothing here: no model tool lists, stops, messages or waits for one (the reference needs a
    jobs tool for that), so its result was thrown away. A continuable child has all of it: in a
    continuable turn a background call starts one (``list_agents``, ``send_message`` and
    ``interrupt_agent`` reach it, and its settlement notice wakes the model's next turn), while a
    call that says nothing still waits for its answer, as the program's calls always did; a
    one-shot turn offers no ``run_in_background``, and the calls of one reply run at once instead.
    """
    if ctx.spec.mode == "continuable":
        return DelegationConfig(background_mode="continuable", background_by_default=False)
    return DelegationConfig(enable_run_in_background=False)


# every variable ``from_environment`` reads: the supervisor's configuration refuses any other SUBAGENTS_LLM_* name (a typo)
ENVIRONMENT = ("SUBAGENTS_LLM_BASE_URL", "SUBAGENTS_LLM_MODEL", "SUBAGENTS_LLM_API_KEY_ENV", "SUBAGENTS_LLM_TIMEOUT_S",
               "SUBAGENTS_LLM_MAX_RETRIES", "SUBAGENTS_LLM_MAX_STEPS")


@dataclass
class LlmProgram:
    """A configured LLM agent program (a callable object, so dill carries it to workers)."""

    base_url: str = "https://api.deepseek.com"
    model: str = "deepseek-chat"
    api_key_env: str = "DEEPSEEK_API_KEY"
    timeout_s: float = 120.0
    max_retries: int = 3  # the SDK's retries on 429 / 5xx / timeouts, with exponential backoff
    max_steps: int = 32  # the turn's step budget when its caller sets none (``TurnContext.limit_steps``)
    # the delegation tool's options; None: chosen per turn (``_delegation_for``)
    delegation: DelegationConfig | None = None
    report_delivery: str = "wakeup"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "LlmProgram":
        """``SUBAGENTS_LLM_BASE_URL``, ``_MODEL``, ``_API_KEY_ENV``, ``_TIMEOUT_S``, ``_MAX_RETRIES``, ``_MAX_STEPS`` (read at the
        program boundary). A bad value is ``ValueError`` naming its variable and what it must be."""
        defaults = cls()
        env = os.environ if environ is None else environ
        return cls(
            base_url=_text_setting(env, "SUBAGENTS_LLM_BASE_URL", defaults.base_url, _url_problem, "an http or https URL"),
            model=_text_setting(env, "SUBAGENTS_LLM_MODEL", defaults.model, lambda v: None if v.strip() else "", "a model name"),
            api_key_env=_text_setting(env, "SUBAGENTS_LLM_API_KEY_ENV", defaults.api_key_env,
                                      lambda v: None if _VARIABLE_NAME.fullmatch(v) else "", "the name of an environment variable",
                                      secret=True),
            timeout_s=_setting(env, "SUBAGENTS_LLM_TIMEOUT_S", defaults.timeout_s, float,
                               lambda v: math.isfinite(v) and v > 0, "a finite number of seconds above 0"),
            max_retries=_setting(env, "SUBAGENTS_LLM_MAX_RETRIES", defaults.max_retries, int,
                                 lambda v: 0 <= v <= 100, "a whole number from 0 to 100"),
            max_steps=_setting(env, "SUBAGENTS_LLM_MAX_STEPS", defaults.max_steps, int,
                               lambda v: 1 <= v <= 100_000, "a whole number from 1 to 100000"),
        )

    def system_prompt(self, ctx: TurnContext) -> str:
        parts = []
        if ctx.persona:
            parts.append(ctx.persona)
        if ctx.depth > 0:
            parts.append(DELEGATION_TEXT)
        if ctx.spec.mode == "continuable":
            parts.append(REPORT_TEXT)
        if ctx.spec.output_schema is not None:  # the turn's result is checked against it: the model must know it
            parts.append(SCHEMA_TEXT + json.dumps(ctx.spec.output_schema))
        return "\n\n".join(parts) or "You are a helpful agent."

    async def __call__(self, ctx: TurnContext) -> str | TurnResult:
        import openai

        try:
            key = load_api_key(self.api_key_env)
        except ApiKeyError as exc:
            return TurnResult(stop_reason="error", diagnostic=str(exc))
        redact = Redactor([key, os.environ.get(self.api_key_env)])
        wrong = _url_problem(self.base_url)
        if wrong is not None:
            return TurnResult(stop_reason="error", diagnostic=redact(
                f"base_url (SUBAGENTS_LLM_BASE_URL) is not a valid http or https URL ({wrong}): {self.base_url}"))

        def clean(text: str) -> str:
            return _storable(redact.known(text))

        delegation = self.delegation or _delegation_for(ctx)
        tools = {t.name: t for t in model_tools(ctx, delegation=delegation, report_delivery=self.report_delivery)}  # type: ignore[arg-type]
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt(ctx)}]
        messages += _transcript(await ctx.history())
        model = ctx.spec.agent_model or self.model
        # a keyless local endpoint gets no Authorization header at all (the SDK wants a key object)
        # the program makes the attempts (``_create``): the client neither retries nor bounds a whole reply
        # every body is read through a cap (``reply_cap.py``): a reply of gigabytes never fills the worker's memory
        http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [capping_hook(ctx.record_limit)]},
                                              headers={"Accept-Encoding": ACCEPT_ENCODING})
        client = openai.AsyncOpenAI(api_key=key or "unused", base_url=self.base_url.rstrip("/"), timeout=self.timeout_s, max_retries=0,
                                    http_client=http)
        extra = {} if key else {"extra_headers": {"Authorization": openai.omit}}
        # the turn's step budget when its caller set none: a model calling tools forever ends budget-exhausted
        ctx.limit_steps(self.max_steps)
        try:
            while True:
                await ctx.step()
                request = {"model": model, "messages": messages, "tools": [t.schema() for t in tools.values()], **extra}
                response = await self._create(client, request, keyless=key is None)
                if isinstance(response, _Failure):
                    return TurnResult(stop_reason="error", diagnostic=redact(response.diagnostic))
                reply = _reply_of(response)
                if isinstance(reply, str):
                    return TurnResult(stop_reason="error", diagnostic=redact(f"the model endpoint {self.base_url} {reply}"))
                content, calls, finish = reply
                content = clean(content)  # an echo of the request (a proxy's) must not carry the key into the log
                if content:
                    try:
                        await ctx.say(content)  # beside tool calls too: what the model said is in the log
                    except RecordTooLargeError as exc:  # the store's message named an event, not the model's reply
                        return TurnResult(output="", stop_reason="error", diagnostic=redact(
                            f"the model endpoint {self.base_url} answered with a reply of {len(content.encode())} bytes of text, "
                            f"more than the store holds in one record ({exc.fields.get('limit')} bytes): it was not kept"))
                if finish == "length":  # cut off: tool calls it holds may be cut too, and are not run
                    return TurnResult(output=content, stop_reason="max-tokens", diagnostic="the model hit its token limit")
                if finish == "refusal":
                    return TurnResult(output=content, stop_reason="refusal", diagnostic="the model declined the request")
                if finish == "content_filter":
                    return TurnResult(output=content, stop_reason="refusal", diagnostic="the endpoint's content filter stopped the reply")
                if finish not in _NORMAL_ENDS:  # DeepSeek's insufficient_system_resource: a cut reply, whose calls are not run
                    return TurnResult(output=content, stop_reason="error", diagnostic=redact(
                        f'the model ended its reply with finish_reason "{_clip(str(finish))}", which is no normal end: its text may be cut short'))
                if not calls and not content:  # no answer: "" would end completed, its output an earlier remark
                    return TurnResult(output="", stop_reason="error", diagnostic="the model's reply held neither text nor a tool call")
                if not calls:
                    return content
                messages.append({"role": "assistant", "content": content or None, "tool_calls": calls})
                answers = await _run_calls(ctx, calls, tools, clean)
                messages += [{"role": "tool", "tool_call_id": call["id"], "content": text} for call, text in zip(calls, answers)]
        finally:
            await _close(client)

    async def _create(self, client: Any, request: dict[str, Any], *, keyless: bool = False) -> Any:
        """One chat completion (whatever the client made of the body), each attempt whole within ``timeout_s``,
        retried as the module says; ``_Failure`` with what went wrong (to be redacted) when no attempt answered.
        ``keyless``: no key was sent, which a refusal must say rather than blame a key."""
        import openai

        attempt = 0
        while True:
            try:
                with anyio.fail_after(self.timeout_s):
                    return await client.chat.completions.create(**request)
            except (openai.OpenAIError, TimeoutError, ValueError) as exc:  # ValueError: a body that is not JSON
                wait = _retry_wait(exc, attempt)
                if wait is None or attempt >= self.max_retries:
                    return _Failure(self._diagnostic(exc, attempt, keyless=keyless))
            except Exception as exc:  # noqa: BLE001 (a body nested too deep, whatever else the HTTP layer raises: never out of the program)
                return _Failure(self._diagnostic(exc, attempt, keyless=keyless))
            attempt += 1
            await anyio.sleep(wait)

    def _diagnostic(self, exc: Exception, retries: int = 0, *, keyless: bool = False) -> str:
        """What went wrong, in words an operator acts on (redacted by the caller before it is returned), with
        the ``retries`` made before it (the count, not the setting)."""
        import openai

        retried = f" (after {retries} retries)" if retries else ""
        asked = _asked_wait(exc)
        if asked is not None and asked > MAX_RETRY_WAIT_S:
            retried += f" (it asked to be retried in {asked:g} s, more than a turn waits)"
        if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
            return f"the model endpoint did not answer within timeout_s={self.timeout_s:g}{retried}"
        if isinstance(exc, openai.APIConnectionError):
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "connection error"
            if "DecodingError" in {cls.__name__ for cls in type(exc.__cause__).__mro__}:  # reached: its body was no gzip it said
                return f"the model endpoint {self.base_url} answered with a body it could not decode ({cause}){retried}"
            if _broke_off(exc.__cause__):
                return f"the model endpoint {self.base_url} broke off its reply ({cause}){retried}"
            return f"the model endpoint {self.base_url} is unreachable ({cause}){retried}"
        if isinstance(exc, openai.APIStatusError):
            body = _body_text(exc)
            status = exc.status_code
            if _quota_exhausted(exc):
                what = f"the model endpoint says the account's quota is used up (HTTP {status}, insufficient_quota){retried}"
            elif isinstance(exc, openai.RateLimitError):
                what = f"the model endpoint is rate limiting (HTTP 429){retried}"
            elif status >= 500:
                what = f"the model endpoint failed (HTTP {status}){retried}"
            elif isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)) and keyless:
                unset = "is not set" if os.environ.get(self.api_key_env) is None else "is blank"
                what = f"the model endpoint refused the request (HTTP {status}): ${self.api_key_env} {unset}, so no API key was sent"
            elif isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
                what = f"the model endpoint refused the API key from ${self.api_key_env} (HTTP {status})"
            elif status == 404 and not isinstance(exc.body, dict):  # no API's own error: nothing answers at that URL
                what = (f"the model endpoint has no {self.base_url.rstrip('/')}/chat/completions "
                        f"(HTTP 404; is base_url, SUBAGENTS_LLM_BASE_URL, right?)")
            else:
                what = f"the model endpoint rejected the request (HTTP {status})"
            return f"{what}: {body}" if body else what
        if isinstance(exc, json.JSONDecodeError) and isinstance(exc.doc, str) and _EVENTS.match(exc.doc):  # said to be JSON: events
            return f"the model endpoint {self.base_url} {_STREAMED}{retried}"
        if isinstance(exc, ValueError):
            return f"the model endpoint {self.base_url} answered with a body that is not JSON ({type(exc).__name__}){retried}"
        if isinstance(exc, ReplyTooLarge):
            return (f"the model endpoint {self.base_url} answered with a reply of more than {exc.limit} bytes, more than a turn keeps "
                    f"(the store holds {exc.record_limit} bytes in one record): it was not read further{retried}")
        if isinstance(exc, RecursionError):
            return f"the model endpoint {self.base_url} answered with a body nested too deep to read{retried}"
        log.warning("llm call failed", exc_info=exc)
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # a task group's wrapping says nothing
            exc = exc.exceptions[0]
        return f"the model call failed: {type(exc).__name__}"


def _failure(value: dict[str, Any]) -> str | None:
    """Why a tool's answer is a failure (its text), logged as the result's ``error``; ``None``: it is not one."""
    return str(value["text"]) if value.get("is_error") else None


async def _close(client: Any) -> None:
    """Close the client, then let the loop run once: a body it failed to decode (a false ``Content-Encoding``)
    leaves an async generator whose closing the loop schedules as a task, which the turn's end otherwise
    cancelled as a task the program left running."""
    await client.close()
    await anyio.lowlevel.checkpoint()


# a transport failure in reaching the endpoint (refused, no route, no name, a proxy in the way), by class name:
# the client's HTTP layer is ``httpx`` in some releases and ``httpx2`` in others, with the same names
_REACHING = frozenset({"ConnectError", "ConnectTimeout", "ProxyError", "UnsupportedProtocol"})


def _broke_off(cause: BaseException | None) -> bool:
    """Whether a connection failure came after the endpoint was reached (it closed or broke the connection
    before its reply was whole), not from reaching it."""
    names = {cls.__name__ for cls in type(cause).__mro__} if cause is not None else set()
    return "TransportError" in names and not names & _REACHING


@dataclass(frozen=True)
class _Failure:
    """No attempt answered: what to tell (a client may hand back any body as a plain ``str``, so not one)."""

    diagnostic: str


def _setting(env: Mapping[str, str], name: str, default: Any, kind: type, valid: Any, what: str) -> Any:
    """A numeric setting from the environment: its default when unset, else a valid value or ``ValueError``."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ValueError(f"{name} must be {what}, not {raw!r}")
    return value


def _text_setting(env: Mapping[str, str], name: str, default: str, problem: Callable[[str], str | None], what: str,
                  *, secret: bool = False) -> str:
    """A text setting from the environment: its default when unset, else the value or ``ValueError`` (with what
    ``problem`` says, when it says something): an empty URL, model or key variable failed every turn instead
    of where the configuration loads. A URL's user and password are not quoted, nor is a ``secret`` value (the
    key put where its variable's name belongs)."""
    raw = env.get(name)
    if raw is None:
        return default
    wrong = problem(raw)
    if wrong is None:
        return raw
    said = f" ({wrong})" if wrong else ""
    shown = "the value it holds, not quoted: it may be the key itself" if secret and raw else repr(Redactor()(raw))
    raise ValueError(f"{name} must be {what}{said}, not {shown}")


# what a POSIX shell takes as a variable's name: anything else can never hold the key
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _url_problem(url: str) -> str | None:
    """What makes ``url`` no endpoint to connect to, or ``None``: the HTTP layer's own complaint came out of
    the program raw (``InvalidURL``, an ``OverflowError`` for a port past 65535 inside an ``ExceptionGroup``)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (it checks the port: ValueError when out of range or no number)
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "not http or https"
    if not parts.hostname:
        return "no host"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _storable(text: str) -> str:
    """``text`` with each lone surrogate (a cut emoji, ``"\\ud83d"`` in a JSON body) replaced by U+FFFD:
    no record can hold one, and the turn ended ``INVALID_RECORD`` on it."""
    return _SURROGATE.sub("\ufffd", text)


# the integers a record holds (msgpack: signed or unsigned 64 bits)
_INT_RANGE = range(-(2 ** 63), 2 ** 64)
# the deepest nesting of arguments taken: walking them (each string redacted) recurses, and JSON nested near
# the interpreter's recursion limit would end the turn with a RecursionError; no tool takes more than a few levels
_MAX_NESTING = 100


class _Unstorable(ValueError):
    """Arguments no record holds: what is wrong with them, as the model reads it."""


def _call_arguments(raw: Any, name: str, clean: Callable[[str], str]) -> tuple[dict[str, Any] | str, str | None]:
    """``(arguments, None)``: the call's JSON object with every string (keys too) passed through ``clean``;
    or ``(their text, cleaned; what is wrong)`` when they are no JSON object (an absent or empty string counts
    as ``{}``; a JSON string holding one's text counts as that object) or hold a number no record holds: the
    call is then logged with its text and answered, never run."""
    text = raw if isinstance(raw, str) else ""
    value = parse_arguments(text or "{}")
    if isinstance(value, str) and isinstance(inner := parse_arguments(value), dict):
        value = inner  # encoded twice, a JSON string of the object (some providers send them so): the object is meant
    if not isinstance(value, dict):
        return clean(text), f"the arguments of this {name} call are not a JSON object; nothing was run"
    try:
        return _cleaned(value, clean), None
    except _Unstorable as exc:
        return clean(text), f"the arguments of this {name} call {exc}; nothing was run"


def _cleaned(value: Any, clean: Callable[[str], str], depth: int = 0) -> Any:
    """A parsed JSON value with every string passed through ``clean``; ``_Unstorable`` for what no record holds."""
    if depth > _MAX_NESTING:
        raise _Unstorable(f"are nested deeper than {_MAX_NESTING}")
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k): _cleaned(v, clean, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v, clean, depth + 1) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and value not in _INT_RANGE or isinstance(value, float) and not math.isfinite(value):
        raise _Unstorable("hold a number out of range")
    return value


# a body of server-sent events (a streamed reply): its first line a comment (``: keep-alive``) or a field
_EVENTS = re.compile(r"\s*(:|(data|event|id|retry):)")
_STREAMED = "answered with a stream of server-sent events, not the one chat completion asked for: does a proxy before it stream every reply?"


def _reply_of(response: Any) -> tuple[str, list[dict[str, Any]], str | None] | str:
    """``(text, tool calls as plain data, finish reason)`` of a chat completion's first choice (a stated refusal:
    its words, and the finish reason ``refusal``), or what is
    wrong with the reply (a body that is HTML, a choice without a message, an error object sent with 200)."""
    if isinstance(response, str) and _EVENTS.match(response):  # the client hands back a body it takes for no JSON as text
        return _STREAMED
    if not hasattr(response, "choices"):
        return f"answered with something that is not a chat completion ({type(response).__name__})"
    choices = response.choices
    if choices is not None and not isinstance(choices, list):
        return "answered with choices that are not a list"
    if not choices:
        extra = getattr(response, "model_extra", None) or {}
        error = extra.get("error") if isinstance(extra, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        return f"answered with no choices: {_clip(str(message))}" if message else "answered with no choices"
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        return "answered with a choice that has no message"
    if isinstance(message, (str, bytes, list, tuple, int, float)):  # the client keeps what it cannot type as it came
        return "answered with a choice whose message is not an object"
    raw_calls = getattr(message, "tool_calls", None) or []
    if not isinstance(raw_calls, list):
        return "answered with tool calls that are not a list"
    calls = []
    for index, call in enumerate(raw_calls):
        function = getattr(call, "function", None)
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        if not isinstance(name, str):
            return "answered with a tool call that has no function name"
        call_id = getattr(call, "id", None) or f"call-{index}"
        calls.append({"id": str(call_id), "type": "function", "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {})}})
    content = getattr(message, "content", None)
    text = content if isinstance(content, str) else (json.dumps(content) if content is not None else "")
    refusal = getattr(message, "refusal", None)
    if not text and not calls and isinstance(refusal, str) and refusal:
        return refusal, [], "refusal"  # the model's own words for declining (OpenAI's ``message.refusal``)
    return text, calls, getattr(choice, "finish_reason", None)


def _asked_wait(exc: Exception) -> float | None:
    """Seconds the endpoint asked to wait (``retry-after-ms``, ``Retry-After`` in seconds or as a date);
    ``None`` when it asked nothing that is a wait (a negative number or NaN ended the turn with
    ``ValueError`` from the sleep, or was not retried): the usual backoff then applies."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms") is not None:
            asked = float(headers["retry-after-ms"]) / 1000
        elif headers.get("retry-after") is None:
            return None
        else:
            value = headers["retry-after"]
            try:
                asked = float(value)
            except ValueError:
                moment = email.utils.parsedate_to_datetime(value)
                return max(0.0, moment.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None
    return asked if asked >= 0 else None  # NaN compares False too


def _retry_wait(exc: Exception, attempt: int) -> float | None:
    """How long to wait before the next attempt, or ``None`` when this failure is not retried: the
    endpoint's ``x-should-retry`` first, then timeouts, dropped connections, 408, 409, 429 and 5xx retry;
    an asked wait over ``MAX_RETRY_WAIT_S`` is not waited for."""
    import openai

    response = getattr(exc, "response", None)
    should = getattr(response, "headers", {}).get("x-should-retry") if response is not None else None
    if should == "false" or _quota_exhausted(exc):
        return None
    status = getattr(exc, "status_code", None)
    retried = (should == "true" or isinstance(exc, (TimeoutError, openai.APITimeoutError, openai.APIConnectionError))
               or (isinstance(status, int) and (status in (408, 409, 429) or status >= 500)))
    if not retried:
        return None
    asked = _asked_wait(exc)
    if asked is not None:
        return asked if asked <= MAX_RETRY_WAIT_S else None
    return min(0.5 * 2 ** attempt, 8.0) * random.uniform(0.75, 1.0)


def _quota_exhausted(exc: Exception) -> bool:
    """Whether the endpoint says the account's quota is used up (OpenAI's ``insufficient_quota``, sent with a
    429): no wait helps it, so it is not retried as a passing rate limit is, and it is said as what it is."""
    return "insufficient_quota" in (getattr(exc, "code", None), getattr(exc, "type", None))


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _BODY_CHARS else text[:_BODY_CHARS] + "…"


# an error body that is a web page (a proxy's, a CDN's), its title, and what is no text of it (markup, scripts, comments)
_HTML = re.compile(r"\s*(<!doctype html|<html|<!--|<head)", re.IGNORECASE)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)
_NOT_TEXT = re.compile(r"<script.*?</script\s*>|<style.*?</style\s*>|<!--.*?-->|<[^>]*>", re.IGNORECASE | re.DOTALL)


def _page_gist(page: str) -> str:
    """An HTML error page in words: its title, else its text. Quoted raw, its first 300 characters were markup
    (Cloudflare's page opens with conditional comments) and never said what failed."""
    title = _TITLE.search(page)
    if title is not None and title.group(1).strip():
        return f'an HTML page titled "{" ".join(html.unescape(title.group(1)).split())}"'
    return f"an HTML page: {' '.join(html.unescape(_NOT_TEXT.sub(' ', page)).split())}"


def _body_text(exc: Any) -> str:
    """The endpoint's error message (not the whole body), bounded."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message") if isinstance(inner, dict) and isinstance(inner.get("message"), str) else json.dumps(body)
    elif isinstance(body, str):
        text = _page_gist(body) if _HTML.match(body) else body
    else:
        text = ""
    return _clip(text)


async def llm(ctx: TurnContext) -> str | TurnResult:
    """The built-in ``llm`` program, configured from the environment (a bad setting ends the turn naming it)."""
    try:
        program = LlmProgram.from_environment()
    except ValueError as exc:
        return TurnResult(stop_reason="error", diagnostic=str(exc))
    return await program(ctx)
