"""Conversion between domain values and table rows, in both directions.

Rows are validated as they are read: a row that no longer makes a valid
header, label set or ledger event is reported as ``IntegrityFailure``,
never as a pydantic or JSON error, and never with its content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeAlias

from psycopg.types.json import Jsonb
from pydantic import ValidationError

from flowvault.application import Guard, LabelValue, RecordMetadata, StoredRecord, Upsert
from flowvault.domain import (
    EnvelopeHeader,
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    canonical_json,
    format_instant,
    parse_json,
)

Row: TypeAlias = Sequence[Any]
Params: TypeAlias = tuple[object, ...]

_MALFORMED = (ValidationError, InvalidInput, ValueError, TypeError, KeyError)
"""What decoding a tampered or truncated row can raise."""


def _malformed(table: str) -> IntegrityFailure:
    return IntegrityFailure(f"stored row is malformed ({table})", table=table)


def record_params(upsert: Upsert) -> dict[str, object]:
    """Return the named parameters every record write statement draws from.

    Labels go in as ``jsonb``: JSON keeps strings and integers apart, and
    PostgreSQL's numbers hold the whole 64-bit label range.
    """
    header, metadata = upsert.header, upsert.metadata
    return {
        "namespace": header.namespace,
        "key_digest": header.key_digest,
        "revision": header.revision,
        "sensitivity": header.sensitivity.value,
        "schema_version": header.schema_version,
        "key_id": header.key_id,
        "written_at": format_instant(header.written_at),
        "labels": Jsonb(dict(upsert.labels)),
        "byte_length": metadata.byte_length,
        "payload_digest": metadata.payload_digest,
        "payload": upsert.payload,
        "expected": None if isinstance(upsert.expected, Guard) else upsert.expected,
    }


def label_rows(upsert: Upsert) -> list[Params]:
    """Return ``INSERT_LABEL`` parameters after the record id, typed into their column."""
    namespace = upsert.header.namespace
    return [
        (namespace, name, value, None) if isinstance(value, str) else (namespace, name, None, value)
        for name, value in upsert.labels.items()
    ]


def _label_value(value: object) -> LabelValue:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError("label value")


def decode_labels(stored: object) -> Mapping[str, LabelValue]:
    """Return the label mapping from the ``labels`` column, refusing anything but str and int."""
    if not isinstance(stored, dict):
        raise TypeError("labels column")
    return MappingProxyType({str(name): _label_value(value) for name, value in stored.items()})


def metadata_from_row(row: Row) -> RecordMetadata:
    """Build metadata from the ten metadata columns, in ``PEEK_METADATA`` order."""
    try:
        namespace, key_digest, revision, sensitivity, schema, key_id, written = row[:7]
        labels, byte_length, payload_digest = row[7:10]
        header = EnvelopeHeader.model_validate(
            {
                "namespace": namespace,
                "key_digest": key_digest,
                "revision": revision,
                "sensitivity": sensitivity,
                "schema_version": schema,
                "key_id": key_id,
                "written_at": written,
            }
        )
        if not isinstance(byte_length, int) or not isinstance(payload_digest, str):
            raise TypeError("record sizes")
        return RecordMetadata(header, decode_labels(labels), byte_length, payload_digest)
    except _MALFORMED:
        raise _malformed("records") from None


def record_from_row(row: Row) -> StoredRecord:
    """Build a stored record from ``LOAD_RECORD``'s columns: metadata, then the payload."""
    metadata = metadata_from_row(row)
    payload = row[10]
    if not isinstance(payload, bytes):
        raise _malformed("records")
    return StoredRecord(metadata=metadata, payload=payload)


def event_params(event: LedgerEvent) -> Params:
    """Return ``INSERT_EVENT`` parameters; the payload is kept as its canonical JSON text.

    Text rather than ``jsonb``, which would normalise numbers and key order
    and so change what the event hash was computed over.
    """
    return (
        event.stream,
        event.index,
        event.type,
        event.from_state,
        event.to_state,
        format_instant(event.occurred_at),
        canonical_json(event.payload),
        event.previous_hash,
        event.event_hash,
        event.event_key,
    )


def event_from_row(row: Row) -> LedgerEvent:
    """Rebuild an event exactly as stored, hash included, so verification sees any edit."""
    try:
        stream, index, type_, from_state, to_state, occurred, payload = row[:7]
        previous_hash, event_hash, event_key = row[7:10]
        return LedgerEvent.model_validate(
            {
                "stream": stream,
                "index": index,
                "type": type_,
                "from_state": from_state,
                "to_state": to_state,
                "occurred_at": occurred,
                "payload": parse_json(payload),
                "previous_hash": previous_hash,
                "event_hash": event_hash,
                "event_key": event_key,
            }
        )
    except _MALFORMED:
        raise _malformed("ledger_events") from None
