"""A lease as a value (FORMAT.md §7): ``Lease`` and its decoding.

Apart from ``store/lease.py`` (which acquires, updates and releases leases)
so that the session file (``store/session_file.py``, which holds the lease
slots) and the log writer can read the lease they fence against without
importing the lease module, which writes the catalog's state records beside
a lease change (``store/rows.py``, which reads logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .records import LeaseFields, LeaseState, decode

__all__ = ["LeaseState", "Lease", "decode_lease"]


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
