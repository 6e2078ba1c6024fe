"""The ``SUBAGENTS_*`` environment variables the configuration reads, and the setting each one sets.

Apart from ``config_loader`` (which validates with pydantic models) so that
``subagents --help``, which lists them, loads no model. ``SUPERVISOR_SETTINGS``
repeats the scalar fields of ``SupervisorConfig``, in their order; the
configuration's tests pin the two equal.
"""

from __future__ import annotations

__all__ = ["ENV_PREFIX", "ENV_LLM_PREFIX", "ENV_CONFIG", "ENV_STORE", "ENV_RAY_ADDRESS", "SUPERVISOR_SETTINGS", "env_variables"]

ENV_PREFIX = "SUBAGENTS_"
ENV_LLM_PREFIX = ENV_PREFIX + "LLM_"
ENV_CONFIG = "SUBAGENTS_CONFIG"  # the deployment file, when --config is not given
ENV_STORE = "SUBAGENTS_STORE"  # store.path; every other variable is SUBAGENTS_<supervisor field> ...
ENV_RAY_ADDRESS = "SUBAGENTS_RAY_ADDRESS"  # ... but this one: ray.address

# the SupervisorConfig fields an environment variable sets: all but the tables of their own (``[ray]``)
SUPERVISOR_SETTINGS = (
    "pool", "pool_size", "start_method", "turns_per_worker", "worker_prefetch", "durability", "lease_ttl_s",
    "cancel_grace_s", "control_poll_s", "worker_ready_timeout_s", "worker_log_level", "worker_log_json",
    "max_record_bytes", "max_depth",
)


def env_variables() -> dict[str, str]:
    """Every variable the loader reads, and the key it sets (for help texts)."""
    out = {ENV_CONFIG: "the deployment file", ENV_STORE: "store.path", ENV_RAY_ADDRESS: "ray.address"}
    for name in SUPERVISOR_SETTINGS:
        out[ENV_PREFIX + name.upper()] = f"supervisor.{name}"
    return out
