"""``subagents config show``: the layered configuration as TOML, each value's source beside it.

The text is itself a valid deployment file (sources are TOML comments): the
layers that applied, lowest first, then every value with ``# default``,
``# <file>:<line>``, ``# env <NAME>`` or ``# flag --store``. Rich highlights
it on a terminal.
"""

from __future__ import annotations

from typing import Sequence

from ..config_loader import toml_escaped
from .render import Output

__all__ = ["render_config"]


def _annotated(text: str, value_sources: dict[str, str]) -> str:
    """A TOML dump with ``  # <source>`` after each value (and after each ``[[providers]]``). Split at ``\\n``
    alone: ``str.splitlines`` also splits at characters a TOML string or comment holds as they are."""
    lines, table = [], ""
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("[["):
            table = "providers"
            line += f"  # {toml_escaped(value_sources.get('providers', 'default'))}"
        elif stripped.startswith("["):
            table = stripped.strip("[]")
        elif "=" in stripped:
            key = stripped.split("=", 1)[0].strip()
            dotted = key if key == "providers" else f"{table}.{key}"
            if table != "providers" and dotted in value_sources:
                line += f"  # {toml_escaped(value_sources[dotted])}"
        lines.append(line)
    return "\n".join(lines)


def render_config(out: Output, text: str, sources: Sequence[str], value_sources: dict[str, str] | None = None) -> None:
    """The layers that applied, then the configuration as TOML with each value's source beside it."""
    body = "".join(f"# from {toml_escaped(s)}\n" for s in sources) + "\n" + (_annotated(text, value_sources) if value_sources else text)
    if out.rich:
        from rich.syntax import Syntax

        out.console.print(Syntax(body, "toml", background_color="default"))
        return
    out.stream.write(body)
    out.stream.flush()
