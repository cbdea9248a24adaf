"""A key store that lives as long as the process, for the in-memory backend."""

from __future__ import annotations

import threading


class InMemoryKeyStore:
    """``KeyStore`` for a store that keeps nothing either: the key dies with the process."""

    def __init__(self) -> None:
        self._key: bytes | None = None
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        """Where the key is kept."""
        return "process memory (lost at exit)"

    def read(self) -> bytes | None:
        """Return the key once created."""
        with self._lock:
            return self._key

    def create(self, key: bytes) -> bytes:
        """Keep ``key`` unless one exists; return the key that is kept."""
        with self._lock:
            if self._key is None:
                self._key = key
            return self._key

    def __repr__(self) -> str:
        return f"InMemoryKeyStore(created={self._key is not None})"
