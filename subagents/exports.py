"""A package's public names, each loaded from its own module on first use (PEP 562).

The three rooms' packages (``subagents.store``, ``.worker``, ``.supervisor``)
and ``subagents`` itself re-export names from their modules. Importing any one
module of a package runs that package's ``__init__``, so eager re-exports would
make every short command (``subagents --help``, ``subagents ls``) and every
worker load the whole room: the supervisor's runtime, the store's maintenance
code. Each package instead says which module holds each name, and takes its
module ``__getattr__`` and ``__dir__`` from here. A name, once loaded, is kept
in the package's namespace, so it costs a lookup only the first time.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Iterable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Iterable[str]], public: Iterable[str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``exports`` map a module (relative to it, e.g.
    ``".errors"``) to the names it gives the package, and whose ``public`` names are its ``__all__``."""
    home = {name: module for module, names in exports.items() for name in names}
    listed = frozenset(public)

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | listed)

    return __getattr__, __dir__
