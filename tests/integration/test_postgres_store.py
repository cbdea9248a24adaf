"""What the contract kit cannot see: session settings, collation, query plans, secrets."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from flowvault.adapters import _listing
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.postgres import PostgresSecureObjectStore, _queries
from flowvault.application import FilterOp, LabelCursor, LabelFilter, Order, UnitOfWork
from flowvault.application.testing import make_upsert
from flowvault.application.testing._fakes import EPOCH
from flowvault.domain import InvalidInput, StoreBusy, StoreUnavailable

pytestmark = pytest.mark.postgres

NS = "plans"
PASSWORD = "s3cret-pw-91c2"


def _with_options(dsn: str, options: str) -> str:
    parts = urlsplit(dsn)
    query = "&".join(filter(None, [parts.query, "options=" + quote(options)]))
    return urlunsplit(parts._replace(query=query))


@pytest.fixture
def store(postgres_server, pg_schema: str) -> Iterator[PostgresSecureObjectStore]:
    """Provide a store on a fresh schema."""
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as opened:
        yield opened


def _session(store: PostgresSecureObjectStore, query: str) -> list[tuple]:
    with store._borrow() as connection:
        return connection.execute(query).fetchall()


# -- sessions ---------------------------------------------------------------------


def test_sessions_override_weaker_server_defaults(postgres_server, pg_schema: str) -> None:
    """Durability, isolation, timeouts and search_path are set by the adapter, not inherited."""
    weak = _with_options(
        postgres_server.dsn,
        "-c synchronous_commit=off -c default_transaction_isolation=serializable "
        "-c statement_timeout=0 -c search_path=public",
    )
    with PostgresSecureObjectStore.open(
        weak, schema=pg_schema, pool_size=3, statement_timeout=12.5, lock_timeout=0.75, create=True
    ) as store:
        for _ in range(3):
            assert _session(store, "SHOW synchronous_commit") == [("on",)]
            assert _session(store, "SHOW statement_timeout") == [("12500ms",)]
            assert _session(store, "SHOW lock_timeout") == [("750ms",)]
            assert _session(store, "SHOW search_path") == [(f'"{pg_schema}", pg_temp',)]
            assert _session(store, "SELECT current_setting('application_name')") == [("flowvault",)]
        isolation = store._run(
            lambda connection: connection.execute("SHOW transaction_isolation").fetchall(),
            transaction=True,
        )
        assert isolation == [("read committed",)]


def test_the_pool_holds_pool_size_sessions(postgres_server, pg_schema: str) -> None:
    """The pool keeps exactly its configured number of sessions open."""
    name = f"fvtest-pool-{secrets.token_hex(4)}"
    with (
        PostgresSecureObjectStore.open(
            postgres_server.dsn, schema=pg_schema, pool_size=3, application_name=name, create=True
        ),
        postgres_server.admin() as admin,
    ):
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        assert admin.execute(query, (name,)).fetchone() == (3,)


# -- ordering and collation --------------------------------------------------------

TEXTS = ["a", "B", "b", "Z", "é", "e", "ß", "ü😀", "工", "\u00a0", "_", "a b", "ab", "A"]


def _fill(store) -> None:
    upserts = [
        make_upsert(NS, f"k{n}", labels={"t": text}, written_at=EPOCH)
        for n, text in enumerate(TEXTS)
    ]
    store.commit(UnitOfWork(upserts=upserts))


def _answers(store) -> list[object]:
    answers: list[object] = []
    for order in Order:
        answers.append([meta.key_digest for meta in store.list(NS, order=order, limit=200).items])
    for op in FilterOp:
        for pivot in ("b", "é", "Z"):
            items = store.list(NS, filters=[LabelFilter("t", pivot, op)], limit=200).items
            answers.append(sorted(meta.labels["t"] for meta in items))
    return answers


@pytest.fixture
def icu_database(postgres_server) -> Iterator[str]:
    """Provide the DSN of a throwaway database whose default collation is ICU en-US."""
    name = f"fvtest_icu_{secrets.token_hex(4)}"
    with postgres_server.admin() as admin:
        try:
            admin.execute(
                sql.SQL(
                    "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' "
                    "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
                ).format(sql.Identifier(name))
            )
        except psycopg.Error as exc:
            pytest.skip(f"cannot create an ICU database here ({exc.sqlstate})")
    dsn = urlunsplit(urlsplit(postgres_server.dsn)._replace(path="/" + name))
    try:
        yield dsn
    finally:
        with postgres_server.admin() as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_ordering_is_byte_identical_to_memory_under_any_collation(icu_database: str) -> None:
    """List orders and text filters match the memory adapter even in an en-US database."""
    with psycopg.connect(icu_database) as raw:
        assert raw.execute("SELECT 'B' < 'a'").fetchone() == (False,)  # the default misleads
    memory = InMemorySecureObjectStore()
    with PostgresSecureObjectStore.open(icu_database, schema="flowvault", create=True) as store:
        _fill(store)
        _fill(memory)
        assert _answers(store) == _answers(memory)


def test_compared_text_columns_are_collated_c(store) -> None:
    """Every ordered or compared text column is declared COLLATE "C"."""
    with store._borrow() as connection:
        rows = connection.execute(
            "SELECT table_name || '.' || column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND collation_name = 'C'",
            (store.schema,),
        ).fetchall()
    assert {row[0] for row in rows} >= {
        "records.namespace",
        "records.key_digest",
        "records.written_at",
        "record_labels.text_value",
        "record_tags.tag",
        "ledger_events.stream",
        "ledger_streams.stream",
    }


# -- query plans ---------------------------------------------------------------------


@pytest.fixture
def filled(store) -> PostgresSecureObjectStore:
    """Provide a store of 1,000 labelled records with fresh planner statistics."""
    upserts = [
        make_upsert(NS, f"k{n}", labels={"status": f"s{n % 50}", "n": n}) for n in range(1000)
    ]
    store.commit(UnitOfWork(upserts=upserts))
    store._run(lambda connection: connection.execute("ANALYZE"), transaction=False)
    return store


def _plan(store, query: str, params: tuple) -> str:
    def explain(connection) -> str:
        connection.execute("SET LOCAL enable_seqscan = off")
        rows = connection.execute("EXPLAIN " + query, params).fetchall()
        return "\n".join(row[0] for row in rows)

    return store._run(explain, transaction=True)


@pytest.mark.parametrize("order", [Order.WRITTEN_AT, Order.WRITTEN_AT_DESC])
def test_written_at_orders_read_the_index_in_order(filled, order: Order) -> None:
    """Time orders walk records_by_written_at, forwards or backwards, with no sort step."""
    plan = _plan(filled, _queries.list_query(order, True), (NS, "2026", "sha256:", 5))
    assert "records_by_written_at" in plan
    assert "Sort" not in plan


def test_a_tag_filter_reads_the_tag_index(store) -> None:
    """A selective tag filter finds its records in record_tags_by_tag, not by reading them all.

    (For a tag most records carry, under a small limit, the planner may rather
    walk the order's index and probe each record's tag key: that stops early.)
    """
    red, blue = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    upserts = [make_upsert(NS, f"k{n}", tags={red} if n == 500 else {blue}) for n in range(1000)]
    store.commit(UnitOfWork(upserts=upserts))
    store._run(lambda connection: connection.execute("ANALYZE"), transaction=False)
    plan = _plan(store, _queries.list_query(Order.KEY, False, (), 1), (NS, NS, red, 5))
    assert "record_tags_by_tag" in plan


def test_key_order_reads_the_identity_index(filled) -> None:
    """Key order walks the (namespace, key_digest) index with no sort step."""
    plan = _plan(filled, _queries.list_query(Order.KEY, True), (NS, "sha256:", 5))
    assert "records_identity" in plan
    assert "Sort" not in plan


@pytest.mark.parametrize(
    ("name", "value", "index"), [("status", "s7", "by_text"), ("n", 7, "by_int")]
)
def test_selective_label_filters_use_the_typed_label_indexes(filled, name, value, index) -> None:
    """A selective label filter is answered from the typed (namespace, name, value) index."""
    op = FilterOp.EQ if isinstance(value, str) else FilterOp.LT
    query = _queries.list_query(Order.KEY, False, ((op, isinstance(value, str)),))
    plan = _plan(filled, query, (NS, NS, name, value, 5))
    assert f"record_labels_{index}" in plan
    assert "Index Cond" in plan.split(f"record_labels_{index}")[1]


@pytest.mark.parametrize("descending", [False, True])
def test_label_listing_after_a_cursor_starts_its_index_scan_at_the_cursor(
    filled, descending: bool
) -> None:
    """Each type of value is an ordered scan of its typed label index, bounded by the cursor.

    The row comparison with the key digest spans both tables, so it cannot
    bound the scan; the value's own bound does, and no page starts reading
    from the first value.
    """
    position = LabelCursor("status", descending, "s20", "sha256:")
    statement = _listing.label_statement(
        _queries.PLACEHOLDER,
        NS,
        "status",
        descending=descending,
        filters=(),
        position=position,
        limit=5,
    )
    assert statement is not None
    plan = _plan(filled, *statement)
    text_scan = plan.split("record_labels_by_text")[1].split("\n")[1]
    assert "Index Cond" in text_scan
    assert "text_value " + ("<=" if descending else ">=") in text_scan
    assert "Seq Scan" not in plan


def test_load_many_reads_the_identity_index_once(filled) -> None:
    """``load_many`` is one probe of the (namespace, key_digest) index for every name."""
    plan = _plan(filled, _queries.LOAD_MANY, (NS, ["a", "b", "c"]))
    assert "records_identity" in plan
    assert "ANY" in plan
    assert "Seq Scan" not in plan


# -- values at the edges ---------------------------------------------------------------


def test_sixty_four_bit_labels_round_trip_and_compare(store) -> None:
    """Labels at both ends of the 64-bit range store, load and filter exactly."""
    extremes = {"low": -(2**63) + 1, "high": 2**63 - 1, "odd": 2**53 + 1}
    store.commit(
        UnitOfWork(upserts=[make_upsert(NS, k, labels={"v": v}) for k, v in extremes.items()])
    )
    found = store.list(NS, filters=[LabelFilter("v", 2**53, FilterOp.GT)]).items
    assert sorted(meta.labels["v"] for meta in found) == [2**53 + 1, 2**63 - 1]
    loaded = store.load(NS, make_upsert(NS, "low").header.key_digest)
    assert loaded is not None
    assert loaded.metadata.labels == {"v": -(2**63) + 1}


def test_compact_is_a_completed_no_op(store) -> None:
    """compact() has nothing to do on PostgreSQL and says it completed."""
    assert store.compact() is True
    store.close()
    with pytest.raises(StoreUnavailable):
        store.compact()


# -- secrets and lifecycle ---------------------------------------------------------------


def _password_dsn(postgres_server, port: int | None = None) -> str:
    parts = urlsplit(postgres_server.dsn)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{parts.username or 'postgres'}:{PASSWORD}@{host}:{port or parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc))


def test_repr_and_errors_never_show_the_dsn(postgres_server, pg_schema: str) -> None:
    """Neither the store's repr nor a connection failure carries the DSN or its password."""
    with pytest.raises(StoreUnavailable) as caught:
        PostgresSecureObjectStore.open(
            _password_dsn(postgres_server, port=1),
            schema=pg_schema,
            connect_timeout=0.5,
            create=True,
        )
    assert PASSWORD not in str(caught.value) + repr(caught.value)
    assert caught.value.code == "STORE_UNAVAILABLE"
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        assert "postgres" not in repr(store).replace("Postgres", "")
        assert PASSWORD not in repr(store._options)


@pytest.mark.parametrize(
    "options",
    [
        {"schema": "Upper"},
        {"schema": "pg_catalog"},
        {"schema": "a" * 64},
        {"schema": "bad-name"},
        {"pool_size": 0},
        {"pool_size": 101},
        {"pool_size": True},
        {"statement_timeout": 0},
        {"lock_timeout": float("nan")},
        {"connect_timeout": -1},
    ],
)
def test_bad_options_are_invalid_input(postgres_server, options: dict) -> None:
    """Out-of-range options are refused before any connection is made."""
    with pytest.raises(InvalidInput):
        PostgresSecureObjectStore.open(postgres_server.dsn, **options)


def test_malformed_dsn_is_invalid_input_without_its_text() -> None:
    """A DSN libpq cannot parse is INVALID_INPUT, and the message does not quote it."""
    with pytest.raises(InvalidInput) as caught:
        PostgresSecureObjectStore.open(f"host=x password={PASSWORD} nonsense", create=True)
    assert PASSWORD not in str(caught.value)
    assert caught.value.__cause__ is None


def test_close_is_idempotent_and_final(store) -> None:
    """close() twice is fine; afterwards every call is STORE_UNAVAILABLE."""
    store.close()
    store.close()
    with pytest.raises(StoreUnavailable):
        store.has_records()
    with pytest.raises(StoreUnavailable):
        store.reserve_seals("k1", 1)


def test_a_forked_child_must_open_its_own_store(store) -> None:
    """In a child the parent's store refuses work; closing it there leaves the parent's pool."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            store.has_records()
        except StoreUnavailable:
            store.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    time.sleep(0.05)
    assert store.has_records() is False


# -- seal counts -------------------------------------------------------------------


def test_seal_counts_survive_close_and_reopen(postgres_server, pg_schema: str) -> None:
    """Reserved totals are committed: a new store on the schema has them and counts on."""
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        store.reserve_seals("k1", 64)
        store.reserve_seals("k1", 128)
        store.reserve_seals("k2", 64)
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        assert store.seal_counts() == {"k1": 192, "k2": 64}
        assert store.reserve_seals("k1", 1) == 193


def test_reservation_held_off_past_the_lock_timeout_is_store_busy(
    postgres_server, pg_schema: str
) -> None:
    """A reservation waiting on its row past ``lock_timeout`` is StoreBusy and adds nothing."""
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, lock_timeout=0.2, create=True
    ) as store:
        store.reserve_seals("k1", 5)
        with postgres_server.admin() as admin, admin.transaction():
            admin.execute(
                sql.SQL("SELECT 1 FROM {}.seal_counters FOR UPDATE").format(
                    sql.Identifier(pg_schema)
                )
            )
            with pytest.raises(StoreBusy):
                store.reserve_seals("k1", 1)
        assert store.seal_counts() == {"k1": 5}
        assert store.reserve_seals("k1", 1) == 6
