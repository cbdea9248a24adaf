"""The database schema as forward-only migrations, keyed by ``PRAGMA user_version``.

Version 1 is the baseline every store is created with; version 2 adds tags;
version 3 makes the two label value indexes partial. A later version adds a
step, never edits one: a store written at an earlier version is brought
forward by replaying only the steps it lacks.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from flowvault.adapters._sql_store import refuse_newer
from flowvault.adapters.sqlite._connect import transaction
from flowvault.domain import StoreUnavailable

_RECORDS = """CREATE TABLE records (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    key_digest TEXT NOT NULL,
    revision INTEGER NOT NULL CHECK (revision >= 1),
    sensitivity TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    written_at TEXT NOT NULL,
    labels TEXT NOT NULL,
    byte_length INTEGER NOT NULL CHECK (byte_length >= 0),
    payload_digest TEXT NOT NULL,
    payload BLOB NOT NULL,
    ledger_index INTEGER CHECK (ledger_index >= 0),
    UNIQUE (namespace, key_digest)
)"""

_RECORD_LABELS = """CREATE TABLE record_labels (
    record_id INTEGER NOT NULL REFERENCES records (id) ON DELETE CASCADE,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    text_value TEXT,
    int_value INTEGER,
    CHECK ((text_value IS NULL) <> (int_value IS NULL)),
    PRIMARY KEY (record_id, name)
) WITHOUT ROWID"""

_LEDGER_EVENTS = """CREATE TABLE ledger_events (
    stream TEXT NOT NULL,
    idx INTEGER NOT NULL CHECK (idx >= 0),
    type TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT,
    occurred_at TEXT NOT NULL,
    payload TEXT NOT NULL,
    previous_hash TEXT NOT NULL,
    event_hash TEXT NOT NULL,
    event_key TEXT,
    chain_mac TEXT,
    PRIMARY KEY (stream, idx)
) WITHOUT ROWID"""

_LEDGER_STREAMS = """CREATE TABLE ledger_streams (
    stream TEXT PRIMARY KEY,
    first_index INTEGER NOT NULL,
    head_index INTEGER NOT NULL,
    head_hash TEXT NOT NULL,
    CHECK (0 <= first_index AND first_index <= head_index)
) WITHOUT ROWID"""

_SEAL_COUNTERS = """CREATE TABLE seal_counters (
    key_id TEXT PRIMARY KEY,
    reserved INTEGER NOT NULL CHECK (reserved >= 0)
) WITHOUT ROWID"""

_STORE_EPOCH = """CREATE TABLE store_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL CHECK (epoch >= 0)
) WITHOUT ROWID"""

BASELINE: Final = (
    _RECORDS,
    "CREATE INDEX records_by_written_at ON records (namespace, written_at, key_digest)",
    "CREATE INDEX records_by_key_id ON records (key_id)",
    _RECORD_LABELS,
    "CREATE INDEX record_labels_by_text ON record_labels (namespace, name, text_value)",
    "CREATE INDEX record_labels_by_int ON record_labels (namespace, name, int_value)",
    _LEDGER_EVENTS,
    _LEDGER_STREAMS,
    _SEAL_COUNTERS,
    _STORE_EPOCH,
    "INSERT INTO store_epoch (id, epoch) VALUES (1, 0)",
)
"""Version 1, the baseline: records, their labels, ledger streams, seal counts and the epoch.

``records.labels`` keeps the whole label set as canonical JSON so reads need
no join; ``record_labels`` repeats each label typed, for filtering only.
``records.ledger_index`` is the index of the ledger event committed with the
write, none for a record without a stream. ``ledger_events.chain_mac`` is
each event's keyed chain MAC, kept outside ``event_hash``. ``seal_counters``
is the nonce budget's durable count, each reservation its own transaction.
``store_epoch`` is the store's commit count, one row raised by every unit
that commits: a restored older copy shows a lower count than the live one
had, so a high-water mark kept elsewhere can refuse it.
"""

_RECORD_TAGS = """CREATE TABLE record_tags (
    record_id INTEGER NOT NULL REFERENCES records (id) ON DELETE CASCADE,
    namespace TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (record_id, tag)
) WITHOUT ROWID"""

TAGS: Final = (
    "ALTER TABLE records ADD COLUMN tags TEXT NOT NULL DEFAULT '[]'",
    _RECORD_TAGS,
    "CREATE INDEX record_tags_by_tag ON record_tags (namespace, tag)",
)
"""Version 2: each record's tags (keyed digests), kept as labels are.

``records.tags`` holds the sorted tag list as canonical JSON, so reads need
no join; every row written before it reads ``[]``, no tags. ``record_tags``
repeats each tag, for filtering only; its ``(namespace, tag)`` index also
holds the record id (the key of a ``WITHOUT ROWID`` table), so a tag filter
is answered from the index alone.
"""

PARTIAL_LABEL_INDEXES: Final = (
    "DROP INDEX record_labels_by_text",
    "CREATE INDEX record_labels_by_text ON record_labels (namespace, name, text_value) "
    "WHERE text_value IS NOT NULL",
    "DROP INDEX record_labels_by_int",
    "CREATE INDEX record_labels_by_int ON record_labels (namespace, name, int_value) "
    "WHERE int_value IS NOT NULL",
)
"""Version 3: each label value index holds only the rows of its own type.

A label row sets exactly one of ``text_value`` and ``int_value``, so the
full indexes gave every text label a useless NULL entry in the integer
index and every integer label one in the text index, so each new label row
was written to both.
Every query that reads them compares the value or says ``IS NOT NULL``,
which implies the index's condition, so they still search them.
"""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (BASELINE, TAGS, PARTIAL_LABEL_INDEXES)
"""Step ``n`` (0-based) takes a database from ``user_version`` n to n + 1.

A later schema appends its step here; the steps before it are never edited.
"""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The ``user_version`` this code writes and the newest it can read."""


def newest_version() -> int:
    """Return the version the migration steps lead to; read per call, so an added step counts."""
    return len(MIGRATIONS)


def user_version(connection: sqlite3.Connection) -> int:
    """Return the schema version recorded in the database header."""
    row = connection.execute("PRAGMA user_version").fetchall()
    version: int = row[0][0]
    return version


def ensure_supported(version: int) -> None:
    """Refuse a database written by a newer schema, before anything writes to it."""
    refuse_newer(version, newest_version(), f"the database has schema version {version}")


def ensure_current(version: int) -> None:
    """Refuse, for a read-only open, any schema but this code's: nothing may be migrated."""
    ensure_supported(version)
    supported = newest_version()
    if version < supported:
        raise StoreUnavailable(
            f"the database has schema version {version}, older than the {supported} "
            "this flowvault reads; a read-only open cannot migrate it (open it read-write "
            "once, on a copy if need be)",
            found=version,
            supported=supported,
        )


def migrate(connection: sqlite3.Connection) -> None:
    """Apply the missing steps in one write transaction.

    The version is read again under the write lock, because another process
    may have migrated the file since this one first looked.
    """
    with transaction(connection, "BEGIN IMMEDIATE"):
        current = user_version(connection)
        ensure_supported(current)
        if current == newest_version():
            return
        for step in MIGRATIONS[current:]:
            for statement in step:
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {newest_version():d}")
