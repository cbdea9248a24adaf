"""Checkpoints, human approvals, their receipts, and evidence witnesses.

Values only; the application layer seals them, binds each to a keyed
integrity digest and moves them through their single-use lifecycles. A
checkpoint is consumed exactly once, by a resume or by an approval's decision
or expiry, so a run can never be resumed twice from the same point.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, ConfigDict, Field, StrictBytes, model_validator

from flowvault.domain._canonical import (
    MAX_SAFE_INTEGER,
    JsonValue,
    canonical_bytes,
    content_hash,
    digest_bytes,
)
from flowvault.domain._envelope import Digest, UtcDatetime
from flowvault.domain._fingerprint import Receipt
from flowvault.domain._state import RunId
from flowvault.domain._values import ValueModel
from flowvault.domain._workflow import Json

CHECKPOINT_ID_PATTERN = re.compile(r"^cp_[0-9a-f]{32}$")
DECISION_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
"""Decisions are short lowercase names such as ``approve`` or ``request-changes``."""
AUTHORITY_CLASS_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
MEDIA_TYPE_PATTERN = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$"
)
"""An RFC 6838 ``type/subtype``, without parameters."""

MAX_AUDIENCE = 256
MAX_ACTOR = 256
MAX_DECISIONS = 16
MAX_LOCATOR = 2048
MAX_WITNESS_LOCATORS = 16
"""Most locators one witness records: the first and up to 15 later ones."""
MAX_BUDGET_ENTRIES = 64
MAX_DECIDERS = 64
"""Largest audience of named deciders (and so largest quorum) one approval may have."""
APPROVE = "approve"
REJECT = "reject"
QUORUM_DECISIONS = (APPROVE, REJECT)
"""The only decisions a quorum approval offers: each decider approves or rejects."""


class CheckpointStatus(StrEnum):
    """Where a checkpoint is in its single-use life."""

    PENDING = "pending"
    CONSUMED = "consumed"


class ApprovalStatus(StrEnum):
    """Where an approval request is in its life; only ``pending`` accepts a decision."""

    PENDING = "pending"
    DECIDED = "decided"
    EXPIRED = "expired"


class RejectionRule(StrEnum):
    """When rejections settle a quorum approval as rejected."""

    ANY = "any"
    """One rejection rejects."""
    QUORUM = "quorum"
    """``required`` rejections reject, or approval can no longer reach ``required``."""


def checkpoint_id_for(run_id: str, next_cursor: JsonValue) -> str:
    """Return the checkpoint id of a run at a cursor, so a retried create finds the first."""
    return "cp_" + content_hash([run_id, next_cursor]).removeprefix("sha256:")[:32]


def _check_checkpoint_id(value: str) -> str:
    if not CHECKPOINT_ID_PATTERN.fullmatch(value):
        raise ValueError("must be cp_ and 32 lowercase hex digits")
    return value


def _check_decisions(value: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(value)) != len(value):
        raise ValueError("must not repeat a decision")
    return tuple(sorted(value))


def _check_printable(value: str) -> str:
    if any(unicodedata.category(char) in {"Cc", "Cf", "Cs", "Zl", "Zp"} for char in value):
        raise ValueError("must not contain control or format characters")
    return value


def _check_budgets(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > MAX_BUDGET_ENTRIES:
        raise ValueError(f"must have at most {MAX_BUDGET_ENTRIES} entries")
    return value


def _check_deciders(value: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(value)) != len(value):
        raise ValueError("must not repeat a decider")
    return tuple(sorted(value))


CheckpointId = Annotated[str, AfterValidator(_check_checkpoint_id)]
Decision = Annotated[str, Field(pattern=DECISION_PATTERN.pattern)]
Decisions = Annotated[
    tuple[Decision, ...],
    Field(min_length=1, max_length=MAX_DECISIONS),
    AfterValidator(_check_decisions),
]
PrintableText = Annotated[str, AfterValidator(_check_printable)]
Counter = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER, strict=True)]
Budgets = Annotated[dict[str, Json], AfterValidator(_check_budgets)]
Counters = Annotated[dict[str, Counter], AfterValidator(_check_budgets)]
Deciders = Annotated[
    tuple[Digest, ...], Field(max_length=MAX_DECIDERS), AfterValidator(_check_deciders)
]
Ed25519Signature = Annotated[str, Field(pattern=r"^[0-9a-f]{128}$")]
Locator = Annotated[PrintableText, Field(min_length=1, max_length=MAX_LOCATOR)]


class Checkpoint(ValueModel):
    """A sealed resume point of a run: its state, budgets and counters at one cursor.

    ``state_digest`` and ``dependency_digest`` are content hashes of the sealed
    values; ``integrity_digest`` is the keyed digest of every other field, so
    a checkpoint rebuilt without the integrity key never verifies.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_id: CheckpointId
    run_id: RunId
    next_cursor: Json
    terminal_cursor: Json = None
    event_cursor: Counter
    state: Json = Field(default=None, repr=False)
    state_digest: Digest
    budgets: Budgets = Field(default_factory=dict)
    counters: Counters = Field(default_factory=dict)
    dependency_summary: Json = Field(default=None, repr=False)
    dependency_digest: Digest
    created_at: UtcDatetime
    status: CheckpointStatus = CheckpointStatus.PENDING
    consumed_at: UtcDatetime | None = None
    integrity_digest: Digest

    @model_validator(mode="after")
    def _consumed_has_a_time(self) -> Self:
        if (self.status is CheckpointStatus.CONSUMED) != (self.consumed_at is not None):
            raise ValueError("consumed_at is set exactly when the checkpoint is consumed")
        return self

    def integrity_body(self) -> dict[str, Any]:
        """Return what ``integrity_digest`` covers: every other field, as JSON.

        State and dependency summary enter through their digests, which are
        checked against them on every read, so large states are hashed once.
        """
        return self.model_dump(
            mode="json", exclude={"integrity_digest", "state", "dependency_summary"}
        )

    def content(self) -> dict[str, Any]:
        """Return what makes two creates the same checkpoint: everything but its lifecycle."""
        return self.model_dump(
            mode="json", exclude={"created_at", "status", "consumed_at", "integrity_digest"}
        )


class Vote(ValueModel):
    """One decider's decision on a quorum approval; the decider is a keyed digest.

    ``signature`` is the decider's Ed25519 signature (hex) of the decision
    statement, present when the decider has a registered public key.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decider: Digest
    decision: Decision
    decided_at: UtcDatetime
    signature: Ed25519Signature | None = None


_QUORUM_FIELDS = frozenset({"required", "deciders", "rejection", "votes"})


class Approval(ValueModel):
    """A request for a human decision on one checkpoint, bound to its integrity digest.

    ``audience``, ``actor`` and ``decision`` are stored only sealed; receipts
    carry keyed digests of them. A quorum approval (``required`` above one,
    or named ``deciders``) collects ``votes`` from distinct deciders and is
    settled by ``tally``; ``actor`` is then the decider whose vote settled it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    approval_id: str = Field(min_length=1, max_length=128)
    checkpoint_id: CheckpointId
    run_id: RunId
    checkpoint_digest: Digest
    audience: PrintableText = Field(min_length=1, max_length=MAX_AUDIENCE, repr=False)
    prompt_digest: Digest
    allowed_decisions: Decisions
    requested_at: UtcDatetime
    expires_at: UtcDatetime
    status: ApprovalStatus = ApprovalStatus.PENDING
    decision: Decision | None = Field(default=None, repr=False)
    actor: PrintableText | None = Field(default=None, max_length=MAX_ACTOR, repr=False)
    decided_at: UtcDatetime | None = None
    required: int = Field(default=1, ge=1, le=MAX_DECIDERS, strict=True)
    deciders: Deciders = ()
    rejection: RejectionRule = RejectionRule.ANY
    votes: tuple[Vote, ...] = Field(default=(), max_length=MAX_DECIDERS)
    integrity_digest: Digest

    @property
    def quorum(self) -> bool:
        """Whether this approval collects votes rather than taking one decision."""
        return self.required > 1 or bool(self.deciders)

    def tally(self) -> str | None:
        """Return the decision the votes settle on (``approve``/``reject``), or ``None`` yet.

        With ``RejectionRule.ANY`` one rejection rejects; with ``QUORUM``
        ``required`` rejections do, and so does a closed audience that can no
        longer give ``required`` approvals.
        """
        approvals = sum(vote.decision == APPROVE for vote in self.votes)
        rejections = len(self.votes) - approvals
        if self.rejection is RejectionRule.ANY and rejections:
            return REJECT
        if approvals >= self.required:
            return APPROVE
        if rejections >= self.required:
            return REJECT
        if self.deciders and approvals + len(self.deciders) - len(self.votes) < self.required:
            return REJECT
        return None

    def status_at(self, now: datetime) -> ApprovalStatus:
        """Return the status as of ``now``: a pending approval past its deadline is expired."""
        if self.status is ApprovalStatus.PENDING and now >= self.expires_at:
            return ApprovalStatus.EXPIRED
        return self.status

    @model_validator(mode="after")
    def _quorum_consistent(self) -> Self:
        if not self.quorum:
            if self.rejection is not RejectionRule.ANY:
                raise ValueError("a rejection rule needs a quorum approval")
            if self.votes and (
                len(self.votes) > 1
                or self.status is not ApprovalStatus.DECIDED
                or self.votes[0].decision != self.decision
            ):
                raise ValueError("a single-decider approval records only its deciding vote")
            return self
        if self.allowed_decisions != QUORUM_DECISIONS:
            raise ValueError("a quorum approval's decisions are exactly approve and reject")
        if self.deciders and self.required > len(self.deciders):
            raise ValueError("required must not exceed the number of deciders")
        voters = [vote.decider for vote in self.votes]
        if len(set(voters)) != len(voters):
            raise ValueError("each decider votes at most once")
        if self.deciders and not set(voters) <= set(self.deciders):
            raise ValueError("a vote comes from a decider outside the audience")
        settled = self.tally()
        if self.status is ApprovalStatus.DECIDED and settled != self.decision:
            raise ValueError("a decided quorum approval's decision is its votes' tally")
        if self.status is ApprovalStatus.PENDING and settled is not None:
            raise ValueError("a pending quorum approval's votes must not settle it")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.expires_at <= self.requested_at:
            raise ValueError("expires_at must be after requested_at")
        decided = self.status is ApprovalStatus.DECIDED
        if (self.decision is not None, self.actor is not None) != (decided, decided):
            raise ValueError("decision and actor are set exactly when the approval is decided")
        if (self.decided_at is not None) != (self.status is not ApprovalStatus.PENDING):
            raise ValueError("decided_at is set exactly when the approval is settled")
        if self.decision is not None and self.decision not in self.allowed_decisions:
            raise ValueError("decision is not one of the allowed decisions")
        return self

    def integrity_body(self) -> dict[str, Any]:
        """Return what ``integrity_digest`` covers: every other field, as JSON.

        A single-decider approval leaves the quorum fields out, so approvals
        stored before quorums existed still verify.
        """
        exclude = {"integrity_digest"}
        if not self.quorum:
            exclude |= {name for name in _QUORUM_FIELDS if not getattr(self, name)}
            exclude |= {"required", "rejection"}
        return self.model_dump(mode="json", exclude=exclude)

    def request(self) -> dict[str, Any]:
        """Return what makes two requests identical: the request, not its outcome."""
        return self.model_dump(
            mode="json",
            include={
                "checkpoint_id",
                "checkpoint_digest",
                "audience",
                "prompt_digest",
                "allowed_decisions",
                "expires_at",
                "required",
                "deciders",
                "rejection",
            },
        )


class ApprovalReceipt(Receipt):
    """Proof of an approval's request and outcome that names no one and reveals nothing."""

    kind: ClassVar[str] = "approval"

    approval: Digest
    checkpoint: Digest
    run: Digest
    audience: Digest
    prompt: Digest
    allowed_decisions: Digest
    status: ApprovalStatus
    decision: Digest | None = None
    actor: Digest | None = None
    decided_at: UtcDatetime | None = None
    required: int | None = None
    votes: Digest | None = None

    def body(self) -> dict[str, Any]:
        """Return the canonical body; a single-decider receipt has no quorum fields."""
        body = super().body()
        for name in ("required", "votes"):
            if body[name] is None:
                del body[name]
        return body


DECISION_STATEMENT = "flowvault.decision/1"


def decision_statement(approval: Approval, decision: str) -> bytes:
    """Return the bytes a decider signs: this approval, its checkpoint's state, one decision.

    Canonical JSON, readable by an auditor, naming no audience, actor or
    prompt in clear; bound to the checkpoint's integrity digest, so a
    signature cannot be carried over to another checkpoint or approval.
    """
    return canonical_bytes(
        {
            "statement": DECISION_STATEMENT,
            "approval_id": approval.approval_id,
            "checkpoint_digest": approval.checkpoint_digest,
            "prompt_digest": approval.prompt_digest,
            "decision": decision,
        }
    )


class Witness(ValueModel):
    """Captured evidence: the bytes retrieved from locators, stored once per content digest.

    ``locator`` is where the content was first captured from; ``later_locators``
    every other source it was captured from since, in capture order.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    content_digest: Digest
    locator: Locator = Field(repr=False)
    later_locators: tuple[Locator, ...] = Field(
        default=(), max_length=MAX_WITNESS_LOCATORS - 1, repr=False
    )
    media_type: Annotated[str, Field(pattern=MEDIA_TYPE_PATTERN.pattern)]
    authority_class: Annotated[str, Field(pattern=AUTHORITY_CLASS_PATTERN.pattern)]
    size_bytes: Counter
    retrieved_at: UtcDatetime
    captured_at: UtcDatetime
    content: StrictBytes = Field(repr=False)
    integrity_digest: Digest

    @model_validator(mode="after")
    def _content_matches(self) -> Self:
        if len(self.content) != self.size_bytes or digest_bytes(self.content) != (
            self.content_digest
        ):
            raise ValueError("content does not match its digest and size")
        return self

    @model_validator(mode="after")
    def _locators_distinct(self) -> Self:
        if len(set(self.locators)) != len(self.locators):
            raise ValueError("a locator is recorded twice")
        return self

    @property
    def locators(self) -> tuple[str, ...]:
        """Every locator the content was captured from, the first one first."""
        return (self.locator, *self.later_locators)

    def integrity_body(self) -> dict[str, Any]:
        """Return what ``integrity_digest`` covers: every field but the bytes (named by digest).

        A witness with one locator leaves ``later_locators`` out, so a witness
        stored before later locators were kept verifies as it did.
        """
        left_out = {"integrity_digest", "content"}
        if not self.later_locators:
            left_out.add("later_locators")
        return self.model_dump(mode="json", exclude=left_out)
