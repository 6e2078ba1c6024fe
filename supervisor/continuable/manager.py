"""``ContinuationManager``: the façade of continuable children, one per supervisor.

Each public method names the module that does the work: ``materialization``
(fresh starts, cold resumes), ``delivery`` (followups, sends, reports),
``teardown`` (interrupts, drains, close), ``driver`` (the turn loop of each
activation), ``watcher`` (what other processes write). The façade builds
them from the ``Runtime``, owns the ``ActivationTable`` they share, and runs
each activation's task: its driver, then its disposal, then a resume for
messages that arrived while it was letting go.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import anyio

from subagents.store.control import ControlRecord

from ..models import AgentRef, AncestorAuthority, ContinuableSpec, UserAuthority, ref_id
from ..runtime import Runtime
from .activation import Activation, ActivationTable
from .admission import Admission
from .delivery import Delivery
from .driver import Driver, RpcFactory
from .materialization import Materializer
from .teardown import Reached, Teardown
from .unhosted import DrainsUnderWay
from .watcher import StoreWatcher

__all__ = ["ContinuationManager"]


class ContinuationManager:
    def __init__(self, rt: Runtime, *, rpc_for: RpcFactory) -> None:
        self._rt = rt
        self._table = ActivationTable(rt.agents)
        self._admission = Admission(self._table)
        self._watcher = StoreWatcher(rt.store, self._table, rt.control, apply=self._apply_control)
        drains = DrainsUnderWay()  # this supervisor's drains of children nobody hosts, which its resumes wait out
        self._materializer = Materializer(rt, self._table, self._admission, self._watcher, launch=self._launch, drains=drains)
        self._delivery = Delivery(rt, self._table, self._admission, self._materializer)
        self._teardown = Teardown(rt, self._table, self._admission, self._delivery, drains=drains)
        self._driver = Driver(rt, self._table, self._teardown, rpc_for=rpc_for)

    @property
    def activations(self) -> Mapping[str, Activation]:
        """The resident activations by child id (a snapshot, for introspection)."""
        return self._table.as_dict()

    # -- starting and delivering (materialization, delivery) --------------------------------

    async def start_continuable(self, spec: ContinuableSpec) -> tuple[str, str]:
        return await self._materializer.start(spec)

    async def followup(self, parent: AgentRef | str, child_id: str, content: Any, *, source: dict[str, Any] | None = None) -> str:
        return await self._delivery.followup(ref_id(parent), child_id, content, source=source)

    async def send(self, child_id: str, content: Any, *, parent: str, source: dict[str, Any] | None = None) -> str:
        return await self._delivery.send(child_id, content, parent=parent, source=source)

    async def report_from(self, child_id: str, content: Any, *, delivery: str = "wakeup") -> str:
        return await self._delivery.report_from(child_id, content, delivery=delivery)

    # -- stopping (teardown) -------------------------------------------------------------------

    def interrupt(self, target_id: str, authority: UserAuthority | AncestorAuthority) -> bool:
        """Stop the current turn of an activation resident here; whether there was one (``Teardown.interrupt``)."""
        return self._teardown.interrupt(target_id, authority)

    async def resume_pending(self, parent_id: str) -> list[str]:
        """Resume the unhosted children of ``parent_id`` that have messages waiting (``Delivery.resume_pending``)."""
        return await self._delivery.resume_pending(parent_id)

    def root_released(self, root_id: str) -> None:
        """A root its supervisor let go of: a drain's closing of admission below it ends with it, as when an
        activation is disposed (a root opened again takes children again)."""
        self._admission.reopen(root_id)
        self._delivery.forget(root_id)  # its mailbox, kept open for its notices

    def stopping(self, child_id: str) -> bool:
        """Whether an interrupt already cancelled the turn the child has in flight here."""
        act = self._table.get(child_id)
        return act is not None and act.being_stopped

    def turn_message(self, child_id: str) -> str | None:
        """The message of the turn the child has in flight here (handed to the pool), or None: what an
        interrupt's cancel reached, which the log read before it may no longer show."""
        act = self._table.get(child_id)
        return act.turn_message_id if act is not None and act.ticket is not None else None

    async def fence_taken_over(self) -> list[str]:
        """Drop the resident activations whose lease another supervisor holds now; their ids."""
        return await self._teardown.fence_taken_over()

    def hosts(self, child_id: str) -> bool:
        """Whether the child has an activation resident in this supervisor."""
        return child_id in self._table

    async def drain(self, parents: Iterable[AgentRef | str]) -> Reached:
        return await self._teardown.drain([ref_id(p) for p in parents])

    async def drain_remote(self, root_id: str) -> Reached:
        return await self._teardown.drain_remote(root_id)

    async def drain_children(self, parent: AgentRef | str, child_ids: Iterable[str]) -> Reached:
        return await self._teardown.drain_children(ref_id(parent), child_ids)

    def open_mailboxes(self) -> int:
        return self._delivery.open_mailboxes()

    async def close(self) -> None:
        try:
            await self._teardown.close()
        finally:
            self._delivery.close_mailboxes()  # those of activations a bounded close left behind

    # -- tasks ---------------------------------------------------------------------------------

    async def watch_store(self, poll_s: float) -> None:
        """Notice what other processes write for our activations (runs until cancelled)."""
        await self._watcher.run(poll_s)

    def _apply_control(self, act: Activation, record: ControlRecord) -> None:
        self._teardown.apply_control(act, record)  # built after the watcher, which needs this callback first

    def _launch(self, act: Activation) -> None:
        self._rt.tg.start_soon(self._activation, act)

    async def _activation(self, act: Activation) -> None:
        """One activation's task: its driver, then (shielded) its disposal, then a resume if messages arrived meanwhile."""
        try:
            await self._driver.run(act)
        finally:
            with anyio.CancelScope(shield=True):
                resume_after = await self._teardown.dispose(act)
        if resume_after:
            self._rt.tg.start_soon(self._delivery.resume_for_pending, act.parent_id, act.child_id)
