"""Graph runs: their lifecycle, pinned definition versions and terminal receipts.

Values only; the run service in the application layer seals them, moves
them through ``RUN_LIFECYCLE`` and signs their receipts with the integrity key
and, when one is configured, an Ed25519 signing key.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Final

from pydantic import AfterValidator, ConfigDict, Field

from flowvault.domain._canonical import MAX_SAFE_INTEGER, canonical_bytes, parse_canonical
from flowvault.domain._envelope import Digest, UtcDatetime
from flowvault.domain._errors import InvalidInput
from flowvault.domain._fingerprint import Receipt
from flowvault.domain._state import RUN_ID_PATTERN
from flowvault.domain._state_machine import StateMachine
from flowvault.domain._values import ValueModel
from flowvault.domain._workflow import Json

DEFINITION_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
"""Definition ids are short lowercase names, safe to log and to join into keys."""

HOST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
"""Host ids name one runtime; printable, so an operator can read them in a run's record."""

LEASED_STATUSES: Final = frozenset({"accepted", "running"})
"""Statuses in which a run is being executed, so its owner holds a lease on it."""

RUN_LIFECYCLE = StateMachine.define(
    name="run_lifecycle",
    initial="accepted",
    transitions={
        "accepted": {"running", "cancelled", "failed", "interrupted_non_resumable"},
        "running": {
            "checkpointed",
            "awaiting_approval",
            "completed",
            "failed",
            "cancelled",
            "interrupted_non_resumable",
        },
        "checkpointed": {
            "running",
            "awaiting_approval",
            "failed",
            "cancelled",
            "interrupted_non_resumable",
        },
        "awaiting_approval": {"running", "failed", "cancelled", "interrupted_non_resumable"},
    },
    terminal={"completed", "failed", "cancelled", "interrupted_non_resumable"},
)
"""The lifecycle every graph run follows.

A run is ``accepted`` when stored, ``running`` while a worker executes it,
``checkpointed`` between resumable steps and ``awaiting_approval`` while a
human decides. It ends ``completed``, ``failed``, ``cancelled``, or
``interrupted_non_resumable`` when its worker vanished with no checkpoint
to resume from.
"""


def _check_definition_id(value: str) -> str:
    if not DEFINITION_ID_PATTERN.fullmatch(value):
        raise ValueError("must match [a-z][a-z0-9_.-]{0,63}")
    return value


def _check_run_id(value: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(value) or ".." in value:
        raise ValueError("must be 3-128 of [A-Za-z0-9._-], start alphanumeric, no '..'")
    return value


def _check_host_id(value: str) -> str:
    if not HOST_ID_PATTERN.fullmatch(value):
        raise ValueError("must be 1-128 of [A-Za-z0-9._:@-], starting alphanumeric")
    return value


def _check_status(value: str) -> str:
    if value not in RUN_LIFECYCLE.states:
        raise ValueError("must be a run_lifecycle state")
    return value


def _check_terminal(value: str) -> str:
    if value not in RUN_LIFECYCLE.terminal:
        raise ValueError("must be a terminal run_lifecycle state")
    return value


DefinitionId = Annotated[str, AfterValidator(_check_definition_id)]
GraphRunId = Annotated[str, AfterValidator(_check_run_id)]
HostId = Annotated[str, AfterValidator(_check_host_id)]
RunStatus = Annotated[str, AfterValidator(_check_status)]
TerminalStatus = Annotated[str, AfterValidator(_check_terminal)]
_Counter = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER, strict=True)]
_KeyHint = Annotated[str, Field(pattern=r"^[0-9a-f]{8}$")]
_Ed25519Signature = Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{86}==$")]

TERMINAL_SIGNATURE_TAG: Final = "flowvault.terminal-receipt/1"
"""Heads the message a terminal receipt's Ed25519 signature covers.

A head receipt's signed text starts with its ``flowvault.ledger/`` origin
line, so neither kind's signature can pass for the other's.
"""

_PUBLIC_SIGNATURE_FIELDS: Final = ("signer_hint", "ed25519_signature")


class DefinitionVersion(ValueModel):
    """One stored content of a graph definition, named by its content hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    definition_id: DefinitionId
    version: Digest
    created_at: UtcDatetime


class GraphRun(ValueModel):
    """One execution of a pinned definition version; input and final state are sealed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: GraphRunId
    definition_id: DefinitionId
    definition_version: Digest
    status: RunStatus
    input: Json = Field(default=None, repr=False)
    budgets: dict[str, Json] = Field(default_factory=dict)
    final_state: Json = Field(default=None, repr=False)
    started_at: UtcDatetime
    finished_at: UtcDatetime | None = None
    node_count: _Counter = 0
    failed_attempts: _Counter = 0
    idempotency_key_digest: Digest | None = None
    revision: int = Field(ge=1, le=MAX_SAFE_INTEGER)
    owner: HostId | None = None
    """The host executing the run, or that took it over; ``None`` once paused or ended."""
    lease_expires_at: UtcDatetime | None = None
    """Until when ``owner`` holds the run without renewing; ``None`` means no live lease."""

    @property
    def finished(self) -> bool:
        """Whether the run has reached a terminal status."""
        return self.status in RUN_LIFECYCLE.terminal

    def lease_live(self, now: datetime) -> bool:
        """Whether an owner still holds the run at ``now``; records from before leases hold none."""
        return (
            self.owner is not None
            and self.lease_expires_at is not None
            and now < self.lease_expires_at
        )


class TerminalReceipt(Receipt):
    """Signed proof of how a run ended, naming no run, input or state in clear.

    ``signature`` is a keyed MAC only the store key checks. With a signing
    key, ``signer_hint`` names its public key and ``ed25519_signature``
    signs ``signed_message()``, so the receipt checks with the public key
    alone; a receipt issued without one leaves both out of its body.
    """

    kind: ClassVar[str] = "terminal"
    plain_fields: ClassVar[frozenset[str]] = frozenset({"status", *_PUBLIC_SIGNATURE_FIELDS})

    run: Digest
    status: TerminalStatus
    definition_version: Digest
    final_state_digest: Digest
    events_digest: Digest
    event_count: int = Field(ge=1, le=MAX_SAFE_INTEGER)
    signature: Digest
    signer_hint: _KeyHint | None = None
    ed25519_signature: _Ed25519Signature | None = None

    def body(self) -> dict[str, Any]:
        """Return the canonical body, leaving out public-signature fields a receipt lacks.

        Receipts issued before they could be signed keep the body, and so the
        MAC and digest, they were issued with.
        """
        body = super().body()
        for name in _PUBLIC_SIGNATURE_FIELDS:
            if body[name] is None:
                del body[name]
        return body

    def unsigned_body(self) -> dict[str, Any]:
        """Return the canonical body the signatures cover: everything but the signatures."""
        body = self.body()
        del body["signature"]
        body.pop("ed25519_signature", None)
        return body

    def signed_message(self) -> bytes:
        """Return the bytes the Ed25519 signature covers: the tag, then the unsigned body."""
        return (
            TERMINAL_SIGNATURE_TAG.encode("ascii") + b"\n" + canonical_bytes(self.unsigned_body())
        )

    def text(self) -> str:
        """Render the receipt as ``parse_terminal_receipt`` reads it: canonical JSON, newline."""
        return canonical_bytes(self.body()).decode("utf-8") + "\n"


def parse_terminal_receipt(text: object) -> TerminalReceipt:
    """Parse a terminal receipt strictly; anything but its canonical text is ``InvalidInput``.

    Signatures are parsed, not checked.
    """
    if not isinstance(text, str) or not text.endswith("\n"):
        raise InvalidInput("a terminal receipt is one line of canonical JSON and a newline")
    document = parse_canonical(text[:-1])
    if not isinstance(document, dict) or document.pop("kind", None) != TerminalReceipt.kind:
        raise InvalidInput("not a terminal receipt: its kind must be 'terminal'")
    receipt = TerminalReceipt.model_validate(document)
    if receipt.text() != text:
        raise InvalidInput("a terminal receipt is not in its canonical form")
    return receipt
