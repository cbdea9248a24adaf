"""A store that is not durable, for the durability contract's negative control.

``BuffersUntilClose`` is the SQLite adapter whose ``commit`` only queues the
unit in memory and returns: the unit reaches the file when the store is
closed. It acknowledges before it stores, so a killed process loses every
unit it acknowledged, while a clean close loses nothing.
"""

from __future__ import annotations

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import UnitOfWork


class BuffersUntilClose(SQLiteSecureObjectStore):
    """Acknowledges each unit at once and writes the queue on ``close()``."""

    _pending: list[UnitOfWork]

    def commit(self, unit: UnitOfWork) -> None:
        self.__dict__.setdefault("_pending", []).append(unit)

    def close(self) -> None:
        for unit in self.__dict__.pop("_pending", []):
            super().commit(unit)
        super().close()
