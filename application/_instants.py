"""Instants as the stores hold them: whole microseconds since the Unix epoch, in labels.

Labels are integers so that a store compares and orders them without knowing
about time zones; every service converts the same way, here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from flowvault.domain import InvalidInput

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND: Final = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """Return ``moment`` as whole microseconds since the epoch (an integer label)."""
    return (moment - EPOCH) // MICROSECOND


def from_micros(value: int) -> datetime:
    """Return the instant an integer label written by ``micros`` stands for."""
    return EPOCH + value * MICROSECOND


def aware(moment: object, what: str) -> datetime:
    """Return ``moment`` if it is timezone-aware; else ``InvalidInput`` naming ``what``."""
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidInput(f"{what} must be a timezone-aware datetime")
    return moment
