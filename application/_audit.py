"""Audits of a store: verify ledger chains, classify records, summarise heads, purge.

These use cases only read, except ``purge``; the ``flowvault ledger`` and
``purge`` verbs format what they return. Reads go through the store port and
the ``StreamCatalog`` and ``StoreStats`` capabilities, so an audit runs the
same over every backend, including a store opened read-only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final, Protocol, TypeVar

from flowvault.application._compaction import compact_after_commit
from flowvault.application._receipts import ReceiptDefect, compare_with_receipt
from flowvault.application._retention import RetentionJob, RetentionReport
from flowvault.application._sealed import SealedRepository
from flowvault.application._streams import read_stream
from flowvault.application.ports import (
    SecureObjectStore,
    StoreStats,
    StreamCatalog,
)
from flowvault.domain import (
    GENESIS_HASH,
    ChainDefect,
    FlowvaultError,
    HeadReceipt,
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    NotFound,
    StoreUnavailable,
    verify_chain,
)

T = TypeVar("T")

MAX_LISTED_UNREADABLE: Final = 100
"""An audit names at most this many unreadable records; it counts all of them."""

_PAGE: Final = 200


class Progress(Protocol):
    """Wraps an iterable to show progress (``CommandIO.progress`` is one)."""

    def __call__(self, items: Iterable[T], *, total: int | None, label: str) -> Iterable[T]:
        """Yield ``items`` unchanged while reporting how far along they are."""
        ...


def no_progress(items: Iterable[T], *, total: int | None, label: str) -> Iterable[T]:
    """Return ``items`` as they are: the ``Progress`` that shows nothing."""
    del total, label
    return items


class RecordReadability(StrEnum):
    """What an audit learnt of one sealed record."""

    READABLE = "readable"
    """It opened and verified under the key."""
    UNREADABLE = "unreadable"
    """Its row, its seal or its body did not verify under the key."""
    UNVERIFIED = "unverified"
    """No key was available, so it was counted but not opened."""


@dataclass(frozen=True, slots=True)
class StreamFailure:
    """Where and why a stream's chain is broken, or departs from a kept receipt."""

    stream: str
    index: int | None
    defect: ChainDefect | ReceiptDefect
    reason: str


@dataclass(frozen=True, slots=True)
class StreamAudit:
    """One stream's verification: the events that verified, and the first defect if any."""

    stream: str
    events: int
    first_index: int | None
    failure: StreamFailure | None = None

    @property
    def ok(self) -> bool:
        """Whether every retained event verified."""
        return self.failure is None


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """A record that did not open: its address only, never its content."""

    namespace: str
    key_digest: str


@dataclass(frozen=True, slots=True)
class AuditReport:
    """The outcome of auditing streams and (optionally) every record."""

    streams: tuple[StreamAudit, ...]
    records: Mapping[RecordReadability, int] | None = None
    unreadable: tuple[UnreadableRecord, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every stream verified; unreadable records are reported, not failed."""
        return all(stream.ok for stream in self.streams)

    @property
    def events(self) -> int:
        """Events that verified, over every stream."""
        return sum(stream.events for stream in self.streams)

    @property
    def failures(self) -> tuple[StreamFailure, ...]:
        """The first defect of every broken stream."""
        return tuple(s.failure for s in self.streams if s.failure is not None)


@dataclass(slots=True)
class _Tracked:
    """Remembers the last event an iterator yielded, to place a read that fails."""

    events: Iterator[LedgerEvent]
    last_index: int | None = None
    count: int = 0

    def __iter__(self) -> Iterator[LedgerEvent]:
        for event in self.events:
            self.last_index = event.index
            self.count += 1
            yield event


def _start(first: LedgerEvent) -> tuple[int, str]:
    """Where verification starts: genesis, or the first retained event's own link.

    After retention trims a stream, its first retained event is the trusted
    starting point; the chain is verified from there to the head.
    """
    if first.index == 0:
        return 0, GENESIS_HASH
    return first.index, first.previous_hash


def _first_unreadable(store: SecureObjectStore, stream: str, start: int) -> int | None:
    """Return the index of the first event from ``start`` on whose row does not decode.

    Reads one event at a time, so it is used only once a page failed.
    """
    index = start
    while True:
        try:
            page = store.read_ledger(stream, from_index=index, limit=1)
        except IntegrityFailure:
            return index
        if not page.events:
            return None
        index = page.events[0].index + 1


def _unreadable_failure(store: SecureObjectStore, stream: str, start: int) -> StreamFailure:
    index = _first_unreadable(store, stream, start)
    return StreamFailure(stream, index, ChainDefect.EDITED, "a stored event row is malformed")


def verify_stream(store: SecureObjectStore, stream: str) -> StreamAudit:
    """Verify one stream's retained events from the first retained one to the head.

    A row that no longer decodes is reported as ``edited`` at its index.
    ``events`` counts the events that verified before the first defect.

    Raises:
        NotFound: the stream holds no events.

    """
    try:
        opening = store.read_ledger(stream, from_index=0, limit=1)
    except IntegrityFailure:
        reason = "the first retained event row is malformed"
        return StreamAudit(stream, 0, None, StreamFailure(stream, None, ChainDefect.EDITED, reason))
    if not opening.events:
        raise NotFound(f"no ledger stream named {stream!r}", stream=stream)
    first = opening.events[0]
    start_index, previous = _start(first)
    tracked = _Tracked(read_stream(store, stream))
    try:
        verdict = verify_chain(tracked, start_index=start_index, previous_hash=previous)
    except InvalidInput:
        reason = "the first retained event's previous_hash cannot start a chain"
        failure = StreamFailure(stream, first.index, ChainDefect.WRONG_PREVIOUS, reason)
        return StreamAudit(stream, 0, first.index, failure)
    except IntegrityFailure:
        start = first.index if tracked.last_index is None else tracked.last_index + 1
        failure = _unreadable_failure(store, stream, start)
        return StreamAudit(stream, tracked.count, first.index, failure)
    if verdict.ok or verdict.defect is None:
        return StreamAudit(stream, verdict.checked, first.index)
    failure = StreamFailure(
        stream, verdict.first_bad_index, verdict.defect, verdict.reason or verdict.defect.value
    )
    return StreamAudit(stream, verdict.checked, first.index, failure)


def _verify_listed(store: SecureObjectStore, stream: str) -> StreamAudit:
    """Verify a stream the catalog lists; one with no events means the catalog was altered.

    Retention never removes a stream's head event, so no listed stream is empty.
    """
    try:
        return verify_stream(store, stream)
    except NotFound:
        reason = "the stream catalog lists a stream that holds no events"
        return StreamAudit(stream, 0, None, StreamFailure(stream, None, ChainDefect.GAP, reason))


def list_all_streams(store: SecureObjectStore) -> list[str]:
    """Return the name of every stream, sorted.

    Raises:
        StoreUnavailable: the store cannot enumerate its streams.

    """
    if not isinstance(store, StreamCatalog):
        raise StoreUnavailable("this store cannot list its ledger streams (no StreamCatalog)")
    names: list[str] = []
    while page := store.list_streams(after=names[-1] if names else None, limit=_PAGE):
        names.extend(page)
    return names


class LedgerAudit:
    """Verifies streams and classifies records; opens records only when given the key.

    ``repository`` is the sealed repository over ``store`` under the store's
    key, or ``None`` when no key is at hand: then records are counted as
    ``unverified`` instead of opened, and the chains are verified all the
    same (they need no key).
    """

    def __init__(self, store: SecureObjectStore, repository: SealedRepository | None) -> None:
        self._store = store
        self._repository = repository

    @property
    def keyed(self) -> bool:
        """Whether records are opened (a key is at hand) rather than counted unverified."""
        return self._repository is not None

    def run(
        self,
        streams: Iterable[str] | None = None,
        *,
        progress: Progress = no_progress,
    ) -> AuditReport:
        """Verify ``streams`` (every stream and every record when ``None``)."""
        if streams is not None:
            names = list(streams)
            audits = progress(names, total=len(names), label="verifying streams")
            return AuditReport(tuple(verify_stream(self._store, name) for name in audits))
        names = list_all_streams(self._store)
        audits = progress(names, total=len(names), label="verifying streams")
        verified = tuple(_verify_listed(self._store, name) for name in audits)
        counts: Counter[RecordReadability] = Counter(dict.fromkeys(RecordReadability, 0))
        unreadable: list[UnreadableRecord] = []
        checks = progress(self._records(), total=self._record_total(), label="opening records")
        for record, readability in checks:
            counts[readability] += 1
            if readability is RecordReadability.UNREADABLE:
                unreadable.append(record)
        return AuditReport(verified, dict(counts), tuple(unreadable[:MAX_LISTED_UNREADABLE]))

    def against(
        self, receipts: Iterable[HeadReceipt], *, progress: Progress = no_progress
    ) -> AuditReport:
        """Verify each receipt's stream, then check it still holds the receipt's head there.

        Authenticate the receipts first (``authenticate``): this compares
        positions, and a forged receipt would compare as well as a real one.
        """
        kept = list(receipts)
        if not all(isinstance(receipt, HeadReceipt) for receipt in kept):
            raise InvalidInput("receipts must be HeadReceipt values, as parse_receipt returns")
        checks = progress(kept, total=len(kept), label="checking receipts")
        return AuditReport(tuple(self._against(receipt) for receipt in checks))

    def _against(self, receipt: HeadReceipt) -> StreamAudit:
        note = receipt.note
        try:
            audit = verify_stream(self._store, note.stream)
        except NotFound:
            audit = StreamAudit(note.stream, 0, None)
        if not audit.ok:
            return audit
        mismatch = compare_with_receipt(self._store, note)
        if mismatch is None:
            return audit
        failure = StreamFailure(note.stream, mismatch.index, mismatch.defect, mismatch.reason)
        return StreamAudit(audit.stream, audit.events, audit.first_index, failure)

    def _namespaces(self) -> Mapping[str, int]:
        return self._store.namespace_counts() if isinstance(self._store, StoreStats) else {}

    def _record_total(self) -> int:
        return sum(self._namespaces().values())

    def _records(self) -> Iterator[tuple[UnreadableRecord, RecordReadability]]:
        for namespace in sorted(self._namespaces()):
            cursor: str | None = None
            while True:
                page = self._store.list(namespace, cursor=cursor, limit=_PAGE)
                for metadata in page.items:
                    address = UnreadableRecord(namespace, metadata.key_digest)
                    yield address, self._classify(address)
                cursor = page.next_cursor
                if cursor is None:
                    break

    def _classify(self, address: UnreadableRecord) -> RecordReadability:
        if self._repository is None:
            return RecordReadability.UNVERIFIED
        try:
            record = self._store.load(address.namespace, address.key_digest)
            if record is None:
                return RecordReadability.UNREADABLE
            self._repository.open(
                record, namespace=address.namespace, key_digest=address.key_digest
            )
        except FlowvaultError:
            return RecordReadability.UNREADABLE
        return RecordReadability.READABLE


@dataclass(frozen=True, slots=True)
class PurgeOutcome:
    """What one retention pass deleted, and whether the compaction after it completed."""

    report: RetentionReport
    compacted: bool


def purge(
    job: RetentionJob,
    store: SecureObjectStore,
    *,
    now: datetime | None = None,
    progress: Progress = no_progress,
) -> PurgeOutcome:
    """Run the retention job (expired action results first), then compact the store.

    The purgers compact after themselves when they delete; the final
    compaction makes sure no purged bytes linger whatever ran before.
    """
    report = RetentionReport()
    compacted = True
    for step in progress(("retention", "compaction"), total=2, label="purging"):
        if step == "retention":
            report = job.run(now)
        else:
            compacted = compact_after_commit(store)
    return PurgeOutcome(report, compacted)
