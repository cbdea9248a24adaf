"""Row codecs shared by the SQL adapters: ledger events and record metadata.

Both SQL adapters store events and headers in the same column layout, so
one codec keeps their validation identical: a row that no longer makes a
valid header or event is ``IntegrityFailure``, never a pydantic or JSON
error, and never with its content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import Any, Final, TypeAlias

from pydantic import ValidationError

from flowvault.application import RecordMetadata, StoredRecord
from flowvault.application._records import LabelValue, check_tags
from flowvault.application.ports import MAX_HEAD_BATCH
from flowvault.domain import EnvelopeHeader, IntegrityFailure, InvalidInput, LedgerEvent
from flowvault.domain._canonical import canonical_json, parse_json
from flowvault.domain._envelope import format_instant

Row: TypeAlias = Sequence[Any]
Params: TypeAlias = tuple[object, ...]
LabelDecoder: TypeAlias = Callable[[object], Mapping[str, LabelValue]]

MALFORMED = (ValidationError, InvalidInput, ValueError, TypeError, KeyError)
"""What decoding a tampered or truncated row can raise."""


def malformed(table: str) -> IntegrityFailure:
    """Return the error for a row of ``table`` that no longer decodes."""
    return IntegrityFailure(f"stored row is malformed ({table})", table=table)


def _ledger_index(value: object) -> int | None:
    """Return a stored ledger index as it was written: NULL or a non-negative integer.

    Checked here rather than left to the header's validation, which in lax
    mode would read text such as ``"5"`` (or a boolean) as a number.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError("ledger index")
    return value


NO_TAGS: Final = "[]"
"""The ``tags`` column of a record without tags, and of every row written before tags existed."""


def encode_tags(tags: frozenset[str]) -> str:
    """Return a record's tags as the ``tags`` column holds them: a sorted canonical JSON list."""
    return canonical_json(sorted(tags)) if tags else NO_TAGS


def decode_tags(stored: object) -> frozenset[str]:
    """Return the tags of a ``tags`` column: JSON text (SQLite) or a decoded list (jsonb).

    Each must still be a keyed digest, so an edited column reads as a
    malformed row rather than as tags no write could have made.
    """
    if stored in (NO_TAGS, []):
        return frozenset()
    if isinstance(stored, str):
        stored = parse_json(stored)
    if not isinstance(stored, list):
        raise TypeError("tags column")
    return check_tags(stored)


def metadata_from_row(row: Row, decode_labels: LabelDecoder) -> RecordMetadata:
    """Build metadata from the twelve metadata columns, in ``PEEK_METADATA`` order.

    ``ledger_index`` follows ``written_at``; NULL reads as a header without
    one. ``tags`` comes last.
    """
    try:
        namespace, key_digest, revision, sensitivity, schema, key_id, written = row[:7]
        ledger_index, labels, byte_length, payload_digest, tags = row[7:12]
        header = EnvelopeHeader.model_validate(
            {
                "namespace": namespace,
                "key_digest": key_digest,
                "revision": revision,
                "sensitivity": sensitivity,
                "schema_version": schema,
                "key_id": key_id,
                "written_at": written,
                "ledger_index": _ledger_index(ledger_index),
            }
        )
        if not isinstance(byte_length, int) or not isinstance(payload_digest, str):
            raise TypeError("record sizes")
        return RecordMetadata(
            header, decode_labels(labels), byte_length, payload_digest, decode_tags(tags)
        )
    except MALFORMED:
        raise malformed("records") from None


def record_from_row(row: Row, decode_labels: LabelDecoder) -> StoredRecord:
    """Build a stored record from ``LOAD_RECORD``'s columns: metadata, then the payload.

    The twelve metadata columns come first, as in ``PEEK_METADATA``; the payload is at index 12.
    """
    metadata = metadata_from_row(row, decode_labels)
    payload = row[12]
    if not isinstance(payload, bytes):
        raise malformed("records")
    return StoredRecord(metadata=metadata, payload=payload)


def event_params(event: LedgerEvent) -> Params:
    """Return ``INSERT_EVENT`` parameters; the payload is kept as its canonical JSON text.

    Text rather than a native JSON type, which could normalise numbers and
    key order and so change what the event hash was computed over.
    """
    return (
        event.stream,
        event.index,
        event.type,
        event.from_state,
        event.to_state,
        format_instant(event.occurred_at),
        event.payload_text(),
        event.previous_hash,
        event.event_hash,
        event.event_key,
        event.chain_mac,
    )


def event_from_row(row: Row) -> LedgerEvent:
    """Rebuild an event exactly as stored, hash and MAC included, so verification sees any edit."""
    try:
        stream, index, type_, from_state, to_state, occurred, payload = row[:7]
        previous_hash, event_hash, event_key, chain_mac = row[7:11]
        return LedgerEvent.restore(
            stream=stream,
            index=index,
            type=type_,
            from_state=from_state,
            to_state=to_state,
            occurred_at=occurred,
            payload_text=payload,
            previous_hash=previous_hash,
            event_hash=event_hash,
            event_key=event_key,
            chain_mac=chain_mac,
        )
    except MALFORMED:
        raise malformed("ledger_events") from None


def stream_state(row: Row) -> tuple[int, int, str]:
    """Return ``(first_index, head_index, head_hash)`` from a ``STREAM_STATE`` row."""
    first, head, head_hash = row
    if not (isinstance(first, int) and isinstance(head, int) and isinstance(head_hash, str)):
        raise malformed("ledger_streams")
    return first, head, head_hash


def check_stream_page(
    mark: tuple[int, int, str] | None,
    start: int,
    events: tuple[LedgerEvent, ...],
    *,
    last_page: bool,
) -> None:
    """Refuse a page that disagrees with its ``ledger_streams`` row, read in the same snapshot.

    Commits write both together, so in an intact store the first retained
    event is at the row's ``first_index`` and the last one is its head. A
    missing, dropped or extra event, or an edited row, breaks that; the
    chain alone cannot show a cut-off head.
    """
    if mark is None:
        if events:
            raise IntegrityFailure("ledger events have no stream row", table="ledger_streams")
        return
    first_index, head_index, head_hash = mark
    expected = max(start, first_index)
    if expected > head_index:
        consistent = not events
    else:
        consistent = bool(events) and events[0].index == expected
        if consistent and last_page:
            consistent = (events[-1].index, events[-1].event_hash) == (head_index, head_hash)
    if not consistent:
        raise IntegrityFailure(
            "ledger events disagree with their stream row", table="ledger_streams"
        )


def _stored_head(index: object) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise malformed("ledger_events")
    return index


def head_index(rows: Sequence[Row]) -> int | None:
    """Return a stream's head index from ``LEDGER_HEAD_INDEX`` rows; ``None`` when empty."""
    return _stored_head(rows[0][0]) if rows else None


def head_indexes(rows: Sequence[Row]) -> dict[str, int]:
    """Return the heads in ``(stream, head index)`` rows, leaving out a null index (no events)."""
    return {str(stream): _stored_head(index) for stream, index in rows if index is not None}


def stored_epoch(rows: Sequence[Row]) -> int:
    """Return the commit count from its single stored row.

    A missing row, or one that is not a count, is ``IntegrityFailure``:
    reading it as 0 would pass a rolled-back copy off as a fresh store.
    """
    if len(rows) != 1:
        raise malformed("store_epoch")
    epoch = rows[0][0]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise malformed("store_epoch")
    return epoch


def require_text(value: object, what: str) -> str:
    """Refuse a name that is not text with ``InvalidInput``, before a driver sees it.

    A driver refuses to bind a list or a number as text with an error that
    reads like a broken connection; the caller's mistake deserves its own code.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be text")
    return value


def require_stream_names(streams: object) -> list[str]:
    """Return the distinct names of a ``ledger_head_indexes`` call, refusing what it cannot take.

    A bare string is refused, not read as one-letter names: that would answer
    a question the caller did not ask. Names are counted by taking at most
    one over the limit, so a huge ``range`` is refused rather than overflowing ``len``.
    """
    if isinstance(streams, str) or not isinstance(streams, Sequence):
        raise InvalidInput("streams must be a sequence of stream names")
    names = list(islice(streams, MAX_HEAD_BATCH + 1))
    if len(names) > MAX_HEAD_BATCH:
        raise InvalidInput(f"at most {MAX_HEAD_BATCH} streams per call")
    return list(dict.fromkeys(require_text(name, "stream") for name in names))


MAX_SEAL_RESERVATION = 2**32
"""No reservation is larger than a key's whole nonce budget."""


def require_seal_count(count: object) -> int:
    """Refuse a seal reservation that would leave a counter unchanged, move it back or overflow."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidInput("count must be an integer")
    if not 1 <= count <= MAX_SEAL_RESERVATION:
        raise InvalidInput(f"count must be between 1 and {MAX_SEAL_RESERVATION}")
    return count
