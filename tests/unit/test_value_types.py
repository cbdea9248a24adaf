"""Every public value type refuses bad input as ``INVALID_INPUT`` naming fields, never values."""

from __future__ import annotations

import importlib
import json
import pkgutil
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from flowvault import application, composition, domain
from flowvault.composition import Settings
from flowvault.domain import FlowvaultError, InvalidInput, WorkflowResult
from flowvault.domain._values import ValueModel

SECRET = "s3cret-value-that-must-not-leak"


class _Secret:
    """A value no field accepts, whose text is a secret."""

    def __repr__(self) -> str:
        return SECRET

    __str__ = __repr__


def _exported_models() -> list[type[BaseModel]]:
    """Every model the domain, application and composition modules define, public or not."""
    modules = [
        importlib.import_module(info.name)
        for package in (domain, application, composition)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
    ]
    found = {
        value
        for module in (domain, application, composition, *modules)
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseModel)
        and value.__module__.startswith("flowvault.")
    }
    return sorted(found, key=lambda model: model.__name__)


MODELS = _exported_models()
FIELDED = [model for model in MODELS if model.model_fields]
"""Models with declared fields; ``WorkflowState`` takes any field a host names, and
``ValueModel``, their base, declares none."""


def _assert_secret_free(error: FlowvaultError) -> None:
    for text in (str(error), repr(error), repr(dict(error.details)), repr(error.args)):
        assert SECRET not in text


def _named(error: InvalidInput) -> set[str]:
    return set(str(error.details["fields"]).split(","))


def test_the_walk_finds_every_model() -> None:
    """The walk covers the models the issue names and all the others, each a frozen value."""
    names = {model.__name__ for model in MODELS}
    assert {
        "WorkflowResult",
        "Witness",
        "Approval",
        "Checkpoint",
        "LedgerEvent",
        "Settings",
    } <= names
    assert len(MODELS) >= 20
    values = [model for model in MODELS if model is not ValueModel]
    assert all(issubclass(model, ValueModel) for model in values)
    assert all(model.model_config.get("frozen") for model in values)


@pytest.mark.parametrize("model", FIELDED, ids=lambda model: model.__name__)
def test_bad_construction_names_fields_not_values(model: type[BaseModel]) -> None:
    """Building with a value no field takes raises ``InvalidInput`` naming the declared fields."""
    fields: dict[str, Any] = {name: _Secret() for name in model.model_fields}
    with pytest.raises(InvalidInput) as caught:
        model(**fields)
    assert caught.value.code == "INVALID_INPUT"
    assert _named(caught.value) <= set(model.model_fields)
    assert _named(caught.value)
    _assert_secret_free(caught.value)


@pytest.mark.parametrize("model", FIELDED, ids=lambda model: model.__name__)
def test_bad_model_validate_names_fields_not_values(model: type[BaseModel]) -> None:
    """``model_validate`` refuses the same way as construction."""
    fields: dict[str, Any] = {name: _Secret() for name in model.model_fields}
    with pytest.raises(InvalidInput) as caught:
        model.model_validate(fields)
    assert _named(caught.value) <= set(model.model_fields)
    _assert_secret_free(caught.value)


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_bad_json_and_shapes_are_invalid_input(model: type[BaseModel]) -> None:
    """Malformed JSON and a document that is not an object are refused as ``InvalidInput``."""
    with pytest.raises(InvalidInput):
        model.model_validate_json('{"' + SECRET)
    with pytest.raises(InvalidInput):
        model.model_validate_strings(SECRET)
    with pytest.raises(InvalidInput) as caught:
        model.model_validate([SECRET])
    _assert_secret_free(caught.value)


def test_invalid_input_is_not_a_value_error() -> None:
    """Pydantic turns a ``ValueError`` raised in a validator into its own error; this is not one."""
    assert not issubclass(InvalidInput, ValueError)


def _result(**changes: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "run_id": "run-001",
        "status": "completed",
        "started_at": datetime(2026, 1, 1, tzinfo=UTC),
        "finished_at": datetime(2026, 1, 2, tzinfo=UTC),
    }
    return {**fields, **changes}


def test_a_short_run_id_names_run_id() -> None:
    """The issue's example: ``WorkflowResult(run_id="ab")`` is ``INVALID_INPUT`` on ``run_id``."""
    with pytest.raises(InvalidInput) as built:
        WorkflowResult(**_result(run_id="ab"))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput) as validated:
        WorkflowResult.model_validate(_result(run_id="ab"))
    for error in (built.value, validated.value):
        assert error.details["fields"] == "run_id"
        assert "run_id" in error.message


def test_a_rule_over_fields_is_named_by_its_message() -> None:
    """A cross-field rule names no single field; its own message says what is wrong."""
    late = datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput) as caught:
        WorkflowResult.model_validate(_result(finished_at=late))
    assert "finished_at is before started_at" in caught.value.message
    assert caught.value.details["fields"] == ""


def test_an_undeclared_field_is_named_only_as_unknown() -> None:
    """A field the model does not declare is the caller's name, so it is not echoed."""
    with pytest.raises(InvalidInput) as caught:
        WorkflowResult.model_validate(_result(**{SECRET: 1}))
    assert caught.value.details["fields"] == "(unknown field)"
    _assert_secret_free(caught.value)


def test_nested_payload_keys_are_not_named() -> None:
    """Only the top-level field is named: a key inside a payload may be a secret."""
    with pytest.raises(InvalidInput) as caught:
        WorkflowResult.model_validate(_result(summary={SECRET: {1, 2}}))
    assert caught.value.details["fields"] == "summary"
    _assert_secret_free(caught.value)


def test_settings_built_by_a_host_name_the_field_not_the_secret() -> None:
    """``Settings`` built directly refuses like every value; its DSN, a secret, is not echoed."""
    dsn = f"postgresql://app:{SECRET}@db.example/app"
    with pytest.raises(InvalidInput) as caught:
        Settings(backend="oracle", postgres_dsn=dsn, busy_timeout=-1)  # type: ignore[arg-type]
    assert caught.value.details["fields"] == "backend,busy_timeout"
    _assert_secret_free(caught.value)


def test_assigning_to_a_frozen_value_is_invalid_input() -> None:
    """Values are frozen; an assignment is refused as ``InvalidInput``, not pydantic's error."""
    result = WorkflowResult.model_validate(_result())
    with pytest.raises(InvalidInput) as caught:
        result.status = SECRET
    assert caught.value.details["fields"] == "status"
    _assert_secret_free(caught.value)


def test_valid_json_still_validates() -> None:
    """The wrapping changes only the refusal: good input validates as before."""
    text = json.dumps({**_result(), "started_at": "2026-01-01T00:00:00Z"}, default=str)
    assert WorkflowResult.model_validate_json(text).run_id == "run-001"
