"""Filters, order and pages over listing rows: what ``ls``, ``tree``, ``top`` and the catalog calls take.

A ``Query`` keeps the rows whose status and outcome are among the ones asked
for, whose label matches a glob (``fnmatch``, case-sensitive) and whose
creation time lies in ``[since, until)``. ``paginate`` orders rows by a sort
key (``created``, ``label`` or ``status``; ties broken by creation time, then
id), cuts a page of ``limit`` rows, and returns a cursor: opaque text naming
the last row's key, from which the next call continues. A cursor is only
meaningful with the same sort and direction; any other is refused
(``INVALID_QUERY``). Rows are anything with ``id``, ``status``, ``created_at``
and optionally ``outcome`` and ``label`` (catalog entries, roots, held sessions).
Pure functions: no I/O. Called by the catalog, ``store/roots.py`` and the CLI.
"""

from __future__ import annotations

import base64
import fnmatch
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Protocol, Sequence, TypeVar

from .errors import InvalidQueryError
from .query_words import OUTCOMES, SORTS, STATUSES
from .records import finite_number

__all__ = ["Query", "Matcher", "Page", "SORTS", "STATUSES", "check_page", "check_query", "paginate", "sort_key", "encode_cursor", "decode_cursor"]

T = TypeVar("T")

_STATUS_RANK = {"running": 0, "idle": 1, "complete": 2}
_OUTCOME_WORDS = frozenset(OUTCOMES) | {"none"}  # "none": no outcome yet


def _get(row: Any, name: str) -> Any:
    return row.get(name) if isinstance(row, dict) else getattr(row, name, None)


def _words(name: str, value: Any, example: str) -> frozenset[str]:
    """A filter's words as the frozenset the field holds, from any collection of text (a list, a set).

    A lone string is refused, not taken as one word: it is a collection too, and was read letter by
    letter ("unknown status g, i, n, r, u"), as ``collect``'s ``outcomes`` and ``drain_children``'s ids
    refuse one. Anything else (``None``, a number, a word that is no text) is refused here, as the query
    is built, and not as a bare ``TypeError`` inside the listing that uses it.
    """
    if isinstance(value, (str, bytes)):
        raise InvalidQueryError(f"{name} must be a set of words such as {{{example!r}}}, not the string {value!r}")
    if not isinstance(value, (frozenset, set, list, tuple)):
        raise InvalidQueryError(f"{name} must be a set of words such as {{{example!r}}}, not {type(value).__name__}")
    odd = [word for word in value if not isinstance(word, str)]
    if odd:
        raise InvalidQueryError(f"{name} must hold words (text), not {type(odd[0]).__name__} {odd[0]!r}")
    return frozenset(value)


def _moment(name: str, value: Any) -> None:
    """``since``/``until``: ``None`` or a number of seconds since the epoch. A NaN compares false with
    every time, so ``since=nan`` would have kept every row rather than any it names."""
    if value is None:
        return
    if not finite_number(value):
        raise InvalidQueryError(f"{name} must be None or a time in seconds since the epoch, not {value!r}")


@dataclass(frozen=True)
class Query:
    """Which rows a listing keeps; an empty field keeps every row. Diagnostic rows match only an empty query.

    ``status`` and ``outcome`` take any collection of words (a set, a list, a tuple; kept as a frozenset,
    so a query stays hashable) but never a lone string: write ``{"running"}``, not ``"running"``.
    Every field is checked as the query is built (``INVALID_QUERY``), before any listing reads a byte.
    """

    status: frozenset[str] = field(default_factory=frozenset)
    outcome: frozenset[str] = field(default_factory=frozenset)  # outcome words, or "none"
    label: str | None = None  # a glob: "review-*", "*[0-9]"
    since: float | None = None  # created at or after (seconds since the epoch)
    until: float | None = None  # created before

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _words("status", self.status, "running"))
        object.__setattr__(self, "outcome", _words("outcome", self.outcome, "completed"))
        if self.label is not None and not isinstance(self.label, str):
            raise InvalidQueryError(f"label must be None or a glob (text), not {type(self.label).__name__}")
        _moment("since", self.since)
        _moment("until", self.until)
        bad = sorted(set(self.status) - set(STATUSES))
        if bad:
            raise InvalidQueryError(f"unknown status {', '.join(bad)}; one of {', '.join(STATUSES)}")
        bad = sorted(set(self.outcome) - _OUTCOME_WORDS)
        if bad:
            raise InvalidQueryError(f"unknown outcome {', '.join(bad)}; one of {', '.join(sorted(_OUTCOME_WORDS))}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise InvalidQueryError("--since must be earlier than --until")

    @property
    def empty(self) -> bool:
        return not (self.status or self.outcome or self.label is not None or self.since is not None or self.until is not None)

    def matches(self, row: Any) -> bool:
        if self.empty:
            return True
        if _get(row, "kind") == "diagnostic":
            return False  # a damaged session has no status, outcome, label or time to match
        if self.status and _get(row, "status") not in self.status:
            return False
        if self.outcome and (_get(row, "outcome") or "none") not in self.outcome:
            return False
        if self.label is not None and not fnmatch.fnmatchcase(_get(row, "label") or "", self.label):
            return False
        created = _get(row, "created_at") or 0.0
        if self.since is not None and created < self.since:
            return False
        if self.until is not None and created >= self.until:
            return False
        return True


class Matcher(Protocol):
    """What ``paginate`` and ``find_roots`` keep rows by: a ``Query``, or a test a row's fields cannot
    answer alone (``tree`` with no ROOT keeps a top-level session by the subagents below it)."""

    def matches(self, row: Any) -> bool: ...


@dataclass(frozen=True)
class Page(Generic[T]):
    rows: list[T]
    next_cursor: str | None  # None: this was the last page


def sort_key(sort: str) -> Callable[[Any], tuple[Any, ...]]:
    if sort == "created":
        return lambda r: (_get(r, "created_at") or 0.0, _get(r, "id"))
    if sort == "label":
        return lambda r: (_get(r, "label") or "", _get(r, "created_at") or 0.0, _get(r, "id"))
    if sort == "status":
        return lambda r: (_STATUS_RANK.get(_get(r, "status"), 3), _get(r, "created_at") or 0.0, _get(r, "id"))
    raise InvalidQueryError(f"unknown sort {sort!r}; one of {', '.join(SORTS)}")


def encode_cursor(sort: str, reverse: bool, key: tuple[Any, ...]) -> str:
    raw = json.dumps([sort, reverse, list(key)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# what each sort's key holds (``sort_key``): a cursor's key is compared with rows' keys, so a key of
# other types (a hand-edited cursor) raised a bare TypeError in the comparison
_NUMBER, _TEXT = "number", "text"
_KEY_KINDS = {"created": (_NUMBER, _TEXT), "label": (_TEXT, _NUMBER, _TEXT), "status": (_NUMBER, _NUMBER, _TEXT)}


def _of_kind(value: Any, kind: str) -> bool:
    return finite_number(value) if kind == _NUMBER else isinstance(value, str)


def decode_cursor(cursor: str, sort: str, reverse: bool) -> tuple[Any, ...]:
    shown = repr(cursor[:40]) if isinstance(cursor, str) else f"of type {type(cursor).__name__}"
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        got_sort, got_reverse, key = json.loads(raw)
    except (ValueError, TypeError):
        raise InvalidQueryError(f"the cursor {shown} is not one this program printed") from None
    if got_sort != sort or got_reverse != reverse:
        raise InvalidQueryError("the cursor belongs to a listing with another sort or order: repeat that listing's options")
    kinds = _KEY_KINDS.get(sort, ())
    if not (isinstance(key, list) and len(key) == len(kinds) and all(_of_kind(v, k) for v, k in zip(key, kinds))):
        raise InvalidQueryError(f"the cursor {shown} is not one this program printed")
    return tuple(key)


def check_page(*, query: Any = None, limit: Any = None, cursor: Any = None) -> None:
    """A listing's arguments, checked before it reads a byte, on every path the listing may take
    (``find_roots`` has one that never reaches ``paginate``)."""
    check_query(query)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise InvalidQueryError(f"limit must be a whole number of rows, not {limit!r}")
    if limit is not None and limit < 1:
        raise InvalidQueryError("limit must be at least 1")
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidQueryError(f"the cursor must be the text a listing printed, not {type(cursor).__name__}")


def check_query(query: Any) -> None:
    """``None`` or a ``Matcher``: a dict or a string was taken, and failed only once a row was there to match."""
    if query is not None and not callable(getattr(query, "matches", None)):
        raise InvalidQueryError(f"query must be a Query or None, not {type(query).__name__}")


def paginate(
    rows: Iterable[T], *, query: Matcher | None = None, sort: str = "created", reverse: bool = False,
    limit: int | None = None, cursor: str | None = None,
) -> Page[T]:
    """The rows ``query`` keeps, ordered by ``sort`` (``reverse``: descending), after ``cursor``, at most ``limit``."""
    check_page(query=query, limit=limit, cursor=cursor)
    key = sort_key(sort)
    kept: Sequence[T] = sorted((r for r in rows if query is None or query.matches(r)), key=key, reverse=reverse)
    if cursor is not None:
        after = decode_cursor(cursor, sort, reverse)
        kept = [r for r in kept if (list(key(r)) < list(after) if reverse else list(key(r)) > list(after))]
    if limit is None or len(kept) <= limit:
        return Page(list(kept), None)
    page = list(kept[:limit])
    return Page(page, encode_cursor(sort, reverse, key(page[-1])))
