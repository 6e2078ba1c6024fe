"""The verbs that start workers and run turns: ``demo`` and ``run``.

Both open a ``Supervisor`` (creating the store when absent), open a new
root, start one-shot children under it and wait for their results; ``demo``
then runs a continuable ``reviewer`` child through a report and two
follow-ups, so a first-time user sees both modes. Exit code 1 when a child
did not complete.

The supervisor's runtime (the service, the event loop, the programs) is
imported by the functions that run it, not here: every command line builds
the parser these verbs register with, ``subagents ls`` as well.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import UsageError
from . import render
from .invocation import Invocation
from .stopping import StopSignals
from .parser import Verbs, non_negative, positive, text_or_stdin, utf8_text

if TYPE_CHECKING:
    from ..config_loader import DeploymentConfig
    from ..models import Provider
    from ..service import Supervisor

__all__ = ["register", "QUICK_CHILDREN", "QUICK_CPU_MS"]

log = logging.getLogger("subagents.cli")

QUICK_CHILDREN, QUICK_CPU_MS = 3, 100


def register(verbs: Verbs) -> None:
    demo = verbs.add("demo", cmd_demo, "run N CPU-bound one-shot children in parallel and show the result",
                     example="subagents demo --quick\nsubagents --store /tmp/st demo --children 16 --cpu-ms 200")
    demo.add_argument("--children", type=positive, default=None, help="how many children (default 8)")
    demo.add_argument("--cpu-ms", type=non_negative, default=None,
                      help="each child's work, as ms of one free core of this host (a fixed number of iterations; default 400)")
    demo.add_argument("--quick", action="store_true", help=f"{QUICK_CHILDREN} children × {QUICK_CPU_MS} ms")
    demo.add_argument("--pool", choices=("local", "ray"), default=None, help="where children run (default: the configured pool)")
    demo.add_argument(
        "--ray-address", default=None,
        help="with --pool ray: join this cluster (host:port, ray://...); without it the demo starts a simulated "
             "cluster of two one-CPU nodes on this host, in a private network (needs root)",
    )

    run = verbs.add("run", cmd_run, "run one one-shot child of PROGRAM under a new root",
                    example='subagents run echo --prompt "hello"\nsubagents run myprog:hello   # myprog.py in the working folder')
    run.add_argument("program", metavar="PROGRAM", help='a built-in program (echo, script, llm) or "package.module:function"')
    run.add_argument("--prompt", type=utf8_text, default="", help="the child's message ('-' reads stdin)")
    run.add_argument("--label", type=utf8_text, default=None, help="the child's label")


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


def cmd_demo(inv: Invocation) -> int:
    from subagents.store import list_children, list_descendants, read_header, read_identity, short_ids

    args = inv.args
    children = args.children or (QUICK_CHILDREN if args.quick else 8)
    cpu_ms = args.cpu_ms if args.cpu_ms is not None else (QUICK_CPU_MS if args.quick else 400)
    config = inv.config
    pool = args.pool or config.supervisor.pool
    if args.ray_address is not None and pool != "ray":  # ignored, the demo ran on this host's pool
        raise UsageError(f'--ray-address joins a Ray cluster, and the pool is "{pool}": add --pool ray')
    store = inv.open_store(create=True, write=True)
    if pool == "ray":
        ray = config.supervisor.ray
        if args.ray_address is not None:
            ray = ray.model_copy(update={"address": args.ray_address})
        config = config.model_copy(update={"supervisor": config.supervisor.model_copy(update={"pool": "ray", "ray": ray})})
    if pool == "ray" and args.ray_address is None:
        doc = _on_simulated_cluster(config, children, cpu_ms, inv.out, inv.stop)
    else:
        doc = inv.stop.host(_demo, config, children, cpu_ms, inv.out)
    for result in doc["results"]:
        header = read_header(store, result["id"])
        result["turn_ms"] = read_identity(store, result["id"], header.seed_length or 0).projection.timing.settled_ms
    doc["busy_s"] = sum(r["turn_ms"] for r in doc["results"]) / 1000.0
    doc["speedup"] = doc["work_s"] / doc["wall_s"] if doc["wall_s"] > 0 else 0.0
    doc["listing"] = render.entry_rows(list_children(store, doc["root"]))
    doc["tree"] = render.descendant_rows(list_descendants(store, doc["root"]))
    doc["label"] = read_header(store, doc["root"]).label
    shorts = short_ids(store, [doc["root"], *(row["id"] for row in doc["tree"])])
    inv.emit(doc, lambda out, shown: render.render_demo(out, shown, shorts))
    return 0 if all(r["stop_reason"] == "completed" for r in doc["results"]) else 1


def _on_simulated_cluster(config: DeploymentConfig, children: int, cpu_ms: int, out: render.Output, stop: StopSignals) -> dict[str, Any]:
    """The demo on a Ray cluster of this host: a head (the store's host) and two one-CPU nodes, loopback only."""
    from .. import netns
    from ..errors import RayUnavailableError
    from ..ray_cluster import SimulatedCluster

    if not netns.available():
        raise RayUnavailableError("a simulated cluster runs in a private network namespace, which needs root: run as root, or join a cluster with --ray-address")
    if not out.json_mode:
        out.line("starting a simulated Ray cluster: a head (the store's host) and 2 one-CPU nodes, in a private network ...")
    cluster = SimulatedCluster(nodes=2, store_resource=config.supervisor.ray.store_resource)
    cluster.start(namespace=config.supervisor.ray.namespace)
    try:
        assert cluster.network is not None
        supervisor = config.supervisor.model_copy(update={"pool_size": 2})
        with cluster.network.entered():
            return stop.host(_demo, config.model_copy(update={"supervisor": supervisor}), children, cpu_ms, out)
    finally:
        cluster.stop()


async def _demo(config: DeploymentConfig, children: int, cpu_ms: int, out: render.Output) -> dict[str, Any]:
    import anyio

    from subagents.worker.programs.script import iterations_per_ms

    from ..models import Capabilities, Provider, SubagentRequest
    from ..service import Supervisor

    results: list[dict[str, Any]] = []
    async with Supervisor.open(store=config.store.path, config=config.supervisor) as sup:
        _register_providers(sup, config, Provider(name="analyst", program="script", capabilities=Capabilities.all()))
        root = await sup.open_root(label="demo")
        if not out.json_mode:
            out.line(f"demo root {root.id}: {children} children × {cpu_ms} ms of CPU, pool of {config.supervisor.pool_size} workers")
        # a fixed amount of work per child, sized here: a child that burned CPU *for* a time took that time
        # however many workers shared its core, and the speedup measured the clock (1.9x on one CPU)
        iterations = round(iterations_per_ms() * cpu_ms)
        pids = sup.pool.worker_pids()
        cpu_before = _worker_cpu_s(pids)
        started = time.perf_counter()

        with render.DemoProgress(out, children) as progress:

            async def finish(run: Any, label: str) -> None:
                try:
                    result = await run.result()
                finally:
                    await run.dispose()
                elapsed = time.perf_counter() - started
                worker = run.worker
                results.append({"id": run.id, "label": label, "stop_reason": result.stop_reason, "output": result.output,
                                "diagnostic": result.diagnostic, "elapsed_s": elapsed,
                                "worker": None if worker is None else {"host": worker.host, "pid": worker.pid}})
                progress.finished(run.id, label, result.stop_reason, elapsed)

            # each result is read (and timed) as it comes, while the next children are still being started
            async with anyio.create_task_group() as tg:
                for i in range(1, children + 1):
                    script = {"script": [{"cpu_iters": iterations}, {"return": f"part {i} of {children}: analysed with {cpu_ms} ms of CPU"}]}
                    request = SubagentRequest(parent=root, prompt=json.dumps(script), label=f"part-{i}")
                    tg.start_soon(finish, await sup.start("analyst", request), f"part-{i}")
        wall = time.perf_counter() - started
        cpu_after = _worker_cpu_s(pids)
        conversation = await _demo_conversation(sup, root, results, out)
    if cpu_before is not None and cpu_after is not None:
        cpu, source = cpu_after - cpu_before, "measured on the worker processes"
    else:
        cpu, source = children * cpu_ms / 1000.0, "requested by the children"
    results.sort(key=lambda r: r["id"])
    return {
        "root": root.id, "children": children, "cpu_ms": cpu_ms, "pool_size": config.supervisor.pool_size, "pool": config.supervisor.pool,
        "wall_s": wall, "work_s": children * cpu_ms / 1000.0, "iterations": iterations,
        "cpu_s": cpu, "cpu_source": source, "results": results, "conversation": conversation,
    }


async def _demo_conversation(sup: Supervisor, root: Any, results: list[dict[str, Any]], out: render.Output) -> list[dict[str, Any]]:
    """The continuable half of the demo: a reviewer child that reports, gets follow-ups, and settles.

    Every message the root receives (the report, each settlement notice) is durable in
    the root's mailbox; ``take_messages`` consumes them into the root's log.
    """
    from ..models import Capabilities, ContinuableSpec, Provider

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


def cmd_run(inv: Invocation) -> int:
    from subagents.store import IdGenerator
    from subagents.store.descriptor import OneShotDescriptor
    from subagents.store.events import widest_event
    from subagents.store.framing import encode_record
    from subagents.worker.programs import load_program

    from ..validation import check_label_fits

    args = inv.args
    load_program(args.program)  # PROGRAM_LOAD_FAILED before the store, a root or a child is written
    prompt = text_or_stdin(args.prompt)  # USAGE for input that is not UTF-8, before the store is made
    store = inv.open_store(create=True, write=True)
    # RECORD_TOO_LARGE before the root is made: the child's creation refuses it only after
    encode_record(widest_event("message/accepted", {"message_id": IdGenerator().new(), "source": {"kind": "user"}, "content": prompt}),
                  limit=store.max_record_bytes, what='a "message/accepted" event')
    check_label_fits(OneShotDescriptor(provider="run", label=args.label), store.max_record_bytes)  # LABEL_TOO_LARGE, as well
    doc = inv.stop.host(_run, inv.config, args.program, prompt, args.label)
    inv.emit(doc, render.render_run)
    return 0 if doc["stop_reason"] == "completed" else 1


async def _run(config: DeploymentConfig, program: str, prompt: str, label: str | None) -> dict[str, Any]:
    from ..models import Capabilities, Provider, SubagentRequest
    from ..service import Supervisor

    async with Supervisor.open(store=config.store.path, config=config.supervisor) as sup:
        _register_providers(sup, config, Provider(name="run", program=program, capabilities=Capabilities.all()))
        root = await sup.open_root(label="run")
        run = await sup.start("run", SubagentRequest(parent=root, prompt=prompt, label=label))
        try:
            result = await run.result()
        finally:
            await run.dispose()
    return {"root": root.id, "id": run.id, **result.model_dump()}
