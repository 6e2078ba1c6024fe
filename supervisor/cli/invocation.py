"""What one verb receives: its parsed arguments, the layered configuration, and stdout.

Built once by ``main`` per run of the CLI and handed to the verb's function
(``def cmd_x(inv: Invocation) -> int``, the exit code). ``open_store`` is the
only way a verb opens the store: only ``demo`` and ``run`` create one, and a
verb that writes checks first that it can (``STORE_READ_ONLY``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from subagents.store.errors import SessionNotFoundError, StoreNotFoundError, SubagentError
from subagents.store.ids import validate_session_id

from .render import Output
from .settings import Settings
from .stopping import StopSignals

if TYPE_CHECKING:
    from subagents.store.header import SessionHeader
    from subagents.store.root import Store

    from ..config_loader import DeploymentConfig

__all__ = ["Invocation", "NO_STORE_HINT"]

NO_STORE_HINT = "`subagents demo` or `subagents run PROGRAM` makes one there; `--store PATH` (or SUBAGENTS_STORE) names another"


@dataclass(frozen=True)
class Invocation:
    args: argparse.Namespace
    settings: Settings  # the layered configuration, built as far as the verb reads it
    out: Output
    stop: StopSignals = field(default_factory=StopSignals)  # a verb that hosts turns runs them through ``stop.host``

    @property
    def config(self) -> DeploymentConfig:
        """The effective configuration (its models are built at the first read)."""
        return self.settings.config

    @property
    def sources(self) -> tuple[str, ...]:
        """The configuration layers that applied, lowest first."""
        return self.settings.sources

    @property
    def origins(self) -> Mapping[str, str]:
        """Dotted key -> where its value came from (``LoadedConfig.origins``, then the flags)."""
        return self.settings.origins

    @property
    def llm(self) -> Mapping[str, str]:
        """The ``SUBAGENTS_LLM_*`` variables set (``LoadedConfig.llm``)."""
        return self.settings.llm

    def open_store(self, *, create: bool = False, write: bool = False) -> Store:
        """The configured store; it must exist unless ``create``; with ``write``, it must be writable.

        The store's modules are imported here, by the verbs that open one (the parser's modules import
        none: ``--help`` loads no store)."""
        from subagents.store.root import Store

        try:
            store = Store(self.settings.store_path, durability=self.settings.durability, create=create)
        except StoreNotFoundError as exc:
            raise StoreNotFoundError(f"{exc.message}: {NO_STORE_HINT}", path=exc.fields.get("path")) from None
        if write:
            store.require_writable()
        return store

    def session(self, store: Store, text: str) -> SessionHeader:
        """The header of the session ``text`` names (its id or a unique prefix, as tables print it):
        ``INVALID_SESSION_ID``, ``AMBIGUOUS_ID`` or ``SESSION_NOT_FOUND`` before a verb acts on it.
        Verbs act on the header's ``id``, never on the text typed."""
        from subagents.store.prefix import resolve_id
        from subagents.store.reader import read_header

        return read_header(store, validate_session_id(resolve_id(store, text)))

    def parent(self, store: Store, text: str) -> str:
        """The id of the session ``text`` names, as the parent of a listing or a drain.

        What lies below a session is in its children index, not its header: a
        damaged header (``CORRUPT_SESSION``, ``UNAVAILABLE_SESSION``, ...) is named
        in a ``warning:`` line on stderr and the verb goes on, so the children of a
        damaged parent can still be found and torn down. An unknown id is still
        ``SESSION_NOT_FOUND``.
        """
        from subagents.store.prefix import resolve_id
        from subagents.store.reader import read_header

        session_id = validate_session_id(resolve_id(store, text))
        try:
            read_header(store, session_id)
        except SessionNotFoundError:
            raise
        except SubagentError as exc:
            print(f"warning: {exc.code}: {exc.message}; going on with what its children index holds (see `subagents store fsck`)",
                  file=sys.stderr)
        return session_id

    def emit(self, doc: Any, text: Callable[[Output, Any], None]) -> None:
        """``doc`` as one JSON document under ``--json``, else its text rendering."""
        if self.out.json_mode:
            self.out.json(doc)
        else:
            text(self.out, doc)
