"""Program references and the ``script`` action list."""

from __future__ import annotations


import pytest

from subagents.worker import BUILTIN_PROGRAMS, ProgramLoadError, load_program
from subagents.worker.program_names import BUILTIN_NAMES
from subagents.worker.programs.script import parse_script


async def module_level_program(ctx):
    return "x"


class Holder:
    @staticmethod
    async def nested(ctx):
        return "y"


def test_builtins():
    assert {"echo", "script"} <= set(BUILTIN_PROGRAMS)
    assert load_program("echo") is BUILTIN_PROGRAMS["echo"]


def test_the_names_references_are_checked_against_are_the_builtin_programs():
    """``program_names`` repeats the built-in programs' names, so that a reference is checked without
    loading them (the configuration of every CLI verb names programs)."""
    assert BUILTIN_NAMES == set(BUILTIN_PROGRAMS)


def test_import_path_and_dotted_attribute():
    assert load_program("tests.worker.test_programs:module_level_program") is module_level_program
    assert load_program("tests.worker.test_programs:Holder.nested") is Holder.nested


@pytest.mark.parametrize("reference", ["no_colon_here", ":func", "module:", "tests.no_such_module:f", "tests.worker.test_programs:missing", "json:__doc__"])
def test_bad_references(reference):
    with pytest.raises(ProgramLoadError) as info:
        load_program(reference)
    assert info.value.code == "PROGRAM_LOAD_FAILED"
    assert isinstance(info.value, ImportError)


def test_no_program():
    with pytest.raises(ProgramLoadError):
        load_program(None)


def test_blob_wins_over_reference():
    import dill

    def local(ctx):
        return "blob"

    assert load_program("echo", dill.dumps(local))(None) == "blob"


@pytest.mark.parametrize("message", [
    '[{"say": "a"}]',
    '{"script": [{"say": "a"}]}',
    [{"say": "a"}],
    {"script": [{"say": "a"}]},
])
def test_parse_script_forms(message):
    assert parse_script(message) == [{"say": "a"}]


@pytest.mark.parametrize("message", ['{"say": "a"}', "[1, 2]", "[{}]", '{"script": "x"}', "42"])
def test_parse_script_rejects(message):
    with pytest.raises(ValueError):
        parse_script(message)


def test_parse_script_rejects_text_that_is_neither_json_nor_toml():
    with pytest.raises(ValueError, match="a script is JSON or TOML"):
        parse_script("not json")


def test_script_accepts_toml_action_tables() -> None:
    """A script may be TOML: one [[script]] table per action, in order."""
    from subagents.worker.programs.script import parse_script

    text = '[[script]]\nsay = "hello"\n\n[[script]]\nstep = 2\n\n[[script]]\nreturn = "done"\n'
    assert parse_script(text) == [{"say": "hello"}, {"step": 2}, {"return": "done"}]
    with pytest.raises(ValueError):
        parse_script("neither json = nor [toml")


@pytest.mark.parametrize("source, said", [
    ("def f(:\n    pass\n", "importing it raised SyntaxError: invalid syntax"),
    ("raise RuntimeError('no config')\n", "importing it raised RuntimeError: no config"),
    ("import sys\nsys.exit(5)\n", "importing it raised SystemExit: 5"),
], ids=["syntax-error", "raises", "exits"])
def test_a_module_that_fails_as_it_is_imported_is_a_program_load_failure(tmp_path, monkeypatch, source, said):
    """Found by a probe: `subagents run mod:f` of a module with a SyntaxError, or one raising at import, printed a
    traceback and INTERNAL; one calling sys.exit() ended the CLI with no word. Each is PROGRAM_LOAD_FAILED."""
    from subagents.worker.errors import ProgramLoadError
    from subagents.worker.programs import load_program

    name = f"faulty_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ProgramLoadError) as info:
        load_program(f"{name}:f")
    assert info.value.code == "PROGRAM_LOAD_FAILED" and said in info.value.message, info.value.message
