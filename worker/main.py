"""The worker process: entry point and its loop.

A worker serves one supervisor over one duplex pipe. It announces itself with
``Ready``, then runs every ``RunTurn`` it is sent as a task of its event loop
(several turns may be resident at once: a turn waiting on its children
leaves the process free for them), forwards ``Cancel`` to the turn's control,
and routes ``Reply`` to the RPC that awaits it.

It never outlives its supervisor: end-of-file on the pipe (the supervisor
died, even by ``kill -9``) ends the process at once with ``os._exit`` —
threads still burning CPU for a program die with it.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import os
import threading
from typing import Any

import anyio

from subagents.store.errors import from_wire
from subagents.store.root import Store

from .budget import TurnControl
from .logcontext import FieldsFilter, bind
from .pipe import FrameReader
from .protocol import Cancel, Reply, RunTurn, Rpc, Ready, Shutdown, TurnDone, TurnOutcome, decode, encode

__all__ = ["worker_entry", "WorkerLoop"]

_MAX_STORES = 16

log = logging.getLogger(__name__)


class WorkerLoop:
    """State of one worker process: its pipe, resident turns, RPCs in flight."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self._turns: dict[int, TurnControl] = {}
        self._rpc_ids = itertools.count(1)
        self._replies: dict[int, tuple[anyio.Event, list[Reply]]] = {}
        # open store handles by (root, durability): opening one reads and checks the STORE
        # marker, which every turn would repeat; a handle holds no session state (store/root.py)
        self._stores: dict[tuple[str, str], Store] = {}

    def send(self, message: Any) -> None:
        with self._send_lock:
            self.conn.send_bytes(encode(message))

    async def serve(self) -> None:
        self.send(Ready(pid=os.getpid()))
        frames = FrameReader(self.conn.fileno())
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.wait_readable(self.conn.fileno())
                try:
                    batch = frames.read_available()
                except OSError:
                    batch = None
                if batch is None:
                    os._exit(0)  # the supervisor is gone: never outlive it
                for raw in batch:
                    if not self._received(decode(raw), tg):
                        tg.cancel_scope.cancel()
                        return

    def _received(self, msg: Any, tg: anyio.abc.TaskGroup) -> bool:
        """Act on one message from the supervisor; False for ``Shutdown``."""
        if isinstance(msg, RunTurn):
            control = TurnControl(max_steps=msg.spec.budget.max_steps)
            self._turns[msg.call_id] = control
            tg.start_soon(self._run, msg, control)
        elif isinstance(msg, Cancel):
            control = self._turns.get(msg.call_id)
            if control is not None:
                control.stop("aborted", f"the turn was cancelled ({msg.reason})")
        elif isinstance(msg, Reply):
            waiter = self._replies.get(msg.rpc_id)
            if waiter is not None:
                waiter[1].append(msg)
                waiter[0].set()
        elif isinstance(msg, Shutdown):
            return False
        return True

    async def _run(self, msg: RunTurn, control: TurnControl) -> None:
        from .turn import run_turn

        async def rpc(method: str, args: dict[str, Any]) -> Any:
            return await self.call(msg.call_id, method, args)

        bind(child=msg.spec.session_id, parent=msg.spec.parent_session, epoch=msg.spec.epoch)
        try:
            outcome = await run_turn(msg.spec, control, rpc, store=self._store(msg.spec.store_root, msg.spec.durability))
        except Exception as exc:  # a store failure outside the program: report, never hang the caller
            log.exception("turn failed outside its program", extra={"session": msg.spec.session_id})
            outcome = TurnOutcome(stop_reason="error", diagnostic=f"{type(exc).__name__}: {exc}"[:4000], steps=control.steps)
        finally:
            self._turns.pop(msg.call_id, None)
        self.send(TurnDone(call_id=msg.call_id, outcome=outcome))

    def _store(self, root: str, durability: str) -> Store:
        store = self._stores.get((root, durability))
        if store is None:
            store = Store(root, durability=durability, create=False)
            if len(self._stores) >= _MAX_STORES:
                self._stores.pop(next(iter(self._stores)))  # the oldest: a worker rarely serves several stores
            self._stores[(root, durability)] = store
        return store

    async def call(self, call_id: int, method: str, args: dict[str, Any]) -> Any:
        rpc_id = next(self._rpc_ids)
        event = anyio.Event()
        box: list[Reply] = []
        self._replies[rpc_id] = (event, box)
        try:
            self.send(Rpc(rpc_id=rpc_id, call_id=call_id, method=method, args=args))
            await event.wait()
        finally:
            self._replies.pop(rpc_id, None)
        reply = box[0]
        if not reply.ok:
            raise from_wire(reply.error or {})
        return reply.value


class _Defaults(logging.Filter):
    """Records logged outside any turn still format (``child=- epoch=-``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key in ("child", "epoch"):
            if not hasattr(record, key):
                setattr(record, key, "-")
        return True


def worker_entry(conn: Any, log_level: int = logging.WARNING, inherited: Any = None) -> None:
    """Process target: serve the supervisor on ``conn`` until it goes away.

    ``inherited`` is the supervisor's end of the pipe when the worker was forked
    with it: closed first, so that the supervisor's death reads as end of file.
    """
    if inherited is not None:
        inherited.close()
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s [child=%(child)s epoch=%(epoch)s]")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Defaults())
        handler.addFilter(FieldsFilter())
    try:
        # A fresh context: a forked worker inherits the context of the supervisor task that
        # started it, where anyio (4.16 and later) has marked asyncio as running, and
        # ``anyio.run`` would refuse to start ("Already running asyncio in this thread").
        contextvars.Context().run(anyio.run, WorkerLoop(conn).serve)
    except KeyboardInterrupt:
        pass
    os._exit(0)
