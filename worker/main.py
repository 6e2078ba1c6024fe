"""The worker process: entry point and its pipe loop.

A worker serves one supervisor over one duplex pipe. It announces itself with
``Ready``, then hands what arrives to its ``TurnRunner`` (``worker/runner.py``):
each ``RunTurn`` runs as a task of its event loop (several turns may be
resident at once: a turn waiting on its children leaves the process free for
them), ``Cancel`` and ``Reply`` go to the runner. This module owns the pipe
(framing, one lock for sends from the loop and from program threads) and the
turns handed over ahead: at most ``turns_per_worker`` turns run at once (a
turn parked in a waiting RPC does not count, as the pool counts them), and a
``RunTurn`` marked ``queued`` beyond that waits here, in order, and starts
the moment a running turn ends or parks, without a round trip to the
supervisor (``Started`` says so first). One still waiting is given back on
``Withdraw`` and ends ``aborted`` on ``Cancel`` or at shutdown, unwritten.
Every turn, before it starts (and a waiting one before it is given back or
ended), has its token taken, if it has one: a token the pool took first means
the pool took the turn back (this worker was stopped), and that copy is
dropped unstarted, unanswered (``claims.py``).

It never outlives its supervisor: the supervisor's end of the pipe closing
(it died, even by ``kill -9``) ends the process at once with ``os._exit`` —
threads still burning CPU for a program die with it. The loop sees that as
end of file; a thread blocked in ``poll`` on the pipe's hang-up sees it too,
so a turn that holds the event loop (a program computing without awaiting)
neither runs on for nobody nor commits its end after its host is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import select
import sys
import threading
from collections import deque
from typing import Any, Coroutine, Mapping, NoReturn

import anyio

from .claims import take
from .descendants import end_descendants
from .forks import worker_started
from .leftovers import untracked
from .logformat import install_logging
from .signals import survive_stop_signals
from .pipe import frame, serve_pipe
from .protocol import Cancel, Ready, Reply, RunTurn, Shutdown, Started, TurnDone, Withdraw, Withdrawn, cancelled_before_start, decode, encode
from .runner import TurnRunner
from .working_folder import back_home, working_folder

__all__ = ["worker_entry", "WorkerLoop"]

log = logging.getLogger(__name__)


class WorkerLoop:
    """The pipe host of a ``TurnRunner``: reads the supervisor's messages, sends the turns' messages.

    Messages sent on the event loop while it serves wait in an outbox until the
    loop's next pass, which writes them all at once: turns that end in the same
    pass (a burst of one-shot children) cost one ``write`` and one wake-up of
    the supervisor instead of one each (the wake-up was about 4% of a worker's
    CPU per child). They are written before the loop waits for anything, and
    before the worker exits at a shutdown. A message sent from another thread
    is written at once, after whatever waits in the outbox (order is kept).
    """

    def __init__(self, conn: Any, *, turns_per_worker: int = 1) -> None:
        self.conn = conn
        self.runner = TurnRunner(on_park=self._parked)
        self._limit = turns_per_worker
        self._active = 0  # turns started and not ended, less those parked in a waiting RPC
        self._waiting: deque[RunTurn] = deque()  # queued turns not started yet, in the order they came
        self._turns: _Turns | None = None
        self._send_lock = threading.Lock()
        self._outbox: list[bytes] = []  # under ``_send_lock``
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop whose passes flush the outbox (asyncio only)
        self._loop_thread = 0
        self._home = working_folder()  # the host's, as the pool started this worker: each turn starts here (``back_home``)

    def send(self, message: Any) -> None:
        data = encode(message)
        with self._send_lock:
            outbox = self._outbox
            outbox.append(data)
            if self._loop is None or threading.get_ident() != self._loop_thread:
                self._write_locked()
            elif len(outbox) == 1:
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        with self._send_lock:
            self._write_locked()

    def _write_locked(self) -> None:
        """Write the outbox (under ``_send_lock``), framed as ``Connection.send_bytes`` frames each message."""
        if not self._outbox:
            return
        blob = frame(self._outbox)
        self._outbox = []
        fd = self.conn.fileno()
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
        except (BrokenPipeError, ConnectionResetError):
            end_worker(0)  # the supervisor is gone (as at end of file): exit quietly, never outlive it

    async def serve(self) -> None:
        self.send(Ready(pid=os.getpid()))
        try:
            self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        except RuntimeError:  # not asyncio: every message is written when it is sent
            pass
        try:
            await self._serve()
        finally:
            self._loop = None
            self._flush()

    async def _serve(self) -> None:
        shutdown = False
        async with anyio.create_task_group() as tg:
            turns = self._turns = _Turns(tg)

            def received(batch: list[bytes]) -> bool:
                nonlocal shutdown
                for raw in batch:
                    if not self._received(decode(raw)):
                        shutdown = True
                        return False
                return True

            await serve_pipe(self.conn.fileno(), received)
            if not shutdown:
                end_worker(0)  # end of file: the supervisor is gone, never outlive it
            while self._waiting:
                msg = self._waiting.popleft()
                if _ours(msg):
                    self._end_unstarted(msg.call_id, "shutdown")
            self.runner.cancel_all("shutdown")
            await turns.wait()

    def _received(self, msg: Any) -> bool:
        """Act on one message from the supervisor; False for ``Shutdown``."""
        if isinstance(msg, RunTurn):
            if self._active < self._limit:
                self._start(msg)
            else:
                self._waiting.append(msg)
        elif isinstance(msg, Cancel):
            if self._take_waiting(msg.call_id):
                self._end_unstarted(msg.call_id, msg.reason)
            else:
                self.runner.cancel(msg)
        elif isinstance(msg, Reply):
            self.runner.reply(msg)
        elif isinstance(msg, Withdraw):
            if self._take_waiting(msg.call_id):
                self.send(Withdrawn(call_id=msg.call_id))
        elif isinstance(msg, Shutdown):
            return False
        return True

    def _start(self, msg: RunTurn) -> None:
        """Start a turn. ``Started`` goes into the outbox before the turn's task exists, so it reaches
        the supervisor before the turn writes anything (the outbox is flushed before the task's first step).
        A turn whose token the pool took back is dropped instead."""
        assert self._turns is not None
        if not _ours(msg):
            return
        self._active += 1
        if msg.queued:
            self.send(Started(call_id=msg.call_id))
        self.runner.admit(msg)
        self._turns.start(self._run(msg))

    def _start_waiting(self) -> None:
        while self._waiting and self._active < self._limit:
            self._start(self._waiting.popleft())

    def _take_waiting(self, call_id: int) -> bool:
        """Remove a queued turn that has not started; False if there is none by that id that is still
        this worker's (a copy the pool took back is dropped: the turn may be here again, as a newer copy)."""
        for msg in [m for m in self._waiting if m.call_id == call_id]:
            self._waiting.remove(msg)
            if _ours(msg):
                return True
        return False

    def _end_unstarted(self, call_id: int, reason: str) -> None:
        self.send(TurnDone(call_id=call_id, outcome=cancelled_before_start(reason)))

    def _parked(self, parked: bool) -> None:
        """The runner's hook: a turn began (True) or ended (False) a waiting RPC; a parked turn frees its slot."""
        self._active += -1 if parked else 1
        if parked:
            self._start_waiting()

    async def _run(self, msg: RunTurn) -> None:
        try:
            try:
                outcome = await self.runner.run(msg, self.send)
            except SystemExit as exc:
                # now, before this turn's slot goes to a turn waiting here: started, it died with the worker
                # (``error``), where a turn handed ahead and never started runs on another worker
                exit_as_asked(exc)
            self.send(TurnDone(call_id=msg.call_id, outcome=outcome))
        finally:
            self._active -= 1
            if not self.runner.resident:
                back_home(self._home)
            self._start_waiting()


class _Turns:
    """The tasks of the turns resident in the worker, members of the serving task group in effect.

    On asyncio each turn is a plain task: an anyio task group's ``start_soon``
    (a handle, a cancel scope and an event per task, since anyio 4.14) cost
    about 12–19 µs of CPU per turn, several percent of a one-shot child's
    worker CPU. What the group gave is kept: a turn that fails (its runner
    turns every failure of a turn into an outcome, so only a bug reaches here)
    fails the group, as a member's failure would, and ``wait`` waits at
    shutdown for the turns still running (the runner has stopped each as a
    cancel would, so each closes its log and reports). Another event loop
    gets the group's own tasks.
    """

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self._tasks: set[asyncio.Task[None]] = set()  # a strong reference to each task while it runs
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def start(self, turn: Coroutine[Any, Any, None]) -> None:
        if self._loop is None:
            self._tg.start_soon(lambda: turn)
            return
        with untracked():  # a turn, never a leftover of the turn whose code started it (worker/leftovers.py)
            task = self._loop.create_task(turn)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        failure = task.exception()

        async def fail() -> None:
            raise failure  # type: ignore[misc]

        try:
            self._tg.start_soon(fail)
        except RuntimeError:  # the group is closing already (shutdown): nothing is left to fail
            log.error("a turn failed during shutdown", exc_info=failure)

    async def wait(self) -> None:
        """Wait until the turns still running end (the group's own tasks: when the group exits)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))


def _exit_at_hangup(fd: int) -> None:
    """Thread body: wait for the pipe's hang-up (the supervisor's end closed), then end the process.

    ``poll`` with no events asked still reports ``POLLHUP`` and ``POLLERR``:
    the thread never reads (the loop owns the pipe's data) and costs nothing
    while it waits. The GIL is the only delay: a program holding it in one
    C call keeps the process until that call returns.
    """
    watcher = select.poll()
    watcher.register(fd, 0)
    watcher.poll()  # without a timeout it returns only with an event (a signal's EINTR is retried: PEP 475)
    end_worker(0)


def _adopt_environment(environ: Mapping[str, str]) -> None:
    """Make this process's environment ``environ``: the host's ``os.environ`` as it was when the pool started this worker.

    A forkserver forks every worker from itself, with the environment the host had when the forkserver
    started (at the first supervisor of the host process): a later supervisor's workers, and a replacement
    started after the host's environment changed, saw that old one, and the ``llm`` program sent its
    requests to an endpoint the host's environment no longer named, with the old model and without a key
    set since. Applied first, every start method gives what ``spawn`` gives. Nothing of the worker's own is
    lost: neither ``multiprocess`` nor the pool sets a variable in a worker (all three start methods give
    the host's environment, no more, no less). Only what differs is changed, through ``os.environ``, so
    C code and the processes a program starts see it too. A variable the C library refuses (a name with
    ``=``, which only a host's own startup environment can hold) is left as it is, not a failed start.
    """
    for name in [name for name in os.environ if name not in environ]:
        with contextlib.suppress(ValueError, OSError):
            del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            with contextlib.suppress(ValueError, OSError):
                os.environ[name] = value


def _ours(msg: RunTurn) -> bool:
    """Whether this worker has the turn: it has no token, or this worker took it before the pool did."""
    return msg.token is None or take(msg.token)


def worker_entry(conn: Any, log_level: int = logging.WARNING, inherited: Any = None, turns_per_worker: int = 1,
                 log_json: bool = False, environ: Mapping[str, str] | None = None, first_token: str | None = None) -> None:
    """Process target: serve the supervisor on ``conn`` until it goes away.

    ``first_token`` is taken before ``Ready``: the pool hands this worker turns with tokens only if it
    could (it sees the pool's tokens: ``claims.py``).

    ``environ`` is the host's environment when the pool started this worker: it
    replaces the worker's own before anything else runs (``_adopt_environment``).
    ``inherited`` is the supervisor's end of the pipe when the worker was forked
    with it: closed first, so that the supervisor's death reads as end of file.
    """
    if environ is not None:
        _adopt_environment(environ)
    if first_token is not None:
        take(first_token)
    worker_started()
    if inherited is not None:
        inherited.close()
    survive_stop_signals()  # a group's Ctrl-C or stop is the supervisor's to act on (``signals.py``)
    # the host's stdout is the host's (``subagents run --json`` prints one document there): what a program
    # prints goes to stderr, where the user still sees it
    try:
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # no real stdout or stderr here (an embedding host): nothing to keep apart
        pass
    threading.Thread(target=_exit_at_hangup, args=(conn.fileno(),), name="subagents-hangup", daemon=True).start()
    install_logging(log_level, as_json=log_json)  # as the host prints: a turn's records name its child, parent and epoch
    try:
        # A fresh context: a forked worker inherits the context of the supervisor task that
        # started it, where anyio (4.16 and later) has marked asyncio as running, and
        # ``anyio.run`` would refuse to start ("Already running asyncio in this thread").
        contextvars.Context().run(anyio.run, WorkerLoop(conn, turns_per_worker=turns_per_worker).serve)
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:
        exit_as_asked(exc)
    end_worker(0)


def end_worker(code: int) -> NoReturn:
    """End this worker process now, and the processes its programs started and left running (``descendants.py``)."""
    end_descendants(os.getpid())
    os._exit(code)


def exit_as_asked(exc: SystemExit) -> NoReturn:
    """A program's ``sys.exit``: the worker ends with its code now, and its host replaces it.

    Left to the interpreter's own exit, a local worker waited for the thread a plain ``def`` program
    ran in, and never ended (nor answered) at all; a Ray actor took it into its event loop and went
    on, with the turn never ending and its slot taken for good. The processes its programs started and
    left running end with it (``end_worker``), on either kind of worker.
    """
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    _flush()
    end_worker(code)


def _flush() -> None:
    """What the worker wrote to its standard streams, out before ``os._exit`` (which flushes nothing)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
