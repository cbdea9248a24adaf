"""Reading and extending ledger streams through the store port, and keying their events."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Final, Protocol

from flowvault.application.ports import SecureObjectStore
from flowvault.domain import GENESIS_HASH, LedgerEvent, canonical_bytes

LEDGER_MAC_TAG: Final = "flowvault.ledger-mac/1"
"""Purpose tag of an event's ``chain_mac``."""


class _Digester(Protocol):
    def keyed_digest(self, tag: str, data: bytes | str) -> str: ...


def chain_mac(event: LedgerEvent, digester: _Digester) -> str:
    """Return the MAC ``event`` must carry: HMAC-SHA-256 of its stream, index and hash.

    The event hash commits to the previous event's hash, so each MAC covers
    the whole chain before it: someone without the integrity key can
    recompute the plain hashes but not one MAC.
    """
    body = canonical_bytes([event.stream, event.index, event.event_hash])
    return digester.keyed_digest(LEDGER_MAC_TAG, body)


def keyed(event: LedgerEvent, digester: _Digester) -> LedgerEvent:
    """Return ``event`` carrying its ``chain_mac``; every event the services append is keyed."""
    return event.model_copy(update={"chain_mac": chain_mac(event, digester)})


def mac_matches(event: LedgerEvent, digester: _Digester) -> bool:
    """Return whether ``event`` carries the MAC the integrity key gives it (constant time)."""
    mac = event.chain_mac
    return isinstance(mac, str) and hmac.compare_digest(mac, chain_mac(event, digester))


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
