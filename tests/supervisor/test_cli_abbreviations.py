"""Options are not abbreviated: ``--older`` is no ``--older-than``, whatever follows it.

Found by the edge probes: argparse took a unique prefix of an option for the option, except where the
value began like a negative number (``gc --older -1d`` said ``USAGE: expected one argument`` while
``--older-than -1d`` and ``--older-than=-1d`` reached the value's own check, ``INVALID_QUERY``), since the
CLI joins a negative-looking value to its option by the option's full name. Rather than re-implement
argparse's prefix rule there, abbreviations are off everywhere: a script's abbreviation would otherwise
change meaning, or stop parsing, the day an option sharing its prefix is added, and shell completion
writes the full name. A unique prefix is refused with the option it abbreviates named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents.supervisor.cli import build_parser
from subagents.supervisor.errors import UsageError

from .test_cli_mistakes import cli, refused


@pytest.mark.parametrize("words", [("--older", "-1d"), ("--older=-1d",), ("--older", "1d"), ("--older-t", "7d")])
def test_an_abbreviated_option_is_usage_naming_the_option(tmp_path: Path, words: tuple[str, ...]) -> None:
    said = refused(cli("--store", "st", "gc", *words, cwd=tmp_path), "USAGE")
    assert "options are not abbreviated" in said and "--older-than" in said, said


@pytest.mark.parametrize(("words", "verb"), [
    (("--sto", "st", "ls"), "subagents"), (("ls", "--sto", "st"), "subagents ls"), (("ls", "--lim", "3"), "subagents ls"),
    (("log", "01X", "--fol"), "subagents log"), (("store", "fsck", "--rep"), "subagents store fsck"),
    (("run", "echo", "--lab", "x"), "subagents run"), (("ls", "--log", "INFO"), "subagents ls"),
])
def test_no_verb_takes_a_prefix_of_its_options(words: tuple[str, ...], verb: str) -> None:
    """Each of these parsed before (an ambiguous one, ``--log``, said so in argparse's words); the refusal
    names the verb whose options were meant."""
    with pytest.raises(UsageError, match="options are not abbreviated") as caught:
        build_parser().parse_args(list(words))
    assert str(caught.value).endswith(f"(see `{verb} --help`)"), caught.value


def test_a_word_after_the_end_of_options_is_no_abbreviation() -> None:
    parsed = build_parser().parse_args(["send", "01CHILD", "--parent", "01ROOT", "--", "--par"])
    assert (parsed.parent, parsed.message) == ("01ROOT", "--par")
