"""The bytes of a lease file (``sessions/<id>/lease``, FORMAT.md §7): ``Lease`` and its decoding.

Apart from ``store/lease.py`` (which acquires, updates and releases leases)
so that the log writer can read the lease it fences against without
importing the lease module, which writes the catalog's state records beside
a lease change (``store/rows.py``, which reads logs). Who calls it:
``store/lease.py`` and ``store/log.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from .records import LeaseFields, decode

__all__ = ["LeaseState", "Lease", "decode_lease", "read_lease_fd"]

LeaseState = Literal["running", "idle", "released"]


@dataclass(frozen=True)
class Lease:
    owner: str
    epoch: int
    state: LeaseState
    acquired_at: float

    def to_record(self) -> dict[str, Any]:
        return {"owner": self.owner, "epoch": self.epoch, "state": self.state, "acquired_at": self.acquired_at}


def decode_lease(raw: bytes) -> Lease | str:
    """The lease, or the problem with its bytes as text."""
    data = decode(LeaseFields, raw)
    if isinstance(data, str):
        return data
    return Lease(data.owner, data.epoch, data.state, data.acquired_at)


def read_lease_fd(fd: int) -> Lease | None:
    """The lease in an open lease file (``None`` when undecodable).

    Lease files are small and only ever replaced whole (``write_atomic``: tmp +
    rename), never rewritten in place — which is what lets a log writer keep
    one open and learn that it is stale from ``st_nlink == 0`` alone.
    """
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 4096, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    lease = decode_lease(b"".join(chunks))
    return None if isinstance(lease, str) else lease
