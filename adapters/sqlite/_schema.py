"""The database schema as forward-only migrations, keyed by ``PRAGMA user_version``.

A migration step is never edited once released: a store written by an older
build is brought forward by replaying only the steps it lacks, and each
released version keeps a SQL fixture under ``tests/fixtures/sqlite``.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from flowvault.adapters.sqlite._connect import transaction
from flowvault.domain import SchemaTooNew, StoreUnavailable

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
    PRIMARY KEY (stream, idx)
) WITHOUT ROWID"""

_LEDGER_STREAMS = """CREATE TABLE ledger_streams (
    stream TEXT PRIMARY KEY,
    first_index INTEGER NOT NULL,
    head_index INTEGER NOT NULL,
    head_hash TEXT NOT NULL,
    CHECK (0 <= first_index AND first_index <= head_index)
) WITHOUT ROWID"""

_V1: Final = (
    _RECORDS,
    "CREATE INDEX records_by_written_at ON records (namespace, written_at, key_digest)",
    "CREATE INDEX records_by_key_id ON records (key_id)",
    _RECORD_LABELS,
    "CREATE INDEX record_labels_by_text ON record_labels (namespace, name, text_value)",
    "CREATE INDEX record_labels_by_int ON record_labels (namespace, name, int_value)",
    _LEDGER_EVENTS,
    _LEDGER_STREAMS,
)
"""Version 1: records with their labels split out for indexed filters, and ledger streams.

``records.labels`` keeps the whole label set as canonical JSON so reads need
no join; ``record_labels`` repeats each label typed, for filtering only.
"""

_SEAL_COUNTERS = """CREATE TABLE seal_counters (
    key_id TEXT PRIMARY KEY,
    reserved INTEGER NOT NULL CHECK (reserved >= 0)
) WITHOUT ROWID"""

_V2: Final = (_SEAL_COUNTERS,)
"""Version 2: seals reserved per key id, the nonce budget's durable count.

Not records: no stats, listing or ledger reads this table, and no unit of
work writes it; each reservation is its own transaction.
"""

_V3: Final = ("ALTER TABLE ledger_events ADD COLUMN chain_mac TEXT",)
"""Version 3: each ledger event's keyed chain MAC, kept outside ``event_hash``.

Nullable: events written before version 3 were never keyed, so they keep
none, and no migration can compute one without the integrity key.
"""

_STORE_EPOCH = """CREATE TABLE store_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL CHECK (epoch >= 0)
) WITHOUT ROWID"""

_V4: Final = (_STORE_EPOCH, "INSERT INTO store_epoch (id, epoch) VALUES (1, 0)")
"""Version 4: the store's commit count, one row, raised by every unit that commits.

A restored older copy of the file shows a lower count than the live one had,
so a high-water mark kept elsewhere can refuse it. Upgraded stores start at
0: no count of their earlier commits exists.
"""

_V5: Final = ("ALTER TABLE records ADD COLUMN ledger_index INTEGER CHECK (ledger_index >= 0)",)
"""Version 5: the index of the ledger event committed with each record's write.

Nullable: rows written before version 5 had no ledger link, so they keep
none, and a record without a stream never gets one.
"""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (_V1, _V2, _V3, _V4, _V5)
"""Step ``n`` (0-based) takes a database from ``user_version`` n to n + 1."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The ``user_version`` this code writes and the newest it can read."""


def user_version(connection: sqlite3.Connection) -> int:
    """Return the schema version recorded in the database header."""
    row = connection.execute("PRAGMA user_version").fetchall()
    version: int = row[0][0]
    return version


def ensure_supported(version: int) -> None:
    """Refuse a database written by a newer schema, before anything writes to it."""
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database has schema version {version}, newer than the {SCHEMA_VERSION} "
            "this flowvault understands; upgrade flowvault to open it",
            found=version,
            supported=SCHEMA_VERSION,
        )


def ensure_current(version: int) -> None:
    """Refuse, for a read-only open, any schema but this code's: nothing may be migrated."""
    ensure_supported(version)
    if version < SCHEMA_VERSION:
        raise StoreUnavailable(
            f"the database has schema version {version}, older than the {SCHEMA_VERSION} "
            "this flowvault reads; a read-only open cannot migrate it (open it read-write "
            "once, on a copy if need be)",
            found=version,
            supported=SCHEMA_VERSION,
        )


def migrate(connection: sqlite3.Connection) -> None:
    """Apply the missing steps in one write transaction.

    The version is read again under the write lock, because another process
    may have migrated the file since this one first looked.
    """
    with transaction(connection, "BEGIN IMMEDIATE"):
        current = user_version(connection)
        ensure_supported(current)
        if current == SCHEMA_VERSION:
            return
        for step in MIGRATIONS[current:]:
            for statement in step:
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")
