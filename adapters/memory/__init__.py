"""The in-memory adapter: reference semantics for every port, nothing durable."""

from flowvault.adapters.memory._keys import InMemoryKeyStore
from flowvault.adapters.memory._store import InMemorySecureObjectStore

__all__ = ["InMemoryKeyStore", "InMemorySecureObjectStore"]
