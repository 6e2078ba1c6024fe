"""Short ids: the shortest unique prefix of a session id, and a prefix typed back.

Ids are 26 characters; tables show each as the shortest prefix (at least
``MIN_PREFIX`` characters) that starts no other session id in the store, and
every verb that takes an id accepts such a prefix back, as git does with
commit hashes. Both read the names under ``sessions/`` once (one ``scandir``),
never a header. Not guaranteed: a prefix unique now may stop being unique
when a later session shares it (ids are time-ordered, so prefixes of recent
sessions grow first); then ``resolve_id`` says it is ambiguous.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from .errors import AmbiguousIdError
from .ids import is_valid_session_id
from .root import Store

__all__ = ["MIN_PREFIX", "short_ids", "resolve_id"]

# 8 characters of a generated id are its creation time to ~0.25 s: short enough for a
# narrow terminal, and sessions made in different quarter-seconds never need more
MIN_PREFIX = 8


def _names(store: Store) -> list[str]:
    try:
        return store.session_ids(any_type=True)  # ``STORE_UNREADABLE`` for a folder that does not list
    except FileNotFoundError:
        return []


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def short_ids(store: Store, ids: Iterable[str]) -> dict[str, str]:
    """Each id → its shortest prefix (≥ ``MIN_PREFIX``) that starts no other session id in the store."""
    names = _names(store)
    out: dict[str, str] = {}
    for session_id in ids:
        i = bisect.bisect_left(names, session_id)
        longest = 0
        for j in (i - 1, i + 1) if i < len(names) and names[i] == session_id else (i - 1, i):
            if 0 <= j < len(names):
                longest = max(longest, _common(session_id, names[j]))
        out[session_id] = session_id[: max(MIN_PREFIX, longest + 1)]
    return out


def resolve_id(store: Store, text: str) -> str:
    """The session id ``text`` names: itself when it exists, else the one id it is a prefix of.

    Generated ids are upper-case base 32, as tables print them; text that
    names no session as typed is matched again without regard to case
    (``01m938e7`` finds ``01M938E7…``), as ULIDs are read case-insensitively.
    Raises ``AmbiguousIdError`` when it starts several ids; an id that starts none is
    returned unchanged (the caller reports ``SESSION_NOT_FOUND`` as for any missing id),
    and so is text that is no valid id (the caller's own check says ``INVALID_SESSION_ID``).
    """
    if not is_valid_session_id(text) or store.exists(text):
        return text
    names = _names(store)
    matches = _starting(names, text)
    if not matches:
        folded = text.lower()
        matches = [name for name in names if name.lower().startswith(folded)]
    if len(matches) > 1:
        raise AmbiguousIdError(text, matches)
    if not matches:
        return text
    return matches[0]


def _starting(names: list[str], text: str) -> list[str]:
    """Every one of the sorted ``names`` that starts with ``text``: a slice found by bisection (the error
    shows five, and says how many there are: it said 6 of 40 when the lookup stopped counting there)."""
    start = bisect.bisect_left(names, text)
    end = start
    while end < len(names) and names[end].startswith(text):
        end += 1
    return names[start:end]
