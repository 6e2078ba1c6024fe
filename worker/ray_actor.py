"""The worker side on a Ray cluster: the worker actor and its transport to the store service.

Imported only when a supervisor runs with ``pool = "ray"`` (it imports Ray).
``SubagentWorker`` is a plain class the supervisor wraps with ``ray.remote``
(``supervisor/ray_pool.py``); each instance is one async actor hosting a
``TurnRunner``, as a worker process hosts one behind its pipe:

    run_turn(RunTurn bytes)  a streaming generator: yields the turn's ``Rpc``
                             frames as it makes them, then its ``TurnDone``
                             (msgpack, exactly as on the local pipe)
    reply(Reply bytes)       the supervisor's answer to an ``Rpc``
    cancel(call_id, reason)  cooperative cancellation (``TurnControl.stop``)
    watch()                  never returns: the pool's death sentinel

Async actors may run calls in any order, so a ``cancel`` can overtake the
``run_turn`` it is about: it is kept and applied when that turn arrives.
The turn's appends go to the store's host through the store service
(``worker/service_writer.py``); ``service_transport`` makes that a Ray call.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from typing import Any, AsyncIterator

import ray

from subagents.store.framing import MAX_RECORD_BYTES

from .logcontext import FieldsFilter
from .logformat import install_logging
from .main import exit_as_asked
from .forks import worker_started
from .protocol import Cancel, CancelRpc, Reply, Rpc, RunTurn, TurnDone, TurnOutcome, decode, encode
from .runner import TurnRunner
from .working_folder import back_home, working_folder
from .service_writer import ServiceCall, ServiceSessions
from .store_service import decode_reply, encode_request

__all__ = ["SubagentWorker", "service_transport", "SERVICE_CALL_TIMEOUT_S"]

log = logging.getLogger(__name__)

# a store call that takes longer is a store host in trouble: the turn fails (its
# writer breaks) instead of hanging; fsyncs take milliseconds
SERVICE_CALL_TIMEOUT_S = 60.0
# cancels kept for turns not arrived yet; a cancel for a turn that already ended is kept
# too (the actor cannot tell the two apart), so the oldest are dropped past this many
_EARLY_CANCELS = 1024


def service_transport(handle: Any) -> ServiceCall:
    """A blocking ``ServiceCall`` over the store service's actor handle (for the writer's sender thread)."""

    def call(method: str, **kwargs: Any) -> dict[str, Any]:
        return decode_reply(ray.get(handle.call.remote(encode_request(method, kwargs)), timeout=SERVICE_CALL_TIMEOUT_S))

    return call


class SubagentWorker:
    """One worker on a cluster node: the turns resident in this actor's process."""

    def __init__(self, service: Any, log_level: int = logging.WARNING, log_json: bool = False, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        worker_started()
        if logging.getLogger().handlers:  # Ray's own: kept as they print, with the child's fields added
            for handler in logging.getLogger().handlers:
                handler.addFilter(FieldsFilter())
        else:
            install_logging(log_level, as_json=log_json)
        sessions = ServiceSessions(service_transport(service), max_record_bytes=max_record_bytes)
        context = ray.get_runtime_context()
        self._where = {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}
        # a program this node cannot import is named with the node, in the log as in the result, so the
        # operator (and the listings) know where to install it
        hint = f" (on Ray node {self._where['node_id']} at {self._where['ip']}: install the program on every node, or ship it with runtime_env)"
        self._runner = TurnRunner(sessions_for=lambda spec: sessions, load_hint=hint)
        self._resident: set[int] = set()
        self._early_cancels: OrderedDict[int, str] = OrderedDict()
        self._home = working_folder()  # as Ray started this actor: each turn starts here (``back_home``)

    async def ready(self) -> dict[str, Any]:
        """Where this worker runs: node id, node address, pid."""
        return dict(self._where)

    async def watch(self) -> None:
        """Never returns: the supervisor keeps one call pending, and the actor's death fails it."""
        await asyncio.Event().wait()

    async def cancel(self, call_id: int, reason: str) -> None:
        if call_id in self._resident:
            self._runner.cancel(Cancel(call_id=call_id, reason=reason))
            return
        self._early_cancels[call_id] = reason
        while len(self._early_cancels) > _EARLY_CANCELS:
            self._early_cancels.popitem(last=False)

    async def reply(self, raw: bytes) -> None:
        msg = decode(raw)
        assert isinstance(msg, Reply)
        self._runner.reply(msg)

    async def run_turn(self, raw: bytes) -> AsyncIterator[bytes]:
        msg = decode(raw)
        assert isinstance(msg, RunTurn)
        self._resident.add(msg.call_id)
        self._runner.admit(msg)
        early = self._early_cancels.pop(msg.call_id, None)
        if early is not None:
            self._runner.cancel(Cancel(call_id=msg.call_id, reason=early))
        frames: asyncio.Queue[bytes] = asyncio.Queue()

        def send(request: Rpc | CancelRpc) -> None:
            frames.put_nowait(encode(request))

        turn = asyncio.ensure_future(self._run(msg, send))
        try:
            while not turn.done():
                frame = asyncio.ensure_future(frames.get())
                await asyncio.wait({turn, frame}, return_when=asyncio.FIRST_COMPLETED)
                if frame.done():
                    yield frame.result()
                else:
                    frame.cancel()
            while not frames.empty():
                yield frames.get_nowait()
            outcome = turn.result()
        finally:
            if not turn.done():  # the stream was closed under us: the turn ends with it
                turn.cancel()
            self._resident.discard(msg.call_id)
        yield encode(TurnDone(call_id=msg.call_id, outcome=outcome))

    async def _run(self, msg: RunTurn, send: Any) -> TurnOutcome:
        """The turn, whose program's ``sys.exit`` ends this actor's process as it ends a local worker: Ray
        reports the actor's death, the turn ends ``error`` and a new actor takes its slot."""
        try:
            return await self._runner.run(msg, send)
        except SystemExit as exc:
            exit_as_asked(exc)
        finally:
            if not self._runner.resident:
                back_home(self._home)
