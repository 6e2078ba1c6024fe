"""Read-only views of a store: ``ls``, ``tree``, ``show``, ``log`` and ``top``.

Each verb calls one read-only view of ``subagents.store`` (the catalog,
``list_roots``, ``describe_session``, ``inspect`` / ``LogTail``,
``held_sessions``), shapes the result into plain data (what ``--json``
prints) and hands it to ``render``. None of them writes a byte, starts a
supervisor or creates a store.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any, Callable

from subagents.store import (
    ContinuableDescriptor,
    LogTail,
    OneShotDescriptor,
    describe_session,
    held_sessions,
    inspect,
    list_children,
    list_descendants,
    list_roots,
)

from . import render
from .invocation import Invocation
from .parser import Verbs, positive_float
from .top_view import TopView, render_top

__all__ = ["register", "FOLLOW_POLL_S", "TOP_INTERVAL_S"]

FOLLOW_POLL_S = 0.2  # `log --follow`: a human watching; cheap enough (one stat per poll)
TOP_INTERVAL_S = 1.0  # `top`: one lease read per session per refresh


def _stop_on_ctrl_c() -> None:
    """Ctrl-C ends the endless views even when this process was started with SIGINT ignored
    (a shell's ``trap '' INT``, a background job): Python then installs no handler of its own."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def register(verbs: Verbs) -> None:
    ls = verbs.add("ls", cmd_ls, "list a parent's direct subagents (no PARENT: the top-level sessions)",
                   example="subagents ls\nsubagents ls 01M8MVY0PZ9RKY15DPNHER70WX --json")
    ls.add_argument("parent", metavar="PARENT", nargs="?", help="the session whose direct subagents to list (omit it for the top-level sessions)")

    tree = verbs.add("tree", cmd_tree, "every subagent below ROOT (no ROOT: below every top-level session)",
                     example="subagents tree 01M8MVY0PZ9RKY15DPNHER70WX")
    tree.add_argument("root", metavar="ROOT", nargs="?", help="the session whose descendants to show (omit it for every top-level session)")

    show = verbs.add("show", cmd_show, "one session: header, identity, status, lease, timing, log",
                     example="subagents show 01M8MVY0PZ9RKY15DPNHER70WX --json")
    show.add_argument("id", metavar="ID", help="a session id, as `ls`, `tree` or `run` print it")

    log_cmd = verbs.add("log", cmd_log, "the events of a session",
                        example="subagents log 01M8MVY0PZ9RKY15DPNHER70WX --follow")
    log_cmd.add_argument("id", metavar="ID", help="a session id, as `ls`, `tree` or `run` print it")
    log_cmd.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted")

    top = verbs.add("top", cmd_top, "running and idle sessions across processes (live on a terminal)",
                    example="subagents top\nsubagents top --once --json")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--interval", type=positive_float, default=TOP_INTERVAL_S, metavar="S",
                     help=f"seconds between refreshes (default {TOP_INTERVAL_S:g})")


def cmd_ls(inv: Invocation) -> int:
    store = inv.open_store()
    if inv.args.parent is not None:
        inv.session(store, inv.args.parent)  # an unknown parent is SESSION_NOT_FOUND, not an empty listing
    if inv.args.parent is None:
        inv.emit([dataclasses.asdict(r) for r in list_roots(store)], render.render_roots)
        return 0
    inv.emit(render.entry_rows(list_children(store, inv.args.parent)), render.render_listing)
    return 0


def cmd_tree(inv: Invocation) -> int:
    store = inv.open_store()
    root = inv.args.root
    if root is not None:
        inv.session(store, root)
        rows = render.descendant_rows(list_descendants(store, root))
        inv.emit(rows, lambda out, _: render.render_tree(out, [{"root": root, "descendants": rows}]))
        return 0
    forest = [{"root": r.id, "descendants": render.descendant_rows(list_descendants(store, r.id))} for r in list_roots(store)]
    inv.emit(forest, render.render_tree)
    return 0


def cmd_show(inv: Invocation) -> int:
    store = inv.open_store()
    inv.session(store, inv.args.id)
    found = describe_session(store, inv.args.id)
    header, projection, log = found.inspection.header, found.projection, found.inspection
    ident = projection.identity
    descriptor = ident.model_dump(mode="json", exclude_none=True) if isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)) else None
    mailbox = {"accepted": found.mailbox.accepted, "pending": found.mailbox.pending}
    if found.mailbox.problem:
        mailbox["problem"] = found.mailbox.problem
    doc = {
        "header": header.model_dump(mode="json"),
        "descriptor": descriptor,
        "identity": "descriptor" if descriptor else (ident or "none (not a subagent)"),
        "status": found.status,
        "lease": dataclasses.asdict(found.lease) if found.lease is not None else None,
        "owner": {**dataclasses.asdict(found.owner), "alive": found.owner_alive} if found.owner is not None else None,
        "timing": dataclasses.asdict(projection.timing),
        "turns": projection.turns,
        "last_stop_reason": projection.last_stop_reason,
        "open_turn": projection.open_turn,
        "events": len(log.events),
        "log": {"status": log.status, "size": log.size, "valid_bytes": log.end,
                "damage": dataclasses.asdict(log.damage) if log.damage else None},
        "mailbox": mailbox,
        "children": found.children,
    }
    inv.emit(doc, render.render_show)
    return 0


def cmd_log(inv: Invocation) -> int:
    store, out = inv.open_store(), inv.out
    inv.session(store, inv.args.id)
    found = inspect(store, inv.args.id)
    doc = {"session": inv.args.id, "log_status": found.status,
           "damage": dataclasses.asdict(found.damage) if found.damage else None, "events": found.events}
    if not inv.args.follow:
        inv.emit(doc, render.render_log)
        return 0
    _stop_on_ctrl_c()
    emit: Callable[[dict[str, Any]], None] = (lambda e: out.json(e, compact=True)) if out.json_mode else (lambda e: out.line(render.event_line(e)))
    tail = LogTail(store, inv.args.id, found)
    try:  # from the first line printed: a Ctrl-C right after it still ends with 0
        for event in found.events:
            emit(event)
        while True:
            time.sleep(FOLLOW_POLL_S)
            for event in tail.poll():
                emit(event)
    except KeyboardInterrupt:
        return 0


def cmd_top(inv: Invocation) -> int:
    store = inv.open_store()

    def snapshot() -> list[dict[str, Any]]:
        return [dataclasses.asdict(row) for row in held_sessions(store)]

    if inv.args.once:
        inv.emit(snapshot(), render_top)
        return 0
    _stop_on_ctrl_c()
    try:
        with TopView(inv.out) as view:
            while True:
                view.update(snapshot(), time.time())
                time.sleep(inv.args.interval)
    except KeyboardInterrupt:
        return 0
