"""``Activation``: one residency epoch of a continuable child in this supervisor, and the table of them.

An activation is the child's lease (its epoch), its driver task, its wake-up,
the children it owns. At most one exists per session across all processes
sharing the store: the lease guarantees it. Its fields come in groups, and
each group has one writer (stated beside it); other modules only read.

``ActivationTable`` holds the resident activations by child id, the
ownership edges between them (``owned``) and the deliveries still looking
for their child's activation (``routing``); only its methods change them.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import anyio

from subagents.store import ContinuableDescriptor, MailboxMessage
from subagents.store.projection import Projection
from subagents.worker.protocol import Budget

from ..agents import LiveAgents
from ..backend import TurnTicket
from ..setup import SetupBatch

__all__ = ["Lifecycle", "LeaseState", "ActivationIdentity", "MailboxCursor", "Activation", "ActivationTable", "Routing", "log_fields"]


class Lifecycle(enum.Enum):
    """Where an activation is in its teardown (written by ``teardown.py`` only)."""

    ACTIVE = "active"  # delivering and running turns
    DISPOSING = "disposing"  # teardown began: no new turn is dispatched, no message is accepted for it
    DISPOSED = "disposed"  # lease released, parent notified, gone from the table


class LeaseState(enum.Enum):
    """What the lease says of a live activation, as other processes read it (written by ``driver.py`` only)."""

    RUNNING = "running"  # a turn runs or waking work is queued
    WAITING = "idle"  # quiescent, but it owns live children (when it owns none it settles)


@dataclass(frozen=True)
class ActivationIdentity:
    """Fixed when the activation materialises (``materialization.py``), except ``epoch``: after a
    worker crash the driver fences the session (lease at epoch + 1) and replaces the identity."""

    child_id: str
    parent_id: str
    descriptor: ContinuableDescriptor
    epoch: int  # the lease epoch: the fencing token of every write this activation makes
    depth: int  # max(header depth, live parent's depth + 1); resume never lowers it
    sandbox: str | None  # the delegated sandbox mode, from its own log on resume (never widened)
    ancestry: frozenset[str]  # the child, its parent and the parent's live lineage at materialisation
    run_id: str  # shared by this epoch's subagent/start and subagent/end
    budget: Budget  # bounds each turn of this epoch (a resumed child runs unbudgeted: budgets are not persisted)


@dataclass
class MailboxCursor:
    """How much of the mailbox the log has consumed (what the driver reads next starts after it).

    Invariant: equals what the child's log records (``message/accepted`` and
    ``message/discarded``), so a crash at any point loses no accepted message
    and delivers none twice. Written only through its methods.
    """

    consumed: int = 0
    last_id: str | None = None
    mailbox_end: int | None = None  # where the unconsumed mailbox starts (None: read it all)

    def advance(self, messages: list[MailboxMessage]) -> None:
        """``messages`` (the head of the pending mailbox, in order) were logged as consumed."""
        self.consumed += len(messages)
        self.last_id = messages[-1].id
        self.mailbox_end = messages[-1].end

    def reset(self, projection: Projection) -> None:
        """Take the cursor from the log itself (after a crash or a turn that failed before logging)."""
        self.consumed, self.last_id, self.mailbox_end = projection.consumed, projection.last_message_id, projection.mailbox_end


@dataclass(eq=False)
class Activation:
    identity: ActivationIdentity
    setup: SetupBatch | None  # the setup contributions installed into it; released by teardown
    # -- the mailbox cursor: advanced by the driver, and by teardown's discard on the driver's task
    cursor: MailboxCursor = field(default_factory=MailboxCursor)
    # -- the turn in flight (driver.py): its pool ticket, and what each turn of the epoch ended with
    ticket: TurnTicket | None = None
    turn_message_ts: float | None = None  # when the main message of the turn in flight was accepted
    turn_message_id: str | None = None  # the main message of the turn in flight (a remote interrupt names it)
    reasons: list[str] = field(default_factory=list)
    last_output: str = ""  # the last non-empty reply of the epoch: the closing message
    lease_state: LeaseState = LeaseState.RUNNING
    # -- an interrupt that found no turn in flight: (reason, time). Set by teardown.interrupt, taken
    # by the driver: it stops the next turn if that turn's message was accepted before the interrupt
    stop_before: tuple[str, float] | None = None
    # -- the ticket an interrupt already cancelled (teardown.py): a second interrupt stops nothing more
    stopping: TurnTicket | None = None
    # -- its last turn failed before it took its message (driver.py): the activation settles and is
    # not resumed at once for the message left pending (teardown.py), which would fail the same way
    stalled: bool = False
    # -- wake-ups: anyone pokes; only the driver replaces ``wake`` (before each mailbox read)
    wake: anyio.Event = field(default_factory=anyio.Event)
    admitted: int = 0  # deliveries in flight (delivery.py): the driver must not settle over them
    # -- teardown (teardown.py only)
    lifecycle: Lifecycle = Lifecycle.ACTIVE
    discard: bool = False  # drop the pending mailbox at disposal (a drain), instead of keeping it for the next epoch
    fenced: bool = False  # taken over by another supervisor: drop it without touching the store
    disposed: anyio.Event = field(default_factory=anyio.Event)
    # -- what the store watcher (watcher.py) has seen of files other processes append to
    mailbox_data_end: int = 0  # store.mailbox_read.mailbox_data_end when it last looked

    @property
    def child_id(self) -> str:
        return self.identity.child_id

    @property
    def parent_id(self) -> str:
        return self.identity.parent_id

    @property
    def epoch(self) -> int:
        return self.identity.epoch

    @property
    def disposing(self) -> bool:
        return self.lifecycle is not Lifecycle.ACTIVE

    @property
    def being_stopped(self) -> bool:
        """An interrupt already cancelled the turn in flight (it may run on until ``cancel_grace_s``)."""
        return self.ticket is not None and self.stopping is self.ticket

    def poke(self) -> None:
        """Wake the driver: something may have changed (a message, a settled child, a disposal)."""
        self.wake.set()


def log_fields(act: Activation) -> dict[str, Any]:
    """Structured logging fields of an activation (``extra=``): child, parent, epoch."""
    return {"child": act.child_id, "parent": act.parent_id, "epoch": act.epoch}


class ActivationTable:
    """The resident activations by child id, and which activation owns which child."""

    def __init__(self, agents: LiveAgents) -> None:
        self._agents = agents
        self._by_id: dict[str, Activation] = {}
        self._owned: dict[str, set[str]] = {}  # parent id -> ids of the live children it owns
        self._routing: Counter[str] = Counter()  # child id -> deliveries routing to it (``routing``)

    def get(self, child_id: str) -> Activation | None:
        return self._by_id.get(child_id)

    def __contains__(self, child_id: object) -> bool:
        return child_id in self._by_id

    def __iter__(self) -> Iterator[Activation]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def as_dict(self) -> dict[str, Activation]:
        return dict(self._by_id)

    def add(self, act: Activation) -> None:
        """Register a materialised activation; its parent (if resident) now owns it."""
        self._by_id[act.child_id] = act
        self.adopt(act.parent_id, act.child_id)

    def remove(self, act: Activation) -> None:
        """Drop a disposed activation (its own children were disposed first, so it owns none)."""
        self._by_id.pop(act.child_id, None)
        self._owned.pop(act.child_id, None)

    def adopt(self, parent_id: str, child_id: str) -> None:
        """``parent_id``'s activation (if resident) owns ``child_id`` until the child is disposed."""
        if parent_id in self._by_id:
            self._owned.setdefault(parent_id, set()).add(child_id)

    def disown(self, parent_id: str, child_id: str) -> None:
        """The child was disposed: its parent no longer owns it (and may settle: it is poked)."""
        owned = self._owned.get(parent_id)
        if owned is not None:
            owned.discard(child_id)
            if not owned:
                del self._owned[parent_id]
        parent = self._by_id.get(parent_id)
        if parent is not None:
            parent.poke()

    def owned(self, parent_id: str) -> list[str]:
        return list(self._owned.get(parent_id, ()))

    def routing(self, child_id: str) -> "Routing":
        """A delivery to ``child_id`` is finding (or resuming) its activation: while it does, that
        activation must not settle, or a message sent beside the one that resumed it would find it
        gone and resume it again. When it ends, the activation is poked to look again."""
        return Routing(self._routing, self._by_id, child_id)

    def routing_to(self, child_id: str) -> bool:
        """Whether a delivery to ``child_id`` has not reached its activation yet (``routing``)."""
        return child_id in self._routing

    def is_live(self, agent_id: str) -> bool:
        """A root or child live in this supervisor, or a resident activation."""
        return agent_id in self._agents or agent_id in self._by_id

    def lineage(self, agent_id: str) -> list[str]:
        """The agent and its live ancestors (through activations and live children)."""
        chain = [agent_id]
        seen = {agent_id}
        current = agent_id
        while True:
            act = self._by_id.get(current)
            live = self._agents.get(current)
            parent = act.parent_id if act else (live.parent if live else None)
            if parent is None or parent in seen:
                return chain
            chain.append(parent)
            seen.add(parent)
            current = parent

    def live_kind(self, agent_id: str) -> str | None:
        """``"root"`` or ``"child"`` (a one-shot child running here) for a live agent of this supervisor that has
        no activation; None otherwise."""
        live = self._agents.get(agent_id)
        return live.kind if live is not None else None

    def parent_depth(self, parent_id: str) -> int:
        """The live parent's depth (its activation's, else the live agent's; 0 when neither is live)."""
        act = self._by_id.get(parent_id)
        if act is not None:
            return act.identity.depth
        live = self._agents.get(parent_id)
        return live.depth if live is not None else 0


class Routing:
    """``ActivationTable.routing``'s context, over the table's count of deliveries routing to each child and
    its activations. A class, not a ``@contextmanager`` generator: every followup enters one."""

    __slots__ = ("_counts", "_by_id", "_child_id")

    def __init__(self, counts: Counter[str], by_id: dict[str, Activation], child_id: str) -> None:
        self._counts, self._by_id, self._child_id = counts, by_id, child_id

    def __enter__(self) -> None:
        self._counts[self._child_id] += 1

    def __exit__(self, *_: object) -> None:
        counts, child_id = self._counts, self._child_id
        counts[child_id] -= 1
        if not counts[child_id]:
            del counts[child_id]
        act = self._by_id.get(child_id)
        if act is not None:
            act.poke()
