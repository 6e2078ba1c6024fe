"""A one-shot's ``output_schema``: checked whole when the child is requested, applied by its turn.

``schema_problem`` runs at the request's boundary (``supervisor/validation.py``), before anything
is created, so a schema that could never be applied is refused there instead of failing the turn
after the child exists: a schema its own metaschema rejects (an unknown ``type``, a ``pattern``
that is no regular expression, ``required`` that is no list), a ``$ref`` to anything outside the
schema (a turn never fetches a URL: the registry it resolves references in holds the schema
alone), a ``$ref`` that points nowhere in it, and a reference cycle that never reaches a keyword
(``{"$ref": "#"}``). ``check_structured`` is the turn's side; what still goes wrong there (a cycle
only some value reaches) ends the turn with an error that says so, never a crash of its worker.
"""

from __future__ import annotations

from typing import Any, Iterator

import jsonschema
import referencing
import referencing.exceptions
from referencing.jsonschema import DRAFT202012
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

__all__ = ["schema_problem", "check_structured"]


def _validator(schema: dict[str, Any]) -> Validator:
    """The validator of the schema's own draft (2020-12 when it names none), resolving in itself only."""
    return validator_for(schema, default=jsonschema.Draft202012Validator)(schema, registry=referencing.Registry())


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield value
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot be applied to a turn's output, or None."""
    if not isinstance(schema.get("$schema", ""), str):
        return f"its $schema must be a URI, not {type(schema['$schema']).__name__}"
    validator = _validator(schema)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"it is not a valid JSON schema: {exc.message}" + (f" (at {where})" if where else "")
    resolver = referencing.Registry().resolver_with_root(
        referencing.Resource.from_contents(schema, default_specification=DRAFT202012))
    for ref in _references(schema):
        if not ref.startswith("#"):
            return f'it refers outside itself ($ref "{ref}"): a schema may refer only within itself ("#/$defs/...")'
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            return f'its $ref "{ref}" points nowhere in it'
    try:
        validator.is_valid({})
    except RecursionError:
        return "it refers to itself without end (a $ref cycle that reaches no keyword)"
    except referencing.exceptions.Unresolvable as exc:
        return f"a reference in it does not resolve ({exc})"
    return None


def check_structured(schema: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` does not match ``schema`` (the first error), or None."""
    try:
        _validator(schema).validate(value)
    except jsonschema.ValidationError as exc:
        return f"structured output does not match the schema: {exc.message}"
    except RecursionError:
        return "output_schema could not be applied: it refers to itself without end"
    except (jsonschema.SchemaError, referencing.exceptions.Unresolvable) as exc:
        return f"output_schema could not be applied: {type(exc).__name__}: {exc}".splitlines()[0]
    return None
