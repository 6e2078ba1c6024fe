"""The pytest plugin of subagents, loaded through the ``pytest11`` entry point (no conftest needed).

Fixtures: ``subagents_store`` (a fresh store per test), ``shared_subagents_store``
(one store for the whole run, shared by every xdist worker), ``supervisor`` (an
open ``Supervisor`` on the per-test store, configured by the ``subagents``
marker; async, under anyio's pytest plugin), ``subagents_root`` (an open root
on it) and ``subagents_chaos`` (``Chaos`` seeded from ``--subagents-chaos-seed``).
The plugin is loaded into every pytest run of an environment where subagents
is installed, so loading it does nothing but register the marker and the
option: the supervisor is imported by the fixtures that use it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

import pytest
from filelock import FileLock

from .chaos import Chaos, PidSource

if TYPE_CHECKING:
    from subagents.supervisor import AgentRef, Supervisor

__all__ = [
    "SHARED_STORE_NAME",
    "supervisor_options",
    "subagents_store",
    "shared_subagents_store",
    "supervisor",
    "subagents_root",
    "subagents_chaos",
]

SHARED_STORE_NAME = "subagents-shared-store"
# what a test supervisor runs with unless its marker says otherwise: two workers (the
# machine's CPU count is the library default, too many for parallel test processes)
DEFAULT_OPTIONS: dict[str, Any] = {"pool_size": 2}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("subagents")
    group.addoption("--subagents-chaos-seed", type=int, default=None, dest="subagents_chaos_seed",
                    help="seed of the subagents_chaos fixture (printed by every chaos run; replays its draws)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "subagents(**options): options of the `supervisor` fixture: SupervisorConfig fields "
        "(pool_size=2, durability='batched', ...) and `builtins=False` to register no provider",
    )


def supervisor_options(node: pytest.Item) -> dict[str, Any]:
    """The ``subagents`` marker options of a test: module, class, then function markers, the closest winning."""
    options = dict(DEFAULT_OPTIONS)
    for marker in reversed(list(node.iter_markers("subagents"))):
        if marker.args:
            raise pytest.UsageError("@pytest.mark.subagents takes keyword options only")
        options.update(marker.kwargs)
    return options


@pytest.fixture
def subagents_store(tmp_path: Path) -> Path:
    """The folder of a fresh, empty store owned by this test."""
    from subagents.store import Store

    path = tmp_path / "subagents-store"
    Store(path)
    return path


@pytest.fixture(scope="session")
def shared_subagents_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ONE store for the whole run: every test and every xdist worker gets the same folder.

    Under xdist it lives in the run's common temp folder (the parent of each worker's
    own), created once under a file lock; nothing removes it when a worker ends, so it
    outlives them all (pytest prunes old temp folders on later runs).
    """
    from subagents.store import Store

    base = tmp_path_factory.getbasetemp()
    folder = base.parent if hasattr(request.config, "workerinput") else base
    path = folder / SHARED_STORE_NAME
    with FileLock(str(folder / f"{SHARED_STORE_NAME}.lock")):
        Store(path)
    return path


@pytest.fixture
async def supervisor(anyio_backend: Any, subagents_store: Path, request: pytest.FixtureRequest) -> AsyncIterator["Supervisor"]:
    """An open ``Supervisor`` on ``subagents_store`` with the built-in ``script`` and ``echo`` providers.

    Configured by ``@pytest.mark.subagents(...)``; closed (workers stopped, leases
    released) after the test. Skipped on a backend other than asyncio: with trio
    installed, anyio's plugin runs each test on both unless the project defines
    ``anyio_backend``, and a supervisor refuses trio.
    """
    backend = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]
    if backend != "asyncio":
        pytest.skip(f"the supervisor runs on asyncio, not {backend}: define an anyio_backend fixture returning "
                    '"asyncio" to run the test on asyncio alone')
    from subagents.supervisor import Capabilities, Provider, Supervisor, SupervisorConfig

    options = supervisor_options(request.node)
    builtins = bool(options.pop("builtins", True))
    async with Supervisor.open(store=subagents_store, config=SupervisorConfig(**options)) as sup:
        if builtins:
            for name in ("script", "echo"):
                sup.register_provider(Provider(name=name, program=name, capabilities=Capabilities.all(), continuable=True))
        yield sup


@pytest.fixture
async def subagents_root(anyio_backend: Any, supervisor: "Supervisor", request: pytest.FixtureRequest) -> "AgentRef":
    """An open top-level agent on ``supervisor``, labelled with the test's name."""
    return await supervisor.open_root(label=request.node.name)


@pytest.fixture
def subagents_chaos(request: pytest.FixtureRequest) -> Iterator[Callable[..., Chaos]]:
    """A factory of ``Chaos`` contexts seeded for this test; the seed and every action are reported on failure.

    ``with subagents_chaos({"worker": workers_of(sup)}): ...``. The n-th chaos of a test
    gets seed + n, so ``--subagents-chaos-seed`` replays them all.
    """
    option = request.config.getoption("subagents_chaos_seed")
    seed = random.SystemRandom().randrange(1 << 32) if option is None else int(option)
    request.node.user_properties.append(("subagents_chaos_seed", seed))
    made: list[Chaos] = []

    def make(targets: dict[str, PidSource] | PidSource, **options: Any) -> Chaos:
        chaos = Chaos(targets, seed=seed + len(made), **options)
        made.append(chaos)
        return chaos

    yield make
    text = "\n".join([f"replay: pytest --subagents-chaos-seed={seed} {request.node.nodeid}", *(c.summary() for c in made)])
    request.node.add_report_section("teardown", "subagents chaos", text)
