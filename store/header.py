"""The session header: immutable identity and lineage of one session.

Written once at creation (``write_atomic`` with fsync, exclusive), never
changed. ``parent_session`` and ``origin`` are the authority for lineage: the
children index is derived from them. A header that breaks these rules is
refused on write (``InvalidHeaderError``) and reported corrupt on read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .errors import InvalidHeaderError, UnsupportedFormatError
from .ids import is_valid_session_id
from .records import finite_number

__all__ = ["HEADER_VERSION", "SessionHeader", "parse_header", "parent_loops"]

HEADER_VERSION = 1
# 10000-01-01T00:00:00Z: a creation time is a date a reader can print (ISO 8601's four-digit years,
# Python's datetime); a header dated after it was written by no clock, and is damage
LATEST_CREATED_AT = 253402300800.0


class SessionHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal[1] = 1
    id: str
    created_at: float
    parent_session: str | None = None
    origin: Literal["subagent"] | None = None
    delegation_depth: int = 0
    seed_length: int | None = None
    cwd: str | None = None
    label: str | None = None  # a top-level agent's label (children keep theirs in the descriptor)

    @field_validator("id", "parent_session")
    @classmethod
    def _session_id(cls, value: str | None) -> str | None:
        if value is not None and not is_valid_session_id(value):
            raise ValueError(f"invalid session id {value!r}")
        return value

    @field_validator("created_at", mode="before")
    @classmethod
    def _created_at(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("created_at must be a number of seconds")
        if not finite_number(value) or value < 0:
            raise ValueError("created_at must be a non-negative finite number")
        if value >= LATEST_CREATED_AT:
            raise ValueError("created_at must be a time before the year 10000")
        return float(value)

    @field_validator("delegation_depth", "seed_length")
    @classmethod
    def _non_negative(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError("must be a non-negative integer")
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("cwd must be an absolute path")
        return value

    def to_record(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def parse_header(data: Any, *, expected_id: str | None = None) -> SessionHeader:
    """Validate a decoded header map; raise ``InvalidHeaderError`` or ``UnsupportedFormatError``."""
    if not isinstance(data, dict):
        raise InvalidHeaderError("session header must be a map")
    version = data.get("version")
    if version != HEADER_VERSION:
        raise UnsupportedFormatError(
            f"session header version {version!r} is not supported (this build reads {HEADER_VERSION})",
            version=str(version),
        )
    try:
        header = SessionHeader.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "header"
        raise InvalidHeaderError(f"session header {where}: {first['msg']}") from None
    if expected_id is not None and header.id != expected_id:
        raise InvalidHeaderError(f'session header id "{header.id}" does not match session id "{expected_id}"')
    return header


def parent_loops(parents: Mapping[str, str | None]) -> dict[str, list[str]]:
    """Each session of ``parents`` (id → the parent its header names) that is its own ancestor, with
    its loop from itself back to itself (``["a", "b", "a"]``).

    Such a session descends from no top-level session: no listing reaches it and no gc collects
    it. Creation refuses a parent the store does not hold, so only headers edited by hand loop.
    One walk per session, none repeated: linear in the number of sessions.
    """
    done: set[str] = set()
    loops: dict[str, list[str]] = {}
    for start in parents:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node in parents and node not in done and node not in on_path:
            path.append(node)
            on_path.add(node)
            node = parents[node]
        if node is not None and node in on_path:
            loop = path[path.index(node):]
            for i, member in enumerate(loop):
                loops[member] = loop[i:] + loop[:i] + [member]
        done.update(path)
    return loops
