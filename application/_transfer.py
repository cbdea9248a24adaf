"""Moving a whole store: read it out as stored, fill an empty store with it, prove the copy.

Sealed rows travel byte for byte with their headers, so nothing is opened or
re-sealed on the way and the target needs the same key ring. A copy counts
as done only once the target reads back exactly as the source was read (the
same lines, so the same digests) and a keyed audit of the target is clean.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from flowvault.application._audit import (
    AuditReport,
    LedgerAudit,
    Progress,
    list_all_streams,
    no_progress,
)
from flowvault.application._capabilities import StoreCapabilities
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    LabelValue,
    RecordMetadata,
    StoreContents,
    StoredRecord,
    check_tags,
)
from flowvault.application.ports import (
    SecureObjectStore,
    StoreEpoch,
    StoreFill,
    StoreStats,
)
from flowvault.domain import (
    EnvelopeHeader,
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    RevisionConflict,
    StoreNotEmpty,
    StoreUnavailable,
)
from flowvault.domain._canonical import canonical_bytes, digest_bytes, parse_canonical
from flowvault.domain._envelope import format_instant

RECORDS_PART: Final = "records.jsonl"
EVENTS_PART: Final = "events.jsonl"
COUNTS_PART: Final = "counts.json"

_MALFORMED = (ValueError, TypeError, KeyError, InvalidInput, binascii.Error)


# -- one line per row ---------------------------------------------------------------


def _label_entries(labels: Mapping[str, LabelValue]) -> list[list[str]]:
    """Labels as ``[name, "s"|"i", text]``: integers span 64 bits, past what JSON numbers keep."""
    return [
        [name, "i" if isinstance(value, int) else "s", str(value)]
        for name, value in sorted(labels.items())
    ]


def _labels_from(entries: object) -> dict[str, LabelValue]:
    if not isinstance(entries, list):
        raise TypeError("labels")
    labels: dict[str, LabelValue] = {}
    for name, kind, text in entries:
        if not isinstance(name, str) or not isinstance(text, str) or kind not in ("s", "i"):
            raise TypeError("label")
        labels[name] = int(text) if kind == "i" else text
    return labels


def record_line(record: StoredRecord) -> bytes:
    """Return one record as a canonical JSON line: header, labels, tags, sizes, sealed bytes.

    ``tags`` (sorted) is there only for a record carrying some, so the line
    of a record without tags is the line written before tags existed.
    """
    meta = record.metadata
    header = meta.header
    tags = {"tags": sorted(meta.tags)} if meta.tags else {}
    return (
        canonical_bytes(
            {
                **tags,
                "namespace": header.namespace,
                "key_digest": header.key_digest,
                "revision": header.revision,
                "sensitivity": header.sensitivity.value,
                "schema_version": header.schema_version,
                "key_id": header.key_id,
                "written_at": format_instant(header.written_at),
                "ledger_index": header.ledger_index,
                "labels": _label_entries(meta.labels),
                "byte_length": meta.byte_length,
                "payload_digest": meta.payload_digest,
                "payload": base64.b64encode(record.payload).decode("ascii"),
            }
        )
        + b"\n"
    )


def record_from_line(line: bytes) -> StoredRecord:
    """Rebuild a record from ``record_line``'s output; a line that does not is ``IntegrityFailure``.

    The payload must match its stated length and digest, so a row is
    never written under metadata that does not describe it.
    """
    try:
        body = parse_canonical(line.decode("utf-8").rstrip("\n"))
        if not isinstance(body, dict):
            raise TypeError("record line")
        header = EnvelopeHeader.model_validate(
            {
                name: body[name]
                for name in (
                    "namespace",
                    "key_digest",
                    "revision",
                    "sensitivity",
                    "schema_version",
                    "key_id",
                    "written_at",
                    "ledger_index",
                )
            }
        )
        payload = base64.b64decode(str(body["payload"]), validate=True)
        byte_length, payload_digest = body["byte_length"], body["payload_digest"]
        if byte_length != len(payload) or payload_digest != digest_bytes(payload):
            raise ValueError("payload")
        labels = _labels_from(body["labels"])
        tags = check_tags(body.get("tags", []))
    except _MALFORMED:
        raise IntegrityFailure("a record line is malformed", part=RECORDS_PART) from None
    metadata = RecordMetadata(header, labels, len(payload), digest_bytes(payload), tags)
    return StoredRecord(metadata=metadata, payload=payload)


def event_line(event: LedgerEvent) -> bytes:
    """Return one ledger event as a canonical JSON line, hash and MAC included."""
    return (
        canonical_bytes(
            {
                "stream": event.stream,
                "index": event.index,
                "type": event.type,
                "from_state": event.from_state,
                "to_state": event.to_state,
                "occurred_at": format_instant(event.occurred_at),
                "payload": event.payload_text(),
                "previous_hash": event.previous_hash,
                "event_hash": event.event_hash,
                "event_key": event.event_key,
                "chain_mac": event.chain_mac,
            }
        )
        + b"\n"
    )


def event_from_line(line: bytes) -> LedgerEvent:
    """Rebuild an event exactly as stored; nothing is rehashed, so an edit fails verification."""
    try:
        body = parse_canonical(line.decode("utf-8").rstrip("\n"))
        if not isinstance(body, dict):
            raise TypeError("event line")
        return LedgerEvent.restore(
            stream=body["stream"],
            index=body["index"],
            type=body["type"],
            from_state=body["from_state"],
            to_state=body["to_state"],
            occurred_at=body["occurred_at"],
            payload_text=body["payload"],
            previous_hash=body["previous_hash"],
            event_hash=body["event_hash"],
            event_key=body["event_key"],
            chain_mac=body["chain_mac"],
        )
    except _MALFORMED:
        raise IntegrityFailure("an event line is malformed", part=EVENTS_PART) from None


def counts_text(contents: StoreContents) -> bytes:
    """Return the seal counts and the epoch as canonical JSON."""
    return canonical_bytes({"epoch": contents.epoch, "seal_counts": dict(contents.seal_counts)})


# -- what was copied ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartSummary:
    """One part of a store's contents: how many lines, and the SHA-256 of their bytes."""

    lines: int
    digest: str

    def document(self) -> dict[str, int | str]:
        """Return the part as JSON."""
        return {"lines": self.lines, "digest": self.digest}


def summarise_lines(lines: Iterator[bytes]) -> tuple[bytes, PartSummary]:
    """Return the joined lines and their summary."""
    data = b"".join(lines)
    return data, PartSummary(data.count(b"\n"), digest_bytes(data))


@dataclass(frozen=True, slots=True)
class ContentSummary:
    """What a copy must reproduce: the digest of every record line, every event line, the counts.

    Two stores with equal summaries hold the same rows byte for byte: the
    same sealed payloads under the same headers and labels, the same
    events from the same first retained index, the same seal counts and
    commit count (``reproduced_by`` lets a copy's count be higher).
    """

    records: PartSummary
    events: PartSummary
    streams: int
    epoch: int
    seal_counts: Mapping[str, int]

    @classmethod
    def of(cls, contents: StoreContents) -> ContentSummary:
        """Summarise ``contents``."""
        _, records = summarise_lines(record_line(record) for record in contents.records)
        _, events = summarise_lines(event_line(event) for event in contents.events)
        return cls(
            records=records,
            events=events,
            streams=len({event.stream for event in contents.events}),
            epoch=contents.epoch,
            seal_counts=dict(contents.seal_counts),
        )

    def reproduced_by(self, copy: ContentSummary) -> bool:
        """Whether ``copy`` holds exactly these rows and counts, its commit count at least as high.

        A fill never lowers a store's commit count, so an empty target
        that had counted commits keeps its higher count.
        """
        return (
            (copy.records, copy.events, copy.streams) == (self.records, self.events, self.streams)
            and dict(copy.seal_counts) == dict(self.seal_counts)
            and copy.epoch >= self.epoch
        )

    def document(self) -> dict[str, object]:
        """Return the summary as JSON (counts and digests only: nothing sealed, no key)."""
        return {
            "records": self.records.lines,
            "events": self.events.lines,
            "streams": self.streams,
            "epoch": self.epoch,
            "seal_counts": dict(sorted(self.seal_counts.items())),
            "records_digest": self.records.digest,
            "events_digest": self.events.digest,
        }


# -- reading a store out ------------------------------------------------------------


def _needs(capabilities: StoreCapabilities) -> tuple[StoreStats, StoreEpoch]:
    """Return the capabilities a whole-store read needs, or say which the store lacks."""
    stats, catalog, epoch = capabilities.stats, capabilities.catalog, capabilities.epoch
    if stats is None or catalog is None or epoch is None:
        missing = [
            name
            for name, part in (
                ("StoreStats", stats),
                ("StreamCatalog", catalog),
                ("StoreEpoch", epoch),
            )
            if part is None
        ]
        raise StoreUnavailable(
            f"this store cannot be read out whole (it lacks {', '.join(missing)}); "
            "move it with the backend's own dump tools"
        )
    return stats, epoch


def _records(store: SecureObjectStore, namespaces: Sequence[str]) -> Iterator[StoredRecord]:
    for namespace in namespaces:
        cursor: str | None = None
        while True:
            page = store.list(namespace, cursor=cursor, limit=MAX_LIST_LIMIT)
            for item in page.items:
                record = store.load(namespace, item.key_digest)
                if record is None:
                    raise _changed("a listed record vanished while it was read")
                yield record
            if page.next_cursor is None:
                break
            cursor = page.next_cursor


def read_events(store: SecureObjectStore, streams: Sequence[str]) -> Iterator[LedgerEvent]:
    """Yield the retained events of ``streams``, each stream in index order, as stored."""
    for stream in streams:
        index = 0
        while True:
            page = store.read_ledger(stream, from_index=index, limit=MAX_LIST_LIMIT)
            yield from page.events
            if page.next_index is None:
                break
            index = page.next_index


def _changed(what: str, **details: int) -> RevisionConflict:
    return RevisionConflict(
        f"{what}: the store changed while it was read; stop its writers and run again",
        guard="epoch",
        **details,
    )


def read_contents(store: SecureObjectStore, *, progress: Progress = no_progress) -> StoreContents:
    """Read every record, every retained event, the seal counts and the epoch, as stored.

    The store must not be written meanwhile: its commit count is read
    before and after, and a change is ``RevisionConflict`` (nothing half
    read is returned). Seal counts are read last, so they cover every seal
    a record read before them used.

    Raises:
        StoreUnavailable: the store cannot list its namespaces or streams,
            or tell its commit count.
        RevisionConflict: the store was written while it was read.

    """
    capabilities = StoreCapabilities.of(store)
    stats, epoch = _needs(capabilities)
    before = epoch.epoch()
    counts = stats.namespace_counts()
    namespaces = sorted(counts)
    records = list(
        progress(_records(store, namespaces), total=sum(counts.values()), label="reading records")
    )
    streams = list_all_streams(capabilities.catalog)
    events: list[LedgerEvent] = []
    for event in progress(read_events(store, streams), total=None, label="reading events"):
        events.append(event)
    seals = {} if capabilities.seals is None else dict(capabilities.seals.seal_counts())
    after = epoch.epoch()
    if after != before:
        raise _changed("its commit count moved", expected=before, actual=after)
    return StoreContents(records=records, events=events, seal_counts=seals, epoch=before)


# -- filling a store ----------------------------------------------------------------


def require_empty(store: SecureObjectStore) -> StoreFill:
    """Return ``store`` as a ``StoreFill`` once it is known to hold no record, event or seal count.

    A commit count alone does not make a store hold anything: a fill that
    was interrupted may have raised it (a PostgreSQL sequence is not rolled
    back), and the fill only ever raises it further.

    Raises:
        StoreUnavailable: the store cannot be filled (no ``StoreFill``) or
            cannot say whether it is empty.
        StoreNotEmpty: it holds a record, an event or a seal count.

    """
    if not isinstance(store, StoreFill):
        raise StoreUnavailable("this store cannot be filled by a move (no StoreFill)")
    capabilities = StoreCapabilities.of(store)
    stats, _ = _needs(capabilities)
    seals = {} if capabilities.seals is None else capabilities.seals.seal_counts()
    if stats.has_records() or seals:
        raise StoreNotEmpty(
            "the target store already holds data; a move or import needs an empty store: "
            "point it at a new SQLite home or a new PostgreSQL schema"
        )
    return store


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What a verified copy wrote: the summary both stores share, and the target's audit."""

    summary: ContentSummary
    audit: AuditReport


def fill_verified(
    contents: StoreContents,
    target: SecureObjectStore,
    audit: Callable[[SecureObjectStore], LedgerAudit],
    *,
    progress: Progress = no_progress,
    report: Callable[[str], None] = lambda _: None,
) -> CopyReport:
    """Fill the empty ``target`` with ``contents`` in one transaction, then prove the copy.

    Proof is twofold: the target, read back as the source was, gives the
    same summary (every row equal byte for byte, every count equal); and
    ``audit(target)``, keyed with the same ring, verifies every stream and
    opens every record. Either failing is ``IntegrityFailure``; the target
    then holds the failed copy, which the operator drops before running
    again (an empty target is required).

    Raises:
        StoreNotEmpty: the target holds anything; nothing was written.
        IntegrityFailure: the written copy does not read back as the source.

    """
    fill = require_empty(target)
    expected = ContentSummary.of(contents)
    report(f"writing {expected.records.lines} records and {expected.events.lines} events")
    fill.fill(contents)
    report("reading the target back")
    found = ContentSummary.of(read_contents(target, progress=progress))
    if not expected.reproduced_by(found):
        raise IntegrityFailure(
            "the target does not read back as the source: drop it and run again",
            part="contents",
        )
    report("auditing the target under the key")
    audited = audit(target).run(progress=progress)
    if not audited.ok:
        raise IntegrityFailure(
            "the target's keyed audit found defects: run `flowvault ledger verify --all` on it",
            part="audit",
        )
    return CopyReport(summary=expected, audit=audited)
