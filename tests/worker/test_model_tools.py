"""Model-facing tool texts, compared to the reference's exact strings (docs/behaviour.md)."""

from __future__ import annotations

import anyio
import pytest

from subagents.worker.context import RunResult
from subagents.worker.listing import render_rows
from subagents.worker.model_tools import _interrupt_agent, _list_agents, _send_message, foreground_failure_text


def test_empty_listing_reads_no_subagents() -> None:
    assert render_rows([]) == "(no subagents)"


def test_child_and_diagnostic_rows() -> None:
    rows = [
        {"kind": "child", "id": "c1", "label": "research", "status": "idle", "mode": "continuable"},
        {"kind": "diagnostic", "id": "c2", "reason": "corrupt"},
    ]
    assert render_rows(rows) == "c1 [idle] — research\nc2 [diagnostic: corrupt]"


def test_descendant_rows_name_parent_and_depth_after_the_bracket() -> None:
    rows = [
        {"kind": "child", "id": "c1", "label": "a", "status": "running", "parent_id": "r", "depth": 1},
        {"kind": "diagnostic", "id": "g1", "reason": "unavailable", "parent_id": "c1", "depth": 2},
    ]
    assert render_rows(rows, descendants=True) == "c1 [running] parent=r depth=1 — a\ng1 [diagnostic: unavailable] parent=c1 depth=2"


@pytest.mark.parametrize(
    ("reason", "text"),
    [
        ("aborted", "subagent run was cancelled"),
        ("error", "subagent run failed"),
        ("max-tokens", "subagent run hit its token limit before finishing"),
        ("refusal", "subagent declined the task"),
        ("budget-exhausted", "subagent run ended abnormally (budget-exhausted)"),
    ],
)
def test_foreground_failure_texts(reason: str, text: str) -> None:
    assert foreground_failure_text(RunResult("x", "", None, reason, None)) == text
    assert foreground_failure_text(RunResult("x", "part", None, reason, "why")) == f"{text}\nDiagnostic: why\nPartial output before the run ended:\npart"


@pytest.mark.parametrize(
    ("tool", "name"),
    [(_list_agents, "list_agents"), (_send_message, "send_message"), (_interrupt_agent, "interrupt_agent")],
)
def test_tools_without_a_calling_agent(tool, name) -> None:
    outcome = anyio.run(tool, None, {})
    assert outcome.is_error
    assert outcome.text == f"{name} requires a calling agent (exec.agent was undefined)"
