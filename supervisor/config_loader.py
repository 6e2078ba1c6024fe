"""Deployment configuration: the embedded default, a TOML file, ``SUBAGENTS_*`` variables.

Owns the layering and the validation of what ``configs/*.toml`` may say, and
turns it into the models the service takes (``SupervisorConfig``,
``Provider``). Layers, later wins: ``DEFAULT_TOML`` (kept byte-identical to
``configs/default.toml``; a test pins it), then a deployment file, then the
environment. Unknown keys are errors naming the key and the layer
(``ConfigError``, code ``CONFIG_INVALID``). Called by the CLI, or by a host
application that wants the same files; the environment is read only here,
and only when the caller does not pass its own mapping.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


from .config import RayConfig, SupervisorConfig, first_problem
from .config_env import ENV_CONFIG, ENV_LLM_PREFIX, ENV_PREFIX, ENV_RAY_ADDRESS, ENV_STORE, env_variables
from .errors import ConfigError
from .models import Capabilities, Provider, well_formed_program, well_formed_provider_name

__all__ = [
    "DEFAULT_TOML",
    "DEFAULT_SOURCE",
    "ENV_PREFIX",
    "ENV_CONFIG",
    "ENV_STORE",
    "ConfigError",
    "StoreSettings",
    "ProviderSettings",
    "DeploymentConfig",
    "LoadedConfig",
    "load_config",
    "toml_escaped",
    "toml_value",
    "llm_settings",
    "env_variables",
    "dump_toml",
]

DEFAULT_SOURCE = "the embedded default (configs/default.toml)"
# SupervisorConfig fields that are tables of their own (``[ray]``), not SUBAGENTS_* scalars
_NESTED = frozenset({"ray"})

DEFAULT_TOML = """\
# subagents: the embedded default configuration.
#
# Layers, later wins: this file (embedded in supervisor/config_loader.py),
# then a deployment file (--config or SUBAGENTS_CONFIG), then SUBAGENTS_*
# environment variables (SUBAGENTS_STORE, SUBAGENTS_POOL_SIZE, ...), then the
# CLI's --store. Unknown keys are errors, in every layer.

[store]
path = "./.subagents"           # relative paths are relative to the working directory

[supervisor]
pool = "local"                  # local (worker processes of this host) | ray (actors of a Ray cluster: [ray])
pool_size = "auto"              # worker processes; "auto" = the CPU count
start_method = "forkserver"     # forkserver | spawn | fork
durability = "batched"          # strict (fsync every append) | batched (fsync at commit points) | none
lease_ttl_s = 5.0               # an owner whose heartbeat is older than this is dead; its leases can be taken
cancel_grace_s = 2.0            # a cancelled turn that ignores cancellation this long has its worker killed
turns_per_worker = 1            # running turns per worker: 1 for CPU-bound programs, more for I/O-bound (LLM) ones
worker_prefetch = 2             # turns a local worker is handed ahead, to start the moment one ends (0: none)
control_poll_s = 0.05           # how often a supervisor looks for messages/controls other processes wrote for its children
worker_ready_timeout_s = 30.0   # a worker that is not READY by then is a startup failure
worker_log_level = 30           # logging level inside workers (30 = WARNING)
worker_log_json = false         # workers log JSON lines, as the CLI's --log-json does (which sets it)
max_record_bytes = 16777216     # largest record (message, event) a store created here accepts; kept in its STORE marker; at most 64 MiB
max_depth = "none"              # deepest child this supervisor creates, whatever a request asks ("none": no cap)

# Used only with pool = "ray" (pip install 'subagents[ray]').
[ray]
address = "auto"                # auto (the cluster this host joined) | host:port | ray://host:10001
namespace = "subagents"         # the Ray namespace of the pool's actors
worker_num_cpus = 1.0           # CPUs per worker actor: below 1 for I/O-bound (LLM) agents, with turns_per_worker > 1
store_resource = "subagents_store"  # custom resource only the store's host advertises (the store service runs there)

# Providers registered by the CLI (`subagents run`, `subagents demo`), besides
# the CLI's own. A deployment file's `providers` array replaces this one.
# capabilities: output_schema, depth_limit, tool_filter, persona,
# sandbox_mode, run_budget, or "all".

[[providers]]
name = "echo"
program = "echo"                # a built-in name or "package.module:function"
capabilities = []

[[providers]]
name = "script"
program = "script"
capabilities = ["all"]
"""


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = "./.subagents"

    @field_validator("path")
    @classmethod
    def _a_folder_name(cls, value: str) -> str:
        """An empty path is the working folder itself (a store's folders made among the user's files),
        and a NUL byte no path the OS takes: both are mistakes, named with their layer. A leading ``~``
        is the home folder, as a shell reads it in ``--store``: kept as written, it made a folder named
        ``~`` in the working folder."""
        if not value:
            raise ValueError("must name a folder, not be empty")
        if "\0" in value:
            raise ValueError("must not hold a NUL byte")
        return os.path.expanduser(value)


_CAPABILITY_NAMES = tuple(Capabilities.model_fields)


class ProviderSettings(BaseModel):
    """One ``[[providers]]`` table: a provider the CLI registers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    program: str
    continuable: bool = False
    inherits_parent_context: bool = False
    capabilities: list[str] = []

    _program = field_validator("program")(well_formed_program)  # as Provider's own
    _name = field_validator("name")(well_formed_provider_name)

    @field_validator("capabilities")
    @classmethod
    def _known_capabilities(cls, value: list[str]) -> list[str]:
        for name in value:
            if name != "all" and name not in _CAPABILITY_NAMES:
                raise ValueError(f'unknown capability "{name}" (known: all, {", ".join(_CAPABILITY_NAMES)})')
        return value

    def to_provider(self) -> Provider:
        if "all" in self.capabilities:
            caps = Capabilities.all()
        else:
            caps = Capabilities(**{name: True for name in self.capabilities})
        return Provider(
            name=self.name,
            program=self.program,
            capabilities=caps,
            inherits_parent_context=self.inherits_parent_context,
            continuable=self.continuable,
        )


class DeploymentConfig(BaseModel):
    """The effective configuration: where the store is, how the supervisor runs, which providers.

    The file's top-level ``[ray]`` table is the supervisor's ``ray`` field
    (``SupervisorConfig.ray``): a deployment file names it as a table of its
    own, the way operators think of it, and the service takes one model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: StoreSettings = StoreSettings()
    supervisor: SupervisorConfig = SupervisorConfig()
    providers: list[ProviderSettings] = []

    @model_validator(mode="before")
    @classmethod
    def _ray_table(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ray" in data:
            data = dict(data)
            ray = data.pop("ray")
            supervisor = dict(data.get("supervisor") or {})
            if "ray" in supervisor:
                raise ValueError('"ray" is given both as a table and inside [supervisor]')
            supervisor["ray"] = ray
            data["supervisor"] = supervisor
        return data

    @model_validator(mode="after")
    def _unique_providers(self) -> "DeploymentConfig":
        seen: set[str] = set()
        for provider in self.providers:
            if provider.name in seen:
                raise ValueError(f'provider "{provider.name}" is defined twice')
            seen.add(provider.name)
        return self

    def with_store(self, path: str | os.PathLike[str]) -> "DeploymentConfig":
        return self.model_copy(update={"store": StoreSettings(path=os.fspath(path))})


@dataclass(frozen=True)
class LoadedConfig:
    config: DeploymentConfig
    sources: tuple[str, ...]  # the layers that were applied, in order
    # where each value that a layer set came from, by dotted key ("supervisor.pool_size", "ray.address",
    # "providers"): "default", "<file>:<line>" or "env <NAME>"; a key absent here has the model's default
    origins: Mapping[str, str] = field(default_factory=dict)
    # the SUBAGENTS_LLM_* variables set (checked): the llm program reads them where its turns run, not from here
    llm: Mapping[str, str] = field(default_factory=dict)


def load_config(path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None) -> LoadedConfig:
    """Layer the default, the deployment file and the environment; validate.

    ``path`` defaults to ``$SUBAGENTS_CONFIG``; ``env`` defaults to
    ``os.environ``. A missing file named explicitly is an error.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"the configuration file must be a path, not {type(path).__name__}")
    if env is not None and not (isinstance(env, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ConfigError("env must map names to values, both text, as os.environ does")
    environ = os.environ if env is None else env
    layers: list[tuple[str, dict[str, Any]]] = [(DEFAULT_SOURCE, _parse(DEFAULT_TOML, DEFAULT_SOURCE))]
    file_path = os.fspath(path) if path is not None else environ.get(ENV_CONFIG) or None
    key_lines: dict[tuple[str, ...], int] = {}
    if file_path is not None:
        data, key_lines = _read_file(file_path)
        layers.append((file_path, data))
    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    sources: list[str] = []
    for source, data in layers:
        _merge(merged, origins, data, source)
        sources.append(source)
    env_sources = _merge_env(merged, origins, environ)
    sources.extend(env_sources)
    labels = {".".join(key): _label(source, key, file_path, key_lines) for key, source in origins.items()}
    llm = {name: value for name, value in environ.items() if name.startswith(ENV_LLM_PREFIX)}
    return LoadedConfig(_validate(merged, origins), tuple(sources), labels, llm)


def _label(source: str, key: tuple[str, ...], file_path: str | None, key_lines: dict[tuple[str, ...], int]) -> str:
    """A layer's name as ``config show`` prints it beside a value."""
    if source == DEFAULT_SOURCE:
        return "default"
    if source == file_path:
        line = key_lines.get(key)
        return f"{file_path}:{line}" if line is not None else file_path
    return source.replace("environment variable ", "env ", 1)


_TABLE_LINE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]")
_ARRAY_LINE = re.compile(r"^\s*\[\[\s*([A-Za-z0-9_.-]+)\s*\]\]")
_KEY_LINE = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*=")


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line (1-based) where each ``(table, key)`` of a TOML file is set; an array of tables by its
    first header. Only for naming sources: ``tomllib`` validates the file, this never rejects it."""
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        if match := _ARRAY_LINE.match(line):
            table = (match.group(1),)
            found.setdefault(table, number)
        elif match := _TABLE_LINE.match(line):
            table = tuple(match.group(1).split("."))
        elif (match := _KEY_LINE.match(line)) and not (table and table[0] == "providers"):
            found.setdefault((*table, *match.group(1).split(".")), number)
    return found


# -- layers ---------------------------------------------------------------------


def _parse(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}", source=source) from None


# a deployment file is a few dozen lines: anything this large is not one (a device, a log named by mistake)
MAX_CONFIG_BYTES = 1 << 20


def _read_file(path: str) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """The file's TOML and its keys' lines, read up to ``MAX_CONFIG_BYTES``. A regular file, or a pipe
    (``--config <(...)``): a device such as ``/dev/zero`` never ends, a folder has no text. The open
    never waits: a named FIFO nobody writes reads as empty, not as a hang."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
                raise ConfigError(f"config file {path} is not a regular file or a pipe", source=path)
            os.set_blocking(fd, True)  # a pipe's writer may not have written yet: wait for its text, or its end
            with os.fdopen(fd, "rb", closefd=False) as handle:
                raw = handle.read(MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}", source=path) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes: not a deployment file", source=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8", source=path) from None
    return _parse(text, path), _key_lines(text)


_TABLES = {"store": StoreSettings, "supervisor": SupervisorConfig, "ray": RayConfig}


def _merge(merged: dict[str, Any], origins: dict[tuple[str, ...], str], data: dict[str, Any], source: str) -> None:
    """Overlay one layer key by key, remembering which layer set each key."""
    for key, value in data.items():
        if key in _TABLES:
            if not isinstance(value, dict):
                raise ConfigError(f'"{key}" must be a table in {source}', key=key, source=source)
            table = merged.setdefault(key, {})
            for sub, sub_value in value.items():
                table[sub] = sub_value
                origins[(key, sub)] = source
        elif key == "providers":
            merged[key] = value  # an array replaces the array of earlier layers
            origins[(key,)] = source
        else:
            raise ConfigError(f'unknown key "{key}" in {source}', key=key, source=source)


def _merge_env(merged: dict[str, Any], origins: dict[tuple[str, ...], str], environ: Mapping[str, str]) -> list[str]:
    known = {ENV_PREFIX + f.upper(): f for f in SupervisorConfig.model_fields if f not in _NESTED}
    used: list[str] = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG:
            continue
        if name.startswith(ENV_LLM_PREFIX):
            _require_llm_variable(name, environ[name])  # the llm program's own (worker/programs/llm.py), read where it runs
            continue
        value = environ[name]
        source = f"environment variable {name}"
        if name == ENV_STORE:
            merged.setdefault("store", {})["path"] = value
            origins[("store", "path")] = source
        elif name == ENV_RAY_ADDRESS:
            merged.setdefault("ray", {})["address"] = value
            origins[("ray", "address")] = source
        elif name in known:
            merged.setdefault("supervisor", {})[known[name]] = value
            origins[("supervisor", known[name])] = source
        else:
            raise ConfigError(
                f'unknown key "{name}" in the environment (known: {", ".join(sorted(env_variables()))})',
                key=name,
                source="environment",
            )
        used.append(source)
    return used


def _require_llm_variable(name: str, value: str) -> None:
    """``CONFIG_INVALID`` for a ``SUBAGENTS_LLM_*`` name the llm program does not read (a typo that was taken in
    silence), or a value it would refuse at its first turn (``SUBAGENTS_LLM_TIMEOUT_S=soon``), as for any setting."""
    from subagents.worker.programs.llm import ENVIRONMENT, LlmProgram  # only when such a name is set: no light import

    if name not in ENVIRONMENT:
        raise ConfigError(f'unknown key "{name}" in the environment (the llm program reads: {", ".join(ENVIRONMENT)})',
                          key=name, source="environment")
    try:
        LlmProgram.from_environment({name: value})
    except ValueError as exc:
        raise ConfigError(str(exc), key=name, source="environment") from None


def llm_settings(llm_environment: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The llm program's settings as its workers will read them from ``llm_environment`` (``LoadedConfig.llm``),
    by field name, and where each came from (``"env <NAME>"`` or ``"default"``): for ``config show``."""
    from subagents.worker.programs.llm import ENVIRONMENT, LlmProgram

    program = LlmProgram.from_environment(llm_environment)
    values, sources = {}, {}
    for name in ENVIRONMENT:
        key = name.removeprefix(ENV_LLM_PREFIX).lower()
        values[key] = getattr(program, key)
        sources[key] = f"env {name}" if name in llm_environment else "default"
    return values, sources


def _validate(merged: dict[str, Any], origins: dict[tuple[str, ...], str]) -> DeploymentConfig:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in merged.items()}
    supervisor = data.get("supervisor")
    if isinstance(supervisor, dict) and supervisor.get("pool_size") == "auto":
        del supervisor["pool_size"]  # absent means the CPU count (SupervisorConfig's default)
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, origins) from None


def _config_error(exc: ValidationError, origins: dict[tuple[str, ...], str]) -> ConfigError:
    loc, kind, problem = first_problem(exc)
    if loc[:2] == ("supervisor", "ray"):
        loc = loc[1:]  # the [ray] table, as the file names it
    source = origins.get(loc[:2]) or origins.get(loc[:1]) or "the merged configuration"
    return ConfigError.refused(loc, kind, problem, source)


# -- rendering ------------------------------------------------------------------


def dump_toml(config: DeploymentConfig) -> str:
    """The configuration as a TOML deployment file (loads back to the same config)."""
    lines = [] if config.providers else ["providers = []", ""]  # top-level keys come before any table
    lines += ["[store]", f"path = {toml_value(config.store.path)}", "", "[supervisor]"]
    for key, value in config.supervisor.model_dump(exclude=set(_NESTED)).items():
        lines.append(f"{key} = {toml_value(value)}")
    lines += ["", "[ray]"]
    for key, value in config.supervisor.ray.model_dump().items():
        lines.append(f"{key} = {toml_value(value)}")
    for provider in config.providers:
        lines += ["", "[[providers]]"]
        for key, value in provider.model_dump().items():
            lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


# what a TOML basic string holds only as an escape: its quote, the backslash, every control character (TOML
# refuses them, tab aside), and the line breaks str.splitlines splits at beyond those (U+2028, U+2029)
_ESCAPED = re.compile(r'["\\\x00-\x1f\x7f-\x9f\u2028\u2029]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_escaped(text: str) -> str:
    """``text`` as the inside of a TOML basic string, and fit for a comment: on one line whoever splits it
    (a dumped deployment file must read back to the values it was dumped from)."""
    return _ESCAPED.sub(lambda m: _SHORT_ESCAPES.get(m.group(), f"\\u{ord(m.group()):04X}"), text)


def toml_value(value: Any) -> str:
    """One value as TOML, on one line."""
    if value is None:
        return '"none"'  # the one setting that may be unset (max_depth) reads "none" back as None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f'"{toml_escaped(value)}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__} as TOML")
