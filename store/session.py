"""Creating and removing sessions.

Creation is all-or-nothing and ordered so that a session exists exactly when
its header does: the folder, the initial log (descriptor and policy events at
epoch 0), the identity cache and any initial mailbox messages are written
first; the header is published last (tmp + fsync + exclusive link + fsync of
the folder); the index entry follows. A crash before the header leaves a
folder that nothing lists or resumes (``subagents store fsck`` reports it); a
failure after it removes the folder and tombstones the index entry.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Sequence

import msgpack

from .atomic import DIR_MODE, fsync_dir, write_atomic
from .errors import SessionExistsError
from .framing import encode_record
from .header import SessionHeader, parse_header
from .ids import validate_session_id
from .index import add_child, remove_child
from .lease import Lease
from .projection import Projection, write_cache
from .root import Store

__all__ = ["create_session", "delete_session"]


def create_session(
    store: Store,
    session_id: str,
    *,
    parent_session: str | None = None,
    origin: str | None = None,
    delegation_depth: int = 0,
    seed: Sequence[dict[str, Any]] = (),
    events: Sequence[tuple[str, Any]] = (),
    cwd: str | None = None,
    created_at: float | None = None,
    lease_owner: str | None = None,
    label: str | None = None,
) -> SessionHeader:
    """Create a session with its seed (events inherited from a parent) and first events.

    Every check happens before the first byte is written. ``lease_owner``
    creates the session already leased to that owner at epoch 1 (state
    ``running``): no other process can have seen the session yet, so no
    lock or takeover check is needed, and it saves the lease's own fsyncs.
    """
    validate_session_id(session_id)
    record: dict[str, Any] = {"version": 1, "id": session_id, "created_at": time.time() if created_at is None else created_at}
    if parent_session is not None:
        record["parent_session"] = parent_session
    if origin is not None:
        record["origin"] = origin
    record["delegation_depth"] = delegation_depth
    if seed:
        record["seed_length"] = len(seed)
    if cwd is not None:
        record["cwd"] = cwd
    if label is not None:
        record["label"] = label
    header = parse_header(record)
    folder = store.session_dir(session_id)
    try:
        os.mkdir(folder, DIR_MODE)
    except FileExistsError:
        raise SessionExistsError(session_id) from None
    published = False
    try:
        now = time.time()
        projection = Projection(seed_length=len(seed))
        chunks: list[bytes] = []
        offset = 0
        rows: list[dict[str, Any]] = [
            {"seq": i, "ts": e.get("ts", now), "type": e["type"], "data": e.get("data"), "epoch": 0} for i, e in enumerate(seed)
        ]
        rows += [{"seq": len(seed) + i, "ts": now, "type": kind, "data": data, "epoch": 0} for i, (kind, data) in enumerate(events)]
        for row in rows:
            chunk = encode_record(row)
            projection.apply(row, offset, offset + len(chunk))
            chunks.append(chunk)
            offset += len(chunk)
        durable = store.durability.syncs_at_commit
        # the header's folder fsync below persists the names of every file written before it
        write_atomic(os.path.join(folder, "log"), b"".join(chunks), durable=durable, sync_dir=False)
        write_cache(os.path.join(folder, "identity"), projection)
        if lease_owner is not None:
            lease = Lease(lease_owner, 1, "running", now)
            write_atomic(os.path.join(folder, "lease"), msgpack.packb(lease.to_record()), durable=durable, sync_dir=False)
        write_atomic(os.path.join(folder, "header"), msgpack.packb(header.to_record()), durable=durable, exclusive=True)
        published = True
        if store.durability.syncs_at_commit:
            fsync_dir(store.sessions_dir)
        if parent_session is not None:
            add_child(store, parent_session, session_id, created_at=header.created_at, origin=origin)
    except BaseException:
        delete_session(store, session_id, parent_session=parent_session if published else None)
        raise
    return header


def delete_session(store: Store, session_id: str, *, parent_session: str | None = None) -> None:
    """Remove a session that was never handed out (rollback); tombstones its index entry."""
    folder = store.session_dir(session_id)
    try:
        os.unlink(os.path.join(folder, "header"))  # unpublish first: from here nothing lists it
    except FileNotFoundError:
        pass
    if parent_session is not None:
        remove_child(store, parent_session, session_id)
    shutil.rmtree(folder, ignore_errors=True)
