"""The ``list`` query both SQL adapters run: one builder, one binding order, one paging rule.

Only the placeholder differs between drivers (``?`` for sqlite3, ``%s`` for
psycopg), so the statement, its parameters and the cursor it hands out are
identical, and so is the order the contract kit checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Final, TypeAlias

from flowvault.application import (
    FilterOp,
    LabelFilter,
    ListCursor,
    Order,
    RecordMetadata,
    RecordPage,
)
from flowvault.domain import IntegrityFailure
from flowvault.domain._envelope import format_instant

FilterShape: TypeAlias = tuple[FilterOp, bool]
"""A filter's operator and whether it compares text (else integers): all the SQL depends on."""

_HEAD: Final = (
    "SELECT r.namespace, r.key_digest, r.revision, r.sensitivity, r.schema_version, r.key_id, "
    "r.written_at, r.ledger_index, r.labels, r.byte_length, r.payload_digest "
    "FROM records r WHERE r.namespace = {p}"
)
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
    placeholder: str, order: Order, after_cursor: bool, filters: tuple[FilterShape, ...] = ()
) -> str:
    """Return the ``list`` statement for one combination of order, cursor and filters.

    Parameters bind in the order ``list_params`` gives them.
    """
    parts = [_HEAD]
    for op, text in filters:
        column = "text_value" if text else "int_value"
        parts.append(_LABEL_MATCH.replace("{column}", column).replace("{symbol}", _SYMBOLS[op]))
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
) -> tuple[object, ...]:
    """Bind values: namespace; (namespace, name, value) per filter; the cursor; limit + 1.

    The one extra row reveals whether there is a next page.
    """
    params: list[object] = [namespace]
    for label in filters:
        params += [namespace, label.name, label.value]
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
    filters: Sequence[LabelFilter] = (),
) -> RecordPage:
    """Turn up to ``limit + 1`` fetched rows into a page and the cursor after it.

    Rows are selected through the label index, but each row's own labels
    (checked against the sealed copy when it is opened) must match every
    filter too: an index row that was altered cannot slip another record into
    a listing, or into a purge.
    """
    items = tuple(decode(row) for row in rows[:limit])
    if any(not label.matches(item.labels) for item in items for label in filters):
        raise IntegrityFailure(
            "the label index disagrees with a listed record's labels", table="record_labels"
        )
    if len(rows) <= limit:
        return RecordPage(items=items, next_cursor=None)
    last = items[-1]
    mark = ListCursor(order, last.key_digest, format_instant(last.header.written_at))
    return RecordPage(items=items, next_cursor=mark.encode())
