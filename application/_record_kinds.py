"""Where each kind of sealed record beside a run lives, and the tag its digest carries.

Every record is addressed by a keyed digest of its natural key in its
namespace and carries a keyed integrity digest under its kind's tag, so a
record rebuilt without the integrity key never verifies. The limits bound
what one record of a kind may hold.
"""

from __future__ import annotations

from typing import Final

from flowvault.application._freshness import CHECKPOINT_KIND, record_stream
from flowvault.application._sealed import SealedRepository

CHECKPOINTS = "flowvault.checkpoints"
APPROVALS = "flowvault.approvals"
APPROVAL_SLOTS = "flowvault.approval-slots"
"""One marker per (checkpoint, audience) naming the approval requested for it."""
REQUEST_IDEMPOTENCY = "flowvault.request-idempotency"
WITNESSES = "flowvault.witnesses"

CHECKPOINT_TAG = "flowvault.checkpoint/1"
APPROVAL_TAG = "flowvault.approval/1"
WITNESS_TAG = "flowvault.witness/1"
REQUEST_TAG = "flowvault.idempotency-request/1"
DECIDER_TAG = "flowvault.decider/1"
"""The workflow service's tag too, so one person has one digest in every receipt."""

MAX_WITNESS_BYTES: Final = 512 * 1024
"""Largest evidence body; base64 inside the sealed record stays under its 1 MiB limit."""
MAX_IDEMPOTENCY_KEY: Final = 256
MAX_ACTOR: Final = 256


def checkpoint_stream(repository: SealedRepository, checkpoint_id: str) -> str:
    """Name the record stream of a checkpoint and of the approvals asked on it.

    Each checkpoint's stream also holds the events of its approvals and their
    slots, so every row of those kinds names the event that last wrote it and
    an older row put back is refused.
    """
    return record_stream(CHECKPOINT_KIND, repository.key_digest(CHECKPOINTS, checkpoint_id))
