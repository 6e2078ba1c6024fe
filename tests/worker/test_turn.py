"""One turn run in-process (``worker.turn.run_turn``) against a real store: log shape, stop causes, fencing."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from subagents.store import Store, acquire_lease, create_session, inspect, release_lease
from subagents.store.errors import SubagentError
from subagents.worker import MAX_DIAGNOSTIC_BYTES, TurnControl, TurnResult, run_turn, truncate_diagnostic
from subagents.worker.protocol import Budget, TurnSpec

pytestmark = pytest.mark.anyio

HERE = "tests.worker.test_turn"


class FakeRpc:
    """Answers RPCs from a table; records every call."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, method: str, args: dict[str, Any]) -> Any:
        self.calls.append((method, args))
        answer = self.answers.get(method)
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture
def st(tmp_path) -> Store:
    return Store(tmp_path / "store", durability="none")


def new_session(st: Store, session_id: str = "01TURNTEST") -> int:
    create_session(st, session_id)
    return acquire_lease(st, session_id, "01OWNER").epoch


def make_spec(st: Store, epoch: int, program: str, message: Any = "hi", session_id: str = "01TURNTEST", **fields: Any) -> TurnSpec:
    return TurnSpec(
        session_id=session_id, epoch=epoch, store_root=st.root, durability="none", program=program,
        message_id="01MSG", message_source={"kind": "user"}, message=message, log_message=True,
        depth=1, mode="one-shot", **fields,
    )


async def turn(st: Store, program: str, message: Any = "hi", *, control: TurnControl | None = None, rpc: FakeRpc | None = None, **fields: Any):
    epoch = new_session(st)
    spec = make_spec(st, epoch, program, message, **fields)
    control = control or TurnControl(max_steps=spec.budget.max_steps)
    with anyio.fail_after(10):
        outcome = await run_turn(spec, control, rpc or FakeRpc())
    return outcome, inspect(st, spec.session_id).events


# -- programs used by reference (the loader imports this module) --------------------


async def say_twice(ctx):
    await ctx.step()
    await ctx.say("first")
    await ctx.step()
    await ctx.say("second")
    return "final"


async def returns_nothing(ctx):
    await ctx.say("only said")


async def raises_subagent_error(ctx):
    raise SubagentError("no such child", code="NO_RUN")


async def sleeps(ctx):
    await anyio.sleep(30)


async def spawns(ctx):
    result = await ctx.spawn("child prompt", label="kid", max_steps=3)
    background = await ctx.spawn("bg", wait=False)
    waited = await ctx.wait(background)
    return f"{result.output}|{waited.output}"


async def takes_over_its_lease(ctx):
    """Simulates another supervisor taking the session over mid-turn."""
    st = ctx._writer.store
    release_lease(st, ctx.session_id, "01OWNER", ctx.spec.epoch)
    acquire_lease(st, ctx.session_id, "01THIEF")
    await ctx.say("after the takeover")
    return "never"


async def returns_result(ctx):
    return TurnResult(output="o", structured={"k": 1})


# -- tests ------------------------------------------------------------------------------


async def test_log_shape_of_a_completed_turn(st):
    outcome, events = await turn(st, f"{HERE}:say_twice")
    assert (outcome.stop_reason, outcome.output, outcome.steps) == ("completed", "final", 2)
    assert [e["type"] for e in events] == [
        "message/accepted", "turn/start",
        "step/start", "assistant/message", "step/end", "step/start", "assistant/message", "step/end",
        "assistant/message", "turn/end",
    ]
    assert events[0]["data"] == {"message_id": "01MSG", "source": {"kind": "user"}, "content": "hi"}
    assert events[1]["data"] == {"message_id": "01MSG"}
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(e["epoch"] == 1 for e in events)
    assert events[-1]["data"] == {"stop_reason": "completed", "diagnostic": None}


async def test_last_said_text_is_the_output(st):
    outcome, events = await turn(st, f"{HERE}:returns_nothing")
    assert (outcome.stop_reason, outcome.output) == ("completed", "only said")
    assert [e["type"] for e in events].count("assistant/message") == 1


async def test_subagent_error_diagnostic_names_its_code(st):
    outcome, events = await turn(st, f"{HERE}:raises_subagent_error")
    assert (outcome.stop_reason, outcome.diagnostic) == ("error", "NO_RUN: no such child")
    assert events[-1]["data"]["stop_reason"] == "error"


async def test_unloadable_program(st):
    outcome, _ = await turn(st, "nope")
    assert outcome.stop_reason == "error"
    assert outcome.diagnostic.startswith("PROGRAM_LOAD_FAILED: ")


async def test_cancel_before_the_program_runs(st):
    """A control already stopped: the program is cancelled at its first await; the cause is kept."""
    control = TurnControl(max_steps=None)
    control.stop("aborted", "the turn was cancelled (user)")
    outcome, events = await turn(st, f"{HERE}:sleeps", control=control)
    assert (outcome.stop_reason, outcome.diagnostic) == ("aborted", "the turn was cancelled (user)")
    assert events[-1]["data"]["stop_reason"] == "aborted"


async def test_timeout_stops_a_sleeping_program(st):
    outcome, _ = await turn(st, f"{HERE}:sleeps", budget=Budget(timeout_ms=50))
    assert (outcome.stop_reason, outcome.diagnostic) == ("budget-exhausted", "the turn exceeded timeout_ms=50")


async def test_spawn_and_wait_go_through_rpc(st):
    child = {"id": "01KID", "output": "kid says", "structured": None, "stop_reason": "completed", "diagnostic": None}
    rpc = FakeRpc({"spawn_wait": child, "spawn": "01BG", "wait_run": {**child, "id": "01BG", "output": "bg says"}})
    outcome, _ = await turn(st, f"{HERE}:spawns", rpc=rpc)
    assert (outcome.stop_reason, outcome.output) == ("completed", "kid says|bg says")
    assert [m for m, _ in rpc.calls] == ["spawn_wait", "spawn", "wait_run"]
    assert rpc.calls[0][1]["prompt"] == "child prompt"
    assert rpc.calls[0][1]["label"] == "kid" and rpc.calls[0][1]["max_steps"] == 3
    assert rpc.calls[2][1] == {"run_id": "01BG"}


async def test_rpc_error_ends_the_turn_error(st):
    rpc = FakeRpc({"spawn_wait": SubagentError("subagent depth 2 exceeds maxDepth 1", code="DEPTH_EXCEEDED")})
    outcome, _ = await turn(st, f"{HERE}:spawns", rpc=rpc)
    assert (outcome.stop_reason, outcome.diagnostic) == ("error", "DEPTH_EXCEEDED: subagent depth 2 exceeds maxDepth 1")


async def test_a_fenced_turn_writes_nothing_more(st):
    """Once another owner holds a newer epoch, the turn's appends are refused and no turn/end is written."""
    outcome, events = await turn(st, f"{HERE}:takes_over_its_lease")
    assert outcome.stop_reason == "error"
    # the code leads, as for every SubagentError ending a turn: the supervisor recognises a fenced turn by it
    assert outcome.diagnostic == 'FENCED: session "01TURNTEST" was taken over: writer epoch 1, lease epoch 2'
    assert outcome.fenced  # the typed flag the supervisor's driver reads
    assert [e["type"] for e in events] == ["message/accepted", "turn/start"]


async def test_structured_result_without_schema_passes_through(st):
    outcome, _ = await turn(st, f"{HERE}:returns_result")
    assert (outcome.output, outcome.structured) == ("o", {"k": 1})


async def test_script_program_end_to_end(st):
    script = [{"say": "a"}, {"step": 2}, {"tool": "add", "args": {"a": 1, "b": 1}}]
    outcome, events = await turn(st, "script", json.dumps(script))
    assert (outcome.stop_reason, outcome.output, outcome.steps) == ("completed", "2", 2)
    kinds = [e["type"] for e in events]
    assert kinds.count("tool/call") == kinds.count("tool/result") == 1


# -- diagnostics ----------------------------------------------------------------------


def test_truncate_diagnostic_limits():
    assert truncate_diagnostic(None) is None
    assert truncate_diagnostic("short") == "short"
    exact = "x" * MAX_DIAGNOSTIC_BYTES
    assert truncate_diagnostic(exact) == exact
    cut = truncate_diagnostic(exact + "y")
    assert cut.endswith("\n[diagnostic truncated]")
    assert len(cut.encode("utf-8")) == MAX_DIAGNOSTIC_BYTES


@pytest.mark.parametrize("char", ["é", "€", "😀"])
@pytest.mark.parametrize("shift", [0, 1, 2, 3])
def test_truncate_diagnostic_on_character_boundaries(char, shift):
    """Whatever the alignment, the cut never splits a character and stays within 4096 bytes."""
    text = "a" * shift + char * 3000
    cut = truncate_diagnostic(text)
    body = cut[: -len("\n[diagnostic truncated]")]
    assert len(cut.encode("utf-8")) <= MAX_DIAGNOSTIC_BYTES
    assert len(cut.encode("utf-8")) > MAX_DIAGNOSTIC_BYTES - len(char.encode("utf-8"))
    assert text.startswith(body)


async def test_a_turn_on_its_own_sessions_releases_and_keeps_no_index_open(st):
    """Without a ``SessionAccess`` the turn opens the store itself; the parent's index it kept open
    for the released child's row is closed with it."""
    import os

    from subagents.store import read_children

    from ..store._support import make_child

    create_session(st, "01PARENT")
    make_child(st, "01PARENT", "01CHILD")
    epoch = acquire_lease(st, "01CHILD", "01OWNER").epoch
    spec = make_spec(st, epoch, "echo", session_id="01CHILD", release_owner="01OWNER", parent_session="01PARENT")
    with anyio.fail_after(10):
        outcome = await run_turn(spec, TurnControl(max_steps=None), FakeRpc())
    assert outcome.released
    assert [e.settled is not None for e in read_children(st, "01PARENT")] == [True]
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    assert not [p for p in held if p.startswith(st.children_index_dir)]
