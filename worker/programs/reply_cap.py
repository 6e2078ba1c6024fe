"""How much of a model endpoint's reply the ``llm`` program reads: a byte cap applied as the body arrives.

The HTTP client reads a reply whole into memory before anything looks at its size, so an endpoint that
answered with gigabytes (or a chunked body that streams forever, fast) grew the worker until the machine
killed it, and with it every other turn the worker ran. The cap is applied to the body as it is read, by a
response hook of the client (``capping_hook``) that wraps the response's byte stream:

- a reply (2xx, a redirect) larger than ``reply_limit`` of the store's record limit raises ``ReplyTooLarge``
  and the read stops there: a reply larger than the store can log is no use (its text is one record; JSON
  escapes cost up to twice the bytes, and the envelope, the tool calls' framing, fits in the megabyte on top);
- an error body (4xx, 5xx) is cut at ``ERROR_BODY_BYTES``: only its start is ever quoted.

The cap counts the body as decompressed: a quarter megabyte of gzip is 256 MiB of spaces, which the client
decompressed whole after the cap had passed it. A body in gzip or deflate (the encodings the client asks
for, ``ACCEPT_ENCODING``) is decompressed here, a bounded piece at a time, and the client is told it is
plain; one in another encoding it was not asked for is left to the client, capped as sent.

The hook finds the HTTP layer's stream class from the response it is given (``httpx`` in some releases of
the ``openai`` client, ``httpx2`` in others, with the same public names), so neither is imported here.
"""

from __future__ import annotations

import functools
import sys
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, Awaitable, Callable

__all__ = ["ACCEPT_ENCODING", "ERROR_BODY_BYTES", "Inflater", "ReplyTooLarge", "capping_hook", "reply_limit"]

# the encodings asked for: those this module decompresses itself (another one would be counted only as sent)
ACCEPT_ENCODING = "gzip, deflate"

# how much of an error body is read: a diagnostic quotes its first few hundred characters (an HTML page's title)
ERROR_BODY_BYTES = 16 * 1024
# room for a reply's envelope beyond its escaped text: ids, the finish reason, tool calls' framing
_ENVELOPE_BYTES = 1024 * 1024
# the most a compressed piece of the body decompresses to at a time
_PIECE_BYTES = 64 * 1024
# the window bits of each encoding decompressed here (deflate: zlib's wrapper; raw deflate is tried when it is absent)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


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


class Inflater:
    """Decompresses a gzip or deflate body in pieces of at most ``_PIECE_BYTES``; ``failure`` (the HTTP layer's
    ``DecodingError``) for a body that is not what its ``Content-Encoding`` says, as the client raised it."""

    def __init__(self, encoding: str, failure: type[Exception]) -> None:
        self.encoding = encoding
        self.unpack = zlib.decompressobj(_WBITS[encoding])
        self.failure = failure
        self.started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What ``data``, the next part of the body as sent, decompresses to, a bounded piece at a time (the
        output zlib holds back past a piece's size comes with the next piece, even once the input is taken)."""
        try:
            piece = self._first(data) if not self.started else self.unpack.decompress(data, _PIECE_BYTES)
            self.started = True
            yield piece
            while self.unpack.unconsumed_tail or len(piece) == _PIECE_BYTES:
                piece = self.unpack.decompress(self.unpack.unconsumed_tail, _PIECE_BYTES)
                if not piece:
                    return
                yield piece
        except zlib.error as exc:
            raise self.failure(f"the body is not the {self.encoding} it says it is: {exc}") from None

    def _first(self, data: bytes) -> bytes:
        if self.encoding != "deflate":
            return self.unpack.decompress(data, _PIECE_BYTES)
        try:
            return self.unpack.decompress(data, _PIECE_BYTES)
        except zlib.error:  # deflate without zlib's wrapper, as some servers send it
            self.unpack = zlib.decompressobj(-zlib.MAX_WBITS)
            return self.unpack.decompress(data, _PIECE_BYTES)


class _CappedBody:
    """A response's byte stream that ends (``cut``) or raises ``ReplyTooLarge`` past ``limit`` bytes of body,
    decompressed by ``inflater`` first when it is compressed.

    Mixed into the HTTP layer's own ``AsyncByteStream`` (``_capped_class``): the client refuses any other."""

    def __init__(self, stream: Any, limit: int, *, cut: bool, record_limit: int, inflater: Inflater | None) -> None:
        self.inner = stream
        self.limit = limit
        self.cut = cut
        self.record_limit = record_limit
        self.inflater = inflater

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self.inner.__aiter__()
        read = 0
        try:
            async for chunk in chunks:
                for piece in self.inflater.pieces(chunk) if self.inflater is not None else (chunk,):
                    if read + len(piece) > self.limit:
                        if not self.cut:
                            raise ReplyTooLarge(self.limit, self.record_limit)
                        yield piece[: self.limit - read]
                        return
                    read += len(piece)
                    if piece:
                        yield piece
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
        encoding = response.headers.get("content-encoding", "").strip().lower()
        inflater = None
        if encoding in _WBITS:  # decompressed here, so the client must take the body as it comes
            inflater = Inflater(encoding, layer.DecodingError)
            del response.headers["content-encoding"]
        wrapper = _capped_class(layer.AsyncByteStream)
        response.stream = wrapper(response.stream, ERROR_BODY_BYTES if error else limit, cut=error, record_limit=record_limit,
                                  inflater=inflater)

    return cap
