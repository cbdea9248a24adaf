"""Schema versions on PostgreSQL: older schemas migrate forward, newer ones are refused.

A real version-1 schema (the baseline, before tags) migrates to the current
version and keeps reading; a real version-2 schema (full label indexes)
migrates to version 3 (partial ones) with every label row and listing
intact. The path from the current version onwards is proven on
a synthetic next version, injected in place of the real list.
Migrations take a transaction-level advisory lock, so hosts opening the
same schema at once migrate it exactly once, and none keeps a lock.
"""

from __future__ import annotations

import threading

import pytest
from psycopg import sql
from schema_contents import (
    assert_baseline_reads_back,
    assert_labelled_reads_back,
    baseline_events,
    fill_baseline,
    label_listings,
    label_upserts,
    reference_label_listings,
)

from flowvault.adapters.postgres import PostgresSecureObjectStore, _schema
from flowvault.adapters.postgres._schema import SCHEMA_VERSION
from flowvault.application import TagFilter, UnitOfWork
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import SchemaTooNew, StoreUnavailable

pytestmark = pytest.mark.postgres

ALL_VERSIONS = list(range(1, SCHEMA_VERSION + 1))
SYNTHETIC_STEP = (
    "CREATE TABLE synthetic_notes (id bigint PRIMARY KEY, note text NOT NULL)",
    "ALTER TABLE records ADD COLUMN synthetic_flag integer",
)
"""A next version as a later release might add it: a new table and a nullable column."""
NEXT_VERSIONS = [*ALL_VERSIONS, SCHEMA_VERSION + 1]


def _with_next_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, SYNTHETIC_STEP))


def _baseline_store(server, schema: str) -> int:
    """Create a baseline store in ``schema`` holding the baseline contents; return its epoch."""
    with PostgresSecureObjectStore.open(server.dsn, schema=schema, create=True) as store:
        fill_baseline(store)
        return store.epoch()


def _raw(server, schema: str, query: str) -> list[tuple]:
    with server.admin() as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return [tuple(row) for row in admin.execute(query).fetchall()]


# -- describing schemas --------------------------------------------------------


CATALOG = """
SELECT 'column', table_name || '.' || column_name,
       concat_ws(' ', data_type, collation_name, is_nullable, column_default, is_identity)
FROM information_schema.columns WHERE table_schema = %(s)s
UNION ALL
SELECT 'constraint', conrelid::regclass::text, pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = %(s)s::regnamespace
UNION ALL
SELECT 'index', indexname, regexp_replace(indexdef, ' ON \\S+\\.', ' ON ')
FROM pg_indexes WHERE schemaname = %(s)s
UNION ALL
SELECT 'sequence', sequence_name,
       concat_ws(' ', data_type, start_value, minimum_value, maximum_value, increment, cycle_option)
FROM information_schema.sequences WHERE sequence_schema = %(s)s
UNION ALL
SELECT 'storage', attrelid::regclass::text || '.' || attname, attstorage::text
FROM pg_attribute WHERE attrelid = (%(s)s || '.records')::regclass AND attnum > 0
ORDER BY 1, 2, 3
"""


def describe(server, schema: str) -> list[tuple[str, str, str]]:
    """Return the schema's columns, constraints, indexes, sequences and storage, nameless."""
    with server.admin() as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return [tuple(row) for row in admin.execute(CATALOG, {"s": schema}).fetchall()]


def versions(server, schema: str) -> list[int]:
    """Return the versions recorded in the schema's ``schema_version`` table."""
    with server.admin() as admin:
        query = sql.SQL("SELECT version FROM {}.schema_version ORDER BY version").format(
            sql.Identifier(schema)
        )
        return [row[0] for row in admin.execute(query).fetchall()]


# -- the current version -------------------------------------------------------


def test_fresh_schema_records_the_current_version(postgres_server, pg_schema: str) -> None:
    """A new schema records every version up to SCHEMA_VERSION, 3, and holds its contents."""
    _baseline_store(postgres_server, pg_schema)
    assert SCHEMA_VERSION == 3
    assert versions(postgres_server, pg_schema) == [1, 2, 3]
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        assert_baseline_reads_back(store)


# -- version 1 onwards: tags --------------------------------------------------------

_TABLE_COLUMNS = """
SELECT table_name, string_agg(column_name, ', ' ORDER BY ordinal_position)
FROM information_schema.columns WHERE table_schema = %s GROUP BY table_name
"""


def _version_1_store(server, schema: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """Build a version-1 schema (the baseline step alone) holding the baseline contents.

    The contents are written by this code into a current schema, then
    copied table by table, column by column as version 1 names them, with
    the epoch: what a release before tags left in the database. Returns the
    epoch.
    """
    source = server.new_schema()
    try:
        epoch = _baseline_store(server, source)
        monkeypatch.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:1])
        PostgresSecureObjectStore.open(server.dsn, schema=schema, create=True).close()
        monkeypatch.undo()
        with server.admin() as admin:
            tables = admin.execute(_TABLE_COLUMNS, (schema,)).fetchall()
            for table, columns in sorted(tables, key=lambda found: found[0] != "records"):
                if table == "schema_version":
                    continue
                admin.execute(
                    sql.SQL(
                        "INSERT INTO {}.{} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}.{}"
                    ).format(
                        sql.Identifier(schema),
                        sql.Identifier(table),
                        sql.SQL(columns),
                        sql.SQL(columns),
                        sql.Identifier(source),
                        sql.Identifier(table),
                    )
                )
            admin.execute(
                sql.SQL("SELECT setval({}, %s, true)").format(sql.Literal(f"{schema}.store_epoch")),
                (epoch,),
            )
            admin.execute(
                sql.SQL(
                    "SELECT setval(pg_get_serial_sequence({}, 'id'), "
                    "(SELECT max(id) FROM {}.records))"
                ).format(sql.Literal(f"{schema}.records"), sql.Identifier(schema))
            )
    finally:
        server.drop_schema(source)
    return epoch


def test_version_1_schema_migrates_to_tags_and_keeps_reading(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """A schema written before tags gains them on open, and every later step: no row has tags.

    Afterwards tagged writes land next to the old rows and filter by tag.
    """
    epoch = _version_1_store(postgres_server, pg_schema, monkeypatch)
    assert versions(postgres_server, pg_schema) == [1]
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert_baseline_reads_back(store)
        assert store.epoch() == epoch
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS
    untagged = "SELECT count(*) FROM records WHERE tags = '[]'::jsonb"
    assert _raw(postgres_server, pg_schema, untagged) == [(3,)]
    tag = "sha256:" + "7" * 64
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        store.commit(UnitOfWork(upserts=[make_upsert("tagged", "t-1", tags={tag})]))
        listed = store.list("tagged", filters=[TagFilter(tag)]).items
        assert [meta.tags for meta in listed] == [frozenset({tag})]
    assert _raw(postgres_server, pg_schema, "SELECT count(*) FROM record_tags") == [(1,)]


def test_version_1_schema_migrated_matches_a_fresh_one(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """Migrating a version-1 schema yields the tables, indexes and storage a new one gets."""
    _version_1_store(postgres_server, pg_schema, monkeypatch)
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema).close()
    fresh = postgres_server.new_schema()
    try:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=fresh, create=True).close()
        assert describe(postgres_server, pg_schema) == describe(postgres_server, fresh)
    finally:
        postgres_server.drop_schema(fresh)


# -- version 2 to 3: partial label indexes ---------------------------------------

_LABEL_ROWS = "SELECT * FROM record_labels ORDER BY record_id, name"
_LABEL_INDEXES = """
SELECT indexname, regexp_replace(indexdef, ' ON \\S+\\.', ' ON ')
FROM pg_indexes WHERE schemaname = current_schema() AND indexname LIKE 'record_labels_by_%'
ORDER BY indexname
"""
_PARTIAL = [
    (
        "record_labels_by_int",
        "CREATE INDEX record_labels_by_int ON record_labels USING btree "
        "(namespace, name, int_value) WHERE (int_value IS NOT NULL)",
    ),
    (
        "record_labels_by_text",
        "CREATE INDEX record_labels_by_text ON record_labels USING btree "
        "(namespace, name, text_value) WHERE (text_value IS NOT NULL)",
    ),
]


def _version_2_store(server, schema: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Build a version-2 schema (the first two steps alone) holding the labelled records.

    Returns its label listings, read at version 2.
    """
    monkeypatch.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:2])
    with PostgresSecureObjectStore.open(server.dsn, schema=schema, create=True) as store:
        store.commit(UnitOfWork(upserts=label_upserts()))
        listings = label_listings(store)
    monkeypatch.undo()
    return listings


def test_version_2_schema_migrates_to_partial_label_indexes(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """A schema with full label indexes gets partial ones on open; label rows and listings stay.

    Every label row is kept as it was, and every label listing (filters of
    both types, by-label listings over text, integers and both, paged by
    cursor) returns the records it returned at version 2, in the same order.
    """
    before = _version_2_store(postgres_server, pg_schema, monkeypatch)
    assert versions(postgres_server, pg_schema) == [1, 2]
    full = [(name, definition.split(" WHERE ")[0]) for name, definition in _PARTIAL]
    assert _raw(postgres_server, pg_schema, _LABEL_INDEXES) == full
    rows = _raw(postgres_server, pg_schema, _LABEL_ROWS)
    assert before == reference_label_listings()
    assert all(before.values()), before
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert label_listings(store) == before
        assert_labelled_reads_back(store)
    assert versions(postgres_server, pg_schema) == [1, 2, 3]
    assert _raw(postgres_server, pg_schema, _LABEL_INDEXES) == _PARTIAL
    assert _raw(postgres_server, pg_schema, _LABEL_ROWS) == rows


def test_version_2_schema_migrated_matches_a_fresh_one(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """Migrating a version-2 schema yields the tables, indexes and storage a new one gets."""
    _version_2_store(postgres_server, pg_schema, monkeypatch)
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema).close()
    fresh = postgres_server.new_schema()
    try:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=fresh, create=True).close()
        assert describe(postgres_server, pg_schema) == describe(postgres_server, fresh)
        assert _raw(postgres_server, fresh, _LABEL_INDEXES) == _PARTIAL
    finally:
        postgres_server.drop_schema(fresh)


# -- a synthetic next version, after the current one ----------------------


def test_baseline_schema_upgrades_to_a_next_version(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """A baseline schema gains the next step on open, records its version, and keeps its data."""
    epoch = _baseline_store(postgres_server, pg_schema)
    _with_next_version(monkeypatch)
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        assert_baseline_reads_back(store)
        assert store.epoch() == epoch
    assert versions(postgres_server, pg_schema) == NEXT_VERSIONS
    assert _raw(postgres_server, pg_schema, "SELECT count(*) FROM synthetic_notes") == [(0,)]
    flags = _raw(postgres_server, pg_schema, "SELECT DISTINCT synthetic_flag FROM records")
    assert flags == [(None,)]


def test_upgraded_schema_accepts_new_writes(postgres_server, pg_schema: str, monkeypatch) -> None:
    """After the upgrade, guards see the baseline's revisions and stream heads; the epoch counts."""
    epoch = _baseline_store(postgres_server, pg_schema)
    _with_next_version(monkeypatch)
    head = baseline_events()["orders"][-1]
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        store.commit(
            UnitOfWork(
                upserts=[make_upsert("orders", "order-1", b"v3", expected=2, ledger_index=4)],
                appends=[make_event("orders", 4, head)],
            )
        )
        assert store.ledger_head("orders").previous_hash == head.event_hash
        assert store.epoch() == epoch + 1
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        assert store.epoch() == epoch + 1
    assert versions(postgres_server, pg_schema) == NEXT_VERSIONS


def test_upgraded_schema_matches_a_fresh_one(postgres_server, pg_schema: str, monkeypatch) -> None:
    """Upgrading a baseline schema yields the tables, indexes and storage a new one gets."""
    _baseline_store(postgres_server, pg_schema)
    _with_next_version(monkeypatch)
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True).close()
    fresh = postgres_server.new_schema()
    try:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=fresh, create=True).close()
        assert describe(postgres_server, pg_schema) == describe(postgres_server, fresh)
        assert versions(postgres_server, fresh) == NEXT_VERSIONS
    finally:
        postgres_server.drop_schema(fresh)


# -- newer schemas, failures, concurrency --------------------------------------


def _contents(server, schema: str) -> list[tuple]:
    with server.admin() as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return [
            *admin.execute("SELECT version FROM schema_version ORDER BY 1").fetchall(),
            *admin.execute("SELECT key_digest, revision, payload FROM records ORDER BY 1"),
            *admin.execute("SELECT stream, idx, event_hash FROM ledger_events ORDER BY 1, 2"),
            *admin.execute("SELECT key_id, reserved FROM seal_counters ORDER BY 1"),
        ]


def test_newer_schema_is_refused_and_left_untouched(postgres_server, pg_schema: str) -> None:
    """A schema at SCHEMA_VERSION + 1 raises SchemaTooNew; not one row or table changes."""
    _baseline_store(postgres_server, pg_schema)
    with postgres_server.admin() as admin:
        query = sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)")
        admin.execute(query.format(sql.Identifier(pg_schema)), (SCHEMA_VERSION + 1,))
    before = (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema))
    with pytest.raises(SchemaTooNew) as caught:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True)
    assert caught.value.details == {"found": SCHEMA_VERSION + 1, "supported": SCHEMA_VERSION}
    assert "upgrade flowvault" in str(caught.value)
    after = (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema))
    assert after == before


def test_failed_migration_changes_nothing(postgres_server, pg_schema: str, monkeypatch) -> None:
    """A step that fails rolls everything back, the schema itself included."""
    broken = (_schema.MIGRATIONS[0] + ("CREATE TABLE broken (",),)
    monkeypatch.setattr(_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreUnavailable):
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True)
    with postgres_server.admin() as admin:
        found = admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_schema,))
        assert found.fetchone() is None
    monkeypatch.undo()
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True).close()
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


def test_failed_upgrade_leaves_a_baseline_schema_as_it_was(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """A next step that fails rolls back to the baseline, data intact; the next open upgrades it."""
    _baseline_store(postgres_server, pg_schema)
    before = (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema))
    broken = (*SYNTHETIC_STEP, "CREATE TABLE broken (")
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, broken))
    with pytest.raises(StoreUnavailable):
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True)
    assert (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema)) == before
    monkeypatch.undo()
    _with_next_version(monkeypatch)
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        assert_baseline_reads_back(store)
    assert versions(postgres_server, pg_schema) == NEXT_VERSIONS


def test_hosts_opening_at_once_migrate_once(postgres_server, pg_schema: str) -> None:
    """Eight stores opening one new schema together all succeed; it is migrated once."""
    barrier = threading.Barrier(8)
    opened: list[PostgresSecureObjectStore] = []
    failures: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            opened.append(
                PostgresSecureObjectStore.open(
                    postgres_server.dsn, schema=pg_schema, pool_size=1, create=True
                )
            )
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert failures == []
        assert len(opened) == 8
        assert versions(postgres_server, pg_schema) == ALL_VERSIONS
        key = _schema.lock_key(pg_schema) & (2**64 - 1)
        with postgres_server.admin() as admin:
            held = admin.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid::bigint = %s AND objid::bigint = %s",
                (key >> 32, key & (2**32 - 1)),
            )
            assert held.fetchone() == (0,)
    finally:
        for store in opened:
            store.close()


def test_two_schemas_in_one_database_are_separate_stores(postgres_server, pg_schema: str) -> None:
    """Two hosts' schemas share a database but no record or stream."""
    other = postgres_server.new_schema()
    try:
        with (
            PostgresSecureObjectStore.open(
                postgres_server.dsn, schema=pg_schema, create=True
            ) as first,
            PostgresSecureObjectStore.open(
                postgres_server.dsn, schema=other, create=True
            ) as second,
        ):
            first.commit(UnitOfWork(upserts=[make_upsert("ns", "a")], appends=[make_event("s", 0)]))
            second.commit(
                UnitOfWork(upserts=[make_upsert("ns", "a")], appends=[make_event("s", 0)])
            )
            assert first.namespace_counts() == second.namespace_counts() == {"ns": 1}
            assert len(first.read_ledger("s").events) == len(second.read_ledger("s").events) == 1
    finally:
        postgres_server.drop_schema(other)


def test_migration_waits_for_the_advisory_lock(postgres_server, pg_schema: str) -> None:
    """While another host holds the schema's migration lock, opening a new schema waits."""
    opened = threading.Event()

    def open_store() -> None:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True).close()
        opened.set()

    with postgres_server.admin() as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (_schema.lock_key(pg_schema),))
        opener = threading.Thread(target=open_store)
        opener.start()
        assert not opened.wait(0.5)
        admin.execute("SELECT pg_advisory_unlock(%s)", (_schema.lock_key(pg_schema),))
        opener.join(timeout=10)
    assert opened.is_set()
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS
