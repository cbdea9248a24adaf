"""Workflow state documents, reset fingerprints and terminal run results."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from flowvault.domain._envelope import Digest, UtcDatetime
from flowvault.domain._fingerprint import Readability
from flowvault.domain._values import ValueModel
from flowvault.domain._workflow import Json

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{2,127}$")
"""Run ids: 3-128 characters of letters, digits, dot, dash and underscore, starting alphanumeric."""

SCOPE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""Scope names: 1-64 characters of letters, digits, dot, dash and underscore."""

REASON_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
TERMINAL_RUN_STATUSES = frozenset({"completed", "failed", "cancelled", "stopped"})


def _check_run_id(value: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(value) or ".." in value:
        raise ValueError("must be 3-128 of [A-Za-z0-9._-], start alphanumeric, no '..'")
    return value


def _check_status(value: str) -> str:
    if value not in TERMINAL_RUN_STATUSES:
        raise ValueError("must be a terminal status: " + ", ".join(sorted(TERMINAL_RUN_STATUSES)))
    return value


RunId = Annotated[str, AfterValidator(_check_run_id)]


class WorkflowState(ValueModel):
    """The default state document: any JSON fields a host wants, frozen once built.

    Hosts that want a schema subclass ``BaseModel`` themselves and hand the
    class to the state repository; this one accepts any extra field.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    if TYPE_CHECKING:
        # What a type checker sees without pydantic's plugin: any JSON fields by keyword.
        def __init__(self, **fields: Json) -> None: ...


class ResetFingerprint(ValueModel):
    """A plaintext-free summary of a state row taken before it is reset.

    On a cold root (no store at all) only scope, readability and reason are
    known; every metadata field stays empty.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str
    readability: Readability
    reason_class: str
    namespace: str | None = None
    key_digest: Digest | None = None
    revision: int | None = None
    schema_version: int | None = None
    sensitivity: str | None = None
    written_at: UtcDatetime | None = None
    byte_length: int | None = None
    payload_digest: Digest | None = None


class WorkflowResult(ValueModel):
    """The terminal record of one workflow run, stored sealed under its run id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: RunId
    status: Annotated[str, AfterValidator(_check_status)]
    started_at: UtcDatetime
    finished_at: UtcDatetime
    workflow_id: str | None = Field(default=None, max_length=128)
    output: Json = Field(default=None, repr=False)
    summary: dict[str, Json] = Field(default_factory=dict, repr=False)
    error_code: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _finished_after_start(self) -> WorkflowResult:
        if self.finished_at < self.started_at:
            raise ValueError("finished_at is before started_at")
        return self
