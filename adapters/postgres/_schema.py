"""The tables as forward-only migrations, versioned in a ``schema_version`` table.

Version 1 is the baseline every store is created with; version 2 adds tags;
version 3 makes the two label value indexes partial. A later version adds a
step, never edits one: a schema written at an earlier version is brought
forward by replaying only the steps it lacks. Steps use unqualified names
and run with ``search_path`` set to the adapter's schema, so one database
can hold the stores of several hosts.
"""

from __future__ import annotations

import hashlib
from typing import Final

from psycopg import sql

from flowvault.adapters._sql_store import refuse_newer
from flowvault.adapters.postgres._connect import Connection
from flowvault.domain import NotFound, StoreUnavailable

_SCHEMA_VERSION_TABLE = """CREATE TABLE schema_version (
    version integer PRIMARY KEY CHECK (version >= 1),
    applied_at timestamptz NOT NULL DEFAULT now()
)"""

_RECORDS = """CREATE TABLE records (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace text COLLATE "C" NOT NULL,
    key_digest text COLLATE "C" NOT NULL,
    revision bigint NOT NULL CHECK (revision >= 1),
    sensitivity text NOT NULL,
    schema_version integer NOT NULL,
    key_id text COLLATE "C" NOT NULL,
    written_at text COLLATE "C" NOT NULL,
    labels jsonb NOT NULL,
    byte_length integer NOT NULL CHECK (byte_length >= 0),
    payload_digest text NOT NULL,
    payload bytea NOT NULL,
    ledger_index bigint CHECK (ledger_index >= 0),
    CONSTRAINT records_identity UNIQUE (namespace, key_digest)
)"""

_RECORD_LABELS = """CREATE TABLE record_labels (
    record_id bigint NOT NULL REFERENCES records (id) ON DELETE CASCADE,
    namespace text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    text_value text COLLATE "C",
    int_value bigint,
    CHECK ((text_value IS NULL) <> (int_value IS NULL)),
    PRIMARY KEY (record_id, name)
)"""

_LEDGER_STREAMS = """CREATE TABLE ledger_streams (
    stream text COLLATE "C" PRIMARY KEY,
    first_index bigint NOT NULL,
    head_index bigint NOT NULL,
    head_hash text NOT NULL,
    CHECK (0 <= first_index AND first_index <= head_index)
)"""

_LEDGER_EVENTS = """CREATE TABLE ledger_events (
    stream text COLLATE "C" NOT NULL,
    idx bigint NOT NULL CHECK (idx >= 0),
    type text NOT NULL,
    from_state text,
    to_state text,
    occurred_at text NOT NULL,
    payload text NOT NULL,
    previous_hash text NOT NULL,
    event_hash text NOT NULL,
    event_key text,
    chain_mac text,
    PRIMARY KEY (stream, idx)
)"""

_SEAL_COUNTERS = """CREATE TABLE seal_counters (
    key_id text COLLATE "C" PRIMARY KEY,
    reserved bigint NOT NULL CHECK (reserved >= 0)
)"""

BASELINE: Final = (
    _SCHEMA_VERSION_TABLE,
    _RECORDS,
    "ALTER TABLE records ALTER COLUMN payload SET STORAGE EXTERNAL",
    "CREATE INDEX records_by_written_at ON records (namespace, written_at, key_digest)",
    "CREATE INDEX records_by_key_id ON records (key_id)",
    _RECORD_LABELS,
    "CREATE INDEX record_labels_by_text ON record_labels (namespace, name, text_value)",
    "CREATE INDEX record_labels_by_int ON record_labels (namespace, name, int_value)",
    _LEDGER_STREAMS,
    _LEDGER_EVENTS,
    _SEAL_COUNTERS,
    "CREATE SEQUENCE store_epoch AS bigint MINVALUE 0 START WITH 1",
)
"""Version 1, the baseline: records, typed label rows, ledger streams, seal counts and the epoch.

Text that is ordered or compared (digests, ``written_at``, label values) is
``COLLATE "C"``: byte order, which for UTF-8 is code-point order, the order
the reference adapter sorts in, whatever collation the database defaults to.
``records.labels`` keeps the whole label set so reads need no join; sealed
payloads do not compress, so they are stored ``EXTERNAL`` (never tried).
``records.ledger_index`` is the index of the ledger event committed with the
write, none for a record without a stream. ``ledger_streams`` holds each
stream's head, the row appends lock and guard; ``ledger_events.chain_mac``
is each event's keyed chain MAC, kept outside ``event_hash``.
``seal_counters`` is the nonce budget's durable count, each reservation its
own transaction.

``store_epoch`` is the store's commit count: a restored older dump carries
the sequence's value at its time, lower than the live one had, so a
high-water mark kept elsewhere can refuse it. The first ``nextval`` returns
1, so the last value is the count (0 before any). A sequence, not a row:
``nextval`` never waits for another transaction, so concurrent units do not
serialise on it; it is not rolled back, which only over-counts.
"""

_RECORD_TAGS = """CREATE TABLE record_tags (
    record_id bigint NOT NULL REFERENCES records (id) ON DELETE CASCADE,
    namespace text COLLATE "C" NOT NULL,
    tag text COLLATE "C" NOT NULL,
    PRIMARY KEY (record_id, tag)
)"""

TAGS: Final = (
    "ALTER TABLE records ADD COLUMN tags jsonb NOT NULL DEFAULT '[]'::jsonb",
    _RECORD_TAGS,
    "CREATE INDEX record_tags_by_tag ON record_tags (namespace, tag)",
)
"""Version 2: each record's tags (keyed digests), kept as labels are.

``records.tags`` holds the sorted tag list, so reads need no join; every row
written before it reads ``[]``, no tags (a constant default: adding the
column rewrites no row). ``record_tags`` repeats each tag, for filtering only.
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
was written to both. Every
query that reads them compares the value or says ``IS NOT NULL``, which
implies the index's predicate, so the planner still uses them. The names
are unqualified like every step's, resolved through ``search_path``; no
``CONCURRENTLY``, which a transaction cannot run, so the rebuild holds a
lock on ``record_labels`` until the migration commits.
"""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (BASELINE, TAGS, PARTIAL_LABEL_INDEXES)
"""Step ``n`` (0-based) takes a schema from version n to n + 1.

A later schema appends its step here; the steps before it are never edited.
"""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The version this code writes and the newest it can read."""


def newest_version() -> int:
    """Return the version the migration steps lead to; read per call, so an added step counts."""
    return len(MIGRATIONS)


_FIND_SCHEMA: Final = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
_FIND_VERSION_TABLE: Final = (
    "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'schema_version'"
)
_RECORD_VERSION: Final = "INSERT INTO schema_version (version) VALUES (%s)"


def lock_key(schema: str) -> int:
    """Return the advisory lock id that serialises migrations of ``schema``, from any host."""
    digest = hashlib.sha256(b"flowvault.migrate\x00" + schema.encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def stored_version(connection: Connection, schema: str) -> int:
    """Return the schema's recorded version; 0 when it holds no flowvault tables yet."""
    if connection.execute(_FIND_VERSION_TABLE, (schema,)).fetchone() is None:
        return 0
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version").format(
        sql.Identifier(schema)
    )
    row = connection.execute(query).fetchone()
    if row is None or not isinstance(row[0], int):
        raise StoreUnavailable("the schema_version table is unreadable")
    return row[0]


def ensure_supported(version: int) -> None:
    """Refuse a schema written by a newer flowvault, before anything writes to it."""
    refuse_newer(version, newest_version(), f"the database schema has version {version}")


def migrate(connection: Connection, schema: str) -> None:
    """Create the schema if needed and apply the missing steps, in one transaction.

    A transaction-level advisory lock serialises hosts migrating at once and
    is released by the commit; a session-level lock would stay with the
    pooled connection. The version is read again under the lock, because
    another host may have migrated meanwhile.
    """
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
        if connection.execute(_FIND_SCHEMA, (schema,)).fetchone() is None:
            connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        current = stored_version(connection, schema)
        ensure_supported(current)
        for version, step in enumerate(MIGRATIONS[current:], start=current + 1):
            for statement in step:
                connection.execute(statement)
            connection.execute(_RECORD_VERSION, (version,))


def prepare_schema(connection: Connection, schema: str, *, create: bool) -> None:
    """Bring the schema to the newest version, refusing a newer one before taking any lock.

    Without ``create`` a schema with no flowvault tables is refused before
    any statement that writes.
    """
    current = stored_version(connection, schema)
    if current == 0 and not create:
        raise NotFound(
            f"no flowvault store in PostgreSQL schema {schema}; create it with create=True",
            schema=schema,
        )
    ensure_supported(current)
    if current < newest_version():
        migrate(connection, schema)
