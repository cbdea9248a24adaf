"""Conversion between domain values and table rows, in both directions.

Rows are validated as they are read: a row that no longer makes a valid
header, label set or ledger event is reported as ``IntegrityFailure``,
never as a pydantic or JSON error, and never with its content.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

from flowvault.adapters._rows import (
    MALFORMED,
    Params,
    Row,
    encode_tags,
)
from flowvault.adapters._rows import metadata_from_row as shared_metadata
from flowvault.adapters._rows import record_from_row as shared_record
from flowvault.adapters.sqlite import _queries as sql
from flowvault.application import RecordMetadata, StoredRecord, Upsert
from flowvault.application._records import LabelValue
from flowvault.domain._canonical import canonical_json, parse_json
from flowvault.domain._envelope import format_instant

_INT, _TEXT = "int", "str"


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


LABEL_MEMO: Final = 512
"""Distinct label columns remembered decoded; label sets repeat (a state, a kind) across rows."""

_decoded_labels: dict[str, Mapping[str, LabelValue]] = {}


def decode_labels(text: object) -> Mapping[str, LabelValue]:
    """Return the label mapping stored by ``encode_labels``.

    The result is read-only and a function of the column's text alone, so
    a text seen before is answered from a bounded memo: every record read
    decodes its labels, and an audit reads every record.
    """
    if not isinstance(text, str):
        raise TypeError("labels column")
    known = _decoded_labels.get(text)
    if known is not None:
        return known
    body = parse_json(text)
    if not isinstance(body, dict):
        raise ValueError("labels column")
    labels = MappingProxyType({name: _decode_label(entry) for name, entry in body.items()})
    if len(_decoded_labels) >= LABEL_MEMO:
        _decoded_labels.clear()
    _decoded_labels[text] = labels
    return labels


@dataclass(frozen=True, slots=True)
class LabelWrites:
    """One upsert's label statements: prune what changed name or type, then upsert the rest.

    ``encoded`` is the label set as the record row stores it; comparing it
    with the stored row's tells which statements a write needs at all.
    """

    address: Params
    encoded: str
    labels: Mapping[str, LabelValue]
    prune_sql: str
    prune: list[Params]
    text: list[Params]
    integers: list[Params]

    def changes(self, stored: object) -> LabelWrites | None:
        """Return the statements that take label rows from the ``stored`` set to this one.

        ``stored`` is the ``labels`` column the row held before the write:
        ``None`` for a new record (no rows to prune), equal text for an
        unchanged set (nothing to write). A stored set that does not decode
        gets every statement, as if nothing about it were known.
        """
        if stored is None:
            return replace(self, prune=[])
        if stored == self.encoded:
            return None
        try:
            before = decode_labels(stored)
        except MALFORMED:
            return self
        kept = {
            name
            for name, value in self.labels.items()
            if name in before and isinstance(before[name], str) == isinstance(value, str)
        }
        gone = [name for name in before if name not in kept]
        return replace(
            self,
            prune_sql=sql.DELETE_LABEL,
            prune=[(*self.address, name) for name in gone],
            text=[row for row in self.text if before.get(str(row[0])) != row[1]],
            integers=[row for row in self.integers if before.get(str(row[0])) != row[1]],
        )


def label_writes(upsert: Upsert) -> LabelWrites:
    """Return the statements that bring a record's label rows to ``upsert.labels``."""
    header = upsert.header
    labels = upsert.labels
    kept: list[object] = []
    text: list[Params] = []
    integers: list[Params] = []
    for name, value in labels.items():
        is_text = isinstance(value, str)
        kept += [name, not is_text]
        (text if is_text else integers).append((name, value, header.namespace, header.key_digest))
    return LabelWrites(
        address=(header.namespace, header.key_digest),
        encoded=encode_labels(labels),
        labels=labels,
        prune_sql=sql.prune_labels(len(labels)),
        prune=[(header.namespace, header.key_digest, *kept)],
        text=text,
        integers=integers,
    )


def record_params(upsert: Upsert, encoded_labels: str) -> Params:
    """Return ``UPSERT_RECORD`` parameters for one upsert whose labels encode as given."""
    header, metadata = upsert.header, upsert.metadata
    return (
        header.namespace,
        header.key_digest,
        header.revision,
        header.sensitivity.value,
        header.schema_version,
        header.key_id,
        format_instant(header.written_at),
        header.ledger_index,
        encoded_labels,
        metadata.byte_length,
        metadata.payload_digest,
        upsert.payload,
        encode_tags(upsert.tags),
    )


@dataclass(frozen=True, slots=True)
class TagWrites:
    """One upsert's tag rows: written again only when the record's tag set changed."""

    address: Params
    encoded: str
    rows: list[Params]

    def changed(self, stored: object) -> bool:
        """Whether the ``tags`` column the row held before the write (``None``: new) differs."""
        return stored != self.encoded and (stored is not None or bool(self.rows))


def tag_writes(upsert: Upsert) -> TagWrites:
    """Return the statements that bring a record's tag rows to ``upsert.tags``."""
    header = upsert.header
    return TagWrites(
        address=(header.namespace, header.key_digest),
        encoded=encode_tags(upsert.tags),
        rows=[(tag, header.namespace, header.key_digest) for tag in sorted(upsert.tags)],
    )


def metadata_from_row(row: Row) -> RecordMetadata:
    """Build metadata from ``PEEK_METADATA``'s columns, labels decoded the sqlite way."""
    return shared_metadata(row, decode_labels)


def record_from_row(row: Row) -> StoredRecord:
    """Build a stored record from ``LOAD_RECORD``'s columns."""
    return shared_record(row, decode_labels)
