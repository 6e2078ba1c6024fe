"""The store watcher: what other processes write for the activations this supervisor hosts.

Another process may append to a hosted child's mailbox (a host-user ``send``
from elsewhere) or to its control file (an ``interrupt`` or ``drain``
request from another supervisor or the CLI). Every ``poll_s`` the watcher
compares where each mailbox's data ends with what it last saw (one
``pread`` of its last block per activation, ``store.mailbox_read.mailbox_data_end``:
an acceptance overwrites the file's zero padding and need not change its
size) and wakes the driver of a grown one. Control files are read by
the supervisor's one ``ControlPoller`` (``supervisor/control_poller.py``,
shared with the one-shot runs): the watcher registers each activation there
from its ``baseline`` on, and new records reach the callback the façade
gives it. Records older than the activation are skipped: a request is about
the turn running when it was asked, never a later one.

Each activation is an isolation boundary: a file that cannot be read or holds
a record of the wrong shape is logged (once per change of the file) and
skipped; it never ends the supervisor or affects another activation.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import anyio

from subagents.store import Store
from subagents.store.mailbox_read import mailbox_data_end
from subagents.store.control import ControlRecord, read_controls

from ..control_poller import ControlPoller
from .activation import Activation, ActivationTable, log_fields

__all__ = ["StoreWatcher"]

log = logging.getLogger(__name__)

ApplyControl = Callable[[Activation, ControlRecord], None]


def _data_end(store: Store, child_id: str) -> int:
    """Where the child's mailbox data ends (an acceptance may not change the file's size: it overwrites padding)."""
    try:
        return mailbox_data_end(store, child_id)
    except OSError:  # unreadable, or damage in its place: nothing to see until it changes
        return 0


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # missing, or damage in its place: nothing to see until it changes
        return 0


class StoreWatcher:
    def __init__(self, store: Store, table: ActivationTable, control: ControlPoller, *, apply: ApplyControl) -> None:
        self._store = store
        self._table = table
        self._control = control
        self._apply = apply
        self._watching: set[str] = set()  # activations registered with ``control``

    def baseline(self, act: Activation) -> None:
        """What the activation starts from: the mailbox as it is, control records up to now (older requests were about older turns)."""
        act.mailbox_data_end = _data_end(self._store, act.child_id)
        size = _size(self._store.path(act.child_id, "control"))
        try:
            controls = read_controls(self._store, act.child_id)
        except Exception:  # isolation boundary: see the module docstring
            log.warning("control file of %s cannot be read; its old requests are ignored", act.child_id, exc_info=True, extra=log_fields(act))
            controls = []
        self._control.watch(act.child_id, lambda record: self._carry_out(act, record), size=size, seq=controls[-1].seq if controls else -1)
        self._watching.add(act.child_id)

    def _carry_out(self, act: Activation, record: ControlRecord) -> None:
        if not act.disposing:
            self._apply(act, record)

    async def run(self, poll_s: float) -> None:
        """Poll until cancelled."""
        while True:
            await anyio.sleep(poll_s)
            self.poll()

    def poll(self) -> None:
        for child_id in [c for c in self._watching if c not in self._table]:
            self._watching.discard(child_id)  # disposed since the last poll
            self._control.unwatch(child_id)
        for act in self._table:
            if act.disposing:
                continue
            try:
                end = _data_end(self._store, act.child_id)
            except Exception:  # isolation boundary: one child's damaged files never end the supervisor
                log.warning("the mailbox of %s could not be watched; skipped until it changes", act.child_id, exc_info=True, extra=log_fields(act))
                continue
            if end != act.mailbox_data_end:
                act.mailbox_data_end = end
                act.poke()
