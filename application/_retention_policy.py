"""How long each kind of record is kept once it stops mattering."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.domain import InvalidInput


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
