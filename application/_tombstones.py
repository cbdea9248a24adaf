"""What a retention deletion leaves behind, and where it goes for records of no run."""

from __future__ import annotations

RETENTION_TOMBSTONE = "retention.purged"
"""Event type of the digest-only record a retention deletion leaves behind."""

IDEMPOTENCY_STREAM = "retention/idempotency"
"""Stream for tombstones of idempotency records, which belong to no run."""
