"""Conversion between domain values and table rows, in both directions.

Rows are validated as they are read: a row that no longer makes a valid
header, label set or ledger event is reported as ``IntegrityFailure``,
never as a pydantic or JSON error, and never with its content.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from psycopg.types.json import Jsonb

from flowvault.adapters._rows import (
    Params,
    Row,
)
from flowvault.adapters._rows import metadata_from_row as shared_metadata
from flowvault.adapters._rows import record_from_row as shared_record
from flowvault.application import Guard, RecordMetadata, StoredRecord, Upsert
from flowvault.application._records import LabelValue
from flowvault.domain._envelope import format_instant


def record_params(upsert: Upsert) -> dict[str, object]:
    """Return the named parameters every record write statement draws from.

    Labels go in as ``jsonb``: JSON keeps strings and integers apart, and
    PostgreSQL's numbers hold the whole 64-bit label range. Tags go in as a
    sorted ``jsonb`` list.
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
        "ledger_index": header.ledger_index,
        "labels": Jsonb(dict(upsert.labels)),
        "byte_length": metadata.byte_length,
        "payload_digest": metadata.payload_digest,
        "payload": upsert.payload,
        "tags": Jsonb(sorted(upsert.tags)),
        "expected": None if isinstance(upsert.expected, Guard) else upsert.expected,
        "replaces": upsert.replaces,
    }


def label_rows(upsert: Upsert) -> list[Params]:
    """Return ``INSERT_LABEL`` parameters after the record id, typed into their column."""
    namespace = upsert.header.namespace
    return [
        (namespace, name, value, None) if isinstance(value, str) else (namespace, name, None, value)
        for name, value in upsert.labels.items()
    ]


def tag_rows(upsert: Upsert) -> list[Params]:
    """Return ``INSERT_TAG`` parameters after the record id, in tag order."""
    return [(upsert.header.namespace, tag) for tag in sorted(upsert.tags)]


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
    """Build metadata from ``PEEK_METADATA``'s columns, labels decoded the postgres way."""
    return shared_metadata(row, decode_labels)


def record_from_row(row: Row) -> StoredRecord:
    """Build a stored record from ``LOAD_RECORD``'s columns."""
    return shared_record(row, decode_labels)
