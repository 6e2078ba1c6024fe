"""The size a record's payload packs to, reckoned without encoding its one long text: what a check against
the store's record limit needs before anything is built (a one-shot's prompt: ``supervisor/oneshot.py``).

Framing a record to learn its size held the text's bytes three times over (msgpack's buffer, the payload,
the framed copy: 48 MiB for a 16 MiB prompt), only to be thrown away: the creation frames it again. Here
the record is packed with that text replaced by an empty one (a small envelope), and the text adds its
UTF-8 length plus the header msgpack gives a string of that length (``_STR_HEADERS``). ASCII text costs
nothing more; other text is encoded a slice at a time (``_SLICE`` characters), so no copy of it is whole.
The sum is the very number ``encode_record`` compares with the limit: the same answer, at the same
boundary, in the same words (``tests/supervisor/test_oneshot_prompt_boundary.py``).
"""

from __future__ import annotations

from typing import Any

import msgpack

__all__ = ["payload_size"]

# (the longest string that header holds, its bytes), msgpack's ``use_bin_type=True`` packing (str8 included)
_STR_HEADERS = ((31, 1), (0xFF, 2), (0xFFFF, 3), (0xFFFF_FFFF, 5))
# characters encoded at a time to count a non-ASCII text's UTF-8 bytes: a few MiB at most, held briefly
_SLICE = 1 << 20


def payload_size(record: dict[str, Any], text_at: tuple[str, ...]) -> int | None:
    """The bytes of ``record``'s msgpack payload, with the text at ``text_at`` (a path of keys into nested maps)
    sized without being encoded whole. None when that text has no size msgpack would give (a lone surrogate,
    or over 4 GiB of it): then only encoding the record can say what is wrong with it."""
    text = _at(record, text_at)
    length = _utf8_length(text)
    if length is None:
        return None
    header = next((size for longest, size in _STR_HEADERS if length <= longest), None)
    if header is None:
        return None
    envelope = msgpack.packb(_replaced(record, text_at), use_bin_type=True)
    return len(envelope) - 1 + header + length  # the empty text in the envelope packed to one byte


def _at(record: dict[str, Any], path: tuple[str, ...]) -> str:
    value: Any = record
    for key in path:
        value = value[key]
    if not isinstance(value, str):
        raise TypeError(f"the value at {'/'.join(path)} is {type(value).__name__}, not text")
    return value


def _replaced(record: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``record`` (only the maps along ``path``) with an empty text at ``path``, keys in their order."""
    head, *rest = path
    return {**record, head: _replaced(record[head], tuple(rest)) if rest else ""}


def _utf8_length(text: str) -> int | None:
    """The UTF-8 bytes of ``text`` (read through ``str``'s own methods: a subclass's overrides are not msgpack's
    view of it); None for text UTF-8 cannot encode (a lone surrogate)."""
    characters = str.__len__(text)
    if str.isascii(text):
        return characters
    try:
        return sum(len(str.encode(str.__getitem__(text, slice(i, i + _SLICE)), "utf-8")) for i in range(0, characters, _SLICE))
    except UnicodeEncodeError:
        return None
