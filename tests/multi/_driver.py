"""A Supervisor in another process, driven over its stdin/stdout: the multi-process tests' host.

Two halves in one module:

* the **host** (``python -m tests.multi._driver --store S --config JSON``): opens a
  ``Supervisor`` on the shared store (config from ``--config``; the client's
  defaults: one worker, durability ``none``, ``fork``), registers the providers
  ``script``, ``echo`` and ``gated`` (all continuable) and ``returns-mid-start``, prints a
  ``ready`` event, then serves one JSON command per stdin line, each as its own
  task (a slow ``followup`` never blocks a listing). It answers every command
  with one ``{"reply": id, "ok": ..., "value" | "error": ...}`` line and may
  print ``{"event": name, ...}`` lines at any time (the ``chaos`` workload
  does). End of file on stdin closes the supervisor gracefully, so a dead test
  never leaves a host behind.
* the **client** (``Driver``): starts a host with ``MULTI_TEST_HOST_TAG`` set to
  a fresh tag in its environment (inherited by its forkserver and workers, so
  the test can find every process of that host in the process table with
  ``tagged_pids``), sends commands (``call`` / ``acall``), waits for events, and
  kills, stops or resumes it (``kill``, ``stop``, ``cont``).

Commands (``args`` in brackets; prompts given as maps or lists are sent as JSON):
``info``; ``open_root [label, id]``; ``start_continuable [parent, prompt, label,
provider]``; ``followup [parent, child, prompt]``; ``start [parent, prompt, label,
provider, wait]``; ``interrupt [child, parent, wait_s]``; ``dispose [child]``; ``list_children [parent]``;
``list_descendants [root]``; ``activations``; ``drain [root]``; ``take_messages [root]``;
``burst [parent, count, concurrency, barrier]`` (one-shot children, started once
the ``barrier`` file exists); ``chaos [...]`` (the stress workload, see
``_chaos``); ``exit``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = str(Path(__file__).resolve().parents[2])
TAG_VARIABLE = "MULTI_TEST_HOST_TAG"  # not SUBAGENTS_*: the CLI refuses unknown names of its own prefix
READY_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0

__all__ = ["Driver", "DriverError", "HostFactory", "S", "gated", "tagged_pids", "gone", "wait_gone", "poll", "REPO_ROOT"]


def S(*actions: dict[str, Any]) -> str:
    """A ``script`` program message."""
    return json.dumps({"script": list(actions)})


# -- a program the hosts run -------------------------------------------------------------

GATE_DEADLINE_S = 60.0


class _Segment:
    """The turn's context with another message: runs one stretch of a gated script."""

    def __init__(self, ctx: Any, actions: list[dict[str, Any]]) -> None:
        self._ctx = ctx
        self.message = {"script": actions}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


async def gated(ctx: Any) -> str:
    """``script`` plus ``{"gate": path}``: wait until that file exists (the test opens the gate).

    A turn woken by a settlement notice or a report answers ``noted <kind>``
    (notices are prose, not scripts). Lets a test hold a turn running, or a
    parent waiting on its child, for exactly as long as it needs to look.
    """
    import anyio

    from subagents.worker.programs.script import parse_script, script

    kind = (ctx.spec.message_source or {}).get("kind")
    if kind in ("subagent-settled", "subagent-report"):
        return f"noted {kind}"
    actions = parse_script(ctx.message)
    output = ""
    segment: list[dict[str, Any]] = []
    for action in [*actions, None]:
        if action is not None and "gate" not in action:
            segment.append(action)
            if "return" in action:
                break
            continue
        if segment:
            output = await script(_Segment(ctx, segment))  # type: ignore[arg-type]
            segment = []
        if action is not None:
            with anyio.fail_after(GATE_DEADLINE_S):
                while not os.path.exists(action["gate"]):
                    await anyio.sleep(0.005)
    if segment:
        output = await script(_Segment(ctx, segment))  # type: ignore[arg-type]
    return output if isinstance(output, str) else str(output)


# the child starts ``returns_mid_start`` left unanswered: held so the event loop keeps running them
_STARTS_IN_FLIGHT: set[Any] = set()


async def returns_mid_start(ctx: Any) -> str:
    """Waits until the file its message names exists, asks for an ``echo`` child and returns without
    waiting for the answer.

    The turn commits ``completed`` with that start in flight, so its worker
    leaves the lease to the supervisor, which releases it only once it has
    answered the start: a test that stops the host meanwhile holds a child
    whose log says its one turn ended while a live supervisor still holds it.
    """
    import asyncio

    import anyio

    with anyio.fail_after(GATE_DEADLINE_S):
        while not os.path.exists(ctx.text):
            await anyio.sleep(0.005)
    start = asyncio.get_running_loop().create_task(ctx.spawn("late", provider="echo", wait=False))
    _STARTS_IN_FLIGHT.add(start)
    start.add_done_callback(_STARTS_IN_FLIGHT.discard)
    await anyio.sleep(0.05)  # the start request leaves before the turn ends
    return "done"


# -- the process table ------------------------------------------------------------------


def _state(pid: int) -> bytes | None:
    """``pid``'s state letter in ``/proc`` (``R``, ``S``, ``T``, ``Z``...); ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[0]


def gone(pid: int) -> bool:
    """True once ``pid`` runs nothing (a zombie counts as gone)."""
    return _state(pid) in (None, b"Z")


def tagged_pids(tag: str) -> list[int]:
    """Every running (non-zombie) process whose environment carries ``MULTI_TEST_HOST_TAG=tag``."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if needle in environ.split(b"\0") and not gone(int(name)):
            found.append(int(name))
    return sorted(found)


def wait_gone(tag: str, *, timeout: float = 10.0) -> float:
    """Poll the process table until no process of ``tag`` runs; the seconds it took. Raises on timeout."""
    t0 = time.monotonic()
    while True:
        left = tagged_pids(tag)
        if not left:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"processes of {tag} still run after {timeout}s: {left} ({_describe(left)})")
        time.sleep(0.005)


def _describe(pids: list[int]) -> str:
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                names.append(handle.read().replace(b"\0", b" ").decode(errors="replace")[:80])
        except OSError:
            names.append("?")
    return "; ".join(names)


# -- the client -------------------------------------------------------------------------


class DriverError(Exception):
    """Raised when a host answered a command with an error (``code`` is the SubagentError code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Driver:
    """One host process. ``call`` may be used from several threads at once (replies are matched by id)."""

    def __init__(
        self,
        store: str | os.PathLike[str],
        *,
        config: dict[str, Any] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        name: str = "host",
        new_session: bool = True,
    ) -> None:
        self.store = os.fspath(store)
        self.name = name
        self.tag = f"{name}-{uuid.uuid4().hex}"
        self.config = {"pool_size": 1, "durability": "none", "start_method": "fork", **(config or {})}
        self.log_path = os.fspath(log_path) if log_path is not None else os.devnull
        env = {**os.environ, TAG_VARIABLE: self.tag}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.multi._driver", "--store", self.store, "--config", json.dumps(self.config)],
            cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=new_session,
        )
        self.pid = self.proc.pid
        self._ids = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._events: list[dict[str, Any]] = []
        self._events_changed = threading.Condition(self._lock)
        self._eof = False
        self._reader = threading.Thread(target=self._read, name=f"driver-{name}", daemon=True)
        self._reader.start()
        ready = self.wait_event(lambda e: e["event"] == "ready", timeout=READY_TIMEOUT_S)
        self.owner: str = ready["owner"]
        self.workers: list[int] = ready["workers"]

    # -- pipes ----------------------------------------------------------------

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue  # a stray print of a program: not protocol
            with self._lock:
                if "reply" in msg:
                    box = self._replies.get(msg["reply"])
                    if box is not None:
                        box.put(msg)
                else:
                    self._events.append(msg)
                    self._events_changed.notify_all()
        with self._lock:
            self._eof = True
            for box in self._replies.values():
                box.put({"ok": False, "error": {"code": "HOST_GONE", "message": f"{self.name} exited"}})
            self._events_changed.notify_all()

    def send(self, op: str, **args: Any) -> int:
        """Send a command without waiting; returns its id (for ``reply``)."""
        call_id = next(self._ids)
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            if self._eof:
                raise DriverError("HOST_GONE", f"{self.name} exited")
            self._replies[call_id] = box
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"id": call_id, "op": op, "args": args}) + "\n").encode())
        self.proc.stdin.flush()
        return call_id

    def reply(self, call_id: int, *, timeout: float = CALL_TIMEOUT_S) -> Any:
        box = self._replies[call_id]
        try:
            msg = box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} did not answer command {call_id} within {timeout}s") from None
        finally:
            with self._lock:
                self._replies.pop(call_id, None)
        if not msg["ok"]:
            raise DriverError(msg["error"]["code"], msg["error"]["message"])
        return msg.get("value")

    def call(self, op: str, *, timeout: float = CALL_TIMEOUT_S, **args: Any) -> Any:
        return self.reply(self.send(op, **args), timeout=timeout)

    async def acall(self, op: str, *, timeout: float = CALL_TIMEOUT_S, **args: Any) -> Any:
        import anyio

        return await anyio.to_thread.run_sync(lambda: self.call(op, timeout=timeout, **args))

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if name is None or e["event"] == name]

    def wait_event(self, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._lock:
            seen = 0
            while True:
                for event in self._events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self._events)
                left = deadline - time.monotonic()
                if self._eof:
                    raise DriverError("HOST_GONE", f"{self.name} exited before the event came ({self.stderr_tail()})")
                if left <= 0:
                    raise TimeoutError(f"{self.name}: no matching event within {timeout}s")
                self._events_changed.wait(left)

    def stderr_tail(self, limit: int = 2000) -> str:
        if self.log_path == os.devnull:
            return "stderr not captured"
        self._log.flush()
        return Path(self.log_path).read_text(errors="replace")[-limit:]

    # -- life -----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL the host (not its workers: they must notice on their own) and reap it.

        Returns ``time.monotonic()`` at the kill.
        """
        at = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close_pipes()
        return at

    def stop(self, *, group: bool = True) -> None:
        """SIGSTOP the host (with ``group``: its whole process group, workers included: a paused host)."""
        if group:
            os.killpg(self.pid, signal.SIGSTOP)
        else:
            os.kill(self.pid, signal.SIGSTOP)

    def stop_outside_locks(self, *paths: str | os.PathLike[str], group: bool = True, attempts: int = 100) -> None:
        """``stop`` at a moment when none of ``paths`` (store files) is ``flock``'d.

        A pause that lands inside a store critical section (say between an append's write, which
        readers already see, and its unlock) keeps that lock until SIGCONT, and a taker then waits
        ``LOCK_TIMEOUT_S`` and fails with ``LockTimeoutError``: that is how a lock-based store meets
        a frozen holder, not what a test of leases and fencing looks at. So: stop, look, and on a
        held lock resume and stop again a little later.
        """
        from tests.store._support import flocked

        for _ in range(attempts):
            self.stop(group=group)
            self._wait_stopped(tagged_pids(self.tag) if group else [self.pid])
            if not any(flocked(path) for path in paths):
                return
            self.cont(group=group)
            time.sleep(random.uniform(0.001, 0.01))
        raise AssertionError(f"{self.name} held a lock on one of {paths} at each of {attempts} stops")

    @staticmethod
    def _wait_stopped(pids: list[int], timeout: float = 10.0) -> None:
        """Until each of ``pids`` is stopped (state ``T`` in ``/proc``): a SIGSTOP is delivered after
        ``kill`` returns, and a lock probed before that could be taken right after the probe."""
        deadline = time.monotonic() + timeout
        for pid in pids:
            while (state := _state(pid)) not in (None, b"T", b"t", b"Z", b"X"):  # stopped, or gone: holds no lock
                if time.monotonic() > deadline:
                    raise AssertionError(f"process {pid} did not stop within {timeout}s (state {state!r})")
                time.sleep(0.001)

    def cont(self, *, group: bool = True) -> None:
        if group:
            os.killpg(self.pid, signal.SIGCONT)
        else:
            os.kill(self.pid, signal.SIGCONT)

    def close(self, *, timeout: float = 20.0) -> int:
        """Ask the host to close gracefully (end of its stdin); kill it past ``timeout``."""
        if self.proc.poll() is None:
            try:
                self.cont(group=True)
            except ProcessLookupError:
                pass
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._close_pipes()
        return self.proc.returncode

    def _close_pipes(self) -> None:
        # the host has ended: let the reader see the end of its output before the file goes away
        # (closing it under a read in progress raises in the reader); a worker that still holds
        # the pipe open keeps the reader blocked, so the wait is bounded
        self._reader.join(timeout=2)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        self._log.close()

    def reap_leftovers(self) -> list[int]:
        """SIGKILL any process of this host still running (test cleanup); returns what it found."""
        left = tagged_pids(self.tag)
        for pid in left:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


class HostFactory:
    """Hosts of one test: started on demand, every one killed and its processes gone at teardown."""

    def __init__(self, base: str | os.PathLike[str]) -> None:
        self.base = Path(base)
        self.hosts: list[Driver] = []

    def start(self, store: str | os.PathLike[str], *, name: str | None = None, **config: Any) -> Driver:
        name = name or f"host{len(self.hosts)}"
        host = Driver(store, config=config, log_path=self.base / f"{name}.log", name=name)
        self.hosts.append(host)
        return host

    def cleanup(self) -> list[int]:
        """Kill what still runs; the pids that had to be killed after their host was gone (orphans)."""
        orphans: list[int] = []
        for host in self.hosts:
            if host.alive:
                try:
                    host.cont()
                except ProcessLookupError:
                    pass
                host.kill()
            try:
                wait_gone(host.tag, timeout=5.0)
            except AssertionError:
                orphans += host.reap_leftovers()
        return orphans


# -- the host ---------------------------------------------------------------------------


def _text(prompt: Any) -> Any:
    return json.dumps(prompt) if isinstance(prompt, (dict, list)) else prompt


def _row(entry: Any) -> dict[str, Any]:
    return dataclasses.asdict(entry)


class _Host:
    """The host side: one method per command, each run as its own task of ``tg``."""

    def __init__(self, sup: Any, tg: Any, done: Any) -> None:
        self.sup = sup
        self.tg = tg
        self.done = done  # set by ``exit`` or end of file on stdin: the supervisor then closes
        self.runs: dict[str, Any] = {}  # one-shot runs started with wait=False, until ``dispose``

    def emit(self, doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    async def handle(self, call_id: int, op: str, args: dict[str, Any]) -> None:
        from subagents.store.errors import SubagentError

        try:
            method = getattr(self, f"op_{op}", None)
            if method is None:
                raise SubagentError(f"unknown driver op {op!r}", code="DRIVER_OP")
            value = await method(**args)
            self.emit({"reply": call_id, "ok": True, "value": value})
        except SubagentError as exc:
            self.emit({"reply": call_id, "ok": False, "error": {"code": exc.code, "message": str(exc)}})
        except Exception as exc:  # reported to the test as data: the host keeps serving
            logging.getLogger("driver").exception("op %s failed", op)
            self.emit({"reply": call_id, "ok": False, "error": {"code": "DRIVER_ERROR", "message": f"{type(exc).__name__}: {exc}"}})

    # -- ops ------------------------------------------------------------------

    async def op_info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "owner": self.sup.lease_keeper.owner_id,
            "workers": self.sup.pool.worker_pids(),
            "ttl": self.sup.lease_keeper.ttl_s,
            "heartbeats": self.sup.lease_keeper.statistics().heartbeats,
        }

    async def op_open_root(self, label: str | None = None, id: str | None = None) -> str:
        return (await self.sup.open_root(label=label, id=id)).id

    async def op_start_continuable(self, parent: str, prompt: Any, label: str = "child", provider: str = "script") -> list[str]:
        from subagents.supervisor import ContinuableSpec

        child, message = await self.sup.start_continuable(ContinuableSpec(parent=parent, provider=provider, prompt=_text(prompt), label=label))
        return [child, message]

    async def op_followup(self, parent: str, child: str, prompt: Any) -> str:
        return await self.sup.followup(parent, child, _text(prompt))

    async def op_start(self, parent: str, prompt: Any, label: str | None = None, provider: str = "echo", wait: bool = True) -> dict[str, Any]:
        from subagents.supervisor import SubagentRequest

        run = await self.sup.start(provider, SubagentRequest(parent=parent, prompt=_text(prompt), label=label))
        if not wait:
            self.runs[run.id] = run
            return {"child": run.id}
        result = await run.result()
        await run.dispose()
        return {"child": run.id, "stop_reason": result.stop_reason, "output": result.output}

    async def op_interrupt(self, child: str, parent: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A user interrupt from this host (``UserAuthority``): the ``InterruptResult`` as a map."""
        from subagents.supervisor import UserAuthority

        result = await self.sup.interrupt(child, authority=UserAuthority(parent_session=parent), wait_s=wait_s)
        return result.model_dump()

    async def op_dispose(self, child: str) -> None:
        run = self.runs.pop(child)
        await run.dispose()

    async def op_list_children(self, parent: str) -> list[dict[str, Any]]:
        return [_row(e) for e in await self.sup.list_children(parent)]

    async def op_list_descendants(self, root: str) -> list[dict[str, Any]]:
        rows = await self.sup.list_descendants(root)
        return [{**_row(r.entry), "parent_id": r.parent_id, "depth": r.depth} for r in rows]

    async def op_activations(self) -> dict[str, Any]:
        return {
            cid: {"epoch": act.epoch, "state": act.lease_state.value, "parent": act.parent_id}
            for cid, act in self.sup.continuation.activations.items()
        }

    async def op_drain(self, root: str) -> None:
        await self.sup.drain([root])

    async def op_take_messages(self, root: str) -> list[dict[str, Any]]:
        return [{"id": m.id, "source": m.source, "content": m.content} for m in await self.sup.take_messages(root)]

    async def op_burst(self, parent: str, count: int, concurrency: int = 8, barrier: str | None = None, provider: str = "echo") -> list[str]:
        """``count`` one-shot children of ``parent`` (start, result, dispose), at most ``concurrency`` at once."""
        import anyio

        from subagents.supervisor import SubagentRequest

        if barrier is not None:
            with anyio.fail_after(READY_TIMEOUT_S):
                while not os.path.exists(barrier):
                    await anyio.sleep(0.001)
        made: list[str] = []
        limit = anyio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with limit:
                run = await self.sup.start(provider, SubagentRequest(parent=parent, prompt=f"burst {i}", label=f"b{i}"))
                made.append(run.id)
                result = await run.result()
                await run.dispose()
                if result.stop_reason != "completed":
                    raise RuntimeError(f"burst child {run.id} ended {result.stop_reason}: {result.diagnostic}")

        async with anyio.create_task_group() as tg:
            for i in range(count):
                tg.start_soon(one, i)
        return made

    async def op_chaos(
        self,
        roots: list[str],
        children: list[list[str]],
        new_roots: int = 1,
        max_children: int = 4,
        steps: int = 20,
        lanes: int = 2,
        seed: int = 0,
        max_sleep_ms: int = 40,
    ) -> str:
        """Start the stress workload in the background; it prints events and ends with ``chaos-done``.

        Takes over ``roots`` (``open_root(id=...)``), opens ``new_roots`` more, and
        runs ``lanes`` concurrent loops of ``steps`` random actions over them: start
        a continuable child (up to ``max_children`` per root), follow up a known
        child (cold-resuming it when nobody hosts it), or run a one-shot child.
        Events: ``root``, ``child`` (root, child), ``accepted`` (child, message,
        only once the message is durably accepted), ``oneshot`` (root, child), and
        ``refused`` (what was not accepted, with the error code).
        """
        self.tg.start_soon(self._chaos, roots, children, new_roots, max_children, steps, lanes, seed, max_sleep_ms)
        return "started"

    async def _chaos(self, roots: list[str], children: list[list[str]], new_roots: int, max_children: int, steps: int,
                     lanes: int, seed: int, max_sleep_ms: int) -> None:
        import anyio

        from subagents.store.errors import SubagentError
        from subagents.supervisor import ContinuableSpec, SubagentRequest

        rng = random.Random(seed)
        held: list[str] = []
        for root_id in roots:
            held.append((await self.sup.open_root(id=root_id)).id)
            self.emit({"event": "root", "root": root_id, "taken_over": True})
        for _ in range(new_roots):
            root = await self.sup.open_root(label="chaos")
            held.append(root.id)
            self.emit({"event": "root", "root": root.id, "taken_over": False})
        kids: dict[str, list[str]] = {r: [] for r in held}
        for root_id, child_id in children:
            if root_id in kids:
                kids[root_id].append(child_id)
        tags = iter(range(1 << 30))

        def turn() -> str:
            tag = f"{seed}-{next(tags)}"
            actions: list[dict[str, Any]] = [{"sleep": rng.randint(0, max_sleep_ms)}, {"say": tag}]
            if rng.random() < 0.15:
                actions.append({"spawn": {"prompt": f"grandchild of {tag}", "provider": "echo", "label": "g"}})
            actions.append({"return": tag})
            return S(*actions)

        async def lane(lane_no: int) -> None:
            for _ in range(steps):
                root_id = rng.choice(held)
                roll = rng.random()
                try:
                    if roll < 0.3 and len(kids[root_id]) < max_children:
                        child, message = await self.sup.start_continuable(
                            ContinuableSpec(parent=root_id, provider="script", prompt=turn(), label=f"c{lane_no}")
                        )
                        kids[root_id].append(child)
                        self.emit({"event": "child", "root": root_id, "child": child})
                        self.emit({"event": "accepted", "child": child, "message": message})
                    elif roll < 0.85 and kids[root_id]:
                        child = rng.choice(kids[root_id])
                        message = await self.sup.followup(root_id, child, turn())
                        self.emit({"event": "accepted", "child": child, "message": message})
                    else:
                        run = await self.sup.start("echo", SubagentRequest(parent=root_id, prompt=f"one-shot {lane_no}", label="o"))
                        self.emit({"event": "oneshot", "root": root_id, "child": run.id})
                        await run.result()
                        await run.dispose()
                except SubagentError as exc:
                    # e.g. NOT_RESUMABLE while a previous holder's lease is still live: nothing accepted
                    self.emit({"event": "refused", "code": exc.code, "message": str(exc)})
                await anyio.sleep(rng.uniform(0, max_sleep_ms / 2000.0))

        async with anyio.create_task_group() as tg:
            for lane_no in range(lanes):
                tg.start_soon(lane, lane_no)
        self.emit({"event": "chaos-done"})

    async def op_exit(self) -> None:
        self.done.set()


async def _serve(store: str, config: dict[str, Any]) -> None:
    import anyio

    from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig

    caps = Capabilities.all()
    async with Supervisor.open(store=store, config=SupervisorConfig(**config)) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="echo", program="echo", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="gated", program="tests.multi._driver:gated", capabilities=caps, continuable=True))
        sup.register_provider(Provider(name="returns-mid-start", program="tests.multi._driver:returns_mid_start", capabilities=caps))
        async with anyio.create_task_group() as tg:
            host = _Host(sup, tg, anyio.Event())
            host.emit({"event": "ready", "pid": os.getpid(), "owner": sup.lease_keeper.owner_id, "workers": sup.pool.worker_pids()})
            async def commands() -> None:
                # wait_readable + os.read, not a reading thread: cancelling this task never blocks
                fd = sys.stdin.fileno()
                buffer = b""
                while True:
                    await anyio.wait_readable(fd)
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            msg = json.loads(line)
                            tg.start_soon(host.handle, msg["id"], msg["op"], msg.get("args") or {})
                host.done.set()  # end of file: the test is done with us (or dead)

            tg.start_soon(commands)
            await host.done.wait()
            tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    import anyio

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--config", default="{}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s pid=%(process)d: %(message)s")
    anyio.run(_serve, args.store, json.loads(args.config))


if __name__ == "__main__":
    main()


async def poll(predicate: Any, *, timeout: float = 20.0, what: str = "condition") -> Any:
    """Wait until ``predicate()`` is truthy (and return it) under a deadline: a hang fails."""
    import anyio

    with anyio.fail_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await anyio.sleep(0.005)
