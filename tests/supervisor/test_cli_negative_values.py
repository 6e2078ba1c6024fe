"""A value that begins like a negative number (``-1d``, ``-3h``, ``-1e3``) is the option's value, spaced or joined.

Found by a probe: ``subagents gc --older-than -1d`` said ``USAGE: argument --older-than: expected one
argument`` (argparse takes a word beginning with ``-`` that is not a plain negative number, ``-5``, for an
option), while ``--older-than=-1d`` said what is wrong with it (``INVALID_QUERY: --older-than: '-1d' is not
an age ...``). ``ls --since -3h``, ``top --interval -1e3`` and ``interrupt --wait-s -1e3`` had the same fault.
The two spellings now give one answer; no option of the CLI begins with ``-`` and a digit, so nothing else
changes meaning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents.supervisor.errors import UsageError
from subagents.supervisor.cli import build_parser

from .test_cli_mistakes import cli, refused


def test_gc_older_than_a_negative_age_is_invalid_query_spaced_or_joined(tmp_path: Path) -> None:
    spaced = refused(cli("--store", "st", "gc", "--older-than", "-1d", cwd=tmp_path), "INVALID_QUERY")
    joined = refused(cli("--store", "st", "gc", "--older-than=-1d", cwd=tmp_path), "INVALID_QUERY")
    assert spaced == joined == "--older-than: '-1d' is not an age such as 30s, 15m, 12h, 7d or 2w"


@pytest.mark.parametrize(
    ("verb", "option", "value"),
    [
        (("ls",), "--since", "-3h"),
        (("ls",), "--until", "-1d"),
        (("ls",), "--limit", "-1e3"),
        (("top",), "--interval", "-1e3"),
        (("interrupt", "01CHILD", "--parent", "01ROOT"), "--wait-s", "-1e3"),
        (("send", "01CHILD", "hi", "--parent", "01ROOT"), "--wait-s", "-.5"),
    ],
)
def test_an_option_given_a_negative_looking_value_answers_as_when_it_is_joined(verb: tuple[str, ...], option: str, value: str) -> None:
    def answer(*args: str) -> str:
        with pytest.raises(UsageError) as caught:
            build_parser().parse_args([*verb, *args])
        return str(caught.value)

    spaced, joined = answer(option, value), answer(f"{option}={value}")
    assert spaced == joined and "expected one argument" not in spaced, (spaced, joined)


def test_a_negative_looking_value_of_a_text_option_is_taken_and_nothing_else_moves() -> None:
    parsed = build_parser().parse_args(["run", "echo", "--label", "-1d", "--prompt", "-2", "--json"])
    assert (parsed.label, parsed.prompt, parsed.json) == ("-1d", "-2", True)
    parsed = build_parser().parse_args(["ls", "--limit", "3", "--json"])
    assert (parsed.limit, parsed.json) == (3, True)
    with pytest.raises(UsageError) as caught:  # an option's missing value is still said as argparse says it
        build_parser().parse_args(["gc", "--older-than", "--dry-run"])
    assert "argument --older-than: expected one argument" in str(caught.value)
