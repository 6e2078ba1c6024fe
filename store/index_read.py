"""The read side of a children index (``index/children/<parent-id>``, FORMAT.md §9): its records
folded into entries, one ``IndexEntry`` per live child.

Apart from ``store/index.py``, which writes the index and rebuilds it from headers (and so reads
identities, and through them logs), so that a reader of logs can ask a child's index row where its
committed records end (``store/committed.py``) without importing the log module back.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from .atomic import NOFOLLOW
from .extent import skim_path
from .framing import scan_clean
from .ids import is_valid_session_id
from .records import index_problem
from .root import Store

__all__ = [
    "Settled", "SettledFields", "IndexEntry", "IndexRow", "IndexFold", "IndexRead", "Listed", "MARK", "entry_of", "fold_on",
    "read_index", "read_clean_rows", "read_children",
]


@dataclass(frozen=True)
class Settled:
    """A ``settled`` state record: the child's row as it stood when its lease was released."""

    outcome: str | None  # store/outcome.py, with ``held=False``
    error_code: str | None
    error: str | None
    last_at: float  # ``ts`` of the last record of its log then (its last activity)
    # whether its own index listed a subagent child then (a settled child gains none until it is
    # active again); None: a record without the field, the listing reads the child's index
    has_children: bool | None = None
    # the file offset where its log's records ended then: a file shorter than that lost committed
    # records behind the store's back, and its listing reads the file instead of the row.
    # None: a record without the field (the listing then only needs a file that can hold a header)
    end: int | None = None
    # the file's ``st_mtime_ns`` once the release had written it (its lease): a file whose time
    # differs was written since, and its listing reads it instead of the row (a written file need
    # not be damaged: its files then say what the child is). None: a record without the field
    mtime_ns: int | None = None

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"outcome": self.outcome, "last_at": self.last_at}
        if self.has_children is not None:
            record["has_children"] = self.has_children
        if self.end is not None:
            record["end"] = self.end
        if self.mtime_ns is not None:
            record["mtime_ns"] = self.mtime_ns
        if self.error_code is not None:
            record["error_code"] = self.error_code
        if self.error is not None:
            record["error"] = self.error
        return record


@dataclass(frozen=True)
class IndexEntry:
    id: str
    created_at: float
    origin: str | None
    mode: str | None = None  # the row's static fields, when the creation record carries them
    label: str | None = None
    settled: Settled | None = None  # set when the child's latest state record is ``settled``
    # the ``end`` of its latest ``settled`` record, kept while it is active again: nothing cuts a log's
    # committed records, so they still reach that far (``store/committed.py``)
    committed_end: int | None = None

    def creation_record(self) -> dict[str, Any]:
        """The entry record (without ``seq``); ``mode``/``label`` only when known (``label`` only when set)."""
        record: dict[str, Any] = {"id": self.id, "created_at": self.created_at, "origin": self.origin}
        if self.mode is not None:
            record["mode"] = self.mode
            if self.label is not None:
                record["label"] = self.label
        return record


@dataclass(frozen=True)
class Listed:
    """What a fold without rows keeps of a listed child's creation record: whether its origin is
    ``subagent`` and its mode (None: not recorded). What a drain asks of the children it names (do
    they exist under this parent, continuable or one-shot), answered from a kept fold
    (``store/committed.py``) without decoding the whole index again. One shared object per value
    (``_listed``): a child costs its table slot, nothing more."""

    subagent: bool
    mode: str | None


_LISTED = {(subagent, mode): Listed(subagent, mode) for subagent in (False, True) for mode in (None, "one-shot", "continuable")}


def _listed(record: dict[str, Any]) -> Listed:
    """The shared ``Listed`` of a creation record (a checked record's mode is one of those: ``records.index_problem``)."""
    return _shared_listed(record.get("origin"), record.get("mode"))


def _shared_listed(origin: str | None, mode: str | None) -> Listed:
    subagent = origin == "subagent"
    return _LISTED.get((subagent, mode)) or Listed(subagent, mode)


@dataclass(frozen=True)
class IndexRead:
    """One read of a parent's index file: its live entries and what was wrong with it."""

    entries: list[IndexEntry]
    problems: list[str]  # each a skipped record or an unreadable file; non-empty → run reindex

    @property
    def needs_reindex(self) -> bool:
        return bool(self.problems)


def read_index(store: Store, parent_id: str) -> IndexRead:
    """Live entries in (created_at, id) order and the problems met; read-only, never raises for damage.

    A file that reads clean is folded as it is read (``read_clean_rows``). Anything else (damage, a
    record in flight, no regular file) is read the careful way, which reads past damage and says what
    it met."""
    rows = read_clean_rows(store, parent_id)
    if rows is not None:
        return IndexRead([entry_of(row) for row in rows], [])
    path = store.children_index_path(parent_id)
    try:
        skim = skim_path(path, check=index_problem)  # bounded by its records
    except FileNotFoundError:
        return IndexRead([], [])
    except OSError as exc:
        return IndexRead([], [f"the index file cannot be read ({exc.strerror or exc})"])
    problems = [
        f"record(s) {s.seqs.start}..{s.seqs.stop - 1} skipped: {s.damage.reason} at byte {s.damage.offset}"
        + (f" ({s.damage.detail})" if s.damage.detail else "")
        for s in skim.skipped
    ]
    if not skim.records and skim.tail is not None:
        # a torn tail leaves the records before it; a file with none is not an index at all
        problems.append(f"no readable record: {skim.tail.reason} at byte {skim.tail.offset}")
    fold = IndexFold()
    fold.apply(skim.records)
    return IndexRead(fold.entries(), problems)


def read_clean_rows(store: Store, parent_id: str) -> "list[IndexRow] | None":
    """The live children of the parent's index as ``IndexRow``s in (created_at, id) order, when every byte
    of it reads as clean records (none without an index); None otherwise: ``read_index`` reads it then.

    Folded as it is read (``fold_on``), a chunk of records at a time, and no record is kept past its
    fold: a listing held every decoded record of the file at once, ~1.4 KB a child the parent ever had.
    Rows, not entries: a listing makes its own row of a settled child from them (``store/catalog.py``)."""
    try:
        clean = _fold_clean(store.children_index_path(parent_id))
    except FileNotFoundError:
        return []
    except OSError:
        return None  # the careful read says what is wrong
    return None if clean is None else clean.rows()


def _fold_clean(path: str) -> "IndexFold | None":
    """The fold of the index at ``path`` when every byte of it reads as clean records; else None."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)  # opened as ``skim_path`` opens it
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        fold = IndexFold()
        return fold if fold_on(fd, 0, info.st_size, fold, 0, b"") is not None else None
    finally:
        os.close(fd)


MARK = 16  # the bytes before where a fold stopped that ``fold_on`` returns (a reader reading on checks them)
_CHUNK = 256 * 1024  # bytes of an index read at a time


def fold_on(fd: int, offset: int, size: int, fold: "IndexFold", seq: int, mark: bytes) -> tuple[int, int, bytes] | None:
    """Fold the records from ``offset`` (where record ``seq`` begins, ``mark`` the bytes before it) to
    ``size`` (a snapshot: bytes appended since the ``fstat`` are not read, as ``pread_all`` says why),
    ``_CHUNK`` bytes at a time: a first read of a large index holds neither its bytes nor its records
    whole. Returns where they end, the next seq and the ``MARK`` bytes before that end; None when they
    do not read clean (a file cut shorter meanwhile included), the fold then holding some of them."""
    carry = b""
    while True:
        chunk = os.pread(fd, min(_CHUNK, size - offset), offset) if offset < size else b""
        offset += len(chunk)
        data = carry + chunk if carry else chunk
        at_end = not chunk or offset >= size
        found = scan_clean(data, check=index_problem, start_seq=seq, sink=fold.apply, part=not at_end)
        if found is None:
            return None
        seq = found.next_seq
        mark = (mark + data[max(0, found.end - MARK):found.end])[-MARK:]
        carry = data[found.end:]
        if at_end:  # a whole scan (not ``part``) ends at the end of its bytes
            return offset, seq, mark


class IndexFold:
    """The fold of an index file's records, in file order: which children are listed, each one's latest
    state, and the end its latest settled record gives. Records may come in several calls (a reader that
    read a file before reads on from where it stopped: ``store/committed.py``; a first read, a chunk of
    records at a time: ``fold_on``).

    A listed child costs what its entry needs, not its records: its creation's ``(created_at, origin,
    mode, label)`` and its latest settled record's ``Settled`` fields (``rows``); kept whole, the records
    of a parent with 100,000 children made ~140 MB of every listing. ``rows=False`` keeps only which
    children are listed (each one's ``Listed``) and their ends: a fold kept for as long as the process
    lives (``store/committed.py``) held each child's creation and settled records, ~1.2 KB a child, to
    answer one integer, and a host's memory grew with every child its root ever had (found by a soak
    probe). Such a fold has no ``rows`` nor ``entries``."""

    __slots__ = ("_entries", "_last_state", "committed", "_rows")

    def __init__(self, *, rows: bool = True) -> None:
        self._rows = rows
        # child → its creation's (created_at, origin, mode, label) (``rows``; else its ``Listed``)
        self._entries: dict[str, _Created | Listed] = {}
        # child → its latest settled record's ``Settled`` fields, made one by ``entry_of`` (None: active)
        self._last_state: dict[str, SettledFields | None] = {}
        self.committed: dict[str, int] = {}  # child → the end its latest settled record gives (listed children only)

    def apply(self, records: list[dict[str, Any]]) -> None:
        entries, last_state, committed, rows = self._entries, self._last_state, self.committed, self._rows
        get_created = _created if rows else _listed
        for record in records:
            child = record["id"]
            state = record.get("state")
            if state is None:
                if record.get("removed"):
                    entries.pop(child, None)
                    last_state.pop(child, None)
                    committed.pop(child, None)
                elif child not in entries and is_valid_session_id(child):
                    entries[child] = get_created(record)
            elif child in entries:  # a state record of a child not (or no longer) listed is ignored
                if state == "settled":
                    if rows:
                        last_state[child] = (record.get("outcome"), record.get("error_code"), record.get("error"),
                                             float(record.get("last_at", 0.0)), record.get("has_children"),
                                             record.get("end"), record.get("mtime_ns"))
                    end = record.get("end")
                    if isinstance(end, int) and not isinstance(end, bool):
                        committed[child] = end
                elif rows:
                    last_state[child] = None

    def listed(self, child: str) -> Listed | None:
        """The child's ``Listed`` (None: not listed)."""
        r = self._entries.get(child)
        return r if r is None or isinstance(r, Listed) else _shared_listed(r[1], r[2])

    def rows(self) -> list[IndexRow]:
        """Live children in (created_at, id) order, as the fold holds them (a fold made with ``rows``)."""
        assert self._rows, "a fold made without rows has no rows"
        last_state, committed = self._last_state, self.committed
        out = [(child, created_at, origin, mode, label, last_state.get(child), committed.get(child))
               for child, (created_at, origin, mode, label) in self._entries.items()]  # type: ignore[misc]
        out.sort(key=_ORDER)
        return out

    def entries(self) -> list[IndexEntry]:
        """Live entries in (created_at, id) order (a fold made with ``rows``)."""
        return [entry_of(row) for row in self.rows()]


_Created = tuple[float, "str | None", "str | None", "str | None"]
# ``Settled``'s fields, in its order: a settled record a later one replaces costs no object
SettledFields = tuple["str | None", "str | None", "str | None", float, "bool | None", "int | None", "int | None"]
# a listed child as a fold holds it: its entry's fields, its ``Settled`` as ``SettledFields`` (``entry_of`` makes the entry)
IndexRow = tuple[str, float, "str | None", "str | None", "str | None", "SettledFields | None", "int | None"]
_ORDER = itemgetter(1, 0)  # (created_at, id)


def entry_of(row: IndexRow) -> IndexEntry:
    """The ``IndexEntry`` of an ``IndexRow``."""
    child, created_at, origin, mode, label, settled, committed_end = row
    return IndexEntry(child, created_at, origin, mode, label, None if settled is None else Settled(*settled), committed_end)


def _created(record: dict[str, Any]) -> _Created:
    return float(record.get("created_at", 0.0)), record.get("origin"), record.get("mode"), record.get("label")


def read_children(store: Store, parent_id: str) -> list[IndexEntry]:
    """Live entries in (created_at, id) order; read-only (damage: see ``read_index``)."""
    return read_index(store, parent_id).entries
