"""The store decorator that advances the high-water mark after every commit it passes on."""

from __future__ import annotations

from collections.abc import Sequence

from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._mark_flusher import MarkFlusher, advance_or_defer
from flowvault.application._records import (
    LedgerPage,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    UnitOfWork,
)
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import LedgerEvent


class HighWaterStore:
    """The store with its mark advanced after every commit; everything else passes through.

    With a ``flusher`` the mark trails the commits by its window (the
    default); without one each commit writes and syncs the mark before it
    returns (the strict mode). flowvault's services never ask this
    decorator for an optional capability: they hold the ``StoreCapabilities``
    found on the wrapped store. The capabilities are still forwarded, as
    the wrapped store has them, for hosts that reach one through
    ``Runtime.store`` (``Runtime.capabilities`` is the typed way).
    """

    def __init__(
        self, store: SecureObjectStore, guard: AntiRollback, flusher: MarkFlusher | None = None
    ) -> None:
        self._store = store
        self._guard = guard
        self._flusher = flusher

    @property
    def wrapped(self) -> SecureObjectStore:
        """The store underneath."""
        return self._store

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Forward to the store."""
        return self._store.load(namespace, key_digest)

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        """Forward to the store."""
        return self._store.peek_metadata(namespace, key_digest)

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Forward to the store."""
        return self._store.list(namespace, filters=filters, order=order, cursor=cursor, limit=limit)

    def commit(self, unit: UnitOfWork) -> None:
        """Commit, then advance the mark past this commit, now or within the flusher's window.

        The commit is durable once the store returns; a mark that cannot be
        written then is logged (``high_water_mark_deferred``) rather than
        raised, since an error would tell the caller the commit failed and
        its retry would conflict. A later write or ``close`` writes it.
        Streams the unit dropped are forgotten by the mark.
        """
        self._store.commit(unit)
        if unit.empty:
            return
        sizes = {event.stream: event.index + 1 for event in unit.appends}
        dropped = [drop.stream for drop in unit.drops]
        if self._flusher is not None:
            self._flusher.note(sizes, dropped)
        else:
            advance_or_defer(self._guard, sizes, dropped)

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Forward to the store."""
        return self._store.ledger_head(stream)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Forward to the store."""
        return self._store.read_ledger(stream, from_index=from_index, limit=limit)

    def close(self) -> None:
        """Stop the flusher, advance the mark one last time, then close the store."""
        try:
            if self._flusher is not None:
                self._flusher.stop()
            advance_or_defer(self._guard)
        finally:
            self._store.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def __repr__(self) -> str:
        return f"HighWaterStore({self._store!r})"


__all__ = ["HighWaterStore"]
