"""A drain of a continuable child that no live supervisor hosts (its host closed, or died).

A hosted child is torn down by its host (a durable ``drain`` control record):
its open turn stopped, its pending messages discarded. A child nobody hosts
has nobody to do that, so a drain left its queued messages in place, and the
next ``send`` ran them all, although the drain had reported the child torn
down. The drainer does it instead, under the child's lease, taken for the
moment as any resume takes it (a live other holder wins: it was asked): the
resume path repairs a turn its dead host left open (``cause`` ``drain``),
then the pending messages are recorded as consumed unrun
(``message/discarded``, ``cause`` ``drain``), and the lease is released.
A child with no open turn and nothing pending is not touched.

The drain takes the lease as this supervisor, so this supervisor's own cold
resume of the same child (a followup that came meanwhile) would take it again
at the next epoch and fence the drain half-way: the messages it was to discard
would run. ``DrainsUnderWay`` says which children a drain of this supervisor
holds; a resume that finds the lease held by its own supervisor waits while
one of them does, and takes a lease of its own left by anything else.

A drain asked of a live host that never carried it out (it died, was
stopped past its lease, or was already closing, which skips a drain) left
the request in the child's control file, and the next activation ignored it
as older than itself: the messages the drain had reported torn down then ran.
So a ``drain`` record carries where the child's mailbox data ended when it
was asked (``mailbox_end``), and whoever takes the child next discards the
messages accepted before that which are still pending
(``discard_drained``). A drain that was carried out left none of them
pending, so this is a no-op then: it never touches a message sent after it.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Iterator

from subagents.store import LogWriter, Store, acquire_lease, pending, read_controls, read_projection, release_lease
from subagents.store.errors import LeaseHeldError, SubagentError
from subagents.store.mailbox_read import mailbox_data_end

__all__ = ["DrainsUnderWay", "discard_drained", "drain_request", "drain_unhosted", "pending_of"]

log = logging.getLogger(__name__)


def pending_of(store: Store, child_id: str, writer: LogWriter | None = None) -> list:
    """The messages of a child no supervisor hosts that no turn has taken (as its log, or ``writer``'s, folds)."""
    p = writer.projection if writer is not None else read_projection(store, child_id)
    return pending(store, child_id, consumed=p.consumed, last_consumed_id=p.last_message_id, mailbox_end=p.mailbox_end)


class DrainsUnderWay:
    """The children a drain of this supervisor holds the lease of now (thread-safe: drains run in threads,
    resumes look from the event loop's store thread)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: set[str] = set()

    @contextmanager
    def holding(self, child_id: str) -> Iterator[None]:
        """Around a drain's take of the lease and its release: said before the take, unsaid after the release."""
        with self._mutex:
            self._held.add(child_id)
        try:
            yield
        finally:
            with self._mutex:
                self._held.discard(child_id)

    def __contains__(self, child_id: object) -> bool:
        with self._mutex:
            return child_id in self._held


def drain_unhosted(store: Store, child_id: str, owner_id: str, drains: DrainsUnderWay) -> bool:
    """Tear down a child nobody hosts (blocking); whether anything was written. A child that another
    supervisor took meanwhile is left; one whose files refuse it (a mailbox that does not read) raises
    that ``SubagentError``, which the drain reports for the child: it was not drained. ``drains``: this
    supervisor's, which its resumes look at before they take a lease it holds."""
    with drains.holding(child_id):
        return _drain(store, child_id, owner_id)


def _drain(store: Store, child_id: str, owner_id: str) -> bool:
    try:
        if read_projection(store, child_id).open_turn is None and not pending_of(store, child_id):
            return False
        # never from this supervisor itself: the table said nobody hosts the child here, but a followup's
        # cold resume may have installed an activation since; taken again (epoch + 1), it fenced that
        # live activation, whose turn the repair below closed as a crash and whose notice never came
        lease = acquire_lease(store, child_id, owner_id, state="idle", take_own=False)
    except LeaseHeldError:
        return False  # hosted after all: its host was asked, or it is resident here now
    try:
        with LogWriter.open(store, child_id, epoch=lease.epoch, cause="drain") as writer:
            messages = pending_of(store, child_id, writer)
            if messages:
                writer.append([("message/discarded", {"message_id": m.id, "mailbox_end": m.end, "cause": "drain"})
                               for m in messages], commit=True)
            log.info("drained %s, which no supervisor hosted: %d pending message(s) discarded%s", child_id, len(messages),
                     ", its open turn closed" if writer.repaired else "")
        return True
    finally:
        try:
            release_lease(store, child_id, owner_id, lease.epoch)
        except SubagentError:
            log.warning("could not release the lease of %s after draining it", child_id, exc_info=True)


def drain_request(store: Store, child_id: str, request: dict) -> dict:
    """A ``drain`` record's data: ``request`` and where the child's mailbox data ends now (omitted when
    the mailbox cannot be read: the drain is still asked of its host, it covers nothing after it)."""
    try:
        return {**request, "mailbox_end": mailbox_data_end(store, child_id)}
    except OSError:
        log.warning("the mailbox of %s could not be read; its drain covers nothing its host leaves", child_id, exc_info=True)
        return dict(request)


def discard_drained(store: Store, child_id: str, epoch: int) -> int:
    """Discard (``cause`` ``drain``) the pending messages a ``drain`` control record covers, under the
    lease the caller just took at ``epoch`` (blocking); how many. A message is covered when it began
    before the mailbox end the record noted: each record begins with a non-zero length, so a message
    accepted before the drain begins below that end, one accepted after it at or past it. Records
    without ``mailbox_end`` (written before it existed) cover nothing."""
    ends = [r.data.get("mailbox_end") for r in read_controls(store, child_id) if r.kind == "drain"]
    limit = max((end for end in ends if isinstance(end, int) and not isinstance(end, bool)), default=0)
    if limit <= 0:
        return 0
    projection = read_projection(store, child_id)
    start = projection.mailbox_end if projection.consumed else 0
    covered = []
    for message in pending_of(store, child_id):
        if start is None or start >= limit:
            break
        covered.append(message)
        start = message.end
    if not covered:
        return 0
    with LogWriter.open(store, child_id, epoch=epoch, cause="drain") as writer:
        messages = pending_of(store, child_id, writer)[: len(covered)]  # as the writer folds it, after any repair
        writer.append([("message/discarded", {"message_id": m.id, "mailbox_end": m.end, "cause": "drain"}) for m in messages],
                      commit=True)
    log.info("discarded %d message(s) of %s that a drain its last host never carried out covered", len(messages), child_id)
    return len(messages)
