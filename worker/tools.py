"""Tools a program can call, and the filter and sandbox that hide or forbid them.

``ctx.tools`` holds only the tools the child may see: a tool outside the
descriptor's ``tool_filter`` is invisible *and* refuses to run; under the
``read-only`` sandbox a tool that writes refuses to run, and so it does under
a mode that is not one of ``SANDBOX_MODES`` (the supervisor refuses such a
mode at every start; one read back from a log written before it did fails
closed rather than letting a typo widen a child). The built-in set is
deliberately small (tests and the demo need no model); programs pass their
own tools to ``Toolbox`` the same way.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ToolArgumentsError, ToolDeniedError

__all__ = ["SANDBOX_MODES", "Tool", "Toolbox", "builtin_tools"]

# the sandbox modes an agent may run under (the reference's sandboxMode values); only read-only forbids writers here
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    run: Callable[..., Any]
    writes: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)

    def invoke(self, args: dict[str, Any]) -> Any:
        """``run(**args)``, the arguments checked against its signature first (``ToolArgumentsError``)."""
        try:
            signature = inspect.signature(self.run)
        except (TypeError, ValueError):  # a callable without one (some builtins): its own error says what is wrong
            return self.run(**args)
        named = signature.parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in named.values()):
            unknown = [name for name in args if name not in named]
            if unknown:
                raise ToolArgumentsError(self.name, f"takes no argument {unknown[0]!r}", list(named))
        try:
            signature.bind(**args)
        except TypeError as exc:  # a required argument missing, or one that only goes by position
            raise ToolArgumentsError(self.name, str(exc), list(named)) from None
        return self.run(**args)


def _echo(text: str = "") -> str:
    return text


def _add(a: float, b: float) -> float:
    return a + b


def _read_file(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _write_file(path: str, content: str) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)
    return f"wrote {len(content)} characters to {path}"


def builtin_tools() -> list[Tool]:
    return [
        Tool("echo", "Return the text unchanged.", _echo, parameters={"text": "string"}),
        Tool("add", "Add two numbers.", _add, parameters={"a": "number", "b": "number"}),
        Tool("read_file", "Read a UTF-8 text file.", _read_file, parameters={"path": "string"}),
        Tool("write_file", "Write a UTF-8 text file.", _write_file, writes=True, parameters={"path": "string", "content": "string"}),
    ]


class Toolbox:
    """The tools visible to one turn, after the tool filter."""

    def __init__(self, tools: list[Tool], *, allow: list[str] | None = None, deny: list[str] | None = None, sandbox: str | None = None) -> None:
        self._all = {t.name: t for t in tools}
        self._allow = None if allow is None else set(allow)
        self._deny = set(deny or ())
        self.sandbox = sandbox

    def _visible(self, name: str) -> bool:
        if self._allow is not None and name not in self._allow:
            return False
        return name not in self._deny

    @property
    def names(self) -> list[str]:
        return [n for n in self._all if self._visible(n)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._all and self._visible(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def get(self, name: str) -> Tool:
        if name not in self:
            raise ToolDeniedError(f'tool "{name}" is not available to this agent', tool=name)
        tool = self._all[name]
        if tool.writes and self.sandbox == "read-only":
            raise ToolDeniedError(f'tool "{name}" writes, and this agent runs in the read-only sandbox', tool=name)
        if tool.writes and self.sandbox is not None and self.sandbox not in SANDBOX_MODES:
            raise ToolDeniedError(f'tool "{name}" writes, and this agent\'s sandbox mode "{self.sandbox}" is unknown', tool=name)
        return tool
