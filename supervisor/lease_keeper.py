"""The lease keeper: this supervisor's owner record and its heartbeat.

One heartbeat file per supervisor, renewed every TTL/3, covers every lease it
holds. If the process is stopped or hung past its TTL, other supervisors may
take its sessions over; its next append is then fenced.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio

from subagents.store import IdGenerator, OwnerRecord, Store, heartbeat, register_owner, remove_owner

__all__ = ["LeaseKeeper", "LeaseKeeperStatistics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseKeeperStatistics:
    owner_id: str
    heartbeats: int
    ttl_s: float


class LeaseKeeper:
    def __init__(self, store: Store, *, ttl_s: float, ids: IdGenerator) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.owner_id = ids.new()
        self._record: OwnerRecord | None = None
        self._beats = 0

    def start(self) -> None:
        self._record = register_owner(self.store, self.owner_id, ttl=self.ttl_s)

    async def run(self) -> None:
        """Renew the heartbeat until cancelled."""
        while True:
            await anyio.sleep(self.ttl_s / 3)
            assert self._record is not None
            self._record = await anyio.to_thread.run_sync(heartbeat, self.store, self._record)
            self._beats += 1

    def stop(self) -> None:
        remove_owner(self.store, self.owner_id)

    def statistics(self) -> LeaseKeeperStatistics:
        return LeaseKeeperStatistics(self.owner_id, self._beats, self.ttl_s)
