"""The listing options of ``ls``, ``tree``, ``top`` and ``summary``: filters, order, page; and time arguments.

``add_filters`` puts ``--status``, ``--outcome``, ``--label``, ``--since`` and
``--until`` on a verb, ``add_paging`` ``--limit``, ``--sort`` and ``--cursor``;
``query_of`` turns the parsed options into a ``store.Query`` (the library's
catalog calls take the same object). A time is an age back from now
(``90s``, ``15m``, ``3h``, ``7d``, ``2w``: the ages ``gc --older-than`` takes) or an ISO 8601 date or time
(``2026-11-30``, ``2026-11-30T17:00``; UTC unless it names a zone).
"""

from __future__ import annotations

import argparse
import datetime
import time

from typing import TYPE_CHECKING

from subagents.store.errors import InvalidQueryError
from subagents.store.query_words import OUTCOMES, SORTS, STATUSES

from .parser import positive

if TYPE_CHECKING:
    from subagents.store.query import Query

__all__ = ["add_filters", "add_paging", "query_of", "moment"]


def moment(text: str) -> float:
    """A point in time: an age back from now (``3h``) or an ISO 8601 date or time (UTC unless zoned). The ages are
    those of ``gc --older-than`` (``store.retention.age_seconds``): one grammar, not two that disagree."""
    from subagents.store.retention import age_seconds

    try:
        age = age_seconds(text)
    except InvalidQueryError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    if age is not None:
        return time.time() - age
    try:
        parsed = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a duration (3h, 7d) nor an ISO 8601 time (2026-11-30T17:00)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed.timestamp()


def _words(allowed: tuple[str, ...], what: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> list[str]:
        words = [w.strip() for w in text.split(",") if w.strip()]
        bad = [w for w in words if w not in allowed]
        if bad or not words:
            raise argparse.ArgumentTypeError(f"{what} is one of {', '.join(allowed)} (comma-separated), not {text!r}")
        return words
    return parse


def add_filters(parser: argparse.ArgumentParser, *, times: bool = True, statuses: tuple[str, ...] = STATUSES) -> None:
    """``statuses``: those the verb can show (``top`` lists only running and idle sessions: offering
    ``complete`` there made a filter that always printed nothing)."""
    group = parser.add_argument_group("filters (rows must match every one given)")
    group.add_argument("--status", type=_words(statuses, "--status"), action="extend", metavar="S[,S]",
                       help=f"only these statuses: {', '.join(statuses)}")
    group.add_argument("--outcome", type=_words((*OUTCOMES, "none"), "--outcome"), action="extend", metavar="O[,O]",
                       help=f"only these outcomes: {', '.join(OUTCOMES)}, none (no turn finished yet)")
    group.add_argument("--label", metavar="GLOB", help="only labels matching this glob (review-*, *-[0-9])")
    if times:
        group.add_argument("--since", type=moment, metavar="WHEN", help="created at or after WHEN: 3h, 7d, 2026-11-30, 2026-11-30T17:00")
        group.add_argument("--until", type=moment, metavar="WHEN", help="created before WHEN (same forms)")


def add_paging(parser: argparse.ArgumentParser, *, unlimited: str) -> None:
    """``unlimited``: what the verb shows with no ``--limit`` (``ls`` with no PARENT pages 20 roots: its
    help said "default: all")."""
    group = parser.add_argument_group("order and pages")
    group.add_argument("--limit", type=positive, default=None, metavar="N", help=f"at most N rows (default: {unlimited})")
    group.add_argument("--sort", choices=SORTS, default="created", help="order of the rows (default created; ties by time, then id)")
    group.add_argument("--cursor", metavar="C", help="continue after the last page: its next_cursor in --json")


def query_of(args: argparse.Namespace) -> Query:
    from subagents.store.query import Query

    return Query(
        status=frozenset(getattr(args, "status", None) or ()),
        outcome=frozenset(getattr(args, "outcome", None) or ()),
        label=getattr(args, "label", None),
        since=getattr(args, "since", None),
        until=getattr(args, "until", None),
    )
