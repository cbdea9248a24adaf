"""One unit of work as one READ COMMITTED transaction, each guard inside its own write.

At READ COMMITTED a guard read in one statement and enforced in the next
would lose updates; here every write carries its guard in the ``WHERE``
clause (or an ``ON CONFLICT`` rule), PostgreSQL re-checks it against the
latest row version after waiting for a concurrent writer, and the number
of rows written says whether it held. A failed guard raises inside the
transaction, so the rollback undoes whatever the unit had already written.

Rows are locked in one global order, records by key and then streams by
name, so two units never wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from flowvault.adapters._rows import Params, event_params
from flowvault.adapters._sql_store import INDEX_CEILING
from flowvault.adapters.postgres import _queries as sql
from flowvault.adapters.postgres._connect import Connection
from flowvault.adapters.postgres._rows import label_rows, record_params, tag_rows
from flowvault.application import (
    Delete,
    Guard,
    LedgerDrop,
    LedgerTrim,
    StoreContents,
    UnitOfWork,
    Upsert,
    check_append,
    check_drop,
)
from flowvault.application._records import ExpectedRevision
from flowvault.domain import LedgerEvent, RevisionConflict, StoreNotEmpty
from flowvault.domain._ledger import GENESIS_HASH


def _describe(expected: ExpectedRevision) -> str | int:
    return expected.value if isinstance(expected, Guard) else expected


def _stored_revision(connection: Connection, namespace: str, key_digest: str) -> int | None:
    row = connection.execute(sql.STORED_REVISION, (namespace, key_digest)).fetchone()
    return None if row is None else int(row[0])


def _record_conflict(
    connection: Connection, guard: str, namespace: str, key_digest: str, expected: ExpectedRevision
) -> RevisionConflict:
    """Build the conflict a failed record guard raises, with the revision stored now."""
    return RevisionConflict(
        f"record revision does not match the {guard}'s guard",
        guard=guard,
        namespace=namespace,
        key_digest=key_digest,
        expected=_describe(expected),
        actual=_stored_revision(connection, namespace, key_digest),
    )


def _append_conflict(connection: Connection, event: LedgerEvent) -> RevisionConflict:
    row = connection.execute(sql.HEAD_INDEX, (event.stream,)).fetchone()
    return RevisionConflict(
        "ledger append does not extend the stream head",
        guard="append",
        stream=event.stream,
        index=event.index,
        head_index=None if row is None else int(row[0]),
    )


@dataclass(frozen=True, slots=True)
class _RecordWrite:
    """One upsert, encoded; its guard picks the statement."""

    upsert: Upsert
    params: dict[str, object] = field(repr=False)
    labels: list[Params]
    tags: list[Params]

    @classmethod
    def of(cls, upsert: Upsert) -> _RecordWrite:
        """Encode one upsert."""
        return cls(upsert, record_params(upsert), label_rows(upsert), tag_rows(upsert))

    @property
    def key(self) -> tuple[str, str]:
        return self.upsert.header.namespace, self.upsert.header.key_digest

    def apply(self, connection: Connection) -> None:
        expected = self.upsert.expected
        statement = (
            sql.CREATE_RECORD
            if expected is Guard.ABSENT
            else sql.ADVANCE_RECORD
            if expected is Guard.ANY
            else sql.REPLACE_RECORD
            if self.upsert.replaces is None
            else sql.RESEAL_RECORD
        )
        row = connection.execute(statement, self.params).fetchone()
        if row is None:
            raise _record_conflict(connection, "upsert", *self.key, expected)
        record_id = row[0]
        if expected is not Guard.ABSENT:
            connection.execute(sql.CLEAR_INDEX_ROWS, {"id": record_id})
        if self.labels:
            with connection.cursor() as cursor:
                cursor.executemany(sql.INSERT_LABEL, [(record_id, *label) for label in self.labels])
        if self.tags:
            with connection.cursor() as cursor:
                cursor.executemany(sql.INSERT_TAG, [(record_id, *tag) for tag in self.tags])


@dataclass(frozen=True, slots=True)
class _RecordDelete:
    """One delete; ``Guard.ANY`` removes whatever is there, even nothing."""

    delete: Delete

    @property
    def key(self) -> tuple[str, str]:
        return self.delete.namespace, self.delete.key_digest

    def apply(self, connection: Connection) -> None:
        expected = self.delete.expected
        if expected is Guard.ANY:
            connection.execute(sql.DELETE_RECORD, self.key)
            return
        removed = connection.execute(sql.DELETE_RECORD_AT, (*self.key, expected)).rowcount
        if removed != 1:
            raise _record_conflict(connection, "delete", *self.key, expected)


@dataclass(frozen=True, slots=True)
class _StreamWrite:
    """A stream's appends (consecutive, checked when built) and then its trims; or its drop."""

    stream: str
    events: list[LedgerEvent] = field(default_factory=list)
    trims: list[int] = field(default_factory=list)
    drop: int | None = None
    """The head index a drop names; a unit that drops a stream neither appends nor trims it."""

    def apply(self, connection: Connection) -> None:
        if self.events:
            self._append(connection)
        for before_index in self.trims:
            row = connection.execute(sql.TRIM_STREAM, (before_index, self.stream)).fetchone()
            if row is not None:
                connection.execute(sql.TRIM_EVENTS, (self.stream, row[0]))
        if self.drop is not None:
            if not _changed(connection, sql.DROP_STREAM, (self.stream, self.drop)):
                row = connection.execute(sql.HEAD_INDEX, (self.stream,)).fetchone()
                head = None if row is None else int(row[0])
                # the row was not deleted, so the guard failed whatever the head reads now
                check_drop(self.stream, self.drop, None if head == self.drop else head)
            connection.execute(sql.DROP_EVENTS, (self.stream,))

    def _append(self, connection: Connection) -> None:
        first, last = self.events[0], self.events[-1]
        if first.index == 0:
            moved = first.previous_hash == GENESIS_HASH and _changed(
                connection, sql.CREATE_STREAM, (self.stream, last.index, last.event_hash)
            )
        else:
            head = (self.stream, first.index - 1, first.previous_hash)
            moved = _changed(connection, sql.ADVANCE_HEAD, (last.index, last.event_hash, *head))
        if not moved:
            raise _append_conflict(connection, first)
        with connection.cursor() as cursor:
            cursor.executemany(sql.INSERT_EVENT, [event_params(event) for event in self.events])


def _changed(connection: Connection, statement: str, params: Params) -> bool:
    return connection.execute(statement, params).rowcount == 1


def _streams(
    appends: Sequence[LedgerEvent], trims: Sequence[LedgerTrim], drops: Sequence[LedgerDrop]
) -> list[_StreamWrite]:
    """Group appends, trims and drops by stream, in stream order; chain each stream's appends.

    Appends after a stream's first one extend the unit's own events, so
    whether they chain is known before any row is read.
    """
    streams: dict[str, _StreamWrite] = {}
    for event in appends:
        group = streams.setdefault(event.stream, _StreamWrite(event.stream))
        if group.events:
            previous = group.events[-1]
            check_append(event, previous.index, previous.event_hash)
        group.events.append(event)
    for trim in trims:
        group = streams.setdefault(trim.stream, _StreamWrite(trim.stream))
        group.trims.append(min(trim.before_index, INDEX_CEILING))
    for drop in drops:
        streams[drop.stream] = _StreamWrite(drop.stream, drop=drop.head_index)
    return [streams[name] for name in sorted(streams)]


@dataclass(frozen=True, slots=True)
class PreparedUnit:
    """A unit's writes, encoded and ordered before any connection is taken.

    Encoding can refuse input (``InvalidInput``) and in-unit chaining can
    fail (``RevisionConflict``); doing both first keeps a doomed unit from
    ever starting a transaction, and a retried transaction reuses the work.
    """

    records: list[_RecordWrite | _RecordDelete]
    streams: list[_StreamWrite]

    @classmethod
    def build(cls, unit: UnitOfWork) -> PreparedUnit:
        """Encode every write of ``unit``, records in key order, streams in name order."""
        records: list[_RecordWrite | _RecordDelete] = [
            _RecordWrite.of(upsert) for upsert in unit.upserts
        ]
        records += [_RecordDelete(delete) for delete in unit.deletes]
        records.sort(key=lambda write: write.key)
        return cls(records=records, streams=_streams(unit.appends, unit.trims, unit.drops))

    def apply(self, connection: Connection) -> None:
        """Run every guarded write, then raise the epoch; the caller's transaction commits all."""
        for write in self.records:
            write.apply(connection)
        for stream in self.streams:
            stream.apply(connection)
        connection.execute(sql.RAISE_EPOCH)


def _write_rows(connection: Connection, contents: StoreContents) -> None:
    """Write the records, each stream's row at its first retained index and head, and events."""
    for upsert in contents.unit().upserts:
        _RecordWrite.of(upsert).apply(connection)
    with connection.cursor() as cursor:
        cursor.executemany(
            sql.FILL_STREAM,
            [
                (name, events[0].index, events[-1].index, events[-1].event_hash)
                for name, events in contents.streams().items()
            ],
        )
        cursor.executemany(sql.INSERT_EVENT, [event_params(event) for event in contents.events])


def fill(connection: Connection, contents: StoreContents) -> None:
    """Write ``contents`` into an empty schema inside the caller's transaction.

    The tables are locked first and the schema found empty under the lock;
    records then go in as ``Guard.ANY`` upserts, each stream's row at its
    first retained index and head, its events, the seal counts, and last
    the epoch (``setval``, which a rollback does not undo).
    """
    connection.execute(sql.LOCK_FOR_FILL)
    held = connection.execute(sql.HAS_RECORDS).fetchone()
    if (held is not None and held[0]) or connection.execute(sql.SEAL_COUNTS).fetchall():
        raise StoreNotEmpty("the store already holds data")
    _write_rows(connection, contents)
    with connection.cursor() as cursor:
        cursor.executemany(sql.FILL_SEALS, sorted(contents.seal_counts.items()))
    if contents.epoch:
        connection.execute(sql.SET_EPOCH, (contents.epoch,))


def add(connection: Connection, contents: StoreContents) -> None:
    """Write ``contents`` next to the schema's rows inside the caller's transaction.

    Under the same table locks as ``fill``, none of its records or streams
    may exist; seal counts are added to, and the epoch raised once.
    """
    connection.execute(sql.LOCK_FOR_FILL)
    for record in contents.records:
        meta = record.metadata
        if connection.execute(sql.HAS_RECORD, (meta.namespace, meta.key_digest)).fetchone():
            raise StoreNotEmpty("the store already holds one of these records or streams")
    for name in contents.streams():
        if connection.execute(sql.HAS_STREAM, (name, name)).fetchone():
            raise StoreNotEmpty("the store already holds one of these records or streams")
    _write_rows(connection, contents)
    with connection.cursor() as cursor:
        cursor.executemany(sql.RESERVE_SEALS, sorted(contents.seal_counts.items()))
    connection.execute(sql.RAISE_EPOCH)
