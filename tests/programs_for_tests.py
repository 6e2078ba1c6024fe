"""Programs the tests run in worker processes, by import path ``tests.programs_for_tests:<name>``.

Each is module-level so a forkserver (or spawn) worker can import it; the
repository root is on the workers' ``sys.path`` (see ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import time

import anyio

from subagents.store import SubagentError
from subagents.worker.context import TurnContext, TurnResult
from subagents.worker.programs.script import _burn, _hold

# A message with multibyte characters of every UTF-8 width, long enough to be truncated.
HUGE_TEXT = "aé€😀" * 2000


async def refuse(ctx: TurnContext) -> TurnResult:
    """Refuses: the result says ``refusal``, the log's ``turn/end`` says ``blocked``."""
    await ctx.step()
    return TurnResult(output="no", stop_reason="refusal", diagnostic="the request was refused")


async def max_tokens(ctx: TurnContext) -> TurnResult:
    await ctx.say("partial")
    return TurnResult(output="partial answer", stop_reason="max-tokens", diagnostic="ran out of tokens")


async def huge_fail(ctx: TurnContext) -> str:
    """Fails with a message far above 4096 UTF-8 bytes."""
    raise RuntimeError(HUGE_TEXT)


async def pid(ctx: TurnContext) -> str:
    return str(os.getpid())


async def pid_then_sleep(ctx: TurnContext) -> str:
    """Records its worker's pid in the log, then sleeps ``message`` ms (cancellable)."""
    await ctx.say(str(os.getpid()))
    await anyio.sleep(float(ctx.text) / 1000.0)
    return f"slept {ctx.text}"


async def cpu_then_pid(ctx: TurnContext) -> str:
    """Burns ``message`` ms of CPU on the event loop's thread, then answers its pid."""
    _burn(float(ctx.text), None)
    return str(os.getpid())


async def tool_names(ctx: TurnContext) -> str:
    return json.dumps(ctx.tools.names)


def blocking_program(ctx) -> str:  # type: ignore[no-untyped-def]
    """A plain ``def``: runs in a thread with the same context API."""
    ctx.step()
    ctx.say("from a thread")
    return "sync:" + ctx.text


def says_from_its_own_threads(ctx) -> str:  # type: ignore[no-untyped-def]
    """A plain ``def`` that fans out to threads it starts itself, each of which records through ``ctx``."""
    from concurrent.futures import ThreadPoolExecutor

    def part(n: int) -> int:
        ctx.step()
        ctx.say(f"part {n}")
        return n

    with ThreadPoolExecutor(max_workers=3) as pool:
        total = sum(pool.map(part, range(3)))
    return f"sum {total}"


async def script_or_notice(ctx: TurnContext) -> str:
    """A ``script`` turn, except that a turn woken by a report or settlement notice answers in words.

    Continuable parents in the tests run this: the notices their children send
    are prose, not scripts. The answer names the waking message's kind and how
    many quiet messages came with it, so a test can read both from the log.
    """
    from subagents.worker.programs.script import script

    kind = (ctx.spec.message_source or {}).get("kind")
    if kind in ("subagent-settled", "subagent-report"):
        quiet = [n.get("source", {}).get("kind") for n in ctx.notices]
        return f"noted {kind} with {len(quiet)} quiet: {','.join(quiet)}"
    result = await script(ctx)
    return result if isinstance(result, str) else result.output


def _where() -> str:
    """The Ray node this program runs on, or ``local`` outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return "local"
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


async def node_pid(ctx: TurnContext) -> str:
    """Answers ``<node id> <pid>``: where the turn ran (Ray tests)."""
    return f"{_where()} {os.getpid()}"


async def node_then_sleep(ctx: TurnContext) -> str:
    """Records ``<node id> <pid>`` in the log, then sleeps ``message`` ms (cancellable)."""
    await ctx.say(f"{_where()} {os.getpid()}")
    await anyio.sleep(float(ctx.text) / 1000.0)
    return f"slept {ctx.text}"


async def node_then_hold(ctx: TurnContext) -> str:
    """Records ``<node id> <pid>`` in the log, then waits (cancellable) until the file named by
    ``message`` exists: the turn stays open until the test opens that gate."""
    await ctx.say(f"{_where()} {os.getpid()}")
    await _hold(ctx.text)
    return "held"


async def environment_value(ctx: TurnContext) -> str:
    """``<pid> <value>`` of the environment variable the turn's message names (``<unset>``): what a program
    that reads its settings from the environment (the ``llm`` program) sees in its worker."""
    return f"{os.getpid()} {os.environ.get(ctx.text, '<unset>')}"


async def echo_upper(ctx: TurnContext) -> str:
    """The turn's message in capitals: a program only reachable by its import path."""
    return ctx.text.upper()


async def unsendable(ctx: TurnContext) -> TurnResult:
    """A structured value the pipe protocol cannot carry (not msgpack): its ``TurnDone`` cannot be sent."""
    return TurnResult(output="x", structured=object())


async def structured_nan(ctx: TurnContext) -> TurnResult:
    """A structured value msgpack holds and JSON does not (NaN): ``run --json`` printed a bare ``NaN``."""
    return TurnResult(output="x", structured={"n": float("nan")})


async def structured_int_keys(ctx: TurnContext) -> TurnResult:
    """A map with integer keys: msgpack holds it, JSON turns the keys into text, and the host's pipe refused
    it, which ended the whole supervisor (a probe found it)."""
    return TurnResult(output="x", structured={1: "a"})


async def raises_cancelled(ctx: TurnContext) -> None:
    """A cancellation nobody asked for: the program's own failure, not the turn's stop (which never came)."""
    import asyncio

    raise asyncio.CancelledError()


def raises_cancelled_in_a_thread(ctx) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    raise asyncio.CancelledError()


async def raises_generator_exit(ctx: TurnContext) -> None:
    raise GeneratorExit("mine")


async def exits_the_worker(ctx: TurnContext) -> None:
    import sys

    sys.exit(3)


def exits_the_worker_from_a_thread(ctx) -> None:  # type: ignore[no-untyped-def]
    """``sys.exit`` in a plain ``def``: its thread's ``SystemExit`` reached the worker, which then waited for
    that thread at its exit, for good (a probe found it)."""
    import sys

    sys.exit(3)


async def garbles_its_workers_pipe(ctx: TurnContext) -> str:
    """Sends the supervisor bytes that are no message (0xc1 is no msgpack at all) on its worker's own pipe, as
    a broken or hostile worker would; an exception in the host's pipe reader used to end the whole supervisor."""
    import gc

    for conn in [o for o in gc.get_objects() if type(o).__name__ == "Connection"]:
        try:
            conn.send_bytes(b"\xc1")
        except OSError:
            pass
    await anyio.sleep(60)
    return "never"


# -- a program's ordinary mistakes: each ends its turn ``error`` saying what, its worker lives on -------------


class OwnBaseException(BaseException):
    """A program's own ``BaseException``: not an ``Exception``, not a cancellation."""


async def says_a_number(ctx: TurnContext) -> None:
    await ctx.say(123)  # type: ignore[arg-type]


async def returns_a_number_as_output(ctx: TurnContext) -> TurnResult:
    return TurnResult(output=123)  # type: ignore[arg-type]


async def returns_an_unknown_stop_reason(ctx: TurnContext) -> TurnResult:
    return TurnResult(output="o", stop_reason="banana")  # type: ignore[arg-type]


async def returns_a_number_as_diagnostic(ctx: TurnContext) -> TurnResult:
    return TurnResult(stop_reason="error", diagnostic=12)  # type: ignore[arg-type]


async def raises_keyboard_interrupt(ctx: TurnContext) -> str:
    raise KeyboardInterrupt


async def raises_its_own_base_exception(ctx: TurnContext) -> str:
    raise OwnBaseException("mine")


async def returns_text_no_encoding_holds(ctx: TurnContext) -> str:
    return "bad \udcff"


async def raises_with_text_no_encoding_holds(ctx: TurnContext) -> str:
    raise ValueError("unexpected file caf\udce9.txt")  # a name os.listdir decoded from Latin-1 bytes


async def returns_a_diagnostic_no_encoding_holds(ctx: TurnContext) -> TurnResult:
    return TurnResult(output="x", stop_reason="error", diagnostic="bad \ud800")


async def returns_more_than_the_store_takes(ctx: TurnContext) -> str:
    return "x" * (256 * 1024)


_KEPT: list[TurnContext] = []


async def keeps_its_context(ctx: TurnContext) -> str:
    """Keeps its ``ctx`` past its turn (a global): a later turn on this worker uses it."""
    _KEPT.append(ctx)
    return "kept"


async def uses_a_kept_context(ctx: TurnContext) -> str:
    """Says how a context kept from an earlier turn refuses to record: each call's error, one per line."""
    lines = []
    for call in (lambda c: c.say("late"), lambda c: c.step()):
        try:
            await call(_KEPT[-1])
            lines.append("recorded")
        except Exception as exc:  # noqa: BLE001 - what it raised is the answer
            lines.append(f"{type(exc).__name__} {getattr(exc, 'code', None)}: {exc}")
    return "\n".join(lines)


async def calls_with_wrong_kinds(ctx: TurnContext) -> str:
    """Calls whose provider, id or label is of the wrong kind, or empty: what each raises (its code)."""
    calls = {
        "spawn provider ''": lambda: ctx.spawn("x", provider=""),
        "spawn provider []": lambda: ctx.spawn("x", provider=[]),  # type: ignore[arg-type]
        "spawn provider 123": lambda: ctx.spawn("x", provider=123),  # type: ignore[arg-type]
        "spawn label bytes": lambda: ctx.spawn("x", provider="script", label=b"x"),  # type: ignore[arg-type]
        "start_continuable provider ''": lambda: ctx.start_continuable("x", label="l", provider=""),
        "wait []": lambda: ctx.wait([]),  # type: ignore[arg-type]
        "interrupt {}": lambda: ctx.interrupt({}),  # type: ignore[arg-type]
        "interrupt None": lambda: ctx.interrupt(None),  # type: ignore[arg-type]
    }
    lines = []
    for name, call in calls.items():
        try:
            await call()
            lines.append(f"{name}: no error")
        except Exception as exc:  # noqa: BLE001 - what it raised is the answer
            lines.append(f"{name}: {getattr(exc, 'code', type(exc).__name__)}")
    return "\n".join(lines)


async def gives_up_on_a_spawn(ctx: TurnContext) -> str:
    """Waits half a second for a child that sleeps a minute, under a timeout of its own, then returns."""
    import asyncio

    child = json.dumps({"script": [{"say": "up"}, {"sleep": 60_000}, {"return": "slept"}]})
    try:
        await asyncio.wait_for(ctx.spawn(child, provider="script", label="given-up"), 0.5)
    except asyncio.TimeoutError:
        return "gave up"
    return "waited"


async def interrupts_what_it_cannot(ctx: TurnContext) -> str:
    """Interrupts a background one-shot child and an unknown id: what each ``interrupt`` answers."""
    child = await ctx.spawn('{"script": [{"sleep": 200}, {"return": "slept"}]}', provider="script", wait=False)
    assert isinstance(child, str)  # its id, without waiting
    return f"{await ctx.interrupt(child)} {await ctx.interrupt('01NOSUCHCHILD000000000000A')}"


async def returns_bytes(ctx: TurnContext) -> bytes:
    return b"abc"


async def returns_a_dict(ctx: TurnContext) -> dict[str, int]:
    return {"a": 1}


async def yields_its_output(ctx: TurnContext):  # type: ignore[no-untyped-def]
    """An async generator: a program that is no coroutine function, whose call returns the generator."""
    yield "x"


def returns_a_coroutine(ctx) -> object:  # type: ignore[no-untyped-def]
    """A plain ``def`` handing back a coroutine it never awaits."""
    return echo_upper(ctx)


async def sends_what_cannot_be_sent(ctx: TurnContext) -> str:
    """Each request to the supervisor with an argument no message holds: what each raised, one per line, then
    how many children it has (none: nothing was created)."""
    lines = []
    calls = [
        lambda: ctx.spawn(object()),
        lambda: ctx.spawn("hi", wait=False, output_schema={"type": object()}),
        lambda: ctx.start_continuable("hi", label="x", persona=object()),
        lambda: ctx.send_message("01NOSUCHCHILD000000000000A", {1, 2}),
        lambda: ctx.report(object()),
        lambda: ctx.spawn({1: "a"}),
        lambda: ctx.send_message("01NOSUCHCHILD000000000000A", {"a": {(1, 2): "b"}}),
    ]
    for call in calls:
        try:
            await call()
            lines.append("sent")
        except Exception as exc:  # noqa: BLE001 - what it raised is the answer
            lines.append(f"{type(exc).__name__} {getattr(exc, 'code', None)}: {exc}")
    lines.append(str(len(await ctx.list_agents())))
    return "\n".join(lines)


async def leaves_a_task_running(ctx: TurnContext) -> str:
    """Starts a task that would beat forever, writing the time to the file named by the message, and returns
    without awaiting it; the task says in the same file that it was cancelled."""
    import asyncio

    path = ctx.text

    async def beat() -> None:
        try:
            while True:
                with open(path, "a") as f:
                    f.write("beat\n")
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            with open(path, "a") as f:
                f.write("cancelled\n")
            raise

    asyncio.get_running_loop().create_task(beat())
    await asyncio.sleep(0.05)
    return "left it"


async def forks_and_returns(ctx: TurnContext) -> str:
    """Forks; the child tries ``ctx.say``, writes what it raised to the file named by the message, and returns
    (into the worker's code) while the parent returns its own answer."""
    pid = os.fork()
    if pid == 0:
        try:
            await ctx.say("from the fork")
            said = "recorded"
        except Exception as exc:  # noqa: BLE001 - what it raised is the answer
            said = f"{type(exc).__name__} {getattr(exc, 'code', None)}: {exc}"
        with open(ctx.text, "w") as f:
            f.write(said)
        return "the fork's"
    os.waitpid(pid, 0)
    return "the worker's"


def forks_and_returns_blocking(ctx) -> str:  # type: ignore[no-untyped-def]
    """The same from a plain ``def`` (its thread), the child raising instead of returning."""
    pid = os.fork()
    if pid == 0:
        raise RuntimeError("the fork's")
    os.waitpid(pid, 0)
    return "the worker's"


async def logs_a_warning(ctx: TurnContext) -> str:
    """Logs from the turn's task and from a thread it starts: each record should name the child."""
    import logging

    logging.getLogger("tests.program").warning("from the task")
    await anyio.to_thread.run_sync(lambda: logging.getLogger("tests.program").warning("from a thread"))
    return "logged"


async def dies_after_its_commit(ctx: TurnContext) -> str:
    """Says where it runs, returns ``done``; its process is killed (SIGKILL) the moment its closing
    commit is in the log, before the worker can tell the supervisor how the turn ended (Ray tests)."""
    import signal
    import types

    writer = ctx._writer
    append, flush = writer.append, writer.flush
    closed: list[bool] = []

    def append_noting_the_end(self, batch, *, commit=False):  # type: ignore[no-untyped-def]
        closed.extend(kind == "turn/end" for kind, _ in batch)
        return append(batch, commit=commit)

    async def flush_then_die(self) -> None:  # type: ignore[no-untyped-def]
        await flush()
        if any(closed):
            os.kill(os.getpid(), signal.SIGKILL)

    writer.append = types.MethodType(append_noting_the_end, writer)
    writer.flush = types.MethodType(flush_then_die, writer)
    await ctx.say(f"{_where()} {os.getpid()}")
    return "done"


def ignores_its_budget(ctx) -> str:  # type: ignore[no-untyped-def]
    """A plain ``def`` that never looks at the stop flag: it returns after ``ctx.text`` seconds, whatever its budget."""
    time.sleep(float(ctx.text))
    return "finished late"


async def hangs_in_a_tool(ctx: TurnContext) -> str:
    """``hang``: a recorded tool call that never returns (a model's tool waiting on a child, say); else says what it got."""
    if ctx.message == "hang":
        await ctx.recorded_call("wait", {}, lambda: anyio.sleep(3600))
    return f"ran: {ctx.message}"


async def fails_in_a_task_group(ctx: TurnContext) -> str:
    """A failure inside an anyio task group reaches the program's caller as an ``ExceptionGroup``."""
    async def connect() -> None:
        raise OverflowError("connect(): port must be 0-65535.")

    async with anyio.create_task_group() as tg:
        tg.start_soon(connect)
    return "never"


async def descends(ctx: TurnContext) -> str:
    """Delegates to itself ``int(prompt)`` levels deep (waiting at each level); the deepest sleeps until stopped."""
    levels = int(ctx.text)
    if levels == 0:
        await anyio.sleep(3600)
        return "woke"
    await ctx.spawn(str(levels - 1), provider="descends", label=f"level-{levels - 1}")
    return "returned"



async def descends_continuable(ctx: TurnContext) -> str:
    """Starts itself as a continuable child ``int(prompt)`` levels deep, then sleeps until stopped (run it
    with ``turns_per_worker`` above the depth, so that every level's turn is in flight at once)."""
    levels = int(ctx.text)
    if levels:
        await ctx.start_continuable(str(levels - 1), label=f"level-{levels - 1}", provider="descends-continuable")
    await anyio.sleep(3600)
    return "woke"


def stops_what_it_starts(ctx) -> str:  # type: ignore[no-untyped-def]
    """Starts a process by exec (``subprocess``) and one by fork (``multiprocessing``), then stops each with SIGTERM and
    a third with SIGINT; says how each ended (``-15`` / ``-2``: the signal ended it; ``ignored``: it ran on)."""
    import multiprocessing
    import signal
    import subprocess
    import time

    said = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen(["sleep", "30"])
        time.sleep(0.2)
        proc.send_signal(sig)
        try:
            said.append(str(proc.wait(timeout=5)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            said.append("ignored")
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    forked.start()
    time.sleep(0.2)
    forked.terminate()
    forked.join(5)
    if forked.exitcode is None:
        forked.kill()
        forked.join()
        said.append("ignored")
    else:
        said.append(str(forked.exitcode))
    return " ".join(said)


async def names_the_errors_it_catches(ctx: TurnContext) -> str:
    """The classes of the errors its requests raise, and whether the builtin base catches them, with
    nothing of the supervisor's imported here (as a program that imports only ``ctx``'s module)."""
    found = []
    try:
        await ctx.spawn("x", provider="echo", max_depth=0)
    except Exception as exc:  # noqa: BLE001 - what it is, is the finding
        found.append(f"{type(exc).__name__} {getattr(exc, 'attempted_depth', None)}")
    try:
        await ctx.send_message(ctx.session_id, "to myself")
    except PermissionError as exc:
        found.append(f"PermissionError {type(exc).__name__}")
    except Exception as exc:  # noqa: BLE001
        found.append(f"not a PermissionError: {type(exc).__name__}")
    return "\n".join(found)


async def times_itself(ctx: TurnContext) -> str:
    """Its turn's start and end, as ``start end`` (a test of which turns ran at once)."""
    began = time.time()
    await anyio.sleep(0.3)
    return f"{began} {time.time()}"


async def waits_on_two_at_once(ctx: TurnContext) -> str:
    """Two children waited on at once (two waiting calls in flight from one turn); their outputs, in order."""
    outputs: list[str] = ["", ""]

    async def one(index: int) -> None:
        result = await ctx.spawn("time", provider="times-itself", label=f"t{index}", wait=True)
        outputs[index] = result.output

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        tg.start_soon(one, 1)
    return json.dumps(outputs)


async def starts_children_with_a_label_of(ctx: TurnContext) -> str:
    """``{"bytes": n, "provider": p}``: a one-shot and a continuable child of provider ``p`` labelled with ``n``
    bytes; the code each start was refused with (``started`` when it was not), one a line."""
    asked = json.loads(str(ctx.message))
    label, provider = "L" * asked["bytes"], asked["provider"]
    answers: list[str] = []
    for start in (lambda: ctx.spawn("x", provider=provider, label=label, wait=False),
                  lambda: ctx.start_continuable("x", provider=provider, label=label)):
        try:
            await start()
        except SubagentError as exc:
            answers.append(f"{exc.code}: {exc}")
        else:
            answers.append("started")
    return "\n".join(answers)


async def starts_a_process_and_returns(ctx: TurnContext) -> str:
    """Starts ``sleep 30`` (and a grandchild under a shell: ``sh -c 'sleep 30 & wait'``), says both pids, and
    returns with them running."""
    import subprocess

    sleeper = subprocess.Popen(["sleep", "30"])
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    await ctx.say(f"{sleeper.pid} {shell.pid}")
    return "started"


def waits_on_a_process(ctx) -> str:  # type: ignore[no-untyped-def]
    """A plain ``def`` that starts ``sleep 30``, says its pid and waits for it: blocked in ``waitpid``, it never
    sees its turn's cancellation."""
    import subprocess

    sleeper = subprocess.Popen(["sleep", "30"])
    ctx.say(str(sleeper.pid))
    sleeper.wait()
    return "waited"


async def starts_a_process_and_exits(ctx: TurnContext) -> None:
    """Starts ``sleep 30``, says its pid, and ends its worker with ``sys.exit(3)``."""
    import subprocess
    import sys

    sleeper = subprocess.Popen(["sleep", "30"])
    await ctx.say(str(sleeper.pid))
    sys.exit(3)


async def starts_a_process_tree_and_exits(ctx: TurnContext) -> None:
    """Starts ``sh -c 'sleep 30 & wait'``, waits until the shell's ``sleep`` runs, says both pids, and ends its
    worker with ``sys.exit(3)``."""
    import subprocess
    import sys

    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    below: list[str] = []
    for _ in range(500):
        with open(f"/proc/{shell.pid}/task/{shell.pid}/children") as handle:
            below = handle.read().split()
        if below:
            break
        await anyio.sleep(0.01)
    await ctx.say(" ".join([str(shell.pid), *below]))
    sys.exit(3)


async def changes_folder(ctx: TurnContext) -> str:
    """Changes its worker's working folder to the one its message names, and leaves it so."""
    os.chdir(ctx.text)
    return os.getcwd()


async def working_folder(ctx: TurnContext) -> str:
    return os.getcwd()


async def forks_a_lingering_child(ctx: TurnContext) -> str:
    """Forks a child that sleeps 30 s (holding its copies of the worker's descriptors, the pipe among them), says
    ``<worker pid> <child pid>``, then sleeps (cancellable)."""
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    await ctx.say(f"{os.getpid()} {child}")
    await anyio.sleep(3600)
    return "woke"


async def lists_at_a_signal(ctx: TurnContext) -> str:
    """Waits for the file its message names (``<go> <done>``), then asks for its children twelve times at
    once (more requests than the host keeps idle threads for), writes ``<done>`` and says each answer's code."""
    go, done = ctx.text.split()
    with anyio.fail_after(20):
        while not os.path.exists(go):
            await anyio.sleep(0.02)
    answers: list[str] = []

    async def ask() -> None:
        try:
            await ctx.list_agents()
            answers.append("ok")
        except SubagentError as exc:
            answers.append(exc.code)

    async with anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(ask)
    with open(done, "w") as file:
        file.write("done")
    return json.dumps(sorted(set(answers)))
