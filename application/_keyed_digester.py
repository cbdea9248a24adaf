"""The one thing most checks need of the integrity key: a keyed digest under a purpose tag."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class KeyedDigester(Protocol):
    """Computes keyed digests under the integrity key (``SealedRepository`` is one)."""

    def keyed_digest(self, tag: str, data: bytes | str) -> str:
        """Return ``sha256:<hex>`` HMAC of ``data`` for purpose ``tag``."""
        ...

