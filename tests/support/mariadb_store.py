"""A `SecureObjectStore` over MariaDB, written from docs/adapters.md to prove the doc and the kit.

It lives with the tests, not in the library: it shows that an adapter over a
database flowvault does not bundle passes the contract kit. One database per
store; every call runs on one connection, serialised by a lock, so a
``commit`` is one transaction whose guards read rows locked ``FOR UPDATE``.
Names and every text column are ``VARBINARY``, so comparisons and sorts are
byte for byte (UTF-8 byte order is code-point order) whatever the server's
collation.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, NoReturn

import pymysql
import pymysql.cursors

from flowvault.application import (
    LedgerPage,
    ListCursor,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    UnitOfWork,
    check_append,
    check_delete,
    check_drop,
    check_upsert,
    effective_limit,
)
from flowvault.domain import (
    EnvelopeHeader,
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    RevisionConflict,
    StoreBusy,
    StoreUnavailable,
)

_BUSY_CODES = frozenset({1205, 1213})
"""Lock wait timeout and deadlock: the row stayed locked, nothing was written."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS records (
        namespace VARBINARY(512) NOT NULL,
        key_digest VARBINARY(255) NOT NULL,
        sensitivity VARBINARY(32) NOT NULL,
        schema_version INT NOT NULL,
        key_id VARBINARY(512) NOT NULL,
        revision BIGINT NOT NULL,
        written_at VARBINARY(32) NOT NULL,
        ledger_index BIGINT NULL,
        labels LONGBLOB NOT NULL,
        byte_length BIGINT NOT NULL,
        payload_digest VARBINARY(255) NOT NULL,
        payload LONGBLOB NOT NULL,
        tags LONGBLOB NOT NULL,
        PRIMARY KEY (namespace, key_digest),
        KEY records_written (namespace, written_at, key_digest)
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS ledger_events (
        stream VARBINARY(800) NOT NULL,
        idx BIGINT NOT NULL,
        type VARBINARY(400) NOT NULL,
        from_state VARBINARY(800) NULL,
        to_state VARBINARY(800) NULL,
        occurred_at VARBINARY(64) NOT NULL,
        payload_text LONGBLOB NOT NULL,
        previous_hash VARBINARY(255) NOT NULL,
        event_hash VARBINARY(255) NOT NULL,
        event_key VARBINARY(800) NULL,
        chain_mac VARBINARY(255) NULL,
        PRIMARY KEY (stream, idx)
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS store_epoch (
        id TINYINT NOT NULL PRIMARY KEY,
        epoch BIGINT NOT NULL
    ) ENGINE=InnoDB""",
    "INSERT IGNORE INTO store_epoch (id, epoch) VALUES (1, 0)",
)

_RECORD_COLUMNS = (
    "namespace, key_digest, sensitivity, schema_version, key_id, revision, written_at,"
    " ledger_index, labels, byte_length, payload_digest, tags"
)
_EVENT_COLUMNS = (
    "stream, idx, type, from_state, to_state, occurred_at, payload_text,"
    " previous_hash, event_hash, event_key, chain_mac"
)
_MAX_HEAD_BATCH = 500
_UTC_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_FILTER_BATCH = 500
"""Rows read per round while label and tag filters drop rows from a page."""


def utc_text(moment: datetime) -> str:
    """Return ``moment`` as the fixed-width UTC text cursors carry, which sorts as text."""
    return moment.astimezone(UTC).strftime(_UTC_FORMAT)


def _require_text(**names: object) -> None:
    """Refuse a name that is not text before the driver sees it, so it never reads as an outage."""
    for field, value in names.items():
        if not isinstance(value, str):
            raise InvalidInput(f"{field} must be text", field=field)


def _text(value: object) -> str:
    """Decode a ``VARBINARY`` column."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    if isinstance(value, str):
        return value
    raise IntegrityFailure("a stored column is not text")


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _optional_int(value: object) -> int | None:
    if value is None or isinstance(value, int):
        return value
    raise IntegrityFailure("a stored column is not an integer")


class MariaDBSecureObjectStore:
    """Sealed records and ledger streams in one MariaDB database."""

    def __init__(self, connection: pymysql.connections.Connection[Any], database: str) -> None:
        self._connection: pymysql.connections.Connection[Any] | None = connection
        self._database = database
        self._lock = threading.RLock()

    @classmethod
    def open(
        cls, *, host: str, port: int, user: str, password: str, database: str
    ) -> MariaDBSecureObjectStore:
        """Connect, create ``database`` and its tables if absent, and return the store."""
        _require_text(database=database)
        try:
            connection = pymysql.connect(
                host=host,
                port=port,
                user=user,
                password=password,
                charset="utf8mb4",
                autocommit=True,
                connect_timeout=10,
            )
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
                cursor.execute(f"USE `{database}`")
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 10")
                for statement in _SCHEMA:
                    cursor.execute(statement)
        except pymysql.MySQLError as exc:
            raise StoreUnavailable(
                "the MariaDB store cannot be opened", reason=type(exc).__name__
            ) from None
        return cls(connection, database)

    def __repr__(self) -> str:
        return f"MariaDBSecureObjectStore(database={self._database!r})"

    # -- plumbing -----------------------------------------------------------

    @contextmanager
    def _cursor(self) -> Iterator[pymysql.cursors.Cursor]:
        """Hold the store's lock and one cursor; translate driver errors."""
        with self._lock:
            if self._connection is None:
                raise StoreUnavailable("the store is closed")
            try:
                with self._connection.cursor() as cursor:
                    yield cursor
            except pymysql.MySQLError as exc:
                _translate(exc)

    def close(self) -> None:
        """Close the connection; a second call returns quietly."""
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            with suppress(pymysql.MySQLError):
                connection.close()

    # -- records ------------------------------------------------------------

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        _require_text(namespace=namespace, key_digest=key_digest)
        with self._cursor() as cursor:
            cursor.execute(
                f"SELECT {_RECORD_COLUMNS}, payload FROM records"  # noqa: S608 - constant columns
                " WHERE namespace = %s AND key_digest = %s",
                (namespace, key_digest),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        payload = row[-1]
        if not isinstance(payload, bytes | bytearray):
            raise IntegrityFailure("a stored payload is not bytes")
        return StoredRecord(metadata=_metadata(row[:-1]), payload=bytes(payload))

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        _require_text(namespace=namespace, key_digest=key_digest)
        with self._cursor() as cursor:
            cursor.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records"  # noqa: S608 - constant columns
                " WHERE namespace = %s AND key_digest = %s",
                (namespace, key_digest),
            )
            row = cursor.fetchone()
        return None if row is None else _metadata(row)

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        _require_text(namespace=namespace)
        size = effective_limit(limit)
        after = None if cursor is None else ListCursor.decode(cursor, order)
        items: list[RecordMetadata] = []
        while True:
            rows = self._list_rows(namespace, order, after, _FILTER_BATCH if filters else size + 1)
            for row in rows:
                meta = _metadata(row)
                if all(f.admits(meta) for f in filters):
                    items.append(meta)
                    if len(items) > size:
                        last = items[size - 1]
                        next_cursor = ListCursor(
                            order, last.key_digest, utc_text(last.header.written_at)
                        ).encode()
                        return RecordPage(items=tuple(items[:size]), next_cursor=next_cursor)
            if not filters or len(rows) < _FILTER_BATCH:
                return RecordPage(items=tuple(items), next_cursor=None)
            last_row = _metadata(rows[-1])
            after = ListCursor(order, last_row.key_digest, utc_text(last_row.header.written_at))

    def _list_rows(
        self, namespace: str, order: Order, after: ListCursor | None, count: int
    ) -> tuple[tuple[object, ...], ...]:
        where = "namespace = %s"
        params: list[object] = [namespace]
        if order is Order.KEY:
            sort = "key_digest ASC"
            if after is not None:
                where += " AND key_digest > %s"
                params.append(after.key_digest)
        else:
            direction = "ASC" if order is Order.WRITTEN_AT else "DESC"
            comparison = ">" if order is Order.WRITTEN_AT else "<"
            sort = f"written_at {direction}, key_digest {direction}"
            if after is not None:
                where += f" AND (written_at, key_digest) {comparison} (%s, %s)"
                params.extend((after.written_at, after.key_digest))
        params.append(count)
        with self._cursor() as cursor:
            cursor.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records"  # noqa: S608 - values are bound
                f" WHERE {where} ORDER BY {sort} LIMIT %s",
                params,
            )
            return tuple(cursor.fetchall())

    # -- ledger -------------------------------------------------------------

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        _require_text(stream=stream)
        with self._cursor() as cursor:
            cursor.execute(
                f"SELECT {_EVENT_COLUMNS} FROM ledger_events"  # noqa: S608 - constant columns
                " WHERE stream = %s ORDER BY idx DESC LIMIT 1",
                (stream,),
            )
            row = cursor.fetchone()
        return None if row is None else _event(row)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        _require_text(stream=stream)
        if not isinstance(from_index, int) or isinstance(from_index, bool) or from_index < 0:
            raise InvalidInput("from_index must be a non-negative integer", field="from_index")
        size = effective_limit(limit)
        with self._cursor() as cursor:
            cursor.execute("SELECT MIN(idx) FROM ledger_events WHERE stream = %s", (stream,))
            first_row = cursor.fetchone()
            cursor.execute(
                f"SELECT {_EVENT_COLUMNS} FROM ledger_events"  # noqa: S608 - constant columns
                " WHERE stream = %s AND idx >= %s"
                " ORDER BY idx ASC LIMIT %s",
                (stream, from_index, size + 1),
            )
            rows = cursor.fetchall()
        first = None if first_row is None else first_row[0]
        gap = first is not None and from_index < int(first)
        events = tuple(_event(row) for row in rows[:size])
        next_index = events[-1].index + 1 if len(rows) > size else None
        return LedgerPage(events=events, next_index=next_index, gap=gap)

    def ledger_head_index(self, stream: str) -> int | None:
        _require_text(stream=stream)
        with self._cursor() as cursor:
            cursor.execute("SELECT MAX(idx) FROM ledger_events WHERE stream = %s", (stream,))
            row = cursor.fetchone()
        return None if row is None else _optional_int(row[0])

    def ledger_head_indexes(self, streams: Sequence[str]) -> Mapping[str, int]:
        if isinstance(streams, str | bytes) or not isinstance(streams, Sequence):
            raise InvalidInput("streams must be a sequence of names", field="streams")
        if len(streams) > _MAX_HEAD_BATCH:
            raise InvalidInput("too many streams in one batch", limit=_MAX_HEAD_BATCH)
        for stream in streams:
            _require_text(stream=stream)
        names = sorted(set(streams))
        if not names:
            return {}
        probes = " UNION ALL ".join(
            "SELECT %s, (SELECT MAX(idx) FROM ledger_events WHERE stream = %s)" for _ in names
        )
        with self._cursor() as cursor:
            cursor.execute(probes, [value for name in names for value in (name, name)])
            rows = cursor.fetchall()
        heads: dict[str, int] = {}
        for name, head in rows:
            index = _optional_int(head)
            if index is not None:
                heads[_text(name)] = index
        return heads

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        if after is not None:
            _require_text(after=after)
        size = effective_limit(limit)
        with self._cursor() as cursor:
            if after is None:
                cursor.execute(
                    "SELECT DISTINCT stream FROM ledger_events ORDER BY stream LIMIT %s", (size,)
                )
            else:
                cursor.execute(
                    "SELECT DISTINCT stream FROM ledger_events WHERE stream > %s"
                    " ORDER BY stream LIMIT %s",
                    (after, size),
                )
            return [_text(row[0]) for row in cursor.fetchall()]

    # -- stats and epoch ----------------------------------------------------

    def has_records(self) -> bool:
        with self._cursor() as cursor:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM records) OR EXISTS (SELECT 1 FROM ledger_events)"
            )
            row = cursor.fetchone()
        return bool(row and row[0])

    def namespace_counts(self) -> Mapping[str, int]:
        return self._counts("namespace")

    def key_id_counts(self) -> Mapping[str, int]:
        return self._counts("key_id")

    def _counts(self, column: str) -> Mapping[str, int]:
        with self._cursor() as cursor:
            cursor.execute(
                f"SELECT {column}, COUNT(*) FROM records GROUP BY {column}"  # noqa: S608 - constant
            )
            return {_text(name): int(count) for name, count in cursor.fetchall()}

    def epoch(self) -> int:
        with self._cursor() as cursor:
            cursor.execute("SELECT epoch FROM store_epoch WHERE id = 1")
            row = cursor.fetchone()
        value = None if row is None else _optional_int(row[0])
        if value is None:
            raise IntegrityFailure("the store epoch row is missing")
        return value

    # -- writes -------------------------------------------------------------

    def commit(self, unit: UnitOfWork) -> None:
        if unit.empty:
            with self._cursor():
                return
        with self._cursor() as cursor:
            connection = self._connection
            assert connection is not None
            connection.begin()
            try:
                self._apply(cursor, unit)
            except BaseException:
                connection.rollback()
                raise
            connection.commit()

    def _apply(self, cursor: pymysql.cursors.Cursor, unit: UnitOfWork) -> None:
        """Check every guard on rows locked for this transaction, then write.

        Raising the epoch first locks its row, so commits from every store
        over this database run one at a time and never deadlock on guards.
        """
        cursor.execute("UPDATE store_epoch SET epoch = epoch + 1 WHERE id = 1")
        for upsert in unit.upserts:
            header = upsert.header
            cursor.execute(
                "SELECT revision, payload_digest FROM records"
                " WHERE namespace = %s AND key_digest = %s FOR UPDATE",
                (header.namespace, header.key_digest),
            )
            row = cursor.fetchone()
            check_upsert(
                header.namespace,
                header.key_digest,
                upsert.expected,
                None if row is None else int(row[0]),
                header.revision,
                replaces=upsert.replaces,
                stored_digest=None if row is None else _text(row[1]),
            )
        removals = []
        for delete in unit.deletes:
            cursor.execute(
                "SELECT revision FROM records WHERE namespace = %s AND key_digest = %s FOR UPDATE",
                (delete.namespace, delete.key_digest),
            )
            row = cursor.fetchone()
            stored = None if row is None else int(row[0])
            if check_delete(delete.namespace, delete.key_digest, delete.expected, stored):
                removals.append(delete)
        heads: dict[str, tuple[int | None, str | None]] = {}
        for event in unit.appends:
            if event.stream not in heads:
                cursor.execute(
                    "SELECT idx, event_hash FROM ledger_events WHERE stream = %s"
                    " ORDER BY idx DESC LIMIT 1 FOR UPDATE",
                    (event.stream,),
                )
                row = cursor.fetchone()
                heads[event.stream] = (None, None) if row is None else (int(row[0]), _text(row[1]))
            head_index, head_hash = heads[event.stream]
            check_append(event, head_index, head_hash)
            heads[event.stream] = (event.index, event.event_hash)
        for drop in unit.drops:
            cursor.execute(
                "SELECT idx FROM ledger_events WHERE stream = %s"
                " ORDER BY idx DESC LIMIT 1 FOR UPDATE",
                (drop.stream,),
            )
            row = cursor.fetchone()
            check_drop(drop.stream, drop.head_index, None if row is None else _optional_int(row[0]))

        for upsert in unit.upserts:
            _write_record(cursor, upsert.header, upsert.metadata, upsert.payload)
        for delete in removals:
            cursor.execute(
                "DELETE FROM records WHERE namespace = %s AND key_digest = %s",
                (delete.namespace, delete.key_digest),
            )
        for event in unit.appends:
            cursor.execute(
                f"INSERT INTO ledger_events ({_EVENT_COLUMNS})"  # noqa: S608 - constant columns
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    event.stream,
                    event.index,
                    event.type,
                    event.from_state,
                    event.to_state,
                    event.occurred_at.isoformat(),
                    event.payload_text(),
                    event.previous_hash,
                    event.event_hash,
                    event.event_key,
                    event.chain_mac,
                ),
            )
        for trim in unit.trims:
            cursor.execute("SELECT MAX(idx) FROM ledger_events WHERE stream = %s", (trim.stream,))
            row = cursor.fetchone()
            if row is None or row[0] is None:
                continue
            cursor.execute(
                "DELETE FROM ledger_events WHERE stream = %s AND idx < %s",
                (trim.stream, min(trim.before_index, int(row[0]))),
            )
        for drop in unit.drops:
            cursor.execute("DELETE FROM ledger_events WHERE stream = %s", (drop.stream,))


def _write_record(
    cursor: pymysql.cursors.Cursor, header: EnvelopeHeader, metadata: RecordMetadata, payload: bytes
) -> None:
    cursor.execute(
        f"REPLACE INTO records ({_RECORD_COLUMNS}, payload)"  # noqa: S608 - constant columns
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            header.namespace,
            header.key_digest,
            header.sensitivity.value,
            header.schema_version,
            header.key_id,
            header.revision,
            utc_text(header.written_at),
            header.ledger_index,
            json.dumps(dict(metadata.labels), sort_keys=True),
            metadata.byte_length,
            metadata.payload_digest,
            json.dumps(sorted(metadata.tags)),
            payload,
        ),
    )


def _metadata(row: Sequence[object]) -> RecordMetadata:
    """Rebuild a record's metadata; a row that does not parse is an integrity failure."""
    try:
        (
            namespace,
            key_digest,
            sensitivity,
            schema_version,
            key_id,
            revision,
            written_at,
            ledger_index,
            labels,
            byte_length,
            payload_digest,
            tags,
        ) = row
        header = EnvelopeHeader(
            namespace=_text(namespace),
            key_digest=_text(key_digest),
            sensitivity=_text(sensitivity),
            schema_version=schema_version,
            key_id=_text(key_id),
            revision=revision,
            written_at=datetime.strptime(_text(written_at), _UTC_FORMAT).replace(tzinfo=UTC),
            ledger_index=_optional_int(ledger_index),
        )
        parsed = json.loads(_text(labels))
        tag_list = json.loads(_text(tags))
        if (
            not isinstance(parsed, Mapping)
            or not isinstance(byte_length, int)
            or not isinstance(tag_list, list)
            or not all(isinstance(tag, str) for tag in tag_list)
        ):
            raise IntegrityFailure("a stored record is malformed")
        return RecordMetadata(
            header=header,
            labels=dict(parsed),
            byte_length=byte_length,
            payload_digest=_text(payload_digest),
            tags=frozenset(tag_list),
        )
    except IntegrityFailure:
        raise
    except (FlowvaultError, ValueError, TypeError):
        raise IntegrityFailure("a stored record is unreadable") from None


def _event(row: Sequence[object]) -> LedgerEvent:
    """Rebuild a stored event; a row that does not parse is an integrity failure."""
    (
        stream,
        index,
        type_,
        from_state,
        to_state,
        occurred_at,
        payload_text,
        previous_hash,
        event_hash,
        event_key,
        chain_mac,
    ) = row
    try:
        return LedgerEvent.restore(
            stream=_text(stream),
            index=index,
            type=_text(type_),
            from_state=_optional_text(from_state),
            to_state=_optional_text(to_state),
            occurred_at=datetime.fromisoformat(_text(occurred_at)),
            payload_text=_text(payload_text),
            previous_hash=_text(previous_hash),
            event_hash=_text(event_hash),
            event_key=_optional_text(event_key),
            chain_mac=_optional_text(chain_mac),
        )
    except IntegrityFailure:
        raise
    except (FlowvaultError, ValueError, TypeError):
        raise IntegrityFailure("a stored ledger event is unreadable") from None


def _translate(exc: pymysql.MySQLError) -> NoReturn:
    """Raise the flowvault error for a driver error; the driver's own never leaks."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    if code in _BUSY_CODES:
        raise StoreBusy("the MariaDB store stayed locked", code=code) from None
    if isinstance(exc, pymysql.err.IntegrityError):
        raise RevisionConflict(
            "a concurrent writer changed the rows this unit guards", code=code
        ) from None
    if isinstance(exc, pymysql.err.DataError):
        raise IntegrityFailure("the MariaDB store refused a value", code=code) from None
    raise StoreUnavailable("the MariaDB store could not be reached", code=code) from None


__all__ = ["MariaDBSecureObjectStore", "utc_text"]
