"""Pieces shared by the run, checkpoint and approval services.

Run events, checkpoint tombstones and approval tombstones all live in the
owning run's stream, so one verified stream tells a run's whole story.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

from flowvault.domain import IntegrityKeyRequired

RETENTION_TOMBSTONE = "retention.purged"
"""Event type of the digest-only record a retention deletion leaves behind."""

IDEMPOTENCY_STREAM = "retention/idempotency"
"""Stream for tombstones of idempotency records, which belong to no run."""


def run_stream(run_id: str) -> str:
    """Name of the ledger stream holding one run's events."""
    return f"run/{run_id}"


@runtime_checkable
class KeyedDigester(Protocol):
    """Computes keyed digests under the integrity key (``SealedRepository`` is one)."""

    def keyed_digest(self, tag: str, data: bytes | str) -> str:
        """Return ``sha256:<hex>`` HMAC of ``data`` for purpose ``tag``."""
        ...


def require_integrity(integrity: KeyedDigester | None) -> KeyedDigester:
    """Return the integrity key holder, or refuse a durable operation without one."""
    if integrity is None:
        raise IntegrityKeyRequired(
            "checkpoints, approvals and receipts need an integrity key; "
            "build the service with the sealed repository (or another keyed digester)"
        )
    return integrity


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long each kind of record is kept after it stops mattering; ``None`` keeps it.

    Ages count from when a record became purgeable: consumed, decided or
    expired, written, or finished. Finished runs are kept by default.
    """

    consumed_checkpoints: timedelta | None = timedelta(days=30)
    decided_approvals: timedelta | None = timedelta(days=90)
    idempotency_records: timedelta | None = timedelta(days=7)
    finished_runs: timedelta | None = None
    batch_size: int = 200
