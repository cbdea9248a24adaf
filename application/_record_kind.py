"""The machinery every typed record kind shares: list a namespace, open a row, purge.

Built only on the sealed repository and the store port. Listing walks every
page; opening a listed row tolerates a row deleted after it was listed; a
purge deletes a bounded batch per unit of work, each deletion committed with
the digest-only tombstones its streams receive, so a retention deletion is
never told apart from its record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from flowvault.application._compaction import compact_after_commit
from flowvault.application._instants import aware, micros
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    Delete,
    FilterOp,
    LabelFilter,
    RecordMetadata,
    UnitOfWork,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import keyed, next_position
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application.ports import Clock, SecureObjectStore
from flowvault.domain import InvalidInput, JsonValue, LedgerEvent, RevisionConflict
from flowvault.domain._envelope import format_instant
from flowvault.domain._sanitise import sanitise_payload

PURGE_BATCH: Final = 200
PURGE_STALLS: Final = 8
"""How many purge units may lose a race to a concurrent writer before a purge stops early."""


def purge_horizon(now: datetime, older_than: timedelta) -> int:
    """Return ``now - older_than`` as an integer label; records older than it are purged."""
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidInput("older_than must be a non-negative timedelta")
    try:
        return micros(aware(now, "now") - older_than)
    except OverflowError:
        raise InvalidInput("now - older_than lies before the first representable instant") from None


def batch_size_of(batch_size: int) -> int:
    """Return a caller's batch size, validated and capped at one listing page."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput("batch_size must be a positive integer")
    return min(batch_size, MAX_LIST_LIMIT)


def list_all(
    store: SecureObjectStore, namespace: str, filters: Sequence[LabelFilter]
) -> Iterator[RecordMetadata]:
    """Yield every record of ``namespace`` that matches ``filters``, page by page."""
    cursor: str | None = None
    while True:
        page = store.list(namespace, filters=filters, cursor=cursor, limit=MAX_LIST_LIMIT)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def open_listed(repository: SealedRepository, metadata: RecordMetadata) -> SealedDocument | None:
    """Open a listed record, or ``None`` when it was deleted after it was listed."""
    record = repository.store.load(metadata.namespace, metadata.key_digest)
    if record is None:
        return None
    return repository.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)


def int_label(metadata: RecordMetadata, name: str) -> int:
    """Return an integer label of a listed row, or -1 when it is absent or not an integer."""
    value = metadata.labels.get(name)
    return value if isinstance(value, int) else -1


@dataclass(frozen=True, slots=True)
class Doomed:
    """One record to purge: its deletions and the tombstone each of its streams receives.

    The owning stream (a run's, or the shared idempotency stream) tells the
    story; the record stream says the row is legitimately gone.
    """

    deletes: tuple[Delete, ...]
    streams: tuple[str, ...]
    tombstone: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class RecordPurge:
    """How one record kind is purged: its namespace, the instant label that ages it, its doom.

    ``doom`` turns a listed row into its deletions and tombstones, or
    ``None`` for a row that is not (or no longer) purgeable.
    """

    repository: SealedRepository
    clock: Clock
    namespace: str
    settled_label: str
    doom: Callable[[RecordMetadata], Doomed | None]

    def __call__(self, now: datetime, older_than: timedelta, batch_size: int) -> int:
        """Delete the records settled before ``now - older_than``; return how many."""
        filters = [LabelFilter(self.settled_label, purge_horizon(now, older_than), FilterOp.LT)]
        limit = batch_size_of(batch_size)
        repository = self.repository
        store = repository.store
        purged = stalled = 0
        while stalled < PURGE_STALLS:
            page = store.list(self.namespace, filters=filters, limit=limit)
            doomed = [item for item in map(self.doom, page.items) if item is not None]
            if not doomed:
                break
            try:
                store.commit(purge_unit(repository, self.clock.now(), doomed))
            except RevisionConflict:
                stalled += 1
                continue
            purged += len(doomed)
        if purged:
            compact_after_commit(repository.capabilities.compactor)
        return purged


def purge_unit(repository: SealedRepository, now: datetime, doomed: Sequence[Doomed]) -> UnitOfWork:
    """Chain each stream's tombstones consecutively onto its head, deletions alongside."""
    heads: dict[str, tuple[int, str]] = {}
    deletes: list[Delete] = []
    appends: list[LedgerEvent] = []
    for item in doomed:
        payload = sanitise_payload({**item.tombstone, "purged_at": format_instant(now)})
        for stream in item.streams:
            if stream not in heads:
                heads[stream] = next_position(repository.store, stream)
            index, previous = heads[stream]
            draft = LedgerEvent.create(
                stream=stream,
                index=index,
                type=RETENTION_TOMBSTONE,
                occurred_at=now,
                payload=payload,
                previous_hash=previous,
            )
            event = keyed(draft, repository)
            heads[stream] = (event.index + 1, event.event_hash)
            appends.append(event)
        deletes.extend(item.deletes)
    appends.sort(key=lambda event: (event.stream, event.index))
    return UnitOfWork(deletes=deletes, appends=appends)
