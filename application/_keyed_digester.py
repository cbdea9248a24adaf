"""The one thing most checks need of the integrity key: a keyed digest under a purpose tag."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from flowvault.domain import IntegrityKeyRequired


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
