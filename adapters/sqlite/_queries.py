"""Every SQL statement the adapter runs, built once at import.

Tests run ``EXPLAIN QUERY PLAN`` on these very strings, so an index that a
query stops using is caught as a test failure rather than a slow store.
"""

from __future__ import annotations

from typing import Final

from flowvault.adapters import _listing as listing
from flowvault.application import Order

LOAD_RECORD: Final = (
    f"SELECT {listing.METADATA_COLUMNS}, r.payload "  # noqa: S608 - constant columns
    "FROM records r WHERE r.namespace = ? AND r.key_digest = ?"
)
PEEK_METADATA: Final = (
    f"SELECT {listing.METADATA_COLUMNS} "  # noqa: S608 - constant columns
    "FROM records r WHERE r.namespace = ? AND r.key_digest = ?"
)
STORED_REVISION: Final = "SELECT revision FROM records WHERE namespace = ? AND key_digest = ?"

STORED_VERSION: Final = (
    "SELECT revision, payload_digest FROM records WHERE namespace = ? AND key_digest = ?"
)
"""What a re-seal's guard compares: the revision and the exact seal it replaces."""

UPSERT_RECORD: Final = (
    "INSERT INTO records (namespace, key_digest, revision, sensitivity, schema_version, "
    "key_id, written_at, ledger_index, labels, byte_length, payload_digest, payload, tags) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (namespace, key_digest) DO UPDATE SET "
    "revision = excluded.revision, sensitivity = excluded.sensitivity, "
    "schema_version = excluded.schema_version, "
    "written_at = excluded.written_at, ledger_index = excluded.ledger_index, "
    "labels = excluded.labels, tags = excluded.tags, "
    "byte_length = excluded.byte_length, payload_digest = excluded.payload_digest, "
    "payload = excluded.payload"
)
"""``key_id`` is left to ``SET_KEY_ID``: rewriting it unchanged would dirty its index page."""
SET_KEY_ID: Final = (
    "UPDATE records SET key_id = ? WHERE namespace = ? AND key_digest = ? AND key_id IS NOT ?"
)
"""Only a record re-sealed under another key touches ``records_by_key_id``."""
_LABEL_RECORD: Final = "(SELECT id FROM records WHERE namespace = ? AND key_digest = ?)"
CLEAR_LABELS: Final = f"DELETE FROM record_labels WHERE record_id = {_LABEL_RECORD}"  # noqa: S608


def prune_labels(count: int) -> str:
    """Return the statement deleting a record's labels other than ``count`` kept ones.

    A label is kept only under the same name and the same type (text or
    integer), so the typed upserts that follow never meet a row of the
    other type. Its parameters: namespace, key digest, then name and
    "is an integer" for each kept label.
    """
    if count == 0:
        return CLEAR_LABELS
    kept = ", ".join(["(?, ?)"] * count)
    return (
        f"DELETE FROM record_labels WHERE record_id = {_LABEL_RECORD} "  # noqa: S608 - placeholders only
        f"AND (name, int_value IS NOT NULL) NOT IN (VALUES {kept})"
    )


DELETE_LABEL: Final = f"DELETE FROM record_labels WHERE record_id = {_LABEL_RECORD} AND name = ?"  # noqa: S608
"""Deletes one label of a record, by name."""
STORED_ROW: Final = (
    "SELECT labels, key_id, tags FROM records WHERE namespace = ? AND key_digest = ?"
)
"""What an upsert replaces, read under the write lock: which index rows and key id change."""
CLEAR_TAGS: Final = f"DELETE FROM record_tags WHERE record_id = {_LABEL_RECORD}"  # noqa: S608
INSERT_TAG: Final = (
    "INSERT INTO record_tags (record_id, namespace, tag) "
    "SELECT id, namespace, ? FROM records WHERE namespace = ? AND key_digest = ?"
)
"""Writes one tag row of a record whose tags changed (its old rows cleared first)."""
UPSERT_TEXT_LABEL: Final = (
    "INSERT INTO record_labels (record_id, namespace, name, text_value, int_value) "
    "SELECT id, namespace, ?, ?, NULL FROM records WHERE namespace = ? AND key_digest = ? "
    "ON CONFLICT (record_id, name) DO UPDATE SET text_value = excluded.text_value "
    "WHERE text_value IS NOT excluded.text_value"
)
"""Writes a text label only if it is new or changed, touching only the text index."""
UPSERT_INT_LABEL: Final = (
    "INSERT INTO record_labels (record_id, namespace, name, text_value, int_value) "
    "SELECT id, namespace, ?, NULL, ? FROM records WHERE namespace = ? AND key_digest = ? "
    "ON CONFLICT (record_id, name) DO UPDATE SET int_value = excluded.int_value "
    "WHERE int_value IS NOT excluded.int_value"
)
"""Writes an integer label only if it is new or changed, touching only the integer index."""
DELETE_RECORD: Final = "DELETE FROM records WHERE namespace = ? AND key_digest = ?"
"""Label and tag rows follow through ``ON DELETE CASCADE``."""

INSERT_EVENT: Final = (
    "INSERT INTO ledger_events (stream, idx, type, from_state, to_state, occurred_at, "
    "payload, previous_hash, event_hash, event_key, chain_mac) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
STREAM_STATE: Final = (
    "SELECT first_index, head_index, head_hash FROM ledger_streams WHERE stream = ?"
)
ADVANCE_HEAD: Final = (
    "INSERT INTO ledger_streams (stream, first_index, head_index, head_hash) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (stream) DO UPDATE SET "
    "head_index = excluded.head_index, head_hash = excluded.head_hash"
)
TRIM_STREAM: Final = (
    "UPDATE ledger_streams SET first_index = MAX(first_index, MIN(?, head_index)) WHERE stream = ?"
)
"""Moves the first retained index forward, never past the head, never back."""
TRIM_EVENTS: Final = (
    "DELETE FROM ledger_events WHERE stream = ? AND idx < "
    "(SELECT first_index FROM ledger_streams WHERE stream = ?)"
)
DROP_EVENTS: Final = "DELETE FROM ledger_events WHERE stream = ?"
DROP_STREAM: Final = "DELETE FROM ledger_streams WHERE stream = ?"
LEDGER_HEAD: Final = (
    "SELECT stream, idx, type, from_state, to_state, occurred_at, payload, "
    "previous_hash, event_hash, event_key, chain_mac "
    "FROM ledger_events WHERE stream = ? ORDER BY idx DESC LIMIT 1"
)
LEDGER_HEAD_INDEX: Final = (
    "SELECT idx FROM ledger_events WHERE stream = ? ORDER BY idx DESC LIMIT 1"
)
LEDGER_PAGE: Final = (
    "SELECT stream, idx, type, from_state, to_state, occurred_at, payload, "
    "previous_hash, event_hash, event_key, chain_mac "
    "FROM ledger_events WHERE stream = ? AND idx >= ? ORDER BY idx LIMIT ?"
)


def ledger_head_indexes(count: int) -> str:
    """Return the statement answering ``(stream, head index)`` for ``count`` distinct names.

    Each name's head is one descending probe of the ``(stream, idx)``
    primary key, so the cost follows the names asked, not the events
    stored; a stream without events answers a null index.
    """
    wanted = ", ".join(["(?)"] * count)
    return (
        f"WITH wanted (stream) AS (VALUES {wanted}) "  # noqa: S608 - placeholders only
        "SELECT w.stream, (SELECT e.idx FROM ledger_events e WHERE e.stream = w.stream "
        "ORDER BY e.idx DESC LIMIT 1) FROM wanted w"
    )


def load_many(count: int) -> str:
    """Return the statement loading ``count`` distinct key digests of one namespace.

    Parameters: the namespace, then each key digest; one probe of the
    ``(namespace, key_digest)`` key per name.
    """
    wanted = ", ".join(["?"] * count)
    return f"{LOAD_RECORD[: LOAD_RECORD.rindex(' AND ')]} AND r.key_digest IN ({wanted})"


VACUUM: Final = "VACUUM"
"""Rebuilds the file; outside any transaction, on the writer connection."""

LIST_STREAMS: Final = "SELECT stream FROM ledger_streams WHERE stream > ? ORDER BY stream LIMIT ?"
"""Stream names after a mark, in ``BINARY`` collation: UTF-8 byte order, i.e. code-point order."""
HAS_RECORDS: Final = "SELECT EXISTS (SELECT 1 FROM records) OR EXISTS (SELECT 1 FROM ledger_events)"
HAS_RECORD: Final = "SELECT 1 FROM records WHERE namespace = ? AND key_digest = ?"
HAS_STREAM: Final = (
    "SELECT 1 FROM ledger_streams WHERE stream = ? "
    "UNION ALL SELECT 1 FROM ledger_events WHERE stream = ? LIMIT 1"
)
NAMESPACE_COUNTS: Final = "SELECT namespace, COUNT(*) FROM records GROUP BY namespace"
KEY_ID_COUNTS: Final = "SELECT key_id, COUNT(*) FROM records GROUP BY key_id"

RESERVE_SEALS: Final = (
    "INSERT INTO seal_counters (key_id, reserved) VALUES (?, ?) "
    "ON CONFLICT (key_id) DO UPDATE SET reserved = reserved + excluded.reserved"
)
"""Adds to a key's counter, creating it at the first reservation."""
RESERVED_SEALS: Final = "SELECT reserved FROM seal_counters WHERE key_id = ?"
"""The new total, read in the reservation's own write transaction.

Not ``RETURNING`` on the upsert: that needs SQLite 3.35, and the adapter
still runs on 3.31.
"""
SEAL_COUNTS: Final = "SELECT key_id, reserved FROM seal_counters"

RAISE_EPOCH: Final = "UPDATE store_epoch SET epoch = epoch + 1 WHERE id = 1"
"""Run once in every transaction that commits a unit, so a rollback undoes it too."""
STORE_EPOCH: Final = "SELECT epoch FROM store_epoch WHERE id = 1"
SET_EPOCH: Final = "UPDATE store_epoch SET epoch = MAX(epoch, ?) WHERE id = 1"
"""Only a fill sets the count: to the source's, unless the store's is higher already."""

FilterShape = listing.FilterShape
PLACEHOLDER: Final = "?"
"""What the shared statement builders put where a parameter binds."""


def list_query(
    order: Order, after_cursor: bool, filters: tuple[FilterShape, ...] = (), tags: int = 0
) -> str:
    """Return the shared ``list`` statement with this driver's placeholder."""
    return listing.list_query(PLACEHOLDER, order, after_cursor, filters, tags)


CHECKPOINT_TRUNCATE: Final = "PRAGMA wal_checkpoint(TRUNCATE)"
"""Copies the WAL into the database and truncates it; answers (busy, log frames, copied)."""
