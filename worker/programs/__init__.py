"""Built-in programs and the loader of program references.

A reference is a built-in name (``echo``, ``script``, ``llm``), an import path
``"package.module:function"``, or (in-code only) a callable object carried by
dill in ``TurnSpec.program_blob``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..errors import ProgramLoadError
from ..program_names import reference_problem
from .echo import echo
from .llm import llm
from .script import script

__all__ = ["BUILTIN_PROGRAMS", "load_program", "reference_problem"]

BUILTIN_PROGRAMS: dict[str, Callable[..., Any]] = {"echo": echo, "script": script, "llm": llm}


def load_program(reference: str | None, blob: bytes | None = None) -> Callable[..., Any]:
    if blob is not None:
        import dill  # only for in-code callables; never for anything read from the store

        return dill.loads(blob)
    if reference is None:
        raise ProgramLoadError("no program given")
    if reference in BUILTIN_PROGRAMS:
        return BUILTIN_PROGRAMS[reference]
    problem = reference_problem(reference)
    if problem is not None:
        raise ProgramLoadError(problem, reference=reference)
    module_name, _, attr = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ProgramLoadError(f'cannot load program "{reference}": {exc}', reference=reference) from exc
    except (Exception, SystemExit) as exc:  # the module failed as it ran: a SyntaxError, its own error, sys.exit()
        raise ProgramLoadError(f'cannot load program "{reference}": importing it raised {type(exc).__name__}: {exc}',
                               reference=reference) from exc
    if not callable(target):
        raise ProgramLoadError(f'program "{reference}" is not callable', reference=reference)
    return target
