"""What this process last committed, kept so the next write can start from it.

A write reads its record and its stream's head before it builds the next
version: a load, an AEAD open, a parse, a validation and a freshness check
against the ledger. When this process wrote both itself, it already holds
them. An entry is only ever a starting point: the write built on it carries
the revision and stream-head guards it was built with, so if anything else
wrote since (another process, another service, an editor of the database)
the commit fails its guard, nothing is written, and the caller reads the
store instead. A stale entry costs one conflict and a reload, never a wrong
write.

Entries are taken out when used, so a write that fails for any reason leaves
none behind, and only a write that committed puts one back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final, Generic, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")

WRITE_CACHE_SIZE: Final = 4096
"""Entries kept per cache; the least recently written go first."""


class WriteCache(Generic[_K, _V]):
    """A bounded map from a key to what this process last committed under it.

    Thread-safe: services are shared by a host's threads.
    """

    __slots__ = ("_capacity", "_entries", "_lock")

    def __init__(self, capacity: int = WRITE_CACHE_SIZE) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[_K, _V] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: _K) -> _V | None:
        """Remove and return the entry for ``key``, or ``None``."""
        with self._lock:
            return self._entries.pop(key, None)

    def put(self, key: _K, value: _V) -> None:
        """Remember what a committed write left under ``key``."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def forget(self, key: _K) -> None:
        """Drop the entry for ``key``: this process changed it by another path."""
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
