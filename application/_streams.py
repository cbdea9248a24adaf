"""Reading, extending and trimming ledger streams through the store port; keying events."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import datetime
from typing import Final

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._records import LedgerTrim, UnitOfWork
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import InvalidInput, JsonValue, LedgerEvent
from flowvault.domain._canonical import MAX_SAFE_INTEGER, canonical_bytes, quote_string
from flowvault.domain._ledger import GENESIS_HASH
from flowvault.domain._sanitise import sanitise_payload

LEDGER_MAC_TAG: Final = "flowvault.ledger-mac/1"
"""Purpose tag of an event's ``chain_mac``."""

TRIM_EVENT: Final = "ledger.trimmed"
"""The event that makes a trim legitimate: the first index kept, the last hash removed."""

VOUCH_EVENT: Final = "ledger.vouched"
"""A key holder's word for what came before: events without a MAC, or a prefix cut earlier."""

MAINTENANCE_EVENTS: Final = frozenset({TRIM_EVENT, VOUCH_EVENT})
"""Events about the stream itself: they leave every record it binds as it is."""


def run_stream(run_id: str) -> str:
    """Name of the ledger stream holding one run's events."""
    if not isinstance(run_id, str):
        raise InvalidInput("a run id must be text")
    return f"run/{run_id}"


def chain_mac(event: LedgerEvent, digester: KeyedDigester) -> str:
    """Return the MAC ``event`` must carry: HMAC-SHA-256 of its stream, index and hash.

    The event hash commits to the previous event's hash, so each MAC covers
    the whole chain before it: someone without the integrity key can
    recompute the plain hashes but not one MAC. The message is the canonical
    JSON of ``[stream, index, event_hash]``; for ASCII text (every digest,
    and most stream names) it is put together directly, as the encoder would
    write it, instead of walking and encoding a list per event.
    """
    stream, index, event_hash = event.stream, event.index, event.event_hash
    body: bytes | str
    if (
        type(stream) is str
        and type(event_hash) is str
        and type(index) is int
        and 0 <= index <= MAX_SAFE_INTEGER
        and stream.isascii()
        and event_hash.isascii()
    ):
        body = f"[{quote_string(stream)},{index},{quote_string(event_hash)}]"
    else:
        body = canonical_bytes([stream, index, event_hash])
    return digester.keyed_digest(LEDGER_MAC_TAG, body)


def keyed(event: LedgerEvent, digester: KeyedDigester) -> LedgerEvent:
    """Return ``event`` carrying its ``chain_mac``; every event the services append is keyed."""
    return event.with_chain_mac(chain_mac(event, digester))


def mac_matches(event: LedgerEvent, digester: KeyedDigester) -> bool:
    """Return whether ``event`` carries the MAC the integrity key gives it (constant time)."""
    mac = event.chain_mac
    return isinstance(mac, str) and hmac.compare_digest(mac, chain_mac(event, digester))


def chained_event(
    digester: KeyedDigester,
    stream: str,
    event_type: str,
    payload: JsonValue,
    occurred_at: datetime,
    *,
    after: LedgerEvent | None,
) -> LedgerEvent:
    """Build the keyed event that follows ``after`` in ``stream`` (``None``: the first event).

    For a host's own kind of record bound to a stream: append the event in
    the same unit of work as the rows, and put its index in their headers
    (``ledger_index``), so a row put back from an older copy names an
    event that a later one supersedes. The payload is sanitised as every
    ledger payload is. Several events of one unit chain by passing the
    one before as ``after``; the unit's append guard then fails the whole
    unit if another writer appended first.
    """
    if after is not None and after.stream != stream:
        raise InvalidInput("an event follows an event of its own stream")
    index, previous = (0, GENESIS_HASH) if after is None else (after.index + 1, after.event_hash)
    draft = LedgerEvent.create(
        stream=stream,
        index=index,
        type=event_type,
        occurred_at=occurred_at,
        payload=sanitise_payload(payload),
        previous_hash=previous,
    )
    return keyed(draft, digester)


def read_stream(store: SecureObjectStore, stream: str) -> Iterator[LedgerEvent]:
    """Yield every retained event of ``stream``, oldest first, a page at a time."""
    next_index: int | None = 0
    while next_index is not None:
        page = store.read_ledger(stream, from_index=next_index, limit=200)
        yield from page.events
        next_index = page.next_index


def newest_first(store: SecureObjectStore, head: LedgerEvent) -> Iterator[LedgerEvent]:
    """Yield ``head`` and the events before it, newest first, until a gap or index 0.

    Readers that judge a stream by its newest events (a purge, a reset, a
    trim on top) stop after a few; a missing predecessor ends the walk
    rather than being skipped over.
    """
    event: LedgerEvent | None = head
    while event is not None:
        yield event
        if event.index == 0:
            return
        page = store.read_ledger(event.stream, from_index=event.index - 1, limit=1)
        before = page.events[0] if page.events else None
        event = before if before is not None and before.index == event.index - 1 else None


def next_position(store: SecureObjectStore, stream: str) -> tuple[int, str]:
    """Return the index and previous hash the next event of ``stream`` must carry."""
    head = store.ledger_head(stream)
    return (0, GENESIS_HASH) if head is None else (head.index + 1, head.event_hash)


def trim_unit(
    store: SecureObjectStore,
    digester: KeyedDigester,
    stream: str,
    *,
    before_index: int,
    occurred_at: datetime,
) -> UnitOfWork:
    """Return the unit that drops the events of ``stream`` below ``before_index``, on the record.

    A trim without an event of its own would look, to every verifier, like
    events deleted by someone without the key. The unit therefore appends a
    keyed ``ledger.trimmed`` event naming ``before_index`` and the hash of
    the last event it removes, then trims. Commit it as it is; a concurrent
    append makes it fail with ``RevisionConflict``, and nothing is dropped.
    Trim only events no live record names: a record whose event is trimmed
    away can no longer be shown current, and reads as stale.

    Raises:
        InvalidInput: nothing to trim (the stream is empty, or ``before_index``
            is not past its first retained event), or ``before_index`` lies
            past the head's successor.

    """
    if type(before_index) is not int or before_index < 1:
        raise InvalidInput("before_index must be a positive integer")
    head = store.ledger_head(stream)
    if head is None or before_index > head.index + 1:
        raise InvalidInput("a trim must keep the stream's head or the trim event after it")
    page = store.read_ledger(stream, from_index=before_index - 1, limit=1)
    removed = page.events[0] if page.events else None
    if page.gap or removed is None or removed.index != before_index - 1:
        raise InvalidInput("the stream is already trimmed at or past before_index")
    event = LedgerEvent.create(
        stream=stream,
        index=head.index + 1,
        type=TRIM_EVENT,
        occurred_at=occurred_at,
        payload={"before_index": before_index, "removed_hash": removed.event_hash},
        previous_hash=head.event_hash,
    )
    return UnitOfWork(appends=[keyed(event, digester)], trims=[LedgerTrim(stream, before_index)])
