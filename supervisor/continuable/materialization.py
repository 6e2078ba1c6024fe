"""Materialisation: how an activation comes to exist — a fresh start, or a cold resume from the store.

A fresh start validates the request (``validation.py``, plus what only a
continuable start checks), creates the child leased to this supervisor
(epoch 1) with its delegation prefix and its prompt durably accepted in its
mailbox, installs the setup contributions, and publishes the activation.
Any failure before publication deletes the session: no trace remains.

A cold resume builds the activation from the store alone — header, the
descriptor and cursor folded from its log, its last sandbox mode — and
never through the provider; it takes the lease (``NOT_RESUMABLE`` if a live
supervisor holds it). Both end in ``install``: the table, the watcher's
baseline, ``subagent/start``, and the launch of the driver task.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import anyio

from subagents.store import (
    ContinuableDescriptor,
    Lease,
    LeaseHeldError,
    SessionExistsError,
    accept,
    acquire_lease,
    create_session,
    delete_session,
    inspect,
    pending,
    read_header,
    read_projection,
    release_lease,
)
from subagents.store.errors import CorruptSessionError, SubagentError
from subagents.store.ids import validate_session_id

from subagents.worker.protocol import Budget

from ..event_loop import hold_back, to_its_end
from ..errors import (
    ActivationClosingError,
    DuplicateChildError,
    InvalidRequestError,
    NotResumableError,
    UnauthorizedError,
    no_provider,
    not_continuable,
)
from ..models import ContinuableSpec
from ..runtime import Runtime
from ..setup import ActivationInfo, SetupBatch
from ..validation import RequestFields, check_label_fits, delegation_events, place_child, prompt_text, request_fields
from .activation import Activation, ActivationIdentity, ActivationTable, MailboxCursor, log_fields
from .admission import Admission
from .unhosted import DrainsUnderWay, discard_drained
from .watcher import StoreWatcher

__all__ = ["Materializer"]

log = logging.getLogger(__name__)

OWN_DRAIN_POLL_S = 0.01  # how often a resume looks whether this supervisor's drain of the child let it go


class _OwnDrain(Exception):
    """A drain of this supervisor holds the child's lease: the resume waits it out (``Materializer._take_lease``)."""

Launch = Callable[[Activation], None]


class Materializer:
    def __init__(self, rt: Runtime, table: ActivationTable, admission: Admission, watcher: StoreWatcher, *, launch: Launch,
                 drains: DrainsUnderWay) -> None:
        self._rt = rt
        self._drains = drains
        self._table = table
        self._admission = admission
        self._watcher = watcher
        self._launch = launch
        # cold resumes under way, one per child: a second delivery waits for the first instead of
        # acquiring the lease again (a re-acquisition by the same owner raises the epoch and
        # would fence the activation the first one installs)
        self._resuming: dict[str, anyio.Event] = {}

    # -- fresh start ---------------------------------------------------------------

    async def start(self, spec: ContinuableSpec) -> tuple[str, str]:
        """Create, accept the prompt, publish; returns ``(child_id, message_id)`` once the prompt is durable.

        A bad request fails before anything is made, checked in the reference's order: admission
        (``DRAINING``), the request's fields (``max_depth`` first), the child id (``DUPLICATE_CHILD``),
        the parent, the depth, then the provider (``NO_PROVIDER``, ``UNSUPPORTED_CAPABILITY``)."""
        rt, table = self._rt, self._table
        parent_id = spec.parent_id
        self._admission.admit(parent_id)
        fields = request_fields(max_depth=spec.max_depth, budget=spec.budget, tool_filter=spec.tool_filter,
                                texts={"persona": spec.persona, "model": spec.model, "agent_provider": spec.agent_provider, "label": spec.label})
        if not isinstance(spec.label, str):
            raise InvalidRequestError("a continuable child needs a string label")
        child_id = spec.child_id
        if child_id is not None:
            validate_session_id(child_id)
            if table.is_live(child_id) or rt.store.exists(child_id):
                raise DuplicateChildError(child_id)
        else:
            child_id = rt.ids.new()
        # marked before anything awaits: a second start of a reserved id is a duplicate from here on,
        # and a message to it waits for this start instead of resuming the child from the store
        with self._admission.materializing(child_id):
            return await self._create_and_publish(spec, child_id, fields)

    async def _create_and_publish(self, spec: ContinuableSpec, child_id: str, fields: RequestFields) -> tuple[str, str]:
        rt, table = self._rt, self._table
        parent_id = spec.parent_id
        if not table.is_live(parent_id):
            raise UnauthorizedError.not_live_parent(child_id)
        self._check_parent_open(parent_id)
        placement = place_child(rt.agents, rt.store, parent_id, max_depth=fields.max_depth, host_max_depth=rt.config.max_depth, sandbox=spec.sandbox)
        # the provider is asked last, as the reference's order has it (after the id and the depth)
        provider = rt.registry.require(spec.provider)
        if not provider.continuable:
            raise not_continuable(provider.name)
        descriptor = ContinuableDescriptor(
            provider=provider.name, label=spec.label, agent_provider=spec.agent_provider, agent_model=spec.model,
            persona=spec.persona, tool_filter=fields.tool_filter,
            program=provider.program if isinstance(provider.program, str) else None,
        )
        check_label_fits(descriptor, rt.store.max_record_bytes)
        prompt = prompt_text(spec.prompt)
        seed: list[dict[str, Any]] = []
        if provider.inherits_parent_context:
            seed = await anyio.to_thread.run_sync(self._fork_prefix, parent_id)
        # a non-empty seed is closed by ``session/end-seed`` after the descriptor: a reader of the log
        # (``subagents log``) sees where the source's turns end and the fork's own begin
        events = delegation_events(placement.sandbox, descriptor, fork=bool(seed))

        def create() -> str:
            try:
                create_session(
                    rt.store, child_id, parent_session=parent_id, origin="subagent", delegation_depth=placement.depth,
                    seed=seed, events=events, lease_owner=rt.owner_id,
                )
            except SessionExistsError:  # another host made it first: the caller's word for that
                raise DuplicateChildError(child_id) from None
            try:
                return accept(rt.store, child_id, source={"kind": "user"}, content=prompt, ids=rt.ids)
            except BaseException:
                delete_session(rt.store, child_id, parent_session=parent_id)
                raise

        epoch = 1  # created leased to us (create_session's lease_owner)

        async def made() -> tuple[str, SetupBatch]:
            message_id = await rt.store_thread.run(create)
            try:
                self._admission.admit(parent_id)  # a drain may have begun while we wrote
                self._check_parent_open(parent_id)
                setup = self._install_setup(ActivationInfo(child_id, parent_id, spec.label, provider.name, placement.depth, epoch, resumed=False))
            except BaseException:
                await rt.store_thread.run(lambda: delete_session(rt.store, child_id, parent_session=parent_id))
                raise
            return message_id, setup

        with anyio.CancelScope(shield=True):
            # to its end even under a native ``Task.cancel()`` (a Ctrl-C through ``asyncio.run``), which the shield
            # does not hold back: cut there, the store thread made the child and accepted its prompt, and nothing
            # installed it, so its lease stayed held by this supervisor after it closed
            (message_id, setup), host_cancel = await to_its_end(made())
        identity = ActivationIdentity(
            child_id=child_id, parent_id=parent_id, descriptor=descriptor, epoch=epoch, depth=placement.depth,
            sandbox=placement.sandbox, ancestry=frozenset(table.lineage(parent_id)), run_id=rt.ids.new(), budget=fields.budget,
        )
        self.install(Activation(identity, setup))
        if host_cancel is not None and not hold_back(host_cancel):
            # the Ctrl-C goes on, given back after the call returns the ids (``results_first``) or raised here; the
            # child is installed either way, so the close stops and releases it, and its accepted prompt runs on resume
            raise host_cancel
        return child_id, message_id

    def _check_parent_open(self, parent_id: str) -> None:
        parent = self._table.get(parent_id)
        if parent is not None and parent.disposing:
            raise ActivationClosingError.parent_disposing(parent_id)

    def _fork_prefix(self, parent_id: str) -> list[dict[str, Any]]:
        """The parent's completed-turn prefix: events up to its last ``turn/end``.

        An ``ignorable`` mark goes with its event: without it, an event a newer writer made skippable
        would make the fork a log this build refuses (the seed's check refuses to write one)."""
        events = inspect(self._rt.store, parent_id).events
        last = max((i for i, e in enumerate(events) if e["type"] == "turn/end"), default=-1)
        return [{"type": e["type"], "data": e["data"], "ts": e["ts"], **({"ignorable": True} if e.get("ignorable") is True else {})}
                for e in events[: last + 1]]

    def _install_setup(self, info: ActivationInfo) -> SetupBatch:
        batch = self._rt.setups.install(info)
        batch.commit()
        return batch

    # -- cold resume ----------------------------------------------------------------

    async def cold_resume(self, parent_id: str, child_id: str) -> Activation | None:
        """Materialise an activation from the store alone (never through the provider).

        Returns None when another delivery resumed (or tried to resume) it meanwhile: the caller looks again.
        """
        under_way = self._resuming.get(child_id) or self._admission.in_flight(child_id)
        if under_way is not None:
            await under_way.wait()
            return None
        done = self._resuming[child_id] = anyio.Event()
        try:
            return await self._resume_from_store(parent_id, child_id)
        finally:
            del self._resuming[child_id]
            done.set()

    def _take_lease(self, child_id: str) -> Lease:
        """The child's lease for a resume (blocking). ``_OwnDrain`` while a drain of this supervisor holds it
        (``unhosted.DrainsUnderWay``): taken again by the same owner, it fenced the drain half-way, and the
        messages the drain was discarding ran. A lease of this supervisor's that no drain holds (one a
        failed release left) is taken again, as before."""
        store, owner_id = self._rt.store, self._rt.owner_id
        try:
            return acquire_lease(store, child_id, owner_id, take_own=False)
        except LeaseHeldError as exc:
            if exc.fields.get("owner") != owner_id:
                raise
            # looked at after the refusal: a drain says itself before its take and unsays itself after its release
            if child_id in self._drains:
                raise _OwnDrain(child_id) from None
            return acquire_lease(store, child_id, owner_id)

    async def _resume_from_store(self, parent_id: str, child_id: str) -> Activation | None:
        rt = self._rt
        try:
            header = await rt.store_thread.run(read_header, rt.store, child_id)
        except SubagentError as exc:
            raise NotResumableError.unavailable(child_id) from exc
        if header.parent_session != parent_id:
            raise UnauthorizedError.other_parent(child_id)
        try:
            # compared with the end its parent's index says its records reach, even when the log reads
            # clean: a whole last turn zeroed would run its message again, a log cut before its
            # ``turn/end`` would fail every turn's opening in the worker
            projection = await rt.store_thread.run(lambda: read_projection(rt.store, child_id, verify_committed=True))
        except CorruptSessionError as exc:  # said, so that nobody retries what only a repair can change
            raise NotResumableError.unavailable(child_id, f"its log is damaged ({exc.code}: {exc.message})") from exc
        except SubagentError as exc:
            raise NotResumableError.unavailable(child_id) from exc
        if projection.resume_error is not None:
            raise NotResumableError.unavailable(child_id, projection.resume_error)
        # its mailbox too, from where the log says its pending messages begin: one that disagrees with the
        # log (deleted, cut) failed the driver's first read, after a lease (a new epoch) taken for nothing.
        # Its own error, CORRUPT_SESSION, as an acceptance into that mailbox says it
        await rt.store_thread.run(lambda: pending(
            rt.store, child_id, consumed=projection.consumed, last_consumed_id=projection.last_message_id,
            mailbox_end=projection.mailbox_end,
        ))
        descriptor = projection.continuable()
        if descriptor is None:
            raise NotResumableError.no_state(child_id)
        if rt.registry.program_for(descriptor.provider, recorded=descriptor.program) is None:
            raise no_provider(descriptor.provider, recorded=False)  # refused before anything is accepted
        if child_id in self._table:
            return None
        starting = self._admission.in_flight(child_id)
        if starting is not None:  # its start is still writing, under the lease we would take
            await starting.wait()
            return None
        self._admission.admit(parent_id)
        try:
            lease = await rt.store_thread.run(self._take_lease, child_id)
        except LeaseHeldError:
            return None  # another supervisor resumed it meanwhile: the caller routes the message to it
        except _OwnDrain:
            while child_id in self._drains:  # a drain's discards are a few appends: polled, as a repair is
                await anyio.sleep(OWN_DRAIN_POLL_S)
            return None  # the caller looks again: the drain let it go
        except CorruptSessionError as exc:  # a lease that would restart its epoch: refused, as a damaged log is
            raise NotResumableError.unavailable(child_id, f"its lease is damaged ({exc.code}: {exc.message})") from exc
        if child_id in self._table:
            return None
        try:
            # read again under our lease: another supervisor may have resumed it between the first read
            # and our acquisition, run messages and let it go; a cursor from the first read would run
            # those messages again (and the log and mailbox would never agree after). Nobody appends now,
            # but for the drain its last host never carried out, which the read below then sees done
            await rt.store_thread.run(discard_drained, rt.store, child_id, lease.epoch)
            projection = await rt.store_thread.run(read_projection, rt.store, child_id)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await rt.store_thread.run(release_lease, rt.store, child_id, rt.owner_id, lease.epoch)
            if isinstance(exc, SubagentError):
                raise NotResumableError.unavailable(child_id) from exc
            raise
        depth = max(header.delegation_depth, self._table.parent_depth(parent_id) + 1)
        try:
            setup = self._install_setup(ActivationInfo(child_id, parent_id, descriptor.label, descriptor.provider, depth, lease.epoch, resumed=True))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await rt.store_thread.run(release_lease, rt.store, child_id, rt.owner_id, lease.epoch)
            raise
        identity = ActivationIdentity(
            child_id=child_id, parent_id=parent_id, descriptor=descriptor, epoch=lease.epoch, depth=depth,
            sandbox=projection.sandbox,  # the delegated policy from its own log; resume re-captures nothing
            ancestry=frozenset(self._table.lineage(parent_id)), run_id=rt.ids.new(), budget=Budget(),
        )
        cursor = MailboxCursor()
        cursor.reset(projection)
        act = Activation(identity, setup, cursor=cursor)
        self.install(act)
        return act

    # -- publication ------------------------------------------------------------------

    def install(self, act: Activation) -> None:
        """Publish: the table (its parent owns it), the watcher's baseline, ``subagent/start``, the driver."""
        self._watcher.baseline(act)
        self._table.add(act)
        log.info("activation of %s started", act.child_id, extra=log_fields(act))
        self._rt.events.emit(
            "subagent/start", {"run_id": act.identity.run_id, "provider": act.identity.descriptor.provider, "id": act.child_id, "local": True}
        )
        self._launch(act)
