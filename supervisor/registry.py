"""The provider registry: names → providers, in insertion order.

Registration fails loudly on a taken name (``DUPLICATE_PROVIDER``) and emits
``subagent/provider-added`` un-contained: a listener that raises rolls the
registration back. Unregistering stops new starts but never revokes accepted
runs or hides persisted children; it emits ``subagent/provider-removed``
with per-listener containment. A removed provider is remembered (``resolve``)
so that its continuable children can still be resumed by this supervisor:
their store names the provider, not its program. ``program_for`` says what
a child of a provider runs, for both kinds of start and for resume.
"""

from __future__ import annotations

from typing import Callable

from subagents.worker.programs import BUILTIN_PROGRAMS

from .errors import InvalidRequestError, duplicate_provider, no_provider, unsupported_capability
from .events import EventBus
from .models import Provider

__all__ = ["ProviderRegistry", "CAPABILITY_ORDER", "ProgramRef", "program_fields"]

# what a worker loads: an import path ``"module:function"``, or a callable carried by dill
ProgramRef = tuple[str | None, bytes | None]

# (request field, capability flag, name in the error), in the order a request's capabilities are checked
CAPABILITY_ORDER = (
    ("output_schema", "output_schema", "outputSchema"),
    ("max_depth", "depth_limit", "depthLimit"),
    ("tool_filter", "tool_filter", "toolFilter"),
    ("persona", "persona", "persona"),
    ("sandbox", "sandbox_mode", "sandboxMode"),
    ("budget", "run_budget", "runBudget"),
)


def program_fields(provider: Provider) -> ProgramRef:
    """A program reference travels as its import path; a bare callable travels by dill, with the globals
    it refers to (``recurse``): modules by name, functions and values by value. Without them a program
    written in the user's script ran in a worker whose ``__main__`` is not that script, and every name
    it took from there (``json``, a constant, a helper) was a ``NameError``. ``INVALID_REQUEST`` when
    it refers to something no pickle carries (a lock, an open file)."""
    if isinstance(provider.program, str):
        return provider.program, None
    import dill  # here, not at the top: only a callable program needs it, and it costs ~35 ms to import

    try:
        return None, dill.dumps(provider.program, recurse=True)
    except Exception as exc:  # dill raises what the refused object's own pickling raised
        raise InvalidRequestError(f'the program of provider "{provider.name}" cannot be carried to a worker (by dill, '
                                  f"with the globals it refers to): {type(exc).__name__}: {exc}", field="program") from None


class ProviderRegistry:
    def __init__(self, events: EventBus) -> None:
        self._events = events
        self._providers: dict[str, Provider] = {}
        self._removed: dict[str, Provider] = {}  # the last provider unregistered under each name

    def register(self, provider: Provider) -> Callable[[], None]:
        if provider.name in self._providers:
            raise duplicate_provider(provider.name)
        program_fields(provider)  # a program no worker can be sent is refused now, not at each start
        self._providers[provider.name] = provider
        try:
            self._events.emit_strict("subagent/provider-added", {"provider": provider.name})
        except BaseException:
            self._providers.pop(provider.name, None)
            raise

        def unregister() -> None:
            if self._providers.get(provider.name) is provider:
                del self._providers[provider.name]
                self._removed[provider.name] = provider
                self._events.emit("subagent/provider-removed", {"provider": provider.name})

        return unregister

    def get(self, name: str) -> Provider | None:
        return self._providers.get(name)

    def resolve(self, name: str) -> Provider | None:
        """The registered provider, else the one last unregistered under ``name`` (for resume only)."""
        return self._providers.get(name) or self._removed.get(name)

    def program_for(self, name: str, *, recorded: str | None = None) -> ProgramRef | None:
        """What a child of provider ``name`` runs, first found of: its provider's program (even if
        the provider was unregistered since), the built-in program of that name, the program
        reference its descriptor ``recorded``; None if none exists."""
        provider = self.resolve(name)
        if provider is not None:
            return program_fields(provider)
        if name in BUILTIN_PROGRAMS:
            return name, None
        if recorded is not None:
            return recorded, None
        return None

    def require(self, name: str) -> Provider:
        provider = self._providers.get(name)
        if provider is None:
            raise no_provider(name)
        return provider

    def names(self) -> list[str]:
        return list(self._providers)

    @staticmethod
    def check_capabilities(provider: Provider, requested: dict[str, object]) -> None:
        """Reject the first requested capability the provider lacks, in ``CAPABILITY_ORDER``."""
        for field, flag, public in CAPABILITY_ORDER:
            if requested.get(field) is not None and not getattr(provider.capabilities, flag):
                raise unsupported_capability(provider.name, public)
