"""How the ``subagents`` CLI prints: plain text, one JSON document, or rich on a terminal.

Owns every byte the CLI writes to stdout (``top``'s table lives in
``top_view``). Verbs (``listing``, ``control``, ...) build plain data (dicts
and lists, the same that ``--json`` prints) and hand it to one ``render_*``
function here. Plain text is the stable form (scripts
and tests read it; listings are the aligned tables of ``columns``); rich
tables, trees and progress bars are used only when stdout is a terminal and
``--json`` is off, and ``rich`` is imported only then. Just over 500 lines:
one renderer per verb's output, kept in one file because it is every byte
the CLI prints.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TextIO

from subagents.worker.listing import render_rows

from . import columns, node_state

if TYPE_CHECKING:
    from subagents.store.catalog import ChildEntry, DescendantRow, DiagnosticEntry

__all__ = [
    "Output",
    "entry_rows",
    "descendant_rows",
    "to_json",
    "fmt_time",
    "summarize",
    "render_listing",
    "render_roots",
    "render_tree",
    "render_show",
    "event_line",
    "render_log",
    "no_events_line",
    "damage_line",
    "render_fsck",
    "render_check",
    "render_reindex",
    "render_migrate",
    "render_run",
    "DemoProgress",
    "render_demo",
    "render_sent",
    "render_settled",
    "render_interrupt",
    "render_drain",
    "status_style",
]

SUMMARY_WIDTH = 96  # one event per terminal line in `log`


class Output:
    """stdout, and whether it gets rich renderings (a terminal, not ``--json``)."""

    def __init__(self, stream: TextIO | None = None, *, json_mode: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.json_mode = json_mode
        self.rich = not json_mode and self.stream.isatty()
        self._console: Any = None

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stream)
        return self._console

    def line(self, text: str = "") -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def json(self, doc: Any, *, compact: bool = False) -> None:
        self.line(to_json(columns.iso_moments(doc), compact=compact))


def entry_rows(entries: Sequence[ChildEntry | DiagnosticEntry]) -> list[dict[str, Any]]:
    """Catalog entries as the plain rows ``ls`` prints."""
    return [dataclasses.asdict(e) for e in entries]


def descendant_rows(rows: Sequence[DescendantRow]) -> list[dict[str, Any]]:
    """A root's descendants as flat rows: the entry plus ``parent_id`` and ``depth``."""
    return [{**dataclasses.asdict(r.entry), "parent_id": r.parent_id, "depth": r.depth} for r in rows]


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def to_json(doc: Any, *, compact: bool = False) -> str:
    if compact:
        return json.dumps(doc, default=_json_default, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(doc, default=_json_default, ensure_ascii=False, indent=2)


def fmt_time(ts: float | None, *, date: bool = True) -> str:
    """Local time with milliseconds. A record's time only has to be finite: one the platform's
    clock cannot convert (``1e20``: a record no writer made) is printed as the number it is."""
    if ts is None:
        return "-"
    try:
        local = time.localtime(ts)
    except (OverflowError, OSError, ValueError):
        return f"{ts:g}"
    millis = int((ts % 1) * 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S", local) + f".{millis:03d}"


def summarize(data: Any, width: int = SUMMARY_WIDTH) -> str:
    text = to_json(data, compact=True) if not isinstance(data, str) else data
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


# -- ls -------------------------------------------------------------------------


def status_style(status: str) -> str:
    return {"running": "bold green", "idle": "yellow", "complete": "dim"}.get(status, "")


def render_listing(out: Output, rows: Sequence[dict[str, Any]], shorts: Mapping[str, str] | None = None) -> None:
    """Direct children: an aligned table (``columns.children_table``), the status coloured on a terminal."""
    _print_lines(out, columns.children_table(rows, shorts or {}, time.time()))


def render_roots(out: Output, roots: Sequence[dict[str, Any]], shorts: Mapping[str, str] | None = None) -> None:
    """Top-level sessions: an aligned table (``columns.roots_table``)."""
    _print_lines(out, columns.roots_table(roots, shorts or {}, time.time()))


def _print_lines(out: Output, lines: list[str]) -> None:
    if not out.rich:
        for line in lines:
            out.line(line)
        return
    from rich.markup import escape

    for i, line in enumerate(lines):
        text = escape(line)
        if i == 0 and len(lines) > 1:
            text = f"[bold]{text}[/bold]"
        out.console.print(text, soft_wrap=True, highlight=False)


# -- tree -----------------------------------------------------------------------


def render_tree(out: Output, forest: Sequence[dict[str, Any]], shorts: Mapping[str, str] | None = None) -> None:
    """Each ``{"root", "descendants"}`` as an indented tree (two spaces a level), one ``columns.tree_line`` a row,
    under a heading naming the top session ``(root)``, else ``(subagent of PARENT)`` (``fork``: ``(fork of PARENT)``)."""
    if not forest:
        out.line("(no sessions)")
        return
    names = shorts or {}
    for tree in forest:
        rows = tree["descendants"]
        label = f" — {columns.visible(tree['label'])}" if tree.get("label") else ""
        damage = f" [diagnostic: {tree['reason']}]" if tree.get("kind") == "diagnostic" else ""
        parent = tree.get("parent")
        role = f"({'fork' if tree.get('fork') else 'subagent'} of {names.get(parent, parent)})" if parent else "(root)"
        lines = [f"{names.get(tree['root'], tree['root'])} {role}{damage}{label}"]
        lines += columns.tree_lines(rows, tree["root"], names)
        if not rows:
            lines.append("  (no subagents)")
        if out.rich:
            from rich.markup import escape

            for line in lines:
                out.console.print(escape(line), soft_wrap=True, highlight=False)
        else:
            for line in lines:
                out.line(line)


# -- show -----------------------------------------------------------------------


def render_show(out: Output, doc: dict[str, Any]) -> None:
    header = doc["header"]
    descriptor = doc["descriptor"]
    lease = doc["lease"]
    log = doc["log"]
    timing = doc["timing"]
    fields: list[tuple[str, str]] = [
        ("session", header["id"]),
        ("created", fmt_time(header["created_at"])),
        ("parent", header.get("parent_session") or "(none: top-level)"),
        ("origin", header.get("origin") or "-"),
        ("depth", str(header.get("delegation_depth", 0))),
    ]
    if header.get("seed_length") is not None:
        fields.append(("seed", f"{header['seed_length']} events"))
    if header.get("cwd"):
        fields.append(("cwd", header["cwd"]))
    if descriptor is not None:
        fields += [("mode", descriptor["mode"]), ("provider", columns.visible(descriptor.get("provider") or "-")),
                   ("label", columns.visible(descriptor.get("label") or "-"))]
        for key in ("agent_provider", "agent_model", "persona"):
            if descriptor.get(key):
                fields.append((key.replace("_", " "), columns.visible(str(descriptor[key]))))
    else:
        if header.get("label"):
            fields.append(("label", columns.visible(header["label"])))  # a root's: in its header (a child's is in its identity)
        fields.append(("identity", doc["identity"]))
    fields.append(("status", doc["status"] or "unknown: its lease does not read"))
    if lease is None:
        fields.append(("lease", f"unreadable ({doc['lease_problem']})" if doc.get("lease_problem") else "(none)"))
    else:
        owner = doc["owner"]
        liveness = "" if lease["state"] == "released" else (" (alive)" if owner and owner["alive"] else " (dead or gone)")
        fields.append(("lease", f"epoch {lease['epoch']}, {lease['state']}, owner {lease['owner']}{liveness}, since {fmt_time(lease['acquired_at'])}"))
    active = f", active since {fmt_time(timing['active_since'], date=False)}" if timing.get("active_since") else ""
    fields.append(("timing", f"{timing['settled_ms']:.0f} ms settled{active}"))
    turns = f"{doc['turns']} turn{'s' if doc['turns'] != 1 else ''}"
    if doc.get("last_stop_reason"):
        turns += f", last stop reason: {doc['last_stop_reason']}"
    if doc.get("open_turn") is not None:
        turns += f", turn open since seq {doc['open_turn']}"
    fields.append(("turns", turns))
    damage = log.get("damage")
    where = f": {damage['reason']} at byte {damage['offset']} ({damage['dropped']} bytes)" if damage else ""
    fields.append(("log", f"{doc['events']} events, {log['status']}{where}, {log['size']} bytes"))
    mailbox = doc["mailbox"]
    accepted, waiting = ("?" if mailbox[key] is None else mailbox[key] for key in ("accepted", "pending"))
    fields.append(("mailbox", f"{accepted} accepted, {waiting} pending" + (f" ({mailbox['problem']})" if mailbox.get("problem") else "")))
    fields.append(("children", str(doc["children"])))
    outcome = doc.get("outcome") or ("-" if doc["status"] == "complete" else "- (no turn finished yet)")
    fields.insert(next(i for i, (k, _) in enumerate(fields) if k == "status") + 1, ("outcome", outcome))
    if doc.get("node"):  # where the open turn runs: worker host:pid, or Ray node ip/id:pid
        fields.insert(next(i for i, (k, _) in enumerate(fields) if k == "outcome") + 1, ("node", node_state.node_text(doc["node"], long=True)))
    if doc.get("failure"):
        fields.append(("failure", doc["failure"]))
    if doc.get("result") is not None:
        result = doc["result"] if isinstance(doc["result"], str) else to_json(doc["result"])
        fields.append(("result", result))
    if out.rich:
        from rich.markup import escape
        from rich.table import Table

        table = Table(box=None, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in fields:
            table.add_row(key, escape(value))
        out.console.print(table)
        return
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        out.line(f"{key.ljust(width)}  {value}")


# -- summary --------------------------------------------------------------------


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def render_summary(out: Output, doc: dict[str, Any]) -> None:
    scope = f"below {doc['root']}" if doc["root"] else f"below {doc['roots']} top-level session{'s' if doc['roots'] != 1 else ''}"
    out.line(f"{doc['subagents']} subagent{'s' if doc['subagents'] != 1 else ''} {scope}")
    out.line(f"status    {_counts(doc['by_status'])}")
    out.line(f"outcome   {_counts(doc['by_outcome'])}")
    if doc["diagnostics"]:
        out.line(f"damaged   {_counts(doc['diagnostics'])}")
    if doc["root_diagnostics"]:
        out.line(f"damaged   top-level: {_counts(doc['root_diagnostics'])}")
    if not doc["supervisors"]:
        out.line("live      no supervisor holds any of them")
    for sup in doc["supervisors"]:
        where = f"pid {sup['pid']} on {sup['host']}" if sup["pid"] is not None else "pid unknown"
        out.line(f"live      {sup['owner']} ({where}): {sup['running']} running, {sup['idle']} idle")


# -- log ------------------------------------------------------------------------


def event_line(event: dict[str, Any], *, full: bool = False) -> str:
    """One event on one line, its data cut to ``SUMMARY_WIDTH``; ``full``: the data whole (newlines kept)."""
    data = event.get("data")
    shown = (data if isinstance(data, str) else to_json(data, compact=True)) if full else summarize(data)
    return f"{event['seq']:>5}  {fmt_time(event.get('ts'), date=False)}  {str(event.get('type')):<20}  {shown}"


def no_events_line(session_id: str, *, top_level: bool) -> str:
    """What ``log`` (and ``log --follow``, before it waits) prints of a log with no events: an empty screen
    reads as a hang or a bug, and a top-level session's work is in its children."""
    where = f": a top-level session's work is in its children (`subagents tree {session_id}`)" if top_level else ""
    return f"(no events{where})"


def render_log(out: Output, doc: dict[str, Any], *, full: bool = False, top_level: bool = False) -> None:
    for event in doc["events"]:
        out.line(event_line(event, full=full))
    if not doc["events"] and doc["log_status"] == "clean":  # say so: an empty screen reads as a hang or a bug
        out.line(no_events_line(doc["session"], top_level=top_level))
    if doc["log_status"] != "clean":
        out.line(damage_line(doc))


def damage_line(doc: dict[str, Any]) -> str:
    """Where a log that is not clean stops reading and why (``doc``: ``log_status`` and ``damage``, as
    ``log --json`` prints them): one line, the same for ``log`` and ``log --follow``."""
    damage = doc.get("damage") or {}
    return f"({doc['log_status']} log: {damage.get('reason')} at byte {damage.get('offset')}, {damage.get('dropped')} bytes after the valid prefix)"


# -- store ------------------------------------------------------------------------


def render_fsck(out: Output, report: dict[str, Any]) -> None:
    counts = report["counts"]
    out.line(
        f"checked {report['sessions']} sessions in {report['store']}: "
        + ", ".join(f"{counts[k]} {k}" for k in ("clean", "torn", "corrupt", "unsupported", "unreadable"))
    )
    for finding in report["findings"]:
        line = f"{finding['kind']:<15} {finding['id']}  {finding['detail']}"
        if finding.get("repair"):
            line += f"  → {finding['repair']}"
        out.line(line)
    if counts["corrupt"]:
        out.line("corrupt sessions are never repaired automatically: their committed work would be lost")
    if report["damaged_mailboxes"]:
        out.line(f"messages sent to {len(report['damaged_mailboxes'])} session(s) are refused until their mailbox holds what "
                 "their log consumed again (see each mailbox-damaged line)")
    if counts["unreadable"]:
        out.line("unreadable sessions were not checked: this process cannot read their files now (see each line)")


def render_check(out: Output, doc: dict[str, Any]) -> None:
    counts = doc["counts"]
    verdict = "clean" if doc["clean"] else f"{len(doc['violations'])} violation(s)"
    out.line(f"{doc['store']}: {verdict}; " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()))
    for v in doc["violations"]:
        at = f" seq {v['seq']}" if v["seq"] is not None else ""
        out.line(f"{v['kind']:<21} {v['session_id']}{at}  {v['evidence']}")


def render_reindex(out: Output, doc: dict[str, Any]) -> None:
    for parent, children in doc["parents"].items():
        out.line(f"{parent}: {len(children)} {'child' if len(children) == 1 else 'children'}")
    for key, what in (("put_back", "put back (absent from the index, but used)"),
                      ("kept_unacknowledged", "kept (never acknowledged: --keep-unacknowledged)"),
                      ("left_out", "left out (never acknowledged: a creation interrupted before its index entry, never used)")):
        for parent, children in doc.get(key, {}).items():
            for child in children:
                out.line(f"{child}: child of {parent}, {what}")
    out.line(f"reindexed {len(doc['parents'])} parents, {doc['children']} children, {doc.get('roots', 0)} roots")
    left_out = sum(len(v) for v in doc.get("left_out", {}).values())
    if left_out:
        out.line(f"{left_out} unacknowledged {'child' if left_out == 1 else 'children'} left out; "
                 "`subagents store reindex --keep-unacknowledged` lists them")


def render_migrate(out: Output, doc: dict[str, Any]) -> None:
    if doc["from_version"] == doc["to_version"]:
        out.line(f"already format version {doc['to_version']}: {doc['already']} sessions, nothing to convert")
        return
    if doc["from_version"] in (2, 3):  # every session and index file of those versions is one of the new version
        out.line(f"converted format version {doc['from_version']} to {doc['to_version']}: {doc['already']} sessions kept as they are, "
                 f"{doc['index_locks_removed']} index lock files removed")
        return
    extra = f", {doc['trash']} trash entries converted" if doc["trash"] else ""
    if doc["leases_rebuilt"]:
        extra += f", {doc['leases_rebuilt']} damaged leases rebuilt as released"
    out.line(f"converted to format version {doc['to_version']}: {doc['converted']} sessions converted, {doc['already']} already converted, "
             f"{doc['debris']} crashed creations removed{extra}{' (finished an interrupted run)' if doc['resumed'] else ''}")


# -- run, demo ---------------------------------------------------------------------------


def render_run(out: Output, doc: dict[str, Any]) -> None:
    if doc["output"]:
        out.line(doc["output"])
    out.line(f"stop reason: {doc['stop_reason']}" + (f" ({doc['diagnostic']})" if doc["diagnostic"] else ""))
    out.line(f"child: {doc['id']} (root {doc['root']})")


class DemoProgress:
    """A progress bar on a terminal, a line per finished child otherwise."""

    def __init__(self, out: Output, total: int) -> None:
        self.out = out
        self.total = total
        self.done = 0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> "DemoProgress":
        if self.out.rich:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("children"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self.out.console
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("children", total=self.total)
        return self

    def finished(self, child_id: str, label: str, stop_reason: str, elapsed_s: float) -> None:
        self.done += 1
        if self.out.json_mode:
            return
        if self._progress is not None:
            self._progress.advance(self._task)
            return
        self.out.line(f"[{self.done}/{self.total}] {child_id} {columns.visible(label)} {stop_reason} after {elapsed_s:.2f} s")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(kind, exc, tb)


def render_demo(out: Output, doc: dict[str, Any], shorts: Mapping[str, str] | None = None) -> None:
    """``shorts``: the ids as the commands it shows print them (their shortest unique prefixes)."""
    per = f"{doc['children']} children × {doc['cpu_ms']} ms of CPU on {doc['pool_size']} workers"
    out.line("")
    out.line(per)
    out.line(f"wall time        {doc['wall_s']:.2f} s")
    out.line(f"children's work  {doc['work_s']:.2f} s (what one free core needs for all of it: what one worker would take)")
    out.line(f"time in turns    {doc['busy_s']:.2f} s (the sum of their turns: more than their work when workers share a core)")
    out.line(f"CPU time         {doc['cpu_s']:.2f} s ({doc['cpu_source']})")
    out.line(f"speedup          {doc['speedup']:.2f}× (children's work / wall time)")
    if doc.get("pool") == "ray":
        out.line("")
        out.line("where each child ran (Ray node: address/id, worker pid):")
        for result in doc["results"]:
            worker = result.get("worker") or {}
            out.line(f"  {result['label']:<10} {worker.get('host', '-')}  pid {worker.get('pid', '-')}")
    out.line("")
    root = (shorts or {}).get(doc["root"], doc["root"])
    out.line(f"$ subagents ls {root}")
    render_listing(out, doc["listing"], shorts)
    out.line("")
    out.line(f"$ subagents tree {root}")
    render_tree(out, [{"root": doc["root"], "label": doc.get("label"), "descendants": doc["tree"]}], shorts)


# -- send, interrupt, drain ----------------------------------------------------------------


def render_sent(out: Output, doc: dict[str, Any]) -> None:
    """The durable message's id, alone on its line (scripts read it)."""
    out.line(doc["message_id"])


def render_settled(out: Output, doc: dict[str, Any]) -> None:
    """The settlement notice the root's mailbox received for a child this command hosted, and, when it
    did not complete, the ``stop reason: ... (diagnostic)`` line ``run`` prints."""
    notice = doc.get("notice")
    if notice is not None:
        out.line(notice["content"] if isinstance(notice["content"], str) else to_json(notice["content"]))
    elif doc.get("notice_problem"):  # the root never got it: the closing message from here, and why
        if doc.get("output"):
            out.line(doc["output"])
        out.line(f"not delivered to {doc['parent']}: {doc['notice_problem']}")
    elif doc.get("settled") and not doc.get("taken_over"):
        # settled here and no notice sent: the parent is a one-shot child, which takes no message (the notice
        # is dropped, as in the reference); the id alone would read the same as a turn that never ran
        if doc.get("output"):
            out.line(doc["output"])
        out.line(f"no settlement notice: its parent {doc['parent']} is a one-shot child, which takes no message")
    if doc.get("stop_reason") not in (None, "completed"):  # the notice says that it failed, not why
        out.line(f"stop reason: {doc['stop_reason']}" + (f" ({doc['diagnostic']})" if doc.get("diagnostic") else ""))
    for message in doc.get("also_delivered") or []:  # taken from the root's mailbox with the notice
        out.line(f"also delivered to {doc['parent']} ({message.get('kind') or 'message'} {message['id']}):")
        out.line(message["content"] if isinstance(message["content"], str) else to_json(message["content"]))


def render_interrupt(out: Output, doc: dict[str, Any]) -> None:
    """One line saying what ``interrupt`` did (an ``InterruptResult``): never success for a no-op."""
    child = doc["child_id"]
    turn = f"turn {doc['turn']}" if doc.get("turn") is not None else "the turn"
    message = f" (message {doc['message_id']})" if doc.get("message_id") else ""
    host = f" in supervisor {doc['host']}" + (f" (pid {doc['host_pid']})" if doc.get("host_pid") is not None else "") if doc.get("host") else ""
    if doc["outcome"] == "cancelled":
        before = " before a worker took it" if doc.get("turn") is None else ""
        out.line(f"cancelled {turn} of agent {child}{host}{message}{before}")
    elif doc["outcome"] == "requested":
        out.line(f"interrupt of {turn} of agent {child} delivered{host.replace(' in ', ' to ', 1)}{message}; {doc['detail']}")
    else:
        out.line(f"no turn running for agent {child}: {doc['detail']}")


def render_drain(out: Output, doc: dict[str, Any]) -> None:
    asked, here = doc["drained"], doc["drained_here"]
    for failure in doc["failed"]:
        out.line(f"could not drain {failure['id']}: {failure['problem']} (see `subagents store fsck`)")
    if asked:
        noun = "descendant" if len(asked) == 1 else "descendants"
        out.line(f"asked {len(asked)} continuable {noun} of {doc['root']} to drain: {', '.join(asked)}")
    if here:
        noun = "descendant" if len(here) == 1 else "descendants"
        out.line(f"drained {len(here)} continuable {noun} of {doc['root']} that no supervisor hosted, here: {', '.join(here)}")
    if not asked and not here and not doc["failed"]:
        out.line(f"nothing to drain below {doc['root']}: no continuable descendant of it is hosted or has messages waiting")
    rows = [{k: v for k, v in row.items() if k not in ("parent_id", "depth")} for row in doc["children"]]
    if rows:
        out.line(render_rows(rows))
