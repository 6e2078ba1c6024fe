"""Text the endless views write whole, even when a stop signal lands mid-write.

``log --follow`` (a line per event) and ``top`` refreshing (a compact JSON
list, or the plain table, per refresh) write until a stop signal ends them,
and exit 0. A large write into a full pipe (a reader that lags) blocks; a
stop signal (Ctrl-C, or SIGTERM / SIGHUP, which ``StopSignals`` hands to the
SIGINT handler) that lands then makes ``sys.stdout`` drop the rest of the
write even when the handler returns: the view exited 0 with its last line
cut mid-document, which a ``--json`` consumer cannot parse. ``whole_writer``
writes each text by ``os.write`` on the stream's descriptor and holds the
first stop signal until the text is out, then raises it; a second one while
the text is still blocked quits at once, the text cut, so a reader that
never reads cannot keep the view from ending.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Callable, TextIO

__all__ = ["whole_writer"]


def whole_writer(stream: TextIO) -> Callable[[str], None]:
    """A writer of texts to ``stream`` that puts each one out whole (module docstring: why, and the second
    signal that cuts one). A stream with no descriptor, or a CLI run from a thread (tests), where no signal
    handler can be set, gets a plain write and flush."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd < 0 or threading.current_thread() is not threading.main_thread():
        def plain(text: str) -> None:
            stream.write(text)
            stream.flush()

        return plain
    encoding, errors = getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict"

    def whole(text: str) -> None:
        data = memoryview(text.encode(encoding, errors))
        held: list[int] = []

        def hold(signum: int, frame: FrameType | None) -> None:
            if held:
                raise KeyboardInterrupt
            held.append(signum)

        stream.flush()  # what went out through the stream goes first
        previous = signal.signal(signal.SIGINT, hold)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            signal.signal(signal.SIGINT, previous)
        if held:
            raise KeyboardInterrupt

    return whole
