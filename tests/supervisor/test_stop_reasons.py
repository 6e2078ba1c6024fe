"""Every stop reason a one-shot result can carry, and what its log's ``turn/end`` records."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.supervisor import RunBudget, SubagentRequest

from ..conftest import DEADLINE_S, HELPERS, events_of, last_turn_end, open_supervisor, said, types_of, wait_until
from ..programs_for_tests import HUGE_TEXT

pytestmark = pytest.mark.anyio


async def run_to_end(sup, provider, prompt, **request):
    root = await sup.open_root()
    run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt, **request))
    with anyio.fail_after(DEADLINE_S):
        result = await run.result()
    await run.dispose()
    return run, result


def assert_balanced(st, session_id):
    """The log ends with one ``turn/end``; every ``step/start`` has its ``step/end``."""
    kinds = types_of(st, session_id)
    assert kinds[-1] == "turn/end"
    assert kinds.count("turn/start") == kinds.count("turn/end") == 1
    assert kinds.count("step/start") == kinds.count("step/end")


async def test_completed(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "echo", "hello")
        assert (result.stop_reason, result.output, result.diagnostic) == ("completed", "hello", None)
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "completed"
        assert_balanced(sup.store, run.id)
        assert types_of(sup.store, run.id)[:3] == ["approval/policy", "subagent/descriptor", "message/accepted"]


async def test_error_from_a_failing_program(tmp_path):
    """A program that raises ends ``error`` with the exception as the diagnostic (not a wrapper)."""
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "script", json.dumps([{"say": "before"}, {"fail": "it broke"}]))
        assert result.stop_reason == "error"
        assert result.diagnostic == "RuntimeError: it broke"
        assert result.output == "before"
        assert last_turn_end(sup.store, run.id) == {"stop_reason": "error", "diagnostic": "RuntimeError: it broke"}
        assert_balanced(sup.store, run.id)


async def test_error_for_a_program_that_cannot_be_loaded(tmp_path):
    from subagents.supervisor import Provider

    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="ghost", program="tests.no_such_module:nothing"))
        run, result = await run_to_end(sup, "ghost", "x")
        assert result.stop_reason == "error"
        assert result.diagnostic.startswith("PROGRAM_LOAD_FAILED: ")
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "error"


async def test_budget_exhausted_by_max_steps(tmp_path):
    """The third step of a ``max_steps=2`` turn stops it; the open step is closed in the log."""
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "script", json.dumps([{"step": 5}, {"say": "never"}]), budget=RunBudget(max_steps=2))
        assert result.stop_reason == "budget-exhausted"
        assert result.diagnostic == "the turn exceeded max_steps=2"
        events = events_of(sup.store, run.id)
        assert [e["data"]["n"] for e in events if e["type"] == "step/start"] == [1, 2]
        assert said(sup.store, run.id) == []
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "budget-exhausted"
        assert_balanced(sup.store, run.id)


async def test_max_steps_exactly_reached_completes(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        _, result = await run_to_end(sup, "script", json.dumps([{"step": 2}, {"return": "ok"}]), budget=RunBudget(max_steps=2))
        assert (result.stop_reason, result.output) == ("completed", "ok")


async def test_budget_exhausted_by_timeout_while_sleeping(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "script", json.dumps([{"sleep": 30_000}]), budget=RunBudget(timeout_ms=150))
        assert result.stop_reason == "budget-exhausted"
        assert result.diagnostic == "the turn exceeded timeout_ms=150"
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "budget-exhausted"
        assert_balanced(sup.store, run.id)


async def test_budget_exhausted_by_timeout_while_burning_cpu(tmp_path):
    """``cpu`` runs in a thread that checks the stop flag: the timer stops it too."""
    async with open_supervisor(tmp_path) as sup:
        _, result = await run_to_end(sup, "script", json.dumps([{"cpu": 30_000}]), budget=RunBudget(timeout_ms=150))
        assert result.stop_reason == "budget-exhausted"


async def test_aborted_by_cancel_event_after_publication(tmp_path):
    """Setting the ``cancel=`` event of a running child ends it ``aborted``; the child stays listed."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        cancel = anyio.Event()
        run = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000", label="sleeper"), cancel=cancel)
        await wait_until(lambda: said(sup.store, run.id), what="the child to start its turn")
        cancel.set()
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "aborted"
        assert result.diagnostic == "the turn was cancelled (user)"
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "aborted"
        assert_balanced(sup.store, run.id)
        # published: nothing is rolled back
        assert [(c.id, c.status) for c in await sup.list_children(root.id)] == [(run.id, "complete")]


async def test_aborted_by_dispose_of_a_sleeping_run(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000"))
        await wait_until(lambda: said(sup.store, run.id), what="the child to start its turn")
        with anyio.fail_after(DEADLINE_S):
            await run.dispose()
            await run.dispose()  # idempotent
            result = await run.result()
        assert result.stop_reason == "aborted"
        assert result.diagnostic == "the turn was cancelled (disposed)"
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "aborted"
        assert_balanced(sup.store, run.id)


async def test_cancel_wins_over_a_later_timer(tmp_path):
    """A cancellation that came first is never rewritten by the timeout that would fire later."""
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="30000", budget=RunBudget(timeout_ms=400)))
        await wait_until(lambda: said(sup.store, run.id), what="the child to start its turn")
        run.cancel()
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        await run.dispose()
        assert result.stop_reason == "aborted"
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "aborted"


async def test_completed_run_is_not_rewritten_by_a_late_cancel(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        cancel = anyio.Event()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt="quick"), cancel=cancel)
        with anyio.fail_after(DEADLINE_S):
            result = await run.result()
        cancel.set()
        run.cancel()
        await run.dispose()
        assert result.stop_reason == "completed"
        assert (await run.result()).stop_reason == "completed"


async def test_refusal(tmp_path):
    """A program's ``refusal`` is the result's reason; the log records ``blocked``."""
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "refuse", "please")
        assert (result.stop_reason, result.output, result.diagnostic) == ("refusal", "no", "the request was refused")
        assert last_turn_end(sup.store, run.id) == {"stop_reason": "blocked", "diagnostic": "the request was refused"}
        assert_balanced(sup.store, run.id)


async def test_max_tokens(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "max-tokens", "x")
        assert (result.stop_reason, result.output) == ("max-tokens", "partial answer")
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "max-tokens"


async def test_blocking_program_runs_in_a_thread(tmp_path):
    """A plain ``def`` program gets the same context API (step, say) through its thread."""
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "blocking", "hi")
        assert (result.stop_reason, result.output) == ("completed", "sync:hi")
        assert said(sup.store, run.id) == ["from a thread", "sync:hi"]
        assert_balanced(sup.store, run.id)


async def test_a_blocking_program_records_from_threads_it_started_itself(tmp_path):
    """Found as a known gap: ``ctx.say`` from a ``ThreadPoolExecutor`` thread raised anyio's ``NoEventLoopError``
    (only the thread the turn runs in knew its event loop), so fanning work out to threads ended the turn ``error``."""
    from subagents.supervisor import Provider

    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="fans-out", program=f"{HELPERS}:says_from_its_own_threads"))
        run, result = await run_to_end(sup, "fans-out", "go")
        assert (result.stop_reason, result.output, result.diagnostic) == ("completed", "sum 3", None)
        assert sorted(said(sup.store, run.id)) == ["part 0", "part 1", "part 2", "sum 3"]
        assert types_of(sup.store, run.id).count("step/start") == 3


async def test_callable_program_travels_by_dill(tmp_path):
    """A provider given a callable object (no import path) runs it in the worker."""
    from subagents.supervisor import Provider

    tag = "closure-value"

    async def program(ctx):
        return f"{tag}:{ctx.text}"

    async with open_supervisor(tmp_path) as sup:
        sup.register_provider(Provider(name="inline", program=program))
        _, result = await run_to_end(sup, "inline", "x")
        assert (result.stop_reason, result.output) == ("completed", "closure-value:x")


async def test_diagnostic_truncated_on_a_character_boundary(tmp_path):
    """A huge multibyte failure message is cut to <= 4096 UTF-8 bytes on a boundary, with the marker."""
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_to_end(sup, "huge-fail", "x")
        assert result.stop_reason == "error"
        diag = result.diagnostic
        suffix = "\n[diagnostic truncated]"
        assert diag.endswith(suffix)
        raw = diag.encode("utf-8")
        assert len(raw) <= 4096
        assert len(raw) > 4096 - 4  # cut at most one (4-byte) character short
        body = diag[: -len(suffix)]
        assert body.startswith("RuntimeError: ")
        assert HUGE_TEXT.startswith(body[len("RuntimeError: "):])
        assert last_turn_end(sup.store, run.id)["diagnostic"] == diag


@pytest.mark.parametrize("provider, prompt", [
    ("script", json.dumps([{"spin": 8_000}, {"return": "finished late"}])),  # blocks its worker's event loop
    ("ignores_its_budget", "8"),  # a plain def in a thread that never checks the stop flag
], ids=["blocked-loop", "thread-ignoring-stop"])
async def test_a_turn_past_its_timeout_that_does_not_stop_is_killed_after_the_grace(tmp_path, provider, prompt):
    """Found by a probe: a program that never yields (a blocked event loop, or a thread that ignores the
    stop) ran to its end past ``timeout_ms`` and its result said ``completed`` (the blocked loop) or came
    only at the end (the thread). The host holds the budget too: past ``timeout_ms`` it stops the turn,
    and kills its worker after ``cancel_grace_s`` as an interrupt does; the result and the log say
    ``budget-exhausted``."""
    from subagents.supervisor import Capabilities, Provider

    from ..conftest import HELPERS

    async with open_supervisor(tmp_path, cancel_grace_s=0.5) as sup:
        sup.register_provider(Provider(name="ignores_its_budget", program=f"{HELPERS}:ignores_its_budget", capabilities=Capabilities.all()))
        started = anyio.current_time()
        run, result = await run_to_end(sup, provider, prompt, budget=RunBudget(timeout_ms=300))
        took = anyio.current_time() - started
        assert result.stop_reason == "budget-exhausted", result
        assert "timeout_ms=300" in result.diagnostic, result.diagnostic
        assert took < 6.0, took  # not the program's 8 s
        end = last_turn_end(sup.store, run.id)
        assert end["stop_reason"] == "budget-exhausted" and end.get("cause") == "timeout", end
        assert_balanced(sup.store, run.id)
