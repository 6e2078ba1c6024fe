"""How much of a model endpoint's reply the ``llm`` program reads: a byte cap applied as the body arrives.

The HTTP client reads a reply whole into memory before anything looks at its size, so an endpoint that
answered with gigabytes (or a chunked body that streams forever, fast) grew the worker until the machine
killed it, and with it every other turn the worker ran. The cap is applied to the raw body as it is read,
by a response hook of the client (``capping_hook``) that wraps the response's byte stream:

- a reply (2xx, a redirect) larger than ``reply_limit`` of the store's record limit raises ``ReplyTooLarge``
  and the read stops there: a reply larger than the store can log is no use (its text is one record; JSON
  escapes cost up to twice the bytes, and the envelope, the tool calls' framing, fits in the megabyte on top);
- an error body (4xx, 5xx) is cut at ``ERROR_BODY_BYTES``: only its start is ever quoted.

The hook finds the HTTP layer's stream class from the response it is given (``httpx`` in some releases of
the ``openai`` client, ``httpx2`` in others, with the same public names), so neither is imported here.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Awaitable, Callable

__all__ = ["ERROR_BODY_BYTES", "ReplyTooLarge", "capping_hook", "reply_limit"]

# how much of an error body is read: a diagnostic quotes its first few hundred characters (an HTML page's title)
ERROR_BODY_BYTES = 16 * 1024
# room for a reply's envelope beyond its escaped text: ids, the finish reason, tool calls' framing
_ENVELOPE_BYTES = 1024 * 1024


def reply_limit(record_limit: int) -> int:
    """The largest reply read from an endpoint for a store whose records hold ``record_limit`` bytes: twice
    that (a text escaped in JSON, ``\\n`` or ``\\"`` for one byte, ``\\u00e9`` for two) and a megabyte."""
    return 2 * record_limit + _ENVELOPE_BYTES


class ReplyTooLarge(Exception):
    """The endpoint's reply ran past ``limit`` bytes; its read was stopped there (not retried: the same
    request gets the same reply)."""

    def __init__(self, limit: int, record_limit: int) -> None:
        super().__init__(f"a reply of more than {limit} bytes")
        self.limit = limit
        self.record_limit = record_limit


class _CappedBody:
    """A response's byte stream that ends (``cut``) or raises ``ReplyTooLarge`` past ``limit`` bytes.

    Mixed into the HTTP layer's own ``AsyncByteStream`` (``_capped_class``): the client refuses any other."""

    def __init__(self, stream: Any, limit: int, *, cut: bool, record_limit: int) -> None:
        self.inner = stream
        self.limit = limit
        self.cut = cut
        self.record_limit = record_limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self.inner.__aiter__()
        read = 0
        try:
            async for chunk in chunks:
                if read + len(chunk) > self.limit:
                    if not self.cut:
                        raise ReplyTooLarge(self.limit, self.record_limit)
                    yield chunk[: self.limit - read]
                    return
                read += len(chunk)
                yield chunk
        finally:
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def elapsed(self) -> Any:
        """The wrapped stream's (the client reads a response's ``elapsed`` from its stream)."""
        return getattr(self.inner, "elapsed", None)


@functools.cache
def _capped_class(base: type) -> type:
    """``_CappedBody`` as a ``base`` (the HTTP layer's ``AsyncByteStream``), made once per HTTP layer."""
    return type("CappedBody", (_CappedBody, base), {})


def capping_hook(record_limit: int) -> Callable[[Any], Awaitable[None]]:
    """A response hook (``event_hooks={"response": [...]}``) that caps the body of every response at
    ``reply_limit(record_limit)`` bytes, an error's at ``ERROR_BODY_BYTES``; it runs before the client reads the body."""
    limit = reply_limit(record_limit)

    async def cap(response: Any) -> None:
        layer = sys.modules[type(response).__module__.partition(".")[0]]
        error = response.status_code >= 400
        wrapper = _capped_class(layer.AsyncByteStream)
        response.stream = wrapper(response.stream, ERROR_BODY_BYTES if error else limit, cut=error, record_limit=record_limit)

    return cap
