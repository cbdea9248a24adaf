"""One unit of work inside one write transaction: every guard first, then every write.

The caller holds the write lock (``BEGIN IMMEDIATE``), so what the guards
read cannot change before the writes land.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from flowvault.adapters._rows import Params, event_params, stream_state
from flowvault.adapters._sql_store import INDEX_CEILING
from flowvault.adapters.sqlite import _queries as sql
from flowvault.adapters.sqlite._rows import (
    LabelWrites,
    TagWrites,
    label_writes,
    record_params,
    tag_writes,
)
from flowvault.application import (
    UnitOfWork,
    check_append,
    check_delete,
    check_drop,
    check_upsert,
)
from flowvault.domain import LedgerEvent

_Head = tuple[int | None, str | None]


@dataclass(frozen=True, slots=True)
class PreparedUnit:
    """A unit's statement parameters, encoded before the write lock is taken.

    Encoding can refuse input (``InvalidInput``); doing it first keeps the
    lock short and a refused unit from ever starting a transaction.
    """

    records: list[Params]
    key_ids: list[Params]
    labels: list[LabelWrites]
    tags: list[TagWrites]
    deletes: list[Params]
    events: list[Params]
    heads: list[Params]
    trims: list[tuple[int, str]]
    drops: list[tuple[str]]

    @classmethod
    def build(cls, unit: UnitOfWork) -> PreparedUnit:
        """Encode every write of ``unit``."""
        labels = [label_writes(upsert) for upsert in unit.upserts]
        return cls(
            records=[
                record_params(upsert, written.encoded)
                for upsert, written in zip(unit.upserts, labels, strict=True)
            ],
            key_ids=[
                (u.header.key_id, u.header.namespace, u.header.key_digest, u.header.key_id)
                for u in unit.upserts
            ],
            labels=labels,
            tags=[tag_writes(upsert) for upsert in unit.upserts],
            deletes=[(delete.namespace, delete.key_digest) for delete in unit.deletes],
            events=[event_params(event) for event in unit.appends],
            heads=_head_rows(unit.appends),
            trims=[(min(trim.before_index, INDEX_CEILING), trim.stream) for trim in unit.trims],
            drops=[(drop.stream,) for drop in unit.drops],
        )


def _head_rows(appends: Sequence[LedgerEvent]) -> list[Params]:
    """Return one ``ADVANCE_HEAD`` row per stream: its last appended event."""
    last = {event.stream: event for event in appends}
    return [(event.stream, 0, event.index, event.event_hash) for event in last.values()]


def _stored_revision(connection: sqlite3.Connection, namespace: str, key_digest: str) -> int | None:
    rows = connection.execute(sql.STORED_REVISION, (namespace, key_digest)).fetchall()
    return rows[0][0] if rows else None


def _stream_head(connection: sqlite3.Connection, stream: str) -> _Head:
    rows = connection.execute(sql.STREAM_STATE, (stream,)).fetchall()
    if not rows:
        return None, None
    _, head_index, head_hash = stream_state(rows[0])
    return head_index, head_hash


def _stored_row(connection: sqlite3.Connection, address: Params) -> tuple[object, object, object]:
    """Return the ``labels``, ``key_id`` and ``tags`` an upsert replaces; ``None`` for a new one."""
    rows = connection.execute(sql.STORED_ROW, address).fetchall()
    return (rows[0][0], rows[0][1], rows[0][2]) if rows else (None, None, None)


def check_guards(connection: sqlite3.Connection, unit: UnitOfWork) -> None:
    """Raise ``RevisionConflict`` at the first guard the stored state does not satisfy."""
    for upsert in unit.upserts:
        header = upsert.header
        if upsert.replaces is None:
            stored = _stored_revision(connection, header.namespace, header.key_digest)
            digest = None
        else:
            rows = connection.execute(
                sql.STORED_VERSION, (header.namespace, header.key_digest)
            ).fetchall()
            stored, digest = rows[0] if rows else (None, None)
        check_upsert(
            header.namespace,
            header.key_digest,
            upsert.expected,
            stored,
            header.revision,
            replaces=upsert.replaces,
            stored_digest=digest,
        )
    for delete in unit.deletes:
        stored = _stored_revision(connection, delete.namespace, delete.key_digest)
        check_delete(delete.namespace, delete.key_digest, delete.expected, stored)
    heads: dict[str, _Head] = {}
    for event in unit.appends:
        if event.stream not in heads:
            heads[event.stream] = _stream_head(connection, event.stream)
        check_append(event, *heads[event.stream])
        heads[event.stream] = (event.index, event.event_hash)
    for drop in unit.drops:
        check_drop(drop.stream, drop.head_index, _stream_head(connection, drop.stream)[0])


def _many(connection: sqlite3.Connection, statement: str, rows: Sequence[Params]) -> None:
    """Run ``statement`` once per row; no rows, no call into the driver at all."""
    if rows:
        connection.executemany(statement, rows)


def apply_writes(connection: sqlite3.Connection, prepared: PreparedUnit) -> None:
    """Write everything, in the reference order: upserts, deletes, appends, trims, drops.

    Label and tag rows are written only where a record's label or tag set
    changed, judged against the set its row held before this write.
    """
    stored = [_stored_row(connection, labels.address) for labels in prepared.labels]
    _many(connection, sql.UPSERT_RECORD, prepared.records)
    _many(
        connection,
        sql.SET_KEY_ID,
        [
            key_id
            for key_id, (_, stored_key_id, _) in zip(prepared.key_ids, stored, strict=True)
            if stored_key_id is not None and stored_key_id != key_id[0]
        ],
    )
    for labels, (stored_labels, _, _) in zip(prepared.labels, stored, strict=True):
        changed = labels.changes(stored_labels)
        if changed is not None:
            _many(connection, changed.prune_sql, changed.prune)
            _many(connection, sql.UPSERT_TEXT_LABEL, changed.text)
            _many(connection, sql.UPSERT_INT_LABEL, changed.integers)
    for tags, (_, _, stored_tags) in zip(prepared.tags, stored, strict=True):
        if tags.changed(stored_tags):
            if stored_tags is not None:
                connection.execute(sql.CLEAR_TAGS, tags.address)
            _many(connection, sql.INSERT_TAG, tags.rows)
    _many(connection, sql.DELETE_RECORD, prepared.deletes)
    _many(connection, sql.INSERT_EVENT, prepared.events)
    _many(connection, sql.ADVANCE_HEAD, prepared.heads)
    for before_index, stream in prepared.trims:
        connection.execute(sql.TRIM_STREAM, (before_index, stream))
        connection.execute(sql.TRIM_EVENTS, (stream, stream))
    _many(connection, sql.DROP_EVENTS, prepared.drops)
    _many(connection, sql.DROP_STREAM, prepared.drops)
