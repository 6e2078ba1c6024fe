"""The configuration one run of the CLI works with, loaded as far as its verb reads it.

A verb that only reads the store (``ls``, ``show``, shell loops' verbs) needs
its path and durability; the layered configuration's pydantic models cost more
than the rest of such a start. When the plain reading answers
(``config_plain``: every setting is the default, but the store's path), the
models are built only if the verb asks for more; otherwise the whole
configuration is loaded at once, as before, so a bad configuration fails every
verb that reads settings with the same error, before the verb runs.
"""

from __future__ import annotations

import argparse
import os
from functools import cached_property
from typing import TYPE_CHECKING, Mapping

from ..config_plain import PlainStore, plain_store

if TYPE_CHECKING:
    from ..config_loader import DeploymentConfig, LoadedConfig

__all__ = ["Settings"]


class Settings:
    """The settings of ``args`` (``--config``, ``--store``, ``--log-json``) over the environment's and the files'."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._reads = bool(getattr(args, "reads_config", True))  # False: a verb that reads no setting (``completion``)
        self._plain: PlainStore | None = plain_store(args.config, args.store, os.environ) if self._reads else None
        if self._reads and self._plain is None:
            _ = self.loaded  # a configuration the plain reading cannot vouch for is checked now, before the verb

    @cached_property
    def loaded(self) -> LoadedConfig:
        """The layered configuration, validated (a verb that reads no setting gets the models' defaults)."""
        from ..config_loader import DeploymentConfig, LoadedConfig, load_config

        return load_config(self._args.config) if self._reads else LoadedConfig(DeploymentConfig(), ())

    @cached_property
    def config(self) -> DeploymentConfig:
        """The effective configuration, with ``--store`` and ``--log-json`` applied."""
        config = self.loaded.config.with_store(self._args.store) if self._args.store else self.loaded.config
        if self._args.log_json:  # the workers print as the host does: one format on one stderr
            config = config.model_copy(update={"supervisor": config.supervisor.model_copy(update={"worker_log_json": True})})
        return config

    @property
    def store_path(self) -> str:
        return self._plain.path if self._plain is not None else self.config.store.path

    @property
    def durability(self) -> str:
        return self._plain.durability if self._plain is not None else self.config.supervisor.durability

    @cached_property
    def sources(self) -> tuple[str, ...]:
        """The configuration layers that applied, lowest first."""
        args = self._args
        return tuple(self.loaded.sources) + (("--store",) if args.store else ()) + (("--log-json",) if args.log_json else ())

    @cached_property
    def origins(self) -> Mapping[str, str]:
        """Dotted key -> where its value came from (``LoadedConfig.origins``, then the flags)."""
        args = self._args
        return {**self.loaded.origins, **({"store.path": "flag --store"} if args.store else {}),
                **({"supervisor.worker_log_json": "flag --log-json"} if args.log_json else {})}

    @property
    def llm(self) -> Mapping[str, str]:
        """The ``SUBAGENTS_LLM_*`` variables set (``LoadedConfig.llm``)."""
        return self.loaded.llm
