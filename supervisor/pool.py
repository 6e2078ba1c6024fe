"""The local worker pool: processes, pipes, dispatch, and crash → typed outcome.

``WorkerPool`` implements the ``Pool`` protocol (``supervisor/backend.py``)
with worker processes on this host, one duplex pipe each:

    Supervisor tasks ──run_turn()──▶ queue ──_schedule()──▶ Worker.conn ──▶ worker process
          ▲                                                      │
          └──── TurnDone / Rpc ◀── _reader(worker) ◀─────────────┘
                                     _watch(worker): process sentinel → _crashed()

One owner for the mutable state: ``_reader``, ``_watch`` and the shared
``Dispatcher`` (``dispatch.py``: the queue, the dispatch rule, parking and
cancellation, as the Ray pool has them too) all run on the supervisor's
event loop (never in threads), so the pending tables need no lock. This
module hands turns over the pipe, reads the frames back, and turns a
worker's death into its turns' outcome.

A worker has the host's environment (``os.environ``) as it is when that worker
starts, whatever the start method, as a ``spawn``ed process would: the pool
sends it along with the start arguments, and the worker makes it its own
first. A forkserver's children would otherwise all have the environment the
host had when the forkserver started, at its first supervisor.

A worker death is seen at once (its sentinel becomes readable): every turn
resident on it ends — ``aborted`` if its cancellation was asked for, else
``error`` naming the pid, exit code or signal — and a replacement starts.
If the forkserver dies, every worker's sentinel ends at once though the
workers still run: they go on serving, each watched through its pipe from
then on (its death then reads as an exit whose status was lost), and the
next replacement starts a new forkserver. (A dead worker's pipe stays open too
when a process its program forked holds it: its process is gone, and it is a crash.)
A cancelled turn that ignores cancellation for ``cancel_grace_s`` has its
worker killed (and so do the other turns resident on that worker: they end
``error``; the log of each is repaired by the caller). A worker is killed with
the processes its programs started (``worker/descendants.py``). At close each worker
is told to shut down: it stops its turns as a cancel would, and each reports
its outcome; a worker still running after 2 s is killed, and a turn left
without an outcome ends ``aborted``, marked crashed, so no caller waits on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import multiprocess
import multiprocess.forkserver
import multiprocess.process as mp_process
import multiprocess.resource_tracker

from subagents.store.errors import SubagentError
from subagents.worker.claims import PoolTokens
from subagents.worker.descendants import end_descendants, running
from subagents.worker.errors import ProtocolError, WorkerCrashedError
from subagents.worker.main import worker_entry
from subagents.worker.pipe import serve_pipe
from subagents.worker.protocol import Cancel, CancelRpc, Ready, Reply, Rpc, RunTurn, Shutdown, Started, TurnDone, Withdraw, Withdrawn, decode, encode

from .backend import WorkerRef
from .dispatch import Dispatcher, Turn, WorkerSlot
from .errors import WorkerHandshakeError, WorkerStartError
from .process_hooks import EXIT_GRACE_S, track_pool
from .worker_stops import StopState
from .worker_start import FORKSERVER_DESCRIPTORS, main_module_hidden, replacement_delays, spare_descriptors

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

# imported once by the forkserver, so each worker forks with them loaded; anyio imports its
# asyncio backend lazily on the first ``anyio.run``, which cost every new worker ~30 ms
_PRELOAD = ["subagents.worker.main", "subagents.worker.turn", "subagents.worker.programs", "subagents.store", "jsonschema", "anyio._backends._asyncio"]


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a terminal or a service manager sends a group


def _start_forkserver() -> None:
    """Start the forkserver (if it is not running) with the stop signals blocked from its first instruction.

    A terminal's Ctrl-C or hangup reaches the whole foreground process group, and a service manager
    stops a whole group with SIGTERM; the forkserver ignores SIGINT itself only once it has imported
    the preloaded modules (about a second), and a signal before that killed it: a traceback, and the
    host failed ``WORKER_START_FAILED`` where it should have stopped ``interrupted``. A thread's
    blocked mask is inherited across fork and kept across exec, so the forkserver starts with them
    blocked: one sent meanwhile stays pending in it and never acts (it ignores SIGINT once it runs,
    and its workers ignore all three and unblock them: ``worker/main.py``).

    The host blocks them in this thread only, for the fork and exec. An earlier version ignored them
    process-wide instead (an ignored signal stays ignored across exec too), and the host lost a
    Ctrl-C that came in those milliseconds: 1 run in 4 of the test that sends one as soon as the
    forkserver shows, and the turn then ran its whole course. Blocked in one thread, a signal goes to
    another thread or waits for this one, and reaches the host's handlers either way. The forkserver
    still ends when its host does (its pipe's end closes).
    """
    if threading.current_thread() is not threading.main_thread():  # the host's handlers run there: the Ctrl-C case
        multiprocess.forkserver.ensure_running()
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        # the forkserver's own first step, done here: the tracker blocks SIGINT and SIGTERM for its child
        # the same way, and *unblocks* them on its way out, which would undo ours for the forkserver
        multiprocess.resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        multiprocess.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@dataclass(eq=False)
class _Worker(WorkerSlot):
    host: str
    process: Any
    conn: Any
    drained: anyio.Event = field(default_factory=anyio.Event)  # its pipe was read to the end (or failed)
    watched: anyio.Event = field(default_factory=anyio.Event)  # ``_watch`` no longer waits on its sentinel
    released: bool = False  # its process handle is closed (``_release``)
    orphaned: bool = False  # its forkserver died: its handle knows nothing more of it (``_watch``)
    stops: StopState = field(default_factory=StopState)  # whether it is stopped (``worker_stops.py``)
    # the reader's own scope: shielded from the caller's cancellation, ended by ``aclose`` only
    reading: anyio.CancelScope = field(default_factory=lambda: anyio.CancelScope(shield=True))

    def ref(self) -> WorkerRef:
        return WorkerRef(self.host, self.pid)


class WorkerPool(Dispatcher[_Worker]):
    """``Pool`` over local worker processes (``multiprocess``, started by ``start_method``)."""

    def __init__(
        self, *, size: int, start_method: str, ready_timeout_s: float, cancel_grace_s: float,
        log_level: int = logging.WARNING, log_json: bool = False, turns_per_worker: int = 1, prefetch: int = 0,
    ) -> None:
        super().__init__(size=size, turns_per_worker=turns_per_worker, cancel_grace_s=cancel_grace_s, prefetch=prefetch)
        self._context = multiprocess.get_context(start_method)
        self._start_method = start_method
        if start_method == "forkserver":
            self._context.set_forkserver_preload(_PRELOAD)
        self._ready_timeout_s = ready_timeout_s
        self._log_level = log_level
        self._log_json = log_json
        self._host = socket.gethostname()
        track_pool(self)

    def disown_after_fork(self) -> None:
        """In a forked copy of the host (``process_hooks``): let go of the host's workers and tokens, touching none."""
        self._tokens = None  # the host's folder: the copy's close or exit would remove it
        for worker in self._slots:
            if worker is None:
                continue
            mp_process._children.discard(worker.process)
            try:
                worker.conn.close()
            except OSError:
                pass

    def let_go_at_exit(self) -> None:
        """The interpreter exits with this pool open (``process_hooks``): its workers go now, unasked."""
        workers = [w for w in self._slots if w is not None and not w.released]
        for worker in workers:
            worker.alive = False
            with contextlib.suppress(OSError):
                worker.conn.close()
        deadline = time.monotonic() + EXIT_GRACE_S
        for worker in workers:
            with contextlib.suppress(OSError, ValueError, AssertionError):  # a handle closed or not ours
                worker.process.join(max(0.0, deadline - time.monotonic()))
                if worker.process.exitcode is None:
                    log.warning("worker %s did not exit at its host's exit; killing it", worker.pid)
                    end_descendants(worker.pid, with_it=True)
                    worker.process.join(EXIT_GRACE_S)
            mp_process._children.discard(worker.process)
        self._close_tokens()

    # -- life cycle ------------------------------------------------------------

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start every worker and wait for each READY under the deadline.

        A worker that does not become ready raises ``WorkerStartError`` (or ``WorkerHandshakeError``; the first,
        if several fail alike), not the group the starting tasks were in; the workers already started are the
        caller's to close (``aclose``). The tokens of the turns it hands over are made here (``claims.py``).
        """
        self._tg = tg
        self._tokens = PoolTokens()
        try:
            async with anyio.create_task_group() as starting:
                for index in range(self.size):
                    starting.start_soon(self._start_worker, index)
        except BaseExceptionGroup as group:
            failures, others = group.split(SubagentError)
            if failures is not None and others is None:
                raise _first_leaf(failures) from None
            raise

    async def _start_worker(self, index: int) -> None:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        # under fork the worker inherits our end of its pipe: it must close it, or the end of file
        # that tells it we died (even by kill -9) never comes and it outlives us
        inherited = parent_conn if self._start_method == "fork" else None
        # the host's environment of this moment, which the worker takes for its own: a forkserver's child
        # would have the host's of when the forkserver started (``worker/main.py``: ``_adopt_environment``)
        environ = dict(os.environ)
        first_token = self._tokens.issue() if self._tokens is not None else None  # taken if it sees the pool's tokens
        process = self._context.Process(
            target=worker_entry, args=(child_conn, self._log_level, inherited, self._turns_per_worker, self._log_json, environ, first_token),
            daemon=True,
            name=f"subagents-worker-{index}",
        )
        try:
            if self._start_method == "forkserver":
                _start_forkserver()
                spare_descriptors(FORKSERVER_DESCRIPTORS)
            with main_module_hidden():
                process.start()
        except (OSError, EOFError) as exc:  # the executable failed, or the forkserver died before forking it
            parent_conn.close()
            raise WorkerStartError.not_launched(self._start_method, exc) from exc
        finally:
            child_conn.close()
        try:
            hello = await self._ready(process, parent_conn)
        except BaseException:
            await _discard(process, parent_conn)
            raise
        if self._closing:
            # a replacement that became ready after ``aclose`` listed the workers it shuts down: nobody
            # would shut this one down, and its pipe reader would keep the supervisor open for good. It
            # never took a turn: it goes as one that failed to start does
            await _discard(process, parent_conn)
            return
        tokens = first_token is not None and self._tokens is not None and not self._tokens.revoke(first_token)
        worker = _Worker(index, hello.pid, self._host, process, parent_conn, tokens=tokens)
        self._slots[index] = worker
        self._started += 1
        assert self._tg is not None
        self._tg.start_soon(self._reader, worker)
        self._tg.start_soon(self._watch, worker)
        self._schedule()

    async def _ready(self, process: Any, conn: Any) -> Ready:
        """The worker's first message, under the deadline; ``WorkerStartError`` if it exits or hangs first."""
        with anyio.move_on_after(self._ready_timeout_s):
            await anyio.wait_readable(conn.fileno())
            try:
                hello = decode(conn.recv_bytes())
            except (EOFError, OSError):  # it exited before writing a byte: its exit code says how
                await anyio.to_thread.run_sync(process.join, self._ready_timeout_s)
                raise WorkerStartError.exited(process.pid, process.exitcode) from None
            if not isinstance(hello, Ready):
                raise WorkerHandshakeError(process.pid)
            return hello
        raise WorkerStartError.not_ready(process.pid, self._ready_timeout_s)

    async def aclose(self) -> None:
        """Shut every worker down (killed after 2 s) and end the turns still resident on it.

        The pipe is read until its end of file, so each turn the worker ends at
        shutdown (cancelled, its log closed, its lease released) reports its own
        outcome; a turn left without one (its worker was killed) ends with the
        pool, ``aborted`` and marked crashed, so no caller waits on it forever.
        """
        self._closing = True
        self._abort_queued()
        workers = [worker for worker in self._slots if worker is not None]
        for worker in workers:
            if worker.alive:
                self._send(worker, Shutdown())
        deadline = time.monotonic() + 2.0
        for worker in workers:
            if worker.released:  # it died and could not be replaced: its crash was handled
                continue
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await worker.drained.wait()
            if worker.process.is_alive():
                _kill(worker.process)
            elif worker.orphaned:
                _kill_orphan(worker)
            with anyio.move_on_after(1.0):  # the end of file follows the kill
                await worker.drained.wait()
            await self._stop_reading(worker)  # no answer is left to read
            worker.alive = False
            await anyio.to_thread.run_sync(worker.process.join, 1.0)
            worker.conn.close()
            with anyio.move_on_after(1.0):  # its sentinel became readable at the exit: ``_watch`` returns
                await worker.watched.wait()
            self._release(worker)
            self._end_at_close(worker)
        self._end_shielded()
        self._close_tokens()

    # -- reaching a worker (the dispatcher's hooks) ----------------------------------

    def _hand_over(self, worker: _Worker, turn: Turn) -> bool:
        return self._send(worker, RunTurn(call_id=turn.call_id, spec=turn.spec, node=f"{self._host}:{worker.pid}", queued=turn.queued, token=turn.token))

    def _send_cancel(self, worker: _Worker, turn: Turn, reason: str) -> None:
        self._send(worker, Cancel(call_id=turn.call_id, reason=reason))

    async def _send_reply(self, worker: _Worker, turn: Turn | None, reply: Reply) -> None:
        self._send(worker, reply)

    def _kill_worker(self, worker: _Worker) -> None:
        if worker.orphaned:
            _kill_orphan(worker)
        elif not worker.released:
            _kill(worker.process)

    def _send_withdraw(self, worker: _Worker, turn: Turn) -> None:
        self._send(worker, Withdraw(call_id=turn.call_id))

    def _send(self, worker: _Worker, message: Any) -> bool:
        """Send one message; False if the worker's pipe is closed (it died; its sentinel reports that)."""
        try:
            worker.conn.send_bytes(encode(message))
        except OSError:
            log.warning("worker %s pipe closed while sending", worker.pid)
            return False
        return True

    async def _stop_reading(self, worker: _Worker) -> None:
        """End the pipe's reader and wait until it unregistered the pipe, before anyone closes it.

        The event loop keeps a registration by descriptor number: a pipe closed under it leaves one
        behind that the next pipe opened with that number (a replacement's) inherits, and that pipe
        is then never read.
        """
        worker.reading.cancel()
        with anyio.CancelScope(shield=True):
            await worker.drained.wait()

    def _release(self, worker: _Worker) -> None:
        """Close the handle of a worker whose process has exited and that nothing waits on any more (``_watch`` ended)."""
        if not worker.released and worker.watched.is_set():
            worker.released = _close_process(worker.process)

    def _takes_turns(self, worker: _Worker) -> bool:
        return worker.stops.takes_turns(worker.pid)

    # -- per-worker tasks -------------------------------------------------------

    async def _reader(self, worker: _Worker) -> None:
        """Serve the worker's pipe, registered once (``serve_pipe``); end of file or a read error: the sentinel task handles the death."""

        def received(batch: list[bytes]) -> bool:
            worker.stops.heard()
            for raw in batch:
                try:
                    msg = decode(raw)
                except ProtocolError as exc:
                    # which turn it was for is unknown, and what it sends next cannot be trusted: it is killed,
                    # and its turns end as a dead worker's do (an exception here ended the whole supervisor)
                    log.error("worker %s sent what is no message of the protocol (%s); killing it", worker.pid, exc)
                    self._kill_worker(worker)
                    return False
                self._received(worker, msg)
            return worker.alive

        try:
            # shielded: a caller's deadline around ``Supervisor.open`` cancels the pool's tasks with the body,
            # and a close that then waited for the workers' last answers with nobody reading them waited out
            # its bounds (``cancel_grace_s + 10`` s). The pipe's end of file ends it, or ``aclose``.
            with worker.reading:
                await serve_pipe(worker.conn.fileno(), received)
        finally:
            worker.drained.set()

    def _received(self, worker: _Worker, msg: Any) -> None:
        if isinstance(msg, TurnDone):
            turn = worker.turns.get(msg.call_id)
            if turn is not None:
                self._turn_done(turn, msg.outcome)
        elif isinstance(msg, Started):
            self._turn_started(worker, msg.call_id)
        elif isinstance(msg, Withdrawn):
            self._turn_withdrawn(worker, msg.call_id)
        elif isinstance(msg, Rpc):
            self._serve_rpc_soon(worker, worker.turns.get(msg.call_id), msg)
        elif isinstance(msg, CancelRpc):
            self._cancel_rpc(worker, msg)

    async def _watch(self, worker: _Worker) -> None:
        try:
            await anyio.wait_readable(worker.process.sentinel)
        finally:
            worker.watched.set()
        if self._closing or not worker.alive:
            return
        with anyio.move_on_after(1.0):  # first what it sent before it died (a Started, a TurnDone)
            await worker.drained.wait()
        if not worker.drained.is_set() and running(worker.pid):
            # its sentinel ended, yet it runs and holds its pipe open: what died is the forkserver that
            # reported its exit (the OOM killer, a signal to the process group). It goes on serving; the
            # end of its pipe is the sign of its death from now on
            log.warning("the forkserver died; worker %s goes on, watched through its pipe", worker.pid)
            worker.orphaned = True
            await worker.drained.wait()
        elif not worker.drained.is_set():  # it died, and a process its program forked holds its pipe open
            log.warning("worker %s died; a process it started holds its pipe open", worker.pid)
        if self._closing or not worker.alive:
            return
        worker.alive = False
        await anyio.to_thread.run_sync(worker.process.join, 1.0)
        self._crash_count += 1
        if worker.orphaned:
            crash = WorkerCrashedError(worker.pid, None, cause=_STATUS_LOST)
        else:
            crash = WorkerCrashedError(worker.pid, worker.process.exitcode)
        log.error("%s", crash.message)
        self._end_resident(worker, str(crash))
        await self._stop_reading(worker)
        worker.conn.close()
        self._release(worker)
        await self._replace(worker.index)

    async def _replace(self, index: int) -> None:
        """Start a worker in slot ``index`` again, until one starts or the pool closes (``worker_start.py``)."""
        for delay in replacement_delays():
            if self._closing:
                return
            try:
                await self._start_worker(index)
                return
            except SubagentError as exc:  # WorkerStartError, WorkerHandshakeError
                if self._closing:
                    return
                log.error("worker %d could not be replaced (trying again in %.1f s): %s", index, delay, exc.message)
                if not self._alive():
                    self._fail_queued(f"no worker is running, and none could be started: {exc.message}")
            await anyio.sleep(delay)


_STATUS_LOST = "exited (its exit status was lost with the forkserver that started it)"


def _kill_orphan(worker: _Worker) -> None:
    """Kill a worker whose forkserver died by its pid: its handle counts it as exited, and kills nothing.

    Only while its pipe is still open (it is not drained), so the pid is still its own.
    """
    if not worker.drained.is_set():
        end_descendants(worker.pid, with_it=True)


def _kill(process: Any) -> None:
    """SIGKILL a running worker with the processes its programs started (``worker/descendants.py``): killed
    alone, it left them running for good, since its own way out that ends them is not taken."""
    if process.pid is not None and process.exitcode is None:
        end_descendants(process.pid, with_it=True)


async def _discard(process: Any, conn: Any) -> None:
    """End a worker that never took a turn (it failed to start, or came ready as the pool closed)."""
    conn.close()
    process.kill()
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(process.join, 1.0)
    _close_process(process)


def _close_process(process: Any) -> bool:
    """Close a worker's process handle once it has exited; whether it was closed (one still running is left).

    Its sentinel and (forkserver) start pipe are closed now, not when the
    cyclic GC frees the handle (the pool's tasks and the handle refer to each
    other): 2 descriptors per worker per open supervisor otherwise.
    """
    if process.exitcode is None:
        return False
    process.close()
    return True


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception of a (possibly nested) group that is not itself a group."""
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
