"""The entry point and the CLI's error boundary.

Exit codes: 0 success; 1 the command ran but found a failure (a run, or a
turn ``send`` hosted, that did not complete; a corrupt session in ``fsck``);
3 ``interrupt`` found no turn running (``control.EXIT_NO_TURN``);
2 an error: one line ``error: <CODE>: <message>`` on stderr (``USAGE`` for a
command line that does not parse; ``TIMEOUT`` when
``send`` or ``drain`` waited past ``--wait-s``; ``OS_ERROR`` for a failure of
the system outside the store; ``INTERNAL``, with a traceback, only for a bug);
130 interrupted; 141 stdout was closed (``subagents tree | head -1``), quietly,
as ``git log | head`` does. Listings take ``--json`` and then print exactly
one JSON document (``log --follow --json`` prints one compact document per
event, JSON Lines; ``top --json`` without ``--once`` one list per refresh).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import traceback
from typing import Sequence, TypeVar

from subagents.store.errors import SubagentError

from ..errors import UsageError
from . import control, demo, listing, maintenance
from .columns import visible
from .invocation import Invocation
from .log_format import setup_logging
from .parser import new_parser
from .render import Output
from .settings import Settings
from .stopping import StopSignals

__all__ = ["main", "build_parser"]

_E = TypeVar("_E", bound=BaseException)

log = logging.getLogger("subagents.cli")

MESSAGE_CHARS = 1000  # an error line stays readable whatever a message echoes back
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def build_parser() -> argparse.ArgumentParser:
    """Every verb, group by group (the order of ``subagents --help``)."""
    parser, verbs = new_parser()
    for group in (demo, listing, control, maintenance):
        group.register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _stdout_or_devnull()
    try:
        return _main(argv)
    except KeyboardInterrupt:  # while the parser is built or the arguments parsed, before the boundary below
        return _exit_code(KeyboardInterrupt(), None)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asks for completions (argcomplete's protocol): answered, and exits
        import argcomplete

        argcomplete.autocomplete(parser)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _error(exc.code, exc.message)
    setup_logging(args.log_level, args.log_json)
    if not hasattr(args, "func"):
        return _error(UsageError.code, args.verbs.no_verb())
    _import_from_here()
    store_path: str | None = None
    stop = StopSignals()
    try:
        # a verb that reads no setting (``completion``) runs beside a broken configuration: it is how a user gets
        # help while they fix it; the configuration's models are built only as far as the verb reads it
        settings = Settings(args)
        store_path = os.path.abspath(settings.store_path)
        out = Output(json_mode=getattr(args, "json", False))
        with stop.installed():
            return int(args.func(Invocation(args, settings, out, stop)) or 0)
    except BaseException as exc:  # the CLI's boundary: every failure becomes an exit code
        return _exit_code(exc, store_path, stop)


def _stdout_or_devnull() -> None:
    """Started with stdout closed (``>&-``, as a daemon or a cron job may start it), Python has no ``sys.stdout``,
    and every print would be an ``AttributeError``: the verb prints to /dev/null instead, as with ``> /dev/null``."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")


def _import_from_here() -> None:
    """Put the working folder first on the import path, as ``python -m`` does: ``run myprog:hello``
    finds ``./myprog.py``, here and in the workers (they start from this process's path)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def _exit_code(exc: BaseException, store_path: str | None, stop: StopSignals | None = None) -> int:
    if _find(exc, KeyboardInterrupt) is not None:
        if stop is not None and stop.received is not None:
            print(stop.said, file=sys.stderr)
            return stop.exit_code
        print("interrupted", file=sys.stderr)
        return 130
    if _find(exc, BrokenPipeError) is not None:
        # the reader went away: nothing more to say, and nothing to say it on
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    error = _find(exc, SubagentError)
    if error is not None:
        return _error(error.code, error.message)
    if not isinstance(exc, Exception):
        raise exc  # SystemExit and friends keep their meaning
    failure = _find(exc, OSError)
    if failure is not None and failure.errno is not None:  # a system call failed (not a bare TimeoutError)
        log.debug("the command failed", exc_info=exc)
        try:
            sys.stdout.flush()
        except OSError:  # it was stdout that failed (``> /dev/full``, a full disk)
            _drop_stdout()
        filename = os.path.abspath(str(failure.filename)) if failure.filename is not None else None
        if failure.errno in _READ_ONLY and store_path and filename and filename.startswith(store_path + os.sep):
            return _error("STORE_READ_ONLY", f"the store at {store_path} is read-only: {failure.strerror}: {filename}")
        return _error("OS_ERROR", str(failure))
    traceback.print_exception(exc, file=sys.stderr)
    return _error("INTERNAL", f"{type(exc).__name__}: {exc}")


def _drop_stdout() -> None:
    """Point stdout at /dev/null, dropping what it still holds: a stdout that failed (a closed pipe, a full
    disk) fails again at the interpreter's last flush, which prints ``Exception ignored ...`` after the
    CLI's one line and turns its exit code into 120."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _error(code: str, message: str) -> int:
    """The refusal's one line: a message that holds a newline (an exception a program's module raised as it
    was imported, say) or a terminal's escape sequence has it escaped, as a label is in a table."""
    message = visible(message)
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 1] + f"… ({len(message)} characters)"
    print(f"error: {code}: {message}", file=sys.stderr)
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
