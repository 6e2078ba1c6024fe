"""Reading the supervisor ⇄ worker pipe: whole pipefuls, split into messages.

Both ends send with ``Connection.send_bytes`` (``worker/protocol.py`` says
what a message holds); this module only frames the byte stream.
"""

from __future__ import annotations

import os
import struct

__all__ = ["FrameReader"]

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

