"""The SQLite adapter on real files: pragmas, permissions, fork, locking, reopening, plans."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from log_capture import capture_logs
from processes import run_together

from flowvault.adapters import _listing
from flowvault.adapters.sqlite import SQLiteSecureObjectStore, _rows
from flowvault.adapters.sqlite import _queries as sql
from flowvault.application import (
    FilterOp,
    Guard,
    LabelCursor,
    LabelFilter,
    LedgerTrim,
    Order,
    UnitOfWork,
)
from flowvault.application._records import LabelValue
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import (
    InsecurePermissions,
    IntegrityFailure,
    InvalidInput,
    StoreBusy,
    StoreUnavailable,
)
from flowvault.domain._envelope import natural_key_digest
from flowvault.domain._ledger import verify_chain

NS = "orders"


def _digest(key: str) -> str:
    return natural_key_digest(NS, key)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Return a database path whose directory does not exist yet."""
    return tmp_path / "data" / "store.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SQLiteSecureObjectStore]:
    """Provide a fresh store, closed after the test."""
    with SQLiteSecureObjectStore.open(db_path, create=True) as opened:
        yield opened


def _pragma(connection: sqlite3.Connection, name: str) -> object:
    return connection.execute(f"PRAGMA {name}").fetchone()[0]


def _connections(store: SQLiteSecureObjectStore) -> list[sqlite3.Connection]:
    """Return the writer and this thread's reader: every kind of connection the store opens."""
    return [store._writer.connection, store._reader().connection]


# -- pragmas -------------------------------------------------------------------


@pytest.mark.parametrize(("synchronous", "level"), [("full", 2), ("normal", 1)])
def test_every_pragma_reads_back_as_configured(db_path: Path, synchronous, level) -> None:
    """Writer and reader connections both run WAL, the chosen sync level and the safety pragmas."""
    with SQLiteSecureObjectStore.open(
        db_path, synchronous=synchronous, busy_timeout=1.5, create=True
    ) as store:
        for connection in _connections(store):
            assert _pragma(connection, "journal_mode") == "wal"
            assert _pragma(connection, "synchronous") == level
            assert _pragma(connection, "foreign_keys") == 1
            assert _pragma(connection, "secure_delete") == 1
            assert _pragma(connection, "trusted_schema") == 0
            assert _pragma(connection, "busy_timeout") == 1500


def test_default_synchronous_is_full(store: SQLiteSecureObjectStore) -> None:
    """Without an explicit choice every commit is synced to disk."""
    assert all(_pragma(c, "synchronous") == 2 for c in _connections(store))


@pytest.mark.parametrize(
    "options", [{"synchronous": "off"}, {"busy_timeout": -1.0}, {"busy_timeout": float("nan")}]
)
def test_bad_options_are_invalid_input(db_path: Path, options) -> None:
    """Unknown sync levels and bad timeouts are refused before any file exists."""
    with pytest.raises(InvalidInput):
        SQLiteSecureObjectStore.open(db_path, **options)
    assert not db_path.parent.exists()


# -- permissions ---------------------------------------------------------------


def test_files_are_private(store: SQLiteSecureObjectStore, db_path: Path) -> None:
    """The directory is 0700 and the database, WAL and shared-memory files are 0600."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
    assert store.load(NS, _digest("a")) is not None
    assert _mode(db_path.parent) == 0o700
    for path in (db_path, _sidecar(db_path, "-wal"), _sidecar(db_path, "-shm")):
        assert path.exists()
        assert _mode(path) == 0o600


def test_modes_do_not_depend_on_the_umask(db_path: Path) -> None:
    """A umask that would strip the owner's bits still yields 0700 and 0600."""
    previous = os.umask(0o277)
    try:
        SQLiteSecureObjectStore.open(db_path, create=True).close()
    finally:
        os.umask(previous)
    assert _mode(db_path.parent) == 0o700
    assert _mode(db_path) == 0o600


def test_group_writable_directory_is_refused(db_path: Path) -> None:
    """A directory others can write to is refused, with the chmod that fixes it, before any file."""
    db_path.parent.mkdir()
    db_path.parent.chmod(0o770)
    with pytest.raises(InsecurePermissions) as caught:
        SQLiteSecureObjectStore.open(db_path, create=True)
    assert f"chmod 700 {db_path.parent}" in str(caught.value)
    assert not db_path.exists()


def test_world_readable_database_is_refused(db_path: Path) -> None:
    """A database file others can read is refused, naming chmod 600."""
    SQLiteSecureObjectStore.open(db_path, create=True).close()
    db_path.chmod(0o644)
    with pytest.raises(InsecurePermissions) as caught:
        SQLiteSecureObjectStore.open(db_path, create=True)
    assert f"chmod 600 {db_path}" in str(caught.value)
    assert caught.value.code == "INSECURE_PERMISSIONS"


def test_insecure_permissions_can_be_allowed_with_a_warning(db_path: Path) -> None:
    """allow_insecure_permissions opens the store anyway and logs a warning per offending path."""
    db_path.parent.mkdir()
    db_path.parent.chmod(0o775)
    with capture_logs() as logs:
        store = SQLiteSecureObjectStore.open(db_path, allow_insecure_permissions=True, create=True)
    with store:
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        assert store.load(NS, _digest("a")) is not None
    warnings = [entry for entry in logs if entry["event"] == "insecure_permissions"]
    assert [entry["log_level"] for entry in warnings] == ["warning"]
    assert warnings[0]["fix"] == f"chmod 700 {db_path.parent}"


# -- lifecycle -----------------------------------------------------------------


def test_use_after_fork_is_refused_in_the_child(store: SQLiteSecureObjectStore) -> None:
    """A forked child gets StoreUnavailable from every call; the parent's store keeps working."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"parent")]))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            store.load(NS, _digest("a"))
        except StoreUnavailable as exc:
            code = 0 if "fork" in str(exc) else 3
        except BaseException:
            code = 2
        try:
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "child")]))
            code = 4
        except StoreUnavailable:
            store.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    loaded = store.load(NS, _digest("a"))
    assert loaded is not None
    assert loaded.payload == b"parent"
    assert store.load(NS, _digest("child")) is None
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "after")]))


def test_close_is_idempotent_and_every_call_is_refused(store: SQLiteSecureObjectStore) -> None:
    """After close() each method raises StoreUnavailable; closing again is harmless."""
    store.close()
    store.close()
    calls = [
        lambda: store.load(NS, _digest("a")),
        lambda: store.peek_metadata(NS, _digest("a")),
        lambda: store.list(NS),
        lambda: store.commit(UnitOfWork()),
        lambda: store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")])),
        lambda: store.ledger_head("s"),
        lambda: store.read_ledger("s"),
        store.has_records,
        store.namespace_counts,
        store.key_id_counts,
        lambda: store.reserve_seals("k1", 1),
        store.seal_counts,
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()


def test_finished_threads_give_back_their_readers(store: SQLiteSecureObjectStore) -> None:
    """A thread's reader connection is closed when the thread ends, not kept until close().

    Reads borrow the idle writer connection, so each read here runs while
    the writer is held (as by a commit in progress) to make it open a reader.
    """

    def read() -> None:
        with store._writer.lock:
            store.has_records()

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store._readers) == 0
    with store._writer.lock:
        store.has_records()
    assert len(store._readers) == 1


def test_reopening_keeps_records_and_ledger(db_path: Path) -> None:
    """A closed and reopened store returns the same records, labels and ledger."""
    first = make_event("s", 0)
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        upsert = make_upsert(NS, "a", b"\x00kept\xff", labels={"status": "open", "n": 2**62})
        store.commit(UnitOfWork(upserts=[upsert], appends=[first]))
        store.commit(UnitOfWork(appends=[make_event("s", 1, first)], trims=[LedgerTrim("s", 1)]))
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert loaded.metadata == upsert.metadata
        assert loaded.payload == b"\x00kept\xff"
        page = store.read_ledger("s")
        assert page.gap
        assert [event.index for event in page.events] == [1]
        assert verify_chain(page.events, start_index=1, previous_hash=first.event_hash).ok


def test_garbage_file_is_an_integrity_failure(db_path: Path) -> None:
    """A file that is not a SQLite database is reported as INTEGRITY_FAILURE, not a driver error."""
    db_path.parent.mkdir(mode=0o700)
    db_path.write_bytes(b"this is not a database, just bytes " * 200)
    db_path.chmod(0o600)
    with pytest.raises(IntegrityFailure) as caught:
        SQLiteSecureObjectStore.open(db_path, create=True)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


def test_directory_in_place_of_the_file_is_unavailable(db_path: Path) -> None:
    """A path SQLite cannot open as a file is StoreUnavailable."""
    db_path.mkdir(parents=True, mode=0o700)
    db_path.parent.chmod(0o700)
    with pytest.raises(StoreUnavailable):
        SQLiteSecureObjectStore.open(db_path, create=True)


# -- locking -------------------------------------------------------------------


def test_write_lock_held_past_the_timeout_is_store_busy(db_path: Path) -> None:
    """A commit that cannot get the write lock in time is StoreBusy and writes nothing."""
    with SQLiteSecureObjectStore.open(db_path, busy_timeout=0.2, create=True) as store:
        blocker = sqlite3.connect(db_path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreBusy) as caught:
                store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
            assert "0.2 s" in str(caught.value)
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
            assert store.load(NS, _digest("a")) is None
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert store.load(NS, _digest("a")) is None
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        assert store.load(NS, _digest("a")) is not None


def test_a_commit_waits_for_a_lock_released_within_the_timeout(db_path: Path) -> None:
    """The write lock freed while a commit waits lets it land; the busy timeout is restored.

    Commits switch SQLite's busy handler off while they retry for the lock
    themselves; every other statement must find it back at its setting.
    """
    with SQLiteSecureObjectStore.open(db_path, busy_timeout=5.0, create=True) as store:
        blocker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.2, lambda: blocker.execute("ROLLBACK"))
        release.start()
        try:
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        finally:
            release.join()
            blocker.close()
        assert store.load(NS, _digest("a")) is not None
        timeout = store._writer.connection.execute("PRAGMA busy_timeout").fetchone()
        assert timeout == (5000,)


def test_readers_do_not_wait_for_a_writer(db_path: Path) -> None:
    """In WAL mode reads see the last commit while another connection holds the write lock."""
    with SQLiteSecureObjectStore.open(db_path, busy_timeout=0.2, create=True) as store:
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v1")]))
        blocker = sqlite3.connect(db_path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            blocker.execute("DELETE FROM records")
            loaded = store.load(NS, _digest("a"))
            assert loaded is not None
            assert loaded.payload == b"v1"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()


# -- what the queries touch ----------------------------------------------------


def test_peek_and_list_never_read_the_payload_column(store: SQLiteSecureObjectStore) -> None:
    """With the payload column made unreadable, metadata reads still work and load does not."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"sealed", labels={"n": 1})]))

    def deny_payload(action: int, table: str | None, column: str | None, *_: object) -> int:
        denied = action == sqlite3.SQLITE_READ and (table, column) == ("records", "payload")
        return sqlite3.SQLITE_DENY if denied else sqlite3.SQLITE_OK

    for connection in (store._reader().connection, store._writer.connection):
        connection.set_authorizer(deny_payload)
    assert store.peek_metadata(NS, _digest("a")) is not None
    assert len(store.list(NS, filters=[LabelFilter("n", 1, FilterOp.GE)]).items) == 1
    assert len(store.list(NS, order=Order.WRITTEN_AT_DESC).items) == 1
    with pytest.raises(StoreUnavailable):
        store.load(NS, _digest("a"))


def _label_statement(
    *,
    descending: bool = False,
    filters: tuple[LabelFilter, ...] = (),
    position: LabelCursor | None = None,
) -> tuple[str, tuple[object, ...]]:
    statement = _listing.label_statement(
        sql.PLACEHOLDER,
        NS,
        "n",
        descending=descending,
        filters=filters,
        position=position,
        limit=100,
    )
    assert statement is not None
    return statement


_QUERIES = {
    "load": (sql.LOAD_RECORD, (NS, "k")),
    "raise epoch": (sql.RAISE_EPOCH, ()),
    "read epoch": (sql.STORE_EPOCH, ()),
    "peek": (sql.PEEK_METADATA, (NS, "k")),
    "revision": (sql.STORED_REVISION, (NS, "k")),
    "stored row": (sql.STORED_ROW, (NS, "k")),
    "clear labels": (sql.CLEAR_LABELS, (NS, "k")),
    "delete one label": (sql.DELETE_LABEL, (NS, "k", "n")),
    "prune labels": (sql.prune_labels(2), (NS, "k", "n", 1, "status", 0)),
    "upsert text label": (sql.UPSERT_TEXT_LABEL, ("status", "open", NS, "k")),
    "upsert integer label": (sql.UPSERT_INT_LABEL, ("n", 1, NS, "k")),
    "set key id": (sql.SET_KEY_ID, ("k2", NS, "k", "k2")),
    "delete": (sql.DELETE_RECORD, (NS, "k")),
    "stream": (sql.STREAM_STATE, ("s",)),
    "trim": (sql.TRIM_STREAM, (3, "s")),
    "trim events": (sql.TRIM_EVENTS, ("s", "s")),
    "ledger head": (sql.LEDGER_HEAD, ("s",)),
    "ledger head index": (sql.LEDGER_HEAD_INDEX, ("s",)),
    "ledger head indexes": (sql.ledger_head_indexes(3), ("s", "t", "u")),
    "ledger page": (sql.LEDGER_PAGE, ("s", 0, 101)),
    "list by key": (sql.list_query(Order.KEY, False), (NS, 101)),
    "list by key after": (sql.list_query(Order.KEY, True), (NS, "k", 101)),
    "list by time after": (sql.list_query(Order.WRITTEN_AT, True), (NS, "w", "k", 101)),
    "list newest first after": (
        sql.list_query(Order.WRITTEN_AT_DESC, True),
        (NS, "w", "k", 101),
    ),
    "list n < 5": (
        sql.list_query(Order.KEY, False, ((FilterOp.LT, False),)),
        (NS, NS, "n", 5, 101),
    ),
    "list expired, oldest first": (
        sql.list_query(Order.WRITTEN_AT, False, ((FilterOp.LT, False),)),
        (NS, NS, "expires_at", 1_700_000_000, 101),
    ),
    "list status = open after": (
        sql.list_query(Order.WRITTEN_AT_DESC, True, ((FilterOp.EQ, True),)),
        (NS, NS, "status", "open", "w", "k", 101),
    ),
    "list by label": _label_statement(),
    "list by label, newest first, before a bound": _label_statement(
        descending=True, filters=(LabelFilter("n", 40, FilterOp.LT),)
    ),
    "list by label after a cursor, filtered": _label_statement(
        descending=True,
        filters=(LabelFilter("status", "open"),),
        position=LabelCursor("n", True, 30, "k"),
    ),
    "load many": (sql.load_many(3), (NS, "a", "b", "c")),
}


@pytest.mark.parametrize("name", sorted(_QUERIES))
def test_queries_use_indexes(store: SQLiteSecureObjectStore, name: str) -> None:
    """Each statement the adapter runs searches an index; none scans a whole table."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, f"r{n}", labels={"n": n}) for n in range(50)]))
    query, params = _QUERIES[name]
    plan = [
        row[3] for row in store._writer.connection.execute(f"EXPLAIN QUERY PLAN {query}", params)
    ]
    searches = [step for step in plan if step.startswith("SEARCH")]
    assert searches, plan
    assert all(
        any(marker in step for marker in ("USING INDEX", "USING COVERING INDEX", "PRIMARY KEY"))
        for step in searches
    ), plan
    for table in ("records", "ledger_events", "record_labels", "ledger_streams", "store_epoch"):
        assert not any(step.startswith(f"SCAN {table}") for step in plan), plan
    assert not any(step.startswith(("SCAN r", "SCAN l")) for step in plan), plan


def test_label_filters_use_the_typed_label_indexes(store: SQLiteSecureObjectStore) -> None:
    """An integer range and a text equality each search their own (namespace, name, value) index."""
    connection = store._writer.connection
    cases = [
        ((FilterOp.LT, False), "n", 5, "record_labels_by_int"),
        ((FilterOp.EQ, True), "status", "open", "record_labels_by_text"),
    ]
    for shape, name, value, index in cases:
        query = sql.list_query(Order.KEY, False, (shape,))
        plan = " | ".join(
            row[3]
            for row in connection.execute(f"EXPLAIN QUERY PLAN {query}", (NS, NS, name, value, 5))
        )
        assert index in plan


def test_any_guard_upsert_replaces_labels(store: SQLiteSecureObjectStore) -> None:
    """A rewrite drops labels the new revision does not carry, from reads and from filters."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", labels={"n": 1, "status": "open"})]))
    store.commit(
        UnitOfWork(upserts=[make_upsert(NS, "a", expected=Guard.ANY, revision=3, labels={"n": 2})])
    )
    meta = store.peek_metadata(NS, _digest("a"))
    assert meta is not None
    assert dict(meta.labels) == {"n": 2}
    assert store.list(NS, filters=[LabelFilter("status", "open")]).items == ()
    assert len(store.list(NS, filters=[LabelFilter("n", 2)]).items) == 1
    rows = store._writer.connection.execute("SELECT COUNT(*) FROM record_labels").fetchone()
    assert rows == (1,)


def test_full_64_bit_label_range_round_trips_and_filters(store: SQLiteSecureObjectStore) -> None:
    """Integer labels beyond 2^53 keep their exact value and compare exactly."""
    big, small = 2**63 - 1, -(2**63 - 1)
    store.commit(
        UnitOfWork(
            upserts=[
                make_upsert(NS, "big", labels={"n": big}),
                make_upsert(NS, "small", labels={"n": small}),
            ]
        )
    )
    meta = store.peek_metadata(NS, _digest("big"))
    assert meta is not None
    assert meta.labels["n"] == big
    assert len(store.list(NS, filters=[LabelFilter("n", big - 1, FilterOp.GT)]).items) == 1
    assert len(store.list(NS, filters=[LabelFilter("n", 0, FilterOp.LT)]).items) == 1


def test_huge_indexes_behave_like_the_reference(store: SQLiteSecureObjectStore) -> None:
    """Indexes past SQLite's 64-bit range read as past the head and trim up to the head."""
    events = [make_event("s", 0)]
    events.append(make_event("s", 1, events[0]))
    store.commit(UnitOfWork(appends=events))
    assert store.read_ledger("s", from_index=2**70).events == ()
    store.commit(UnitOfWork(trims=[LedgerTrim("s", 2**70)]))
    assert list(store.read_ledger("s").events) == events[1:]


def _label_rows(store: SQLiteSecureObjectStore) -> set[tuple[object, ...]]:
    rows = store._writer.connection.execute(
        "SELECT name, text_value, int_value FROM record_labels"
    ).fetchall()
    return {tuple(row) for row in rows}


def test_rewritten_labels_change_only_what_changed(store: SQLiteSecureObjectStore) -> None:
    """Renamed, retyped, changed, kept and dropped labels leave exactly the new set behind.

    Rows are pruned by name and type and then upserted, so a label that
    changes type never meets its old row, and filters see only the new values.
    """
    first = {"a": "x", "b": 1, "c": "keep", "e": 7}
    second = {"a": 2, "b": "y", "c": "keep", "d": 5, "e": 8}
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", labels=first)]))
    assert _label_rows(store) == {
        ("a", "x", None),
        ("b", None, 1),
        ("c", "keep", None),
        ("e", None, 7),
    }
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", expected=1, labels=second)]))
    assert _label_rows(store) == {
        ("a", None, 2),
        ("b", "y", None),
        ("c", "keep", None),
        ("d", None, 5),
        ("e", None, 8),
    }
    assert len(store.list(NS, filters=[LabelFilter("a", 2, FilterOp.EQ)]).items) == 1
    assert not store.list(NS, filters=[LabelFilter("a", "x", FilterOp.EQ)]).items
    assert not store.list(NS, filters=[LabelFilter("e", 7, FilterOp.EQ)]).items
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", expected=2, labels={"d": 5})]))
    assert _label_rows(store) == {("d", None, 5)}
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", expected=3)]))
    assert _label_rows(store) == set()
    meta = store.peek_metadata(NS, _digest("r"))
    assert meta is not None
    assert dict(meta.labels) == {}


def test_an_unchanged_label_set_writes_no_label_row(store: SQLiteSecureObjectStore) -> None:
    """A rewrite with the labels it had touches neither label rows nor the key id column."""
    labels: dict[str, LabelValue] = {"a": "x", "n": 1}
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", labels=labels)]))
    statements: list[str] = []
    store._writer.connection.set_trace_callback(statements.append)
    try:
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", expected=1, labels=labels)]))
    finally:
        store._writer.connection.set_trace_callback(None)
    writes = [s for s in statements if not s.startswith(("SELECT", "PRAGMA"))]
    assert not [s for s in writes if "record_labels" in s or "key_id =" in s], writes
    assert _label_rows(store) == {("a", "x", None), ("n", None, 1)}
    assert len(store.list(NS, filters=[LabelFilter("a", "x")]).items) == 1


def test_labels_that_no_longer_decode_get_every_label_row_rewritten(
    store: SQLiteSecureObjectStore,
) -> None:
    """An edited label column says nothing about the rows; the next write prunes them all."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", labels={"a": "x", "c": 3})]))
    store._writer.connection.execute("UPDATE records SET labels = 'not json'")
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "r", expected=1, labels={"b": 2})]))
    assert _label_rows(store) == {("b", None, 2)}
    assert not store.list(NS, filters=[LabelFilter("a", "x")]).items


def test_compact_truncates_the_wal_once_no_reader_holds_an_old_snapshot(db_path: Path) -> None:
    """A reader on an older snapshot defers compaction (False); once it ends, the WAL empties.

    The busy timeout is back at its setting afterwards, either way.
    """
    wal = _sidecar(db_path, "-wal")
    with SQLiteSecureObjectStore.open(db_path, busy_timeout=0.3, create=True) as store:
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        reader = sqlite3.connect(db_path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT COUNT(*) FROM records").fetchone()
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "b")]))
            assert store.compact() is False
            assert wal.stat().st_size > 0
        finally:
            reader.execute("ROLLBACK")
            reader.close()
        assert store.compact() is True
        assert wal.stat().st_size == 0
        timeout = store._writer.connection.execute("PRAGMA busy_timeout").fetchone()
        assert timeout == (300,)
        assert store.load(NS, _digest("b")) is not None


# -- seal counts ---------------------------------------------------------------


def test_seal_counts_survive_close_and_reopen(db_path: Path) -> None:
    """Reserved totals are on disk: a reopened file has them and keeps counting from them."""
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        store.reserve_seals("k1", 64)
        store.reserve_seals("k1", 128)
        store.reserve_seals("k2", 64)
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        assert store.seal_counts() == {"k1": 192, "k2": 64}
        assert store.reserve_seals("k1", 1) == 193


_RESERVER = """
import sys
import time
from pathlib import Path

from flowvault.adapters.sqlite import SQLiteSecureObjectStore

path, go, rounds, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with SQLiteSecureObjectStore.open(path) as store:
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the go file never appeared")
        time.sleep(0.005)
    totals = [store.reserve_seals("k1", count) for _ in range(rounds)]
print(" ".join(map(str, totals)), flush=True)
"""
"""Reserves ``rounds`` times once GO exists, so both processes overlap; prints each total."""


def test_two_processes_reserving_at_once_add_up_exactly(db_path: Path, tmp_path: Path) -> None:
    """Two processes reserving from one file lose nothing and never share a range of seals.

    Each total ends a range no other reservation covers, so the totals of
    both processes together are every multiple of ``count`` exactly once.
    """
    SQLiteSecureObjectStore.open(db_path, create=True).close()
    go, rounds, count = tmp_path / "go", 200, 3
    arguments = [str(db_path), str(go), str(rounds), str(count)]
    finished = run_together([[sys.executable, "-c", _RESERVER, *arguments]] * 2, go)
    totals: list[int] = []
    for worker in finished:
        assert worker.returncode == 0, worker.stderr
        totals += [int(total) for total in worker.stdout.split()]
    expected = 2 * rounds * count
    assert sorted(totals) == list(range(count, expected + 1, count))
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        assert store.seal_counts() == {"k1": expected}


def test_read_only_store_reads_counts_but_refuses_reservations(db_path: Path) -> None:
    """A read-only open reports seal counts and refuses to add to them, as it refuses commits."""
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        store.reserve_seals("k1", 64)
    with SQLiteSecureObjectStore.open(db_path, read_only=True) as store:
        assert store.seal_counts() == {"k1": 64}
        with pytest.raises(StoreUnavailable, match="read-only"):
            store.reserve_seals("k1", 1)
    with SQLiteSecureObjectStore.open(db_path, create=True) as store:
        assert store.seal_counts() == {"k1": 64}


def test_reservation_held_off_past_the_timeout_is_store_busy(db_path: Path) -> None:
    """A reservation that cannot get the write lock in time is StoreBusy and adds nothing."""
    with SQLiteSecureObjectStore.open(db_path, busy_timeout=0.2, create=True) as store:
        store.reserve_seals("k1", 5)
        blocker = sqlite3.connect(db_path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreBusy) as caught:
                store.reserve_seals("k1", 1)
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert store.seal_counts() == {"k1": 5}
        assert store.reserve_seals("k1", 1) == 6


def test_label_columns_decode_the_same_from_the_memo() -> None:
    """A label column seen before decodes to the same read-only mapping; the memo stays bounded."""
    text = _rows.encode_labels({"state": "intake", "n": 2**62})
    first, again = _rows.decode_labels(text), _rows.decode_labels(text)
    assert dict(first) == dict(again) == {"state": "intake", "n": 2**62}
    with pytest.raises(TypeError):
        first["state"] = "x"  # type: ignore[index]
    for number in range(_rows.LABEL_MEMO + 10):
        assert _rows.decode_labels(_rows.encode_labels({"n": number})) == {"n": number}
    assert len(_rows._decoded_labels) <= _rows.LABEL_MEMO
    for _ in range(2):
        with pytest.raises(ValueError, match="label entry"):
            _rows.decode_labels('{"n":["int","x"]}')
