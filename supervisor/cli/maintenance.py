"""Store maintenance and setup: ``gc``, ``store fsck``, ``store check``, ``store reindex``, ``store migrate``,
``config show``, ``completion``.

``gc`` is ``store/retention.py``: it deletes old, settled top-level subtrees
(``--dry-run`` only lists them); a bad age or outcome is ``INVALID_QUERY``
before anything is read.

``fsck`` is ``store/fsck.py`` (read-only unless ``--repair``, which only cuts
torn tails); ``check`` is ``store/check.py`` (read-only, every invariant, safe
while supervisors write; exit 1 on a violation); ``reindex`` rebuilds the derived children index from the
headers, leaving out (and naming) children whose creation never returned (``--keep-unacknowledged`` keeps them); ``migrate`` converts a store of format version 1, 2 or 3 in place (``store/migrate.py``;
it opens no ``Store``: the handle refuses that version); ``config show`` prints the layered configuration and never opens
the store; ``completion`` prints a shell's completion code (argcomplete).
"""

from __future__ import annotations

from subagents.store import InvalidQueryError

from . import render
from .invocation import Invocation
from .parser import Verbs

__all__ = ["register", "SHELLS"]

SHELLS = ("bash", "zsh", "fish", "tcsh")


def register(verbs: Verbs) -> None:
    gc = verbs.add("gc", cmd_gc, "delete top-level sessions and their subtrees that have been settled longer than an age",
                   example="subagents gc --older-than 7d --dry-run\nsubagents gc --older-than 12h --json")
    gc.add_argument("--older-than", required=True, metavar="AGE",
                    help="keep everything active within AGE: 30s, 15m, 12h, 7d, 2w (last activity, not creation)")
    gc.add_argument("--outcome", action="append", metavar="O[,O]",
                    help="only roots with these outcomes (repeatable; the values of `ls --outcome`): a root's own turns, not its "
                         "children's, so a root that `run`, `demo` or `open_root` made, which runs none, is `none`")
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted; change nothing")

    store = verbs.group("store", "store maintenance (fsck, check, reindex, migrate)",
                         example="subagents store check\nsubagents store fsck --repair")
    fsck_cmd = store.add("fsck", cmd_fsck, "check every session; report torn and corrupt logs",
                         example="subagents store fsck\nsubagents store fsck --repair")
    fsck_cmd.add_argument("--repair", action="store_true", help="truncate torn tails (never touches corrupt sessions)")
    store.add("check", cmd_check, "check every invariant of the store (read-only; safe while it is written)",
              example="subagents store check --json")
    reindex_cmd = store.add("reindex", cmd_reindex, "rebuild the children index and the roots index from the headers",
                            example="subagents store reindex\nsubagents store reindex --keep-unacknowledged")
    reindex_cmd.add_argument("--keep-unacknowledged", action="store_true",
                             help="also list children whose creation was interrupted before their index entry and that were "
                                  "never used (by default they are left out: nobody was given their id)")
    store.add("migrate", cmd_migrate, "convert a store of format version 1, 2 or 3 to version 4 in place (stop its supervisors first)",
              example="subagents store migrate\nsubagents --store ./old-store store migrate --json")

    completion = verbs.add("completion", cmd_completion, "print the shell code that completes subagents' verbs and options",
                           json=False, reads_config=False, example='eval "$(subagents completion bash)"   # in ~/.bashrc\n'
                                                "subagents completion fish > ~/.config/fish/completions/subagents.fish")
    completion.add_argument("shell", metavar="SHELL", choices=SHELLS,
                            help=f"the shell to complete in: {', '.join(SHELLS)} (tcsh's code calls `python-argcomplete-tcsh`, "
                                 "which pip's argcomplete does not install: it comes with the system's argcomplete package)")

    config = verbs.group("config", "configuration", example="subagents config show --json")
    config.add("show", cmd_config_show, "the effective configuration (default, file, environment, --store)",
               example="subagents config show\nSUBAGENTS_POOL_SIZE=4 subagents --config deploy.toml config show --json")


# Each verb imports what it runs (the whole-store check, gc, fsck, migration, the configuration's models, completion)
# where it runs it: every command line builds the parser these verbs register with, ``subagents ls`` as well.


def cmd_gc(inv: Invocation) -> int:
    """Exit 0 whenever it ran: a subtree kept for a reason (held, mail, ...) is policy, not a failure."""
    from subagents.store import OUTCOMES, collect, parse_age

    from .gc_view import gc_doc, render_gc

    try:
        age = parse_age(inv.args.older_than)
    except InvalidQueryError as exc:
        raise InvalidQueryError(f"--older-than: {exc.message}") from None
    outcomes = [w.strip() for text in inv.args.outcome or () for w in text.split(",") if w.strip()]
    allowed = (*OUTCOMES, "none")
    if inv.args.outcome and (not outcomes or set(outcomes) - set(allowed)):
        raise InvalidQueryError(f"--outcome is one of {', '.join(allowed)} (comma-separated), not {', '.join(inv.args.outcome)!r}")
    store = inv.open_store(write=not inv.args.dry_run)
    report = collect(store, age, outcomes=outcomes, dry_run=inv.args.dry_run)
    inv.emit(gc_doc(report), render_gc)
    return 0


def cmd_completion(inv: Invocation) -> int:
    """The shell code argcomplete generates for the ``subagents`` command (it calls back into this CLI)."""
    import argcomplete

    inv.out.stream.write(argcomplete.shellcode(["subagents"], shell=inv.args.shell))
    inv.out.stream.flush()
    return 0


def cmd_fsck(inv: Invocation) -> int:
    from subagents.store.fsck import fsck

    report = fsck(inv.open_store(write=inv.args.repair), repair=inv.args.repair, lease_ttl_s=inv.config.supervisor.lease_ttl_s)
    inv.emit(report, render.render_fsck)
    # a lease that does not read is a damaged session too: nobody can tell whether it is held; a session
    # whose parent is gone, or whose parents loop, is one no listing shows, and no reindex brings back
    unreadable = any(f["kind"] in ("lease-unreadable", "parent-missing", "parent-cycle") for f in report["findings"])
    return 1 if report["counts"]["corrupt"] or report["damaged_mailboxes"] or unreadable else 0


def cmd_check(inv: Invocation) -> int:
    from subagents.store import check_store

    report = check_store(inv.open_store())
    inv.emit(report.to_dict(), render.render_check)
    return 0 if report.clean else 1


def cmd_reindex(inv: Invocation) -> int:
    from subagents.store import rebuild_roots, reindex

    store = inv.open_store(write=True)
    report = reindex(store, keep_unacknowledged=inv.args.keep_unacknowledged)
    roots = rebuild_roots(store)
    inv.emit({**report.to_dict(), "roots": len(roots)}, render.render_reindex)
    return 0


def cmd_migrate(inv: Invocation) -> int:
    from subagents.store.migrate import migrate

    report = migrate(inv.config.store.path, durability=inv.config.supervisor.durability)
    inv.emit(report.to_dict(), render.render_migrate)
    return 0


def _value_sources(inv: Invocation) -> dict[str, str]:
    """Where every value of the effective configuration came from, by dotted key ("default" when no layer set it)."""
    supervisor = inv.config.supervisor
    keys = ["store.path", *(f"supervisor.{k}" for k in supervisor.model_dump(exclude={"ray"})),
            *(f"ray.{k}" for k in supervisor.ray.model_dump()), "providers"]
    return {key: inv.origins.get(key, "default") for key in keys}


def cmd_config_show(inv: Invocation) -> int:
    from ..config_loader import dump_toml, llm_settings
    from .config_view import render_config

    sources = _value_sources(inv)
    llm, llm_sources = llm_settings(inv.llm)
    if inv.out.json_mode:
        inv.out.json({**inv.config.model_dump(mode="json"), "llm": llm,
                      "sources": {**sources, **{f"llm.{key}": source for key, source in llm_sources.items()}}})
    else:
        render_config(inv.out, dump_toml(inv.config), inv.sources, sources, (llm, llm_sources))
    return 0
