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

A lapse (two renewals further apart than the streak allows: the process was
stopped, or stalled) calls ``on_lapse``: another supervisor may have taken
sessions over meanwhile, and a turn that does not write for a while (a long
tool call, a model's request) would learn it only at its next append, running
on beside the taker's turn until then; the supervisor reads its leases instead.

It also answers, without reading the store, whether a lease this supervisor
took can have been taken over since (``held_surely``): another supervisor
takes a lease only once its owner's heartbeat is older than the TTL, so while
the beats have followed each other closer than ``_SURE`` of the TTL since the
lease was taken, and the last is that recent, nobody can have. A pause (the
process stopped, a host suspended: the clock counts suspended time) breaks
the streak, and the caller reads the lease instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from subagents.store import IdGenerator, OwnerReaper, OwnerRecord, Store, SubagentError, heartbeat, register_owner, remove_owner

__all__ = ["LeaseKeeper", "LeaseKeeperStatistics"]

log = logging.getLogger(__name__)

_SURE = 2 / 3  # of the TTL: a renewal this recent, with none further apart, holds every lease (a third of margin)
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)  # counts a suspended host's sleep, as wall time does


def _now() -> float:
    return time.clock_gettime(_CLOCK)


@dataclass(frozen=True)
class LeaseKeeperStatistics:
    owner_id: str
    heartbeats: int
    ttl_s: float
    leases_read: int  # by the passes that remove crashed supervisors' records, so far


class LeaseKeeper:
    def __init__(self, store: Store, *, ttl_s: float, ids: IdGenerator, on_lapse: Callable[[], Awaitable[None]] | None = None) -> None:
        self.store = store
        self._on_lapse = on_lapse
        self.ttl_s = ttl_s
        self.owner_id = ids.new()
        self._record: OwnerRecord | None = None
        self._beats = 0
        self._beat_at: float | None = None  # the clock just before the last renewal that succeeded
        self._streak = 0  # bumped by a renewal further than _SURE of the TTL from the one before
        self._reaper = OwnerReaper(store)
        self._reaping = anyio.Lock()  # the reaper runs one pass at a time

    def start(self) -> None:
        before = _now()
        self._record = register_owner(self.store, self.owner_id, ttl=self.ttl_s)
        self._renewed(before)

    def _renewed(self, before: float) -> None:
        if self._beat_at is None or _now() - self._beat_at >= self.ttl_s * _SURE:
            self._streak += 1
        self._beat_at = before

    def streak(self) -> int:
        """The current streak of close renewals; take it before acquiring a lease, pass it to ``held_surely``."""
        return self._streak

    def held_surely(self, streak: int) -> bool:
        """Whether a lease acquired during ``streak`` is certainly still this supervisor's (see the module's docstring).

        ``False`` means "not known": read the lease."""
        return streak == self._streak and self._beat_at is not None and _now() - self._beat_at < self.ttl_s * _SURE

    async def run(self) -> None:
        """Remove the records of crashed owners, then renew the heartbeat until cancelled."""
        await self.reap()
        failing = False
        while True:
            await anyio.sleep(self.ttl_s / 3)
            assert self._record is not None
            before = _now()
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
            streak = self._streak
            self._renewed(before)
            self._beats += 1
            if self._streak != streak and self._on_lapse is not None:
                await self._lapsed()

    async def _lapsed(self) -> None:
        """``on_lapse``, an isolation boundary: a failure is logged, and the heartbeat goes on."""
        assert self._on_lapse is not None
        log.info("this supervisor's heartbeat lapsed (stopped or stalled): reading the leases it holds")
        try:
            await self._on_lapse()
        except Exception:
            log.exception("could not check the leases of this supervisor after its heartbeat lapsed")

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
