"""The base of every flowvault value type: bad input is ``InvalidInput``, never pydantic's error.

Pydantic's ``ValidationError`` is not part of the flowvault error tree, and
its text and ``repr`` echo the input, which may be a secret. A value refused
here names only its declared fields at fault and the rule each broke.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ValidationError

from flowvault.domain._errors import InvalidInput


def invalid_values(model: type[BaseModel], error: ValidationError) -> InvalidInput:
    """Return ``InvalidInput`` naming the fields and rules ``error`` reports, never their input.

    Only the top-level field is named: deeper locations can be the keys of a
    host's payload. A field the model does not declare is named only as
    unknown, since its name is the caller's. A rule over several fields
    (an empty location) is named by its own message.
    """
    fields: set[str] = set()
    problems: set[str] = set()
    for issue in error.errors(include_url=False, include_input=False, include_context=False):
        rule = str(issue["msg"]).removeprefix("Value error, ")
        location = issue["loc"]
        if not location:
            problems.add(rule)
            continue
        name = str(location[0])
        if name not in model.model_fields:
            name = "(unknown field)"
        fields.add(name)
        problems.add(f"{name}: {rule}")
    return InvalidInput(
        f"invalid {model.__name__}: " + "; ".join(sorted(problems)),
        fields=",".join(sorted(fields)),
    )


class ValueModel(BaseModel):
    """A pydantic model whose every validating entry point raises ``InvalidInput``."""

    def __init__(self, /, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_values(type(self), exc) from None

    # Tells pydantic this is still its own initialiser, so ``model_validate`` and nested
    # validation skip it (keeping their context) as they skip ``BaseModel.__init__``.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: object) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise invalid_values(type(self), exc) from None

    @classmethod
    def model_validate(cls, obj: object, **options: Any) -> Self:  # noqa: ANN401 - pydantic's own
        """Validate ``obj`` as pydantic does; a refusal is ``InvalidInput`` naming the fields."""
        try:
            return super().model_validate(obj, **options)
        except ValidationError as exc:
            raise invalid_values(cls, exc) from None

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        **options: Any,  # noqa: ANN401 - pydantic's own
    ) -> Self:
        """Validate JSON text as pydantic does; a refusal is ``InvalidInput`` naming the fields."""
        try:
            return super().model_validate_json(json_data, **options)
        except ValidationError as exc:
            raise invalid_values(cls, exc) from None

    @classmethod
    def model_validate_strings(cls, obj: object, **options: Any) -> Self:  # noqa: ANN401 - pydantic's own
        """Validate string data as pydantic does; a refusal is ``InvalidInput`` naming fields."""
        try:
            return super().model_validate_strings(obj, **options)
        except ValidationError as exc:
            raise invalid_values(cls, exc) from None
