"""The argument parser's frame: global options, the ``Verbs`` helper, argument types.

Each verb group module (``listing``, ``control``, ``demo``, ``maintenance``)
has a ``register(verbs)`` that adds its verbs through ``Verbs.add``;
``main.build_parser`` calls them in turn, so a new verb goes in the module of
its group. The global options are accepted before and after the verb name.
A command line that does not parse raises ``UsageError`` (``USAGE``), which
the CLI prints as every other refusal: one ``error: USAGE: ...`` line, exit 2.

An option's value that begins like a negative number (``--older-than -1d``,
``--since -3h``, ``--interval -1e3``) is its value, as when it is joined
(``--older-than=-1d``): argparse takes a word that begins with ``-`` and is
not a plain negative number (``-5``) for an option, and answered ``expected
one argument`` where the joined spelling said what is wrong with the value.
No option of this CLI begins with ``-`` and a digit, so nothing else moves.

Options are not abbreviated (``--older`` is not ``--older-than``): an
abbreviation a script relied on would change meaning, or stop parsing, the
day an option sharing its prefix is added, and shell completion writes the
full name. A word that abbreviates an option is refused with the option named.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any, Callable, NoReturn

from ...store.errors import RecordTooLargeError, SubagentError
from ..config_env import env_variables
from ..errors import UsageError
from .invocation import Invocation

__all__ = ["Verbs", "new_parser", "whole", "number_of", "positive", "non_negative", "positive_float", "utf8_text", "text_or_stdin"]

Command = Callable[[Invocation], int]


def _log_level(value: str) -> str:
    if value.isdigit() or value.upper() in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not a logging level")


def whole(value: str) -> int:
    """``int(value)``, or the refusal naming what the option takes (argparse named the parser's function:
    ``invalid positive value``)."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None


def number_of(value: str) -> float:
    """``float(value)``, or the refusal naming what the option takes (``invalid positive_float value``).
    ``nan`` is refused as ``abc`` is: it is no number, and every range check it meets would say something
    else about it (that it is not more than 0, or not finite)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if math.isnan(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number")
    return number


def positive(value: str) -> int:
    number = whole(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def non_negative(value: str) -> int:
    number = whole(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return number


def seconds(value: str) -> float:
    """A finite number of seconds, 0 included: ``interrupt --wait-s 0`` does not wait."""
    return _wait_s(value, zero=True)


def positive_float(value: str) -> float:
    """A wait of more than 0 seconds, ``inf`` included: ``send`` and ``drain --wait-s inf`` wait as long as it takes
    (an anyio deadline of any size is no sleep that overflows; ``top --interval`` has bounds of its own)."""
    return _wait_s(value, zero=False)


def _wait_s(value: str, *, zero: bool) -> float:
    """The one check of every ``--wait-s``, so that one mistake is told in the same words whatever the verb:
    ``zero`` takes 0 (do not wait) and refuses inf; otherwise the wait is more than 0 and inf is no limit."""
    number = number_of(value)
    if not (0 <= number < math.inf if zero else number > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, {'finite, 0 or more' if zero else 'more than 0 (inf: no limit)'}")
    return number


def utf8_text(value: str) -> str:
    """Text a record will hold. Python keeps argv bytes that are not UTF-8 as lone surrogates,
    which msgpack cannot encode: refused here, before a root, a lease or a row is written."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{value.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8") from None
    return value


def text_or_stdin(value: str) -> str:
    """``value``, or all of stdin when it is ``-``: read as bytes and decoded strictly, so input
    that is not UTF-8 is a ``USAGE`` error whatever the locale's stdin error handler is. Read up
    to the largest record any store accepts (``MAX_RECORD_BYTES``) and no further: more is
    ``RECORD_TOO_LARGE`` at once, not an endless stream held in memory (the store's own, lower
    limit is checked where the message is written)."""
    if value != "-":
        return value
    if sys.stdin is None:  # started with stdin closed (``<&-``): Python has none to read
        raise UsageError("stdin is closed: there is no message to read from '-'")
    from ...store.framing import MAX_RECORD_BYTES

    data = sys.stdin.buffer.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise SubagentError(f"stdin holds more than {MAX_RECORD_BYTES} bytes: no store accepts a record that large "
                            "(max_record_bytes is at most that)", code=RecordTooLargeError.code, limit=MAX_RECORD_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not valid UTF-8 (byte {exc.start} of {len(data)})") from None


class _Version(argparse._VersionAction):
    """``--version``: the installed distribution's version, looked up when asked: ``importlib.metadata`` takes
    ~15 ms to import here, a fifth of a ``--help``. Otherwise argparse's own (it prints, and swallows a failed
    write, as before)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        import importlib.metadata

        self.version = f"subagents {importlib.metadata.version('subagents')}"
        super().__call__(parser, namespace, values, option_string)


def _folder(value: str) -> str:
    """``--store``'s folder: an empty one would be the working folder itself (or, taken as absent, not what was typed)."""
    if not value:
        raise argparse.ArgumentTypeError("must name a folder, not be empty")
    return value


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The global options; after the verb they default to SUPPRESS so they never undo the ones before it."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument("--store", type=_folder, default=default(None), help="the store folder (default: from the config, ./.subagents)")
    parser.add_argument("--config", default=default(None), help="a deployment TOML file (default: $SUBAGENTS_CONFIG)")
    parser.add_argument("--log-level", type=_log_level, default=default("WARNING"), help="DEBUG, INFO, WARNING (default), ERROR")
    parser.add_argument("--log-json", action="store_true", default=default(False), help="log JSON lines to stderr")


# a word that begins like a negative number: "-1d", "-3h", "-1e3", "-.5"
_NEGATIVE_LOOKING = re.compile(r"-\.?[0-9]")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are ``UsageError``, not a usage block and ``SystemExit(2)``.

    Its sub-command parsers are of this class too (argparse makes them with the
    parent's class), so each names its own ``--help`` and takes no abbreviation.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _valued_options(self) -> set[str]:
        """This parser's options that take one value (a flag's ``nargs`` is 0), from the base class's table of
        its actions, which holds its argument groups' and its parents' too."""
        return {option for action in self._actions if action.nargs is None for option in action.option_strings}

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, with ``--option -1d`` read as ``--option=-1d`` for an option of this parser that
        takes a value (a verb's parser is given the words after its name, so each joins its own)."""
        words = list(sys.argv[1:] if args is None else args)
        valued = self._valued_options()
        joined: list[str] = []
        i = 0
        while i < len(words):
            word = words[i]
            if word == "--":  # the rest are positional, as argparse has them
                joined += words[i:]
                break
            if word in valued and i + 1 < len(words) and _NEGATIVE_LOOKING.match(words[i + 1]):
                joined.append(f"{word}={words[i + 1]}")
                i += 2
                continue
            joined.append(word)
            i += 1
        try:
            parsed, extras = super().parse_known_args(joined, namespace)
        except UsageError as exc:
            if "abbreviation" not in exc.fields:  # a verb's parser has said it already
                self._refuse_abbreviations(words)  # said first: "--older-than is required" hides what went wrong
            raise
        self._refuse_abbreviations(extras)
        return parsed, extras

    def _refuse_abbreviations(self, words: list[str]) -> None:
        """``USAGE`` naming the option a word abbreviates (``--older`` for ``--older-than``), if one does."""
        options = {option for action in self._actions for option in action.option_strings}
        for word in words:
            if word == "--":  # the rest are positional
                return
            name = word.split("=", 1)[0]
            meant = sorted(option for option in options if option.startswith(name))
            if name.startswith("--") and name not in options and meant:
                raise UsageError(f"{name} is not an option: options are not abbreviated ({' or '.join(meant)}) "
                                 f"(see `{self.prog} --help`)", abbreviation=name)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, with arguments nobody took named against the verb that was given them."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            prog = getattr(parsed, "verb_prog", self.prog)
            raise UsageError(f"unrecognized arguments: {' '.join(extras)} (see `{prog} --help`)")
        return parsed

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class Verbs:
    """A group of sub-commands (the top level, ``store``, ``config``) that verb modules add to.

    Its parser's defaults name it (``verbs``), so that a command line that stops before its verb (``subagents``,
    ``subagents store``) is told which verbs go on from there (``no_verb``).
    """

    def __init__(self, parser: argparse.ArgumentParser, common: argparse.ArgumentParser, *, title: str) -> None:
        self._group = parser.add_subparsers(title=title, metavar="COMMAND")
        self._common = common
        self._prog = parser.prog
        parser.set_defaults(verbs=self)

    def no_verb(self) -> str:
        """The ``USAGE`` message for a command line that names none of these verbs: the verbs to go on with, in
        the one line every refusal is (it printed its whole usage, and no ``error:`` line for a script to read)."""
        return f"a command is required: one of {', '.join(self._group.choices)} (see `{self._prog} --help`)"

    def add(self, name: str, func: Command, help: str, *, example: str, json: bool = True,
            json_help: str = "print one JSON document", reads_config: bool = True) -> argparse.ArgumentParser:
        """A verb running ``func``; ``json`` adds ``--json`` (``json_help`` says what it prints); ``example``
        (one or more command lines, ``subagents ...``) ends its ``--help``. A verb that does not
        ``reads_config`` gets the defaults, and runs even where the configuration does not load."""
        sub = self._group.add_parser(
            name, parents=[self._common], help=help, description=help,
            epilog="example:\n" + "\n".join(f"  {line}" for line in example.splitlines()),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(func=func, verb_prog=sub.prog, reads_config=reads_config)
        if json:
            sub.add_argument("--json", action="store_true", help=json_help)
        return sub

    def group(self, name: str, help: str, *, example: str) -> "Verbs":
        """A verb that only groups others (``subagents store fsck``); alone it is a ``USAGE`` error (``no_verb``). Its ``--help``
        ends with ``example``, as every verb's does."""
        parser = self._group.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter,
                                        epilog="example:\n" + "\n".join(f"  {line}" for line in example.splitlines()))
        return Verbs(parser, self._common, title=f"{name} commands")


def new_parser() -> tuple[argparse.ArgumentParser, Verbs]:
    """The top-level parser with the global options, and its (still empty) verbs."""
    variables = "\n".join(f"  {name:<32} {what}" for name, what in env_variables().items())
    parser = _Parser(
        prog="subagents",
        description="Child agents in worker processes over a durable, shared store.",
        epilog=f"environment (overrides the config files; unknown SUBAGENTS_* names are errors):\n{variables}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    _global_options(parser, top=True)
    common = _Parser(add_help=False)
    _global_options(common, top=False)
    return parser, Verbs(parser, common, title="commands")
