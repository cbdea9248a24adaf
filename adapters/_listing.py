"""The ``list`` query both SQL adapters run: one builder, one binding order, one paging rule.

Only the placeholder differs between drivers (``?`` for sqlite3, ``%s`` for
psycopg), so the statement, its parameters and the cursor it hands out are
identical, and so is the order the contract kit checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, TypeAlias

from flowvault.application import (
    FilterOp,
    LabelCursor,
    LabelFilter,
    ListCursor,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    TagFilter,
)
from flowvault.application._record_reads import label_page
from flowvault.application._records import split_filters
from flowvault.domain import IntegrityFailure
from flowvault.domain._envelope import format_instant

FilterShape: TypeAlias = tuple[FilterOp, bool]
"""A filter's operator and whether it compares text (else integers): all the SQL depends on."""

METADATA_COLUMNS: Final = (
    "r.namespace, r.key_digest, r.revision, r.sensitivity, r.schema_version, r.key_id, "
    "r.written_at, r.ledger_index, r.labels, r.byte_length, r.payload_digest, r.tags"
)
"""The twelve metadata columns every record read selects, as ``metadata_from_row`` reads them."""
_HEAD: Final = f"SELECT {METADATA_COLUMNS} FROM records r WHERE r.namespace = {{p}}"  # noqa: S608 - constant columns
_SYMBOLS: Final = {
    FilterOp.EQ: "=",
    FilterOp.NE: "<>",
    FilterOp.LT: "<",
    FilterOp.LE: "<=",
    FilterOp.GT: ">",
    FilterOp.GE: ">=",
}
_LABEL_MATCH: Final = (
    " AND r.id IN (SELECT l.record_id FROM record_labels l "
    "WHERE l.namespace = {p} AND l.name = {p} AND l.{column} {symbol} {p})"
)
"""A label filter; a value of the other type sits in the other column as NULL, so never matches.

Not correlated with ``r``, so the planner builds the set of matching ids
once from the ``(namespace, name, value)`` index instead of probing per record.
"""
_TAG_MATCH: Final = (
    " AND r.id IN (SELECT t.record_id FROM record_tags t WHERE t.namespace = {p} AND t.tag = {p})"
)
"""A tag filter, read from the ``(namespace, tag)`` index as a label filter is from its own."""
_AFTER_CURSOR: Final = {
    Order.KEY: " AND r.key_digest > {p}",
    Order.WRITTEN_AT: " AND (r.written_at, r.key_digest) > ({p}, {p})",
    Order.WRITTEN_AT_DESC: " AND (r.written_at, r.key_digest) < ({p}, {p})",
}
_ORDER_BY: Final = {
    Order.KEY: " ORDER BY r.key_digest LIMIT {p}",
    Order.WRITTEN_AT: " ORDER BY r.written_at, r.key_digest LIMIT {p}",
    Order.WRITTEN_AT_DESC: " ORDER BY r.written_at DESC, r.key_digest DESC LIMIT {p}",
}


@lru_cache(maxsize=512)
def list_query(
    placeholder: str,
    order: Order,
    after_cursor: bool,
    filters: tuple[FilterShape, ...] = (),
    tags: int = 0,
) -> str:
    """Return the ``list`` statement for one combination of order, cursor and filters.

    ``tags`` counts the tag filters. Parameters bind in the order
    ``list_params`` gives them.
    """
    parts = [_HEAD]
    for op, text in filters:
        column = "text_value" if text else "int_value"
        parts.append(_LABEL_MATCH.replace("{column}", column).replace("{symbol}", _SYMBOLS[op]))
    parts += [_TAG_MATCH] * tags
    if after_cursor:
        parts.append(_AFTER_CURSOR[order])
    parts.append(_ORDER_BY[order])
    return "".join(parts).replace("{p}", placeholder)


def filter_shapes(filters: Sequence[LabelFilter]) -> tuple[FilterShape, ...]:
    """Return what of ``filters`` shapes the SQL (operators and types, not values)."""
    return tuple((label.op, isinstance(label.value, str)) for label in filters)


def list_params(
    namespace: str,
    filters: Sequence[LabelFilter],
    order: Order,
    position: ListCursor | None,
    limit: int,
    *,
    tags: Sequence[TagFilter] = (),
) -> tuple[object, ...]:
    """Bind values: namespace; per filter its values; the cursor; limit + 1.

    A label filter binds (namespace, name, value), then a tag filter
    (namespace, tag). The one extra row reveals whether there is a next page.
    """
    params: list[object] = [namespace]
    for label in filters:
        params += [namespace, label.name, label.value]
    for one in tags:
        params += [namespace, one.tag]
    if position is not None and order is not Order.KEY:
        params.append(position.written_at)
    if position is not None:
        params.append(position.key_digest)
    params.append(limit + 1)
    return tuple(params)


def page_of(
    rows: Sequence[Sequence[Any]],
    limit: int,
    order: Order,
    decode: Callable[[Sequence[Any]], RecordMetadata],
    filters: Sequence[RecordFilter] = (),
) -> RecordPage:
    """Turn up to ``limit + 1`` fetched rows into a page and the cursor after it.

    Rows are selected through the label and tag indexes, but each row's own
    labels and tags (checked against the sealed copy when it is opened) must
    match every filter too: an index row that was altered cannot slip
    another record into a listing, or into a purge.
    """
    items = tuple(decode(row) for row in rows[:limit])
    for item in items:
        check_indexed(item, filters)
    if len(rows) <= limit:
        return RecordPage(items=items, next_cursor=None)
    last = items[-1]
    mark = ListCursor(order, last.key_digest, format_instant(last.header.written_at))
    return RecordPage(items=items, next_cursor=mark.encode())


def check_indexed(item: RecordMetadata, filters: Sequence[RecordFilter]) -> None:
    """Refuse a listed record whose own labels or tags fail a filter its index rows passed."""
    for one in filters:
        if one.admits(item):
            continue
        if isinstance(one, LabelFilter):
            raise IntegrityFailure(
                "the label index disagrees with a listed record's labels", table="record_labels"
            )
        raise IntegrityFailure(
            "the tag index disagrees with a listed record's tags", table="record_tags"
        )


# -- list_by_label ----------------------------------------------------------------

_BY_LABEL: Final = (
    f"SELECT {METADATA_COLUMNS}, l.int_value, l.text_value{{payload}} "  # noqa: S608 - constant
    "FROM record_labels l JOIN records r ON r.id = l.record_id "
    "WHERE l.namespace = {p} AND l.name = {p}"
)
_WIDTH: Final = 12
"""Metadata columns before a label row's two value columns."""
"""One type of the label's values, read in order from its ``(namespace, name, value)`` index.

A comparison with a value selects that value's type on its own; only a
part without one says ``IS NOT NULL``, so each scan has a single lower bound.
"""

SegmentShape: TypeAlias = tuple[bool, tuple[FilterOp, ...], bool]
"""One type's part of a label listing: text (else integers), bounds on the label, after a cursor."""


@dataclass(frozen=True, slots=True)
class _Segment:
    """The records whose label holds one type of value, bounded by filters on the label itself."""

    text: bool
    bounds: tuple[LabelFilter, ...]
    after: LabelCursor | None

    @property
    def shape(self) -> SegmentShape:
        return (self.text, tuple(bound.op for bound in self.bounds), self.after is not None)


def _segments(
    label: str, descending: bool, filters: Sequence[LabelFilter], position: LabelCursor | None
) -> list[_Segment]:
    """Return the types of value the page may hold, in listing order.

    A filter on the label itself compares one type, so it rules the other
    type out and bounds its own in the index scan; a cursor rules out the
    types before its own.
    """
    kinds = [True, False] if descending else [False, True]
    same = [bound for bound in filters if bound.name == label]
    kinds = [text for text in kinds if all(isinstance(b.value, str) == text for b in same)]
    if position is not None:
        at = isinstance(position.value, str)
        kinds = kinds[kinds.index(at) :] if at in kinds else []
    return [
        _Segment(
            text,
            tuple(same),
            position if position is not None and isinstance(position.value, str) == text else None,
        )
        for text in kinds
    ]


@lru_cache(maxsize=512)
def label_query(
    placeholder: str,
    descending: bool,
    segments: tuple[SegmentShape, ...],
    filters: tuple[FilterShape, ...] = (),
    tags: int = 0,
    *,
    payload: bool = False,
) -> str:
    """Return the ``list_by_label`` statement: one ordered, limited scan per segment, in a union.

    Each part reads its type's values in index order up to the limit; the
    rows are put in their final order in Python, where integers and text
    need not be compared. After a cursor, the value alone bounds the index
    scan (a row comparison spanning both tables cannot), and the row
    comparison then passes over the ties already listed. Parameters bind in
    the order ``label_statement`` gives them.
    """
    direction = " DESC" if descending else ""
    parts: list[str] = []
    for text, bounds, after_cursor in segments:
        column = "l.text_value" if text else "l.int_value"
        part = [_BY_LABEL.replace("{payload}", ", r.payload" if payload else "")]
        part += [f" AND {column} {_SYMBOLS[op]} {{p}}" for op in bounds]
        if not bounds and not after_cursor:
            part.append(f" AND {column} IS NOT NULL")
        for op, text_filter in filters:
            value_column = "text_value" if text_filter else "int_value"
            match = _LABEL_MATCH.replace("{column}", value_column)
            part.append(match.replace("{symbol}", _SYMBOLS[op]))
        part += [_TAG_MATCH] * tags
        if after_cursor:
            past = "<" if descending else ">"
            part.append(f" AND {column} {past}= {{p}}")
            part.append(f" AND ({column}, r.key_digest) {past} ({{p}}, {{p}})")
        part.append(f" ORDER BY {column}{direction}, r.key_digest{direction} LIMIT {{p}}")
        parts.append("".join(part))
    if len(parts) == 1:
        query = parts[0]
    else:
        query = " UNION ALL ".join(
            f"SELECT * FROM ({part}) AS part{n}"  # noqa: S608 - placeholders only
            for n, part in enumerate(parts)
        )
    return query.replace("{p}", placeholder)


def label_statement(
    placeholder: str,
    namespace: str,
    label: str,
    *,
    descending: bool,
    filters: Sequence[RecordFilter],
    position: LabelCursor | None,
    limit: int,
    payload: bool = False,
) -> tuple[str, tuple[object, ...]] | None:
    """Return the ``list_by_label`` statement and its parameters; ``None`` when nothing can match.

    Each part binds: namespace and label; its bounds; (namespace, name,
    value) per other label filter; (namespace, tag) per tag filter; the
    cursor's value, then its value and key digest; limit + 1, the one more
    row telling a page there is a next one. With ``payload`` (a load, which
    does not page) the limit itself, and each row carries its payload.
    """
    labels, tags = split_filters(filters)
    segments = _segments(label, descending, labels, position)
    if not segments:
        return None
    others = [one for one in labels if one.name != label]
    params: list[object] = []
    for segment in segments:
        params += [namespace, label, *(bound.value for bound in segment.bounds)]
        for one in others:
            params += [namespace, one.name, one.value]
        for tag in tags:
            params += [namespace, tag.tag]
        if segment.after is not None:
            params += [segment.after.value, segment.after.value, segment.after.key_digest]
        params.append(limit if payload else limit + 1)
    shapes = tuple(segment.shape for segment in segments)
    query = label_query(
        placeholder, descending, shapes, filter_shapes(others), len(tags), payload=payload
    )
    return query, tuple(params)


def label_page_of(
    rows: Sequence[Sequence[Any]],
    namespace: str,
    label: str,
    *,
    descending: bool,
    filters: Sequence[RecordFilter],
    position: LabelCursor | None,
    limit: int,
    decode: Callable[[Sequence[Any]], RecordMetadata],
) -> RecordPage:
    """Turn the rows of ``label_statement`` into a page, in order, and the cursor after it.

    As for ``list``, each row's own labels must agree with the label row
    that selected it, and its labels and tags with every filter: an altered
    index row cannot slip another record into the listing.
    """
    found = [_listed_by_label(row, namespace, label, filters, decode) for row in rows]
    return label_page(found, label, descending=descending, position=position, limit=limit)


def label_records_of(
    rows: Sequence[Sequence[Any]],
    namespace: str,
    label: str,
    *,
    descending: bool,
    filters: Sequence[RecordFilter],
    limit: int,
    decode: Callable[[Sequence[Any]], RecordMetadata],
) -> list[StoredRecord]:
    """Turn the rows of a ``label_statement`` with payloads into the records, in order.

    Each row is checked as ``label_page_of`` checks it; the metadata is
    decoded once and the payload taken beside it.
    """
    records: dict[str, StoredRecord] = {}
    for row in rows:
        meta = _listed_by_label(row, namespace, label, filters, decode)
        payload = row[_WIDTH + 2]
        if not isinstance(payload, bytes):
            raise IntegrityFailure("stored row is malformed (records)", table="records")
        records[meta.key_digest] = StoredRecord(metadata=meta, payload=payload)
    metas = [record.metadata for record in records.values()]
    page = label_page(metas, label, descending=descending, position=None, limit=limit)
    return [records[meta.key_digest] for meta in page.items]


def _listed_by_label(
    row: Sequence[Any],
    namespace: str,
    label: str,
    filters: Sequence[RecordFilter],
    decode: Callable[[Sequence[Any]], RecordMetadata],
) -> RecordMetadata:
    """Decode one row of a label listing, refusing one the label or tag index lied about."""
    meta = decode(row[:_WIDTH])
    indexed = row[_WIDTH + 1] if row[_WIDTH] is None else row[_WIDTH]
    held = meta.labels.get(label)
    if meta.namespace != namespace or type(held) is not type(indexed) or held != indexed:
        raise IntegrityFailure(
            "the label index disagrees with a listed record's labels", table="record_labels"
        )
    check_indexed(meta, filters)
    return meta
