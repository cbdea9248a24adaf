"""Work orders, workflow records, action results and decision receipts.

These are values only; the workflow service in the application layer
stores them sealed and moves them through a ``StateMachine``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, ConfigDict, Field

from flowvault.domain._canonical import JsonValue, content_hash, validate_json
from flowvault.domain._envelope import Digest, UtcDatetime
from flowvault.domain._fingerprint import Receipt
from flowvault.domain._values import ValueModel

_KIND = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
MAX_IDEMPOTENCY_KEY = 256
MAX_STOP_REASON = 200

DECISION_APPROVED = "decision.approved"
DECISION_REJECTED = "decision.rejected"
DECISION_TYPES = frozenset({DECISION_APPROVED, DECISION_REJECTED})


def _check_kind(value: str) -> str:
    if not _KIND.fullmatch(value):
        raise ValueError("must be a short lowercase name such as 'invoice.review'")
    return value


def _check_json(value: Any) -> Any:  # noqa: ANN401 - pydantic hands over any value
    try:
        return validate_json(value)
    except Exception as exc:
        raise ValueError("must be canonical JSON") from exc


Kind = Annotated[str, AfterValidator(_check_kind)]
Json = Annotated[Any, AfterValidator(_check_json)]


class WorkOrder(ValueModel):
    """What a requester asks a workflow to do; ``parameters`` are sealed and never logged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind
    parameters: dict[str, Json] = Field(default_factory=dict, repr=False)
    requester: str = Field(min_length=1, max_length=200, repr=False)
    idempotency_key: str = Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY, repr=False)
    priority: int = Field(default=0, ge=-100, le=100)

    def fingerprint(self) -> str:
        """Content hash of the canonical form: equal orders, equal fingerprints."""
        return content_hash(self.model_dump(mode="json"))

    def ledger_summary(self) -> dict[str, JsonValue]:
        """Return what the ledger may say of the order: never parameters or requester."""
        return {
            "kind": self.kind,
            "priority": self.priority,
            "parameter_count": len(self.parameters),
        }

    def scrubbed(self) -> WorkOrder:
        """Return the order without its parameters, as kept once a workflow has ended."""
        return self.model_copy(update={"parameters": {}})


class WorkflowRecord(ValueModel):
    """The current state of one workflow, as the service returns it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str = Field(min_length=1, max_length=128)
    state: str
    state_version: int = Field(ge=1)
    machine_version: Digest
    work_order: WorkOrder = Field(repr=False)
    created_at: UtcDatetime
    updated_at: UtcDatetime
    original_content_hash: Digest | None = None
    output_content_hash: Digest | None = None
    stop_reason: str | None = Field(default=None, max_length=MAX_STOP_REASON)


class ActionResult(ValueModel):
    """A sealed action result and its retention window; ``result`` is absent in listings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    action_hash: Digest
    content_hash: Digest
    size_bytes: int = Field(ge=0)
    created_at: UtcDatetime
    expires_at: UtcDatetime
    result: Json = Field(default=None, repr=False)


class DecisionReceipt(Receipt):
    """Proof that a human decision was recorded, naming no one and revealing nothing."""

    kind: ClassVar[str] = "decision"

    workflow: Digest
    action_hash: Digest
    approved: bool
    event_index: int = Field(ge=0)
    event_hash: Digest
    decider: Digest | None = None
