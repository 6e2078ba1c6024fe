"""The supervisor's error classes: each code and text, and the trip across the worker pipe."""

from __future__ import annotations

import pickle

import pytest

from subagents.store.errors import SubagentError, from_wire
from subagents.supervisor import errors as E

CASES = [
    (E.UnauthorizedError.not_live_parent("c1"), "UNAUTHORIZED", 'subagent "c1" delivery requires the exact live parent agent'),
    (E.UnauthorizedError.other_parent("c1"), "UNAUTHORIZED", 'subagent "c1" belongs to another parent session'),
    (E.UnauthorizedError.cannot_report("c1"), "UNAUTHORIZED", 'agent "c1" is not a live continuable subagent and cannot report'),
    (E.UnauthorizedError.not_live_ancestor("c1"), "UNAUTHORIZED", 'interrupting "c1" requires the exact live ancestor agent'),
    (E.UnauthorizedError.self_interrupt("c1"), "UNAUTHORIZED", 'agent "c1" cannot interrupt itself'),
    (E.UnauthorizedError.not_descendant("c1", "p1"), "UNAUTHORIZED", 'subagent "c1" is not a live descendant of agent "p1"'),
    (E.UnauthorizedError.teardown_needs_parent(), "UNAUTHORIZED", "selected child teardown requires the exact live parent agent"),
    (E.UnauthorizedError.not_direct_child("c1", "p1"), "UNAUTHORIZED", 'subagent "c1" is not a direct child of agent "p1"'),
    (E.UnauthorizedError.not_own_root("r1"), "UNAUTHORIZED", 'agent "r1" is not a root opened by this supervisor'),
    (E.NotResumableError.unavailable("c1"), "NOT_RESUMABLE", 'subagent "c1" is unavailable'),
    (E.NotResumableError.held_elsewhere("c1"), "NOT_RESUMABLE", 'subagent "c1" is unavailable: it is active in another supervisor'),
    (
        E.NotResumableError.no_state("c1"), "NOT_RESUMABLE",
        'subagent "c1" has no supported continuation state and cannot be resumed; do not retry send_message with this id',
    ),
    (E.ActivationClosingError.parent_disposing("p1"), "ACTIVATION_CLOSING", 'subagent parent "p1" is being disposed; the child was not established'),
    (E.ActivationClosingError.message_refused("c1"), "ACTIVATION_CLOSING", 'subagent "c1" activation is being disposed; the message was not accepted'),
    (E.ActivationClosingError.report_refused("c1"), "ACTIVATION_CLOSING", 'subagent "c1" activation is being disposed; the report was not delivered'),
    (E.DrainingError(), "DRAINING", "continuable subagents are draining; the operation was not admitted"),
    (E.DrainingError("r1"), "DRAINING", 'continuable subagents below parent "r1" are draining; the operation was not admitted'),
    (E.ParentUnavailableError(), "PARENT_UNAVAILABLE", "direct parent is not live; report was not delivered"),
    (E.DuplicateChildError("c1"), "DUPLICATE_CHILD", 'subagent "c1" already exists'),
    (E.NoParentError("p1"), "NO_PARENT", 'parent session "p1" does not exist'),
    (E.SupervisorClosedError(), "SUPERVISOR_CLOSED", "the supervisor is closed"),
    (E.RpcError.unknown("fly"), "UNKNOWN_RPC", "unknown rpc 'fly'"),
    (E.RpcError.no_run("r9"), "NO_RUN", 'no background subagent "r9" was started by this turn'),
    (E.RpcError.turn_gone(), "TURN_GONE", "the calling turn is gone"),
    (E.WorkerHandshakeError(42), "WORKER_HANDSHAKE", "worker 42 did not announce itself"),
    (E.WorkerStartError.exited(42, 1), "WORKER_START_FAILED", "worker process 42 exited with code 1 before it was ready"),
    (E.WorkerStartError.exited(42, -9), "WORKER_START_FAILED", "worker process 42 killed by signal SIGKILL before it was ready"),
    (
        E.WorkerStartError.not_ready(42, 30.0), "WORKER_START_FAILED",
        "worker process 42 was not ready within 30s (worker_ready_timeout_s) and was killed",
    ),
    (
        E.WorkerStartError.not_launched("forkserver", EOFError("unexpected EOF")), "WORKER_START_FAILED",
        "a worker process could not be started (start method forkserver): EOFError: unexpected EOF",
    ),
    (E.no_provider("x"), "NO_PROVIDER", 'no subagent provider registered for "x"'),
    (E.program_missing("c1", "x"), "NO_PROVIDER", 'subagent "c1" needs provider "x" to run its program'),
    (
        E.not_continuable("x"), "UNSUPPORTED_CAPABILITY",
        'subagent provider "x" does not support continuable children (no prepareContinuable capability)',
    ),
]


@pytest.mark.parametrize("error, code, text", CASES, ids=[f"{c}:{t[:30]}" for _, c, t in CASES])
def test_code_and_text(error, code, text):
    assert isinstance(error, SubagentError)
    assert (error.code, str(error)) == (code, text)


@pytest.mark.parametrize("error", [case[0] for case in CASES[:6]])
def test_crosses_the_pipe_as_the_same_class(error):
    for rebuilt in (from_wire(error.to_wire()), pickle.loads(pickle.dumps(error))):
        assert (type(rebuilt), rebuilt.code, str(rebuilt), rebuilt.fields) == (type(error), error.code, str(error), error.fields)


def test_who_is_to_blame_is_also_a_builtin():
    assert isinstance(E.UnauthorizedError.self_interrupt("c1"), PermissionError)
    assert isinstance(E.NoParentError("p1"), LookupError)
    assert isinstance(E.InvalidRequestError("bad"), ValueError)
