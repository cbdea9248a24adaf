"""Reading and extending ledger streams through the store port."""

from __future__ import annotations

from collections.abc import Iterator

from flowvault.application.ports import SecureObjectStore
from flowvault.domain import GENESIS_HASH, LedgerEvent


def read_stream(store: SecureObjectStore, stream: str) -> Iterator[LedgerEvent]:
    """Yield every retained event of ``stream``, oldest first, a page at a time."""
    next_index: int | None = 0
    while next_index is not None:
        page = store.read_ledger(stream, from_index=next_index, limit=200)
        yield from page.events
        next_index = page.next_index


def next_position(store: SecureObjectStore, stream: str) -> tuple[int, str]:
    """Return the index and previous hash the next event of ``stream`` must carry."""
    head = store.ledger_head(stream)
    return (0, GENESIS_HASH) if head is None else (head.index + 1, head.event_hash)
