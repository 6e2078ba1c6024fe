"""Read-only views of a store: ``ls``, ``tree``, ``show``, ``log`` and ``top``.

Each verb calls one read-only view of ``subagents.store`` (the catalog,
``list_roots``, ``describe_session``, ``inspect`` / ``LogTail``,
``held_sessions``), shapes the result into plain data (what ``--json``
prints) and hands it to ``render``. None of them writes a byte, starts a
supervisor or creates a store. ``show`` of a session whose header or
committed log is damaged prints the diagnostic (``CORRUPT_SESSION``, where
and why) and exits 2, never a view of what still reads; ``log`` shows the
valid records and the damage.

Each verb imports the store's views where it reads them, not at the top:
every command line builds the parser these verbs register with, and
``subagents --help`` reads no store.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import time
from typing import TYPE_CHECKING, Any

from subagents.store.errors import SubagentError
from subagents.store.query_words import DEFAULT_ROOT_LIMIT

from . import columns, render
from .filters import add_filters, add_paging, query_of
from .invocation import Invocation
from .parser import Verbs, number_of
from .top_view import COLUMNS_HELP, TopView, render_top
from .whole_writes import whole_writer

if TYPE_CHECKING:
    from subagents.store import DescendantRow, DiagnosticEntry, Page, Query, RootEntry, Store
    from subagents.store.outcome import OutcomeVerdict
    from subagents.store.query import Matcher

__all__ = ["register", "FOLLOW_POLL_S", "TOP_INTERVAL_S"]

FOLLOW_POLL_S = 0.2  # `log --follow`: a human watching; cheap enough (one stat per poll)
TOP_INTERVAL_S = 1.0  # `top`: one lease read per session per refresh
TOP_INTERVALS_S = (0.05, 86400.0)  # `top --interval`: no faster than a human can read, no slower than a day


def _stop_on_ctrl_c() -> None:
    """Ctrl-C ends the endless views even when this process was started with SIGINT ignored
    (a shell's ``trap '' INT``, a background job): Python then installs no handler of its own."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def interval(value: str) -> float:
    """Seconds between ``top``'s refreshes, within ``TOP_INTERVALS_S``: ``time.sleep`` overflows on ``inf`` or
    ``1e300`` (after the first snapshot was drawn), and ``1e-300`` redraws in a busy loop."""
    number = number_of(value)
    low, high = TOP_INTERVALS_S
    if not low <= number <= high:
        raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g} seconds (a day), not {value!r}")
    return number


def register(verbs: Verbs) -> None:
    ls = verbs.add("ls", cmd_ls, "list a parent's direct subagents (no PARENT: the newest top-level sessions)",
                   example="subagents ls\nsubagents ls 01M8MVY0 --outcome error,crashed --since 1d\n"
                           "subagents ls --limit 50 --json   # then: --cursor <next_cursor>")
    ls.add_argument("parent", metavar="PARENT", nargs="?",
                    help="the session whose direct subagents to list, its id or a unique prefix (omit it for the top-level sessions)")
    add_filters(ls)
    add_paging(ls, unlimited=f"all of PARENT's; with no PARENT, the {DEFAULT_ROOT_LIMIT} newest")

    tree = verbs.add("tree", cmd_tree, "every subagent below ROOT (no ROOT: below each of the newest top-level sessions)",
                     example="subagents tree 01M8MVY0\nsubagents tree 01M8MVY0 --status running,idle\n"
                             "subagents tree --outcome error --limit 5 --json   # then: --cursor <next_cursor>")
    tree.description = (
        f"{tree.description}.\n\n"
        "With no ROOT, the top-level sessions are ordered and paged as `ls` pages them (by default newest first,\n"
        f"{DEFAULT_ROOT_LIMIT} unless --limit; --sort, --cursor), each with its tree. Filters pick subagents, never the session\n"
        "heading a tree: with ROOT, the ones below ROOT that match; with no ROOT, also only the top-level\n"
        "sessions with a match below them (pages count those).")
    tree.add_argument("root", metavar="ROOT", nargs="?",
                      help="the session whose descendants to show, its id or a unique prefix (omit it for the newest top-level sessions)")
    add_filters(tree)
    add_paging(tree, unlimited=f"all below ROOT; with no ROOT, the {DEFAULT_ROOT_LIMIT} newest trees")

    show = verbs.add("show", cmd_show, "one session: header, identity, status, lease, timing, log",
                     example="subagents show 01M8MVY0PZ9RKY15DPNHER70WX --json")
    show.add_argument("id", metavar="ID", help="a session id, as `ls`, `tree` or `run` print it, or a unique prefix of one")

    log_cmd = verbs.add("log", cmd_log, "the events of a session",
                        example="subagents log 01M8MVY0PZ9RKY15DPNHER70WX --follow")
    log_cmd.add_argument("id", metavar="ID", help="a session id, as `ls`, `tree` or `run` print it, or a unique prefix of one")
    log_cmd.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted (a one-shot child's, until its turn ends or its host is gone, which it prints as the child's outcome; a corrupt log's, until its damage, which it prints as `log` does)")
    log_cmd.add_argument("--full", action="store_true", help="print each event's data whole (default: one line of 96 characters; --json is never cut)")

    summary = verbs.add("summary", cmd_summary, "counts of subagents by status and outcome, and live per supervisor",
                        example="subagents summary\nsubagents summary 01M8MVY0 --json")
    summary.add_argument("root", metavar="ROOT", nargs="?", help="count below this root only, its id or a unique prefix (default: the whole store)")

    top = verbs.add("top", cmd_top, "running and idle sessions across processes (live on a terminal)",
                    example="subagents top\nsubagents top --once --json",
                    json_help="print JSON: one document with --once, else one compact list per refresh, a line each, until interrupted")
    top.epilog = COLUMNS_HELP + ("\n\n" + top.epilog if top.epilog else "")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--interval", type=interval, default=TOP_INTERVAL_S, metavar="S",
                     help=f"seconds between refreshes, {TOP_INTERVALS_S[0]:g} to {TOP_INTERVALS_S[1]:g} (a day) (default {TOP_INTERVAL_S:g})")
    add_filters(top, times=False, statuses=("running", "idle"))


def _ids_in(rows: list[dict[str, Any]], *extra: str) -> list[str]:
    return [*extra, *(r["id"] for r in rows)]


def _paged(args: Any) -> bool:
    """Whether ``ls PARENT`` and ``tree`` print a page (an object with ``next_cursor``) rather than a plain list."""
    return args.limit is not None or args.cursor is not None


def _root_page(store: Store, args: argparse.Namespace, query: Matcher | None) -> Page[RootEntry | DiagnosticEntry]:
    """The top-level sessions ``ls`` with no PARENT and ``tree`` with no ROOT show: one page, so that both
    order, cut and continue it alike (newest first by creation reads only the end of ``index/roots``)."""
    from subagents.store import find_roots

    return find_roots(store, query=query, sort=args.sort, newest_first=args.sort == "created",
                      limit=args.limit or DEFAULT_ROOT_LIMIT, cursor=args.cursor)


@dataclasses.dataclass
class _Subtrees:
    """The subagents a filter keeps below each top-level session, walked once: with a filter, ``tree`` with
    no ROOT shows a session only when one matches below it (as ``tree ROOT`` shows what matches below ROOT),
    so its page is cut from those sessions and then drawn from the same walks."""

    store: Store
    query: Query
    walked: dict[str, list[DescendantRow]] = dataclasses.field(default_factory=dict)

    def below(self, root_id: str) -> list[DescendantRow]:
        from subagents.store import list_descendants

        if root_id not in self.walked:
            self.walked[root_id] = list_descendants(self.store, root_id, self.query)
        return self.walked[root_id]

    def matches(self, row: RootEntry | DiagnosticEntry) -> bool:
        return bool(self.below(row.id))


def _more(out: Any, cursor: str | None, noun: str) -> None:
    if cursor is not None:
        out.line(f"(more {noun}: --cursor {cursor})")


def cmd_ls(inv: Invocation) -> int:
    from subagents.store import list_children, short_ids
    from subagents.store.query import paginate

    store, args = inv.open_store(), inv.args
    query = query_of(args)
    if args.parent is None:
        page = _root_page(store, args, query)
        roots = [dataclasses.asdict(r) for r in page.rows]
        if inv.out.json_mode:
            inv.out.json({"roots": roots, "next_cursor": page.next_cursor})
        else:
            render.render_roots(inv.out, roots, short_ids(store, _ids_in(roots)))
            _more(inv.out, page.next_cursor, "sessions")
        return 0
    parent = inv.parent(store, args.parent)  # an unknown parent is SESSION_NOT_FOUND, not an empty listing
    listed = paginate(list_children(store, parent, query), sort=args.sort, limit=args.limit, cursor=args.cursor)
    rows = render.entry_rows(listed.rows)
    if inv.out.json_mode:
        inv.out.json({"rows": rows, "next_cursor": listed.next_cursor} if _paged(args) else rows)
    else:
        render.render_listing(inv.out, rows, short_ids(store, _ids_in(rows)))
        _more(inv.out, listed.next_cursor, "subagents")
    return 0


def cmd_tree(inv: Invocation) -> int:
    from subagents.store import DiagnosticEntry, list_descendants, short_ids
    from subagents.store.query import paginate

    store, args = inv.open_store(), inv.args
    query = query_of(args)
    if args.root is not None:
        root = inv.parent(store, args.root)
        found = list_descendants(store, root, query)
        if _paged(args):  # a page keeps pre-order: rows are cut, never reordered
            listed = paginate([r.entry for r in found], limit=args.limit, cursor=args.cursor, sort=args.sort)
            kept = {e.id for e in listed.rows}
            found, cursor = [r for r in found if r.entry.id in kept], listed.next_cursor
        else:
            cursor = None
        rows = render.descendant_rows(found)
        if inv.out.json_mode:
            inv.out.json({"rows": rows, "next_cursor": cursor} if _paged(args) else rows)
        else:
            head = _subtree_head(store, root)
            ids = _ids_in(rows, root, *([head["parent"]] if head.get("parent") else []))
            render.render_tree(inv.out, [{**head, "descendants": rows}], short_ids(store, ids))
            _more(inv.out, cursor, "subagents")
        return 0
    subtrees = _Subtrees(store, query)
    page = _root_page(store, args, None if query.empty else subtrees)
    # a root whose files do not read heads its tree as the diagnostic `ls` lists; its children still read
    forest = [{"root": r.id, "label": getattr(r, "label", None),
               **({"kind": r.kind, "reason": r.reason} if isinstance(r, DiagnosticEntry) else {}),
               "descendants": render.descendant_rows(subtrees.below(r.id))} for r in page.rows]
    if inv.out.json_mode:  # always a page, as `ls` with no PARENT prints it: 20 by default, so the cursor says there is more
        inv.out.json({"rows": forest, "next_cursor": page.next_cursor})
    else:
        ids = [i for tree in forest for i in _ids_in(tree["descendants"], tree["root"])]
        render.render_tree(inv.out, forest, short_ids(store, ids))
        _more(inv.out, page.next_cursor, "sessions")
    return 0


def _subtree_head(store: Any, session_id: str) -> dict[str, Any]:
    """What heads ``tree ID``: a root with its label, as ``tree`` alone heads it, or a subagent with its
    parent and the label its parent's listing shows (a child's own header holds none). A session with a
    parent and no ``origin`` is a plain fork, which no listing lists: headed as one (``fork``), not as the
    subagent it is not. A header that does not read (already warned about) heads it as the diagnostic
    ``ls`` would list."""
    from subagents.store import list_children, read_header
    from subagents.store.catalog import damage_reason

    try:
        header = read_header(store, session_id)
    except SubagentError as exc:
        return {"root": session_id, "kind": "diagnostic", "reason": damage_reason(exc, session_id)}
    parent = header.parent_session
    if parent is None:
        return {"root": session_id, "label": header.label}
    if header.origin != "subagent":
        return {"root": session_id, "parent": parent, "fork": True, "label": header.label}
    row = next((e for e in list_children(store, parent) if e.id == session_id), None)
    return {"root": session_id, "parent": parent, "label": getattr(row, "label", None)}


def cmd_show(inv: Invocation) -> int:
    from subagents.store import ContinuableDescriptor, OneShotDescriptor, describe_session
    from subagents.store.reader import committed_damage

    store = inv.open_store()
    session_id = inv.session(store, inv.args.id).id
    found = describe_session(store, session_id)
    header, projection, log = found.inspection.header, found.projection, found.inspection
    if log.status == "corrupt" and log.damage is not None:
        # the records before the damage would show as a session of their own (a crashed turn, an
        # outcome it never had): the diagnostic instead, as a damaged header gives; `log` lists them
        raise committed_damage(session_id, log.damage)
    ident = projection.identity
    descriptor = ident.model_dump(mode="json", exclude_none=True) if isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)) else None
    mailbox = {"accepted": found.mailbox.accepted, "pending": found.mailbox.pending}
    lease_problem = {"lease_problem": found.lease_problem} if found.lease_problem else {}
    if found.mailbox.problem:
        mailbox["problem"] = found.mailbox.problem
    doc = {
        "header": header.model_dump(mode="json"),
        "descriptor": descriptor,
        "identity": "descriptor" if descriptor else (ident or "none (not a subagent)"),
        "status": found.status,
        "lease": dataclasses.asdict(found.lease) if found.lease is not None else None,
        **lease_problem,  # only when the lease does not read: "lease": null is then no "never leased"
        "owner": {**dataclasses.asdict(found.owner), "alive": found.owner_alive} if found.owner is not None else None,
        "timing": dataclasses.asdict(projection.timing),
        "turns": projection.turns,
        "last_stop_reason": projection.last_stop_reason,
        "open_turn": projection.open_turn,
        "node": found.node,
        "events": len(log.events),
        "log": {"status": log.status, "size": log.size, "valid_bytes": log.end,
                "damage": dataclasses.asdict(log.damage) if log.damage else None},
        "mailbox": mailbox,
        "children": found.children,
        "outcome": found.outcome.outcome,
        "error_code": found.outcome.error_code,
        "error": found.outcome.error,
        "result": _closing_message(log.events),
        "failure": projection.last_diagnostic if found.outcome.outcome not in (None, "completed") else None,
    }
    inv.emit(doc, render.render_show)
    return 0


def _closing_message(events: list[dict[str, Any]]) -> Any:
    """The session's result: the last non-empty ``assistant/message`` (its text, or its data when it has no text)
    of the last finished turn. An open turn's messages are no result (a crashed one-shot child's "starting" was
    shown as its result), and nor is anything after the last ``turn/end``, or before the one ahead of it: a last
    turn that failed before it said anything has no result, not an earlier turn's."""
    ends = [i for i, event in enumerate(events) if event.get("type") == "turn/end"]
    if not ends:
        return None
    for event in reversed(events[ends[-2] + 1 if len(ends) > 1 else 0:ends[-1]]):
        if event.get("type") == "assistant/message":
            data = event.get("data")
            text = data.get("text") if isinstance(data, dict) else data
            if text:
                return text
    return None


def cmd_summary(inv: Invocation) -> int:
    from subagents.store import summarize

    store = inv.open_store()
    root = inv.parent(store, inv.args.root) if inv.args.root is not None else None
    inv.emit(dataclasses.asdict(summarize(store, root)), render.render_summary)
    return 0


def cmd_log(inv: Invocation) -> int:
    from subagents.store import LogTail, inspect
    from subagents.store.committed import CommittedEnds
    from subagents.store.log import read_projection
    from subagents.store.outcome import outcome_of

    store, out = inv.open_store(), inv.out
    header = inv.session(store, inv.args.id)
    session_id = header.id
    found = CommittedEnds(store).apply(inspect(store, session_id))  # a settled child's damaged last record is no torn tail
    doc = {"session": session_id, "log_status": found.status,
           "damage": dataclasses.asdict(found.damage) if found.damage else None, "events": found.events}
    if not inv.args.follow:
        inv.emit(doc, lambda o, d: render.render_log(o, d, full=inv.args.full, top_level=header.parent_session is None))
        return 0
    full = inv.args.full
    write = whole_writer(out.stream)  # a stop signal never cuts a line: a `--json` consumer parses every one

    def emit(event: dict[str, Any]) -> None:
        write((render.to_json(columns.iso_moments(event), compact=True) if out.json_mode else render.event_line(event, full=full)) + "\n")

    _stop_on_ctrl_c()
    tail = LogTail(store, session_id, found)
    ended = _OneShotEnd()

    def drain() -> None:
        for event in tail.poll():
            emit(event)
            ended.see(event)

    abandoned: OutcomeVerdict | None = None
    try:  # from the first line printed: a Ctrl-C right after it still ends with 0
        if not found.events and found.status == "clean" and not out.json_mode:
            write(render.no_events_line(session_id, top_level=header.parent_session is None) + "\n")
        for event in found.events:
            emit(event)
            ended.see(event)
        while not ended.ended and tail.damage is None:
            time.sleep(FOLLOW_POLL_S)
            drain()
            if ended.one_shot and not ended.ended and tail.damage is None and not _may_grow(store, session_id):
                drain()  # what its last holder wrote before it let go (a turn/end, then the release)
                if not ended.ended and tail.damage is None:
                    abandoned = outcome_of(read_projection(store, session_id), held=False)
                    break
        if tail.damage is not None:  # committed damage: nothing past it ever reads, so waiting would be silent for good
            damaged = {"session": session_id, "log_status": "corrupt", "damage": dataclasses.asdict(tail.damage)}
            if out.json_mode:
                out.json(damaged, compact=True)
            else:
                out.line(render.damage_line(damaged))
        elif abandoned is not None:  # a one-shot child nobody holds is never resumed: its log ends here
            closing = {"session": session_id, "outcome": abandoned.outcome, "error": abandoned.error}
            if out.json_mode:
                out.json(closing, compact=True)
            else:
                out.line(f"({abandoned.outcome}: {abandoned.error})" if abandoned.error else f"({abandoned.outcome})")
    except KeyboardInterrupt:
        pass
    return 0  # as plain `log` on the same damage: the records that read were shown, and where they stop


def _may_grow(store: Store, session_id: str) -> bool:
    """Whether a live owner may still write the session: its lease is held by one, or does not read
    (unknown, so the follow goes on, as for any session it cannot prove abandoned)."""
    from subagents.store.lease import OwnerCache, check_lease

    try:
        lease = check_lease(store, session_id)
    except SubagentError:
        return True
    return OwnerCache(store).holds(lease)


class _OneShotEnd:
    """Whether a log can grow any more, as ``log --follow`` reads it: a one-shot child's ends with its
    one turn (``turn/end``, or ``message/discarded`` when it never began), and following it ends there,
    as ``kubectl logs -f`` ends with its container. The session's own descriptor is its last one: a
    fork child's log begins with its ancestor's turns."""

    def __init__(self) -> None:
        self._one_shot = False
        self._turn_over = False

    @property
    def ended(self) -> bool:
        return self._one_shot and self._turn_over

    @property
    def one_shot(self) -> bool:
        return self._one_shot

    def see(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "subagent/descriptor":
            data = event.get("data")
            self._one_shot = isinstance(data, dict) and data.get("mode") == "one-shot"
            self._turn_over = False
        elif kind in ("turn/end", "message/discarded"):
            self._turn_over = True


def cmd_top(inv: Invocation) -> int:
    from subagents.store import held_sessions, short_ids

    store = inv.open_store()

    query = query_of(inv.args)

    def snapshot() -> list[dict[str, Any]]:
        return [dataclasses.asdict(row) for row in held_sessions(store) if query.matches(row)]

    def shorts(rows: list[dict[str, Any]]) -> dict[str, str]:
        return {} if inv.out.json_mode else short_ids(store, [*_ids_in(rows), *(r["parent"] for r in rows if r.get("parent"))])

    if inv.args.once:
        rows = snapshot()
        if inv.out.json_mode:
            inv.out.json(rows)
        else:
            render_top(inv.out, rows, shorts(rows))
        return 0
    _stop_on_ctrl_c()
    try:
        with TopView(inv.out) as view:
            while True:
                rows = snapshot()
                view.update(rows, time.time(), shorts(rows))
                time.sleep(inv.args.interval)
    except KeyboardInterrupt:
        return 0
