"""``Supervisor``: the public service, a façade over its collaborators.

Each method names the collaborator that does the work: the provider
``registry``, the worker ``pool``, one-shot ``runs``, the continuable
children (``continuation``), ``interrupts`` (routed to whoever runs the
turn), the ``lease keeper``, and the store's catalog.
The collaborators are built from one frozen ``Runtime`` (``runtime.py``),
never from the ``Supervisor``; each turn's RPC handler too (``_turn_rpc``).
State lives on the instance (no module globals), so several supervisors may
run in one process, each with its own pool.

Closing the supervisor cancels and disposes every run it still holds, stops
its workers, releases its roots' leases and removes its owner record.
(About 500 lines: the whole public API, one short method with its contract
per operation; the work is the collaborators'.)
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

import anyio
import anyio.lowlevel

from subagents.store import (
    ChildEntry,
    DescendantRow,
    DiagnosticEntry,
    GcReport,
    IdGenerator,
    Store,
    SubagentError,
    acquire_lease,
    collect,
    create_session,
    LogWriter,
    MailboxMessage,
    Query,
    list_children,
    list_descendants,
    pending,
    SeqMismatchError,
    read_header,
    read_lease,
    release_lease,
    validate_session_id,
)
from subagents.store.errors import FencedError, RecordTooLargeError
from subagents.store.mailbox import require_consumed_prefix
from subagents.store.mailbox_read import mailbox_data_end
from subagents.store.reserve import keep_reserve
from subagents.worker.protocol import TurnSpec

from .agents import LiveAgents
from .config import SupervisorConfig
from .config_loader import load_config
from .backend import Pool, PoolStatistics
from .continuable import ContinuationManager
from .control_poller import ControlPoller
from .event_loop import deliver_held_back, hold_back, require_asyncio, require_loop, results_first, to_its_end
from .errors import InvalidRequestError, SupervisorClosedError, TeardownFailedError, ThreadStartError, UnauthorizedError, WaitTimeoutError
from .events import EVENT_NAMES, EventBus, HostStop
from .interrupts import Interrupts
from .lease_keeper import LeaseKeeper
from .models import AgentRef, AncestorAuthority, ContinuableSpec, InterruptResult, Provider, SubagentRequest, UserAuthority, ref_id
from .creator import CreatorStatistics
from .oneshot import CancelToken, OneShotRuns, SubagentRun
from .pool import WorkerPool
from .ray_cluster import require_ray
from .registry import ProviderRegistry
from .rpc import TurnRpc
from .runtime import Runtime
from .setup import Contribution, SetupRegistry
from .store_thread import StoreThread, StoreThreadStatistics
from .thread_failures import thread_failure, thread_failures_coded
from .validation import request_fields

__all__ = ["Supervisor", "SupervisorStatistics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupervisorStatistics:
    owner_id: str
    pool: PoolStatistics
    runs_live: int
    runs_held: int  # one-shot runs published and not yet disposed, finished or not (each is memory until disposed)
    roots: int
    creation: CreatorStatistics  # one-shot children created: thread hops and group commits
    store_thread: StoreThreadStatistics  # short store calls (acceptances) on the store thread, and those that overflowed
    open_mailboxes: int  # resident children's mailboxes held open for their followups


def _mailbox_end(store: Store, root_id: str) -> int | None:
    """Where the root's mailbox data ends (one ``pread``, on the event loop as the store watcher reads it);
    ``None`` when it cannot be read, and the caller takes, which says why."""
    try:
        return mailbox_data_end(store, root_id)
    except (OSError, SubagentError):
        return None


def _make_pool(config: SupervisorConfig, store: Store) -> Pool:
    """The pool ``config.pool`` names: local worker processes, or actors of a Ray cluster (imported only then)."""
    if config.pool == "ray":
        from .ray_pool import RayPool

        return RayPool(
            size=config.pool_size,
            ray=config.ray,
            store_root=store.root,
            durability=config.durability,
            ready_timeout_s=config.worker_ready_timeout_s,
            cancel_grace_s=config.cancel_grace_s,
            log_level=config.worker_log_level,
            log_json=config.worker_log_json,
            turns_per_worker=config.turns_per_worker,
        )
    return WorkerPool(
        size=config.pool_size,
        start_method=config.start_method,
        ready_timeout_s=config.worker_ready_timeout_s,
        cancel_grace_s=config.cancel_grace_s,
        log_level=config.worker_log_level,
        log_json=config.worker_log_json,
        turns_per_worker=config.turns_per_worker,
        prefetch=config.worker_prefetch,
    )


class Supervisor:
    """Use ``async with Supervisor.open(store=..., config=...) as sup``."""

    def __init__(
        self, store: Store, config: SupervisorConfig, tg: anyio.abc.TaskGroup, host_stop: HostStop | None = None,
        opening: object = None,
    ) -> None:
        self.store = store
        self._opening = opening  # its own context manager (``open``): alive as long as the supervisor's tasks are
        self.config = config
        self._pid = os.getpid()  # only this process closes it (``_close``): a fork's copy is no owner of its workers
        self.ids = IdGenerator()
        self.events = EventBus(stop=None if host_stop is None else host_stop.stop)
        self.registry = ProviderRegistry(self.events)
        self.agents = LiveAgents()
        self.lease_keeper = LeaseKeeper(store, ttl_s=config.lease_ttl_s, ids=self.ids, on_lapse=self._after_lapse)
        self.pool: Pool = _make_pool(config, store)
        self.runtime = Runtime(
            store=store, config=config, ids=self.ids, tg=tg, owner_id=self.lease_keeper.owner_id, pool=self.pool,
            registry=self.registry, events=self.events, agents=self.agents, setups=SetupRegistry(), control=ControlPoller(store),
            store_thread=StoreThread(), loop=anyio.lowlevel.current_token(),
        )
        self.runs = OneShotRuns(self.runtime, rpc_for=self._turn_rpc)
        self.continuation = ContinuationManager(self.runtime, rpc_for=self._turn_rpc)
        self.interrupts = Interrupts(self.runtime, self.runs, self.continuation)
        self._root_epochs: dict[str, int] = {}
        self._root_streaks: dict[str, int] = {}  # the lease keeper's streak each root's lease was taken in
        self._closed = False

    async def _after_lapse(self) -> None:
        """The heartbeat lapsed: stop every run and activation whose lease another supervisor took meanwhile,
        now, rather than at its turn's next append (which may be a long tool call away)."""
        stopped = [*await self.runs.stop_taken_over(), *await self.continuation.fence_taken_over()]
        # each one says so itself, once (a fenced activation as it is dropped, a run as its lease is not released)
        log.info("after the lapse: %d of this supervisor's sessions were taken over", len(stopped))

    def _turn_rpc(self, spec: TurnSpec) -> TurnRpc:
        """The RPC handler of one turn: what it may ask of the one-shot runs and the continuable children."""
        return TurnRpc(self.runtime, spec, runs=self.runs, continuation=self.continuation)

    @classmethod
    def open(cls, store: str | os.PathLike[str] = "./.subagents", config: SupervisorConfig | None = None) -> AbstractAsyncContextManager["Supervisor"]:
        """Open the store at ``store`` and start the workers: ``async with Supervisor.open(...) as sup``.

        Leaving the ``async with`` closes it. One whose ``async with`` is never left (entered by
        hand, ``await cm.__aenter__()``) stays open until its event loop ends, even if nothing
        refers to its context manager any more; it is then closed as a crashed host would leave
        it, with a warning: its workers are stopped, its roots released, its turns not awaited
        (the tasks that would deliver their results are gone by then), and the next supervisor
        finds every child settled or resumable.
        """
        held: list[AbstractAsyncContextManager["Supervisor"]] = []
        opening = cls._opening(store, config, held)
        held.append(opening)
        return opening

    @classmethod
    @asynccontextmanager
    async def _opening(
        cls, store: str | os.PathLike[str], config: SupervisorConfig | None, held: list[AbstractAsyncContextManager["Supervisor"]],
    ) -> AsyncIterator["Supervisor"]:
        InvalidRequestError.require(store, (str, os.PathLike), "store")
        if store == "":  # the working folder itself: the store's folders made among the caller's files
            raise InvalidRequestError("store must name a folder, not the empty path", field="store")
        InvalidRequestError.require(config, (SupervisorConfig, type(None)), "config")
        cfg = config or SupervisorConfig()
        if cfg.pool == "ray":
            require_ray()  # before anything exists: Ray installed, asyncio loop
        require_asyncio()
        handle = Store(store, durability=cfg.durability, max_record_bytes=cfg.max_record_bytes)
        handle.require_writable()  # a supervisor writes from its first step (its owner record): STORE_READ_ONLY now
        own_error: BaseException | None = None  # what the pool's start or the body raised
        opened_in = anyio.get_current_task().id
        left_open = False  # finalised by the event loop's end, in a task of its own: the ``async with`` was never left
        try:
            # a listener's KeyboardInterrupt or SystemExit stops the program as its own code raising it would: the
            # body is cancelled, the supervisor closes in order, then it is raised (from inside the supervisor's
            # bookkeeping, it skipped the close, and the process hung at exit)
            host_stop = HostStop()
            async with anyio.create_task_group() as tg:
                # the supervisor's tasks keep it, and so its context manager, alive until its loop ends: collected
                # earlier (dropped after a bare ``__aenter__``), the close ran in a task of the garbage
                # collector's choosing and cancelled the task the task group was entered in, the host's own
                sup = cls(handle, cfg, tg, host_stop, opening=held)
                try:
                    # space only gc spends, so a disk this store fills can still be collected (store/reserve.py)
                    await sup.runtime.store_thread.run(keep_reserve, handle)
                except BaseException as exc:  # its first thread that cannot start: ThreadStartError
                    own_error = exc
                    raise
                try:
                    try:
                        await sup.pool.start(tg)
                        # alive to others only now, holding nothing before: the first worker start (the
                        # forkserver's imports) blocks this loop, for seconds on a busy host, and a heartbeat
                        # written before it read as a dead owner's once the supervisor took its first leases
                        sup.lease_keeper.start()
                    except BaseException as exc:  # a worker that cannot start: WorkerStartError
                        own_error = exc
                        raise
                    tg.start_soon(sup.lease_keeper.run)
                    tg.start_soon(sup.continuation.watch_store, cfg.control_poll_s)
                    tg.start_soon(sup.runtime.control.run, cfg.control_poll_s)
                    try:
                        with anyio.CancelScope() as host_stop.body:
                            yield sup
                    except BaseException as exc:
                        own_error = exc
                        raise
                finally:
                    left_open = anyio.get_current_task().id != opened_in
                    with anyio.CancelScope(shield=True):
                        _, host_cancel = await to_its_end(sup._close(left_open=left_open))
                    if not left_open:
                        tg.cancel_scope.cancel()
                    if host_cancel is not None:
                        raise host_cancel  # the Ctrl-C, once the close is done: ``asyncio.run`` makes it a KeyboardInterrupt
            if host_stop.raised is not None:
                raise host_stop.raised
        except BaseException as exc:
            if left_open:
                # leaving the scopes entered in a task that has ended raises anyio's "different task"
                # RuntimeError, which says nothing the warning did not; the loop is ending
                log.debug("the scopes of a supervisor left open were left from another task", exc_info=exc)
                return
            # The task group wraps whatever left the body (or the pool's start); when that is
            # all it holds, the caller gets that exception back (``except ValueError`` must see
            # a ValueError, ``except SubagentError`` a worker that could not start).
            # A background task that could not get a thread (anyio's, for a store call) beside it says the same
            # as the coded error, once more: the caller gets that error alone (ThreadStartError.of).
            if isinstance(exc, BaseExceptionGroup):
                if own_error is not None and exc.split(lambda leaf: leaf is own_error or ThreadStartError.of(leaf) is not None)[1] is None:
                    # own_error may be a group itself (the body's own task group): split, not a walk of the
                    # leaves, sets it aside whole, so none of its leaves is taken for a thread's failure
                    beside = exc.split(lambda leaf: leaf is own_error)[1]
                    for leaf in _leaves(beside) if beside is not None else ():
                        log.warning("%s", ThreadStartError.of(leaf))
                    raise own_error from None
                coded = thread_failure(exc) if own_error is None else None
                if coded is not None:
                    raise coded from None
            raise

    @classmethod
    @asynccontextmanager
    async def open_configured(
        cls, config_file: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None,
    ) -> AsyncIterator["Supervisor"]:
        """Open a supervisor the way the ``subagents`` CLI does: from the layered configuration.

        ``open(store, config)`` reads nothing but its arguments. This call reads
        the embedded default, then the deployment file (``config_file``, else
        ``$SUBAGENTS_CONFIG``), then the ``SUBAGENTS_*`` variables of ``env``
        (default ``os.environ``), opens the configured store with the
        configured ``[supervisor]`` settings, and registers the configured
        ``[[providers]]``. A bad layer raises ``ConfigError`` (``CONFIG_INVALID``)
        before anything is opened.
        """
        deployment = load_config(config_file, env=env).config
        async with cls.open(store=deployment.store.path, config=deployment.supervisor) as sup:
            for settings in deployment.providers:
                sup.register_provider(settings.to_provider())
            yield sup

    async def _close(self, *, left_open: bool = False) -> None:
        """Close in order: the continuable children, the runs, the pool, the roots, the store thread.

        ``left_open``: the ``async with`` was never left, and the event loop's end finalises it after
        cancelling every task, the supervisor's own too. What those tasks would have delivered (a
        turn's end read from its worker's pipe, an activation's disposal) never comes, so nothing
        here waits for it: the workers are stopped and the turns they ran end with the pool.
        Every wait is bounded (a run's ``dispose`` is not, being shielded: the result is awaited
        here, and the runs forgotten, which is what ``dispose`` does once all of them are done).
        """
        self._closed = True
        if os.getpid() != self._pid:
            # a process forked from the host, unwinding its copy of the ``async with``: the workers, pipes,
            # leases and threads are the host's (its threads are not even here), and a close from here
            # cancelled the host's turns, killed its workers and released its leases
            log.warning("a supervisor opened in process %d is not closed from process %d, forked from it: left to "
                        "its own process", self._pid, os.getpid())
            return
        if left_open:
            log.warning("a supervisor of the store %s was never closed (its `async with Supervisor.open(...)` was not "
                        "left): it is closed as its event loop ends, its turns stopped, not awaited", self.store.root)
        with anyio.move_on_after(1.0 if left_open else self.config.cancel_grace_s + 10):
            await self.continuation.close()
        runs = list(self.runs.runs.values())  # the children the runs' turns started too: each is one of them
        for run in runs:
            run.cancel("disposed")
        if not left_open:
            with anyio.move_on_after(self.config.cancel_grace_s + 5):
                for run in runs:
                    await run.result()
        await self.runs.aclose()
        await self.pool.aclose()
        with anyio.move_on_after(0 if left_open else 5):  # a run whose turn the pool ended at close: its repair and release
            for run in runs:
                await run.result()
        for run in runs:
            self.runs.forget(run.id)
        for root_id, epoch in list(self._root_epochs.items()):
            try:
                await anyio.to_thread.run_sync(release_lease, self.store, root_id, self.lease_keeper.owner_id, epoch)
            except FencedError:
                log.warning("root %s was taken over before close", root_id)
            except (SubagentError, OSError):  # a store that takes no write now: the lease lapses with us
                log.warning("could not release the lease of root %s at close", root_id, exc_info=True)
        await self.runtime.store_thread.aclose()  # last: everything above may still call it
        with anyio.move_on_after(5):  # the leases of crashed owners this supervisor took over are released now
            await self.lease_keeper.reap()
        self.lease_keeper.stop()

    def _check_open(self) -> None:
        """``SUPERVISOR_CLOSED`` once closing began, for every public call: reads too (``get_provider``,
        ``providers``, ``statistics``, the listings). After close the pool is stopped and the runs are
        disposed, so an answer would describe a torn-down supervisor (no workers, no runs, providers
        nothing can run), not its last state; the store's own functions read what it left."""
        if self._closed:
            raise SupervisorClosedError()
        require_loop(self.runtime.loop)

    def _own_root(self, root: AgentRef | str) -> str:
        """The id of ``root``, a root this supervisor opened and still holds (``UNAUTHORIZED`` otherwise)."""
        root_id = ref_id(root, "root")
        if root_id not in self._root_epochs:
            raise UnauthorizedError.not_own_root(root_id)
        return root_id

    async def _begin(self) -> None:
        """``_check_open``, then a checkpoint, for the calls that act: in a scope already cancelled a call has no
        effect, anyio's rule (``followup`` accepted a message whose id went to nobody, and ``drain`` tore a
        tree down, before the cancellation was raised)."""
        self._check_open()
        await deliver_held_back()
        await anyio.lowlevel.checkpoint_if_cancelled()

    # -- providers (ProviderRegistry) ------------------------------------------------

    def register_provider(self, provider: Provider) -> Callable[[], None]:
        self._check_open()
        InvalidRequestError.require(provider, Provider, "provider")
        return self.registry.register(provider)

    def get_provider(self, name: str) -> Provider | None:
        """The provider registered as ``name``, or ``None``. A name that is no text is ``INVALID_REQUEST``
        (a list was a bare ``TypeError: unhashable type`` from the registry's table)."""
        self._check_open()
        InvalidRequestError.require(name, str, "name")
        return self.registry.get(name)

    def providers(self) -> list[str]:
        """The registered providers' names, in registration order."""
        self._check_open()
        return self.registry.names()

    def on(self, event: str | None, listener: Callable[[str, dict[str, Any]], Any]) -> Callable[[], None]:
        """Listen to lifecycle events (``EVENT_NAMES``: ``subagent/start``, ``subagent/end``,
        ``subagent/provider-*``; ``None``: all). An unknown name or a listener that is not callable is
        ``INVALID_REQUEST``: it would never fire, or fail only when an event comes."""
        self._check_open()
        if event is not None and event not in EVENT_NAMES:
            raise InvalidRequestError(f"unknown event {event!r} (known: {', '.join(EVENT_NAMES)})", field="event")
        if not callable(listener):
            raise InvalidRequestError(f"listener must be callable, not {type(listener).__name__}", field="listener")
        return self.events.on(event, listener)

    # -- roots -----------------------------------------------------------------------

    @thread_failures_coded
    async def open_root(self, *, label: str | None = None, id: str | None = None, sandbox: str | None = None) -> AgentRef:
        """Open a top-level agent (depth 0): a new session labelled ``label``, or an existing root by ``id``.

        A root opened by ``id`` keeps the label it was created with (``label``,
        if given, must be that one); a session that has a parent is not a root
        (``INVALID_REQUEST``, before its lease is touched). ``sandbox`` is one of
        the tools' ``SANDBOX_MODES`` (``INVALID_REQUEST`` before anything is made).
        """
        self._check_open()
        InvalidRequestError.require_sandbox(sandbox)
        InvalidRequestError.require(label, (str, type(None)), "label")
        InvalidRequestError.require(id, (str, type(None)), "id")
        # the checks a child's label gets (text UTF-8 can hold: INVALID_REQUEST); its size is bounded by
        # the store's record limit as the header is encoded, and named for the label (LABEL_TOO_LARGE), as a
        # child's is in its descriptor: the header, a record the caller never wrote, is the store's word
        request_fields(max_depth=None, budget=None, tool_filter=None, texts={"label": label})

        def open_it() -> tuple[str, int, int, str | None]:
            if id is None:
                # created leased: a gc of any age cannot take it before it is held (it did, between two steps)
                root_id = self.ids.new()
                try:
                    create_session(self.store, root_id, label=label, lease_owner=self.lease_keeper.owner_id, lease_state="idle")
                except RecordTooLargeError as exc:  # refused as the header was encoded, before any file was written
                    if label is None:
                        raise
                    raise InvalidRequestError.label_too_large(label, exc.fields["size"], exc.fields["limit"]) from None
                return root_id, 1, 0, label
            header = read_header(self.store, id)
            if header.parent_session is not None:
                raise InvalidRequestError.not_a_root(id, header.parent_session)
            if label is not None and label != header.label:
                raise InvalidRequestError.other_label(id, header.label, label)
            lease = acquire_lease(self.store, id, self.lease_keeper.owner_id, state="idle")
            return id, lease.epoch, header.delegation_depth, header.label

        streak = self.lease_keeper.streak()
        root_id, epoch, depth, stored = await anyio.to_thread.run_sync(open_it)
        self._root_epochs[root_id] = epoch
        self._root_streaks[root_id] = streak
        self.agents.add_root(root_id, label=stored, sandbox=sandbox, depth=depth)
        return AgentRef(root_id, stored)

    @thread_failures_coded
    async def release_root(self, root: AgentRef | str) -> None:
        """Let go of a root this supervisor opened, without closing: its lease is released, and it is no
        parent here until ``open_root(id=...)`` opens it again (``UNAUTHORIZED`` meanwhile, and for a
        root not open here).

        For a service that opens a root per conversation: an open root holds memory and its lease,
        which keeps ``gc`` off its whole tree, until the supervisor closes. Its children are left as
        they are: one still working settles as usual, its notice waiting in the root's mailbox for
        whoever opens the root next; ``drain([root])`` first stops them.
        """
        await self._begin()
        root_id = self._own_root(root)
        epoch = self._root_epochs.pop(root_id)
        del self._root_streaks[root_id]
        self.agents.remove(root_id)
        self.continuation.root_released(root_id)
        with anyio.CancelScope(shield=True):  # forgotten here: its lease goes too, cancelled or not
            try:
                await anyio.to_thread.run_sync(release_lease, self.store, root_id, self.lease_keeper.owner_id, epoch)
            except FencedError:
                log.warning("root %s was taken over before it was released", root_id)

    # -- one-shot children (OneShotRuns) ------------------------------------------------

    @thread_failures_coded
    async def start(self, provider: str, request: SubagentRequest, *, cancel: CancelToken | None = None) -> SubagentRun:
        """Start a one-shot child; returns once it is published (the caller must dispose it).

        ``provider`` is a registered provider's name: anything but text is ``INVALID_REQUEST`` (``None``
        was looked up and said ``NO_PROVIDER "None"``, a list was a bare ``TypeError``). Cancelled before it
        returns (the caller's cancel scope, ``cancel``, a Ctrl-C), it leaves no child: one made meanwhile is
        deleted unrun before the cancellation goes on, so there is no id to learn, interrupt or collect."""
        await self._begin()
        InvalidRequestError.require(provider, str, "provider")
        InvalidRequestError.require(request, SubagentRequest, "request")
        if cancel is not None:  # a Protocol's isinstance walks its members: not on every start without a token
            InvalidRequestError.require(cancel, CancelToken, "cancel")
        return await self.runs.start(provider, request, cancel=cancel)

    # -- continuable children (ContinuationManager) ---------------------------------------

    @thread_failures_coded
    async def start_continuable(self, spec: ContinuableSpec) -> tuple[str, str]:
        """Start a continuable child; returns ``(child_id, message_id)`` once the prompt is durably accepted.

        A cancellation (the caller's cancel scope, a Ctrl-C) that comes once the child is being made waits for
        the call's end: the ids are returned, and it is raised at the caller's next await, so the caller always
        holds the id of a child that exists (to interrupt, drain or ``gc`` it); one before leaves no child."""
        await self._begin()
        InvalidRequestError.require(spec, ContinuableSpec, "spec")
        with results_first():  # the ids of a child made and a prompt accepted reach the caller before a Ctrl-C
            await self._require_root_held(spec.parent)
            return await self.continuation.start_continuable(spec)

    @thread_failures_coded
    async def followup(self, parent: AgentRef | str, child_id: str, content: Any, *, source: dict[str, Any] | None = None) -> str:
        """Send the next FIFO turn to a child of ``parent``; cold-resumes it from the store when needed."""
        await self._begin()
        InvalidRequestError.require(child_id, str, "child_id")  # not INVALID_SESSION_ID: that says the text is no id
        with results_first():  # an accepted message's id reaches the caller before a Ctrl-C does
            await self._require_root_held(parent)
            return await self.continuation.followup(parent, child_id, content, source=source)

    async def _require_root_held(self, parent: AgentRef | str) -> None:
        """``FencedError`` when ``parent`` is a root this supervisor opened whose lease another supervisor took over
        (this one was paused past its TTL): its children's notices would go to the new holder, and this
        supervisor's own take of them is fenced. One read of the root's lease slots; other parents are checked
        by the calls themselves. No read while the lease keeper's renewals show nobody can have taken it
        (``LeaseKeeper.held_surely``): a followup's acceptance stays one store-thread call."""
        root_id = ref_id(parent)
        epoch = self._root_epochs.get(root_id) if isinstance(root_id, str) else None
        if epoch is None or self.lease_keeper.held_surely(self._root_streaks[root_id]):
            return
        lease = await self.runtime.store_thread.run(read_lease, self.store, root_id)
        if lease is None or lease.owner != self.lease_keeper.owner_id or lease.epoch != epoch or lease.state == "released":
            raise FencedError(root_id, epoch=epoch, current_epoch=None if lease is None else lease.epoch)

    @thread_failures_coded
    async def interrupt(
        self, child_id: str, *, authority: UserAuthority | AncestorAuthority, wait_s: float = 0.0,
    ) -> InterruptResult:
        """Cancel the child's current turn only (queued messages and its children are kept); says what happened.

        With a ``UserAuthority`` it reaches a running turn of any child on the
        store, one-shot or continuable: one held here is stopped here; one that a
        live other supervisor holds gets a durable control record that
        supervisor carries out. ``wait_s`` bounds how long to wait for that
        supervisor to confirm (the child's log shows the turn ended): the answer
        is then ``cancelled``, else ``requested``. ``no_turn_running`` says why
        nothing was stopped. An ``AncestorAuthority`` reaches continuable
        activations held here only (as a turn's ``ctx.interrupt`` does).
        """
        await self._begin()
        InvalidRequestError.require(child_id, str, "child_id")
        validate_session_id(child_id)  # whatever the authority: an id no session can have is no child of anyone
        InvalidRequestError.require(authority, (UserAuthority, AncestorAuthority), "authority")
        InvalidRequestError.require(wait_s, (int, float), "wait_s")  # no None: a bound of 0 is "do not wait"
        InvalidRequestError.require_seconds(wait_s, "wait_s")  # before a control record is written, not after
        return await self.interrupts.interrupt(child_id, authority, wait_s=wait_s)

    @thread_failures_coded
    async def send(self, child_id: str, content: Any, *, parent: AgentRef | str, source: dict[str, Any] | None = None) -> str:
        """Host-user continuation from any process: the next FIFO turn for a child of root ``parent``.

        Needs no live parent here: the child's header must name ``parent``. Goes to
        the supervisor hosting the child (through its durable mailbox), or cold-resumes
        the child here when nobody hosts it. Returns once the message is durable.
        """
        await self._begin()
        InvalidRequestError.require(child_id, str, "child_id")
        parent_id = ref_id(parent)
        with results_first():
            return await self.continuation.send(child_id, content, parent=parent_id, source=source)

    @thread_failures_coded
    async def report_from(self, child_id: str, content: Any, *, delivery: str = "wakeup") -> str:
        """A live continuable child's message to its live direct parent (``quiet``: context; ``wakeup``: a turn).
        A ``child_id`` that is no text is ``INVALID_REQUEST`` (a list was a bare ``TypeError``)."""
        await self._begin()
        InvalidRequestError.require(child_id, str, "child_id")
        with results_first():
            return await self.continuation.report_from(child_id, content, delivery=delivery)

    def register_continuable_setup(self, contribution: Contribution) -> Callable[[], None]:
        """Install ``contribution(ActivationInfo) -> dispose`` into every continuable activation; returns the revoker."""
        self._check_open()
        if not callable(contribution):
            raise InvalidRequestError(f"contribution must be callable, not {type(contribution).__name__}", field="contribution")
        return self.runtime.setups.register(contribution)

    @thread_failures_coded
    async def drain(self, parents: list[AgentRef | str]) -> None:
        """Close admission below ``parents`` and dispose their continuable descendants child-first.

        Descendants another live supervisor hosts get a durable drain request, carried out by their
        host and not awaited here (as ``drain_remote``); those nobody hosts are drained here.
        ``TeardownFailedError`` once all that is done, naming each descendant whose files did not let
        it be torn down (they do not read): logging it alone let a caller believe the tree was drained."""
        await self._begin()
        InvalidRequestError.require(parents, (list, tuple), "parents")
        for item in parents:
            InvalidRequestError.require(item, (AgentRef, str), "each of parents")
        reached = await self.continuation.drain(parents)
        if reached.failed:
            raise TeardownFailedError("scoped", reached.failed)

    @thread_failures_coded
    async def drain_remote(self, root: AgentRef | str) -> list[str]:
        """Ask other supervisors to tear down the continuable descendants of ``root`` they host
        (durable ``drain`` control records), and drain here those nobody hosts; returns the ids
        reached: those asked, then those drained here (which had an open turn or messages waiting).
        ``TeardownFailedError`` instead, once all that is done, if a descendant's files did not let it be
        torn down; its ``reached`` holds the ids that would have been returned."""
        await self._begin()
        reached = await self.continuation.drain_remote(ref_id(root, "root"))
        if reached.failed:
            raise TeardownFailedError("scoped", reached.failed, reached=reached.asked + reached.here)
        return reached.asked + reached.here

    @thread_failures_coded
    async def drain_children(self, parent: AgentRef | str, child_ids: list[str]) -> None:
        """Dispose the listed continuable children of ``parent`` (as ``drain``, for those children only,
        wherever they are hosted); ids that name no session are skipped. ``TeardownFailedError`` once
        the others are torn down, for those whose files did not let them be."""
        await self._begin()
        InvalidRequestError.require(parent, (AgentRef, str), "parent")
        InvalidRequestError.require(child_ids, (list, tuple), "child_ids")  # a string would be drained letter by letter
        for item in child_ids:
            InvalidRequestError.require(item, str, "each of child_ids")
        reached = await self.continuation.drain_children(parent, child_ids)
        if reached.failed:
            raise TeardownFailedError("selected", reached.failed)

    @thread_failures_coded
    async def resume_pending(self, root: AgentRef | str) -> list[str]:
        """Run what a closed or crashed host left waiting under ``root`` (a root opened here): each of its
        continuable children that no live supervisor hosts and whose mailbox holds messages no turn took is
        resumed here and runs them in order; the ids resumed. Not automatic on ``open_root``: a short-lived
        process opening a root (``subagents send``) would start turns it then stops as it closes."""
        self._check_open()
        return await self.continuation.resume_pending(self._own_root(root))

    @thread_failures_coded
    async def take_messages(self, root: AgentRef | str) -> list[MailboxMessage]:
        """Messages delivered to a root (reports, settlement notices), consumed durably into its log."""
        self._check_open()
        root_id = self._own_root(root)
        epoch = self._root_epochs[root_id]

        def take() -> list[MailboxMessage]:
            # what is pending is read from the projection of the writer that consumes it, and consumed only
            # if no other take appended since (the log's next seq): two takes at once (a ``wait_for_message``
            # poller beside a call) each returned the same message, and the log consumed it twice
            with LogWriter.open(self.store, root_id, epoch=epoch) as writer:
                while True:
                    projection = writer.projection
                    messages = pending(
                        self.store, root_id, consumed=projection.consumed, last_consumed_id=projection.last_message_id,
                        mailbox_end=projection.mailbox_end,
                    )
                    if not messages:
                        # nothing pending, perhaps because the mailbox refuses every acceptance: damage in its
                        # consumed part, which the pending read starts after. The host waiting on it is told,
                        # as the notices' senders were (it waited out its timeout, for good without one)
                        require_consumed_prefix(self.store, root_id, projection)
                        return messages
                    try:
                        writer.append([("message/accepted", m.to_event_data()) for m in messages], first_seq=writer.next_seq)
                    except SeqMismatchError:
                        continue  # the other take's records are folded in now: what is left, again
                    # written: the log has consumed them, and they are the caller's whatever comes next. The
                    # commit point's fsync may still fail (DURABILITY_FAILED: not durable, said), but the fence
                    # it checks again to refresh the identity cache (a log past 64 KiB) is no reason to drop
                    # them: a root released (or taken over) since the write raised FENCED there, and messages
                    # the log had consumed were returned to nobody
                    try:
                        writer.commit()
                    except FencedError:
                        log.info("root %s was let go after a take consumed %d message(s): they are returned all the same",
                                 root_id, len(messages))
                    return messages

        await deliver_held_back()
        while True:
            try:
                with results_first(), anyio.CancelScope(shield=True):
                    # to its end under a Ctrl-C too (a native cancellation, which the shield lets through): what
                    # the take consumed reaches the caller, and the Ctrl-C is raised after; at once when it took nothing
                    messages, host_cancel = await to_its_end(anyio.to_thread.run_sync(take))
                    if host_cancel is not None and (not messages or not hold_back(host_cancel)):
                        raise host_cancel
                    return messages
            except FencedError:
                # fenced by this supervisor's own letting go of the root while the take's thread ran (a
                # ``release_root``, its close), not by a takeover: said as a new call would say it. A root
                # opened again meanwhile is taken at its new epoch; a lease still ours at the same epoch
                # was taken by another supervisor, which FENCED says
                self._check_open()
                root_id = self._own_root(root)
                if self._root_epochs[root_id] == epoch:
                    raise
                epoch = self._root_epochs[root_id]

    @thread_failures_coded
    async def wait_for_message(self, root: AgentRef | str, *, timeout_s: float | None = None) -> list[MailboxMessage]:
        """Wait until messages reach a root's mailbox, take them, and return them (the host side of ``report``).

        ``timeout_s=None`` (the default) waits as long as it takes, like any
        anyio receive: bound it with ``timeout_s`` (then ``WaitTimeoutError``,
        code ``TIMEOUT``) or with a cancel scope of your own
        (``anyio.fail_after``). The mailbox is polled every 20 ms, and always
        read at least once: ``timeout_s=0`` takes what is there or times out.
        A take that has begun is finished even past the deadline (it is a
        durable consumption), so the bound is on the waiting between takes.
        A wait under way ends as a new call would: ``SUPERVISOR_CLOSED`` once
        the supervisor closes, ``UNAUTHORIZED`` once its root is released.
        """
        self._check_open()
        InvalidRequestError.require_seconds(timeout_s, "timeout_s")
        deadline = math.inf if timeout_s is None else anyio.current_time() + timeout_s
        root_id = self._own_root(root)  # before its mailbox is looked at: an id of no root open here
        looked: int | None = None  # where the root's mailbox data ended before the last take that found nothing
        while True:
            # a take opens the root's log writer: each idle waiter cost 2-4% of a core at one take per poll.
            # Every acceptance moves the mailbox's data end (``mailbox_data_end``), read before the take: a
            # message accepted after that read moves it past ``looked``, one accepted before is taken
            end = _mailbox_end(self.store, root_id)
            if end is None or end != looked:
                got = await self.take_messages(root)
                if got:
                    return got
                looked = end
            left = deadline - anyio.current_time()
            if left <= 0:
                break
            await anyio.sleep(min(0.02, left))
            # as a new call would be answered: nothing moves a mailbox no take will read any more
            self._check_open()
            self._own_root(root_id)
        raise WaitTimeoutError(f"no message reached root {ref_id(root, 'root')} within {timeout_s} s")

    # -- catalog (store) ------------------------------------------------------------------

    @thread_failures_coded
    async def list_children(self, parent_id: AgentRef | str, query: Query | None = None) -> list[ChildEntry | DiagnosticEntry]:
        """Direct children in creation order; ``query`` filters by status, outcome, label glob and time. The parent
        is an id or the ``AgentRef`` that ``open_root`` returned, as for ``start`` and ``followup``; a session with no
        children, or none of that id, has none (``[]``, as in the reference: a listing is no lookup)."""
        self._check_open()
        InvalidRequestError.require(query, (Query, type(None)), "query")
        parent = ref_id(parent_id)
        return await anyio.to_thread.run_sync(list_children, self.store, parent, query)

    @thread_failures_coded
    async def list_descendants(self, root_id: AgentRef | str, query: Query | None = None) -> list[DescendantRow]:
        """Every descendant in pre-order; ``query`` keeps the matching rows (``root_id`` as ``list_children``'s parent)."""
        self._check_open()
        InvalidRequestError.require(query, (Query, type(None)), "query")
        root = ref_id(root_id, "root_id")
        return await anyio.to_thread.run_sync(list_descendants, self.store, root, query)

    @thread_failures_coded
    async def gc(
        self, older_than_s: float, *, outcomes: tuple[str, ...] | list[str] | set[str] | frozenset[str] = (), dry_run: bool = False,
    ) -> GcReport:
        """Delete the top-level subtrees settled longer than ``older_than_s`` (``store.collect``, ``subagents gc``).

        Runs in a thread; this supervisor's own roots and children are held (live leases), so they stay.
        An argument of the wrong type is ``INVALID_REQUEST``, as for every call here (``outcomes=None`` was
        a bare ``TypeError``, ``dry_run="no"`` a dry run); a value of the right type that the store's rules
        refuse (a negative age, an unknown outcome) is the store's ``INVALID_QUERY``, as ``subagents gc`` says.
        """
        self._check_open()
        if isinstance(older_than_s, bool):  # an int to isinstance, and no age
            raise InvalidRequestError("older_than_s must be int or float, not bool", field="older_than_s")
        InvalidRequestError.require(older_than_s, (int, float), "older_than_s")
        InvalidRequestError.require(outcomes, (list, tuple, set, frozenset), "outcomes")  # a string: one outcome per letter
        for item in outcomes:
            InvalidRequestError.require(item, str, "each of outcomes")
        InvalidRequestError.require(dry_run, bool, "dry_run")  # any truthy text would have meant "dry run", 0 "delete"
        return await anyio.to_thread.run_sync(lambda: collect(self.store, older_than_s, outcomes=outcomes, dry_run=dry_run))

    def statistics(self) -> SupervisorStatistics:
        """A snapshot of the pool, the runs, the roots and the store thread, for tests and the CLI
        (``SUPERVISOR_CLOSED`` after close: see ``_check_open``)."""
        self._check_open()
        return SupervisorStatistics(
            owner_id=self.lease_keeper.owner_id,
            pool=self.pool.statistics(),
            runs_live=self.runs.live(),
            runs_held=len(self.runs.runs),
            roots=len(self._root_epochs),
            creation=self.runs.creation_statistics(),
            store_thread=self.runtime.store_thread.statistics(),
            open_mailboxes=self.continuation.open_mailboxes(),
        )


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    """The exceptions a (nested) group holds, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
