"""Conversion between domain values and table rows, in both directions.

Rows are validated as they are read: a row that no longer makes a valid
header, label set or ledger event is reported as ``IntegrityFailure``,
never as a pydantic or JSON error, and never with its content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeAlias

from pydantic import ValidationError

from flowvault.application import LabelValue, RecordMetadata, StoredRecord, Upsert
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

_INT, _TEXT = "int", "str"
_MALFORMED = (ValidationError, InvalidInput, ValueError, TypeError, KeyError)
"""What decoding a tampered or truncated row can raise."""


def _malformed(table: str) -> IntegrityFailure:
    return IntegrityFailure(f"stored row is malformed ({table})", table=table)


def encode_labels(labels: Mapping[str, LabelValue]) -> str:
    """Return the labels as canonical JSON, each value tagged with its type.

    Integers travel as decimal text because labels span 64 bits while
    canonical JSON numbers stop at 2^53 - 1.
    """
    return canonical_json(
        {
            name: [_TEXT, value] if isinstance(value, str) else [_INT, str(value)]
            for name, value in labels.items()
        }
    )


def _decode_label(entry: object) -> LabelValue:
    match entry:
        case [str(kind), str(text)] if kind == _TEXT:
            return text
        case [str(kind), str(text)] if kind == _INT and text.lstrip("-").isdigit():
            return int(text)
    raise ValueError("label entry")


def decode_labels(text: object) -> Mapping[str, LabelValue]:
    """Return the label mapping stored by ``encode_labels``."""
    if not isinstance(text, str):
        raise TypeError("labels column")
    body = parse_json(text)
    if not isinstance(body, dict):
        raise ValueError("labels column")
    return MappingProxyType({name: _decode_label(entry) for name, entry in body.items()})


def label_rows(upsert: Upsert) -> list[Params]:
    """Return ``INSERT_LABEL`` parameters, one row per label, typed into its column."""
    header = upsert.header
    return [
        (name, value, None, header.namespace, header.key_digest)
        if isinstance(value, str)
        else (name, None, value, header.namespace, header.key_digest)
        for name, value in upsert.labels.items()
    ]


def record_params(upsert: Upsert) -> Params:
    """Return ``UPSERT_RECORD`` parameters for one upsert."""
    header, metadata = upsert.header, upsert.metadata
    return (
        header.namespace,
        header.key_digest,
        header.revision,
        header.sensitivity.value,
        header.schema_version,
        header.key_id,
        format_instant(header.written_at),
        encode_labels(upsert.labels),
        metadata.byte_length,
        metadata.payload_digest,
        upsert.payload,
    )


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


def stream_state(row: Row) -> tuple[int, int, str]:
    """Return ``(first_index, head_index, head_hash)`` from a ``STREAM_STATE`` row."""
    first, head, head_hash = row
    if not (isinstance(first, int) and isinstance(head, int) and isinstance(head_hash, str)):
        raise _malformed("ledger_streams")
    return first, head, head_hash


def event_params(event: LedgerEvent) -> Params:
    """Return ``INSERT_EVENT`` parameters; the stored hash is the event's own."""
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
