"""Teardown: interrupt, disposal, drain and close — everything that stops work.

``interrupt`` cancels only the current turn (queued messages, the activation
and its children stay; queued waking messages then run at once). Disposal
opens top-down — mark, cancel the current turn, wake; then the same for the
owned children — and completes child-first on each driver's task
(``dispose``): wait for the owned children, drop the pending mailbox if a
drain asked for it, release the lease, deliver the settlement notice to the
parent durably, and only then release the parent's ownership and emit
``subagent/end``. ``drain`` does that below some parents and closes
admission there; ``close`` does it everywhere and keeps pending messages for
the next activation. Only this module writes an activation's lifecycle.

(About 500 lines: every way an activation stops, fences included, in the one
module that writes its lifecycle, so that their order reads in one place.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import anyio

from subagents.store import DiagnosticEntry, LogWriter, list_descendants, pending, read_header, release_lease
from subagents.store.lease import taken_over
from subagents.store.control import ControlRecord
from subagents.store.control import request as control_request
from subagents.store.errors import FencedError, LockTimeoutError, RecordTooLargeError, SubagentError
from subagents.store.locks import LOCK_TIMEOUT_S
from subagents.store.mailbox import check_message

from ..descriptors import outlasting
from ..errors import UnauthorizedError
from ..models import AncestorAuthority, UserAuthority
from ..runtime import Runtime
from .activation import Activation, ActivationTable, LeaseState, Lifecycle, log_fields
from .admission import Admission
from .delivery import Delivery
from .indexed import continuable, indexed_mode, listed
from .unhosted import DrainsUnderWay, drain_request, drain_unhosted, pending_of
from .settlement import bounded_line, epoch_stop_reason, settlement_text

# what a notice's record holds beside its text (its source, ids, framing) and what its log record adds, with room to spare
_NOTICE_ROOM = 4096

__all__ = ["Teardown", "Reached"]


@dataclass(frozen=True)
class Reached:
    """The children a drain reached that this supervisor does not host."""

    asked: list[str]  # another live supervisor hosts it: a durable drain request, carried out by that host
    here: list[str]  # nobody hosts it: drained by the caller (an open turn closed, pending messages discarded)
    # not drained, and why: its files do not read (its row is a diagnostic, or they refused the drain)
    failed: dict[str, str] = field(default_factory=dict)

    def merged(self, other: "Reached") -> "Reached":
        return Reached(self.asked + other.asked, self.here + other.here, {**self.failed, **other.failed})


def _notice(child_id: str, reason: str, output: str, *, cut: int | None = None) -> tuple[dict[str, Any], str]:
    """A settlement notice's source and text (``settlement_text``; ``cut`` as there)."""
    summary, body = settlement_text(child_id, reason, output, cut=cut)
    return {"kind": "subagent-settled", "form": "notice", "summary": bounded_line(summary), "sender_session_id": child_id}, body

log = logging.getLogger(__name__)


class Teardown:
    def __init__(self, rt: Runtime, table: ActivationTable, admission: Admission, delivery: Delivery, *, drains: DrainsUnderWay) -> None:
        self._rt = rt
        self._table = table
        self._admission = admission
        self._delivery = delivery
        self._drains = drains

    # -- interrupt ---------------------------------------------------------------------

    def interrupt(self, target_id: str, authority: UserAuthority | AncestorAuthority) -> bool:
        """Cancel the target's current turn; an unknown or inactive target is a no-op.

        Returns whether a turn is being stopped: one in flight, or one about to be
        dispatched for a message accepted before now. An idle activation, or one
        with nothing left to run, has no turn to stop.
        """
        if isinstance(authority, AncestorAuthority):
            caller = authority.agent_id
            if not self._table.is_live(caller):
                raise UnauthorizedError.not_live_ancestor(target_id)
            if caller == target_id:
                raise UnauthorizedError.self_interrupt(target_id)
            act = self._table.get(target_id)
            if act is None or act.disposing:
                return False
            if caller not in act.identity.ancestry:
                raise UnauthorizedError.not_descendant(target_id, caller)
            reason = "parent"
        else:
            try:
                header = read_header(self._rt.store, target_id)
            except SubagentError:
                return False  # unknown target: no-op
            if header.parent_session != authority.parent_session:
                raise UnauthorizedError.other_parent(target_id)
            act = self._table.get(target_id)
            if act is None or act.disposing:
                return False
            reason = "user"
        return self._stop_turn(act, reason, time.time())

    def _stop_turn(self, act: Activation, reason: str, asked_at: float, aim: dict[str, Any] | None = None) -> bool:
        """Stop the turn in flight, or else the next one, unless its message came after the request
        (mailbox ``ts`` against ``asked_at``, one host's clock): a request read late — a control
        record read after the turn it aimed at ended — never stops a turn that started after it.

        ``aim``: a control record's data, which names the turn its writer saw (``_aimed_at``): that
        turn or none, even when the next one's message was accepted before the request."""
        aim = aim or {}
        aimed = _aimed_at(act, aim)
        if aimed is False:
            return False
        if act.ticket is not None:
            if act.being_stopped:
                return False  # a second cancel would stop nothing more
            # only a request naming this turn's own message was written while it ran; one aimed "after
            # the last consumed message" was written between turns, and a message accepted after it
            # is not the turn it asked to stop (as ``stop_before`` says for a turn not yet dispatched)
            names_it = isinstance(aim.get("message_id"), str)
            if not names_it and act.turn_message_ts is not None and act.turn_message_ts > asked_at:
                return False
            self._rt.pool.cancel(act.ticket, reason)
            act.stopping = act.ticket
            return True
        # no turn in flight yet: the current turn is the next one, if its message was accepted
        # before the request (mailbox ``ts``, same host clock; a later message is not stopped)
        act.stop_before = (reason, asked_at)
        return act.lease_state is LeaseState.RUNNING and self._has_waking_pending(act)

    def apply_control(self, act: Activation, record: ControlRecord) -> None:
        """A control record another process wrote for a hosted child (the store watcher calls this)."""
        if record.kind == "interrupt":
            stopped = self._stop_turn(act, "user", record.ts, record.data)
            log.info("control record %d (%s) of %s: interrupt %s", record.seq, record.id, act.child_id,
                     "applied" if stopped else "found no turn it was asked for (the turn ended or had not begun)",
                     extra=log_fields(act))
        elif record.kind == "drain":
            self.open_disposal(act, discard=True)
        else:
            log.warning("control record %d of %s has unknown kind %r; ignored", record.seq, act.child_id, record.kind, extra=log_fields(act))

    # -- disposal ----------------------------------------------------------------------

    def open_disposal(self, act: Activation, *, discard: bool, cause: str = "parent") -> None:
        """Top-down: mark, cancel the current turn, wake; then the same for owned children.

        ``cause`` is the cancel's reason when the disposal does not discard (a drain's is ``drain``):
        ``parent`` when a parent's disposal stops the child, ``disposed`` when the supervisor closes,
        as a one-shot run's turn records it then; nobody's parent stopped a turn its host closed on.

        The tree is walked with a work list, not by recursion: a program that
        starts itself builds a chain of live children deeper than Python's
        recursion limit, and a recursive walk then failed half-way through a
        close or a drain and left it waiting for good.
        """
        pending = [act]
        while pending:
            act = pending.pop()
            if act.disposing:
                continue
            act.lifecycle = Lifecycle.DISPOSING
            act.discard = discard
            if act.ticket is not None:
                # a drain (which discards) cancels with its own reason, so the log says the turn was drained
                self._rt.pool.cancel(act.ticket, "drain" if discard else cause)
            act.poke()
            owned = (self._table.get(child_id) for child_id in self._table.owned(act.child_id))
            pending.extend(reversed([child for child in owned if child is not None]))

    def fence(self, act: Activation) -> None:
        """Another supervisor took this child over: stop, and never write to its files again."""
        if not act.fenced:
            log.warning(
                "activation %s was taken over by another supervisor (fenced at epoch %d); dropping it", act.child_id, act.epoch,
                extra=log_fields(act),
            )
        act.fenced = True
        act.lifecycle = Lifecycle.DISPOSING
        if act.ticket is not None:
            self._rt.pool.cancel(act.ticket, "fenced")
        act.poke()  # an idle activation's driver waits for a message: it ends now

    async def fence_taken_over(self) -> list[str]:
        """``fence`` each resident activation whose lease reads as another supervisor's (``taken_over``,
        after this one's heartbeat lapsed); the ids fenced. A lease of ours at a higher epoch is this
        supervisor's own fence before a crash repair, caught between its acquisition and the activation
        taking the new epoch: not counted."""
        acts = {act.child_id: act for act in self._table if not act.fenced}
        taken = await anyio.to_thread.run_sync(taken_over, self._rt.store, self._rt.owner_id, list(acts))
        for child_id in taken:
            self.fence(acts[child_id])
        return taken

    async def dispose(self, act: Activation) -> bool:
        """Child-first teardown, on the driver's task after its loop ends.

        Returns whether messages another process left for the child arrived
        meanwhile (the caller resumes the child for them).
        """
        act.lifecycle = Lifecycle.DISPOSING
        for child_id in self._table.owned(act.child_id):
            child = self._table.get(child_id)
            if child is not None:
                self.open_disposal(child, discard=act.discard)
                await child.disposed.wait()
        if act.fenced:
            self._finish(act, "error", None, taken_over=True)
            # a message accepted for it here before its fence was known (its host paused past its lease, say)
            # was left for this activation, and the one that took the child over may have let go already:
            # read as the log stands (this activation's cursor is stale), and the caller resumes it, which
            # a live holder refuses (it runs the message itself)
            return (not act.discard and not self._admission.closing
                    and await self._rt.store_thread.run(lambda: self._has_waking_pending(act, as_logged=True)))
        dropped = False
        rt = self._rt
        try:
            if act.discard:
                await self._deliveries_landed(act)
                dropped = await rt.store_thread.run(self._discard_pending, act)
        except (SubagentError, OSError):  # the store takes no write now: the messages stay pending, as at a close
            log.warning("could not discard the pending messages of %s", act.child_id, extra=log_fields(act), exc_info=True)
        reason = epoch_stop_reason(act.reasons, dropped)
        try:
            await outlasting(lambda: rt.store_thread.run(release_lease, rt.store, act.child_id, rt.owner_id, act.epoch),
                             f"the lease release of {act.child_id}")
        except FencedError:
            log.warning("lease of %s was taken over before release", act.child_id, extra=log_fields(act))
        except (SubagentError, OSError):
            # the store takes no write now (a read-only mount, its files' modes): the child is settled here
            # all the same, and its lease reads as free once this supervisor's heartbeat stops
            log.warning("could not release the lease of %s; it lapses with this supervisor", act.child_id,
                        extra=log_fields(act), exc_info=True)
        # another process may have accepted a message after our last mailbox read and seen our
        # lease still held; it left the message for us. Re-read after releasing: one of us sees it.
        resume_after = (not act.discard and not act.stalled and not self._admission.closing
                        and await rt.store_thread.run(self._has_waking_pending, act))
        undelivered = notice_id = None
        if act.reasons or dropped:
            notice_id, undelivered = await self._notify_parent(act, reason)
        else:
            # resumed for a message its acceptance then refused (a full disk, a damaged mailbox): nothing
            # ran or was dropped, so the parent's last notice still says how it stands
            log.info("subagent %s settled again without a turn: no settlement notice", act.child_id, extra=log_fields(act))
        self._finish(act, reason, act.last_output or None, undelivered, notice_id=notice_id)
        return resume_after

    async def _notify_parent(self, act: Activation, reason: str) -> tuple[str | None, str | None]:
        """The settlement notice, durably in the parent's mailbox (quiet when the parent's lineage is closing).
        Returns, for ``subagent/end``, the notice's message id (None when none was sent) and why the parent's
        files refused it (``CODE: message``; None once delivered)."""
        wake = not self._admission.closed_below(act.parent_id)
        try:
            output, limit = act.last_output, self._rt.store.max_record_bytes
            if len(output) * 4 + _NOTICE_ROOM < limit:  # four bytes a character at most: it fits as it is
                source, body = _notice(act.child_id, reason, output)
            else:  # framed as the mailbox would, off the event loop (up to the record limit of text)
                source, body = await self._rt.store_thread.run(self._fitting_notice, act.child_id, act.parent_id, reason, output, wake)
            # resident: its driver takes it; else its mailbox, unless it can never have a next turn
            if await outlasting(lambda: self._delivery.takes_messages(act.parent_id), f"the settlement notice of {act.child_id}"):
                return await outlasting(lambda: self._delivery.send_to(act.parent_id, source, body, wake=wake),
                                        f"the settlement notice of {act.child_id}"), None
            log.info("subagent %s settled; its parent %s is a one-shot child (or gone), which takes no message: "
                     "the settlement notice is dropped", act.child_id, act.parent_id, extra=log_fields(act))
        except SubagentError as exc:
            # the parent's files refused it (damage, a takeover): the child is settled all the same. The
            # error's code and text say why; a traceback of the store's internals would say nothing more
            log.error("subagent %s settlement notice was not delivered to its parent %s: %s: %s", act.child_id, act.parent_id,
                      exc.code, exc, extra=log_fields(act))
            return None, f"{exc.code}: {exc.message}"
        return None, None

    def _fitting_notice(self, child_id: str, parent_id: str, reason: str, output: str, wake: bool) -> tuple[dict[str, Any], str]:
        """The notice's source and text, its closing message cut (by halves) until the parent's mailbox
        would take it: a closing message near the record limit would otherwise make a notice no mailbox
        takes, and the parent would hear nothing."""
        cut = None
        while True:
            source, body = _notice(child_id, reason, output, cut=cut)
            try:
                check_message(self._rt.store, parent_id, source=source, content=body, wake=wake)
                return source, body
            except RecordTooLargeError:
                if cut == 0:
                    raise
                cut = (len(output.encode("utf-8")) if cut is None else cut) // 2

    def _finish(self, act: Activation, reason: str, last_message: str | None, undelivered: str | None = None, *,
                notice_id: str | None = None, taken_over: bool = False) -> None:
        """The last steps of every disposal: setup released, out of the table, the parent stops owning
        the child, ``subagent/end`` (with ``notice_id``, the id of the settlement notice this activation
        sent; ``notice_problem`` when the parent's files refused it: a caller waiting for the notice
        learns it will not come; ``taken_over`` when another supervisor took the child over, and the
        notice of its next settlement, if any, is that supervisor's), done.

        The activation leaves the table only here, after its settlement notice is in its
        parent's mailbox: a parent disposing meanwhile finds it among what it owns and waits
        for ``disposed``, so the parent's own disposal (a drain discarding its mailbox) never
        reads that mailbox before the notice lands.
        """
        if act.setup is not None:
            try:
                act.setup.release()
            except SubagentError:
                log.exception("subagent %s activation teardown failed", act.child_id, extra=log_fields(act))
        self._table.remove(act)
        self._delivery.forget(act.child_id)
        self._table.disown(act.parent_id, act.child_id)
        self._admission.reopen(act.child_id)
        self._rt.events.emit(
            "subagent/end",
            {"run_id": act.identity.run_id, "provider": act.identity.descriptor.provider, "id": act.child_id, "local": True,
             "stop_reason": reason, "last_assistant_message": last_message,
             **({"notice_id": notice_id} if notice_id is not None else {}),
             **({"notice_problem": undelivered} if undelivered is not None else {}),
             **({"taken_over": True} if taken_over else {})},
        )
        act.lifecycle = Lifecycle.DISPOSED
        act.disposed.set()

    @staticmethod
    async def _deliveries_landed(act: Activation) -> None:
        """Wait for the acceptances in flight as the disposal began (``Delivery.deliver``): acknowledged, they
        are pending messages the drain drops with the rest; read before they land, they were left pending,
        and ran when a later host resumed the drained child. No new one starts once the activation is
        disposing (its senders wait for it to be disposed, then find admission closed)."""
        while act.admitted:
            act.wake = anyio.Event()
            if act.admitted:
                await act.wake.wait()

    def _has_waking_pending(self, act: Activation, *, as_logged: bool = False) -> bool:
        """Whether the child's mailbox holds a waking message not taken yet: past this activation's cursor,
        or (``as_logged``) past what its log took, for an activation whose cursor is stale (fenced)."""
        try:
            messages = pending_of(self._rt.store, act.child_id) if as_logged else self._pending(act)
        except SubagentError:
            return False
        return any(m.wake for m in messages)

    def _pending(self, act: Activation) -> list:
        c = act.cursor
        return pending(self._rt.store, act.child_id, consumed=c.consumed, last_consumed_id=c.last_id, mailbox_end=c.mailbox_end)

    def _discard_pending(self, act: Activation) -> bool:
        """Record the whole pending mailbox as consumed unrun (``message/discarded``); whether any was."""
        try:
            messages = self._pending(act)
            if not messages:
                return False
            with LogWriter.open(self._rt.store, act.child_id, epoch=act.epoch) as writer:
                writer.append([("message/discarded", {"message_id": m.id, "mailbox_end": m.end, "cause": "drain"}) for m in messages], commit=True)
        except SubagentError:
            log.exception("could not discard pending messages of %s", act.child_id, extra=log_fields(act))
            return False
        act.cursor.advance(messages)
        return True

    # -- drain and close -----------------------------------------------------------------

    async def drain(self, roots: list[str]) -> Reached:
        """Close admission below the live ``roots`` and dispose their continuable descendants child-first.

        Descendants this supervisor does not host are reached too (``_reach_descendants``): another live
        supervisor's get a durable drain request, which that host carries out (not awaited here);
        those nobody hosts are drained here. Returns what that reach did, and could not do."""
        live_roots = [r for r in roots if self._table.is_live(r)]
        self._admission.drain_below(live_roots)
        targets = [a for a in self._table if any(r in a.identity.ancestry for r in live_roots)]
        for act in targets:
            self.open_disposal(act, discard=True)
        await self._admission.wait_materializing()
        for act in targets:
            await act.disposed.wait()
        here = {act.child_id for act in targets}
        reached = Reached([], [])
        for root_id in live_roots:
            reached = reached.merged(await self._reach_descendants(root_id, {"root": root_id}, skip=here))
        # admission stays closed below each root until that root is disposed (``Admission.reopen``)
        return reached

    async def drain_children(self, parent_id: str, child_ids: Iterable[str]) -> Reached:
        """Dispose the named direct children of the live ``parent_id`` (admission stays open).

        Resident ones here, child-first. The others, with their continuable descendants, as ``drain``
        reaches them: a child another supervisor hosts gets a drain request, one nobody hosts (its
        pending messages left by a closed or dead host) is drained here. Every id is authorized
        before anything is torn down; an id that names no session is skipped. Returns what the
        reach of the others did, and could not do."""
        if not self._table.is_live(parent_id):
            raise UnauthorizedError.teardown_needs_parent()
        selected, elsewhere = [], []
        for child_id in dict.fromkeys(child_ids):
            starting = self._admission.in_flight(child_id)
            if starting is not None:
                # its start is still writing here (a reserved id): the header first, then the prompt, the index
                # row, the activation. Looked at meanwhile, it read as nobody's child (UNAUTHORIZED) or as an
                # unhosted child with nothing to drain, and then ran: what the start publishes is drained
                # below, and one that rolls back leaves nothing
                await starting.wait()
            act = self._table.get(child_id)
            if act is None:
                elsewhere.append(child_id)
                continue
            if act.parent_id != parent_id or parent_id not in act.identity.ancestry:
                raise UnauthorizedError.not_direct_child(child_id, parent_id)
            selected.append(act)
        if elsewhere:
            # a listing of the parent's children: off the store thread, whose calls (acceptances) wait behind it
            elsewhere = await anyio.to_thread.run_sync(self._stored_children, parent_id, elsewhere)
        for act in selected:
            self.open_disposal(act, discard=True)
        for act in selected:
            await act.disposed.wait()
        reached = Reached([], [])
        for child_id in elsewhere:
            reached = reached.merged(await self._reach_descendants(child_id, {"parent": parent_id}, skip=set(), itself=True))
        return reached

    def _stored_children(self, parent_id: str, child_ids: list[str]) -> list[str]:
        """Which of ``child_ids`` (hosted nowhere here) are continuable children of ``parent_id`` in the
        store (blocking); ``UNAUTHORIZED`` for one whose header names another parent. Reads the parent's
        index and the named children's own files, never their siblings': a listing of the parent's children
        (which ``lstat``s or reads each one) made draining one settled child of a parent with 800 others
        cost ~30 ms of CPU, growing with every child the parent ever had (found by a soak probe). The index
        is read on from where this process last stopped (``indexed.listed``), not decoded whole each time."""
        store = self._rt.store
        indexed = listed(store, parent_id, child_ids)
        found = []
        for child_id in child_ids:
            try:
                header = read_header(store, child_id)
            except SubagentError:
                continue  # no such session (or one whose header does not read): nothing to tear down
            if header.parent_session != parent_id:
                raise UnauthorizedError.not_direct_child(child_id, parent_id)
            entry = indexed.get(child_id)
            # one not indexed yet is a creation under way elsewhere, with nothing to drain so far
            if entry is not None and entry.subagent and header.origin == "subagent" and continuable(store, child_id, entry):
                found.append(child_id)
        return found

    async def drain_remote(self, root_id: str) -> Reached:
        """Ask the supervisors hosting continuable descendants of ``root_id`` to tear them down.

        Writes a durable ``drain`` control record for each descendant whose lease a
        live other supervisor holds (``Reached.asked``). One that nobody hosts is
        drained here (``unhosted.py``): its open turn closed, its pending messages
        discarded (``Reached.here``, when there was anything to do). Admission below
        the root is closed only in this supervisor (``drain``), not in theirs.
        """
        return await self._reach_descendants(root_id, {"root": root_id}, skip=set())

    async def _reach_descendants(self, top_id: str, request: dict[str, Any], *, skip: set[str], itself: bool = False) -> Reached:
        """Tear down the continuable descendants of ``top_id`` (and ``top_id`` when ``itself``) that this
        supervisor does not host, save ``skip``: a durable ``drain`` control record (``request``, its
        data) for each one a live other supervisor holds; one nobody hosts is drained here
        (``unhosted.py``)."""
        store, ids = self._rt.store, self._rt.ids

        def targets() -> Reached:
            reached = Reached([], [])
            rows = list_descendants(store, top_id)
            below = [row.entry.id for row in rows if getattr(row.entry, "mode", None) == "continuable"]
            for row in rows:
                entry = row.entry
                # whether it is a continuable child with work waiting cannot be told from its files: said, not
                # skipped in silence, unless its parent's index recorded it one-shot (no drain's business)
                if (isinstance(entry, DiagnosticEntry) and entry.id not in skip and entry.id not in self._table
                        and indexed_mode(store, row.parent_id, entry.id) != "one-shot"):
                    reached.failed[entry.id] = f"its files do not read ({entry.reason})"
            for child_id in [top_id, *below] if itself else below:
                if child_id in skip or child_id in self._table:
                    continue
                if self._delivery.settled_holder_elsewhere(child_id) is not None:
                    # where its mailbox ends: what the drain covers should its host never carry it out (unhosted.py)
                    try:
                        control_request(store, child_id, "drain", drain_request(store, child_id, request), ids=ids,
                                        lock_timeout=LOCK_TIMEOUT_S)
                    except LockTimeoutError as exc:  # a stopped process holds its lock: said, and the others reached
                        reached.failed[child_id] = f"{exc.code}: {exc.message}"
                        continue
                    reached.asked.append(child_id)
                    continue
                try:
                    if drain_unhosted(store, child_id, self._rt.owner_id, self._drains):
                        reached.here.append(child_id)
                except SubagentError as exc:
                    log.warning("could not drain %s, which no supervisor hosts: %s", child_id, exc)
                    reached.failed[child_id] = f"{exc.code}: {exc.message}"
            return reached

        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(targets)

    async def close(self) -> None:
        """Manager-wide drain: admission closed forever; pending messages stay for the next activation."""
        self._admission.close()
        await self._admission.wait_materializing()
        acts = list(self._table)
        for act in acts:
            self.open_disposal(act, discard=False, cause="disposed")
        for act in acts:
            await act.disposed.wait()


def _aimed_at(act: Activation, aim: dict[str, Any]) -> bool | None:
    """Whether an interrupt request names the activation's current turn (the one in flight, or
    else the next one); None when it names no turn (a writer that predates naming them).

    ``message_id``: its writer saw a turn running that message — the current turn only if it is
    the one in flight. ``after_message_id``: it saw no turn running, the log's last consumed
    message being this (None: none yet) — the current turn only if it starts right after that
    message, which the cursor says while that turn is in flight or about to be dispatched.
    """
    if isinstance(aim.get("message_id"), str):
        return act.ticket is not None and act.turn_message_id == aim["message_id"]
    if "after_message_id" in aim:
        return act.cursor.last_id == aim["after_message_id"]
    return None
