"""Supervisor configuration (a pydantic model; the TOML loader of the CLI fills it).

``pool`` picks where turns run: ``local`` (worker processes of this host) or
``ray`` (actors of a Ray cluster, ``supervisor/ray_pool.py``); ``ray`` holds
how to join that cluster. Ray itself is imported only when ``pool = "ray"``.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from subagents.store import MAX_RECORD_BYTES
from subagents.store.framing import MIN_RECORD_LIMIT

from .errors import ConfigError

__all__ = ["RayConfig", "SupervisorConfig", "first_problem"]


def first_problem(exc: ValidationError) -> tuple[tuple[str, ...], str, str]:
    """The first value a model refused: its path, pydantic's error kind and what is wrong.

    A nested settings model has already turned its own refusal into a ``ConfigError``
    (``_Settings``), which pydantic wraps as a value error at the nested field: its path and
    problem are read back, so the outer message names the whole dotted key, not "Value error".
    """
    first = exc.errors()[0]
    loc = tuple(str(part) for part in first["loc"])
    inner = first.get("ctx", {}).get("error")
    if isinstance(inner, ConfigError) and "path" in inner.fields:
        return loc + tuple(inner.fields["path"]), inner.fields["kind"], inner.fields["problem"]
    return loc, first["type"], first["msg"].removeprefix("Value error, ")


class _Settings(BaseModel):
    """A configuration model a caller may build in code: a refused value is ``CONFIG_INVALID``,
    as the same value in a deployment file or the environment is, not pydantic's bare error."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError.refused(*first_problem(exc), type(self).__name__) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """``True`` for a count or a duration is a mistake, not 1: pydantic's lax numbers take it."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, float, int | None, float | None):
            raise ValueError("a number, not a boolean")
        return value


# resources Ray schedules itself (``num_cpus``, ``num_gpus``, ``memory``, ...), which it refuses by name
_RAY_OWN_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory", "object_store_memory"})


class RayConfig(_Settings):
    """How a supervisor with ``pool = "ray"`` joins its cluster (the ``[ray]`` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # "auto" joins the cluster this host runs (``ray start`` wrote its address); "host:port"
    # names a head's GCS; "ray://host:10001" goes through Ray Client
    address: str = Field(default="auto", min_length=1)
    namespace: str = Field(default="subagents", min_length=1)
    # CPUs Ray reserves per worker actor: below 1 packs several I/O-bound (LLM) workers per core
    worker_num_cpus: float = Field(default=1.0, gt=0)
    # a custom resource only the store's host advertises: the store service is pinned by it
    store_resource: str = Field(default="subagents_store", min_length=1)

    @field_validator("worker_num_cpus")
    @classmethod
    def _ray_precision(cls, value: float) -> float:
        """Ray refuses a finer fraction only as each actor is made, inside the pool's start."""
        if round(value, 4) != value:
            raise ValueError(f"Ray counts a CPU to 4 decimal places (0.0001 at the finest), not {value!r}")
        return value

    @field_validator("store_resource")
    @classmethod
    def _custom_resource(cls, value: str) -> str:
        """Ray's own resources are asked for by their own options, and refused as a custom one."""
        if value in _RAY_OWN_RESOURCES:
            raise ValueError(f'"{value}" is one of Ray\'s own resources, not a custom one only the store\'s host advertises')
        return value


# workers one supervisor starts: far above any host's cores or a cluster's actors a store serves,
# low enough that a typo (``1e9``) is refused instead of forking until the host falls over
MAX_POOL_SIZE = 4096


class SupervisorConfig(_Settings):
    # ``inf`` or ``nan`` seconds mean no deployment (a lease that never expires lets no host take over)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    pool: Literal["local", "ray"] = "local"
    pool_size: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=MAX_POOL_SIZE)
    start_method: Literal["forkserver", "spawn", "fork"] = "forkserver"
    # running turns one worker process takes at once: 1 for CPU-bound programs; more for
    # programs that mostly await I/O (LLM calls), which then share a worker's event loop
    turns_per_worker: int = Field(default=1, ge=1)
    # turns a local worker is handed beyond its running ones, to start the moment one ends (no
    # round trip to the supervisor between two turns); given back to a worker that falls idle,
    # or after 50 ms behind a long turn. 2: one ahead still left a worker idle ~40% of the time
    # on 2 busy cores, as one round trip outlasted a short turn
    worker_prefetch: int = Field(default=2, ge=0)
    durability: Literal["strict", "batched", "none"] = "batched"
    lease_ttl_s: float = Field(default=5.0, gt=0)
    cancel_grace_s: float = Field(default=2.0, gt=0)  # a cancelled turn that ignores it this long has its worker killed
    # how often a supervisor looks for messages and control records that other processes
    # wrote for the children it hosts (a stat per child per poll)
    control_poll_s: float = Field(default=0.05, gt=0)
    worker_ready_timeout_s: float = Field(default=30.0, gt=0)
    worker_log_level: int = 30
    # workers print their log records as JSON lines (the CLI's --log-json sets it), else text lines
    worker_log_json: bool = False
    # the largest record (a message, an event) writers of a store this supervisor CREATES accept;
    # an existing store keeps the limit in its STORE marker, so every process on it agrees
    max_record_bytes: int = Field(default=16 * 1024 * 1024, ge=MIN_RECORD_LIMIT, le=MAX_RECORD_BYTES)
    # the deepest child this supervisor creates, whatever a request asks (a request's own
    # ``max_depth`` caps only that request, as in the reference, so a program that delegates to
    # itself would otherwise grow without bound); None ("none" in a file or the environment): no cap
    max_depth: int | None = Field(default=None, ge=0)
    ray: RayConfig = RayConfig()

    @field_validator("max_depth", mode="before")
    @classmethod
    def _none_is_no_cap(cls, value: Any) -> Any:
        """TOML has no null, and the environment holds text: both say ``"none"``."""
        return None if value == "none" else value
