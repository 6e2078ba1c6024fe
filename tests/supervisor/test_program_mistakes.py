"""A program's ordinary mistakes end its turn ``error``, saying what, in its result and its log alike; its
worker lives on and the next child runs.

Found by a probe that wrote faulty programs: ``ctx.say(123)`` or ``TurnResult(output=123)`` left the caller
waiting forever (the supervisor could not take the result) while the listing said ``completed``; a program
raising ``KeyboardInterrupt`` or a ``BaseException`` of its own killed its worker (and every other turn on
it); a structured value no record holds killed the worker too, while the log said ``completed``; an output
larger than the store takes, or text no encoding holds, left the turn open in the log for good (``crashed``)
and printed a traceback; an unknown stop reason came back as ``error`` with no diagnostic.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from subagents.store import inspect
from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import HELPERS, open_supervisor

pytestmark = pytest.mark.anyio

CASES = [
    ("says_a_number", "TypeError: say takes text, not int"),
    ("returns_a_number_as_output", "TypeError: TurnResult.output must be text, not int"),
    ("returns_an_unknown_stop_reason", "ValueError: TurnResult.stop_reason must be one of completed, refusal, max-tokens, error, not 'banana'"),
    ("returns_a_number_as_diagnostic", "TypeError: TurnResult.diagnostic must be text or None, not int"),
    ("unsendable", "TypeError: TurnResult.structured cannot be stored"),
    ("structured_nan", "TypeError: TurnResult.structured must be a JSON value (Out of range float values are not JSON compliant"),
    ("structured_int_keys", "TypeError: TurnResult.structured must be a JSON value (a map key at [1] is int, not text)"),
    ("raises_cancelled", "asyncio.exceptions.CancelledError"),
    ("raises_cancelled_in_a_thread", "asyncio.exceptions.CancelledError"),
    ("raises_generator_exit", "GeneratorExit: mine"),
    ("raises_keyboard_interrupt", "KeyboardInterrupt"),
    ("raises_its_own_base_exception", "tests.programs_for_tests.OwnBaseException: mine"),
    ("returns_text_no_encoding_holds", "INVALID_RECORD: the turn's closing message cannot be stored"),
    ("returns_more_than_the_store_takes", "RECORD_TOO_LARGE: the turn's closing message cannot be stored"),
    # a lone surrogate in the error's own text (found by a probe: the turn was left open, read as a host crash)
    ("raises_with_text_no_encoding_holds", "ValueError: unexpected file caf\\udce9.txt"),
    ("returns_a_diagnostic_no_encoding_holds", "bad \\ud800"),
    ("returns_bytes", "TypeError: a program returns text or a TurnResult, not bytes"),
    ("returns_a_dict", "TypeError: a program returns text or a TurnResult, not dict"),
    ("yields_its_output", "TypeError: a program returns text or a TurnResult, not async_generator"),
    ("returns_a_coroutine", "TypeError: a program returns text or a TurnResult, not coroutine"),
    # the group alone said nothing of what failed (found by a probe: an endpoint URL with port 80800)
    ("fails_in_a_task_group",
     "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception): OverflowError: connect(): port must be 0-65535."),
]


@pytest.mark.parametrize("name, said", CASES, ids=[name for name, _ in CASES])
async def test_a_program_mistake_ends_its_turn_error_and_its_worker_runs_the_next(tmp_path, name, said) -> None:
    async with open_supervisor(tmp_path, pool_size=1, max_record_bytes=64 * 1024) as sup:
        run_id, result = await _run_then_the_next(sup, name)
        assert result.stop_reason == "error" and result.diagnostic.startswith(said), result
        [end] = [e["data"] for e in inspect(sup.store, run_id).events if e["type"] == "turn/end"]
        assert (end["stop_reason"], end["diagnostic"]) == ("error", result.diagnostic)
        assert sup.statistics().pool.crashed == 0


async def _run(sup, program: str, prompt: str = "go", *, provider: str | None = None, within: float = 20) -> tuple[str, Any]:
    """Run a one-shot child under a new root: of the test program ``program`` (registered here), or of the
    registered ``provider``; its id and result, once disposed."""
    if provider is None:
        provider = program
        sup.register_provider(Provider(name=provider, program=f"{HELPERS}:{program}"))
    root = await sup.open_root()
    run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt))
    with anyio.fail_after(within):
        result = await run.result()
    await run.dispose()
    return run.id, result


async def _run_then_the_next(sup, name: str) -> tuple[str, Any]:
    """Run the test program ``name`` as a one-shot child, then an echo child, which must complete: the
    faulty child's id and result."""
    run_id, result = await _run(sup, name)
    root = await sup.open_root()
    after = await sup.start("echo", SubagentRequest(parent=root, prompt="still here"))
    with anyio.fail_after(20):
        assert (await after.result()).output == "still here"
    await after.dispose()
    return run_id, result


async def test_a_context_kept_past_its_turn_says_the_turn_is_gone(tmp_path) -> None:
    """A program that keeps ``ctx`` (a global) and uses it in a later turn got ``ValueError: file descriptor cannot
    be a negative integer (-1)`` from ``say`` and ``step``; they say ``TURN_GONE``, as the requests that reach the
    supervisor after the turn do, and nothing is written to the old session."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        for name in ("keeps_its_context", "uses_a_kept_context"):
            sup.register_provider(Provider(name=name, program=f"{HELPERS}:{name}"))
        root = await sup.open_root()
        first = await sup.start("keeps_its_context", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(20):
            assert (await first.result()).output == "kept"
        before = inspect(sup.store, first.id).events
        second = await sup.start("uses_a_kept_context", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(20):
            result = await second.result()
        assert result.output.splitlines() == ["TurnGoneError TURN_GONE: the calling turn is gone"] * 2, result
        assert inspect(sup.store, first.id).events == before
        for run in (first, second):
            await run.dispose()


async def test_listing_agents_in_a_scope_there_is_not_is_an_error_not_the_children(tmp_path) -> None:
    """Found by a probe: ``ctx.list_agents("bogus")`` listed the children."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        _, result = await _run(sup, "script", '{"script": [{"list": "bogus"}]}', provider="script")
        assert (result.stop_reason, result.diagnostic) == ("error", """ValueError: scope must be "children" or "descendants", not 'bogus'""")


async def test_the_script_list_action_says_the_listing_as_a_model_reads_it(tmp_path) -> None:
    """Found by a docs probe: ``{"list": "children"}`` said a JSON dump of the rows, where the script's own
    docstring and the behaviour notes promise the rendered listing (``<id> [<status>] — <label>``)."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        script = '{"script": [{"list": "children"}, {"spawn": {"prompt": {"script": [{"return": "x"}]}, "label": "kid"}}, {"list": "children"}]}'
        run = await sup.start("script", SubagentRequest(parent=root, prompt=script))
        with anyio.fail_after(20):
            result = await run.result()
        assert result.stop_reason == "completed", result
        said = [e["data"]["text"] for e in inspect(sup.store, run.id).events if e["type"] == "assistant/message"]
        kid = (await sup.list_children(run.id))[0].id
        assert said[0] == "(no subagents)" and said[-1] == f"{kid} [complete] — kid", said
        await run.dispose()


async def test_the_processes_a_program_starts_obey_the_stop_signals_the_worker_survives(tmp_path) -> None:
    """Found by a probe: the worker ignored SIGTERM, SIGINT and SIGHUP (so a group's Ctrl-C or a service manager's
    stop reaches the supervisor alone), and an ignored signal stays ignored across fork and exec: a ``sleep`` the
    program started ran on after ``terminate()``, and a ``multiprocessing`` pool's ``terminate`` hung for good."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        _, result = await _run(sup, "stops_what_it_starts", within=60)
        assert (result.stop_reason, result.output) == ("completed", "-15 -2 -15"), result


async def test_a_tool_called_with_arguments_it_does_not_take_says_so_in_its_own_words(tmp_path) -> None:
    """Found by a probe: ``ctx.call_tool("read_file", nope=1)`` raised a bare ``TypeError`` naming the tool's
    internal function (``_read_file() got an unexpected keyword argument``), with no code, and a model read
    the same text as the call's result."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        run_id, result = await _run(sup, "script", '{"script": [{"tool": "read_file", "args": {"nope": 1}}]}', provider="script")
        expected = """tool "read_file" takes no argument 'nope' (its parameters: path)"""
        assert (result.stop_reason, result.diagnostic) == ("error", f"INVALID_REQUEST: {expected}"), result
        [answer] = [e["data"] for e in inspect(sup.store, run_id).events if e["type"] == "tool/result"]
        assert answer["is_error"] and answer["error"] == f"ToolArgumentsError: {expected}", answer


async def test_interrupt_from_a_program_says_whether_it_stopped_a_turn(tmp_path) -> None:
    """Found by a probe: ``ctx.interrupt`` of a one-shot child or an unknown id returned None, which reads as done.
    It does nothing there (the reference's rule: no error), and now answers False."""
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        _, result = await _run(sup, "interrupts_what_it_cannot")
        assert (result.stop_reason, result.output) == ("completed", "False False"), result


async def test_a_request_with_a_provider_id_or_label_of_the_wrong_kind_is_invalid_and_creates_nothing(tmp_path) -> None:
    """Found by a probe: ``provider=""`` (or ``[]``) started a child of the caller's own program (a program
    that did so recursed without end), a list or a map as an id was ``RPC_FAILED`` with a traceback in the
    host's log, and a label of bytes was taken. Each is ``INVALID_REQUEST``, and no child is made."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="wrong", program=f"{HELPERS}:calls_with_wrong_kinds", capabilities=Capabilities.all(),
                                       continuable=True))
        root = await sup.open_root()
        run = await sup.start("wrong", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(20):
            result = await run.result()
        assert result.stop_reason == "completed", result
        lines = result.output.splitlines()
        assert [line.rsplit(": ", 1)[1] for line in lines] == ["INVALID_REQUEST"] * len(lines), lines
        assert await sup.list_children(run.id) == []
        await run.dispose()


async def test_a_request_with_an_argument_no_message_holds_is_invalid_and_creates_nothing(tmp_path) -> None:
    """Found by a probe: ``ctx.spawn(object())`` and the like raised msgpack's bare ``TypeError: can not serialize
    'object' object``. Each is ``INVALID_REQUEST`` naming the call and the argument, raised before anything is sent."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="sender", program=f"{HELPERS}:sends_what_cannot_be_sent"))
        root = await sup.open_root()
        run = await sup.start("sender", SubagentRequest(parent=root, prompt="go"))
        with anyio.fail_after(20):
            result = await run.result()
        assert result.stop_reason == "completed", result
        assert result.output.splitlines() == [
            "UnsendableArgumentError INVALID_REQUEST: spawn: prompt cannot be sent (can not serialize 'object' object)",
            "UnsendableArgumentError INVALID_REQUEST: spawn: output_schema cannot be sent (can not serialize 'object' object)",
            "UnsendableArgumentError INVALID_REQUEST: start_continuable: persona cannot be sent (can not serialize 'object' object)",
            "UnsendableArgumentError INVALID_REQUEST: send_message: message cannot be sent (can not serialize 'set' object)",
            "UnsendableArgumentError INVALID_REQUEST: report: content cannot be sent (can not serialize 'object' object)",
            "UnsendableArgumentError INVALID_REQUEST: spawn: prompt cannot be sent (a map key at [1] is int, not text)",
            "UnsendableArgumentError INVALID_REQUEST: send_message: message cannot be sent (a map key at ['a'][(1, 2)] is tuple, not text)",
            "0",
        ], result.output
        assert await sup.list_children(run.id) == []
        await run.dispose()


async def test_a_task_the_program_leaves_running_is_cancelled_as_its_turn_ends(tmp_path) -> None:
    """Found by a probe: a task a program started and never awaited ran on after its turn, on that worker's loop,
    slowing every later turn there. It is cancelled before the turn's closing records, as ``asyncio.run`` cancels
    what its main coroutine left; the worker runs the next turn."""
    beats = tmp_path / "beats"
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="leaver", program=f"{HELPERS}:leaves_a_task_running"))
        root = await sup.open_root()
        run = await sup.start("leaver", SubagentRequest(parent=root, prompt=str(beats)))
        with anyio.fail_after(20):
            result = await run.result()
        assert (result.stop_reason, result.output) == ("completed", "left it"), result
        lines = beats.read_text().splitlines()
        assert lines[-1] == "cancelled" and set(lines[:-1]) == {"beat"}, lines
        await anyio.sleep(0.2)
        assert beats.read_text().splitlines() == lines  # nothing beats any more
        after = await sup.start("echo", SubagentRequest(parent=root, prompt="still here"))
        with anyio.fail_after(20):
            assert (await after.result()).output == "still here"
        for done in (run, after):
            await done.dispose()


@pytest.mark.parametrize("name", ["forks_and_returns", "forks_and_returns_blocking"])
async def test_a_process_the_program_forks_never_acts_as_its_worker(tmp_path, name) -> None:
    """Found by a probe: a program that forked and let the child return sent the turn's answer twice on the
    shared pipe and wrote its closing records twice, and the worker's next turn failed ("no running event
    loop"). The forked child's ``ctx`` says TURN_GONE, it exits as it comes back from the program, and the
    worker's turns go on."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="forker", program=f"{HELPERS}:{name}"))
        root = await sup.open_root()
        for i in range(3):
            said = tmp_path / f"said-{i}"
            run = await sup.start("forker", SubagentRequest(parent=root, prompt=str(said)))
            with anyio.fail_after(20):
                result = await run.result()
            assert (result.stop_reason, result.output) == ("completed", "the worker's"), result
            types = [e["type"] for e in inspect(sup.store, run.id).events]
            assert types.count("turn/end") == 1 and "assistant/message" in types, types
            if name == "forks_and_returns":
                assert said.read_text() == "TurnGoneError TURN_GONE: the calling turn is its worker's: this process was forked from it"
            await run.dispose()
        assert sup.statistics().pool.crashed == 0



async def test_an_option_the_call_sets_is_an_invalid_request_not_an_internal_failure(tmp_path, caplog) -> None:
    """Found by a probe: ``ctx.start_continuable(..., parent=...)`` came back ``RPC_FAILED`` with ``TypeError:
    ContinuableSpec() got multiple values for keyword argument 'parent'``, logged with a traceback."""
    import json

    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        action = {"start_continuable": {"prompt": "x", "label": "c", "parent": "01M00000000000000000000000"}}
        run = await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([action])))
        with anyio.fail_after(20):
            result = await run.result()
        await run.dispose()
    assert result.stop_reason == "error" and result.diagnostic.startswith("INVALID_REQUEST: invalid "), result
    assert "is not an option here" in result.diagnostic
    assert not [r for r in caplog.records if "rpc" in r.getMessage() and r.exc_info], "no traceback for a program's mistake"


@pytest.mark.parametrize("name", ["exits_the_worker", "exits_the_worker_from_a_thread"])
async def test_a_program_that_exits_its_worker_ends_its_turn_and_the_worker_is_replaced(tmp_path, name) -> None:
    """``sys.exit`` ends the worker (README); from a plain ``def`` the worker hung instead, waiting at its exit for
    the thread that ran the program, and the caller waited for good (a probe found it)."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        _run_id, result = await _run_then_the_next(sup, name)
    assert result.stop_reason == "error" and result.diagnostic.endswith("exited with code 3"), result


async def test_a_worker_that_sends_what_is_no_message_is_killed_not_the_supervisor(tmp_path) -> None:
    """Found by a probe (a map with integer keys, which the host's strict reader refused): anything the host
    cannot decode from a worker raised in its pipe reader and ended the supervisor's task group. Now that
    worker is killed, its turn ends as a dead worker's does, and the supervisor goes on."""
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        _run_id, result = await _run_then_the_next(sup, "garbles_its_workers_pipe")
    assert result.stop_reason == "error" and "SIGKILL" in result.diagnostic, result
