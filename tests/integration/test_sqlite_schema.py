"""Schema versions: older files migrate forward, newer ones are refused untouched.

A real version-1 file (the baseline, before tags) migrates to the current
version and keeps reading; a real version-2 file (full label indexes)
migrates to version 3 (partial ones) with every label row and listing
intact, and its listings still search the label indexes. The path from the
current version onwards is proven on a synthetic next version, injected in
place of the real list.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path

import pytest
from schema_contents import (
    LABELLED,
    assert_baseline_reads_back,
    assert_labelled_reads_back,
    baseline_events,
    fill_baseline,
    label_listings,
    label_upserts,
    reference_label_listings,
)

from flowvault.adapters import _listing
from flowvault.adapters.sqlite import SQLiteSecureObjectStore, _schema
from flowvault.adapters.sqlite import _queries as sql
from flowvault.adapters.sqlite._schema import SCHEMA_VERSION
from flowvault.application import FilterOp, LabelCursor, LabelFilter, Order, TagFilter, UnitOfWork
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import SchemaTooNew, StoreUnavailable

SYNTHETIC_STEP = (
    "CREATE TABLE synthetic_notes (id INTEGER PRIMARY KEY, note TEXT NOT NULL)",
    "ALTER TABLE records ADD COLUMN synthetic_flag INTEGER",
)
"""A next version as a later release might add it: a new table and a nullable column."""
NEXT = SCHEMA_VERSION + 1


def _with_next_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, SYNTHETIC_STEP))


def _schema_of(path: Path) -> list[tuple[str, str, str | None]]:
    raw = sqlite3.connect(path)
    try:
        return raw.execute(
            "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
    finally:
        raw.close()


def _raw(path: Path, query: str) -> list[tuple[object, ...]]:
    raw = sqlite3.connect(path)
    try:
        return raw.execute(query).fetchall()
    finally:
        raw.close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


def _baseline_store(path: Path) -> int:
    """Create a baseline store at ``path`` holding the baseline contents; return its epoch."""
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        fill_baseline(store)
        return store.epoch()


def _version_1_store(path: Path) -> int:
    """Build a version-1 file (the baseline steps alone) holding the baseline contents.

    The contents are written by this code into a current file, then copied
    table by table, column by column as version 1 names them, into a file
    made with plain sqlite3 from ``BASELINE``: what a release before tags
    left on disk. Returns the epoch.
    """
    source = path.with_name("source.db")
    epoch = _baseline_store(source)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in _schema.BASELINE:
            raw.execute(statement)
        raw.execute("ATTACH DATABASE ? AS source", (str(source),))
        tables = raw.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")
        for (table,) in tables.fetchall():
            names = [row[1] for row in raw.execute(f"PRAGMA main.table_info({table})")]
            columns = ", ".join(names)
            raw.execute(f"DELETE FROM main.{table}")  # noqa: S608 - names from the catalog
            raw.execute(
                f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM source.{table}"  # noqa: S608
            )
        raw.execute("DETACH DATABASE source")
        raw.execute("PRAGMA user_version = 1")
    finally:
        raw.close()
    for leftover in [source, *_sidecars(source)]:
        leftover.unlink(missing_ok=True)
    path.chmod(0o600)
    return epoch


# -- the current version ---------------------------------------------------------


def test_fresh_store_records_the_current_version(tmp_path: Path) -> None:
    """A new file is stamped with SCHEMA_VERSION, 3 (partial label indexes), and holds its data."""
    path = tmp_path / "data" / "store.db"
    _baseline_store(path)
    assert SCHEMA_VERSION == 3
    assert _raw(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    with SQLiteSecureObjectStore.open(path, read_only=True) as store:
        assert_baseline_reads_back(store)


# -- version 1 onwards: tags --------------------------------------------------------


def test_version_1_file_migrates_to_tags_and_keeps_reading(tmp_path: Path) -> None:
    """A file written before tags gains them on open, and every later step: no row has tags.

    A read-only open refuses it until a read-write open has migrated it;
    afterwards tagged writes land next to the old rows and filter by tag.
    """
    path = tmp_path / "data" / "store.db"
    epoch = _version_1_store(path)
    assert _raw(path, "PRAGMA user_version") == [(1,)]
    with pytest.raises(StoreUnavailable) as caught:
        SQLiteSecureObjectStore.open(path, read_only=True)
    assert caught.value.details == {"found": 1, "supported": SCHEMA_VERSION}
    with SQLiteSecureObjectStore.open(path) as store:
        assert_baseline_reads_back(store)
        assert store.epoch() == epoch
    assert _raw(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert _raw(path, "SELECT count(*) FROM records WHERE tags = '[]'") == [(3,)]
    with SQLiteSecureObjectStore.open(path, read_only=True) as store:
        assert_baseline_reads_back(store)
    tag = "sha256:" + "7" * 64
    with SQLiteSecureObjectStore.open(path) as store:
        store.commit(UnitOfWork(upserts=[make_upsert("tagged", "t-1", tags={tag})]))
        listed = store.list("tagged", filters=[TagFilter(tag)]).items
        assert [meta.tags for meta in listed] == [frozenset({tag})]
    assert _raw(path, "SELECT count(*) FROM record_tags") == [(1,)]


def test_version_1_file_migrated_matches_a_fresh_one(tmp_path: Path) -> None:
    """Migrating a version-1 file yields exactly the schema a new store gets."""
    old = tmp_path / "old" / "store.db"
    _version_1_store(old)
    SQLiteSecureObjectStore.open(old).close()
    fresh = tmp_path / "fresh" / "store.db"
    SQLiteSecureObjectStore.open(fresh, create=True).close()
    assert _schema_of(old) == _schema_of(fresh)


# -- version 2 to 3: partial label indexes ---------------------------------------

_LABEL_ROWS = "SELECT * FROM record_labels ORDER BY record_id, name"
_LABEL_INDEXES = (
    "SELECT name, sql FROM sqlite_master "
    "WHERE tbl_name = 'record_labels' AND type = 'index' AND sql IS NOT NULL ORDER BY name"
)
_PARTIAL = [
    (
        "record_labels_by_int",
        "CREATE INDEX record_labels_by_int ON record_labels (namespace, name, int_value) "
        "WHERE int_value IS NOT NULL",
    ),
    (
        "record_labels_by_text",
        "CREATE INDEX record_labels_by_text ON record_labels (namespace, name, text_value) "
        "WHERE text_value IS NOT NULL",
    ),
]


def _index_entries(path: Path) -> dict[str, int]:
    """Return the number of entries each label value index holds, counted from its b-tree pages.

    An index b-tree keeps one entry in each cell, interior pages included.
    """
    query = (
        "SELECT name, sum(ncell) FROM dbstat "
        "WHERE name LIKE 'record_labels_by_%' GROUP BY name ORDER BY name"
    )
    return {str(name): int(str(entries)) for name, entries in _raw(path, query)}


def _version_2_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Build a version-2 file (the first two steps alone) holding the labelled records.

    Returns its label listings, read at version 2.
    """
    monkeypatch.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:2])
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        store.commit(UnitOfWork(upserts=label_upserts()))
        listings = label_listings(store)
    monkeypatch.undo()
    return listings


def test_version_2_file_migrates_to_partial_label_indexes(tmp_path: Path, monkeypatch) -> None:
    """A file with full label indexes gets partial ones on open; label rows and listings stay.

    Each index held an entry for every label row; now it holds only the
    rows of its own type. Every label row is kept as it was, and every
    label listing (filters of both types, by-label listings over text,
    integers and both, paged by cursor) returns the records it returned at
    version 2, in the same order.
    """
    path = tmp_path / "data" / "store.db"
    before = _version_2_store(path, monkeypatch)
    assert _raw(path, "PRAGMA user_version") == [(2,)]
    full = [(name, definition.split(" WHERE ")[0]) for name, definition in _PARTIAL]
    assert _raw(path, _LABEL_INDEXES) == full
    rows = _raw(path, _LABEL_ROWS)
    texts = sum(1 for row in rows if row[3] is not None)
    assert _index_entries(path) == {
        "record_labels_by_int": len(rows),
        "record_labels_by_text": len(rows),
    }
    assert before == reference_label_listings()
    assert all(before.values()), before
    with pytest.raises(StoreUnavailable) as caught:
        SQLiteSecureObjectStore.open(path, read_only=True)
    assert caught.value.details == {"found": 2, "supported": 3}
    with SQLiteSecureObjectStore.open(path) as store:
        assert label_listings(store) == before
        assert_labelled_reads_back(store)
    assert _raw(path, "PRAGMA user_version") == [(3,)]
    assert _raw(path, _LABEL_INDEXES) == _PARTIAL
    assert _raw(path, _LABEL_ROWS) == rows
    assert _index_entries(path) == {
        "record_labels_by_int": len(rows) - texts,
        "record_labels_by_text": texts,
    }
    with SQLiteSecureObjectStore.open(path, read_only=True) as store:
        assert label_listings(store) == before


def test_version_2_file_migrated_matches_a_fresh_one(tmp_path: Path, monkeypatch) -> None:
    """Migrating a version-2 file yields exactly the schema a new store gets."""
    old = tmp_path / "old" / "store.db"
    _version_2_store(old, monkeypatch)
    SQLiteSecureObjectStore.open(old).close()
    fresh = tmp_path / "fresh" / "store.db"
    SQLiteSecureObjectStore.open(fresh, create=True).close()
    assert _schema_of(old) == _schema_of(fresh)
    assert _raw(fresh, _LABEL_INDEXES) == _PARTIAL


def _by_label(
    label: str,
    *,
    descending: bool = False,
    filters: tuple[LabelFilter, ...] = (),
    position: LabelCursor | None = None,
) -> tuple[str, tuple[object, ...]]:
    statement = _listing.label_statement(
        sql.PLACEHOLDER,
        LABELLED,
        label,
        descending=descending,
        filters=filters,
        position=position,
        limit=5,
    )
    assert statement is not None
    return statement


_TEXT, _INT = "record_labels_by_text", "record_labels_by_int"
_LISTINGS = {
    "list colour = red": (
        sql.list_query(Order.KEY, False, ((FilterOp.EQ, True),)),
        (LABELLED, LABELLED, "colour", "red", 5),
        {_TEXT},
    ),
    "list colour <> red": (
        sql.list_query(Order.KEY, False, ((FilterOp.NE, True),)),
        (LABELLED, LABELLED, "colour", "red", 5),
        {_TEXT},
    ),
    "list size < 0, newest first, after a cursor": (
        sql.list_query(Order.WRITTEN_AT_DESC, True, ((FilterOp.LT, False),)),
        (LABELLED, LABELLED, "size", 0, "2027", "sha256:", 5),
        {_INT},
    ),
    "list colour = blue and size >= -3": (
        sql.list_query(Order.KEY, False, ((FilterOp.EQ, True), (FilterOp.GE, False))),
        (LABELLED, LABELLED, "colour", "blue", LABELLED, "size", -3, 5),
        {_TEXT, _INT},
    ),
    "by mixed, both types unbounded": (*_by_label("mixed"), {_TEXT, _INT}),
    "by mixed, descending": (*_by_label("mixed", descending=True), {_TEXT, _INT}),
    "by colour, descending, between bounds": (
        *_by_label(
            "colour",
            descending=True,
            filters=(
                LabelFilter("colour", "blue", FilterOp.GE),
                LabelFilter("colour", "red", FilterOp.LT),
            ),
        ),
        {_TEXT},
    ),
    "by colour, descending, after a cursor": (
        *_by_label("colour", descending=True, position=LabelCursor("colour", True, "green", "s")),
        {_TEXT},
    ),
    "by size, after a cursor": (
        *_by_label("size", position=LabelCursor("size", False, -2, "sha256:")),
        {_INT, _TEXT},
    ),
    "by size > -4": (*_by_label("size", filters=(LabelFilter("size", -4, FilterOp.GT),)), {_INT}),
}
"""Label listings, each with the label indexes its plan must search."""


@pytest.mark.parametrize("made", ["fresh", "migrated from version 2"])
@pytest.mark.parametrize("name", sorted(_LISTINGS))
def test_label_listings_search_the_partial_label_indexes(
    tmp_path: Path, monkeypatch, made: str, name: str
) -> None:
    """Every label listing still searches its typed label index once the index is partial.

    A comparison on the value, or the ``IS NOT NULL`` of an unbounded part
    of a by-label listing, implies the index's ``WHERE``; no plan scans
    ``record_labels``.
    """
    path = tmp_path / "data" / "store.db"
    if made == "fresh":
        with SQLiteSecureObjectStore.open(path, create=True) as store:
            store.commit(UnitOfWork(upserts=label_upserts()))
    else:
        _version_2_store(path, monkeypatch)
    query, params, indexes = _LISTINGS[name]
    with SQLiteSecureObjectStore.open(path) as store:
        connection = store._writer.connection
        plan = [row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {query}", params)]
        assert len(connection.execute(query, params).fetchall()) > 0
    assert _raw(path, _LABEL_INDEXES) == _PARTIAL
    for index in indexes:
        assert any(step.startswith("SEARCH") and index in step for step in plan), plan
    assert not any(step.startswith(("SCAN l", "SCAN record_labels")) for step in plan), plan


# -- a synthetic next version, after the current one ----------------------


def test_baseline_file_upgrades_to_a_next_version(tmp_path: Path, monkeypatch) -> None:
    """A baseline file gains the next step on open, records its version, and keeps its data.

    A read-only open cannot migrate, so it refuses the file until a
    read-write open has.
    """
    path = tmp_path / "data" / "store.db"
    epoch = _baseline_store(path)
    _with_next_version(monkeypatch)
    with pytest.raises(StoreUnavailable) as caught:
        SQLiteSecureObjectStore.open(path, read_only=True)
    assert caught.value.details == {"found": SCHEMA_VERSION, "supported": NEXT}
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        assert_baseline_reads_back(store)
        assert store.epoch() == epoch
    assert _raw(path, "PRAGMA user_version") == [(NEXT,)]
    assert _raw(path, "SELECT count(*) FROM synthetic_notes") == [(0,)]
    assert _raw(path, "SELECT DISTINCT synthetic_flag FROM records") == [(None,)]
    with SQLiteSecureObjectStore.open(path, read_only=True) as store:
        assert_baseline_reads_back(store)


def test_upgraded_file_accepts_new_writes(tmp_path: Path, monkeypatch) -> None:
    """After the upgrade, guards see the baseline's revisions and stream heads; the epoch counts."""
    path = tmp_path / "data" / "store.db"
    epoch = _baseline_store(path)
    _with_next_version(monkeypatch)
    head = baseline_events()["orders"][-1]
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        store.commit(
            UnitOfWork(
                upserts=[make_upsert("orders", "order-1", b"v3", expected=2, ledger_index=4)],
                appends=[make_event("orders", 4, head)],
            )
        )
        assert store.read_ledger("orders", from_index=4).events[0].previous_hash == (
            head.event_hash
        )
        assert store.epoch() == epoch + 1
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        assert store.epoch() == epoch + 1
    assert _raw(path, "PRAGMA user_version") == [(NEXT,)]


def test_upgraded_file_matches_a_fresh_one(tmp_path: Path, monkeypatch) -> None:
    """Upgrading a baseline file yields exactly the schema a new store gets at the next version."""
    old = tmp_path / "old" / "store.db"
    _baseline_store(old)
    _with_next_version(monkeypatch)
    SQLiteSecureObjectStore.open(old, create=True).close()
    fresh = tmp_path / "fresh" / "store.db"
    SQLiteSecureObjectStore.open(fresh, create=True).close()
    assert _schema_of(old) == _schema_of(fresh)
    assert _raw(fresh, "PRAGMA user_version") == [(NEXT,)]


# -- newer and broken schemas --------------------------------------------------


def _stamp(path: Path, version: int) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute(f"PRAGMA user_version = {version}")
    raw.close()


def _plain_baseline(path: Path) -> None:
    """Build a baseline file with plain sqlite3, no flowvault code opening it."""
    path.parent.mkdir(mode=0o700)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in _schema.BASELINE:
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 1")
    finally:
        raw.close()
    path.chmod(0o600)


@pytest.mark.parametrize("made_by", ["flowvault", "plain sqlite3"])
def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path, made_by: str) -> None:
    """A file stamped SCHEMA_VERSION + 1 raises SchemaTooNew; not one byte changes."""
    path = tmp_path / "data" / "store.db"
    if made_by == "flowvault":
        SQLiteSecureObjectStore.open(path, create=True).close()
    else:
        _plain_baseline(path)
    _stamp(path, SCHEMA_VERSION + 1)
    before = _sha256(path)
    with pytest.raises(SchemaTooNew) as caught:
        SQLiteSecureObjectStore.open(path, create=True)
    assert caught.value.details == {"found": SCHEMA_VERSION + 1, "supported": SCHEMA_VERSION}
    assert "upgrade flowvault" in str(caught.value)
    assert _sha256(path) == before
    assert [sidecar for sidecar in _sidecars(path) if sidecar.exists()] == []


def test_failed_migration_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    """A step that fails rolls the whole migration back; the next open starts cleanly."""
    path = tmp_path / "data" / "store.db"
    broken = (_schema.MIGRATIONS[0] + ("CREATE TABLE broken (",),)
    monkeypatch.setattr(_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreUnavailable):
        SQLiteSecureObjectStore.open(path, create=True)
    assert _schema_of(path) == []
    monkeypatch.undo()
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        assert store.has_records() is False


def _snapshot(path: Path) -> tuple[object, ...]:
    """Return the file's schema, version and rows, read with plain sqlite3."""
    tables = (
        "records",
        "record_labels",
        "record_tags",
        "ledger_events",
        "ledger_streams",
        "seal_counters",
    )
    rows = [_raw(path, f"SELECT * FROM {table} ORDER BY 1, 2") for table in tables]  # noqa: S608
    return (_schema_of(path), _raw(path, "PRAGMA user_version"), *rows)


def test_failed_upgrade_leaves_a_baseline_file_as_it_was(tmp_path: Path, monkeypatch) -> None:
    """A next step that fails rolls back to the baseline, data intact; the next open upgrades it."""
    path = tmp_path / "data" / "store.db"
    _baseline_store(path)
    before = _snapshot(path)
    broken = (*SYNTHETIC_STEP, "CREATE TABLE broken (")
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, broken))
    with pytest.raises(StoreUnavailable):
        SQLiteSecureObjectStore.open(path, create=True)
    assert _snapshot(path) == before
    monkeypatch.undo()
    _with_next_version(monkeypatch)
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        assert_baseline_reads_back(store)
    assert _raw(path, "PRAGMA user_version") == [(NEXT,)]


def test_concurrent_first_opens_migrate_once(tmp_path: Path) -> None:
    """Stores opening one new file at the same moment all succeed on a single schema."""
    path = tmp_path / "data" / "store.db"
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_and_close() -> None:
        barrier.wait()
        try:
            SQLiteSecureObjectStore.open(path, create=True).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_and_close) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    fresh = tmp_path / "fresh" / "store.db"
    SQLiteSecureObjectStore.open(fresh, create=True).close()
    assert _schema_of(path) == _schema_of(fresh)
