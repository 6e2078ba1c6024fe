"""Reading the supervisor ⇄ worker pipe: whole pipefuls, split into messages, handed on as they arrive.

Both ends send with ``Connection.send_bytes``'s framing (``worker/protocol.py``
says what a message holds); this module splits the byte stream into messages
(``FrameReader``), frames several messages for one write (``frame``, the
worker's outbox) and keeps a pipe registered with the event loop while it is
served (``serve_pipe``). Used by the worker's loop (``worker/main.py``) and the
supervisor's pool (``supervisor/pool.py``).
"""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Callable

import anyio

__all__ = ["FrameReader", "frame", "serve_pipe"]

_LENGTH = struct.Struct("!i")  # Connection.send_bytes: payload length, or -1 ...
_LONG_LENGTH = struct.Struct("!Q")  # ... then this length, for payloads over 2 GiB


class FrameReader:
    """Splits a ``multiprocess`` Connection's byte stream into messages, a whole pipeful per ``read``.

    ``Connection.recv_bytes`` costs two ``read`` calls per message, and a caller
    that waits for readability before each message also re-registers the pipe
    with the event loop each time. A reader that takes everything already in
    the pipe at once serves a burst of messages (many turns ending together)
    with one wake-up. The framing is Connection's own: a signed 32-bit
    big-endian length (``-1`` then an unsigned 64-bit length for huge
    payloads), then the payload. Use it only on a Connection nothing else reads.
    """

    _CHUNK = 1 << 16

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def read_available(self) -> list[bytes] | None:
        """Read what the pipe holds (call when it is readable); the complete messages, ``None`` at end of file."""
        data = os.read(self._fd, self._CHUNK)
        if not data:
            return None
        buffer = self._buffer
        buffer += data
        messages: list[bytes] = []
        while len(buffer) >= 4:
            (size,) = _LENGTH.unpack_from(buffer, 0)
            start = 4
            if size == -1:
                if len(buffer) < 12:
                    break
                (size,) = _LONG_LENGTH.unpack_from(buffer, 4)
                start = 12
            end = start + size
            if len(buffer) < end:
                break
            messages.append(bytes(buffer[start:end]))
            del buffer[:end]
        return messages



def frame(messages: list[bytes]) -> bytes:
    """``messages`` framed as ``Connection.send_bytes`` frames each one, for one ``write`` of them all."""
    parts: list[bytes] = []
    for payload in messages:
        size = len(payload)
        parts.append(_LENGTH.pack(size) if size <= 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG_LENGTH.pack(size))
        parts.append(payload)
    return b"".join(parts)


async def serve_pipe(fd: int, on_messages: Callable[[list[bytes]], bool]) -> None:
    """Hand every batch of messages arriving on ``fd`` to ``on_messages`` until end of file, or until it returns False.

    ``on_messages`` runs on the event loop, synchronously, as soon as the pipe
    is readable: it must not block (it may start tasks). On asyncio the pipe
    stays registered with the loop the whole time and the read happens in
    the loop's readiness callback: ``anyio.wait_readable`` per message
    registered and unregistered it each time (two ``epoll_ctl`` calls and a
    task wake-up per message, measured about a tenth of a worker's CPU per
    one-shot child). Another event loop gets that ``wait_readable`` loop.
    A read error counts as end of file; an error in ``on_messages`` is raised
    here. Cancelling the caller unregisters the pipe.
    """
    frames = FrameReader(fd)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio): the portable loop
        while True:
            await anyio.wait_readable(fd)
            try:
                batch = frames.read_available()
            except OSError:
                batch = None
            if batch is None or not on_messages(batch):
                return
    finished: asyncio.Future[None] = loop.create_future()
    registered = True

    def unregister() -> None:
        # at once, in the callback that saw the end: the owner may close the pipe before this
        # task resumes, and a new pipe with the same descriptor number must not lose its registration
        nonlocal registered
        if registered:
            registered = False
            loop.remove_reader(fd)

    def readable() -> None:
        try:
            batch = frames.read_available()
        except OSError:
            batch = None
        try:
            more = batch is not None and on_messages(batch)
        except BaseException as exc:  # raised in the serving task, never lost in the loop's handler
            unregister()
            finished.set_exception(exc)
            return
        if not more:
            unregister()
            finished.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await finished
    finally:
        unregister()
