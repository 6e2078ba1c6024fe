"""The ``subagents`` command line: a demo, one-off runs, control of children, views of a store.

Owns argument parsing, configuration layering for the process (through
``config_loader``), logging setup and exit codes; every byte on stdout goes
through ``cli_render``. Listings (and ``top``) read the store directly (no
supervisor, no worker): they never write a byte. ``demo``, ``run`` and the
control commands (``send``, ``interrupt``, ``drain``) open a ``Supervisor``;
a control command reaches a child hosted by another process through the
store (its durable mailbox or control file), never by signalling it. Only
those and ``store fsck --repair`` and ``store reindex`` write.

Exit codes: 0 success; 1 the command ran but found a failure (a run, or a
turn ``send`` hosted, that did not complete; a corrupt session in ``fsck``);
2 an error (``error: <CODE>: <message>`` on stderr; ``TIMEOUT`` when ``send``
or ``drain`` waited past ``--wait-s``); 130 interrupted. Listings take ``--json`` and then
print exactly one JSON document (``log --follow --json`` prints one compact
document per event, JSON Lines; ``top --json`` without ``--once`` one list per
refresh).

Over ~500 lines because the control commands (``send`` to ``top``) live here
for now; they would read better in a module of their own, leaving this one the
parsing and the read-only views (``store fsck`` already moved to ``store/fsck.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from typing import Any, Callable, Sequence, TypeVar

import anyio

from subagents.store import (
    ContinuableDescriptor,
    OneShotDescriptor,
    OwnerCache,
    Projection,
    Store,
    inspect,
    list_children,
    list_descendants,
    owner_alive,
    pending,
    read_mailbox,
    read_children,
    read_header,
    read_identity,
    read_lease,
    read_owner,
    read_projection,
    reindex,
    scan,
    session_status,
)
from subagents.store.errors import CorruptSessionError, SubagentError
from subagents.store.fsck import fsck

from subagents.worker.logcontext import FieldsFilter

from . import cli_render as render
from .errors import WaitTimeoutError
from .config import SupervisorConfig
from .config_loader import DeploymentConfig, dump_toml, env_variables, load_config
from .models import Capabilities, ContinuableSpec, Provider, SubagentRequest, UserAuthority
from .service import Supervisor

__all__ = ["main", "build_parser"]

log = logging.getLogger("subagents.cli")

FOLLOW_POLL_S = 0.2  # `log --follow`: a human watching; cheap enough (one stat per poll)
QUICK_CHILDREN, QUICK_CPU_MS = 3, 100
# `send` and `drain` wait on other processes through the store (a lease read per child per poll);
# `send` also wakes at once on its own child's end event, so this bounds only the cross-process case
CONTROL_POLL_S = 0.05
WAIT_S = 60.0  # how long `send` (a child it resumed) and `drain` wait for children to settle
TOP_INTERVAL_S = 1.0  # `top`: one lease read per session per refresh

_E = TypeVar("_E", bound=BaseException)


# -- entry point ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level, args.log_json)
    if not hasattr(args, "func"):
        getattr(args, "usage", parser).print_help(sys.stderr)
        return 2
    try:
        loaded = load_config(args.config)
        config = loaded.config.with_store(args.store) if args.store else loaded.config
        sources = loaded.sources + (("--store",) if args.store else ())
        out = render.Output(json_mode=getattr(args, "json", False))
        return int(args.func(args, config, out, sources) or 0)
    except BaseException as exc:  # the CLI's boundary: every failure becomes an exit code
        if _find(exc, KeyboardInterrupt) is not None:
            print("interrupted", file=sys.stderr)
            return 130
        error = _find(exc, SubagentError)
        if error is not None:
            print(f"error: {error.code}: {error.message}", file=sys.stderr)
            return 2
        if not isinstance(exc, Exception):
            raise  # SystemExit and friends keep their meaning
        traceback.print_exception(exc, file=sys.stderr)
        print(f"error: INTERNAL: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _find(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` itself or the first ``kind`` inside it (anyio task groups wrap errors in groups)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


_LOG_FIELDS = ("child", "parent", "epoch", "session")


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={getattr(record, k)}" for k in _LOG_FIELDS if hasattr(record, k))
        return f"{text} [{fields}]" if fields else text


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": record.created, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key in _LOG_FIELDS:  # the structured fields the library attaches (``extra=``)
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def _setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if as_json else _TextFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(FieldsFilter())  # child/parent/epoch of the task that logs (worker/logcontext.py)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(int(level) if level.isdigit() else getattr(logging, level.upper()))


# -- parser -----------------------------------------------------------------------------


def _log_level(value: str) -> str:
    if value.isdigit() or value.upper() in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not a logging level")


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The global options, accepted before and after the command name."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument("--store", default=default(None), help="the store folder (default: from the config, ./.subagents)")
    parser.add_argument("--config", default=default(None), help="a deployment TOML file (default: $SUBAGENTS_CONFIG)")
    parser.add_argument("--log-level", type=_log_level, default=default("WARNING"), help="DEBUG, INFO, WARNING (default), ERROR")
    parser.add_argument("--log-json", action="store_true", default=default(False), help="log JSON lines to stderr")


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return number


def build_parser() -> argparse.ArgumentParser:
    variables = "\n".join(f"  {name:<32} {what}" for name, what in env_variables().items())
    parser = argparse.ArgumentParser(
        prog="subagents",
        description="Child agents in worker processes over a durable, shared store.",
        epilog=f"environment (overrides the config files; unknown SUBAGENTS_* names are errors):\n{variables}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, top=False)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(group: Any, name: str, func: Callable[..., int], help: str, *, listing: bool = True) -> argparse.ArgumentParser:
        sub = group.add_parser(name, parents=[common], help=help, description=help)
        sub.set_defaults(func=func)
        if listing:
            sub.add_argument("--json", action="store_true", help="print one JSON document")
        return sub

    demo = command(commands, "demo", cmd_demo, "run N CPU-bound one-shot children in parallel and show the result")
    demo.add_argument("--children", type=_positive, default=None, help="how many children (default 8)")
    demo.add_argument("--cpu-ms", type=_non_negative, default=None, help="CPU each child burns, in ms (default 400)")
    demo.add_argument("--quick", action="store_true", help=f"{QUICK_CHILDREN} children × {QUICK_CPU_MS} ms")

    run = command(commands, "run", cmd_run, "run one one-shot child of PROGRAM under a new root")
    run.add_argument("program", metavar="PROGRAM", help='a built-in program (echo, script) or "package.module:function"')
    run.add_argument("--prompt", default="", help="the child's message ('-' reads stdin)")
    run.add_argument("--label", default=None, help="the child's label")

    ls = command(commands, "ls", cmd_ls, "list a parent's direct subagents (no PARENT: the top-level sessions)")
    ls.add_argument("parent", metavar="PARENT", nargs="?")

    tree = command(commands, "tree", cmd_tree, "every subagent below ROOT (no ROOT: below every top-level session)")
    tree.add_argument("root", metavar="ROOT", nargs="?")

    show = command(commands, "show", cmd_show, "one session: header, identity, status, lease, timing, log")
    show.add_argument("id", metavar="ID")

    log_cmd = command(commands, "log", cmd_log, "the events of a session")
    log_cmd.add_argument("id", metavar="ID")
    log_cmd.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted")

    send = command(commands, "send", cmd_send, "send CHILD its next turn as the host user (cold-resumes it when nobody hosts it)")
    send.add_argument("child", metavar="CHILD")
    send.add_argument("message", metavar="MESSAGE", help="the message ('-' reads stdin)")
    send.add_argument("--parent", required=True, metavar="ROOT", help="the root session CHILD belongs to (checked against its header)")
    send.add_argument("--wait-s", type=_positive_float, default=WAIT_S,
                      help=f"when CHILD was resumed here: how long to wait for it to settle (default {WAIT_S:.0f})")

    interrupt = command(commands, "interrupt", cmd_interrupt, "cancel CHILD's current turn (its queued messages and children are kept)",
                        listing=False)
    interrupt.add_argument("child", metavar="CHILD")
    interrupt.add_argument("--parent", required=True, metavar="ROOT", help="the root session CHILD belongs to")

    drain = command(commands, "drain", cmd_drain, "tear down every continuable descendant of ROOT, whichever process hosts it")
    drain.add_argument("root", metavar="ROOT")
    drain.add_argument("--wait-s", type=_positive_float, default=WAIT_S, help=f"how long to wait for them to settle (default {WAIT_S:.0f})")

    top = command(commands, "top", cmd_top, "running and idle sessions across processes (live on a terminal)")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--interval", type=_positive_float, default=TOP_INTERVAL_S, metavar="S",
                     help=f"seconds between refreshes (default {TOP_INTERVAL_S:g})")

    store_cmd = commands.add_parser("store", help="store maintenance (fsck, reindex)")
    store_cmd.set_defaults(usage=store_cmd)
    store_sub = store_cmd.add_subparsers(title="store commands", metavar="COMMAND")
    fsck = command(store_sub, "fsck", cmd_fsck, "check every session; report torn and corrupt logs")
    fsck.add_argument("--repair", action="store_true", help="truncate torn tails (never touches corrupt sessions)")
    command(store_sub, "reindex", cmd_reindex, "rebuild the children index from the headers")

    config_cmd = commands.add_parser("config", help="configuration")
    config_cmd.set_defaults(usage=config_cmd)
    config_sub = config_cmd.add_subparsers(title="config commands", metavar="COMMAND")
    command(config_sub, "show", cmd_config_show, "the effective configuration (default, file, environment, --store)")
    return parser


# -- helpers --------------------------------------------------------------------------------


def _emit(out: render.Output, doc: Any, text: Callable[[render.Output, Any], None]) -> None:
    """``doc`` as one JSON document under ``--json``, else its text rendering."""
    if out.json_mode:
        out.json(doc)
    else:
        text(out, doc)


def _open_store(config: DeploymentConfig) -> Store:
    """The configured store, which must exist: read commands never create one."""
    return Store(config.store.path, durability=config.supervisor.durability, create=False)


def _rows(entries: Sequence[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(e) for e in entries]


def _descendant_rows(store: Store, root_id: str) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(r.entry), "parent_id": r.parent_id, "depth": r.depth} for r in list_descendants(store, root_id)]


def _subagent_count(store: Store, session_id: str) -> int:
    """Direct subagent children per the index (cheap; the catalog re-checks headers)."""
    return sum(1 for e in read_children(store, session_id) if e.origin == "subagent")


def _roots(store: Store) -> list[dict[str, Any]]:
    """Top-level sessions (no ``parent_session``): one header read per session in the store."""
    owners = OwnerCache(store)
    roots = []
    for session_id in store.session_ids():
        try:
            header = read_header(store, session_id)
        except SubagentError:
            continue  # `store fsck` reports unreadable headers
        if header.parent_session is None:
            roots.append({
                "id": session_id,
                "label": header.label,
                "created_at": header.created_at,
                "status": session_status(store, session_id, owners),
                "children": _subagent_count(store, session_id),
            })
    return roots


def _register_providers(sup: Supervisor, config: DeploymentConfig, own: Provider) -> None:
    """The CLI's own provider, then the configured ones (a clash keeps the CLI's)."""
    sup.register_provider(own)
    for settings in config.providers:
        if settings.name == own.name:
            log.warning('configured provider "%s" is shadowed by the CLI\'s own', settings.name)
            continue
        sup.register_provider(settings.to_provider())


def _worker_cpu_s(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds of these processes (Linux ``/proc``), ``None`` if unreadable."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            return None
    return total / ticks


# -- demo, run ----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    children = args.children or (QUICK_CHILDREN if args.quick else 8)
    cpu_ms = args.cpu_ms if args.cpu_ms is not None else (QUICK_CPU_MS if args.quick else 400)
    doc = anyio.run(_demo, config, children, cpu_ms, out)
    store = _open_store(config)
    for result in doc["results"]:
        header = read_header(store, result["id"])
        result["turn_ms"] = read_identity(store, result["id"], header.seed_length or 0).projection.timing.settled_ms
    doc["busy_s"] = sum(r["turn_ms"] for r in doc["results"]) / 1000.0
    doc["speedup"] = doc["busy_s"] / doc["wall_s"] if doc["wall_s"] > 0 else 0.0
    doc["listing"] = _rows(list_children(store, doc["root"]))
    doc["tree"] = _descendant_rows(store, doc["root"])
    _emit(out, doc, render.render_demo)
    return 0 if all(r["stop_reason"] == "completed" for r in doc["results"]) else 1


async def _demo(config: DeploymentConfig, children: int, cpu_ms: int, out: render.Output) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    async with Supervisor.open(store=config.store.path, config=config.supervisor) as sup:
        _register_providers(sup, config, Provider(name="analyst", program="script", capabilities=Capabilities.all()))
        root = await sup.open_root(label="demo")
        if not out.json_mode:
            out.line(f"demo root {root.id}: {children} children × {cpu_ms} ms of CPU, pool of {config.supervisor.pool_size} workers")
        pids = sup.pool.worker_pids()
        cpu_before = _worker_cpu_s(pids)
        started = time.perf_counter()
        runs = []
        for i in range(1, children + 1):
            script = {"script": [{"cpu": cpu_ms}, {"return": f"part {i} of {children}: analysed with {cpu_ms} ms of CPU"}]}
            request = SubagentRequest(parent=root, prompt=json.dumps(script), label=f"part-{i}")
            runs.append((await sup.start("analyst", request), f"part-{i}"))

        with render.DemoProgress(out, children) as progress:

            async def finish(run: Any, label: str) -> None:
                try:
                    result = await run.result()
                finally:
                    await run.dispose()
                elapsed = time.perf_counter() - started
                results.append({"id": run.id, "label": label, "stop_reason": result.stop_reason, "output": result.output,
                                "diagnostic": result.diagnostic, "elapsed_s": elapsed})
                progress.finished(run.id, label, result.stop_reason, elapsed)

            async with anyio.create_task_group() as tg:
                for run, label in runs:
                    tg.start_soon(finish, run, label)
        wall = time.perf_counter() - started
        cpu_after = _worker_cpu_s(pids)
        conversation = await _demo_conversation(sup, root, results, out)
    if cpu_before is not None and cpu_after is not None:
        cpu, source = cpu_after - cpu_before, "measured on the worker processes"
    else:
        cpu, source = children * cpu_ms / 1000.0, "requested by the children"
    results.sort(key=lambda r: r["id"])
    return {
        "root": root.id, "children": children, "cpu_ms": cpu_ms, "pool_size": config.supervisor.pool_size,
        "wall_s": wall, "cpu_s": cpu, "cpu_source": source, "results": results, "conversation": conversation,
    }


async def _demo_conversation(sup: Supervisor, root: Any, results: list[dict[str, Any]], out: render.Output) -> list[dict[str, Any]]:
    """The continuable half of the demo: a reviewer child that reports, gets follow-ups, and settles.

    Every message the root receives (the report, each settlement notice) is durable in
    the root's mailbox; ``take_messages`` consumes them into the root's log.
    """
    sup.register_provider(Provider(name="reviewer", program="script", capabilities=Capabilities.all(), continuable=True))
    parts = "; ".join(r["output"] for r in sorted(results, key=lambda r: r["label"]))
    first = {"script": [{"cpu": 50}, {"report": f"reviewed {len(results)} parts so far", "delivery": "wakeup"},
                        {"return": f"first review done: {parts[:120]}"}]}
    spec = ContinuableSpec(parent=root, provider="reviewer", prompt=json.dumps(first), label="reviewer")
    child_id, _ = await sup.start_continuable(spec)
    if not out.json_mode:
        out.line(f"started continuable child {child_id} (reviewer)")
    received: list[dict[str, Any]] = []

    async def collect(until: int) -> None:
        while sum(1 for m in received if m["kind"] == "subagent-settled") < until:
            for message in await sup.wait_for_message(root, timeout_s=30):
                received.append({"kind": message.source.get("kind"), "content": message.content})
                if not out.json_mode:
                    text = " ".join(str(message.content).split())
                    out.line(f"  root received ({message.source.get('kind')}): {text if len(text) <= 160 else text[:159] + '…'}")

    await collect(1)
    for n, text in enumerate(["now compare part 1 with part 2", "and summarise everything in one line"], start=2):
        follow = {"script": [{"cpu": 30}, {"return": f"follow-up {n - 1} answered: {text}"}]}
        message_id = await sup.followup(root, child_id, json.dumps(follow))
        if not out.json_mode:
            out.line(f"followup {message_id} → {child_id}: {text}")
        await collect(n)
    return received


def cmd_run(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    doc = anyio.run(_run, config, args.program, prompt, args.label)
    _emit(out, doc, render.render_run)
    return 0 if doc["stop_reason"] == "completed" else 1


async def _run(config: DeploymentConfig, program: str, prompt: str, label: str | None) -> dict[str, Any]:
    async with Supervisor.open(store=config.store.path, config=config.supervisor) as sup:
        _register_providers(sup, config, Provider(name="run", program=program, capabilities=Capabilities.all()))
        root = await sup.open_root(label="run")
        run = await sup.start("run", SubagentRequest(parent=root, prompt=prompt, label=label))
        try:
            result = await run.result()
        finally:
            await run.dispose()
    return {"root": root.id, "id": run.id, **result.model_dump()}


# -- send, interrupt, drain: control of children hosted anywhere --------------------------------------


def _register_configured(sup: Supervisor, config: DeploymentConfig) -> None:
    """The configured providers: a child resumed here runs its descriptor's provider (or the built-in
    program of that name)."""
    for settings in config.providers:
        sup.register_provider(settings.to_provider())


def _control_config(config: DeploymentConfig) -> SupervisorConfig:
    """The supervisor config of a command that runs no turn (``interrupt``, ``drain``): one worker, the least the pool takes."""
    return config.supervisor.model_copy(update={"pool_size": 1})


def _settlement_notices(store: Store, root_id: str, child_id: str, since: float) -> list[dict[str, Any]]:
    """Settlement notices of ``child_id`` in its root's durable mailbox, accepted at or after ``since``."""
    return [
        {"id": m.id, "ts": m.ts, "summary": m.source.get("summary"), "content": m.content}
        for m in read_mailbox(store, root_id)
        if m.source.get("kind") == "subagent-settled" and m.source.get("sender_session_id") == child_id and m.ts >= since
    ]


def cmd_send(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    _open_store(config)  # a control command never creates a store
    message = sys.stdin.read() if args.message == "-" else args.message
    doc = anyio.run(_send, config, args.child, message, args.parent, args.wait_s, out)
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
    return 0 if doc["hosted"] == "elsewhere" or doc["stop_reason"] == "completed" else 1


async def _send(config: DeploymentConfig, child: str, message: str, parent: str, wait_s: float, out: render.Output) -> dict[str, Any]:
    """Send; when the child was resumed here, host it until it settles (closing earlier would cancel its turn)."""
    async with Supervisor.open(store=config.store.path, config=config.supervisor) as sup:
        _register_configured(sup, config)
        owner_id = sup.statistics().owner_id
        ends: list[str] = []  # stop reasons of the child's activations that ended here
        woken = [anyio.Event()]

        def on_end(name: str, payload: dict[str, Any]) -> None:
            if payload.get("id") == child:
                ends.append(str(payload.get("stop_reason")))
                woken[0].set()

        sup.on("subagent/end", on_end)
        message_id = await sup.send(child, message, parent=parent)
        accepted_at = next((m.ts for m in await anyio.to_thread.run_sync(read_mailbox, sup.store, child) if m.id == message_id), 0.0)
        lease = await anyio.to_thread.run_sync(read_lease, sup.store, child)
        doc: dict[str, Any] = {"message_id": message_id, "child": child, "parent": parent,
                               "hosted": "here" if lease is not None and lease.owner == owner_id else "elsewhere"}
        if doc["hosted"] == "elsewhere":
            return doc  # durable in its mailbox: the hosting supervisor runs it
        doc["epoch"] = lease.epoch if lease is not None else None
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
        notices = await anyio.to_thread.run_sync(_settlement_notices, sup.store, parent, child, accepted_at)
        doc.update(settled=settled, stop_reason=ends[0] if ends else None, notice=notices[0] if notices and settled else None)
    return doc


def cmd_interrupt(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    _open_store(config)
    anyio.run(_interrupt, config, args.child, args.parent)
    render.render_interrupt(out, {"child": args.child})
    return 0


async def _interrupt(config: DeploymentConfig, child: str, parent: str) -> None:
    async with Supervisor.open(store=config.store.path, config=_control_config(config)) as sup:
        await sup.interrupt(child, authority=UserAuthority(parent_session=parent))


def cmd_drain(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    read_header(_open_store(config), args.root)  # SESSION_NOT_FOUND before any supervisor starts
    doc = anyio.run(_drain, config, args.root, args.wait_s)
    _emit(out, doc, render.render_drain)
    if not doc["settled"]:
        left = [c["id"] for c in doc["children"] if c["status"] != "complete"]
        raise WaitTimeoutError(
            f"{len(left)} continuable descendants of {args.root} did not settle within {args.wait_s:g} s: {', '.join(left)}", root=args.root
        )
    return 0


def _continuable_rows(store: Store, root_id: str) -> list[dict[str, Any]]:
    return [row for row in _descendant_rows(store, root_id) if row.get("mode") == "continuable"]


async def _drain(config: DeploymentConfig, root: str, wait_s: float) -> dict[str, Any]:
    """Durable drain requests to the supervisors hosting ROOT's continuable descendants; then wait
    until each reads complete, asking again for any that began to be hosted since."""
    async with Supervisor.open(store=config.store.path, config=_control_config(config)) as sup:
        asked = list(await sup.drain_remote(root))
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
                    asked += [c for c in await sup.drain_remote(root) if c not in asked]
                await anyio.sleep(CONTROL_POLL_S)
        rows = await anyio.to_thread.run_sync(_continuable_rows, sup.store, root)
    return {"root": root, "drained": asked, "settled": settled, "children": rows}


# -- top ---------------------------------------------------------------------------------------------


def _top_rows(store: Store) -> list[dict[str, Any]]:
    """Every session a live owner holds (lease ``running`` or ``idle``): one lease read per session."""
    owners = OwnerCache(store)
    rows = []
    for session_id in store.session_ids():
        lease = read_lease(store, session_id)
        if lease is None or lease.state == "released" or not owners.alive(lease.owner):
            continue
        status = session_status(store, session_id, owners)
        if status == "complete":
            continue  # released between the two reads
        try:
            header = read_header(store, session_id)
            # the cached checkpoint plus the log after it: exact mid-turn (an open turn's start is
            # after the last commit point, where the catalog's identity cache stops)
            projection = read_projection(store, session_id)
        except (SubagentError, OSError):
            continue  # `store fsck` reports what does not read
        ident = projection.identity
        descriptor = ident if isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)) else None
        owner = read_owner(store, lease.owner)
        timing = projection.timing
        rows.append({
            "id": session_id,
            "label": descriptor.label if descriptor is not None else None,
            "mode": descriptor.mode if descriptor is not None else ("root" if header.parent_session is None else "-"),
            "parent": header.parent_session,
            "status": status,
            "epoch": lease.epoch,
            "owner": lease.owner,
            "owner_pid": owner.pid if owner is not None else None,
            "owner_host": owner.host if owner is not None else None,
            "settled_ms": timing.settled_ms,
            "active_since": timing.active_since,
        })
    return rows


def cmd_top(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    if args.once:
        _emit(out, _top_rows(store), render.render_top)
        return 0
    try:
        with render.TopView(out) as view:
            while True:
                view.update(_top_rows(store), time.time())
                time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


# -- listings -------------------------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    if args.parent is None:
        roots = _roots(store)
        _emit(out, roots, render.render_roots)
        return 0
    rows = _rows(list_children(store, args.parent))
    _emit(out, rows, render.render_listing)
    return 0


def cmd_tree(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    if args.root is not None:
        rows = _descendant_rows(store, args.root)
        _emit(out, rows, lambda o, _: render.render_tree(o, [{"root": args.root, "descendants": rows}]))
        return 0
    forest = [{"root": r["id"], "descendants": _descendant_rows(store, r["id"])} for r in _roots(store)]
    _emit(out, forest, render.render_tree)
    return 0


def cmd_show(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    found = inspect(store, args.id)
    projection = Projection(seed_length=found.header.seed_length or 0)
    projection.fold(found.events, found.offsets, found.end)
    ident = projection.identity
    descriptor = ident.model_dump(mode="json", exclude_none=True) if isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)) else None
    lease = read_lease(store, args.id)
    owner = read_owner(store, lease.owner) if lease is not None else None
    doc = {
        "header": found.header.model_dump(mode="json"),
        "descriptor": descriptor,
        "identity": "descriptor" if descriptor else (ident or "none (not a subagent)"),
        "status": session_status(store, args.id),
        "lease": dataclasses.asdict(lease) if lease is not None else None,
        "owner": {**dataclasses.asdict(owner), "alive": owner_alive(owner)} if owner is not None else None,
        "timing": dataclasses.asdict(projection.timing),
        "turns": projection.turns,
        "last_stop_reason": projection.last_stop_reason,
        "open_turn": projection.open_turn,
        "events": len(found.events),
        "log": {"status": found.status, "size": found.size, "valid_bytes": found.end,
                "damage": dataclasses.asdict(found.damage) if found.damage else None},
        "mailbox": _mailbox(store, args.id, projection),
        "children": _subagent_count(store, args.id),
    }
    _emit(out, doc, render.render_show)
    return 0


def _mailbox(store: Store, session_id: str, projection: Projection) -> dict[str, Any]:
    """Accepted messages, and how many no turn has taken yet (``None`` when log and mailbox disagree)."""
    messages = read_mailbox(store, session_id)
    if not messages:
        return {"accepted": 0, "pending": 0}  # a one-shot child's message is logged at creation, never mailed
    try:
        waiting: int | None = len(pending(store, session_id, consumed=projection.consumed, last_consumed_id=projection.last_message_id))
        problem = None
    except CorruptSessionError as exc:
        waiting, problem = None, exc.message
    return {"accepted": len(messages), "pending": waiting, **({"problem": problem} if problem else {})}


def cmd_log(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    found = inspect(store, args.id)
    doc = {"session": args.id, "log_status": found.status,
           "damage": dataclasses.asdict(found.damage) if found.damage else None, "events": found.events}
    if not args.follow:
        _emit(out, doc, render.render_log)
        return 0
    emit: Callable[[dict[str, Any]], None] = (lambda e: out.json(e, compact=True)) if out.json_mode else (lambda e: out.line(render.event_line(e)))
    for event in found.events:
        emit(event)
    path, end, next_seq = store.path(args.id, "log"), found.end, len(found.events)
    try:
        while True:
            time.sleep(FOLLOW_POLL_S)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = 0
            if size < end:  # cut back under us (a repair): start over from what is valid now
                again = inspect(store, args.id)
                for event in again.events[next_seq:]:
                    emit(event)
                end, next_seq = again.end, len(again.events)
            elif size > end:
                with open(path, "rb") as handle:
                    handle.seek(end)
                    result = scan(handle.read(size - end), start_seq=next_seq, base_offset=end)
                for event in result.records:  # a damaged tail may be a write in flight: wait for it
                    emit(event)
                end, next_seq = result.end, next_seq + len(result.records)
    except KeyboardInterrupt:
        return 0


# -- store maintenance ---------------------------------------------------------------------------


def cmd_fsck(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    report = fsck(store, repair=args.repair, lease_ttl_s=config.supervisor.lease_ttl_s)  # store/fsck.py
    _emit(out, report, render.render_fsck)
    return 1 if report["counts"]["corrupt"] else 0


def cmd_reindex(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Any) -> int:
    store = _open_store(config)
    parents = reindex(store)
    doc = {"parents": parents, "children": sum(len(v) for v in parents.values())}
    _emit(out, doc, render.render_reindex)
    return 0


def cmd_config_show(args: argparse.Namespace, config: DeploymentConfig, out: render.Output, sources: Sequence[str]) -> int:
    if out.json_mode:
        out.json(config.model_dump(mode="json"))
    else:
        render.render_config(out, dump_toml(config), sources)
    return 0


if __name__ == "__main__":
    sys.exit(main())
