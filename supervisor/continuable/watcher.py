"""The store watcher: what other processes write for the activations this supervisor hosts.

Another process may append to a hosted child's mailbox (a host-user ``send``
from elsewhere) or to its control file (an ``interrupt`` or ``drain``
request from another supervisor or the CLI). Every ``poll_s`` the watcher
compares each file's size with what it last saw (one ``stat`` per file per
activation): a grown mailbox wakes the driver, new control records are
applied through the callback the façade gives it. Records older than the
activation are ignored (``baseline``): a request is about the turn running
when it was asked, never a later one.

Each activation is an isolation boundary: a control file that cannot be read
or holds a record of the wrong shape is logged (once per change of the file)
and skipped; it never ends the supervisor or affects another activation.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import anyio

from subagents.store import Store
from subagents.store.control import ControlRecord, read_controls

from .activation import Activation, ActivationTable, log_fields

__all__ = ["StoreWatcher"]

log = logging.getLogger(__name__)

ApplyControl = Callable[[Activation, ControlRecord], None]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # missing, or damage in its place: nothing to see until it changes
        return 0


class StoreWatcher:
    def __init__(self, store: Store, table: ActivationTable, *, apply: ApplyControl) -> None:
        self._store = store
        self._table = table
        self._apply = apply
        self._control_sizes: dict[str, int] = {}  # child id -> control file size last read

    def baseline(self, act: Activation) -> None:
        """What the activation starts from: the mailbox as it is, control records up to now (older requests were about older turns)."""
        act.mailbox_size = _size(self._store.path(act.child_id, "mailbox"))
        self._control_sizes[act.child_id] = _size(self._store.path(act.child_id, "control"))
        try:
            controls = read_controls(self._store, act.child_id)
        except Exception:  # isolation boundary: see the module docstring
            log.warning("control file of %s cannot be read; its old requests are ignored", act.child_id, exc_info=True, extra=log_fields(act))
            return
        act.control_seq = controls[-1].seq if controls else -1

    async def run(self, poll_s: float) -> None:
        """Poll until cancelled."""
        while True:
            await anyio.sleep(poll_s)
            self.poll()

    def poll(self) -> None:
        for child_id in list(self._control_sizes):
            if child_id not in self._table:
                del self._control_sizes[child_id]  # disposed since the last poll
        for act in self._table:
            if act.disposing:
                continue
            try:
                self._poll_one(act)
            except Exception:  # isolation boundary: one child's damaged files never end the supervisor
                log.warning("the files of %s could not be watched; skipped until they change", act.child_id, exc_info=True, extra=log_fields(act))

    def _poll_one(self, act: Activation) -> None:
        size = _size(self._store.path(act.child_id, "mailbox"))
        if size != act.mailbox_size:
            act.mailbox_size = size
            act.poke()
        control = _size(self._store.path(act.child_id, "control"))
        if control == self._control_sizes.get(act.child_id):
            return
        self._control_sizes[act.child_id] = control  # first: a file that fails to parse is not re-read until it changes
        for record in read_controls(self._store, act.child_id, after_seq=act.control_seq):
            act.control_seq = record.seq
            if not act.disposing:
                self._apply(act, record)
