"""What one verb receives: its parsed arguments, the layered configuration, and stdout.

Built once by ``main`` per run of the CLI and handed to the verb's function
(``def cmd_x(inv: Invocation) -> int``, the exit code). ``open_store`` is the
only way a verb opens the store, so no read or control verb ever creates one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from subagents.store import Store

from ..config_loader import DeploymentConfig
from .render import Output

__all__ = ["Invocation"]


@dataclass(frozen=True)
class Invocation:
    args: argparse.Namespace
    config: DeploymentConfig
    out: Output
    sources: tuple[str, ...]  # the configuration layers that applied, lowest first

    def open_store(self) -> Store:
        """The configured store, which must exist: only ``demo`` and ``run`` create one."""
        return Store(self.config.store.path, durability=self.config.supervisor.durability, create=False)

    def emit(self, doc: Any, text: Callable[[Output, Any], None]) -> None:
        """``doc`` as one JSON document under ``--json``, else its text rendering."""
        if self.out.json_mode:
            self.out.json(doc)
        else:
            text(self.out, doc)
