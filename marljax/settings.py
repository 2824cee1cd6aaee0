"""The strict pydantic base of every typed setting (run configs, workflow options).

Unknown keys are errors, and a YAML boolean given for a number is an error
rather than 1 or 0; everything else follows pydantic's lax coercion, since
YAML 1.1 reads `1e-6` as a string.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, field_validator


def resolve_annotation(tp: Any) -> Any:
    """Strip Annotated/Optional so that a field's annotation shows its container or model."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return None
            tp = args[0]
        else:
            return tp


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v, info):
        # Lax mode would read `true` as 1 for a number; in a config that is a mistake.
        if isinstance(v, bool) and resolve_annotation(cls.model_fields[info.field_name].annotation) in (
            int,
            float,
        ):
            raise ValueError("expected a number, not a boolean")
        return v


def check_kind_default(model: type[BaseModel], kind: str) -> None:
    """A registry's entry must be chosen by its own name: `model.kind` defaults to `kind` (a
    `Literal[kind]` field, the discriminator of the config union it joins)."""
    default = model.model_fields["kind"].default
    if default != kind:
        raise TypeError(
            f"{model.__name__}.kind must default to {kind!r} (a Literal[{kind!r}] field), got {default!r}"
        )
