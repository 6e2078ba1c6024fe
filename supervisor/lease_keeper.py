"""The lease keeper: this supervisor's owner record and its heartbeat.

One heartbeat file per supervisor, renewed every TTL/3, covers every lease it
holds. If the process is stopped or hung past its TTL, other supervisors may
take its sessions over; its next append is then fenced. It also removes the
records crashed supervisors left (``reap_owners``: gone for good and holding
no lease) once when it starts and once at close, after this supervisor may
have taken their leases over; a record still holding a lease then waits for
a later supervisor or ``store gc``. One ``OwnerReaper`` serves both passes:
the one at close reads only the leases the first found naming a gone owner,
and the first, too, only those an earlier process found (``store/reaper.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio

from subagents.store import IdGenerator, OwnerReaper, OwnerRecord, Store, SubagentError, heartbeat, register_owner, remove_owner

__all__ = ["LeaseKeeper", "LeaseKeeperStatistics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseKeeperStatistics:
    owner_id: str
    heartbeats: int
    ttl_s: float
    leases_read: int  # by the passes that remove crashed supervisors' records, so far


class LeaseKeeper:
    def __init__(self, store: Store, *, ttl_s: float, ids: IdGenerator) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.owner_id = ids.new()
        self._record: OwnerRecord | None = None
        self._beats = 0
        self._reaper = OwnerReaper(store)
        self._reaping = anyio.Lock()  # the reaper runs one pass at a time

    def start(self) -> None:
        self._record = register_owner(self.store, self.owner_id, ttl=self.ttl_s)

    async def run(self) -> None:
        """Remove the records of crashed owners, then renew the heartbeat until cancelled."""
        await self.reap()
        failing = False
        while True:
            await anyio.sleep(self.ttl_s / 3)
            assert self._record is not None
            try:
                self._record = await anyio.to_thread.run_sync(heartbeat, self.store, self._record)
            except (SubagentError, OSError):
                # A store that takes no write now (remounted read-only, its modes changed): the
                # supervisor goes on, and once the TTL passes others may take its sessions over, which
                # fences its next appends. Said once per failing streak, tried again every beat.
                if not failing:
                    log.warning("could not renew this supervisor's heartbeat; its leases lapse after %.1f s unless "
                                "a later beat succeeds", self.ttl_s, exc_info=True)
                failing = True
                continue
            if failing:
                log.warning("this supervisor's heartbeat is renewed again")
            failing = False
            self._beats += 1

    async def reap(self) -> list[str]:
        """Remove the records of owners gone for good that hold nothing (``OwnerReaper``); the ids removed.

        Housekeeping, an isolation boundary: a failure (a store that cannot be
        read or written right now) is logged and leaves the records for a later
        pass; it never stops the supervisor.
        """
        try:
            async with self._reaping:
                removed = await anyio.to_thread.run_sync(self._reaper.reap)
        except (SubagentError, OSError):
            log.warning("could not remove the records of crashed supervisors", exc_info=True)
            return []
        if removed:
            log.info("removed the records of %d crashed supervisor(s): %s", len(removed), ", ".join(removed))
        return removed

    def stop(self) -> None:
        """Remove the owner record; one the store refuses to remove reads as a closed owner's once its heartbeat is old."""
        try:
            remove_owner(self.store, self.owner_id)
        except (SubagentError, OSError):
            log.warning("could not remove this supervisor's owner record", exc_info=True)

    def statistics(self) -> LeaseKeeperStatistics:
        return LeaseKeeperStatistics(self.owner_id, self._beats, self.ttl_s, self._reaper.leases_read)
