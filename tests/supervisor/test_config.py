"""The configuration loader: embedded default, deployment file, environment; unknown keys are errors."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from subagents.supervisor import Capabilities, SupervisorConfig
from subagents.supervisor.config import RayConfig
from subagents.supervisor.config_env import SUPERVISOR_SETTINGS
from subagents.supervisor.config_loader import (
    DEFAULT_SOURCE,
    DEFAULT_TOML,
    ConfigError,
    DeploymentConfig,
    dump_toml,
    env_variables,
    load_config,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write(tmp_path: Path, text: str, name: str = "deploy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_embedded_default_is_configs_default_toml() -> None:
    """The text embedded in the module and configs/default.toml are the same bytes."""
    assert DEFAULT_TOML == (CONFIGS / "default.toml").read_text()


def test_default_names_only_known_supervisor_fields() -> None:
    assert set(tomllib.loads(DEFAULT_TOML)["supervisor"]) <= set(SupervisorConfig.model_fields)


def test_default_values() -> None:
    loaded = load_config(env={})
    cfg = loaded.config
    assert loaded.sources == (DEFAULT_SOURCE,)
    assert cfg.store.path == "./.subagents"
    assert cfg.supervisor.pool_size == (os.cpu_count() or 1)  # "auto"
    assert (cfg.supervisor.start_method, cfg.supervisor.durability, cfg.supervisor.lease_ttl_s) == ("forkserver", "batched", 5.0)
    assert [p.name for p in cfg.providers] == ["echo", "script"]
    assert cfg.providers[1].to_provider().capabilities == Capabilities.all()
    assert cfg.providers[0].to_provider().capabilities == Capabilities()


def test_stress_config_loads() -> None:
    cfg = load_config(CONFIGS / "stress.toml", env={}).config
    assert cfg.supervisor.pool_size == 8 and cfg.supervisor.durability == "strict"
    assert cfg.supervisor.start_method == "forkserver"  # kept from the default
    assert any(p.continuable for p in cfg.providers)


def test_file_overrides_key_by_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[supervisor]\npool_size = 3\n\n[store]\npath = "/var/st"\n')
    loaded = load_config(path, env={})
    assert loaded.config.supervisor.pool_size == 3 and loaded.config.supervisor.durability == "batched"
    assert loaded.config.store.path == "/var/st"
    assert loaded.sources == (DEFAULT_SOURCE, str(path))


def test_file_providers_replace_the_default_list(tmp_path: Path) -> None:
    path = write(tmp_path, '[[providers]]\nname = "mine"\nprogram = "pkg.mod:run"\ncapabilities = ["persona", "run_budget"]\ncontinuable = true\n')
    providers = load_config(path, env={}).config.providers
    assert [p.name for p in providers] == ["mine"]
    provider = providers[0].to_provider()
    assert provider.continuable and provider.capabilities == Capabilities(persona=True, run_budget=True)


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[supervisor]\npool_size = 3\nlease_ttl_s = 9\n")
    env = {"SUBAGENTS_POOL_SIZE": "1", "SUBAGENTS_STORE": "/tmp/x", "SUBAGENTS_START_METHOD": "spawn",
           "SUBAGENTS_DURABILITY": "none", "SUBAGENTS_LEASE_TTL_S": "2.5", "OTHER": "ignored"}
    loaded = load_config(path, env=env)
    sup = loaded.config.supervisor
    assert (sup.pool_size, sup.start_method, sup.durability, sup.lease_ttl_s) == (1, "spawn", "none", 2.5)
    assert loaded.config.store.path == "/tmp/x"
    assert "environment variable SUBAGENTS_POOL_SIZE" in loaded.sources


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[supervisor]\npool_size = 5\n")
    assert load_config(env={"SUBAGENTS_CONFIG": str(path)}).config.supervisor.pool_size == 5


def test_pool_size_auto_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[supervisor]\npool_size = 3\n")
    assert load_config(path, env={"SUBAGENTS_POOL_SIZE": "auto"}).config.supervisor.pool_size == (os.cpu_count() or 1)


@pytest.mark.parametrize(
    "text, key",
    [
        ("[supervisor]\npool_sise = 2\n", "supervisor.pool_sise"),
        ("[store]\nroot = 'x'\n", "store.root"),
        ("colour = 'blue'\n", "colour"),
        ("[[providers]]\nname = 'a'\nprogram = 'echo'\nmodel = 'x'\n", "providers[0].model"),
    ],
)
def test_unknown_key_in_file_names_key_and_file(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert caught.value.code == "CONFIG_INVALID"
    assert f'unknown key "{key}"' in caught.value.message and str(path) in caught.value.message


def test_unknown_environment_variable() -> None:
    with pytest.raises(ConfigError, match='unknown key "SUBAGENTS_POOLSIZE" in the environment'):
        load_config(env={"SUBAGENTS_POOLSIZE": "2"})


def test_an_unknown_llm_environment_variable_is_refused_and_the_known_ones_pass() -> None:
    """Found by a docs probe: every ``SUBAGENTS_LLM_*`` name was passed over (the llm program reads them where it
    runs), so a typo such as ``SUBAGENTS_LLM_MODLE`` was taken without a word, against "unknown names are errors"."""
    with pytest.raises(ConfigError, match='unknown key "SUBAGENTS_LLM_MODLE" in the environment') as caught:
        load_config(env={"SUBAGENTS_LLM_MODLE": "m"})
    assert "SUBAGENTS_LLM_MODEL" in caught.value.message
    load_config(env={"SUBAGENTS_LLM_MODEL": "m", "SUBAGENTS_LLM_BASE_URL": "http://127.0.0.1:1/v1", "SUBAGENTS_LLM_MAX_STEPS": "4",
                     "SUBAGENTS_LLM_TIMEOUT_S": "5", "SUBAGENTS_LLM_MAX_RETRIES": "1", "SUBAGENTS_LLM_API_KEY_ENV": "KEY"})


def test_bad_value_names_its_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'"supervisor.pool_size" in environment variable SUBAGENTS_POOL_SIZE'):
        load_config(env={"SUBAGENTS_POOL_SIZE": "many"})
    path = write(tmp_path, "[supervisor]\ndurability = 'sometimes'\n")
    with pytest.raises(ConfigError, match=rf'"supervisor.durability" in {path}'):
        load_config(path, env={})
    path = write(tmp_path, "[[providers]]\nname = 'a'\nprogram = 'echo'\ncapabilities = ['flying']\n")
    with pytest.raises(ConfigError, match=r'unknown capability "flying"'):
        load_config(path, env={})


def test_duplicate_provider_names_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "[[providers]]\nname = 'a'\nprogram = 'echo'\n[[providers]]\nname = 'a'\nprogram = 'script'\n")
    with pytest.raises(ConfigError, match='provider "a" is defined twice'):
        load_config(path, env={})


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(write(tmp_path, "[supervisor\n"), env={})
    with pytest.raises(ConfigError, match='"supervisor" must be a table'):
        load_config(write(tmp_path, "supervisor = 3\n"), env={})


def test_dump_toml_round_trips() -> None:
    cfg = load_config(CONFIGS / "stress.toml", env={}).config
    assert DeploymentConfig.model_validate(tomllib.loads(dump_toml(cfg))) == cfg
    empty = cfg.model_copy(update={"providers": []})
    assert DeploymentConfig.model_validate(tomllib.loads(dump_toml(empty))) == empty


def test_env_variables_cover_every_supervisor_field() -> None:
    """Every scalar supervisor field has its variable; the [ray] table is a table, with SUBAGENTS_RAY_ADDRESS."""
    names = env_variables()
    scalars = set(SupervisorConfig.model_fields) - {"ray"}
    assert {f"SUBAGENTS_{f.upper()}" for f in scalars} <= set(names)
    # the list --help prints is written apart from the model (no pydantic for --help): the same fields, in order
    assert SUPERVISOR_SETTINGS == tuple(f for f in SupervisorConfig.model_fields if f != "ray")
    assert "SUBAGENTS_RAY" not in names
    assert names["SUBAGENTS_STORE"] == "store.path"
    assert names["SUBAGENTS_RAY_ADDRESS"] == "ray.address"


def test_pool_and_ray_defaults() -> None:
    cfg = load_config(env={}).config.supervisor
    assert cfg.pool == "local"
    assert cfg.ray == RayConfig(address="auto", namespace="subagents", worker_num_cpus=1.0, store_resource="subagents_store")


def test_ray_table_in_a_file(tmp_path: Path) -> None:
    """The file's [ray] table fills SupervisorConfig.ray key by key; the rest keeps its default."""
    path = write(tmp_path, '[supervisor]\npool = "ray"\n\n[ray]\naddress = "10.0.0.5:6379"\nworker_num_cpus = 0.25\n')
    cfg = load_config(path, env={}).config.supervisor
    assert cfg.pool == "ray"
    assert cfg.ray.address == "10.0.0.5:6379" and cfg.ray.worker_num_cpus == 0.25
    assert cfg.ray.namespace == "subagents" and cfg.ray.store_resource == "subagents_store"


def test_pool_and_ray_address_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, '[ray]\naddress = "10.0.0.5:6379"\n')
    loaded = load_config(path, env={"SUBAGENTS_POOL": "ray", "SUBAGENTS_RAY_ADDRESS": "ray://head:10001"})
    assert loaded.config.supervisor.pool == "ray"
    assert loaded.config.supervisor.ray.address == "ray://head:10001"
    assert "environment variable SUBAGENTS_RAY_ADDRESS" in loaded.sources


def test_ray_table_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match='unknown key "ray.adress"') as info:
        load_config(write(tmp_path, '[ray]\nadress = "x"\n'), env={})
    assert info.value.code == "CONFIG_INVALID"
    with pytest.raises(ConfigError, match='invalid value for "ray.worker_num_cpus" in .*deploy.toml'):
        load_config(write(tmp_path, "[ray]\nworker_num_cpus = 0\n"), env={})
    with pytest.raises(ConfigError, match='invalid value for "supervisor.pool"'):
        load_config(env={"SUBAGENTS_POOL": "dask"})
    with pytest.raises(ConfigError, match='unknown key "SUBAGENTS_RAY"'):
        load_config(env={"SUBAGENTS_RAY": "x"})


def test_dump_toml_round_trips_the_ray_table(tmp_path: Path) -> None:
    path = write(tmp_path, '[supervisor]\npool = "ray"\n\n[ray]\nnamespace = "team-a"\n')
    cfg = load_config(path, env={}).config
    text = dump_toml(cfg)
    assert "[ray]" in text and 'namespace = "team-a"' in text
    assert DeploymentConfig.model_validate(tomllib.loads(text)) == cfg
    assert load_config(write(tmp_path, text, "dumped.toml"), env={}).config == cfg


def test_llm_config_loads_and_leaves_llm_variables_to_the_program() -> None:
    """configs/llm.toml registers the llm provider; SUBAGENTS_LLM_* are the program's, not config errors."""
    cfg = load_config(CONFIGS / "llm.toml", env={"SUBAGENTS_LLM_MODEL": "m", "SUBAGENTS_LLM_BASE_URL": "http://127.0.0.1:1"}).config
    assert cfg.supervisor.turns_per_worker == 8
    assert [(p.name, p.program, p.continuable) for p in cfg.providers] == [("llm", "llm", True)]


def test_max_record_bytes_is_a_bounded_supervisor_key(tmp_path: Path) -> None:
    """Issue #14: the record size limit is configurable, never above the format's ceiling."""
    from subagents.store import MAX_RECORD_BYTES

    assert load_config(env={}).config.supervisor.max_record_bytes == 16 * 1024 * 1024
    path = write(tmp_path, "[supervisor]\nmax_record_bytes = 65536\n")
    assert load_config(path, env={}).config.supervisor.max_record_bytes == 65536
    path = write(tmp_path, f"[supervisor]\nmax_record_bytes = {MAX_RECORD_BYTES + 1}\n")
    with pytest.raises(ConfigError, match="max_record_bytes"):
        load_config(path, env={})


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: SupervisorConfig(pool_size=0), 'invalid value for "pool_size" in SupervisorConfig: Input should be greater than or equal to 1'),
        (lambda: SupervisorConfig(lease_ttl_s=float("inf")), 'invalid value for "lease_ttl_s" in SupervisorConfig: Input should be a finite number'),
        (lambda: SupervisorConfig(durability="sometimes"), 'invalid value for "durability" in SupervisorConfig: Input should be \'strict\', \'batched\' or \'none\''),
        (lambda: SupervisorConfig(pool_sise=2), 'unknown key "pool_sise" in SupervisorConfig'),
        (lambda: SupervisorConfig(ray={"worker_num_cpus": 0}), 'invalid value for "ray.worker_num_cpus" in SupervisorConfig: Input should be greater than 0'),
        (lambda: RayConfig(address=""), 'invalid value for "address" in RayConfig: String should have at least 1 character'),
        # found by a probe: read as 1 and 1.0 (pydantic's lax numbers take a bool)
        (lambda: SupervisorConfig(pool_size=True), 'invalid value for "pool_size" in SupervisorConfig: a number, not a boolean'),
        (lambda: SupervisorConfig(ray={"worker_num_cpus": True}), 'invalid value for "ray.worker_num_cpus" in SupervisorConfig: a number, not a boolean'),
    ],
)
def test_a_config_built_in_code_with_a_bad_value_is_config_invalid(build, message) -> None:
    """Found by an API probe: ``SupervisorConfig(pool_size=0)`` raised pydantic's ``ValidationError`` (no ``code``),
    while the same value in a file or the environment is ``CONFIG_INVALID``. Still a ``ValueError``."""
    with pytest.raises(ConfigError) as info:
        build()
    assert (info.value.code, info.value.message) == ("CONFIG_INVALID", message)
    assert isinstance(info.value, ValueError)


def test_a_nested_bad_value_in_a_layer_still_names_its_key_and_source(tmp_path: Path) -> None:
    """The loader's messages keep the dotted key and the layer, whatever the models raise inside."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[supervisor]\npool_size = 0\n"), env={})
    assert info.value.message.startswith('invalid value for "supervisor.pool_size" in ')
    assert info.value.message.endswith("deploy.toml: Input should be greater than or equal to 1")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[ray]\nworker_num_cpus = 0\n"), env={})
    assert info.value.message.startswith('invalid value for "ray.worker_num_cpus" in ')
    assert info.value.message.endswith("deploy.toml: Input should be greater than 0")


@pytest.mark.parametrize(("fields", "problem"), [
    ({"worker_num_cpus": 1e-9}, "Ray counts a CPU to 4 decimal places"),
    ({"worker_num_cpus": 0.00015}, "Ray counts a CPU to 4 decimal places"),
    ({"store_resource": "CPU"}, "one of Ray's own resources"),
    ({"store_resource": "memory"}, "one of Ray's own resources"),
])
def test_ray_values_that_ray_would_refuse_are_config_errors(fields: dict, problem: str) -> None:
    """Ray refused these only as the pool started, with a raw ValueError inside a task group (the CLI
    said ``INTERNAL`` and printed a traceback); they are ``CONFIG_INVALID`` where the value is given."""
    with pytest.raises(ConfigError) as caught:
        RayConfig(**fields)
    assert caught.value.code == "CONFIG_INVALID" and problem in str(caught.value)
    assert RayConfig(worker_num_cpus=0.0001, store_resource="my_store").worker_num_cpus == 0.0001
