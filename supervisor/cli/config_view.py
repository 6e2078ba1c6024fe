"""``subagents config show``: the layered configuration as TOML, each value's source beside it.

The text is itself a valid deployment file (sources are TOML comments): the
layers that applied, lowest first, then every value with ``# default``,
``# <file>:<line>``, ``# env <NAME>`` or ``# flag --store``; then, as
comments, the llm program's ``SUBAGENTS_LLM_*`` settings. Rich highlights
it on a terminal.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..config_loader import toml_escaped, toml_value
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


def _llm_comments(values: dict[str, Any], sources: dict[str, str]) -> str:
    """The llm program's settings as comments (``# SUBAGENTS_LLM_MODEL = "m"  # default``): its workers read
    them from their environment, so they are no key of a deployment file, and the text still loads back."""
    lines = ["", "# the llm program's settings: read from the environment where its turns run, not from this file"]
    lines += [f"# SUBAGENTS_LLM_{key.upper()} = {toml_value(value)}  # {toml_escaped(sources[key])}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def render_config(out: Output, text: str, sources: Sequence[str], value_sources: dict[str, str] | None = None,
                  llm: tuple[dict[str, Any], dict[str, str]] | None = None) -> None:
    """The layers that applied, then the configuration as TOML with each value's source beside it, then the
    llm program's settings (``llm``: values and sources by key, from ``llm_settings``) as comments."""
    body = "".join(f"# from {toml_escaped(s)}\n" for s in sources) + "\n" + (_annotated(text, value_sources) if value_sources else text)
    if llm is not None:
        body += _llm_comments(*llm)
    if out.rich:
        from rich.syntax import Syntax

        out.console.print(Syntax(body, "toml", background_color="default"))
        return
    out.stream.write(body)
    out.stream.flush()
