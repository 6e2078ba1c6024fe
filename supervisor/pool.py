"""The local worker pool: processes, pipes, dispatch, and crash → typed outcome.

``WorkerPool`` implements the ``Pool`` protocol (``supervisor/backend.py``)
with worker processes on this host, one duplex pipe each:

    Supervisor tasks ──run_turn()──▶ queue ──_schedule()──▶ Worker.conn ──▶ worker process
          ▲                                                      │
          └──── TurnDone / Rpc ◀── _reader(worker) ◀─────────────┘
                                     _watch(worker): process sentinel → _crashed()

One owner for the mutable state: ``_schedule``, ``_reader``, ``_watch`` and
``run_turn`` all run on the supervisor's event loop (never in threads), so
the pending tables need no lock.

Dispatch rule: a worker takes a queued turn only when fewer than
``turns_per_worker`` (default 1) of its resident turns are *running*. 1 suits
CPU-bound programs (each gets a core); a program that mostly awaits I/O (an
LLM call) can share a worker with others by raising it. A turn blocked in a waiting RPC (``spawn_wait``,
``wait_run``) is *parked*: it stays resident in its worker's event loop but
no longer counts, so the children it waits for can run in that worker. A
parent waiting on children therefore never holds a worker they need, at any
depth and pool size. When the wait ends the turn resumes where it is, even if
its worker has meanwhile taken another turn (brief oversubscription, never a
deadlock).

A worker death is seen at once (its sentinel becomes readable): every turn
resident on it ends — ``aborted`` if its cancellation was asked for, else
``error`` naming the pid, exit code or signal — and a replacement starts.
A cancelled turn that ignores cancellation for ``cancel_grace_s`` has its
worker killed (and so do the other turns resident on that worker: they end
``error``; the log of each is repaired by the caller).
"""

from __future__ import annotations

import dataclasses
import contextlib
import itertools
import logging
import os
import socket
import sys
import time
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator

import anyio
import multiprocess

from subagents.store.errors import SubagentError
from subagents.worker.errors import WorkerCrashedError, describe_exit
from subagents.worker.main import worker_entry
from subagents.worker.pipe import serve_pipe
from subagents.worker.protocol import BLOCKING_RPCS, Cancel, Ready, Reply, Rpc, RunTurn, Shutdown, TurnDone, TurnOutcome, TurnSpec, decode, encode

from .backend import PoolStatistics, RpcHandler, StartedCallback, TurnResult, TurnTicket, WorkerRef
from .errors import RpcError, SupervisorClosedError, WorkerHandshakeError

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

# imported once by the forkserver, so each worker forks with them loaded; anyio imports its
# asyncio backend lazily on the first ``anyio.run``, which cost every new worker ~30 ms
_PRELOAD = ["subagents.worker.main", "subagents.worker.turn", "subagents.worker.programs", "subagents.store", "jsonschema", "anyio._backends._asyncio"]


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a worker without re-running the host's ``__main__`` in it.

    forkserver/spawn children re-import the parent's main script unless it
    is guarded by ``if __name__ == "__main__"``; workers never need it (they
    load programs by import path, or by dill by value), so the host's script
    is hidden while the process is launched. Runs on the event-loop thread,
    so no other thread sees the swap.
    """
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


@dataclass(eq=False)
class _Turn:
    """One queued or resident turn: the pool's ticket (``TurnTicket``), owned by the pool's tasks."""

    call_id: int
    spec: TurnSpec
    on_rpc: RpcHandler
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: TurnOutcome | None = None
    crashed: bool = False
    worker: "_Worker | None" = None
    parked: int = 0
    cancel_reason: str | None = None
    cancel_sent_at: float | None = None


@dataclass(eq=False)
class _Worker:
    index: int
    process: Any
    conn: Any
    pid: int
    turns: dict[int, _Turn] = field(default_factory=dict)
    alive: bool = True

    @property
    def running(self) -> int:
        return sum(1 for t in self.turns.values() if t.parked == 0)


class WorkerPool:
    """``Pool`` over local worker processes (``multiprocess``, started by ``start_method``)."""

    def __init__(
        self, *, size: int, start_method: str, ready_timeout_s: float, cancel_grace_s: float,
        log_level: int = logging.WARNING, turns_per_worker: int = 1,
    ) -> None:
        self.size = size
        self._turns_per_worker = turns_per_worker
        self._context = multiprocess.get_context(start_method)
        self._start_method = start_method
        if start_method == "forkserver":
            self._context.set_forkserver_preload(_PRELOAD)
        self._ready_timeout_s = ready_timeout_s
        self._cancel_grace_s = cancel_grace_s
        self._log_level = log_level
        self._workers: list[_Worker] = []
        self._queue: deque[_Turn] = deque()
        self._host = socket.gethostname()
        self._call_ids = itertools.count(1)
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._started = 0
        self._crashed = 0

    # -- life cycle ------------------------------------------------------------

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start every worker and wait for each READY under the deadline."""
        self._tg = tg
        with anyio.fail_after(self._ready_timeout_s):
            async with anyio.create_task_group() as starting:
                for index in range(self.size):
                    starting.start_soon(self._start_worker, index)

    async def _start_worker(self, index: int) -> None:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        # under fork the worker inherits our end of its pipe: it must close it, or the end of file
        # that tells it we died (even by kill -9) never comes and it outlives us
        inherited = parent_conn if self._start_method == "fork" else None
        process = self._context.Process(
            target=worker_entry, args=(child_conn, self._log_level, inherited), daemon=True, name=f"subagents-worker-{index}"
        )
        with _main_module_hidden():
            process.start()
        child_conn.close()
        with anyio.fail_after(self._ready_timeout_s):
            await anyio.wait_readable(parent_conn.fileno())
        hello = decode(parent_conn.recv_bytes())
        if not isinstance(hello, Ready):
            raise WorkerHandshakeError(process.pid)
        worker = _Worker(index, process, parent_conn, hello.pid)
        if index < len(self._workers):
            self._workers[index] = worker
        else:
            while len(self._workers) < index:
                self._workers.append(None)  # type: ignore[arg-type]
            self._workers.append(worker)
        self._started += 1
        assert self._tg is not None
        self._tg.start_soon(self._reader, worker)
        self._tg.start_soon(self._watch, worker)
        self._schedule()

    async def aclose(self) -> None:
        self._closing = True
        for handle in list(self._queue):
            self._finish(handle, TurnOutcome(stop_reason="aborted", diagnostic="the supervisor closed before the turn ran"))
        self._queue.clear()
        for worker in self._workers:
            if worker is not None and worker.alive:
                worker.alive = False
                try:
                    worker.conn.send_bytes(encode(Shutdown()))
                except OSError:
                    pass
        deadline = time.monotonic() + 2.0
        for worker in self._workers:
            if worker is None:
                continue
            while worker.process.is_alive() and time.monotonic() < deadline:
                await anyio.sleep(0.01)
            if worker.process.is_alive():
                worker.process.kill()
            await anyio.to_thread.run_sync(worker.process.join, 1.0)
            worker.conn.close()

    # -- turns -------------------------------------------------------------------

    async def run_turn(self, spec: TurnSpec, on_rpc: RpcHandler, *, started: StartedCallback | None = None) -> TurnResult:
        """Queue a turn and wait for how it ended."""
        if self._closing:
            raise SupervisorClosedError()
        handle = _Turn(next(self._call_ids), spec, on_rpc)
        self._queue.append(handle)
        if started is not None:
            started(handle)
        self._schedule()
        await handle.done.wait()
        assert handle.outcome is not None
        worker = None if handle.worker is None else WorkerRef(self._host, handle.worker.pid)
        return TurnResult(handle.outcome, worker, handle.crashed)

    def cancel(self, ticket: TurnTicket, reason: str = "user") -> None:
        """Ask a turn to stop; kill its worker if it ignores that past the grace period."""
        assert isinstance(ticket, _Turn), "a ticket of another pool"
        handle = ticket
        if handle.done.is_set() or handle.cancel_reason is not None:
            return
        handle.cancel_reason = reason
        if handle.worker is None:
            if handle in self._queue:
                self._queue.remove(handle)
            self._finish(handle, TurnOutcome(stop_reason="aborted", diagnostic=f"the turn was cancelled ({reason}) before it started"))
            return
        handle.cancel_sent_at = time.monotonic()
        self._send(handle.worker, Cancel(call_id=handle.call_id, reason=reason))
        assert self._tg is not None
        self._tg.start_soon(self._enforce_cancel, handle)

    async def _enforce_cancel(self, handle: _Turn) -> None:
        with anyio.move_on_after(self._cancel_grace_s):
            await handle.done.wait()
            return
        worker = handle.worker
        if worker is not None and worker.alive and not handle.done.is_set():
            log.warning("turn ignored cancellation for %.1fs; killing worker %s", self._cancel_grace_s, worker.pid)
            worker.process.kill()

    def _finish(self, handle: _Turn, outcome: TurnOutcome, *, crashed: bool = False) -> None:
        if handle.done.is_set():
            return
        handle.outcome, handle.crashed = outcome, crashed
        if handle.worker is not None:
            handle.worker.turns.pop(handle.call_id, None)
        handle.done.set()

    def _schedule(self) -> None:
        for worker in self._workers:
            if not self._queue:
                return
            if worker is None or not worker.alive or worker.running >= self._turns_per_worker:
                continue
            handle = self._queue.popleft()
            if not self._send(worker, RunTurn(call_id=handle.call_id, spec=handle.spec, node=f"{self._host}:{worker.pid}")):
                # the worker died before the pool saw its sentinel: the turn never reached
                # it, so it stays first in line for another worker or the replacement
                self._queue.appendleft(handle)
                continue
            handle.worker = worker
            worker.turns[handle.call_id] = handle

    def _send(self, worker: _Worker, message: Any) -> bool:
        """Send one message; False if the worker's pipe is closed (it died; its sentinel reports that)."""
        try:
            worker.conn.send_bytes(encode(message))
        except OSError:
            log.warning("worker %s pipe closed while sending", worker.pid)
            return False
        return True

    # -- per-worker tasks -------------------------------------------------------

    async def _reader(self, worker: _Worker) -> None:
        """Serve the worker's pipe, registered once (``serve_pipe``); end of file or a read error: the sentinel task handles the death."""

        def received(batch: list[bytes]) -> bool:
            for raw in batch:
                self._received(worker, decode(raw))
            return worker.alive

        await serve_pipe(worker.conn.fileno(), received)

    def _received(self, worker: _Worker, msg: Any) -> None:
        if isinstance(msg, TurnDone):
            handle = worker.turns.get(msg.call_id)
            if handle is not None:
                outcome = msg.outcome
                if handle.cancel_reason is not None and outcome.stop_reason == "completed":
                    outcome = dataclasses.replace(outcome, stop_reason="aborted")
                self._finish(handle, outcome)
                self._schedule()
        elif isinstance(msg, Rpc):
            handle = worker.turns.get(msg.call_id)
            assert self._tg is not None
            self._tg.start_soon(self._serve_rpc, worker, handle, msg)

    async def _serve_rpc(self, worker: _Worker, handle: _Turn | None, msg: Rpc) -> None:
        blocking = msg.method in BLOCKING_RPCS and handle is not None
        if blocking:
            assert handle is not None
            handle.parked += 1
            self._schedule()
        try:
            if handle is None:
                raise RpcError.turn_gone()
            value = await handle.on_rpc(msg.method, msg.args)
            reply = Reply(rpc_id=msg.rpc_id, ok=True, value=value)
        except SubagentError as exc:
            reply = Reply(rpc_id=msg.rpc_id, ok=False, error=exc.to_wire())
        except Exception as exc:  # isolation boundary: a failure serving one request goes back to its turn as an error
            log.exception("rpc %s failed", msg.method)
            reply = Reply(rpc_id=msg.rpc_id, ok=False, error=RpcError.failed(exc).to_wire())
        finally:
            if blocking:
                assert handle is not None
                handle.parked -= 1
        if worker.alive:
            self._send(worker, reply)

    async def _watch(self, worker: _Worker) -> None:
        await anyio.wait_readable(worker.process.sentinel)
        if self._closing or not worker.alive:
            return
        worker.alive = False
        await anyio.to_thread.run_sync(worker.process.join, 1.0)
        self._crashed += 1
        code = worker.process.exitcode
        log.error("worker %s died: %s", worker.pid, describe_exit(code))
        crash = WorkerCrashedError(worker.pid, code)
        for handle in list(worker.turns.values()):
            if handle.cancel_reason is not None:
                outcome = TurnOutcome(stop_reason="aborted", diagnostic=f"the turn was cancelled ({handle.cancel_reason}); {crash}")
            else:
                outcome = TurnOutcome(stop_reason="error", diagnostic=str(crash))
            self._finish(handle, outcome, crashed=True)
        worker.conn.close()
        if not self._closing:
            await self._start_worker(worker.index)

    # -- introspection --------------------------------------------------------------

    def statistics(self) -> PoolStatistics:
        alive = [w for w in self._workers if w is not None and w.alive]
        return PoolStatistics(
            size=self.size,
            workers_alive=len(alive),
            queued=len(self._queue),
            resident=sum(len(w.turns) for w in alive),
            parked=sum(1 for w in alive for t in w.turns.values() if t.parked),
            started=self._started,
            crashed=self._crashed,
        )

    def workers(self) -> list[WorkerRef]:
        return [WorkerRef(self._host, pid) for pid in self.worker_pids()]

    def worker_pids(self) -> list[int]:
        """The live workers' pids (this pool's workers all run on this host)."""
        return [w.pid for w in self._workers if w is not None and w.alive]
