"""The store's path and durability read without the configuration's models, when every setting is the default.

``subagents ls`` and ``show`` run once per line of a shell loop and read two
settings: where the store is and how it syncs. Building the layered
configuration's pydantic models for those costs more than the rest of their
start. When no deployment file is named and no ``SUBAGENTS_*`` variable is set
but ``SUBAGENTS_STORE``, every setting is the embedded default (which is valid,
a test pins it) and the store's path is the one value left to check: it is
read here, as ``config_loader`` reads it. Anything else returns ``None`` and
the caller loads the whole configuration, so a bad one fails with the same
error as always. The configuration's tests pin the two readings equal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .config_env import ENV_CONFIG, ENV_PREFIX, ENV_STORE

__all__ = ["DEFAULT_STORE_PATH", "DEFAULT_DURABILITY", "PlainStore", "plain_store"]

# as ``[store] path`` and ``[supervisor] durability`` of the embedded default (config_loader.DEFAULT_TOML)
DEFAULT_STORE_PATH = "./.subagents"
DEFAULT_DURABILITY = "batched"


@dataclass(frozen=True)
class PlainStore:
    """The two settings a store's reader needs, as ``DeploymentConfig`` would hold them."""

    path: str
    durability: str


def _well_formed(path: str) -> bool:
    """What ``StoreSettings`` accepts without a word: a refused path goes through the models, for their error."""
    return bool(path) and "\0" not in path


def plain_store(config_path: str | None, store_flag: str | None, environ: Mapping[str, str]) -> PlainStore | None:
    """The store's settings when only defaults, ``SUBAGENTS_STORE`` and ``--store`` apply; else ``None``."""
    if config_path is not None or ENV_CONFIG in environ:
        return None
    path = DEFAULT_STORE_PATH
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        if name != ENV_STORE or not _well_formed(value):
            return None
        path = value
    if store_flag is not None:
        if not _well_formed(store_flag):
            return None
        path = store_flag
    return PlainStore(os.path.expanduser(path), DEFAULT_DURABILITY)
