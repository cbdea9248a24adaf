"""The reads both SQL stores answer alike: one statement each, run through the store's ``_fetch``.

The statements differ between drivers only in placeholders and dialect, and
the rows in how labels are decoded, so each store names its own statement
module and row readers; what is asked, checked and returned is written once.
"""

from __future__ import annotations

import builtins
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, Protocol, Self

from flowvault.adapters._listing import (
    FilterShape,
    filter_shapes,
    label_page_of,
    label_records_of,
    label_statement,
    list_params,
    page_of,
)
from flowvault.adapters._rows import (
    Row,
    check_stream_page,
    event_from_row,
    head_index,
    head_indexes,
    require_stream_names,
    require_text,
)
from flowvault.application import (
    LabelCursor,
    LedgerPage,
    ListCursor,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    effective_limit,
)
from flowvault.application._record_reads import key_digest_names, label_listing_args
from flowvault.application._records import check_filters, split_filters
from flowvault.application.ports import MAX_LOAD_BATCH
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    SchemaTooNew,
    StoreUnavailable,
)
from flowvault.domain._canonical import MAX_SAFE_INTEGER

_FORKED: Final = "store opened before fork; open a new one in the child"

INDEX_CEILING: Final = MAX_SAFE_INTEGER + 1
"""Above every storable ledger index and inside a signed 64-bit integer, so clamping keeps order."""


def refuse_newer(version: int, supported: int, found: str) -> None:
    """Refuse a schema a newer flowvault wrote; ``found`` says where the version was read."""
    if version > supported:
        raise SchemaTooNew(
            f"{found}, newer than the {supported} "
            "this flowvault understands; upgrade flowvault to open it",
            found=version,
            supported=supported,
        )


class Statements(Protocol):
    """The part of a driver's statement module that the shared reads run."""

    LOAD_RECORD: str
    PEEK_METADATA: str
    LEDGER_HEAD: str
    LEDGER_HEAD_INDEX: str
    LIST_STREAMS: str
    HAS_RECORDS: str
    NAMESPACE_COUNTS: str
    KEY_ID_COUNTS: str
    SEAL_COUNTS: str
    PLACEHOLDER: str

    def list_query(
        self,
        order: Order,
        after_cursor: bool,
        filters: tuple[FilterShape, ...] = (),
        tags: int = 0,
    ) -> str: ...


@dataclass(frozen=True)
class Dialect:
    """A driver's statements and the readers of its record rows."""

    statements: Statements
    record_from_row: Callable[[Row], StoredRecord]
    metadata_from_row: Callable[[Row], RecordMetadata]


def ledger_start(stream: str, from_index: int, limit: int) -> tuple[int, int]:
    """Check a ``read_ledger`` call; return ``(start, limit)`` as the statement binds them."""
    require_text(stream, "stream")
    limit = effective_limit(limit)
    if isinstance(from_index, bool) or not isinstance(from_index, int) or from_index < 0:
        raise InvalidInput("from_index must not be negative")
    return min(from_index, INDEX_CEILING), limit


def ledger_page(
    mark: tuple[int, int, str] | None, rows: Sequence[Row], from_index: int, limit: int
) -> LedgerPage:
    """Build a page from up to ``limit + 1`` event rows and the stream row read with them."""
    start = min(from_index, INDEX_CEILING)
    events = tuple(event_from_row(row) for row in rows[:limit])
    check_stream_page(mark, start, events, last_page=len(rows) <= limit)
    gap = mark is not None and from_index < mark[0]
    next_index = events[-1].index + 1 if len(rows) > limit else None
    return LedgerPage(events=events, next_index=next_index, gap=gap)


class SqlStore(ABC):
    """What both SQL stores share: the fork and close checks, and the reads of one statement each.

    Records, ledger heads, stream names and counts are read alike; commits,
    locks and connections are each driver's own.
    """

    dialect: ClassVar[Dialect]
    _pid: int
    _closed: bool

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """Release the store's connections; later calls raise ``StoreUnavailable``."""

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise StoreUnavailable(_FORKED)
        if self._closed:
            raise StoreUnavailable("the store is closed")

    @abstractmethod
    def _fetch(self, statement: str, params: Sequence[object]) -> Sequence[Row]:
        """Return the rows of one read statement."""

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Return the stored record or ``None``."""
        require_text(namespace, "namespace")
        require_text(key_digest, "key_digest")
        rows = self._fetch(self.dialect.statements.LOAD_RECORD, (namespace, key_digest))
        return self.dialect.record_from_row(rows[0]) if rows else None

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        """Return the record's metadata or ``None``; the payload column is never read."""
        require_text(namespace, "namespace")
        require_text(key_digest, "key_digest")
        rows = self._fetch(self.dialect.statements.PEEK_METADATA, (namespace, key_digest))
        return self.dialect.metadata_from_row(rows[0]) if rows else None

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of matching metadata in ``order``, resuming after ``cursor``."""
        require_text(namespace, "namespace")
        labels, tags = split_filters(check_filters(filters))
        limit = effective_limit(limit)
        position = None if cursor is None else ListCursor.decode(cursor, order)
        statements = self.dialect.statements
        query = statements.list_query(
            order, position is not None, filter_shapes(labels), len(tags)
        )
        rows = self._fetch(query, list_params(namespace, labels, order, position, limit, tags=tags))
        return page_of(rows, limit, order, self.dialect.metadata_from_row, filters)

    def list_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of the records carrying ``label``, by its value, in one statement.

        Each type of value is one ordered scan of its ``(namespace, name,
        value)`` label index, stopping at the page's end.
        """
        limit, position = label_listing_args(
            namespace, label, descending=descending, filters=filters, cursor=cursor, limit=limit
        )
        rows = self._label_rows(
            namespace, label, descending=descending, filters=filters, position=position, limit=limit
        )
        return label_page_of(
            rows,
            namespace,
            label,
            descending=descending,
            filters=filters,
            position=position,
            limit=limit,
            decode=self.dialect.metadata_from_row,
        )

    def load_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> builtins.list[StoredRecord]:
        """Return the first records ``list_by_label`` lists, payloads included, in one statement."""
        limit, _ = label_listing_args(
            namespace, label, descending=descending, filters=filters, cursor=None, limit=limit
        )
        rows = self._label_rows(
            namespace,
            label,
            descending=descending,
            filters=filters,
            position=None,
            limit=limit,
            payload=True,
        )
        return label_records_of(
            rows,
            namespace,
            label,
            descending=descending,
            filters=filters,
            limit=limit,
            decode=self.dialect.metadata_from_row,
        )

    def _label_rows(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool,
        filters: Sequence[RecordFilter],
        position: LabelCursor | None,
        limit: int,
        payload: bool = False,
    ) -> Sequence[Row]:
        """Run a label listing's one statement; no rows when the filters rule every type out."""
        statement = label_statement(
            self.dialect.statements.PLACEHOLDER,
            namespace,
            label,
            descending=descending,
            filters=filters,
            position=position,
            limit=limit,
            payload=payload,
        )
        if statement is None:
            self._check_usable()
            return []
        return self._fetch(*statement)

    def load_many(self, namespace: str, key_digests: Sequence[str]) -> dict[str, StoredRecord]:
        """Return the stored records among ``key_digests``, in one statement."""
        require_text(namespace, "namespace")
        names = key_digest_names(key_digests, MAX_LOAD_BATCH)
        if not names:
            self._check_usable()
            return {}
        found: dict[str, StoredRecord] = {}
        for row in self._fetch(*self._load_many_statement(namespace, names)):
            record = self.dialect.record_from_row(row)
            meta = record.metadata
            if meta.namespace != namespace or meta.key_digest not in names:
                raise IntegrityFailure("a loaded record is not one asked for", table="records")
            found[meta.key_digest] = record
        return found

    @abstractmethod
    def _load_many_statement(
        self, namespace: str, names: Sequence[str]
    ) -> tuple[str, Sequence[object]]:
        """Return the statement loading ``names`` of ``namespace``, and its parameters."""

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Return the last event of ``stream`` or ``None``."""
        require_text(stream, "stream")
        rows = self._fetch(self.dialect.statements.LEDGER_HEAD, (stream,))
        return event_from_row(rows[0]) if rows else None

    def ledger_head_index(self, stream: str) -> int | None:
        """Return the index of the last event of ``stream``, read from the events table."""
        require_text(stream, "stream")
        return head_index(self._fetch(self.dialect.statements.LEDGER_HEAD_INDEX, (stream,)))

    def ledger_head_indexes(self, streams: Sequence[str]) -> dict[str, int]:
        """Return the index of the last event of each named stream that holds events.

        One statement for all the names, read from the events table like
        ``ledger_head_index``.
        """
        names = require_stream_names(streams)
        if not names:
            self._check_usable()
            return {}
        return head_indexes(self._fetch(*self._head_indexes_statement(names)))

    @abstractmethod
    def _head_indexes_statement(self, names: Sequence[str]) -> tuple[str, Sequence[object]]:
        """Return the statement reading the heads of ``names``, and its parameters."""

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        """Return up to ``limit`` stream names after ``after``, in code-point order."""
        if after is not None:
            require_text(after, "after")
        limit = effective_limit(limit)
        rows = self._fetch(self.dialect.statements.LIST_STREAMS, (after or "", limit))
        return [str(row[0]) for row in rows]

    def has_records(self) -> bool:
        """Return whether any record or ledger event exists, without counting them."""
        return bool(self._fetch(self.dialect.statements.HAS_RECORDS, ())[0][0])

    def namespace_counts(self) -> dict[str, int]:
        """Return the number of records per namespace."""
        return self._per_key(self.dialect.statements.NAMESPACE_COUNTS)

    def key_id_counts(self) -> dict[str, int]:
        """Return the number of records sealed under each key id."""
        return self._per_key(self.dialect.statements.KEY_ID_COUNTS)

    def seal_counts(self) -> dict[str, int]:
        """Return the reserved total per key id; a store opened read-only answers too."""
        return self._per_key(self.dialect.statements.SEAL_COUNTS)

    def _per_key(self, statement: str) -> dict[str, int]:
        return {row[0]: row[1] for row in self._fetch(statement, ())}
