"""A key store in process memory, for stores that keep nothing either."""

from __future__ import annotations

import threading

from flowvault.application._keys import KeyRing
from flowvault.domain import InvalidInput, RevisionConflict


class InMemoryKeyStore:
    """``KeyRingStore`` for a store that keeps nothing either: the keys die with the process."""

    def __init__(self) -> None:
        self._ring: KeyRing | None = None
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        """Where the key is kept."""
        return "process memory (lost at exit)"

    def read(self) -> bytes | None:
        """Return the primary key once created."""
        with self._lock:
            return None if self._ring is None else self._ring.primary

    def read_ring(self) -> KeyRing | None:
        """Return the ring once created."""
        with self._lock:
            return self._ring

    def create(self, key: bytes) -> bytes:
        """Keep ``key`` unless one exists; return the primary key that is kept."""
        with self._lock:
            if self._ring is None:
                self._ring = KeyRing(primary=key)
            return self._ring.primary

    def replace_ring(self, ring: KeyRing, *, expected: KeyRing) -> None:
        """Replace the ring if it is still ``expected``."""
        if not isinstance(ring, KeyRing):
            raise InvalidInput("a key ring must be a KeyRing")
        with self._lock:
            if self._ring != expected:
                raise RevisionConflict("the key ring changed meanwhile", guard="key ring")
            self._ring = ring

    def __repr__(self) -> str:
        return f"InMemoryKeyStore(created={self._ring is not None})"
