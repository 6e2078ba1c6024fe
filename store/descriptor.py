"""The subagent descriptor: the event that proves a session is a subagent.

A child's own log holds one ``subagent/descriptor`` event with everything
needed to rebuild it. Two folds read it, deliberately different (as in the
reference; docs/behaviour.md, "Descriptors"):

* resume folds the **first** descriptor of the child's own suffix (after
  ``seed_length``): a fork child must not resume under its ancestor's identity;
* identity (the catalog) folds the **last** descriptor of the whole log, and a
  malformed or unknown-version one resets it.

Unknown version → ``unsupported`` (not an error); malformed → ``corrupt``.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import DescriptorError

__all__ = [
    "DESCRIPTOR_VERSION",
    "ToolFilter",
    "OneShotDescriptor",
    "ContinuableDescriptor",
    "Descriptor",
    "parse_descriptor",
    "fold_resume_descriptor",
    "IdentityVerdict",
    "identity_of",
]

DESCRIPTOR_VERSION = 1


class ToolFilter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None

    @field_validator("allow", "deny", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be an array of strings")
        return tuple(value)

    @model_validator(mode="after")
    def _declares_something(self) -> "ToolFilter":
        if self.allow is None and self.deny is None:
            raise ValueError("toolFilter must declare allow and/or deny")
        return self

    def permits(self, name: str) -> bool:
        if self.allow is not None and name not in self.allow:
            return False
        return not (self.deny is not None and name in self.deny)

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.allow is not None:
            out["allow"] = list(self.allow)
        if self.deny is not None:
            out["deny"] = list(self.deny)
        return out


class OneShotDescriptor(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal[1] = 1
    mode: Literal["one-shot"] = "one-shot"
    provider: str
    label: str | None = None

    def to_record(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ContinuableDescriptor(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal[1] = 1
    mode: Literal["continuable"] = "continuable"
    provider: str
    label: str
    agent_provider: str | None = None
    agent_model: str | None = None
    persona: str | None = None
    tool_filter: ToolFilter | None = None
    # The program the child runs, by reference: a built-in name or "package.module:function".
    # Recorded so that any process on the store can resume the child without registering its
    # provider; absent when the program was a Python object carried by value (dill).
    program: str | None = Field(default=None, min_length=1)

    def to_record(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True, exclude={"tool_filter"})
        if self.tool_filter is not None:
            out["tool_filter"] = self.tool_filter.to_record()
        return out


Descriptor = OneShotDescriptor | ContinuableDescriptor

_PREFIX = "persisted subagent descriptor "


def parse_descriptor(payload: Any) -> Descriptor | None:
    """Validate one descriptor payload.

    Returns ``None`` for an unknown version (unsupported, not an error);
    raises ``DescriptorError`` for a malformed payload.
    """
    if not isinstance(payload, dict):
        raise DescriptorError(_PREFIX + "payload must be an object")
    version = payload.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise DescriptorError(_PREFIX + "version must be a number")
    if version != DESCRIPTOR_VERSION:
        return None
    mode = payload.get("mode")
    model: type[OneShotDescriptor] | type[ContinuableDescriptor]
    if mode == "one-shot":
        model = OneShotDescriptor
    elif mode == "continuable":
        model = ContinuableDescriptor
    else:
        raise DescriptorError(_PREFIX + 'mode must be "one-shot" or "continuable"')
    _refuse_unknown_and_nil(payload, model)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            raise DescriptorError(_PREFIX + f'payload has unknown field "{where}"') from None
        if first["type"] == "missing":
            raise DescriptorError(_PREFIX + f"{where} must be a string") from None
        raise DescriptorError(_PREFIX + f"{where}: {first['msg']}") from None


def _refuse_unknown_and_nil(payload: dict[str, Any], model: type[BaseModel]) -> None:
    """Absent optional fields are omitted, never nil (docs/behaviour.md, "Descriptors"): a nil one is malformed.

    Pydantic would read ``None`` as the field's default (absent), so the check runs
    before model validation, after the unknown-field check the reference makes first
    (pydantic would report a bad known field before an unknown one).
    """
    known = model.model_fields  # read once: each read of it goes through a pydantic descriptor (~0.4 µs)
    for key in payload:
        if key not in known:
            raise DescriptorError(_PREFIX + f'payload has unknown field "{key}"')
    for key, value in payload.items():
        if value is not None:
            continue
        if key == "tool_filter":
            raise DescriptorError(_PREFIX + "tool_filter must be an object")
        raise DescriptorError(_PREFIX + f"{key} must be a string")
    tool_filter = payload.get("tool_filter")
    if isinstance(tool_filter, dict):
        for key in ("allow", "deny"):
            if key in tool_filter and tool_filter[key] is None:
                raise DescriptorError(_PREFIX + f"tool_filter.{key} must be an array of strings")


def fold_resume_descriptor(events: Sequence[dict[str, Any]], seed_length: int) -> tuple[int, Descriptor] | None:
    """First descriptor of the own suffix, with its seq; ``None`` if absent or unsupported."""
    for event in events[seed_length:]:
        if event.get("type") == "subagent/descriptor":
            parsed = parse_descriptor(event.get("data"))
            return None if parsed is None else (event["seq"], parsed)
    return None


IdentityVerdict = Literal["unsupported", "corrupt"]


def identity_of(payload: Any) -> Descriptor | IdentityVerdict:
    """What one descriptor event means for the identity (last-wins) fold."""
    try:
        parsed = parse_descriptor(payload)
    except DescriptorError:
        return "corrupt"
    return "unsupported" if parsed is None else parsed
