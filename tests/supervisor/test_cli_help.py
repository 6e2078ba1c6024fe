"""What the ``subagents`` CLI says about itself: ``--version``, each verb's ``--help``, shell completion (issue #15).

Run through the real CLI in a subprocess; the list of verbs comes from the
parser itself, so a verb added later is held to the same rules.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from subagents.supervisor.cli import build_parser

DEADLINE_S = 60.0
CLI = [sys.executable, "-m", "subagents.supervisor.cli"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env or ENV, capture_output=True, text=True, timeout=DEADLINE_S)


def _verbs(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable verb (``("store", "fsck")``, ...) with its parser."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.get_default("func") is not None:
                    found.append(((*prefix, name), sub))
                found += _verbs(sub, (*prefix, name))
    return found


VERBS = _verbs(build_parser())


def test_version(tmp_path: Path) -> None:
    """`subagents --version` prints the installed distribution's version and exits 0."""
    done = run("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"subagents {importlib.metadata.version('subagents')}"


@pytest.mark.parametrize("verb, sub", VERBS, ids=[" ".join(v) for v, _ in VERBS])
def test_every_verb_documents_its_arguments_with_an_example(tmp_path: Path, verb: tuple[str, ...], sub: argparse.ArgumentParser) -> None:
    """`subagents VERB --help` describes every positional argument and ends with a runnable example."""
    done = run(*verb, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    positionals = [a for a in sub._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    for action in positionals:
        assert action.help and action.help != argparse.SUPPRESS, f"{' '.join(verb)}: {action.metavar} has no help"
        assert action.help.split("(")[0].strip() in " ".join(text.split()), text
    assert "example" in text, text
    example = text[text.index("example") :]
    assert f"subagents {' '.join(verb)}" in example, text


@pytest.mark.parametrize("group", ["store", "config"])
def test_a_group_of_verbs_ends_its_help_with_an_example_too(tmp_path: Path, group: str) -> None:
    """Found by a README probe ("every verb's --help ends with an example"): `subagents store --help` and
    `subagents config --help` ended with their list of commands."""
    done = run(group, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "example:" in done.stdout and f"subagents {group} " in done.stdout[done.stdout.index("example:") :], done.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_the_shell(tmp_path: Path, shell: str) -> None:
    """`subagents completion SHELL` prints the script that shell sources to complete `subagents`."""
    done = run("completion", shell, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "subagents" in done.stdout and "complete" in done.stdout


@pytest.mark.parametrize("line, expected", [("subagents dr", {"drain"}), ("subagents store ", {"fsck", "check", "reindex"}),
                                            ("subagents log --fo", {"--follow"})])
def test_completion_completes_verbs_and_options(tmp_path: Path, line: str, expected: set[str]) -> None:
    """What the shell script asks for: the CLI, run with the completion protocol's variables, answers the candidates."""
    answer = tmp_path / "answer"
    env = {**ENV, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n",
           "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)}
    done = run(cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    candidates = {c.strip() for c in answer.read_text().split("\n") if c.strip()}
    assert expected <= candidates, candidates
