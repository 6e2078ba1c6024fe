"""``Toolbox``: the tool filter hides tools, the read-only sandbox forbids writers."""

from __future__ import annotations

import pytest

from subagents.worker import Tool, ToolDeniedError, Toolbox, builtin_tools


def test_no_filter_shows_every_tool():
    box = Toolbox(builtin_tools())
    assert box.names == ["echo", "add", "read_file", "write_file"]
    assert len(box) == 4 and list(box) == box.names
    assert box.get("add").run(a=1, b=2) == 3


def test_allow_then_deny():
    box = Toolbox(builtin_tools(), allow=["echo", "add"], deny=["add"])
    assert box.names == ["echo"]
    assert "echo" in box and "add" not in box and "read_file" not in box
    assert 3 not in box


@pytest.mark.parametrize("name", ["add", "write_file", "unknown"])
def test_hidden_tool_refuses_to_run(name):
    box = Toolbox(builtin_tools(), allow=["echo"])
    with pytest.raises(ToolDeniedError) as info:
        box.get(name)
    assert info.value.code == "TOOL_DENIED"
    assert info.value.tool == name
    assert isinstance(info.value, PermissionError)
    assert str(info.value) == f'tool "{name}" is not available to this agent'


def test_empty_allow_list_hides_everything():
    assert Toolbox(builtin_tools(), allow=[]).names == []


def test_read_only_sandbox_forbids_writers_but_keeps_them_visible(tmp_path):
    box = Toolbox(builtin_tools(), sandbox="read-only")
    assert "write_file" in box
    with pytest.raises(ToolDeniedError, match="read-only sandbox"):
        box.get("write_file")
    path = tmp_path / "f.txt"
    path.write_text("data")
    assert box.get("read_file").run(path=str(path)) == "data"


def test_other_sandboxes_allow_writers(tmp_path):
    box = Toolbox(builtin_tools(), sandbox="workspace-write")
    target = tmp_path / "w.txt"
    assert box.get("write_file").run(path=str(target), content="abc") == f"wrote 3 characters to {target}"
    assert target.read_text() == "abc"


def test_custom_tools():
    box = Toolbox([Tool("shout", "Upper-case.", lambda text: text.upper()), Tool("rm", "Delete.", lambda: None, writes=True)], sandbox="read-only")
    assert box.get("shout").run(text="hi") == "HI"
    with pytest.raises(ToolDeniedError):
        box.get("rm")


@pytest.mark.parametrize("mode", ["readonly", "READ-ONLY", "bogus"])
def test_an_unknown_sandbox_forbids_writers(mode):
    """A mode the tools do not know (a log written before modes were checked at the start) fails closed."""
    box = Toolbox(builtin_tools(), sandbox=mode)
    with pytest.raises(ToolDeniedError) as info:
        box.get("write_file")
    assert str(info.value) == f'tool "write_file" writes, and this agent\'s sandbox mode "{mode}" is unknown'
    assert box.get("read_file").name == "read_file"
