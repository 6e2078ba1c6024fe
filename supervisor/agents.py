"""The live agents of one supervisor: roots it opened and children it runs.

Runtime facts the store does not hold: the runtime depth (never below the
header's), the sandbox mode captured for delegation, and which agent is the
parent of which live child. Lineage authority is still the header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LiveAgent", "LiveAgents"]


@dataclass
class LiveAgent:
    id: str
    kind: Literal["root", "child"]
    depth: int
    sandbox: str | None
    parent: str | None = None
    label: str | None = None


class LiveAgents:
    def __init__(self) -> None:
        self._agents: dict[str, LiveAgent] = {}

    def add_root(self, agent_id: str, *, label: str | None, sandbox: str | None, depth: int = 0) -> LiveAgent:
        agent = LiveAgent(agent_id, "root", depth, sandbox, None, label)
        self._agents[agent_id] = agent
        return agent

    def add_child(self, agent_id: str, *, depth: int, sandbox: str | None, parent: str) -> LiveAgent:
        agent = LiveAgent(agent_id, "child", depth, sandbox, parent)
        self._agents[agent_id] = agent
        return agent

    def get(self, agent_id: str) -> LiveAgent | None:
        return self._agents.get(agent_id)

    def remove(self, agent_id: str) -> None:
        self._agents.pop(agent_id, None)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._agents

    def roots(self) -> list[LiveAgent]:
        return [a for a in self._agents.values() if a.kind == "root"]
