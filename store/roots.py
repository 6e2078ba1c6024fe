"""Top-level sessions: the roots of a store, and their index, for listings that start from nothing.

A root is a session whose header names no ``parent_session``. ``index/roots``
holds framed records ``{seq, id, created_at}`` appended when a root is
created (and ``{seq, id, removed: true}`` when one is deleted), so the newest
roots are read from the end of one file — the last few KiB for a page of 20 —
whatever the number of sessions in the store. Like the children index it is
derived: headers are the authority (a listed root is checked against its
header), ``reindex`` rebuilds it from headers, and a store written before it
existed gets it built from headers by the first root created afterwards;
until then listings scan ``sessions/``. What is not guaranteed: entries are
in append order, which two processes creating roots in the same instant may
swap; the newest-first read sorts what it read by ``(created_at, id)``.
A listing that steps over damaged records reads the headers beside the index
(a scan of every header, until a reindex), as a damaged children index is read:
any root may have been in the damaged bytes, and none may drop out of a listing.
An index that reads clean costs what it always did: the headers are read only then.
Called by the CLI (``ls``, ``tree``, ``summary``, ``gc``) and anyone listing a store.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from .appender import append_durably
from .atomic import NOFOLLOW, write_atomic
from .catalog import ChildStatus, DiagnosticEntry, damage_reason, listed_children
from .errors import CorruptSessionError, SessionNotFoundError, SubagentError, UnavailableSessionError
from .extent import skim_file, skim_path
from .framing import SkimResult, encode_record, scan_suffix
from .ids import is_valid_session_id
from .lease import OwnerCache, session_status
from .index_file import IndexFile, rebuilding
from .log import read_projection
from .outcome import Outcome, outcome_of
from .query_words import DEFAULT_ROOT_LIMIT
from .query import Matcher, Page, check_page, decode_cursor, encode_cursor, paginate, sort_key
from .reader import read_header
from .records import IndexFields, problem_of
from .root import Store

__all__ = [
    "RootEntry", "DEFAULT_ROOT_LIMIT", "list_roots", "find_roots", "subagent_count",
    "add_root", "remove_root", "remove_roots", "compact_roots", "rebuild_roots", "roots_index_path", "indexed_roots",
    "roots_index_problem",
]

# DEFAULT_ROOT_LIMIT, what `ls` shows with no --limit: a screenful, and the cost of a listing stays
# flat as the store grows (each row costs a header, a lease and a projection read)
_FIRST_WINDOW = 16 * 1024  # bytes read from the end of index/roots first (~300 entries)
_MAX_WINDOW = 4 << 20  # past it the whole index is read instead, from its start (``_read_suffix``)
# a root its index has missed this long is no creation in flight (publication to entry takes milliseconds)
UNINDEXED_AFTER_S = 10.0

_problem = problem_of(IndexFields)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RootEntry:
    id: str
    label: str | None
    created_at: float
    status: ChildStatus
    children: int  # direct subagent children, per the index
    outcome: Outcome | None = None  # store/outcome.py; None for a root that never ran a turn
    error_code: str | None = None
    error: str | None = None
    kind: Literal["root"] = "root"


Row = RootEntry | DiagnosticEntry  # a top-level listing's row: a root, or one whose files do not read


def roots_index_path(store: Store) -> str:
    return store.roots_index_path


def subagent_count(store: Store, session_id: str) -> int:
    """Direct subagent children per the index (cheap; the catalog re-checks each header). A damaged
    index is read around as the listings read it, or the count beside a parent would miss the
    children its own listing shows."""
    return sum(1 for e in listed_children(store, session_id) if e.origin == "subagent")


# -- the index -------------------------------------------------------------------------


def _root_headers(store: Store) -> list[tuple[float, str]]:
    found = []
    for session_id in store.session_ids():
        try:
            header = read_header(store, session_id)
        except SubagentError:
            continue  # `store fsck` reports unreadable headers
        if header.parent_session is None:
            found.append((header.created_at, session_id))
    return sorted(found)


def _write_index(store: Store, roots: list[tuple[float, str]]) -> None:
    # the key order of an appended record (appender.py adds ``seq`` last): a rebuilt file equals an appended one
    blob = b"".join(encode_record({"id": sid, "created_at": ts, "seq": i}) for i, (ts, sid) in enumerate(roots))
    write_atomic(roots_index_path(store), blob, durable=store.durability.syncs_at_commit)
    store.index_tails.pop("index/roots", None)


def rebuild_roots(store: Store) -> list[str]:
    """Rewrite ``index/roots`` from headers (``subagents store reindex``); the root ids, oldest first.

    A listed root whose header does not read keeps its entry (as ``reindex`` keeps a damaged
    child's): it stays listed as a diagnostic row until its file is restored or removed."""
    store.require_index_files(store.roots_index_path)
    with rebuilding(_index_file(store)):
        roots = _root_headers(store)
        found = _read_suffix(store, 1 << 62, read_around_empty=False)  # what it lists: no warning to run what runs
        if found is not None:
            headed = {sid for _, sid in roots}
            roots = sorted(roots + [(ts, sid) for ts, sid in found.entries if sid not in headed and _unreadable(store, sid)])
        _write_index(store, roots)
    return [sid for _, sid in roots]


def _unreadable(store: Store, session_id: str) -> bool:
    """Whether the session exists and its header does not read."""
    if not store.exists(session_id):
        return False
    try:
        read_header(store, session_id)
    except SubagentError:
        return True
    return False


def add_root(store: Store, root_id: str, created_at: float) -> None:
    """Index a root just published (its header exists). A store without the index gets it built from headers,
    and so does one whose index does not read whole: appending after damage (or cutting it as a torn
    tail) would leave the roots it hid out of every listing, with nothing left to warn about them."""
    path = roots_index_path(store)
    if not os.path.lexists(path):
        with rebuilding(_index_file(store)) as index:
            if not index.size:  # still empty once locked: nobody built it meanwhile
                _write_index(store, _root_headers(store))  # includes this root: its header is published
                return
    try:
        append_durably(store, path, {"id": root_id, "created_at": created_at}, index=_index_file(store), key="index/roots",
                       owner="roots", what="roots index", check=_problem, refuse_damage=True)
    except CorruptSessionError as exc:
        with rebuilding(_index_file(store)):
            log.warning("index/roots does not read whole (%s): rebuilt from the session headers", exc.reason)
            _write_index(store, _root_headers(store))  # includes this root: its header is published
    except UnavailableSessionError:
        store.require_index_files(path)  # a folder or a link in its place: the store's format, said as such
        raise


def compact_roots(store: Store) -> int | None:
    """Rewrite ``index/roots`` without tombstones and the entries they hide; the entries kept.

    Called after ``gc`` removed roots: its tombstones land at the end of the file, where the
    newest-first listing reads, so without this a page would read past every one of them.
    Under the index's lock (appends wait); one atomic replace. A file with damaged records is
    left alone (``None``): ``store reindex`` rebuilds it from headers.
    """
    path = roots_index_path(store)
    if not os.path.lexists(path):
        return None
    with rebuilding(_index_file(store)):
        try:
            skim = skim_path(path, check=_problem)  # bounded by its records, not the file's apparent size
        except OSError:
            return None
        if skim.skipped or (skim.tail is not None and not skim.records):
            return None
        live = sorted(_live(skim.records))
        _write_index(store, live)
        return len(live)


def remove_root(store: Store, root_id: str) -> None:
    remove_roots(store, [root_id])


def remove_roots(store: Store, root_ids: list[str], *, if_gone: bool = False) -> None:
    """Tombstone ``root_ids`` in one write. ``if_gone``: only those whose header does not exist
    (checked under the index's lock, which ``add_root`` appends under after publishing: a root
    re-created with the same id is never hidden by the tombstone of its predecessor)."""
    path = roots_index_path(store)
    if root_ids and os.path.lexists(path):
        keep = (lambda record: not store.exists(record["id"])) if if_gone else None
        append_durably(store, path, [{"id": sid, "removed": True} for sid in root_ids], index=_index_file(store),
                       key="index/roots", owner="roots", what="roots index", skip_damage=True, keep=keep)


def _index_file(store: Store) -> IndexFile:
    """The roots index, not yet open (``IndexFile``: it is its own lock)."""
    return IndexFile(roots_index_path(store), owner="roots", key="index/roots", tails=store.index_tails)



def _live(records: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """Entries minus tombstones (a tombstone always follows its entry), newest first."""
    removed: set[str] = set()
    seen: dict[str, float] = {}
    for record in reversed(records):
        sid = record["id"]
        if not is_valid_session_id(sid):
            continue
        if record.get("removed"):
            removed.add(sid)
        elif sid not in removed and sid not in seen:
            seen[sid] = float(record.get("created_at", 0.0))
    return sorted(((ts, sid) for sid, ts in seen.items()), reverse=True)


def roots_index_problem(store: Store) -> str | None:
    """What is wrong with ``index/roots``, or ``None``: records it steps over, a file with no readable
    record, or one that cannot be read (``fsck`` and ``check`` report it; ``reindex`` rewrites it)."""
    try:
        skim = skim_path(roots_index_path(store), check=_problem, judge_tail=True)  # bounded by its records
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"index/roots cannot be read ({exc.strerror or exc})"
    if skim.skipped:
        first = skim.skipped[0]
        return f"index/roots: {len(skim.skipped)} damaged range(s) stepped over, the first {first.damage.reason} at byte {first.damage.offset}"
    if not skim.records and skim.tail is not None:
        return f"index/roots holds no readable record ({skim.tail.reason} at byte {skim.tail.offset})"
    return _end_problem(skim)


def indexed_roots(store: Store) -> set[str] | None:
    """The ids ``index/roots`` lists as live (not those its damage may have held: ``check`` and ``fsck``
    name a root it misses); ``None`` when it is absent or holds no readable record (listings then read
    every header).

    What the file lists, not what a listing shows: an index emptied, or left with tombstones alone,
    beside top-level sessions lists none (an empty set), though listings read the headers around it
    (``_unindexed``). ``store check`` and ``fsck`` compare this with the headers: had it been the
    headers' own list, no root would ever be missing from it, and both said clean while every
    listing warned to run ``store reindex``."""
    found = _read_suffix(store, 1 << 62, read_around_empty=False)
    return None if found is None else {sid for _, sid in found.entries}


class _Suffix(NamedTuple):
    """What ``_read_suffix`` read of the index."""

    entries: list[tuple[float, str]]  # live entries, newest first
    whole: bool  # the whole file was read
    damaged: bool = False  # records were stepped over: any root may be missing from ``entries``


def _with_headers(store: Store, found: _Suffix) -> list[tuple[float, str]]:
    """``found``'s entries, newest first, and when its damage may have hidden roots, the roots whose headers
    read that it does not list: a scan of every header, made only then (until a reindex), as a damaged
    children index is read beside the headers that name its parent. (A root whose header does not read
    and whose entry was in the damaged bytes is not found so: ``store reindex`` cannot place it either.)"""
    if not found.damaged:
        return found.entries
    listed = {sid for _, sid in found.entries}
    hidden = [(ts, sid) for ts, sid in _root_headers(store) if sid not in listed]
    return sorted([*found.entries, *hidden], reverse=True) if hidden else found.entries


def _read_suffix(store: Store, size: int, *, read_around_empty: bool = True) -> _Suffix | None:
    """Live entries in the last ``size`` bytes of the index, newest first, whether that was the whole file,
    and whether records were stepped over (``_with_headers`` then reads around them).

    ``None`` when there is no index, it cannot be read, or it holds no readable record at all (logged:
    that is damage, not a torn tail): the caller scans headers. A whole index that lists no root while
    ``sessions/`` holds sessions gives the top-level headers instead (``_unindexed``), unless
    ``read_around_empty`` is false (``indexed_roots``: what the file itself lists).
    """
    try:
        fd = os.open(roots_index_path(store), os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)  # a FIFO in its place: no wait
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _read_around(exc)
    try:
        total = os.fstat(fd).st_size
        # a window past ``_MAX_WINDOW`` is the whole file, read from its start as a log is: bounded by its
        # records. A window of zeros before a stray byte far past them held no record, and grew until it
        # read the whole apparent size in one piece (every ``ls`` of the store paid it)
        start = max(0, total - size) if size <= _MAX_WINDOW else 0
        if start > 0:
            data = os.pread(fd, total - start, start)
        else:
            skim = skim_file(fd, check=_problem, judge_tail=True)
    except OSError as exc:
        return _read_around(exc)
    finally:
        os.close(fd)
    if start > 0:
        records, damaged = scan_suffix(data, check=_problem)
        return _Suffix(_live(records), False, damaged)
    for skipped in skim.skipped:
        log.warning("index/roots: records %d..%d skipped (%s at byte %d); run `subagents store reindex`",
                    skipped.seqs.start, skipped.seqs.stop - 1, skipped.damage.reason, skipped.damage.offset)
    if total and not skim.records:
        # not a torn tail (that leaves the records before it): the file is not an index at all
        damage = skim.tail
        log.warning("index/roots holds no readable record (%s at byte %d); listing from the session headers: "
                    "run `subagents store reindex`", damage.reason if damage else "damage", damage.offset if damage else 0)
        return None
    problem = _end_problem(skim)
    if problem is not None:
        log.warning("%s; listing from the session headers: run `subagents store reindex`", problem)
        return None
    live = _live(skim.records)
    if not live and read_around_empty and store.session_ids():
        return _Suffix(_unindexed(store), True)
    return _Suffix(live, True, bool(skim.skipped))


def _unindexed(store: Store) -> list[tuple[float, str]]:
    """The roots of a store whose whole index lists none while ``sessions/`` holds sessions, newest first.

    Either the first root is between its publication and its entry (milliseconds), or the index was
    emptied or cut behind the store's back: a listing that went by it alone would show an empty
    store. So the headers are read (that costs what a store without the index costs) and, when a root
    the index misses is older than a creation takes, said to be damage: not every root is listed."""
    roots = _root_headers(store)
    stale = [sid for ts, sid in roots if ts < time.time() - UNINDEXED_AFTER_S]
    if stale:
        log.warning("index/roots lists no root while %d top-level session(s) exist (%s, ...); listing from the session headers: "
                    "run `subagents store reindex`", len(stale), stale[0])
    return sorted(roots, reverse=True)


def _end_problem(skim: SkimResult) -> str | None:
    """Damage at the index's end that would drop roots from a listing read as a clean or torn end: a whole
    last record changed since it was written (every append is a committed root). Not found here: an index
    cut at a record boundary, which reads as one that holds fewer roots; ``store check`` names the roots
    it misses. (One emptied, or cut to no live root, is read around by ``_unindexed``.)"""
    tail = skim.tail
    if tail is not None and skim.records and not skim.tail_torn:  # judged by the reader (``skim_file``)
        return f"index/roots: its last record is damaged ({tail.reason} at byte {tail.offset}), no torn tail"
    return None


def _read_around(exc: OSError) -> None:
    """An index the listing reads around (every header instead), said as damage is: a user's listing
    that suddenly scans every session should say why."""
    log.warning("index/roots cannot be read (%s); listing from the session headers: run `subagents store reindex`",
                exc.strerror or exc)


# -- listing -----------------------------------------------------------------------------


def _entry(store: Store, session_id: str, owners: OwnerCache, created_at: float) -> Row | None:
    """The row of one indexed root (``created_at`` per the index); ``None`` when it is gone (a
    rolled-back or deleted root) or its header names a parent (a stale entry ``store check`` reports).
    Never raises: a root whose files do not read is the ``DiagnosticEntry`` a damaged child is — it
    keeps its place (its id and the index's creation time), and has no status: a status beside
    it would read as a session that ran and ended."""
    try:
        header = read_header(store, session_id)
        if header.parent_session is not None:
            return None
        status = session_status(store, session_id, owners)
        verdict = outcome_of(read_projection(store, session_id), held=status != "complete", root=True)
        return RootEntry(session_id, header.label, header.created_at, status, subagent_count(store, session_id),
                         verdict.outcome, verdict.error_code, verdict.error)
    except SessionNotFoundError:
        return None
    except Exception as exc:
        return DiagnosticEntry(session_id, damage_reason(exc, session_id), created_at=created_at)


def list_roots(store: Store, query: Matcher | None = None) -> list[Row]:
    """Every top-level session ``query`` keeps, oldest first."""
    return _rows(store, _read_suffix(store, 1 << 62), query)


def _rows(store: Store, found: _Suffix | None, query: Matcher | None) -> list[Row]:
    """The rows of ``found`` (``_read_suffix`` of the whole index, read around its damage; ``None``: every
    header), oldest first."""
    owners = OwnerCache(store)
    roots = sorted(_with_headers(store, found)) if found is not None else _root_headers(store)
    rows = [r for r in (_entry(store, sid, owners, ts) for ts, sid in roots) if r is not None]
    return [r for r in rows if query is None or query.matches(r)]


def find_roots(
    store: Store, *, query: Matcher | None = None, sort: str = "created", newest_first: bool = True,
    limit: int | None = DEFAULT_ROOT_LIMIT, cursor: str | None = None,
) -> Page[Row]:
    """A page of top-level sessions, with the cursor of the next one.

    Newest first by creation (the default) reads the end of ``index/roots``
    only, growing the window until the page is full: the cost follows the page,
    not the store. Any other order reads every root.
    """
    check_page(query=query, limit=limit, cursor=cursor)
    if sort != "created" or not newest_first or limit is None:
        return paginate(list_roots(store), query=query, sort=sort, reverse=newest_first, limit=limit, cursor=cursor)
    key = sort_key(sort)
    after = decode_cursor(cursor, sort, True) if cursor is not None else None
    owners = OwnerCache(store)
    built: dict[str, Row | None] = {}
    size = _FIRST_WINDOW
    while True:
        found = _read_suffix(store, size)
        if found is not None and found.damaged and not found.whole:
            found = _read_suffix(store, 1 << 62)  # damage in the window: the whole file says what it hides
        if found is None:  # no index yet, or a damaged one: every header
            return paginate(_rows(store, None, None), query=query, sort=sort, reverse=True, limit=limit, cursor=cursor)
        entries, whole = _with_headers(store, found), found.whole
        page: list[Row] = []
        for ts, sid in entries:
            if after is not None and not [ts, sid] < list(after):
                continue
            if sid not in built:
                built[sid] = _entry(store, sid, owners, ts)
            row = built[sid]
            if row is not None and (query is None or query.matches(row)):
                page.append(row)
                if len(page) > limit:
                    break
        if len(page) > limit or whole:
            break
        size *= 4
    page.sort(key=key, reverse=True)
    if len(page) <= limit:
        return Page(page, None)
    return Page(page[:limit], encode_cursor(sort, True, key(page[limit - 1])))
