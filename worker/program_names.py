"""The shape of a program reference: the name of a built-in program, or ``package.module:function``.

Apart from ``worker.programs``, which imports every built-in program (``llm``
with its HTTP client and the event loop), so that the supervisor's models and
the configuration check a reference without loading any program: every CLI
verb that reads a store loads the configuration, whose providers name
programs. ``BUILTIN_NAMES`` are the keys of ``worker.programs.BUILTIN_PROGRAMS``
(the worker's tests pin the two equal).
"""

from __future__ import annotations

__all__ = ["BUILTIN_NAMES", "reference_problem"]

BUILTIN_NAMES = frozenset({"echo", "script", "llm"})


def reference_problem(reference: str) -> str | None:
    """What is wrong with the shape of a program reference, or None: a built-in name or ``module:function``.

    The one rule, read without importing anything (the module may exist only
    where workers run): by ``load_program``, by ``Provider`` and by a
    configured ``[[providers]]`` table, so a malformed reference is refused
    before any child is made, with the same text ``subagents run`` shows.
    """
    if reference in BUILTIN_NAMES:
        return None
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        return f'program reference "{reference}" is not a built-in name or "package.module:function"'
    return None
