"""Continuable children: activations, durable delivery, ownership, settlement, drain.

An **activation** is one residency epoch of a continuable child in this
supervisor: its lease (epoch), its driver task, the children it owns. At most
one per session across all processes (the lease guarantees it).

Delivery is durable: ``start_continuable``, ``followup`` and ``report_from``
return a message id only once the message is fsync'd in the recipient's
mailbox. The driver takes messages in FIFO order; each *waking* message is
one turn (a followup never steers a running turn); *quiet* messages wait and
are handed to the next turn as context. The log records consumption
(``message/accepted``), so after any crash every accepted message is
delivered exactly once, in order, when the child is next activated — by any
supervisor.

Lifecycle: ``running`` (a turn runs or waking work is queued) → ``waiting``
(quiescent, owns live children; lease ``idle``) → ``settled`` (quiescent,
owns none) → disposed: lease released, the settlement notice (REFERENCE.md
§3 texts) delivered durably to the parent's mailbox *before* the parent's
ownership is released, ``subagent/end`` emitted. Disposal is child-first;
cancellation goes top-down.

Choices where the reference differs or is silent (documented in README):
* ``interrupt`` cancels only the current turn; queued waking messages then
  run at once (the reference parks them until the next waking send, its
  known "wake gap").
* a busy parent receives a settlement notice as a queued waking message (a
  turn after its current one), not mid-turn; a parent below a closing
  lineage receives it quiet.
* ``drain`` discards the pending mailbox of the activations it tears down
  (``message/discarded``); closing the supervisor does not: their messages
  stay pending and are delivered on the next activation.
* a cold resume runs under the child's own log: its last ``sandbox/mode``
  (never widened by a restart), its descriptor's persona and tool filter.
  The ``budget`` of ``start_continuable`` bounds each turn of the first
  residency epoch only; like the reference's ``maxTokens`` it is not
  persisted, so a resumed child runs unbudgeted.
* the program is found through the provider named in the descriptor:
  registered, or unregistered from this supervisor since (the registry
  remembers it), or a built-in program of that name. A followup that needs
  a cold resume nobody can run fails ``NO_PROVIDER`` before it is accepted.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import anyio

from subagents.store import (
    ContinuableDescriptor,
    LeaseHeldError,
    LogWriter,
    MailboxMessage,
    Store,
    ToolFilter,
    accept,
    acquire_lease,
    create_session,
    delete_session,
    inspect,
    list_descendants,
    pending,
    read_header,
    read_projection,
    release_lease,
    set_lease_state,
)
from subagents.store.control import read_controls
from subagents.store.control import request as control_request
from subagents.store.errors import FencedError, SessionNotFoundError, SubagentError
from subagents.store.lease import owner_alive, read_lease, read_owner
from subagents.store.ids import validate_session_id
from subagents.worker.programs import BUILTIN_PROGRAMS
from subagents.worker.logcontext import bind
from subagents.worker.protocol import Budget, TurnSpec

from .backend import TurnTicket
from .errors import InvalidRequestError, SubagentDepthError, no_provider
from .models import AgentRef, AncestorAuthority, ContinuableSpec, UserAuthority
from .oneshot import program_fields, validate_budget, validate_max_depth
from .setup import ActivationInfo, SetupBatch, SetupRegistry

if TYPE_CHECKING:
    from .service import Supervisor

__all__ = ["Activation", "ContinuationManager", "settlement_text", "SUMMARIES"]

log = logging.getLogger(__name__)

SUMMARIES = {
    "completed": "Background subagent {id} finished and will do no further work unless you send it more.",
    "aborted": "Background subagent {id} was stopped before it finished.",
    "max-tokens": "Background subagent {id} ran out of room before it finished.",
    "refusal": "Background subagent {id} declined the task.",
    "error": "Background subagent {id} failed before it finished.",
}


def epoch_stop_reason(reasons: list[str], dropped_unrun: bool) -> str:
    """REFERENCE.md §1.5 continuable epoch mapping over the epoch's own turns."""
    if not reasons:
        return "aborted" if dropped_unrun else "completed"
    last = reasons[-1]
    if last in ("aborted", "interrupted"):
        return "aborted"
    if last == "blocked" or last == "refusal":
        return "refusal"
    if last in ("max-tokens", "error"):
        return last
    if last == "completed":
        return "aborted" if dropped_unrun else "completed"
    return last


def settlement_text(child_id: str, reason: str, output: str) -> tuple[str, str]:
    """(summary line, whole notice) in the reference's exact words."""
    template = SUMMARIES.get(reason)
    summary = template.format(id=child_id) if template else f"Background subagent {child_id} ended abnormally ({reason}) before it finished."
    body = f"{summary}\nIts closing message:\n{output}" if output else f"{summary}\nIt left no closing message."
    return summary, body


def _fields(act: "Activation") -> dict[str, Any]:
    """Structured logging fields of an activation (``extra=``): child, parent, epoch."""
    return {"child": act.child_id, "parent": act.parent_id, "epoch": act.epoch}


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _bounded(line: str) -> str:
    first = line.splitlines()[0] if line else ""
    return first if len(first) <= 120 else first[:119] + "…"


@dataclass(eq=False)
class Activation:
    child_id: str
    parent_id: str
    descriptor: ContinuableDescriptor
    epoch: int
    depth: int
    sandbox: str | None
    ancestry: frozenset[str]
    run_id: str
    consumed: int
    last_id: str | None
    mailbox_end: int | None = None  # where the unconsumed mailbox starts (None: read it all)
    owned: set[str] = field(default_factory=set)
    wake: anyio.Event = field(default_factory=anyio.Event)
    disposed: anyio.Event = field(default_factory=anyio.Event)
    disposing: bool = False
    discard: bool = False
    admitted: int = 0
    handle: TurnTicket | None = None  # the pool's ticket of the turn in flight
    reasons: list[str] = field(default_factory=list)
    last_output: str = ""
    state: str = "running"
    budget: Budget = field(default_factory=Budget)
    # an interrupt that found no turn executing: (reason, time) — it stops the next turn
    # if that turn's message was accepted before the interrupt (``interrupt``)
    stop_before: tuple[str, float] | None = None
    # what the store watcher has seen (other processes append to the mailbox and control files)
    mailbox_size: int = 0
    control_seq: int = -1
    fenced: bool = False  # taken over by another supervisor: drop without touching the store
    setup: SetupBatch | None = None  # the setup contributions installed into this activation

    def poke(self) -> None:
        self.wake.set()


class ContinuationManager:
    def __init__(self, sup: "Supervisor") -> None:
        self.sup = sup
        self.store: Store = sup.store
        self.activations: dict[str, Activation] = {}
        self._draining_roots: set[str] = set()
        self._closing = False
        self._materializing: dict[str, anyio.Event] = {}
        # cold resumes under way, one per child: a second delivery waits for the first instead of
        # acquiring the lease again (a re-acquisition by the same owner raises the epoch and
        # would fence the activation the first one installs)
        self._resuming: dict[str, anyio.Event] = {}
        self.setups = SetupRegistry()

    # -- admission -------------------------------------------------------------

    def _lineage(self, agent_id: str) -> list[str]:
        """The agent and its live ancestors (through activations and live children)."""
        chain = [agent_id]
        seen = {agent_id}
        current = agent_id
        while True:
            act = self.activations.get(current)
            live = self.sup.agents.get(current)
            parent = act.parent_id if act else (live.parent if live else None)
            if parent is None or parent in seen:
                return chain
            chain.append(parent)
            seen.add(parent)
            current = parent

    def _admit(self, parent_id: str) -> None:
        if self._closing:
            raise SubagentError("continuable subagents are draining; the operation was not admitted", code="DRAINING")
        for node in self._lineage(parent_id):
            if node in self._draining_roots:
                raise SubagentError(
                    f'continuable subagents below parent "{node}" are draining; the operation was not admitted', code="DRAINING"
                )

    def _is_live(self, agent_id: str) -> bool:
        return agent_id in self.sup.agents or agent_id in self.activations

    # -- start ---------------------------------------------------------------------

    async def start_continuable(self, spec: ContinuableSpec) -> tuple[str, str]:
        parent_id = spec.parent_id
        self._admit(parent_id)
        provider = self.sup.registry.require(spec.provider)
        if not provider.continuable:
            raise SubagentError(
                f'subagent provider "{provider.name}" does not support continuable children (no prepareContinuable capability)',
                code="UNSUPPORTED_CAPABILITY",
                provider=provider.name,
            )
        max_depth = validate_max_depth(spec.max_depth)
        budget = validate_budget(spec.budget)
        tool_filter = None
        if spec.tool_filter is not None:
            try:
                tool_filter = ToolFilter.model_validate(spec.tool_filter)
            except Exception as exc:
                raise InvalidRequestError(f"tool_filter is invalid: {exc}") from None
        if not isinstance(spec.label, str):
            raise InvalidRequestError("a continuable child needs a string label")
        child_id = spec.child_id
        if child_id is not None:
            validate_session_id(child_id)
            if self._is_live(child_id) or self.store.exists(child_id):
                raise SubagentError(f'subagent "{child_id}" already exists', code="DUPLICATE_CHILD", child_id=child_id)
        else:
            child_id = self.sup._ids.new()
        if not self._is_live(parent_id):
            raise SubagentError(f'subagent "{child_id}" delivery requires the exact live parent agent', code="UNAUTHORIZED")
        parent_act = self.activations.get(parent_id)
        if parent_act is not None and parent_act.disposing:
            raise SubagentError(
                f'subagent parent "{parent_id}" is being disposed; the child was not established', code="ACTIVATION_CLOSING"
            )
        parent = self.sup.runs._parent(parent_id)
        child_depth = parent.depth + 1
        if max_depth is not None and child_depth > max_depth:
            raise SubagentDepthError(child_depth, max_depth)
        sandbox = spec.sandbox if spec.sandbox is not None else parent.sandbox
        descriptor = ContinuableDescriptor(
            provider=provider.name,
            label=spec.label,
            agent_provider=spec.agent_provider,
            agent_model=spec.model,
            persona=spec.persona,
            tool_filter=tool_filter,
        )
        prompt = spec.prompt if isinstance(spec.prompt, str) else json.dumps(spec.prompt)
        events: list[tuple[str, Any]] = []
        if sandbox is not None:
            events.append(("sandbox/mode", {"mode": sandbox, "source": "delegation"}))
        events.append(("approval/policy", {"policy": "never", "source": "delegation"}))
        events.append(("subagent/descriptor", descriptor.to_record()))
        owner = self.sup.lease_keeper.owner_id
        ids = self.sup._ids

        seed: list[dict[str, Any]] = []
        if provider.inherits_parent_context:
            seed = await anyio.to_thread.run_sync(self._fork_prefix, parent_id)

        def materialize() -> tuple[int, str]:
            create_session(
                self.store, child_id, parent_session=parent_id, origin="subagent", delegation_depth=child_depth,
                seed=seed, events=events, lease_owner=owner,
            )
            try:
                epoch = 1
                message_id = accept(self.store, child_id, source={"kind": "user"}, content=prompt, ids=ids)
                return epoch, message_id
            except BaseException:
                delete_session(self.store, child_id, parent_session=parent_id)
                raise

        done = anyio.Event()
        self._materializing[child_id] = done
        try:
            with anyio.CancelScope(shield=True):
                epoch, message_id = await anyio.to_thread.run_sync(materialize)
                try:
                    self._admit(parent_id)  # a drain may have begun while we wrote
                    if parent_act is not None and parent_act.disposing:
                        raise SubagentError(
                            f'subagent parent "{parent_id}" is being disposed; the child was not established',
                            code="ACTIVATION_CLOSING",
                        )
                    info = ActivationInfo(child_id, parent_id, spec.label, provider.name, child_depth, epoch, resumed=False)
                    batch = self.setups.install(info)
                    batch.commit()
                except BaseException:
                    await anyio.to_thread.run_sync(lambda: delete_session(self.store, child_id, parent_session=parent_id))
                    raise
        finally:
            del self._materializing[child_id]
            done.set()
        act = Activation(
            child_id=child_id, parent_id=parent_id, descriptor=descriptor, epoch=epoch, depth=child_depth, sandbox=sandbox,
            ancestry=frozenset(self._lineage(parent_id)), run_id=self.sup._ids.new(), consumed=0, last_id=None,
            budget=budget, setup=batch,
        )
        self._install(act, provider_name=provider.name)
        return child_id, message_id

    def _fork_prefix(self, parent_id: str) -> list[dict[str, Any]]:
        """The parent's completed-turn prefix: events up to its last ``turn/end``."""
        events = inspect(self.store, parent_id).events
        last = max((i for i, e in enumerate(events) if e["type"] == "turn/end"), default=-1)
        return [{"type": e["type"], "data": e["data"], "ts": e["ts"]} for e in events[: last + 1]]

    def _install(self, act: Activation, *, provider_name: str) -> None:
        act.mailbox_size = _size(self.store.path(act.child_id, "mailbox"))
        controls = read_controls(self.store, act.child_id)
        act.control_seq = controls[-1].seq if controls else -1  # older requests were about older turns
        self.activations[act.child_id] = act
        parent_act = self.activations.get(act.parent_id)
        if parent_act is not None:
            parent_act.owned.add(act.child_id)
        log.info("activation of %s started", act.child_id, extra=_fields(act))
        self.sup.events.emit("subagent/start", {"run_id": act.run_id, "provider": provider_name, "id": act.child_id, "local": True})
        self.sup._tg.start_soon(self._drive, act)

    # -- delivery ------------------------------------------------------------------------

    async def followup(self, parent: AgentRef | str, child_id: str, content: Any, *, source: dict[str, Any] | None = None) -> str:
        parent_id = parent.id if isinstance(parent, AgentRef) else parent
        self._admit(parent_id)
        validate_session_id(child_id)
        if not self._is_live(parent_id):
            raise SubagentError(f'subagent "{child_id}" delivery requires the exact live parent agent', code="UNAUTHORIZED")
        text = content if isinstance(content, str) else json.dumps(content)
        src = source or {"kind": "coordinator", "form": "relay", "sender_session_id": parent_id}
        while True:
            act = self.activations.get(child_id)
            if act is not None and act.disposing:
                await act.disposed.wait()
                continue
            if act is None:
                act = await self._cold_resume(parent_id, child_id)
                if act is None:
                    continue
            if act.parent_id != parent_id:
                raise SubagentError(f'subagent "{child_id}" belongs to another parent session', code="UNAUTHORIZED")
            parent_act = self.activations.get(parent_id)
            if parent_act is not None:
                if parent_act.disposing:
                    raise SubagentError(
                        f'subagent "{child_id}" activation is being disposed; the message was not accepted', code="ACTIVATION_CLOSING"
                    )
                parent_act.owned.add(child_id)
            return await self._deliver(act, src, text, wake=True)

    async def _deliver(self, act: Activation, source: dict[str, Any], text: str, *, wake: bool) -> str:
        """Durably accept a message for a resident activation and wake its driver."""
        act.admitted += 1
        try:
            with anyio.CancelScope(shield=True):
                message_id = await anyio.to_thread.run_sync(
                    lambda: accept(self.store, act.child_id, source=source, content=text, ids=self.sup._ids, wake=wake)
                )
        finally:
            act.admitted -= 1
            act.poke()
        return message_id

    async def _cold_resume(self, parent_id: str, child_id: str) -> Activation | None:
        """Materialize an activation from the store alone (never through the provider).

        ``None`` when another delivery resumed (or tried to resume) the child meanwhile: the caller looks again.
        """
        under_way = self._resuming.get(child_id)
        if under_way is not None:
            await under_way.wait()
            return None
        done = self._resuming[child_id] = anyio.Event()
        try:
            return await self._resume_from_store(parent_id, child_id)
        finally:
            del self._resuming[child_id]
            done.set()

    async def _resume_from_store(self, parent_id: str, child_id: str) -> Activation | None:
        try:
            header = await anyio.to_thread.run_sync(read_header, self.store, child_id)
        except SessionNotFoundError as exc:
            raise SubagentError(f'subagent "{child_id}" is unavailable', code="NOT_RESUMABLE", child_id=child_id) from exc
        except SubagentError as exc:
            raise SubagentError(f'subagent "{child_id}" is unavailable', code="NOT_RESUMABLE", child_id=child_id) from exc
        if header.parent_session != parent_id:
            raise SubagentError(f'subagent "{child_id}" belongs to another parent session', code="UNAUTHORIZED")
        try:
            projection = await anyio.to_thread.run_sync(read_projection, self.store, child_id)
        except SubagentError as exc:
            raise SubagentError(f'subagent "{child_id}" is unavailable', code="NOT_RESUMABLE", child_id=child_id) from exc
        if projection.resume_error is not None:
            raise SubagentError(f'subagent "{child_id}" is unavailable: {projection.resume_error}', code="NOT_RESUMABLE")
        descriptor = projection.continuable()
        if descriptor is None:
            raise SubagentError(
                f'subagent "{child_id}" has no supported continuation state and cannot be resumed; do not retry send_message with this id',
                code="NOT_RESUMABLE",
                child_id=child_id,
            )
        if self._program(descriptor.provider) is None:
            raise no_provider(descriptor.provider)  # refused before anything is accepted
        if child_id in self.activations:
            return None  # another delivery materialized it meanwhile: loop
        self._admit(parent_id)
        try:
            lease = await anyio.to_thread.run_sync(lambda: acquire_lease(self.store, child_id, self.sup.lease_keeper.owner_id))
        except LeaseHeldError as exc:
            raise SubagentError(
                f'subagent "{child_id}" is unavailable: it is active in another supervisor', code="NOT_RESUMABLE", child_id=child_id
            ) from exc
        if child_id in self.activations:
            return None
        parent_live = self.sup.agents.get(parent_id)
        parent_act = self.activations.get(parent_id)
        parent_depth = parent_act.depth if parent_act else (parent_live.depth if parent_live else 0)
        depth = max(header.delegation_depth, parent_depth + 1)
        sandbox = projection.sandbox  # the delegated policy from its own log; resume re-captures nothing
        try:
            info = ActivationInfo(child_id, parent_id, descriptor.label, descriptor.provider, depth, lease.epoch, resumed=True)
            batch = self.setups.install(info)
            batch.commit()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(release_lease, self.store, child_id, self.sup.lease_keeper.owner_id, lease.epoch)
            raise
        act = Activation(
            child_id=child_id, parent_id=parent_id, descriptor=descriptor, epoch=lease.epoch, depth=depth, sandbox=sandbox,
            ancestry=frozenset(self._lineage(parent_id)), run_id=self.sup._ids.new(),
            consumed=projection.consumed, last_id=projection.last_message_id, mailbox_end=projection.mailbox_end,
            setup=batch,
        )
        self._install(act, provider_name=descriptor.provider)
        return act

    async def report_from(self, child_id: str, content: Any, *, delivery: str = "wakeup") -> str:
        if delivery not in ("quiet", "wakeup"):
            raise InvalidRequestError(f'report delivery must be "quiet" or "wakeup", got {delivery!r}')
        act = self.activations.get(child_id)
        if act is None:
            raise SubagentError(f'agent "{child_id}" is not a live continuable subagent and cannot report', code="UNAUTHORIZED")
        self._admit(child_id)
        if act.disposing:
            raise SubagentError(
                f'subagent "{child_id}" activation is being disposed; the report was not delivered', code="ACTIVATION_CLOSING"
            )
        if not self._is_live(act.parent_id):
            raise SubagentError("direct parent is not live; report was not delivered", code="PARENT_UNAVAILABLE")
        text = f"Background subagent {child_id} reported:\n{content if isinstance(content, str) else json.dumps(content)}"
        source = {"kind": "subagent-report", "form": "relay", "sender_session_id": child_id}
        return await self._send_to(act.parent_id, source, text, wake=delivery == "wakeup")

    async def _send_to(self, recipient: str, source: dict[str, Any], text: str, *, wake: bool) -> str:
        """Deliver to a live parent: an activation's driver, or a root's durable mailbox."""
        parent_act = self.activations.get(recipient)
        if parent_act is not None and not parent_act.disposing:
            return await self._deliver(parent_act, source, text, wake=wake)
        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(
                lambda: accept(self.store, recipient, source=source, content=text, ids=self.sup._ids, wake=wake)
            )

    async def send(self, child_id: str, content: Any, *, parent: str, source: dict[str, Any] | None = None) -> str:
        """Host-user continuation from any process: deliver a message to a child of ``parent``.

        Authority is the durable lineage (the child's header must name ``parent``),
        not a live parent object. Routing: an activation here → its mailbox and
        driver; a live activation in another supervisor → its durable mailbox,
        which that supervisor's watcher picks up; none → cold resume here.
        """
        validate_session_id(child_id)
        try:
            header = await anyio.to_thread.run_sync(read_header, self.store, child_id)
        except SubagentError as exc:
            raise SubagentError(f'subagent "{child_id}" is unavailable', code="NOT_RESUMABLE", child_id=child_id) from exc
        if header.parent_session != parent:
            raise SubagentError(f'subagent "{child_id}" belongs to another parent session', code="UNAUTHORIZED")
        self._admit(parent)
        text = content if isinstance(content, str) else json.dumps(content)
        src = source or {"kind": "user"}
        while True:
            act = self.activations.get(child_id)
            if act is not None and act.disposing:
                await act.disposed.wait()
                continue
            if act is not None:
                return await self._deliver(act, src, text, wake=True)
            if await anyio.to_thread.run_sync(self._held_elsewhere, child_id):
                message_id = await self._accept_for_remote(child_id, src, text)
                if await anyio.to_thread.run_sync(self._held_elsewhere, child_id):
                    return message_id
                # the holder let go meanwhile: run it here (it may also resume it; the lease decides)
                await self._resume_for_pending(parent, child_id)
                return message_id
            act = await self._cold_resume(parent, child_id)
            if act is not None:
                return await self._deliver(act, src, text, wake=True)

    def _held_elsewhere(self, child_id: str) -> bool:
        lease = read_lease(self.store, child_id)
        if lease is None or lease.state == "released" or lease.owner == self.sup.lease_keeper.owner_id:
            return False
        return owner_alive(read_owner(self.store, lease.owner))

    async def _accept_for_remote(self, child_id: str, source: dict[str, Any], text: str) -> str:
        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(
                lambda: accept(self.store, child_id, source=source, content=text, ids=self.sup._ids, wake=True)
            )

    async def interrupt_anywhere(self, target_id: str, authority: UserAuthority | AncestorAuthority) -> None:
        """``interrupt``, and for a user authority over a child active in another supervisor,
        a durable control record that supervisor carries out."""
        if isinstance(authority, UserAuthority) and target_id not in self.activations:
            try:
                header = await anyio.to_thread.run_sync(read_header, self.store, target_id)
            except SubagentError:
                return  # unknown target: no-op
            if header.parent_session != authority.parent_session:
                raise SubagentError(f'subagent "{target_id}" belongs to another parent session', code="UNAUTHORIZED")
            if await anyio.to_thread.run_sync(self._held_elsewhere, target_id):
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(
                        lambda: control_request(self.store, target_id, "interrupt", {"reason": "user"}, ids=self.sup._ids)
                    )
            return
        self.interrupt(target_id, authority)

    async def watch_store(self, poll_s: float) -> None:
        """Notice what other processes write for our activations: mailbox messages, control records."""
        while True:
            await anyio.sleep(poll_s)
            for act in list(self.activations.values()):
                if act.disposing:
                    continue
                size = _size(self.store.path(act.child_id, "mailbox"))
                if size != act.mailbox_size:
                    act.mailbox_size = size
                    act.poke()
                if _size(self.store.path(act.child_id, "control")) and act.control_seq >= -1:
                    fresh = read_controls(self.store, act.child_id, after_seq=act.control_seq)
                    for record in fresh:
                        act.control_seq = record.seq
                        if record.kind == "interrupt" and not act.disposing:
                            if act.handle is not None:
                                self.sup.pool.cancel(act.handle, "user")
                            else:
                                act.stop_before = ("user", record.ts)
                        elif record.kind == "drain":
                            self._open_disposal(act, discard=True)

    # -- interrupt --------------------------------------------------------------------

    def interrupt(self, target_id: str, authority: UserAuthority | AncestorAuthority) -> None:
        if isinstance(authority, AncestorAuthority):
            caller = authority.agent_id
            if not self._is_live(caller):
                raise SubagentError(f'interrupting "{target_id}" requires the exact live ancestor agent', code="UNAUTHORIZED")
            if caller == target_id:
                raise SubagentError(f'agent "{target_id}" cannot interrupt itself', code="UNAUTHORIZED")
            act = self.activations.get(target_id)
            if act is None or act.disposing:
                return
            if caller not in act.ancestry:
                raise SubagentError(f'subagent "{target_id}" is not a live descendant of agent "{caller}"', code="UNAUTHORIZED")
            reason = "parent"
        else:
            try:
                header = read_header(self.store, target_id)
            except SubagentError:
                return  # unknown target: no-op
            if header.parent_session != authority.parent_session:
                raise SubagentError(f'subagent "{target_id}" belongs to another parent session', code="UNAUTHORIZED")
            act = self.activations.get(target_id)
            if act is None or act.disposing:
                return
            reason = "user"
        if act.handle is not None:
            self.sup.pool.cancel(act.handle, reason)
        else:
            # no turn executes yet: the current turn is the next one, if its message was
            # accepted before now (mailbox ``ts``, same host clock; a later message is not stopped)
            act.stop_before = (reason, time.time())

    # -- the driver -------------------------------------------------------------------

    async def _drive(self, act: Activation) -> None:
        from .rpc import TurnRpc

        bind(**_fields(act))
        program: str | None = None
        blob: bytes | None = None
        try:
            while not act.disposing:
                act.wake = anyio.Event()
                messages = await anyio.to_thread.run_sync(self._pending, act)
                waking = next((i for i, m in enumerate(messages) if m.wake), None)
                if waking is None:
                    # a delivery in flight, or one that landed after the read began (its poke
                    # set ``wake``): read again rather than settle over an accepted message
                    if act.admitted or act.wake.is_set():
                        await act.wake.wait()
                        continue
                    if act.owned:
                        await self._set_state(act, "idle")
                        await act.wake.wait()
                        continue
                    break  # settled
                if program is None and blob is None:
                    program, blob = self._program(act.descriptor.provider) or (None, None)
                    if program is None and blob is None:
                        raise SubagentError(
                            f'subagent "{act.child_id}" needs provider "{act.descriptor.provider}" to run its program',
                            code="NO_PROVIDER",
                        )
                await self._set_state(act, "running")
                if act.disposing:
                    break  # fenced while recording the state: never dispatch a turn it cannot write
                quiet, main = messages[:waking], messages[waking]
                tf = act.descriptor.tool_filter
                spec = TurnSpec(
                    session_id=act.child_id, epoch=act.epoch, store_root=self.store.root, durability=self.store.durability.name,
                    program=program, program_blob=blob, message_id=main.id, message_source=main.source, message=main.content,
                    message_mailbox_end=main.end,
                    log_message=True, budget=act.budget, depth=act.depth, mode="continuable", label=act.descriptor.label,
                    provider=act.descriptor.provider, parent_session=act.parent_id, persona=act.descriptor.persona,
                    tool_filter=None if tf is None else tf.to_record(), sandbox=act.sandbox, agent_model=act.descriptor.agent_model,
                    notices=[m.to_event_data() for m in quiet],
                )

                stop, act.stop_before = act.stop_before, None
                interrupted = stop[0] if stop is not None and main.ts < stop[1] else None

                def started(ticket: TurnTicket) -> None:
                    act.handle = ticket
                    reason = "parent" if act.disposing else interrupted
                    if reason is not None:
                        self.sup.pool.cancel(ticket, reason)

                turn = await self.sup.pool.run_turn(spec, TurnRpc(self.sup.runs, spec, self), started=started)
                act.handle = None
                if not turn.dispatched:
                    # stopped before a worker took it, so nothing was logged: an interrupt or a
                    # drain consumes it unrun (durably); closing the supervisor leaves it pending
                    if not act.disposing or act.discard:
                        await anyio.to_thread.run_sync(self._discard, act, [*quiet, main])
                elif turn.crashed:
                    await anyio.to_thread.run_sync(self._repair, act)
                elif turn.outcome.stop_reason == "error" and not turn.outcome.fenced:
                    # a turn can fail before it logs its message (its log would not open):
                    # what it consumed is what the log says, never an assumption
                    await anyio.to_thread.run_sync(self._recount, act)
                elif not act.fenced:
                    act.consumed += len(quiet) + 1
                    act.last_id = main.id
                    act.mailbox_end = main.end
                act.reasons.append(turn.outcome.stop_reason)
                act.last_output = turn.outcome.output
                if turn.outcome.fenced:
                    self._fenced(act)
        except Exception:
            log.exception("driver of %s failed", act.child_id, extra=_fields(act))
            act.reasons.append("error")
        finally:
            with anyio.CancelScope(shield=True):
                await self._dispose(act)

    def _program(self, provider_name: str) -> tuple[str | None, bytes | None] | None:
        """What a child of ``provider_name`` runs: its provider's program (even if the provider was
        unregistered from this supervisor since), else the built-in program of that name."""
        provider = self.sup.registry.resolve(provider_name)
        if provider is not None:
            return program_fields(provider)
        if provider_name in BUILTIN_PROGRAMS:
            return provider_name, None
        return None

    async def _set_state(self, act: Activation, state: str) -> None:
        if act.state == state:
            return
        act.state = state
        try:
            await anyio.to_thread.run_sync(
                lambda: set_lease_state(self.store, act.child_id, self.sup.lease_keeper.owner_id, act.epoch, state)  # type: ignore[arg-type]
            )
        except FencedError:
            self._fenced(act)

    def _fenced(self, act: Activation) -> None:
        """Another supervisor took this child over: stop, and never write to its files again."""
        if not act.fenced:
            log.warning(
                "activation %s was taken over by another supervisor (fenced at epoch %d); dropping it", act.child_id, act.epoch,
                extra=_fields(act),
            )
        act.fenced = True
        act.disposing = True
        if act.handle is not None:
            self.sup.pool.cancel(act.handle, "fenced")

    def _recount(self, act: Activation) -> None:
        """Take the consumed count of the mailbox from the log itself."""
        try:
            projection = read_projection(self.store, act.child_id)
        except SubagentError:
            log.exception("could not re-read what %s consumed", act.child_id, extra=_fields(act))
            return
        act.consumed, act.last_id, act.mailbox_end = projection.consumed, projection.last_message_id, projection.mailbox_end

    def _repair(self, act: Activation) -> None:
        """Balance the log of a turn whose worker died; what it consumed is what its log says
        (a message the dead worker never logged stays pending and runs again)."""
        try:
            with LogWriter.open(self.store, act.child_id, epoch=act.epoch) as writer:
                act.consumed, act.last_id = writer.projection.consumed, writer.projection.last_message_id
                act.mailbox_end = writer.projection.mailbox_end
        except SubagentError:
            log.exception("repair of %s failed", act.child_id, extra=_fields(act))

    def _discard(self, act: Activation, messages: list[Any]) -> None:
        """Record the head of the pending mailbox as consumed unrun (``message/discarded``)."""
        with LogWriter.open(self.store, act.child_id, epoch=act.epoch) as writer:
            writer.append([("message/discarded", {"message_id": m.id, "mailbox_end": m.end}) for m in messages], commit=True)
        act.consumed += len(messages)
        act.last_id = messages[-1].id
        act.mailbox_end = messages[-1].end

    # -- disposal ----------------------------------------------------------------------

    def _open_disposal(self, act: Activation, *, discard: bool) -> None:
        """Top-down: mark, cancel the current turn, wake; then the same for owned children."""
        if act.disposing:
            return
        act.disposing = True
        act.discard = discard
        if act.handle is not None:
            self.sup.pool.cancel(act.handle, "parent")
        act.poke()
        for child in list(act.owned):
            sub = self.activations.get(child)
            if sub is not None:
                self._open_disposal(sub, discard=discard)

    async def _dispose(self, act: Activation) -> None:
        """Child-first teardown, run by the driver when it exits."""
        act.disposing = True
        for child in list(act.owned):
            sub = self.activations.get(child)
            if sub is not None:
                self._open_disposal(sub, discard=act.discard)
                await sub.disposed.wait()
        if act.fenced:
            del self.activations[act.child_id]
            self._release_ownership(act, "error", None)
            return
        dropped = False
        if act.discard:
            dropped = await anyio.to_thread.run_sync(self._discard_pending, act)
        reason = epoch_stop_reason(act.reasons, dropped)
        try:
            await anyio.to_thread.run_sync(release_lease, self.store, act.child_id, self.sup.lease_keeper.owner_id, act.epoch)
        except FencedError:
            log.warning("lease of %s was taken over before release", act.child_id, extra=_fields(act))
        # another process may have accepted a message after our last mailbox read and seen our
        # lease still held; it left the message for us. Re-read after releasing: one of us sees it.
        resume_after = not act.discard and not self._closing and await anyio.to_thread.run_sync(self._has_waking_pending, act)
        del self.activations[act.child_id]
        parent_closing = self._closing or any(n in self._draining_roots for n in self._lineage(act.parent_id)) or (
            act.parent_id in self.activations and self.activations[act.parent_id].disposing
        )
        summary, body = settlement_text(act.child_id, reason, act.last_output)
        source = {"kind": "subagent-settled", "form": "notice", "summary": _bounded(summary), "sender_session_id": act.child_id}
        try:
            if self._is_live(act.parent_id) or self.store.exists(act.parent_id):
                await self._send_to(act.parent_id, source, body, wake=not parent_closing)
        except Exception:
            log.exception("subagent %s settlement notice was not delivered to its parent", act.child_id, extra=_fields(act))
        self._release_ownership(act, reason, act.last_output or None)
        if resume_after:
            self.sup._tg.start_soon(self._resume_for_pending, act.parent_id, act.child_id)

    def _pending(self, act: Activation) -> list[MailboxMessage]:
        """The activation's unconsumed mailbox messages (read from where its log says they start)."""
        return pending(self.store, act.child_id, consumed=act.consumed, last_consumed_id=act.last_id, mailbox_end=act.mailbox_end)

    def _release_ownership(self, act: Activation, reason: str, last_message: str | None) -> None:
        """The last steps of every disposal: setup released, the parent stops owning the child, ``subagent/end``, done."""
        if act.setup is not None:
            try:
                act.setup.release()
            except SubagentError:
                log.exception("subagent %s activation teardown failed", act.child_id, extra=_fields(act))
        parent_act = self.activations.get(act.parent_id)
        if parent_act is not None:
            parent_act.owned.discard(act.child_id)
            parent_act.poke()
        self.sup.events.emit(
            "subagent/end",
            {"run_id": act.run_id, "provider": act.descriptor.provider, "id": act.child_id, "local": True,
             "stop_reason": reason, "last_assistant_message": last_message},
        )
        act.disposed.set()

    def _has_waking_pending(self, act: Activation) -> bool:
        try:
            messages = self._pending(act)
        except SubagentError:
            return False
        return any(m.wake for m in messages)

    async def _resume_for_pending(self, parent_id: str, child_id: str) -> None:
        """Run messages another process left for a child this supervisor just settled."""
        if child_id in self.activations or self._closing:
            return
        try:
            await self._cold_resume(parent_id, child_id)
        except SubagentError as exc:
            # another supervisor resumed it first (it delivers them), or admission closed
            log.info("child %s was not resumed for its pending messages: %s", child_id, exc)

    def _discard_pending(self, act: Activation) -> bool:
        messages = self._pending(act)
        if not messages:
            return False
        try:
            writer = LogWriter.open(self.store, act.child_id, epoch=act.epoch)
        except SubagentError:
            log.exception("could not discard pending messages of %s", act.child_id, extra=_fields(act))
            return False
        with writer:
            writer.append([("message/discarded", {"message_id": m.id, "mailbox_end": m.end}) for m in messages], commit=True)
        act.consumed += len(messages)
        act.last_id = messages[-1].id
        act.mailbox_end = messages[-1].end
        return True

    async def drain_remote(self, root_id: str) -> list[str]:
        """Ask the supervisors hosting continuable descendants of ``root_id`` to tear them down.

        Writes a durable ``drain`` control record for each descendant whose lease a
        live other supervisor holds; returns their ids. Admission below the root is
        closed only in this supervisor (``drain``), not in theirs.
        """
        def targets() -> list[str]:
            rows = list_descendants(self.store, root_id)
            found = []
            for row in rows:
                entry = row.entry
                if getattr(entry, "mode", None) == "continuable" and entry.id not in self.activations and self._held_elsewhere(entry.id):
                    control_request(self.store, entry.id, "drain", {"root": root_id}, ids=self.sup._ids)
                    found.append(entry.id)
            return found

        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(targets)

    async def drain(self, parents: Iterable[AgentRef | str]) -> None:
        roots = [p.id if isinstance(p, AgentRef) else p for p in parents]
        live_roots = [r for r in roots if self._is_live(r)]
        self._draining_roots.update(live_roots)
        targets = [a for a in self.activations.values() if any(r in a.ancestry for r in live_roots)]
        for act in targets:
            self._open_disposal(act, discard=True)
        for child_id, event in list(self._materializing.items()):
            await event.wait()
        for act in targets:
            await act.disposed.wait()
        # admission stays closed below each root until that root is disposed (close_root)

    async def drain_children(self, parent: AgentRef | str, child_ids: Iterable[str]) -> None:
        parent_id = parent.id if isinstance(parent, AgentRef) else parent
        if not self._is_live(parent_id):
            raise SubagentError("selected child teardown requires the exact live parent agent", code="UNAUTHORIZED")
        selected = []
        for child_id in dict.fromkeys(child_ids):
            act = self.activations.get(child_id)
            if act is None:
                continue
            if act.parent_id != parent_id or parent_id not in act.ancestry:
                raise SubagentError(f'subagent "{child_id}" is not a direct child of agent "{parent_id}"', code="UNAUTHORIZED")
            selected.append(act)
        for act in selected:
            self._open_disposal(act, discard=True)
        for act in selected:
            await act.disposed.wait()

    async def close(self) -> None:
        """Manager-wide drain: admission closed forever; pending messages stay for the next activation."""
        self._closing = True
        for event in list(self._materializing.values()):
            await event.wait()
        acts = list(self.activations.values())
        for act in acts:
            self._open_disposal(act, discard=False)
        for act in acts:
            await act.disposed.wait()

    def root_closed(self, root_id: str) -> None:
        self._draining_roots.discard(root_id)
