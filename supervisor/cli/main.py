"""The entry point and the CLI's error boundary.

Exit codes: 0 success; 1 the command ran but found a failure (a run, or a
turn ``send`` hosted, that did not complete; a corrupt session in ``fsck``);
2 an error (``error: <CODE>: <message>`` on stderr; ``TIMEOUT`` when ``send``
or ``drain`` waited past ``--wait-s``); 130 interrupted. Listings take
``--json`` and then print exactly one JSON document (``log --follow --json``
prints one compact document per event, JSON Lines; ``top --json`` without
``--once`` one list per refresh).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Sequence, TypeVar

from subagents.store.errors import SubagentError

from ..config_loader import load_config
from . import control, demo, listing, maintenance
from .invocation import Invocation
from .log_format import setup_logging
from .parser import new_parser
from .render import Output

__all__ = ["main", "build_parser"]

_E = TypeVar("_E", bound=BaseException)


def build_parser() -> argparse.ArgumentParser:
    """Every verb, group by group (the order of ``subagents --help``)."""
    parser, verbs = new_parser()
    for group in (demo, listing, control, maintenance):
        group.register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_json)
    if not hasattr(args, "func"):
        getattr(args, "usage", parser).print_help(sys.stderr)
        return 2
    try:
        loaded = load_config(args.config)
        config = loaded.config.with_store(args.store) if args.store else loaded.config
        sources = tuple(loaded.sources) + (("--store",) if args.store else ())
        out = Output(json_mode=getattr(args, "json", False))
        return int(args.func(Invocation(args, config, out, sources)) or 0)
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
