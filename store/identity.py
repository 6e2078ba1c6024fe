"""What a listing knows of one session without replaying its log: its descriptor and projection.

``read_identity`` takes the identity cache when it passes its gate (FORMAT.md
§10) and folds the log in memory otherwise; it never writes. Apart from the
catalog so that the lease module can compute a settled child's row under the
session lock (``store/rows.py``) without importing the catalog, which reads
leases. Who calls it: ``store/catalog.py``, ``store/rows.py``, the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .descriptor import ContinuableDescriptor, Descriptor, OneShotDescriptor
from .header import SessionHeader
from .log import CACHE_LAG_BYTES, read_projection
from .projection import Projection, read_cache
from .reader import inspect, inspect_file
from .root import Store
from .session_file import SessionFile

__all__ = ["DiagnosticReason", "Identity", "read_identity"]

DiagnosticReason = Literal["corrupt", "unsupported", "unavailable"]


@dataclass(frozen=True)
class Identity:
    """What the catalog knows of one session without replaying its log."""

    descriptor: Descriptor | None
    verdict: DiagnosticReason | None  # set when the session cannot be listed healthy
    projection: Projection


def read_identity(
    store: Store, session_id: str, seed_length: int, file: SessionFile | None = None, *, use_cache: bool = True,
    header: SessionHeader | None = None,
) -> Identity:
    """Identity from the cache when it passes its gate, else from an in-memory fold.

    ``use_cache=False``: fold the whole log, whatever the cache says. For a file that was
    written behind its writer's back (a settled child whose file's time moved, FORMAT.md §9):
    the cache vouches for the bytes before its checkpoint only as its writer left them.

    ``file``: the session's file, when the caller has it open (a listing row reads
    header, lease and log through one descriptor); a log shorter than
    ``CACHE_LAG_BYTES`` has no cache, so none is looked for (the region's size counts
    the zero padding after the records: at most one lookup of a cache that is not
    there, never one skipped); ``header``: that file's header, when the caller has validated it (a
    listing row has: it is not validated again). Raises ``OSError`` for
    an unreadable log, ``UnsupportedFormatError`` for unknown event types.
    """
    projection = None
    if use_cache and (file is None or file.log_size() >= CACHE_LAG_BYTES):
        try:
            projection = read_cache(store.path(session_id, "identity"))
        except OSError:  # an unreadable cache is ignored: the log is the authority
            projection = None
    if projection is not None and projection.identity is not None and projection.seq >= seed_length:
        # the cache stops at the last commit point: a log that grew since (an open turn, a
        # message dropped by a drain) is folded from the cached checkpoint on (log.py)
        projection = read_projection(store, session_id)
    if projection is None or projection.identity is None or projection.seq < seed_length:
        folded = Projection(seed_length=seed_length)
        found = inspect(store, session_id) if file is None else inspect_file(file, header)
        folded.fold(found.events, found.offsets, found.end)
        if found.status == "corrupt":
            return Identity(None, "corrupt", folded)
        projection = folded
    ident = projection.identity
    if isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)):
        return Identity(ident, None, projection)
    if ident == "unsupported":
        return Identity(None, "unsupported", projection)
    return Identity(None, "corrupt", projection)  # none, "corrupt", or anything a cache should not hold
