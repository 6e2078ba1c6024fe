"""``Runtime``: what one supervisor's collaborators share, fixed when the supervisor opens.

The one-shot runs, the continuable children and each turn's RPC handler are
built from a ``Runtime``, never from the ``Supervisor``: they see exactly
these collaborators, each owned by its own object (the store handle, the id
generator, the task group every background task runs in, this supervisor's
owner id, the worker pool, the provider registry, the lifecycle events, the
live agents, the setup contributions, the store thread for short blocking store calls). The record is frozen: nothing is
swapped in after construction. Built by ``supervisor/service.py`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
from anyio.lowlevel import EventLoopToken

from subagents.store import IdGenerator, Store

from .agents import LiveAgents
from .backend import Pool
from .config import SupervisorConfig
from .control_poller import ControlPoller
from .events import EventBus
from .registry import ProviderRegistry
from .setup import SetupRegistry
from .store_thread import StoreThread

__all__ = ["Runtime"]


@dataclass(frozen=True)
class Runtime:
    store: Store
    config: SupervisorConfig
    ids: IdGenerator
    tg: anyio.abc.TaskGroup  # owns every background task (drivers, watchers, creation drains)
    owner_id: str  # this supervisor's owner record: the holder named in every lease it takes
    pool: Pool
    registry: ProviderRegistry
    events: EventBus
    agents: LiveAgents
    setups: SetupRegistry
    control: ControlPoller  # the control files of every child held here, one-shot or continuable
    store_thread: StoreThread  # short blocking store calls of the event loop (acceptances): no thread hop each
    loop: EventLoopToken  # the loop the supervisor answers on (``event_loop.py``): its threads hand results back there
