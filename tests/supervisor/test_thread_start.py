"""A host that cannot start a thread (its process limit, or no memory for a stack) gets a coded error, and
recovers once it can again (found by the resource-limits probe: a start then hung for good, past its deadline).

The store threads are started on demand: a creation's (``creator.py``) at the first start of a child, the
supervisor's store thread (``store_thread.py``) at its first call. A thread that failed to start used to stay
counted as one that would take the queue, so the start that failed raised a bare ``RuntimeError`` and every
later one waited for a thread that never ran. The host runs in a process of its own, whose thread stack size
is set past what the kernel will map (a real ``can't start new thread``), then set back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HOST = r'''
import json, sys, threading, anyio
from subagents import Supervisor, SupervisorConfig, SubagentRequest, SubagentError
from subagents.supervisor import Provider, Capabilities

async def main(store: str) -> None:
    async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="echo", program="echo", capabilities=Capabilities.all()))
        root = await sup.open_root()
        threading.stack_size(1 << 40)  # no thread can be made from here on: the kernel maps no 1 TiB stack
        try:
            await sup.start("echo", SubagentRequest(parent=root, prompt="first", label="a"))
            print(json.dumps({"first": "started"}), flush=True)
        except SubagentError as exc:
            print(json.dumps({"first": exc.code, "text": str(exc)}), flush=True)
        threading.stack_size(0)
        with anyio.fail_after(20):
            run = await sup.start("echo", SubagentRequest(parent=root, prompt="second", label="b"))
            result = await run.result()
        print(json.dumps({"second": result.stop_reason, "output": result.output}), flush=True)

anyio.run(main, sys.argv[1])
'''


def test_a_start_that_cannot_make_a_thread_says_so_and_the_next_one_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", HOST, str(tmp_path / "store")], capture_output=True, text=True, timeout=60)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, (proc.returncode, lines, proc.stderr[-3000:])
    first, second = lines
    assert first["first"] == "THREAD_START_FAILED", (first, proc.stderr[-3000:])
    assert "thread" in first["text"] and "ulimit -u" in first["text"], first
    assert second == {"second": "completed", "output": "second"}, second


OPEN = r'''
import json, sys, threading, anyio
from subagents import Supervisor, SupervisorConfig, SubagentError

async def main(store: str) -> None:
    threading.stack_size(1 << 40)  # the supervisor's first thread cannot be made
    try:
        async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="none")):
            print(json.dumps({"opened": True}), flush=True)
    except SubagentError as exc:
        print(json.dumps({"code": exc.code}), flush=True)

anyio.run(main, sys.argv[1])
'''


def test_a_supervisor_that_cannot_make_its_first_thread_says_so_without_an_exception_group(tmp_path: Path) -> None:
    """``Supervisor.open`` gives the caller the coded error, as it does a worker that cannot start: an
    ``except SubagentError`` around it must see it, not an ``ExceptionGroup`` of one."""
    proc = subprocess.run([sys.executable, "-c", OPEN, str(tmp_path / "store")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [{"code": "THREAD_START_FAILED"}], proc.stderr[-3000:]


CALLS = r'''
import json, sys, threading, anyio
from subagents import Supervisor, SupervisorConfig, SubagentRequest, SubagentError, ContinuableSpec
from subagents.supervisor import Provider, Capabilities, UserAuthority

async def main(store: str) -> None:
    async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="none")) as sup:
        sup.register_provider(Provider(name="echo", program="echo", capabilities=Capabilities.all(), continuable=True))
        root = await sup.open_root()
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="echo", label="c", prompt="hi"))
        await sup.wait_for_message(root, timeout_s=20)
        calls = {
            "open_root": lambda: sup.open_root(),
            "list_children": lambda: sup.list_children(root),
            "list_descendants": lambda: sup.list_descendants(root),
            "followup": lambda: sup.followup(root, child, "again"),
            "send": lambda: sup.send(child, "sent", parent=root),
            "interrupt": lambda: sup.interrupt(child, authority=UserAuthority(parent_session=root.id)),
            "take_messages": lambda: sup.take_messages(root),
            "gc": lambda: sup.gc(older_than_s=10**6),
            "start": lambda: sup.start("echo", SubagentRequest(parent=root, prompt="x", label="a")),
            "start_continuable": lambda: sup.start_continuable(ContinuableSpec(parent=root, provider="echo", label="d", prompt="hi")),
        }
        answers: list[str] = []

        async def call(fn) -> None:
            try:
                await fn()
                answers.append("ok")
            except SubagentError as exc:
                answers.append(exc.code)
            except BaseException as exc:
                answers.append(f"{type(exc).__name__}: {exc}")

        threading.stack_size(1 << 40)  # from here no thread can be made: the kernel maps no 1 TiB stack
        async with anyio.create_task_group() as tg:
            for _ in range(3):  # at once: more than the worker threads anyio keeps idle
                for fn in calls.values():
                    tg.start_soon(call, fn)
        threading.stack_size(0)
        print(json.dumps(answers), flush=True)
        with anyio.fail_after(20):
            print(json.dumps(len(await sup.list_children(root))), flush=True)

anyio.run(main, sys.argv[1])
'''


def test_public_calls_that_cannot_make_a_thread_say_so_with_a_code(tmp_path: Path) -> None:
    """Once open, a public call that needed one of anyio's worker threads for a store call raised the
    interpreter's bare ``RuntimeError: can't start new thread``, which no ``except SubagentError`` sees
    (found by the resource-limits probe). Each now says ``THREAD_START_FAILED``, and the supervisor serves
    the next call once threads can be made again."""
    proc = subprocess.run([sys.executable, "-c", CALLS, str(tmp_path / "store")], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    answers, children = (json.loads(line) for line in proc.stdout.splitlines())
    assert set(answers) <= {"ok", "THREAD_START_FAILED"}, answers
    assert answers.count("THREAD_START_FAILED") >= 3, answers  # the probe's own check: threads were refused
    assert children >= 1
