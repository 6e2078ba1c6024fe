"""The worker side on a Ray cluster: the transport to the store service (and, next, the worker actor).

Imported only when a supervisor runs with ``pool = "ray"`` (it imports Ray).
``service_transport(handle)`` turns the store service's actor handle into the
blocking ``ServiceCall`` that ``ServiceSessions`` takes: a Ray actor call
whose reply is awaited by the writer's sender thread, never on the event loop.
"""

from __future__ import annotations

from typing import Any

import ray

from .service_writer import ServiceCall

__all__ = ["service_transport", "SERVICE_CALL_TIMEOUT_S"]

# a store call that takes longer is a store host in trouble: the turn fails (its
# writer breaks) instead of hanging; fsyncs take milliseconds
SERVICE_CALL_TIMEOUT_S = 60.0


def service_transport(handle: Any) -> ServiceCall:
    def call(method: str, **kwargs: Any) -> dict[str, Any]:
        return ray.get(getattr(handle, method).remote(**kwargs), timeout=SERVICE_CALL_TIMEOUT_S)

    return call
