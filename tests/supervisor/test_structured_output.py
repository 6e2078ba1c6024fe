"""Structured output: validated against the request's schema; invalid or missing output ends ``error``."""

from __future__ import annotations

import json

import anyio
import pytest

from subagents.store import SubagentError, read_header
from subagents.supervisor import SubagentRequest

from ..conftest import DEADLINE_S, last_turn_end, open_supervisor

pytestmark = pytest.mark.anyio

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "why": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


async def run_with_schema(sup, provider, prompt, schema=SCHEMA):
    root = await sup.open_root()
    run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt, output_schema=schema))
    with anyio.fail_after(DEADLINE_S):
        result = await run.result()
    await run.dispose()
    return run, result


async def test_valid_structured_result(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        _, result = await run_with_schema(sup, "script", json.dumps([{"structured": {"answer": 42, "why": "because"}}]))
        assert result.stop_reason == "completed"
        assert result.structured == {"answer": 42, "why": "because"}
        assert json.loads(result.output) == {"answer": 42, "why": "because"}


async def test_structured_parsed_from_json_output(tmp_path):
    """A program that only returns text: the text is parsed as JSON and validated."""
    async with open_supervisor(tmp_path) as sup:
        _, result = await run_with_schema(sup, "echo", '{"answer": 7}')
        assert (result.stop_reason, result.structured) == ("completed", {"answer": 7})


async def test_invalid_structured_result(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_with_schema(sup, "script", json.dumps([{"structured": {"answer": "many"}}]))
        assert result.stop_reason == "error"
        assert result.structured is None
        assert result.diagnostic == "structured output does not match the schema: 'many' is not of type 'integer'"
        assert last_turn_end(sup.store, run.id) == {"stop_reason": "error", "diagnostic": result.diagnostic}


async def test_structured_result_missing_a_required_field(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        _, result = await run_with_schema(sup, "script", json.dumps([{"structured": {"why": "no answer"}}]))
        assert result.stop_reason == "error"
        assert "'answer' is a required property" in result.diagnostic


async def test_missing_structured_result(tmp_path):
    """Plain non-JSON text under a schema is an error, not a silent ``None``."""
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_with_schema(sup, "echo", "just words")
        assert result.stop_reason == "error"
        assert result.diagnostic == "structured output is missing: the output is not JSON"
        assert result.output == "just words"
        assert last_turn_end(sup.store, run.id)["stop_reason"] == "error"


async def test_schema_not_checked_for_a_failed_turn(tmp_path):
    """A turn that already failed keeps its own diagnostic."""
    async with open_supervisor(tmp_path) as sup:
        _, result = await run_with_schema(sup, "script", json.dumps([{"fail": "first"}]))
        assert (result.stop_reason, result.diagnostic) == ("error", "RuntimeError: first")


async def test_no_schema_no_structured(tmp_path):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        run = await sup.start("echo", SubagentRequest(parent=root, prompt='{"answer": 1}'))
        result = await run.result()
        await run.dispose()
        assert (result.stop_reason, result.structured) == ("completed", None)


# found by a probe: each of these created the child, whose worker then raised outside the program
# (SchemaError, RecursionError, an HTTP fetch of the $ref), leaving a turn listed as a crash
UNUSABLE = {
    "an unknown type": ({"type": "object", "properties": {"a": {"type": "bogus"}}}, "not a valid JSON schema"),
    "a pattern that is no regex": ({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}, "not a valid JSON schema"),
    "required that is no list": ({"type": "object", "required": "a"}, "not a valid JSON schema"),
    "a minimum that is no number": ({"type": "object", "properties": {"a": {"minimum": "x"}}}, "not a valid JSON schema"),
    "a self reference": ({"type": "object", "$ref": "#"}, "refers to itself without end"),
    "a remote reference": ({"type": "object", "$ref": "http://127.0.0.1:9/x.json"}, "refers outside itself"),
    "a reference to nothing": ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "points nowhere"),
    "a $schema that is no URI": ({"$schema": 5, "type": "object"}, "$schema must be a URI"),
}


@pytest.mark.parametrize("schema, why", UNUSABLE.values(), ids=UNUSABLE.keys())
async def test_a_schema_that_cannot_be_applied_is_refused_before_the_child_exists(tmp_path, schema, why):
    async with open_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        with pytest.raises(SubagentError) as refused:
            await sup.start("script", SubagentRequest(parent=root, prompt=json.dumps([{"structured": {"a": 1}}]), output_schema=schema))
        assert refused.value.code == "INVALID_REQUEST" and why in refused.value.message, refused.value.message
        assert await sup.list_children(root.id) == []


async def test_local_references_and_a_named_draft_are_applied(tmp_path):
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "definitions": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/definitions/n"}}}
    async with open_supervisor(tmp_path) as sup:
        _, good = await run_with_schema(sup, "script", json.dumps([{"structured": {"a": 1}}]), schema)
        _, bad = await run_with_schema(sup, "script", json.dumps([{"structured": {"a": "x"}}]), schema)
    assert (good.stop_reason, good.structured) == ("completed", {"a": 1})
    assert bad.stop_reason == "error" and "does not match the schema" in bad.diagnostic


async def test_a_cycle_only_a_value_reaches_ends_the_turn_with_an_error_not_a_crash(tmp_path):
    schema = {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}}
    async with open_supervisor(tmp_path) as sup:
        run, result = await run_with_schema(sup, "script", json.dumps([{"structured": {"a": 1}}]), schema)
        assert result.stop_reason == "error"
        assert result.diagnostic == "output_schema could not be applied: it refers to itself without end"
        [row] = await sup.list_children(read_header(sup.store, run.id).parent_session)
        assert (row.outcome, row.error_code) == ("error", None), row  # a failed turn, not "crashed"
