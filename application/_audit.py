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

from flowvault.application import _observability as observe
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._capabilities import StoreCapabilities
from flowvault.application._compaction import compact_after_commit
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._receipts import (
    ReceiptDefect,
    ReceiptSigner,
    compare_with_receipt,
    issue_receipt,
)
from flowvault.application._record_audit import BoundRecords, StaleRecord
from flowvault.application._retention import RetentionJob, RetentionReport
from flowvault.application._sealed import SealedRepository
from flowvault.application._verified import StreamVerifier
from flowvault.application.ports import SecureObjectStore, StreamCatalog
from flowvault.domain import (
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    KeyRequired,
    LedgerEvent,
    NotFound,
    StoreRolledBack,
    StoreUnavailable,
)
from flowvault.domain._ledger import ChainDefect
from flowvault.domain._receipt import HeadReceipt

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
    """One stream's verification: the events that verified, and the first defect if any.

    ``unkeyed`` counts the events a keyed audit accepted on the plain chain
    alone: appended without a ``chain_mac``, before a keyed event that covers them.
    """

    stream: str
    events: int
    first_index: int | None
    failure: StreamFailure | None = None
    unkeyed: int = 0

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
    """The outcome of auditing streams and (optionally) every record.

    ``ok`` is false for anything that shows tampering: a stream that fails
    verification, a record that does not open, a record older than its
    stream says (``stale``: a row put back, or its newer history cut off),
    or a store below its high-water mark (``rolled_back``: a stream's
    newest events cut, or an older copy put back).
    """

    streams: tuple[StreamAudit, ...]
    records: Mapping[RecordReadability, int] | None = None
    unreadable: tuple[UnreadableRecord, ...] = ()
    stale: tuple[StaleRecord, ...] = ()
    rolled_back: str | None = None
    """Why the store is below its high-water mark (or the mark fails), when it is."""

    @property
    def ok(self) -> bool:
        """Whether every stream verified, every record opened and is current, and no rollback."""
        unreadable = 0 if self.records is None else self.records[RecordReadability.UNREADABLE]
        clean = not unreadable and not self.stale and self.rolled_back is None
        return all(stream.ok for stream in self.streams) and clean

    @property
    def events(self) -> int:
        """Events that verified, over every stream."""
        return sum(stream.events for stream in self.streams)

    @property
    def unkeyed(self) -> int:
        """Events of keyed audits that carry no ``chain_mac`` (appended without ``keyed``)."""
        return sum(stream.unkeyed for stream in self.streams)

    @property
    def failures(self) -> tuple[StreamFailure, ...]:
        """The first defect of every broken stream."""
        return tuple(s.failure for s in self.streams if s.failure is not None)

    @property
    def unreadable_count(self) -> int:
        """Records that did not open (all of them, though ``unreadable`` lists at most 100)."""
        return 0 if self.records is None else self.records[RecordReadability.UNREADABLE]


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


def verify_stream(
    store: SecureObjectStore, stream: str, digester: KeyedDigester | None = None
) -> StreamAudit:
    """Verify one stream's retained events from the first retained one to the head.

    With ``digester`` (the store's integrity key) each event's ``chain_mac``
    is checked too (``forged``, ``unkeyed``); without it, only the plain
    chain, which anyone who can write the store could have recomputed.
    A retained prefix that starts past index 0 without the trim event that
    accounts for it is ``truncated``. A row that no longer decodes is
    reported as ``edited`` at its index. ``events`` counts the events that
    verified before the first defect.

    Raises:
        NotFound: the stream holds no events.

    """
    return _verified_stream(store, stream, digester, None)


def _verified_stream(
    store: SecureObjectStore,
    stream: str,
    digester: KeyedDigester | None,
    kept: list[LedgerEvent] | None,
) -> StreamAudit:
    """Verify as ``verify_stream`` does, adding every event fed to the verifier to ``kept``.

    The events kept are vouched for only when the audit returned is ``ok``.
    """
    verifier = StreamVerifier(digester)
    first: int | None = None
    next_index: int | None = 0
    while next_index is not None:
        try:
            page = store.read_ledger(stream, from_index=next_index, limit=_PAGE)
        except IntegrityFailure:
            index = _first_unreadable(store, stream, next_index)
            reason = "a stored event row is malformed"
            broken = StreamFailure(stream, index, ChainDefect.EDITED, reason)
            return StreamAudit(stream, verifier.checked, first, broken, verifier.unkeyed)
        if first is None:
            if not page.events:
                raise NotFound(f"no ledger stream named {stream!r}", stream=stream)
            first = page.events[0].index
        verifier.feed(page.events)
        if verifier.failure is not None:
            break
        if kept is not None:
            kept.extend(page.events)
        next_index = page.next_index
    verifier.finish()
    found = verifier.failure
    failure: StreamFailure | None = None
    if found is not None:
        failure = StreamFailure(stream, found.index, found.defect, found.reason)
    return StreamAudit(stream, verifier.checked, first, failure, verifier.unkeyed)


def _verify_listed(
    store: SecureObjectStore,
    stream: str,
    digester: KeyedDigester | None,
    kept: list[LedgerEvent] | None = None,
) -> StreamAudit:
    """Verify a stream the catalog lists; one with no events means the catalog was altered.

    Retention never removes a stream's head event, so no listed stream is empty.
    """
    try:
        return _verified_stream(store, stream, digester, kept)
    except NotFound:
        reason = "the stream catalog lists a stream that holds no events"
        return StreamAudit(stream, 0, None, StreamFailure(stream, None, ChainDefect.GAP, reason))


def list_all_streams(catalog: StreamCatalog | None) -> list[str]:
    """Return the name of every stream, sorted; ``catalog`` is the store's, if it has one.

    Raises:
        StoreUnavailable: the store cannot enumerate its streams.

    """
    if catalog is None:
        raise StoreUnavailable("this store cannot list its ledger streams (no StreamCatalog)")
    names: list[str] = []
    while page := catalog.list_streams(after=names[-1] if names else None, limit=_PAGE):
        names.extend(page)
    return names


def _reported(report: AuditReport) -> AuditReport:
    """Log (and count) a finished audit by its finding codes, never stream names or contents."""
    findings = {str(failure.defect) for failure in report.failures}
    if report.unreadable_count:
        findings.add("unreadable")
    if report.stale:
        findings.add("stale")
    if report.rolled_back is not None:
        findings.add("rolled_back")
    observe.ledger_verified(report.ok, len(report.streams), report.events, tuple(sorted(findings)))
    return report


class LedgerAudit:
    """Verifies streams and classifies records; opens records only when given the key.

    ``repository`` is the sealed repository over ``store`` under the store's
    key, or ``None`` when no key is at hand: then records are counted as
    ``unverified`` instead of opened, and only the plain chains are verified
    (they need no key); with the key, every event's ``chain_mac`` is too.
    ``bound`` reads back the record each stream binds (a workflow, a run, a
    scope's state) with the services' freshness check, so a full audit
    also finds rows put back whole; without it, none are looked for.
    ``mark`` is the store's high-water mark: a full audit compares the
    store with it, writing nothing, so a stream whose newest events were
    cut is found as opening would find it.
    """

    def __init__(
        self,
        store: SecureObjectStore,
        repository: SealedRepository | None,
        bound: BoundRecords | None = None,
        mark: AntiRollback | None = None,
    ) -> None:
        self._store = store
        self._repository = repository
        self._bound = bound
        self._mark = mark
        self._capabilities = (
            StoreCapabilities.of(store) if repository is None else repository.capabilities
        )

    @property
    def repository(self) -> SealedRepository | None:
        """The sealed repository under the store's key, or ``None`` without a key."""
        return self._repository

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
            return _reported(
                AuditReport(
                    tuple(verify_stream(self._store, name, self._repository) for name in audits)
                )
            )
        names = list_all_streams(self._capabilities.catalog)
        audits = progress(names, total=len(names), label="verifying streams")
        verified: list[StreamAudit] = []
        stale: list[StaleRecord] = []
        for name in audits:
            audit, found = self._verify_and_hold(name)
            verified.append(audit)
            stale.extend(found)
        counts: Counter[RecordReadability] = Counter(dict.fromkeys(RecordReadability, 0))
        unreadable: list[UnreadableRecord] = []
        checks = progress(self._records(), total=self._record_total(), label="opening records")
        for record, readability in checks:
            counts[readability] += 1
            if readability is RecordReadability.UNREADABLE:
                unreadable.append(record)
        listed = tuple(unreadable[:MAX_LISTED_UNREADABLE])
        return _reported(
            AuditReport(tuple(verified), dict(counts), listed, tuple(stale), self._rolled_back())
        )

    def _rolled_back(self) -> str | None:
        if self._mark is None:
            return None
        try:
            self._mark.inspect()
        except (StoreRolledBack, IntegrityFailure) as error:
            return error.message
        return None

    def _verify_and_hold(self, stream: str) -> tuple[StreamAudit, list[StaleRecord]]:
        """Verify ``stream``, then hold the records it binds to it (with the key and ``bound``).

        Done stream by stream, so a record stream's events are read once:
        those just verified under the key are the ones the records are held
        to, and at most one stream's events are in memory.
        """
        bound, repository = self._bound, self._repository
        if bound is None or repository is None:
            return _verify_listed(self._store, stream, repository), []
        handed = bound.repository is repository and bound.reads_events(stream)
        kept: list[LedgerEvent] | None = [] if handed else None
        audit = _verify_listed(self._store, stream, repository, kept)
        return audit, bound.check(stream, events=kept if audit.ok else None)

    def issue(
        self,
        stream: str,
        *,
        issued_at: datetime,
        signers: tuple[ReceiptSigner, ...] = (),
    ) -> HeadReceipt:
        """Verify ``stream`` with the key, then return a receipt of its head.

        A receipt anchors what it names, so none is issued for a chain that
        fails: that would vouch for a forgery.

        Raises:
            KeyRequired: the audit has no key (receipts carry a MAC under it).
            NotFound: the stream holds no events.
            IntegrityFailure: the stream fails verification.

        """
        if self._repository is None:
            raise KeyRequired("a receipt carries a MAC under the store key, and none is at hand")
        audit = verify_stream(self._store, stream, self._repository)
        if audit.failure is not None:
            failure = audit.failure
            raise IntegrityFailure(
                f"no receipt for stream {stream!r}: it fails verification at index "
                f"{failure.index} ({failure.defect.value})",
                stream=stream,
                index=failure.index,
                defect=failure.defect.value,
            )
        return issue_receipt(
            self._store, self._repository, stream, issued_at=issued_at, signers=signers
        )

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
            audit = verify_stream(self._store, note.stream, self._repository)
        except NotFound:
            audit = StreamAudit(note.stream, 0, None)
        if not audit.ok:
            return audit
        mismatch = compare_with_receipt(self._store, note)
        if mismatch is None:
            return audit
        failure = StreamFailure(note.stream, mismatch.index, mismatch.defect, mismatch.reason)
        return StreamAudit(audit.stream, audit.events, audit.first_index, failure, audit.unkeyed)

    def _namespaces(self) -> Mapping[str, int]:
        stats = self._capabilities.stats
        return {} if stats is None else stats.namespace_counts()

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
            self._repository.verify(
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
    capabilities: StoreCapabilities,
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
            compacted = compact_after_commit(capabilities.compactor)
    return PurgeOutcome(report, compacted)
