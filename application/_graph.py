"""Pieces shared by the run, checkpoint and approval services.

Run events, checkpoint tombstones and approval tombstones all live in the
owning run's stream, so one verified stream tells a run's whole story.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.domain import IntegrityKeyRequired, InvalidInput

RETENTION_TOMBSTONE = "retention.purged"
"""Event type of the digest-only record a retention deletion leaves behind."""

IDEMPOTENCY_STREAM = "retention/idempotency"
"""Stream for tombstones of idempotency records, which belong to no run."""


def run_stream(run_id: str) -> str:
    """Name of the ledger stream holding one run's events."""
    if not isinstance(run_id, str):
        raise InvalidInput("a run id must be text")
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

    def __post_init__(self) -> None:
        """Refuse a policy a pass could only apply partly: check every age and the batch first."""
        for name in AGES:
            _check_age(name, getattr(self, name))
        if type(self.batch_size) is not int or not 1 <= self.batch_size <= MAX_LIST_LIMIT:
            raise InvalidInput(f"batch_size must be within 1..{MAX_LIST_LIMIT}")


AGES = ("consumed_checkpoints", "decided_approvals", "idempotency_records", "finished_runs")
"""The policy's ages, each ``None`` (keep) or a non-negative ``timedelta``."""


def _check_age(name: str, age: object) -> None:
    if age is not None and (not isinstance(age, timedelta) or age < timedelta(0)):
        raise InvalidInput(f"{name} must be None or a non-negative timedelta")
