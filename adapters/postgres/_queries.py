"""Every SQL statement the adapter runs, built once at import.

Names are unqualified: each pooled session's ``search_path`` is the store's
schema. Every compare-and-swap guard is part of the ``WHERE`` clause of the
write it guards, so at READ COMMITTED the row is re-checked after any wait
for a concurrent writer; tests run ``EXPLAIN`` on these very strings.
"""

from __future__ import annotations

from typing import Final

from flowvault.adapters import _listing as listing
from flowvault.application import Order

LOAD_RECORD: Final = (
    f"SELECT {listing.METADATA_COLUMNS}, r.payload "  # noqa: S608 - constant columns
    "FROM records r WHERE r.namespace = %s AND r.key_digest = %s"
)
PEEK_METADATA: Final = (
    f"SELECT {listing.METADATA_COLUMNS} "  # noqa: S608 - constant columns
    "FROM records r WHERE r.namespace = %s AND r.key_digest = %s"
)
LOAD_MANY: Final = LOAD_RECORD.replace("r.key_digest = %s", "r.key_digest = ANY(%s::text[])")
"""Records of one namespace by a list of key digests (bound as one ``text[]``)."""
LOCK_RECORD: Final = "SELECT pg_advisory_lock(hashtextextended(%s, 0))"
"""A session lock on a record's name; two names may share a hash, which only makes one wait."""
UNLOCK_RECORD: Final = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"

STORED_REVISION: Final = "SELECT revision FROM records WHERE namespace = %s AND key_digest = %s"
"""Re-read after a failed guard, in the same transaction, for the conflict's details."""

CREATE_RECORD: Final = (
    "INSERT INTO records (namespace, key_digest, revision, sensitivity, schema_version, "
    "key_id, written_at, ledger_index, labels, byte_length, payload_digest, payload, tags) "
    "VALUES (%(namespace)s, %(key_digest)s, %(revision)s, %(sensitivity)s, "
    "%(schema_version)s, %(key_id)s, %(written_at)s, %(ledger_index)s, %(labels)s, "
    "%(byte_length)s, %(payload_digest)s, %(payload)s, %(tags)s) "
    "ON CONFLICT (namespace, key_digest) DO NOTHING RETURNING id"
)
"""``Guard.ABSENT``: no row comes back when the record exists (or a racing insert committed)."""
REPLACE_RECORD: Final = (
    "UPDATE records SET revision = %(revision)s, sensitivity = %(sensitivity)s, "
    "schema_version = %(schema_version)s, key_id = %(key_id)s, written_at = %(written_at)s, "
    "ledger_index = %(ledger_index)s, labels = %(labels)s, byte_length = %(byte_length)s, "
    "payload_digest = %(payload_digest)s, payload = %(payload)s, tags = %(tags)s "
    "WHERE namespace = %(namespace)s AND key_digest = %(key_digest)s "
    "AND revision = %(expected)s RETURNING id"
)
"""An exact guard: the row changes only while it still holds the expected revision."""
RESEAL_RECORD: Final = REPLACE_RECORD.replace(
    "AND revision = %(expected)s", "AND revision = %(expected)s AND payload_digest = %(replaces)s"
)
"""A re-seal's guard: the revision and the exact seal (payload digest) it replaces."""
ADVANCE_RECORD: Final = (
    "INSERT INTO records AS stored (namespace, key_digest, revision, sensitivity, "
    "schema_version, key_id, written_at, ledger_index, labels, byte_length, payload_digest, "
    "payload, tags) "
    "VALUES (%(namespace)s, %(key_digest)s, %(revision)s, %(sensitivity)s, "
    "%(schema_version)s, %(key_id)s, %(written_at)s, %(ledger_index)s, %(labels)s, "
    "%(byte_length)s, %(payload_digest)s, %(payload)s, %(tags)s) "
    "ON CONFLICT (namespace, key_digest) DO UPDATE SET "
    "revision = excluded.revision, sensitivity = excluded.sensitivity, "
    "schema_version = excluded.schema_version, key_id = excluded.key_id, "
    "written_at = excluded.written_at, ledger_index = excluded.ledger_index, "
    "labels = excluded.labels, tags = excluded.tags, "
    "byte_length = excluded.byte_length, payload_digest = excluded.payload_digest, "
    "payload = excluded.payload "
    "WHERE stored.revision < excluded.revision RETURNING stored.id"
)
"""``Guard.ANY``: insert, or replace only a lower revision, so revisions never move back."""

CLEAR_INDEX_ROWS: Final = (
    "WITH tags AS (DELETE FROM record_tags WHERE record_id = %(id)s) "
    "DELETE FROM record_labels WHERE record_id = %(id)s"
)
"""Clears a replaced record's label and tag rows in one statement, so one round trip."""
INSERT_TAG: Final = "INSERT INTO record_tags (record_id, namespace, tag) VALUES (%s, %s, %s)"
INSERT_LABEL: Final = (
    "INSERT INTO record_labels (record_id, namespace, name, text_value, int_value) "
    "VALUES (%s, %s, %s, %s, %s)"
)
DELETE_RECORD_AT: Final = (
    "DELETE FROM records WHERE namespace = %s AND key_digest = %s AND revision = %s"
)
"""Label and tag rows follow through ``ON DELETE CASCADE``."""
DELETE_RECORD: Final = "DELETE FROM records WHERE namespace = %s AND key_digest = %s"
"""``Guard.ANY``: deleting an absent record is a no-op."""

CREATE_STREAM: Final = (
    "INSERT INTO ledger_streams (stream, first_index, head_index, head_hash) "
    "VALUES (%s, 0, %s, %s) ON CONFLICT (stream) DO NOTHING"
)
"""An append at index 0: the head row must not exist yet."""
ADVANCE_HEAD: Final = (
    "UPDATE ledger_streams SET head_index = %s, head_hash = %s "
    "WHERE stream = %s AND head_index = %s AND head_hash = %s"
)
"""An append at index n: the head must be event n - 1 with exactly that hash.

The row lock it takes is held to the commit, so one stream's appends
serialise, and the loser re-checks the moved head and matches nothing.
"""
HEAD_INDEX: Final = "SELECT head_index FROM ledger_streams WHERE stream = %s"
INSERT_EVENT: Final = (
    "INSERT INTO ledger_events (stream, idx, type, from_state, to_state, occurred_at, "
    "payload, previous_hash, event_hash, event_key, chain_mac) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
TRIM_STREAM: Final = (
    "UPDATE ledger_streams SET first_index = GREATEST(first_index, LEAST(%s, head_index)) "
    "WHERE stream = %s RETURNING first_index"
)
"""Moves the first retained index forward, never past the head, never back."""
TRIM_EVENTS: Final = "DELETE FROM ledger_events WHERE stream = %s AND idx < %s"

DROP_STREAM: Final = "DELETE FROM ledger_streams WHERE stream = %s AND head_index = %s"
"""A drop: the head must be the one it names; the row lock it takes is held to the commit."""
DROP_EVENTS: Final = "DELETE FROM ledger_events WHERE stream = %s"

LEDGER_HEAD: Final = (
    "SELECT stream, idx, type, from_state, to_state, occurred_at, payload, "
    "previous_hash, event_hash, event_key, chain_mac "
    "FROM ledger_events WHERE stream = %s ORDER BY idx DESC LIMIT 1"
)
LEDGER_HEAD_INDEX: Final = (
    "SELECT idx FROM ledger_events WHERE stream = %s ORDER BY idx DESC LIMIT 1"
)
LEDGER_HEAD_INDEXES: Final = (
    "SELECT s, (SELECT idx FROM ledger_events WHERE stream = s ORDER BY idx DESC LIMIT 1) "
    "FROM unnest(%s::text[]) AS s"
)
"""Each named stream with its head index, or null when it has no events.

One descending probe of the ``(stream, idx)`` primary key per name, all in
one statement and one round trip.
"""
LEDGER_PAGE: Final = (
    "SELECT s.first_index, s.head_index, s.head_hash, "
    "e.stream, e.idx, e.type, e.from_state, e.to_state, e.occurred_at, e.payload, "
    "e.previous_hash, e.event_hash, e.event_key, e.chain_mac "
    "FROM (SELECT 1) AS one "
    "LEFT JOIN ledger_streams AS s ON s.stream = %s "
    "LEFT JOIN LATERAL (SELECT * FROM ledger_events WHERE stream = %s AND idx >= %s "
    "ORDER BY idx LIMIT %s) AS e ON true "
    "ORDER BY e.idx"
)
"""The stream's row and a page of its events in one statement, so in one snapshot.

Always at least one row: the stream row's three columns (null if there is
none), then an event's columns (null when the page is empty).
"""

LIST_STREAMS: Final = (
    'SELECT stream FROM ledger_streams WHERE stream > %s ORDER BY stream COLLATE "C" LIMIT %s'
)
"""Stream names after a mark; the column is ``COLLATE "C"``, so code-point order."""
HAS_RECORDS: Final = "SELECT EXISTS (SELECT 1 FROM records) OR EXISTS (SELECT 1 FROM ledger_events)"
HAS_RECORD: Final = "SELECT 1 FROM records WHERE namespace = %s AND key_digest = %s"
HAS_STREAM: Final = (
    "SELECT 1 FROM ledger_streams WHERE stream = %s "
    "UNION ALL SELECT 1 FROM ledger_events WHERE stream = %s LIMIT 1"
)
NAMESPACE_COUNTS: Final = "SELECT namespace, count(*) FROM records GROUP BY namespace"
KEY_ID_COUNTS: Final = "SELECT key_id, count(*) FROM records GROUP BY key_id"

RESERVE_SEALS: Final = (
    "INSERT INTO seal_counters AS stored (key_id, reserved) VALUES (%s, %s) "
    "ON CONFLICT (key_id) DO UPDATE SET reserved = stored.reserved + excluded.reserved "
    "RETURNING reserved"
)
"""Adds to a key's counter, creating it at the first reservation; returns the new total.

Concurrent reservations of one key wait on its row lock, then add to the
committed total, so at READ COMMITTED none is lost.
"""
SEAL_COUNTS: Final = "SELECT key_id, reserved FROM seal_counters"

RAISE_EPOCH: Final = "SELECT nextval('store_epoch')"
"""Run once in every transaction that commits a unit, after its guards held."""
STORE_EPOCH: Final = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM store_epoch"
"""The last value handed out; 0 before the first ``nextval``."""
STORE_NOW: Final = "SELECT clock_timestamp()"
"""The server's time as the statement runs, not as its transaction began (``now()``)."""

LOCK_FOR_FILL: Final = (
    "LOCK TABLE records, ledger_streams, ledger_events, seal_counters IN EXCLUSIVE MODE"
)
"""Held by a fill to its commit, so two fills (or a fill and a unit) never interleave."""
FILL_STREAM: Final = (
    "INSERT INTO ledger_streams (stream, first_index, head_index, head_hash) "
    "VALUES (%s, %s, %s, %s)"
)
FILL_SEALS: Final = "INSERT INTO seal_counters (key_id, reserved) VALUES (%s, %s)"
SET_EPOCH: Final = (
    "SELECT setval('store_epoch', GREATEST(%s, "
    "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM store_epoch)), true)"
)
"""Only a fill sets the count: to the source's, unless the schema's is higher already.

``setval`` is not transactional: a fill killed after it leaves the count
raised in an otherwise empty schema, which is why a count alone does not
make a schema hold anything.
"""

FilterShape = listing.FilterShape
PLACEHOLDER: Final = "%s"
"""What the shared statement builders put where a parameter binds."""


def list_query(
    order: Order, after_cursor: bool, filters: tuple[FilterShape, ...] = (), tags: int = 0
) -> str:
    """Return the shared ``list`` statement with this driver's placeholder."""
    return listing.list_query(PLACEHOLDER, order, after_cursor, filters, tags)
