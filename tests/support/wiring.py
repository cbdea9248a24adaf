"""A runtime bootstrapped over one adapter's store, as the reliability families share it."""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import SecureObjectStore
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime


@dataclass(frozen=True)
class Wired:
    """A runtime over the parametrized backend's store, and the frozen clock it reads."""

    runtime: Runtime
    clock: FrozenClock
    backend: str
    """``memory``, ``sqlite`` or ``postgres``."""
    key: bytes
    """The master key the runtime was opened with."""

    @property
    def family(self) -> str:
        """The backend as the figures table names it."""
        return {"memory": "memory", "sqlite": "SQLite", "postgres": "PostgreSQL"}[self.backend]


def backend_of(store: SecureObjectStore) -> str:
    """Name the adapter behind ``store``."""
    if isinstance(store, InMemorySecureObjectStore):
        return "memory"
    if isinstance(store, SQLiteSecureObjectStore):
        return "sqlite"
    return "postgres"
