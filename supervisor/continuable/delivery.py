"""Delivery: followups, host-user sends and reports, each durably in a mailbox before it returns.

Every message is accepted into the recipient's mailbox (``store.accept``:
appended and fsync'd under the session lock) and only then acknowledged with
its id; the driver takes it from there. Routing of a message to a child:
resident here → its mailbox and a poke of its driver; resident in another
live supervisor (``send`` only) → its mailbox, which that supervisor's
watcher picks up; nobody → a cold resume here (``materialization.py``).
A followup needs the exact live parent; a ``send`` needs only the durable
lineage (the child's header must name the parent); a report goes up to the
reporting child's live direct parent.

A resident child's mailbox is held open (``MailboxWriter``) from its first
delivery until its disposal, for at most ``MAX_OPEN_MAILBOXES`` children at
a time (the least recently delivered to is closed first): a followup then
pays no ``open``/``close`` of the session's file and mailbox. That cache is
only a saving, so it never takes the descriptors the host needs: it holds at
most an eighth of the process's soft open-file limit (``ulimit -n 128``: 8
mailboxes, 16 descriptors; a fixed 64 took all 128, and every later open of
the host failed with nothing to give them back), and an acceptance whose open
fails for want of a descriptor closes the cache and tries once more.
"""

from __future__ import annotations

import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

import anyio

from subagents.store import ChildEntry, OneShotDescriptor, Store, accept, list_children, read_header, read_projection
from subagents.store.changes import ChangeWatch
from subagents.store.errors import SubagentError
from subagents.store.ids import validate_session_id
from subagents.store.lease import OwnerRecord, owner_alive, read_lease, read_owner
from subagents.store.mailbox import MailboxWriter, check_message

from ..descriptors import out_of_descriptors
from ..errors import ActivationClosingError, InvalidRequestError, NotResumableError, ParentUnavailableError, UnauthorizedError
from ..lock_wait import LockWait, bounded
from ..runtime import Runtime
from ..validation import prompt_text
from .activation import Activation, ActivationTable
from .admission import Admission
from .materialization import Materializer
from .unhosted import pending_of

__all__ = ["Delivery"]

log = logging.getLogger(__name__)

# Mailboxes held open at once: two descriptors each (the session's file, its mailbox). Enough for
# the children a host follows up on in turn; a supervisor with thousands resident stays far below
# a 1,024-descriptor limit, and a child past the bound pays two opens per delivery again.
MAX_OPEN_MAILBOXES = 64
# the share of the soft open-file limit the cache may hold (two descriptors per mailbox)
LIMIT_SHARE = 8


def mailbox_bound() -> int:
    """How many mailboxes may be held open now: ``MAX_OPEN_MAILBOXES``, or fewer under a soft open-file
    limit below 1,024, so that they hold at most ``1 / LIMIT_SHARE`` of it (read each time: a host may
    change its limit while it runs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_MAILBOXES
    return min(MAX_OPEN_MAILBOXES, soft // (2 * LIMIT_SHARE))
# how often a message for a child that a maintenance pass holds looks whether it has let go
MAINTENANCE_POLL_S = 0.02


class Delivery:
    def __init__(self, rt: Runtime, table: ActivationTable, admission: Admission, materializer: Materializer) -> None:
        self._rt = rt
        self._table = table
        self._admission = admission
        self._materializer = materializer
        self._writers: OrderedDict[str, MailboxWriter] = OrderedDict()  # resident children's open mailboxes, least recent first
        self._changes: ChangeWatch | None = None  # their watch for other programs' writes, made with the first
        self._changes_tried = False

    async def followup(self, parent_id: str, child_id: str, content: Any, *, source: dict[str, Any] | None = None) -> str:
        """The next FIFO turn for a child of the live ``parent_id``; cold-resumes it when nobody hosts it."""
        table = self._table
        wait = LockWait.of_caller()
        self._admission.admit(parent_id)
        validate_session_id(child_id)
        if not table.is_live(parent_id):
            raise UnauthorizedError.not_live_parent(child_id)
        text = prompt_text(content)
        src = source if source is not None else {"kind": "coordinator", "form": "relay", "sender_session_id": parent_id}
        with table.routing(child_id):
            while True:
                act = table.get(child_id)
                if act is not None and act.disposing:
                    await act.disposed.wait()
                    continue
                if act is None:
                    await self._check(parent_id, child_id, src, text)
                    routed = await self._accept_for_holder(parent_id, child_id, src, text, wait)
                    if routed is not None:
                        return routed
                    act = await self._materializer.cold_resume(parent_id, child_id)
                    if act is None:
                        continue
                if act.parent_id != parent_id:
                    raise UnauthorizedError.other_parent(child_id)
                parent = table.get(parent_id)
                if parent is not None:
                    if parent.disposing:
                        raise ActivationClosingError.message_refused(child_id)
                    table.adopt(parent_id, child_id)
                return await self.deliver(act, src, text, wake=True, wait=wait)

    async def deliver(self, act: Activation, source: dict[str, Any], text: str, *, wake: bool, wait: LockWait | None = None) -> str:
        """Durably accept a message for a resident activation and wake its driver. ``wait``: a public call's
        bound on the wait for the child's lock (``lock_wait.py``); ``None``: the supervisor's own delivery."""
        act.admitted += 1
        try:
            return await self._accept_resident(act.child_id, source, text, wake=wake, wait=wait)
        finally:
            act.admitted -= 1
            act.poke()

    async def _accept_resident(self, child_id: str, source: dict[str, Any], text: str, *, wake: bool, wait: LockWait | None) -> str:
        """``_accept`` through the open mailbox of a resident child or a live root of ours (opened by its first
        delivery, then kept).

        A writer made for one acceptance checks, first, that the mailbox still holds what the log consumed
        and that its unconsumed messages read whole: O(pending). A kept one checks only when another hand
        touched the file. A root's settlement notices pile up until its host takes them (a host that
        starts a batch of children and collects at the end): made afresh, 3,000 children cost 25 ms of
        host CPU each at the end against 5.6 at the start, O(N²) in all."""
        store, ids = self._rt.store, self._rt.ids
        writer = self._writers.get(child_id)
        if writer is not None:
            self._writers.move_to_end(child_id)
            kept = writer
            return await bounded(wait, lambda timeout: self._rt.store_thread.run_uncancellable(
                lambda: kept.accept(source=source, content=text, ids=ids, wake=wake, lock_timeout=timeout)))

        changes = self._change_watch()

        def first(timeout: float | None) -> tuple[MailboxWriter, str]:
            made = MailboxWriter(store, child_id, changes=changes)  # SessionNotFoundError
            try:
                return made, made.accept(source=source, content=text, ids=ids, wake=wake, lock_timeout=timeout)
            except BaseException:
                made.close()
                raise

        def attempt() -> Awaitable[tuple[MailboxWriter, str]]:
            return bounded(wait, lambda timeout: self._rt.store_thread.run_uncancellable(first, timeout))

        try:
            made, message_id = await attempt()
        except SubagentError as exc:
            if not out_of_descriptors(exc) or not self._writers:
                raise
            # the open failed and wrote nothing: the cache's descriptors go back, and it is tried once more
            log.info("out of file descriptors: closing %d held mailboxes (%s)", len(self._writers), exc.message)
            self.close_writers()
            made, message_id = await attempt()
        if self._keeps_mailbox(child_id) and child_id not in self._writers:
            self._writers[child_id] = made
            bound = mailbox_bound()
            while len(self._writers) > bound:
                self._writers.popitem(last=False)[1].close()
        else:  # disposed meanwhile, or another delivery kept its own first
            made.close()
        return message_id

    def _keeps_mailbox(self, session_id: str) -> bool:
        """A resident activation's, or a root this supervisor holds (``forget`` closes it at its release)."""
        return session_id in self._table or self._table.live_kind(session_id) == "root"

    def _change_watch(self) -> ChangeWatch | None:
        """The inotify instance the held mailboxes share, opened once (None where there is none: timestamps)."""
        if not self._changes_tried:
            self._changes_tried = True
            self._changes = ChangeWatch.open()
        return self._changes

    def open_mailboxes(self) -> int:
        """How many resident children's mailboxes are held open now (at most ``MAX_OPEN_MAILBOXES``)."""
        return len(self._writers)

    def close_writers(self) -> None:
        """Close every open mailbox, keeping the watch (the next delivery to each opens it again)."""
        while self._writers:
            self._writers.popitem()[1].close()

    def close_mailboxes(self) -> None:
        """Close every open mailbox (the supervisor is closing)."""
        self.close_writers()
        if self._changes is not None:
            self._changes.close()  # a writer still accepting (closed, not yet done) sees every file as changed

    def forget(self, child_id: str) -> None:
        """The child is disposed, or the root released: close its open mailbox (at once, or after an acceptance
        in progress)."""
        writer = self._writers.pop(child_id, None)
        if writer is not None:
            writer.close()

    async def _accept(self, recipient: str, source: dict[str, Any], text: str, *, wake: bool, wait: LockWait | None) -> str:
        """Append to ``recipient``'s mailbox on the store thread; uncancellable, as it always was (under a
        shield): once begun, an acceptance is never half-done (its wait for the lock may end first: ``wait``)."""
        store, ids = self._rt.store, self._rt.ids
        return await bounded(wait, lambda timeout: self._rt.store_thread.run_uncancellable(
            lambda: accept(store, recipient, source=source, content=text, ids=ids, wake=wake, lock_timeout=timeout)))

    async def report_from(self, child_id: str, content: Any, *, delivery: str = "wakeup") -> str:
        """A live continuable child's message to its live direct parent: ``quiet`` (context) or ``wakeup`` (a turn)."""
        if delivery not in ("quiet", "wakeup"):
            raise InvalidRequestError(f'report delivery must be "quiet" or "wakeup", got {delivery!r}')
        wait = LockWait.of_caller()
        act = self._table.get(child_id)
        if act is None:
            raise UnauthorizedError.cannot_report(child_id)
        self._admission.admit(child_id)
        if act.disposing:
            raise ActivationClosingError.report_refused(child_id)
        if not await self.takes_messages(act.parent_id):
            raise ParentUnavailableError()
        text = f"Background subagent {child_id} reported:\n{prompt_text(content)}"
        source = {"kind": "subagent-report", "form": "relay", "sender_session_id": child_id}
        return await self.send_to(act.parent_id, source, text, wake=delivery == "wakeup", wait=wait)

    async def takes_messages(self, recipient: str) -> bool:
        """Whether a parent can take a report or a settlement notice: one resident here (its driver), a root or a
        continuable child held anywhere or nowhere (its durable mailbox, taken by ``take_messages`` or consumed at
        its next turn). A one-shot child, running or finished, never has a next turn and has no mailbox (its
        prompt is in its log, consumed from none: a mailbox made for it disagrees with its log), and a session
        that is gone has nowhere to keep one."""
        if self._table.get(recipient) is not None:
            return True
        kind = self._table.live_kind(recipient)
        if kind is not None:
            return kind == "root"
        return bool(await self._rt.store_thread.run(_takes_messages, self._rt.store, recipient))

    async def send_to(self, recipient: str, source: dict[str, Any], text: str, *, wake: bool, wait: LockWait | None = None) -> str:
        """Deliver to a parent: its activation's driver when resident, else its durable mailbox (a root's).
        ``wait``: as ``deliver``'s."""
        parent = self._table.get(recipient)
        if parent is not None and not parent.disposing:
            return await self.deliver(parent, source, text, wake=wake, wait=wait)
        if self._table.live_kind(recipient) == "root":
            return await self._accept_resident(recipient, source, text, wake=wake, wait=wait)
        return await self._accept(recipient, source, text, wake=wake, wait=wait)

    async def send(self, child_id: str, content: Any, *, parent: str, source: dict[str, Any] | None = None) -> str:
        """Host-user continuation from any process: deliver a message to a child of ``parent``.

        Authority is the durable lineage (the child's header must name ``parent``),
        not a live parent object.
        """
        validate_session_id(child_id)
        wait = LockWait.of_caller()
        try:
            header = await self._rt.store_thread.run(read_header, self._rt.store, child_id)
        except SubagentError as exc:
            raise NotResumableError.unavailable(child_id) from exc
        if header.parent_session != parent:
            raise UnauthorizedError.other_parent(child_id)
        self._admission.admit(parent)
        text = prompt_text(content)
        src = source if source is not None else {"kind": "user"}
        with self._table.routing(child_id):
            while True:
                act = self._table.get(child_id)
                if act is not None and act.disposing:
                    await act.disposed.wait()
                    continue
                if act is not None:
                    return await self.deliver(act, src, text, wake=True, wait=wait)
                await self._check(parent, child_id, src, text)
                routed = await self._accept_for_holder(parent, child_id, src, text, wait)
                if routed is not None:
                    return routed
                act = await self._materializer.cold_resume(parent, child_id)
                if act is not None:
                    return await self.deliver(act, src, text, wake=True, wait=wait)

    async def _check(self, parent_id: str, child_id: str, source: dict[str, Any], text: str) -> None:
        """Refuse a message no mailbox would take before routing it: a cold resume is durable (a lease
        epoch, and a settlement notice to the parent when the resumed child settles again), and must
        not happen for a message that is then refused (a resident child's acceptance checks it itself).
        A child with no continuation state (a one-shot child, running elsewhere or not) takes none:
        ``NOT_RESUMABLE``, as its cold resume says, before its mailbox is read or written (and after
        the lineage: ``UNAUTHORIZED`` comes first, as there)."""
        def check() -> None:
            if not _continuable_or_unread(self._rt.store, child_id):
                if read_header(self._rt.store, child_id).parent_session != parent_id:
                    raise UnauthorizedError.other_parent(child_id)
                raise NotResumableError.no_state(child_id)
            check_message(self._rt.store, child_id, source=source, content=text)

        await self._rt.store_thread.run(check)

    async def _accept_for_holder(self, parent_id: str, child_id: str, source: dict[str, Any], text: str, wait: LockWait) -> str | None:
        """When a live other supervisor holds the child, accept the message into its durable mailbox.

        That supervisor's store watcher runs it as the next turn; the message id
        is returned once durable. ``followup`` and ``send`` share this rule.
        None: nobody else holds it, so the caller resumes it here.
        """
        holder = await self._rt.store_thread.run(self.holder_elsewhere, child_id)
        if holder is None:
            return None
        if holder.maintenance:
            await self._wait_out_maintenance(child_id)
            return None  # let go: the caller resumes it here, or routes to whoever took it since
        header = await self._rt.store_thread.run(read_header, self._rt.store, child_id)
        if header.parent_session != parent_id:
            raise UnauthorizedError.other_parent(child_id)
        message_id = await self._accept(child_id, source, text, wake=True, wait=wait)
        # accepted, durable: its id goes back to the caller, cancelled or not. A cancellation raised here
        # said "not sent" of a message that ran, and a caller that sent it again ran it twice
        with anyio.CancelScope(shield=True):
            # a maintenance pass that took the lease as its host let go runs nothing: outwait it
            await self._wait_out_maintenance(child_id)
            if not await self._rt.store_thread.run(self.held_elsewhere, child_id):
                # the holder let go meanwhile: run it here (it may also resume it; the lease decides)
                await self.resume_for_pending(parent_id, child_id)
        return message_id

    async def _wait_out_maintenance(self, child_id: str) -> None:
        """Until no live maintenance pass (``store fsck --repair``) holds the child: it holds a lease for
        a repair, and dies by its heartbeat's age if it stops, so the wait is as bounded as the lease."""
        while True:
            holder = await self._rt.store_thread.run(self.holder_elsewhere, child_id)
            if holder is None or not holder.maintenance:
                return
            await anyio.sleep(MAINTENANCE_POLL_S)

    def settled_holder_elsewhere(self, child_id: str) -> OwnerRecord | None:
        """``holder_elsewhere`` once no maintenance pass holds the child (blocking, sleeps: run it in a
        worker thread, not the store thread): what a teardown reaches, which must not take a repair
        for a host that would carry out its drain request."""
        while (holder := self.holder_elsewhere(child_id)) is not None and holder.maintenance:
            time.sleep(MAINTENANCE_POLL_S)
        return holder

    def held_elsewhere(self, child_id: str) -> bool:
        """Whether a live other owner holds the child's lease (blocking: run it in a thread)."""
        return self.holder_elsewhere(child_id) is not None

    def holder_elsewhere(self, child_id: str) -> OwnerRecord | None:
        """The live other owner holding the child's lease, if any (blocking: run it in a thread)."""
        lease = read_lease(self._rt.store, child_id)
        if lease is None or lease.state == "released" or lease.owner == self._rt.owner_id:
            return None
        owner = read_owner(self._rt.store, lease.owner)
        return owner if owner_alive(owner) else None

    async def resume_pending(self, parent_id: str) -> list[str]:
        """Resume each continuable child of ``parent_id`` that no supervisor hosts and whose mailbox holds
        messages no turn has taken (what a closed or crashed host left); the ids resumed, in creation
        order. Each runs them as its next turns. One whose files refuse it, or that another process
        resumed first, is left (logged): the others still run."""
        resumed = []
        for child_id in await self._rt.store_thread.run(self._waiting_children, parent_id):
            if child_id in self._table:
                continue
            try:
                act = await self._materializer.cold_resume(parent_id, child_id)
            except SubagentError as exc:
                log.warning("child %s was not resumed for its pending messages: %s", child_id, exc, extra={"child": child_id})
                continue
            if act is not None:
                resumed.append(child_id)
        return resumed

    def _waiting_children(self, parent_id: str) -> list[str]:
        """The unhosted continuable children of ``parent_id`` with messages pending (blocking: in the store thread)."""
        store, waiting = self._rt.store, []
        for entry in list_children(store, parent_id):
            if not isinstance(entry, ChildEntry) or entry.mode != "continuable" or entry.status != "complete" or entry.id in self._table:
                continue
            try:
                if pending_of(store, entry.id):
                    waiting.append(entry.id)
            except SubagentError as exc:  # its damage is its own: said here, the others still run
                log.warning("the pending messages of %s could not be read: %s", entry.id, exc, extra={"child": entry.id})
        return waiting

    async def resume_for_pending(self, parent_id: str, child_id: str) -> None:
        """Run messages another process left for a child nobody hosts now."""
        if child_id in self._table or self._admission.closing:
            return
        try:
            await self._materializer.cold_resume(parent_id, child_id)
        except SubagentError as exc:
            # another supervisor resumed it first (it delivers them), or admission closed
            log.info("child %s was not resumed for its pending messages: %s", child_id, exc)
        except (KeyboardInterrupt, SystemExit, anyio.get_cancelled_exc_class()):
            raise
        except BaseException:  # isolation boundary: a background resume (a host's setup installer failed in it,
            # say) ends only itself; the messages stay pending, durable, for the next activation
            log.exception("child %s was not resumed for its pending messages", child_id)


def _continuable_or_unread(store: Store, session_id: str) -> bool:
    """Whether the child's log holds a continuation state; True when it does not read (its cold
    resume or its holder's acceptance says what is wrong)."""
    try:
        return read_projection(store, session_id).continuable() is not None
    except SubagentError:
        return True


def _takes_messages(store: Store, session_id: str) -> bool:
    """A session not live here takes messages in its mailbox unless it is a one-shot child or gone."""
    if not store.exists(session_id):
        return False
    return not isinstance(read_projection(store, session_id).identity, OneShotDescriptor)

