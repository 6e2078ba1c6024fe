"""Control of children hosted by any process: ``send``, ``interrupt`` and ``drain``.

Each verb opens a ``Supervisor`` on the store. A child hosted by another
process is reached through the store (its durable mailbox or its control
file), never by signalling that process; a child nobody hosts is
cold-resumed here by ``send`` and hosted until it settles (closing earlier
would cancel its turn). ``send`` and ``drain`` wait under ``--wait-s`` and
answer ``TIMEOUT`` past it. ``interrupt`` says what it did: the turn it
cancelled (exit 0), the request it left for the supervisor holding the child
when that did not confirm within ``--wait-s`` (exit 0), or that no turn was
running (exit ``EXIT_NO_TURN``).

The supervisor's runtime is imported by the functions that open one, not
here: every command line builds the parser these verbs register with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from subagents.store.errors import LeaseHeldError, SubagentError

from ..errors import UnauthorizedError, WaitTimeoutError
from . import render
from .invocation import Invocation
from .parser import Verbs, positive_float, seconds, text_or_stdin, utf8_text

if TYPE_CHECKING:
    from subagents.store import MailboxMessage, Store

    from ..config import SupervisorConfig
    from ..config_loader import DeploymentConfig
    from ..models import InterruptResult
    from ..service import Supervisor

__all__ = ["register", "CONTROL_POLL_S", "WAIT_S", "INTERRUPT_WAIT_S", "EXIT_NO_TURN"]

# `send` and `drain` wait on other processes through the store (a lease read per child per poll);
# `send` also wakes at once on its own child's end event, so this bounds only the cross-process case
CONTROL_POLL_S = 0.05
WAIT_S = 60.0  # how long `send` (a child it resumed) and `drain` wait for children to settle
INTERRUPT_WAIT_S = 10.0  # how long `interrupt` waits for the supervisor holding the child to confirm the turn ended
EXIT_NO_TURN = 3  # `interrupt` found no turn running (settled, idle, no live holder)


def register(verbs: Verbs) -> None:
    send = verbs.add("send", cmd_send, "send CHILD its next turn as the host user (cold-resumes it when nobody hosts it)",
                     example='subagents send 01M8MW1K3J5T0000000000000B \'{"script": [{"return": "summarised"}]}\' --parent 01M8MVY0PZ9RKY15DPNHER70WX\n'
                             '# the demo\'s reviewer runs the script program: its messages are scripts; an llm child takes text')
    send.add_argument("child", metavar="CHILD", help="the continuable child that takes the message")
    send.add_argument("message", metavar="MESSAGE", type=utf8_text, help="the message ('-' reads stdin)")
    send.add_argument("--parent", required=True, metavar="ROOT", help="the session CHILD's header names as its parent (a root, for a child started by a host)")
    send.add_argument("--wait-s", type=positive_float, default=WAIT_S,
                      help=f"when CHILD was resumed here: how long to wait for it to settle (default {WAIT_S:.0f})")

    interrupt = verbs.add("interrupt", cmd_interrupt,
                          "cancel CHILD's current turn, one-shot or continuable, whichever process runs it (its queued messages "
                          f"and children are kept); exit {EXIT_NO_TURN} when no turn was running",
                          example="subagents interrupt 01M8MW1K3J5T0000000000000B --parent 01M8MVY0PZ9RKY15DPNHER70WX")
    interrupt.add_argument("child", metavar="CHILD", help="the child whose current turn to cancel")
    interrupt.add_argument("--parent", required=True, metavar="ROOT", help="the session CHILD's header names as its parent")
    interrupt.add_argument("--wait-s", type=seconds, default=INTERRUPT_WAIT_S,
                           help=f"when another process runs CHILD: how long to wait for it to confirm the turn ended (default {INTERRUPT_WAIT_S:.0f}; 0: deliver, do not wait)")

    drain = verbs.add("drain", cmd_drain, "tear down every continuable descendant of ROOT, whichever process hosts it",
                      example="subagents drain 01M8MVY0PZ9RKY15DPNHER70WX --wait-s 30")
    drain.add_argument("root", metavar="ROOT", help="the session whose continuable descendants to tear down: a top-level session, "
                       "or any subagent (its own subtree only)")
    drain.add_argument("--wait-s", type=positive_float, default=WAIT_S, help=f"how long to wait for them to settle (default {WAIT_S:.0f})")


def _register_configured(sup: Supervisor, config: DeploymentConfig) -> None:
    """The configured providers: a child resumed here runs its descriptor's provider (or the built-in
    program of that name)."""
    for settings in config.providers:
        sup.register_provider(settings.to_provider())


def _control_config(config: DeploymentConfig) -> SupervisorConfig:
    """The supervisor config of a command that runs no turn (``interrupt``, ``drain``): one worker, the least the pool takes."""
    return config.supervisor.model_copy(update={"pool_size": 1})


def _is_settlement_of(message: MailboxMessage, child_id: str, since: float) -> bool:
    """A settlement notice of ``child_id`` (the kind the supervisor writes when an activation settles), accepted at or after ``since``."""
    return message.source.get("kind") == "subagent-settled" and message.source.get("sender_session_id") == child_id and message.ts >= since


def _settlement_notices(store: Store, root_id: str, child_id: str, since: float) -> list[dict[str, Any]]:
    from subagents.store import read_mailbox

    return [_message_doc(m) for m in read_mailbox(store, root_id) if _is_settlement_of(m, child_id, since)]


def _message_doc(message: MailboxMessage) -> dict[str, Any]:
    return {"id": message.id, "ts": message.ts, "kind": message.source.get("kind"), "summary": message.source.get("summary"),
            "content": message.content}


# how long ``send`` waits for another holder of the root to let go before it leaves the root's mail to that
# holder: another ``send`` taking the root's mail holds it for a moment, and a notice it found held was left
# waiting for good (two ``send`` commands at once, found by a probe)
ROOT_MAIL_WAIT_S = 2.0
_ROOT_MAIL_RETRY_S = 0.05


async def _take_root_mail(sup: Supervisor, root_id: str) -> list[MailboxMessage] | None:
    """Take what waits in the root's mailbox into its log: this command is the root's reader once it
    printed the notice, and a message nobody takes waits forever (``gc`` keeps its subtree for it).

    None when the parent is not a root (a subagent reads its own mailbox in its turns) or another
    live supervisor holds the root for longer than ``ROOT_MAIL_WAIT_S`` (its program reads it); the
    messages are then left where they are.
    """
    import anyio

    from subagents.store import read_header

    if (await anyio.to_thread.run_sync(read_header, sup.store, root_id)).origin is not None:
        return None
    deadline = anyio.current_time() + ROOT_MAIL_WAIT_S
    while True:  # no cancel scope: a take cut short after it consumed the messages would print none of them
        try:
            root = await sup.open_root(id=root_id)
        except LeaseHeldError:
            if anyio.current_time() >= deadline:
                return None
            await anyio.sleep(_ROOT_MAIL_RETRY_S)
        else:
            return await sup.take_messages(root)


def _require_parent(store: Store, child: str, parent: str) -> None:
    """``UNAUTHORIZED`` before any supervisor starts when ``--parent`` is not the parent ``child``'s header
    names, saying what it names: the API's text alone (``belongs to another parent session``) said it of
    a top-level session too, and left the user nothing to correct the command with."""
    from subagents.store import read_header

    named = read_header(store, child).parent_session
    if named == parent:
        return
    whose = f"{child} is a top-level session, which has no parent" if named is None else f"its parent is {named}, not {parent}"
    raise UnauthorizedError(f"{UnauthorizedError.other_parent(child).message}: {whose}", child_id=child)


def cmd_send(inv: Invocation) -> int:
    args, out = inv.args, inv.out
    store = inv.open_store(write=True)  # a control command never creates a store
    args.child = inv.session(store, args.child).id  # SESSION_NOT_FOUND before any supervisor starts
    args.parent = inv.session(store, args.parent).id
    _require_parent(store, args.child, args.parent)
    message = text_or_stdin(args.message)
    doc = inv.stop.host(_send, inv.config, args.child, message, args.parent, args.wait_s, out)
    if out.json_mode:
        out.json(doc)
    elif doc["hosted"] == "elsewhere":
        render.render_sent(out, doc)  # resumed here: printed as soon as it was durable
    else:
        render.render_settled(out, doc)
    if doc["hosted"] == "here" and not doc["settled"]:
        raise WaitTimeoutError(
            f'agent "{args.child}" did not settle within {args.wait_s:g} s; its turn was stopped when this command closed',
            child_id=args.child,
        )
    return 0 if doc["hosted"] == "elsewhere" or (doc["stop_reason"] == "completed" and doc["notice_problem"] is None) else 1


# what ``send`` says of a turn it hosted; null when another supervisor hosts the child (``--json`` has the same keys
# wherever it runs, so that a script reads ``doc["settled"]`` either way)
_SETTLEMENT_KEYS = ("settled", "stop_reason", "diagnostic", "notice", "also_delivered", "notice_taken", "output",
                    "notice_problem", "taken_over")


async def _send(config: DeploymentConfig, child: str, message: str, parent: str, wait_s: float, out: render.Output) -> dict[str, Any]:
    """Send; when the child was resumed here, host it until it settles (closing earlier would cancel its turn)."""
    import anyio

    from subagents.store import read_lease, read_mailbox

    from ..service import Supervisor

    async with Supervisor.open(store=config.store.path, config=config.supervisor) as sup:
        _register_configured(sup, config)
        owner_id = sup.statistics().owner_id
        ends: list[dict[str, Any]] = []  # the ``subagent/end`` payloads of the child's activations that ended here
        woken = [anyio.Event()]

        def on_end(name: str, payload: dict[str, Any]) -> None:
            if payload.get("id") == child:
                ends.append(payload)
                woken[0].set()

        sup.on("subagent/end", on_end)
        message_id = await sup.send(child, message, parent=parent)
        accepted_at = next((m.ts for m in await anyio.to_thread.run_sync(read_mailbox, sup.store, child) if m.id == message_id), 0.0)
        lease = await anyio.to_thread.run_sync(read_lease, sup.store, child)
        doc: dict[str, Any] = {"message_id": message_id, "child": child, "parent": parent,
                               "hosted": "here" if lease is not None and lease.owner == owner_id else "elsewhere",
                               "epoch": lease.epoch if lease is not None else None, **dict.fromkeys(_SETTLEMENT_KEYS)}
        if doc["hosted"] == "elsewhere":
            return doc  # durable in its mailbox: the hosting supervisor runs it, and this command sees none of it
        if not out.json_mode:
            render.render_sent(out, doc)

        # settled = this supervisor emitted the activation's ``subagent/end``: that comes after
        # the settlement notice is durable in the root's mailbox (the lease is released earlier,
        # so "lease released" alone would read the mailbox before the notice is there)
        settled = False
        with anyio.move_on_after(wait_s):
            while not ends:
                woken[0] = anyio.Event()
                if ends:
                    break
                await woken[0].wait()
            settled = True
        end = ends[0] if ends else {}
        # the root's files refused the notice: the closing message is printed from here instead, with why
        undelivered: str | None = end.get("notice_problem")
        taken_over = bool(end.get("taken_over"))
        notice = None
        if settled and end.get("notice_id") is not None:
            try:
                notices = await anyio.to_thread.run_sync(_settlement_notices, sup.store, parent, child, accepted_at)
            except SubagentError as exc:  # delivered, and the root's mailbox no longer reads
                undelivered = f"{exc.code}: {exc.message}"
            else:
                # this activation's own notice, by its id: after a takeover the root also holds the notices
                # of the supervisor that took the child over, which this command printed as its own
                notice = next((n for n in notices if n["id"] == end["notice_id"]), None)
        taken = (await _take_root_mail(sup, parent) or []) if notice is not None else []
        # the root's other messages taken with the notice are printed too: taken means delivered
        others = [m for m in taken if m.id != notice["id"]] if notice is not None else []
        stop_reason = end.get("stop_reason")
        if taken_over:
            diagnostic: str | None = (f"{child} was taken over by another process (its lease at epoch {doc['epoch']} lapsed while this "
                                      "command was stopped or stalled): that process closed this turn and runs the child now; "
                                      f"see `subagents log {child}`")
        elif stop_reason not in (None, "completed"):
            diagnostic = await anyio.to_thread.run_sync(_last_diagnostic, sup.store, child)
        else:
            diagnostic = None
        doc.update(settled=settled, stop_reason=stop_reason, diagnostic=diagnostic, notice=notice,
                   also_delivered=[_message_doc(m) for m in others], notice_taken=len(others) < len(taken),
                   output=None if taken_over else end.get("last_assistant_message"), notice_problem=undelivered,
                   taken_over=taken_over)
    return doc


def _last_diagnostic(store: Store, child: str) -> str | None:
    """Why the child's last turn ended as it did (``PARENT_UNAVAILABLE: ...``): the settlement notice says
    only that it failed, and this command ran that turn, so it says why, as ``run`` does."""
    from subagents.store import inspect

    ends = [e["data"] for e in inspect(store, child).events if e["type"] == "turn/end"]
    return ends[-1].get("diagnostic") if ends else None


def cmd_interrupt(inv: Invocation) -> int:
    args = inv.args
    store = inv.open_store(write=True)
    child = inv.session(store, args.child).id  # INVALID_SESSION_ID / SESSION_NOT_FOUND before any supervisor starts
    parent = inv.session(store, args.parent).id
    _require_parent(store, child, parent)
    result = inv.stop.host(_interrupt, inv.config, child, parent, args.wait_s)
    inv.emit(result.model_dump(), render.render_interrupt)
    return EXIT_NO_TURN if result.outcome == "no_turn_running" else 0


async def _interrupt(config: DeploymentConfig, child: str, parent: str, wait_s: float) -> InterruptResult:
    from ..models import UserAuthority
    from ..service import Supervisor

    async with Supervisor.open(store=config.store.path, config=_control_config(config)) as sup:
        return await sup.interrupt(child, authority=UserAuthority(parent_session=parent), wait_s=wait_s)


def cmd_drain(inv: Invocation) -> int:
    args = inv.args
    args.root = inv.parent(inv.open_store(write=True), args.root)  # SESSION_NOT_FOUND before any supervisor starts
    doc = inv.stop.host(_drain, inv.config, args.root, args.wait_s)
    inv.emit(doc, render.render_drain)
    if doc["failed"]:
        return 1  # each named in the report: the rest was drained
    if not doc["settled"]:
        left = [c["id"] for c in doc["children"] if c["status"] != "complete"]
        raise WaitTimeoutError(
            f"{len(left)} continuable descendants of {args.root} did not settle within {args.wait_s:g} s: {', '.join(left)}", root=args.root
        )
    return 0


def _continuable_rows(store: Store, root_id: str) -> list[dict[str, Any]]:
    from subagents.store import list_descendants

    return [row for row in render.descendant_rows(list_descendants(store, root_id)) if row.get("mode") == "continuable"]


async def _drain(config: DeploymentConfig, root: str, wait_s: float) -> dict[str, Any]:
    """Durable drain requests to the supervisors hosting ROOT's continuable descendants; then wait
    until each reads complete, asking again for any that began to be hosted since."""
    import anyio

    from ..service import Supervisor

    async with Supervisor.open(store=config.store.path, config=_control_config(config)) as sup:
        asked: list[str] = []
        here: list[str] = []
        failed: dict[str, str] = {}  # the last reach's word on each child it could not drain

        async def reach() -> None:
            reached = await sup.continuation.drain_remote(root)
            asked.extend(c for c in reached.asked if c not in asked)
            here.extend(c for c in reached.here if c not in here)
            failed.clear()
            failed.update(reached.failed)

        await reach()
        settled = False
        rows: list[dict[str, Any]] = []
        with anyio.move_on_after(wait_s):
            while True:
                rows = await anyio.to_thread.run_sync(_continuable_rows, sup.store, root)
                waiting = {r["id"] for r in rows if r["status"] != "complete"}
                if not waiting:
                    settled = True
                    break
                if waiting - set(asked):
                    await reach()
                await anyio.sleep(CONTROL_POLL_S)
        # a host that died while asked leaves its children unhosted, their queued messages in place: drained here
        await reach()
        rows = await anyio.to_thread.run_sync(_continuable_rows, sup.store, root)
    return {"root": root, "drained": asked, "drained_here": here, "settled": settled, "children": rows,
            "failed": [{"id": child, "problem": problem} for child, problem in failed.items()]}
