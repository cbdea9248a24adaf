"""The in-memory reference adapter: the contract's semantics, nothing durable."""

from __future__ import annotations

import builtins
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flowvault.adapters._rows import require_seal_count, require_stream_names, require_text
from flowvault.application import (
    Delete,
    LedgerPage,
    LedgerTrim,
    ListCursor,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoreContents,
    StoredRecord,
    UnitOfWork,
    Upsert,
    check_append,
    check_delete,
    check_drop,
    check_upsert,
    effective_limit,
)
from flowvault.application import _observability as observe
from flowvault.application._record_reads import key_digest_names, label_listing_args, label_page
from flowvault.application._records import check_filters
from flowvault.application.ports import MAX_LOAD_BATCH
from flowvault.domain import (
    InvalidInput,
    LedgerEvent,
    RevisionConflict,
    StoreNotEmpty,
    StoreUnavailable,
)
from flowvault.domain._envelope import format_instant

_Key = tuple[str, str]
_Keys = list[_Key]


@dataclass(slots=True)
class _Stream:
    first_index: int = 0
    events: list[LedgerEvent] = field(default_factory=list)

    @property
    def head(self) -> LedgerEvent | None:
        return self.events[-1] if self.events else None


def _sort_key(order: Order) -> Callable[[RecordMetadata], tuple[str, str]]:
    if order is Order.KEY:
        return lambda meta: ("", meta.key_digest)
    return lambda meta: (format_instant(meta.header.written_at), meta.key_digest)


class InMemorySecureObjectStore:
    """Thread-safe ``SecureObjectStore`` held in dictionaries under one lock.

    Also ``StoreStats``, ``StreamCatalog``, ``Compactor``, ``SealCounter``,
    ``StoreEpoch``, ``StoreFill``, ``LabelListing`` and ``BatchLoad``.
    It is the reference the durable adapters are held to, and the fast
    backend for tests; everything is lost when the process ends, seal
    counts and the epoch included.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[_Key, StoredRecord] = {}
        self._streams: dict[str, _Stream] = {}
        self._seals: dict[str, int] = {}
        self._epoch = 0
        self._closed = False

    def __enter__(self) -> InMemorySecureObjectStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store is closed")

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Return the stored record or ``None``."""
        key = (require_text(namespace, "namespace"), require_text(key_digest, "key_digest"))
        with self._lock:
            self._check_open()
            return self._records.get(key)

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        """Return the record's metadata or ``None``."""
        record = self.load(namespace, key_digest)
        return None if record is None else record.metadata

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of matching metadata in ``order``."""
        require_text(namespace, "namespace")
        filters = check_filters(filters)
        limit = effective_limit(limit)
        position = None if cursor is None else ListCursor.decode(cursor, order)
        with self._lock:
            self._check_open()
            candidates = [
                record.metadata
                for (space, _), record in self._records.items()
                if space == namespace and all(f.admits(record.metadata) for f in filters)
            ]
        sort_key = _sort_key(order)
        descending = order is Order.WRITTEN_AT_DESC
        candidates.sort(key=sort_key, reverse=descending)
        if position is not None:
            mark = ("" if order is Order.KEY else position.written_at, position.key_digest)
            candidates = [
                meta
                for meta in candidates
                if (sort_key(meta) < mark if descending else sort_key(meta) > mark)
            ]
        items = tuple(candidates[:limit])
        next_cursor = None
        if len(candidates) > limit:
            last = items[-1]
            next_cursor = ListCursor(
                order, last.key_digest, format_instant(last.header.written_at)
            ).encode()
        return RecordPage(items=items, next_cursor=next_cursor)

    def list_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of the records carrying ``label``, by its value, then key digest."""
        limit, position = label_listing_args(
            namespace, label, descending=descending, filters=filters, cursor=cursor, limit=limit
        )
        with self._lock:
            self._check_open()
            candidates = [
                record.metadata
                for (space, _), record in self._records.items()
                if space == namespace
                and label in record.metadata.labels
                and all(f.admits(record.metadata) for f in filters)
            ]
        return label_page(
            candidates, label, descending=descending, position=position, limit=limit
        )

    def load_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> builtins.list[StoredRecord]:
        """Return the first records ``list_by_label`` lists, read under one hold of the lock."""
        limit, _ = label_listing_args(
            namespace, label, descending=descending, filters=filters, cursor=None, limit=limit
        )
        with self._lock:
            self._check_open()
            candidates = {
                record.metadata.key_digest: record
                for (space, _), record in self._records.items()
                if space == namespace
                and label in record.metadata.labels
                and all(f.admits(record.metadata) for f in filters)
            }
        page = label_page(
            [record.metadata for record in candidates.values()],
            label,
            descending=descending,
            position=None,
            limit=limit,
        )
        return [candidates[meta.key_digest] for meta in page.items]

    def load_many(self, namespace: str, key_digests: Sequence[str]) -> dict[str, StoredRecord]:
        """Return the stored records among ``key_digests``, read under one hold of the lock."""
        require_text(namespace, "namespace")
        names = key_digest_names(key_digests, MAX_LOAD_BATCH)
        with self._lock:
            self._check_open()
            found = {name: self._records.get((namespace, name)) for name in names}
        return {name: record for name, record in found.items() if record is not None}

    def commit(self, unit: UnitOfWork) -> None:
        """Check every guard, then apply every write, under one lock; a failed write undoes all."""
        started = time.perf_counter()
        with self._lock:
            self._check_open()
            try:
                removals = self._check(unit)
            except RevisionConflict as conflict:
                observe.revision_conflict("memory", unit, conflict.details.get("guard"))
                raise
            undo = self._undo_log(unit)
            try:
                for upsert in unit.upserts:
                    self._apply_upsert(upsert)
                for key in removals:
                    self._apply_delete(key)
                for event in unit.appends:
                    self._apply_append(event)
                for trim in unit.trims:
                    self._apply_trim(trim)
                for drop in unit.drops:
                    self._streams.pop(drop.stream, None)
            except BaseException:
                undo()
                raise
            if not unit.empty:
                self._epoch += 1
                observe.unit_committed("memory", unit, started)

    def _undo_log(self, unit: UnitOfWork) -> Callable[[], None]:
        """Return what puts back every record and stream ``unit`` touches, as they are now.

        Costs O(writes): appends only grow a stream's list, trims replace it
        and drops unlink the stream, so keeping the list and its length is
        enough to restore it.
        """
        keys = [(u.header.namespace, u.header.key_digest) for u in unit.upserts]
        keys += [(d.namespace, d.key_digest) for d in unit.deletes]
        records = {key: self._records.get(key) for key in keys}
        names = {event.stream for event in unit.appends} | {trim.stream for trim in unit.trims}
        names |= {drop.stream for drop in unit.drops}
        streams = {name: self._streams.get(name) for name in names}
        marks = {
            name: (stream.first_index, stream.events, len(stream.events))
            for name, stream in streams.items()
            if stream is not None
        }

        def undo() -> None:
            for key, record in records.items():
                if record is None:
                    self._records.pop(key, None)
                else:
                    self._records[key] = record
            for name, stream in streams.items():
                if stream is None:
                    self._streams.pop(name, None)
                    continue
                stream.first_index, stream.events, length = marks[name]
                del stream.events[length:]
                self._streams[name] = stream

        return undo

    def _check(self, unit: UnitOfWork) -> _Keys:
        for upsert in unit.upserts:
            header = upsert.header
            current = self._records.get((header.namespace, header.key_digest))
            stored = None if current is None else current.metadata
            check_upsert(
                header.namespace,
                header.key_digest,
                upsert.expected,
                None if stored is None else stored.revision,
                header.revision,
                replaces=upsert.replaces,
                stored_digest=None if stored is None else stored.payload_digest,
            )
        removals = [key for delete in unit.deletes if (key := self._check_delete(delete))]
        heads: dict[str, tuple[int | None, str | None]] = {}
        for event in unit.appends:
            if event.stream not in heads:
                head = self._streams.get(event.stream, _Stream()).head
                heads[event.stream] = (
                    (None, None) if head is None else (head.index, head.event_hash)
                )
            check_append(event, *heads[event.stream])
            heads[event.stream] = (event.index, event.event_hash)
        for drop in unit.drops:
            head = self._streams.get(drop.stream, _Stream()).head
            check_drop(drop.stream, drop.head_index, None if head is None else head.index)
        return removals

    def _check_delete(self, delete: Delete) -> _Key | None:
        key = (delete.namespace, delete.key_digest)
        current = self._records.get(key)
        stored = None if current is None else current.metadata.revision
        return (
            key
            if check_delete(delete.namespace, delete.key_digest, delete.expected, stored)
            else None
        )

    def _apply_upsert(self, upsert: Upsert) -> None:
        key = (upsert.header.namespace, upsert.header.key_digest)
        self._records[key] = StoredRecord(metadata=upsert.metadata, payload=upsert.payload)

    def _apply_delete(self, key: _Key) -> None:
        del self._records[key]

    def _apply_append(self, event: LedgerEvent) -> None:
        self._streams.setdefault(event.stream, _Stream()).events.append(event)

    def _apply_trim(self, trim: LedgerTrim) -> None:
        stream = self._streams.get(trim.stream)
        if stream is None or not stream.events:
            return
        head_index = stream.events[-1].index
        cut = min(trim.before_index, head_index) - stream.first_index
        if cut > 0:
            stream.events = stream.events[cut:]
            stream.first_index += cut

    def fill(self, contents: StoreContents) -> None:
        """Hold ``contents`` as given, under the lock, if the store holds nothing yet."""
        with self._lock:
            self._check_open()
            if self._records or any(s.events for s in self._streams.values()) or self._seals:
                raise StoreNotEmpty("the store already holds data")
            for record in contents.records:
                self._records[(record.metadata.namespace, record.metadata.key_digest)] = record
            for name, events in contents.streams().items():
                self._streams[name] = _Stream(first_index=events[0].index, events=list(events))
            self._seals = dict(contents.seal_counts)
            self._epoch = max(self._epoch, contents.epoch)

    def add(self, contents: StoreContents) -> None:
        """Hold ``contents`` next to what the store holds, if none of its keys or streams exist."""
        with self._lock:
            self._check_open()
            keys = [(r.metadata.namespace, r.metadata.key_digest) for r in contents.records]
            streams = contents.streams()
            if any(key in self._records for key in keys) or any(
                name in self._streams for name in streams
            ):
                raise StoreNotEmpty("the store already holds one of these records or streams")
            for key, record in zip(keys, contents.records, strict=True):
                self._records[key] = record
            for name, events in streams.items():
                self._streams[name] = _Stream(first_index=events[0].index, events=list(events))
            for key_id, count in contents.seal_counts.items():
                self._seals[key_id] = self._seals.get(key_id, 0) + count
            self._epoch += 1

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Return the last event of ``stream`` or ``None``."""
        require_text(stream, "stream")
        with self._lock:
            self._check_open()
            found = self._streams.get(stream)
            return None if found is None else found.head

    def ledger_head_index(self, stream: str) -> int | None:
        """Return the index of the last event of ``stream`` or ``None``."""
        head = self.ledger_head(stream)
        return None if head is None else head.index

    def ledger_head_indexes(self, streams: Sequence[str]) -> dict[str, int]:
        """Return the index of the last event of each named stream that holds events."""
        names = require_stream_names(streams)
        with self._lock:
            self._check_open()
            heads = {name: self._streams[name].head for name in names if name in self._streams}
        return {name: head.index for name, head in heads.items() if head is not None}

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Return retained events from ``from_index`` on, flagging trimmed ones."""
        limit = effective_limit(limit)
        require_text(stream, "stream")
        if isinstance(from_index, bool) or not isinstance(from_index, int) or from_index < 0:
            raise InvalidInput("from_index must not be negative")
        with self._lock:
            self._check_open()
            found = self._streams.get(stream, _Stream())
            gap = bool(found.events) and from_index < found.first_index
            start = max(from_index, found.first_index) - found.first_index
            events = tuple(found.events[start : start + limit])
            has_more = start + limit < len(found.events)
        next_index = events[-1].index + 1 if events and has_more else None
        return LedgerPage(events=events, next_index=next_index, gap=gap)

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        """Return up to ``limit`` stream names after ``after``, in code-point order."""
        limit = effective_limit(limit)
        if after is not None:
            require_text(after, "after")
        with self._lock:
            self._check_open()
            names = [name for name, found in self._streams.items() if found.events]
        return sorted(name for name in names if after is None or name > after)[:limit]

    def has_records(self) -> bool:
        """Return whether any record or ledger event exists."""
        with self._lock:
            self._check_open()
            return bool(self._records) or any(s.events for s in self._streams.values())

    def namespace_counts(self) -> dict[str, int]:
        """Return the number of records per namespace."""
        with self._lock:
            self._check_open()
            return dict(Counter(space for space, _ in self._records))

    def key_id_counts(self) -> dict[str, int]:
        """Return the number of records sealed under each key id."""
        with self._lock:
            self._check_open()
            return dict(Counter(r.metadata.header.key_id for r in self._records.values()))

    def reserve_seals(self, key_id: str, count: int) -> int:
        """Add ``count`` seals to ``key_id``'s counter and return its new total.

        The counter is outside every unit's undo log, so a commit that fails
        later never takes a reservation back.
        """
        require_text(key_id, "key_id")
        require_seal_count(count)
        with self._lock:
            self._check_open()
            total = self._seals.get(key_id, 0) + count
            self._seals[key_id] = total
            return total

    def seal_counts(self) -> dict[str, int]:
        """Return the reserved total per key id."""
        with self._lock:
            self._check_open()
            return dict(self._seals)

    def epoch(self) -> int:
        """Return the count of units committed; it lives and dies with the store object."""
        with self._lock:
            self._check_open()
            return self._epoch

    def compact(self) -> bool:
        """Nothing is on disk, so nothing lingers; always complete."""
        with self._lock:
            self._check_open()
        return True

    def close(self) -> None:
        """Mark the store closed; later calls raise ``StoreUnavailable``."""
        with self._lock:
            self._closed = True
