"""Schema versions on PostgreSQL: released schemas keep opening, newer ones are refused untouched.

Migrations take a transaction-level advisory lock, so hosts opening the
same schema at once migrate it exactly once, and none keeps a lock.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from psycopg import sql

from flowvault.adapters.postgres import SCHEMA_VERSION, PostgresSecureObjectStore, _schema
from flowvault.application import (
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    Order,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import (
    GENESIS_HASH,
    EnvelopeHeader,
    LedgerEvent,
    SchemaTooNew,
    Sensitivity,
    StoreUnavailable,
    verify_chain,
)
from flowvault.domain._envelope import natural_key_digest

pytestmark = pytest.mark.postgres

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "postgres"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UNICODE_NS = "工作流/ß"
AUDIT = "audit/\N{GREEK SMALL LETTER ALPHA}"
FIXTURE_TRIM = ("orders", 2)
"""The ``orders`` stream was trimmed before index 2, so the fixture holds a gap."""
RELEASED = [f"schema_v{version}.sql" for version in range(1, SCHEMA_VERSION + 1)]
"""Every fixture holds the v1 records and events; v2 on adds ``V2_SEAL_COUNTS``, v4 ``V4_EPOCH``.

From v5 on, two of its records carry ``V5_LEDGER_INDEXES``.
"""
V2_SEAL_COUNTS = {"k1": 192, "k2": 64}
V4_EPOCH = 7
V5_LEDGER_INDEXES = {"order-1": 3, "run-1": 2**53 - 1}
"""The ledger index each v5 record was written with, by natural key; ``order-2`` has none."""
ALL_VERSIONS = list(range(1, SCHEMA_VERSION + 1))


def fixture_version(fixture: str) -> int:
    """Return the schema version of a ``schema_v<n>.sql`` fixture."""
    return int(fixture.removeprefix("schema_v").removesuffix(".sql"))


# -- what the v1 fixture holds, rebuilt from first principles ------------------


def _upsert(namespace: str, key: str, payload: bytes, **fields) -> Upsert:
    labels = fields.pop("labels")
    header = EnvelopeHeader(
        namespace=namespace,
        key_digest=natural_key_digest(namespace, key),
        schema_version=1,
        **fields,
    )
    return Upsert(header=header, payload=payload, expected=Guard.ANY, labels=labels)


def fixture_upserts(version: int = 1) -> list[Upsert]:
    """Return the records the fixture of ``version`` holds: v1's, with ledger indexes from v5."""
    confidential, restricted = Sensitivity.CONFIDENTIAL, Sensitivity.RESTRICTED
    linked = V5_LEDGER_INDEXES if version >= 5 else {}
    return [
        _upsert(
            "orders", "order-1", b"\x00sealed-order-1\xff", sensitivity=confidential,
            key_id="k1", revision=2, written_at=T0 + timedelta(seconds=1),
            labels={"status": "open", "n": 3}, ledger_index=linked.get("order-1"),
        ),
        _upsert(
            "orders", "order-2", b"sealed-order-2", sensitivity=restricted,
            key_id="k2", revision=1, written_at=T0,
            labels={"status": "closed", "n": 2**53 + 1, "big": -(2**63) + 1},
        ),
        _upsert(
            UNICODE_NS, "run-1", b"", sensitivity=Sensitivity.PUBLIC,
            key_id="k1", revision=7, written_at=T0 + timedelta(seconds=2),
            ledger_index=linked.get("run-1"), labels={"who": "ü😀"},
        ),
    ]  # fmt: skip


def _chain(stream: str, bodies: list[dict]) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    for index, body in enumerate(bodies):
        previous = events[-1].event_hash if events else GENESIS_HASH
        occurred = T0 + timedelta(minutes=index)
        events.append(
            LedgerEvent.create(
                stream=stream, index=index, occurred_at=occurred, previous_hash=previous, **body
            )
        )
    return events


def fixture_events() -> dict[str, list[LedgerEvent]]:
    """Return every event the v1 fixture's streams were written with (trimmed ones too)."""
    orders = _chain("orders", [{"type": "order.changed", "payload": {"n": n}} for n in range(4)])
    audit = _chain(
        AUDIT,
        [
            {
                "type": "workflow.created",
                "payload": {"who": "ops", "mixed": [1, 2.5, None, True, "ü"]},
                "to_state": "draft",
                "event_key": "create-1",
            },
            {
                "type": "workflow.approved",
                "payload": {},
                "from_state": "draft",
                "to_state": "approved",
            },
        ],
    )
    return {"orders": orders, AUDIT: audit}


def _identity(metadata: RecordMetadata) -> tuple[str, str]:
    return metadata.namespace, metadata.key_digest


# -- loading and describing schemas --------------------------------------------


def load_fixture(server, name: str, schema: str) -> None:
    """Create ``schema`` and run a SQL fixture in it with plain psycopg, as a release left it."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    with server.admin() as admin, admin.transaction():
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        admin.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        admin.execute(text)


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


# -- released versions ---------------------------------------------------------


def test_every_released_version_has_a_fixture() -> None:
    """Each schema version this code can write has a frozen SQL fixture."""
    for version in range(1, SCHEMA_VERSION + 1):
        assert (FIXTURES / f"schema_v{version}.sql").is_file()


@pytest.mark.parametrize("fixture", RELEASED)
def test_released_fixture_reads_back(postgres_server, pg_schema: str, fixture: str) -> None:
    """Every record and event of a released schema loads intact, with the trimmed stream's gap.

    Records peeked and listed in every order have the same header too.
    """
    load_fixture(postgres_server, fixture, pg_schema)
    events = fixture_events()
    stream, trimmed_before = FIXTURE_TRIM
    upserts = fixture_upserts(fixture_version(fixture))
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        for upsert in upserts:
            header = upsert.header
            loaded = store.load(header.namespace, header.key_digest)
            assert loaded is not None
            assert loaded.metadata == upsert.metadata
            assert loaded.payload == upsert.payload
            assert store.peek_metadata(header.namespace, header.key_digest) == upsert.metadata
        for order in Order:
            listed = [*store.list("orders", order=order).items, *store.list(UNICODE_NS).items]
            assert sorted(listed, key=_identity) == sorted(
                (upsert.metadata for upsert in upserts), key=_identity
            )
        assert dict(store.namespace_counts()) == {"orders": 2, UNICODE_NS: 1}
        assert dict(store.key_id_counts()) == {"k1": 2, "k2": 1}
        big = store.list("orders", filters=[LabelFilter("n", 2**53, FilterOp.GT)]).items
        assert [meta.labels["status"] for meta in big] == ["closed"]
        audit = store.read_ledger(AUDIT)
        assert list(audit.events) == events[AUDIT]
        assert verify_chain(audit.events).ok
        orders = store.read_ledger(stream)
        assert orders.gap
        assert list(orders.events) == events[stream][trimmed_before:]
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


@pytest.mark.parametrize("fixture", RELEASED)
def test_released_fixture_accepts_new_writes(postgres_server, pg_schema: str, fixture: str) -> None:
    """Guards on a released schema see its revisions and stream heads."""
    load_fixture(postgres_server, fixture, pg_schema)
    head = fixture_events()["orders"][-1]
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        epoch = store.epoch()
        store.commit(
            UnitOfWork(
                upserts=[make_upsert("orders", "order-1", b"v3", expected=2)],
                appends=[make_event("orders", 4, head)],
            )
        )
        assert store.ledger_head("orders").previous_hash == head.event_hash
        assert store.epoch() == epoch + 1


@pytest.mark.parametrize("fixture", RELEASED)
def test_upgraded_fixture_matches_a_fresh_schema(
    postgres_server, pg_schema: str, fixture: str
) -> None:
    """Opening any released fixture yields exactly the tables, indexes and storage of a new one."""
    load_fixture(postgres_server, fixture, pg_schema)
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema).close()
    fresh = postgres_server.new_schema()
    try:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=fresh).close()
        assert describe(postgres_server, pg_schema) == describe(postgres_server, fresh)
        assert versions(postgres_server, fresh) == ALL_VERSIONS
    finally:
        postgres_server.drop_schema(fresh)


def test_v1_upgrade_adds_empty_seal_counts_and_keeps_data(postgres_server, pg_schema: str) -> None:
    """A v1 schema gains the seal counter table on open, empty, with its records and ledger kept.

    The migration cannot know how many seals a v1 build made, so it invents no count.
    """
    load_fixture(postgres_server, "schema_v1.sql", pg_schema)
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert store.seal_counts() == {}
        assert store.key_id_counts() == {"k1": 2, "k2": 1}
        assert store.ledger_head(AUDIT) == fixture_events()[AUDIT][-1]
        assert store.reserve_seals("k1", 64) == 64
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


def test_v2_fixture_seal_counts_read_back_and_grow(postgres_server, pg_schema: str) -> None:
    """A v2 schema's seal counts read back and the next reservation adds to them."""
    load_fixture(postgres_server, "schema_v2.sql", pg_schema)
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert store.seal_counts() == V2_SEAL_COUNTS
        assert store.reserve_seals("k2", 64) == V2_SEAL_COUNTS["k2"] + 64
        assert store.has_records() is True


def test_v2_upgrade_adds_chain_mac_null_for_old_events(postgres_server, pg_schema: str) -> None:
    """A v2 schema gains ``chain_mac`` on open: its events keep none, new ones keep theirs."""
    load_fixture(postgres_server, "schema_v2.sql", pg_schema)
    head = fixture_events()["orders"][-1]
    keyed = make_event("orders", 4, head).model_copy(update={"chain_mac": "sha256:" + "ab" * 32})
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert [event.chain_mac for event in store.read_ledger(AUDIT).events] == [None, None]
        store.commit(UnitOfWork(appends=[keyed]))
        assert store.ledger_head("orders") == keyed
        assert store.read_ledger("orders", from_index=4).events == (keyed,)
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS
    with postgres_server.admin() as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        stored = admin.execute(
            "SELECT stream, idx, chain_mac FROM ledger_events ORDER BY stream, idx"
        ).fetchall()
    assert stored == [
        (AUDIT, 0, None),
        (AUDIT, 1, None),
        ("orders", 2, None),
        ("orders", 3, None),
        ("orders", 4, keyed.chain_mac),
    ]


def test_v3_upgrade_starts_the_epoch_at_zero_and_counts(postgres_server, pg_schema: str) -> None:
    """A v3 schema gains the ``store_epoch`` sequence on open at 0; each commit raises it by one.

    No count of the commits made before v4 exists, so the migration starts
    at 0 rather than invent one.
    """
    load_fixture(postgres_server, "schema_v3.sql", pg_schema)
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert store.epoch() == 0
        store.commit(UnitOfWork(upserts=[make_upsert("orders", "order-9")]))
        store.commit(
            UnitOfWork(deletes=[Delete("orders", natural_key_digest("orders", "order-9"), 1)])
        )
        assert store.epoch() == 2
        assert store.namespace_counts() == {"orders": 2, UNICODE_NS: 1}
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


def test_v4_fixture_epoch_reads_back_and_grows(postgres_server, pg_schema: str) -> None:
    """A v4 schema's epoch reads back and the next commit raises it; reservations do not."""
    load_fixture(postgres_server, "schema_v4.sql", pg_schema)
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert store.epoch() == V4_EPOCH
        assert store.reserve_seals("k1", 1) == V2_SEAL_COUNTS["k1"] + 1
        assert store.epoch() == V4_EPOCH
        store.commit(UnitOfWork(upserts=[make_upsert("orders", "order-9")]))
        assert store.epoch() == V4_EPOCH + 1


def _stored_ledger_indexes(server, schema: str) -> list[tuple[str, str, int, int | None]]:
    with server.admin() as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return [
            tuple(row)
            for row in admin.execute(
                "SELECT namespace, key_digest, revision, ledger_index FROM records "
                "ORDER BY namespace, key_digest"
            ).fetchall()
        ]


def test_v4_upgrade_adds_ledger_index_null_for_old_rows(postgres_server, pg_schema: str) -> None:
    """A v4 schema gains ``ledger_index`` on open: its records keep none, new writes keep theirs.

    Rows written before v5 had no ledger link, and no migration can invent
    one: it is bound into each sealed payload's associated data.
    """
    load_fixture(postgres_server, "schema_v4.sql", pg_schema)
    linked = make_upsert("orders", "order-1", b"v3", expected=2, ledger_index=4)
    large = make_upsert("orders", "order-9", ledger_index=2**40)
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert [meta.header.ledger_index for meta in store.list("orders").items] == [None, None]
        store.commit(UnitOfWork(upserts=[linked, large]))
        for upsert in (linked, large):
            digest = upsert.header.key_digest
            assert store.peek_metadata("orders", digest) == upsert.metadata
        newest_first = store.list("orders", order=Order.WRITTEN_AT_DESC).items
        assert {meta.key_digest: meta.header.ledger_index for meta in newest_first} == {
            linked.header.key_digest: 4,
            large.header.key_digest: 2**40,
            natural_key_digest("orders", "order-2"): None,
        }
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS
    digest = {key: natural_key_digest("orders", key) for key in ("order-1", "order-2", "order-9")}
    assert sorted(_stored_ledger_indexes(postgres_server, pg_schema)) == sorted(
        [
            ("orders", digest["order-1"], 3, 4),
            ("orders", digest["order-2"], 1, None),
            ("orders", digest["order-9"], 1, 2**40),
            (UNICODE_NS, natural_key_digest(UNICODE_NS, "run-1"), 7, None),
        ]
    )


def test_v5_fixture_ledger_indexes_read_back_and_change(postgres_server, pg_schema: str) -> None:
    """A v5 schema's ledger indexes read back; a new revision replaces or drops one."""
    load_fixture(postgres_server, "schema_v5.sql", pg_schema)
    digests = {key: natural_key_digest("orders", key) for key in ("order-1", "order-2")}
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert store.epoch() == V4_EPOCH
        run = store.peek_metadata(UNICODE_NS, natural_key_digest(UNICODE_NS, "run-1"))
        assert run is not None
        assert run.header.ledger_index == V5_LEDGER_INDEXES["run-1"]
        listed = {meta.key_digest: meta.header.ledger_index for meta in store.list("orders").items}
        assert listed == {digests["order-1"]: 3, digests["order-2"]: None}
        store.commit(
            UnitOfWork(
                upserts=[
                    make_upsert("orders", "order-1", b"v3", expected=2),
                    make_upsert("orders", "order-2", b"v2", expected=1, ledger_index=0),
                ]
            )
        )
        listed = {meta.key_digest: meta.header.ledger_index for meta in store.list("orders").items}
        assert listed == {digests["order-1"]: None, digests["order-2"]: 0}
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


# -- newer schemas, failures, concurrency --------------------------------------


def _contents(server, schema: str) -> list[tuple]:
    with server.admin() as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return [
            *admin.execute("SELECT version FROM schema_version ORDER BY 1").fetchall(),
            *admin.execute("SELECT key_digest, revision, payload FROM records ORDER BY 1"),
            *admin.execute("SELECT stream, idx, event_hash FROM ledger_events ORDER BY 1, 2"),
        ]


def test_newer_schema_is_refused_and_left_untouched(postgres_server, pg_schema: str) -> None:
    """A schema at SCHEMA_VERSION + 1 raises SchemaTooNew; not one row or table changes."""
    load_fixture(postgres_server, "schema_v1.sql", pg_schema)
    with postgres_server.admin() as admin:
        query = sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)")
        admin.execute(query.format(sql.Identifier(pg_schema)), (SCHEMA_VERSION + 1,))
    before = (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema))
    with pytest.raises(SchemaTooNew) as caught:
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema)
    assert caught.value.details == {"found": SCHEMA_VERSION + 1, "supported": SCHEMA_VERSION}
    assert "upgrade flowvault" in str(caught.value)
    after = (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema))
    assert after == before


def test_failed_migration_changes_nothing(postgres_server, pg_schema: str, monkeypatch) -> None:
    """A step that fails rolls everything back, the schema itself included."""
    broken = (_schema.MIGRATIONS[0] + ("CREATE TABLE broken (",),)
    monkeypatch.setattr(_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreUnavailable):
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema)
    with postgres_server.admin() as admin:
        found = admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_schema,))
        assert found.fetchone() is None
    monkeypatch.undo()
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema).close()
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


def test_failed_upgrade_leaves_a_v1_schema_as_it_was(
    postgres_server, pg_schema: str, monkeypatch
) -> None:
    """A v2 step that fails rolls back to the v1 schema, data intact; the next open upgrades it."""
    load_fixture(postgres_server, "schema_v1.sql", pg_schema)
    before = (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema))
    broken = (_schema.MIGRATIONS[0], (*_schema.MIGRATIONS[1], "CREATE TABLE broken ("))
    monkeypatch.setattr(_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreUnavailable):
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema)
    assert (_contents(postgres_server, pg_schema), describe(postgres_server, pg_schema)) == before
    monkeypatch.undo()
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as store:
        assert store.seal_counts() == {}
    assert versions(postgres_server, pg_schema) == ALL_VERSIONS


def test_hosts_opening_at_once_migrate_once(postgres_server, pg_schema: str) -> None:
    """Eight stores opening one new schema together all succeed; it is migrated once."""
    barrier = threading.Barrier(8)
    opened: list[PostgresSecureObjectStore] = []
    failures: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            opened.append(
                PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, pool_size=1)
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
            PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema) as first,
            PostgresSecureObjectStore.open(postgres_server.dsn, schema=other) as second,
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
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema).close()
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
