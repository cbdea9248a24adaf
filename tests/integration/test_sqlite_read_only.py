"""``SQLiteSecureObjectStore.open(read_only=True)``: reads a database file and changes nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite._schema import SCHEMA_VERSION
from flowvault.application import StreamCatalog, UnitOfWork
from flowvault.application._streams import read_stream
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import IntegrityFailure, SchemaTooNew, StoreUnavailable
from flowvault.domain._ledger import verify_chain

NS = "read-only"


def _fingerprint(path: Path) -> tuple[str, int, int]:
    info = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), info.st_mtime_ns, info.st_mode


def _sidecars(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """Provide a closed store with records and a two-event stream, its WAL checkpointed away."""
    path = tmp_path / "data" / "store.db"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        first = make_event("s", 0)
        store.commit(
            UnitOfWork(
                upserts=[make_upsert(NS, "a"), make_upsert(NS, "b")],
                appends=[first, make_event("s", 1, first), make_event("t", 0)],
            )
        )
    assert _sidecars(path) == []
    return path


def test_reads_everything_and_changes_no_byte(database: Path) -> None:
    """Records, ledger and stream list read back; file bytes, mtime and mode are unchanged."""
    before = _fingerprint(database)
    with SQLiteSecureObjectStore.open(database, read_only=True) as store:
        assert store.read_only
        assert len(store.list(NS).items) == 2
        assert store.load(NS, store.list(NS).items[0].key_digest) is not None
        assert verify_chain(read_stream(store, "s")).ok
        assert isinstance(store, StreamCatalog)
        assert store.list_streams() == ["s", "t"]
        assert store.namespace_counts() == {NS: 2}
        assert store.epoch() == 1
    assert _fingerprint(database) == before
    assert _sidecars(database) == []


def test_writes_and_compaction_are_refused(database: Path) -> None:
    """``commit`` (even of an empty unit) and ``compact`` raise ``StoreUnavailable``."""
    before = _fingerprint(database)
    with SQLiteSecureObjectStore.open(database, read_only=True) as store:
        for unit in (UnitOfWork(), UnitOfWork(upserts=[make_upsert(NS, "c")])):
            with pytest.raises(StoreUnavailable, match="read-only"):
                store.commit(unit)
        with pytest.raises(StoreUnavailable, match="read-only"):
            store.compact()
    assert _fingerprint(database) == before


def test_missing_file_is_unavailable_and_nothing_is_created(tmp_path: Path) -> None:
    """No directory and no file appear for a read-only open of a missing database."""
    path = tmp_path / "absent" / "store.db"
    with pytest.raises(StoreUnavailable, match="no database file"):
        SQLiteSecureObjectStore.open(path, read_only=True)
    assert not path.parent.exists()


def test_modes_are_neither_checked_nor_changed(database: Path) -> None:
    """A copy readable by others opens read-only and keeps its mode (no chmod)."""
    database.chmod(0o644)
    database.parent.chmod(0o755)
    before = _fingerprint(database)
    with SQLiteSecureObjectStore.open(database, read_only=True) as store:
        assert store.list_streams() == ["s", "t"]
    assert _fingerprint(database) == before


def test_older_schema_is_refused_without_migrating(tmp_path: Path) -> None:
    """A file below the current schema is ``StoreUnavailable`` and stays as it was."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE before_any_migration (x)")  # user_version 0
    connection.close()
    before = _fingerprint(path)
    with pytest.raises(StoreUnavailable, match="older than"):
        SQLiteSecureObjectStore.open(path, read_only=True)
    assert _fingerprint(path) == before


def test_newer_schema_is_refused(database: Path) -> None:
    """A file written by a newer flowvault is ``SchemaTooNew``."""
    with sqlite3.connect(database) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    connection.close()
    with pytest.raises(SchemaTooNew):
        SQLiteSecureObjectStore.open(database, read_only=True)


def test_a_file_that_is_not_a_database_is_an_integrity_failure(tmp_path: Path) -> None:
    """Garbage is reported as damage, not as a crash."""
    path = tmp_path / "garbage.db"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(IntegrityFailure):
        SQLiteSecureObjectStore.open(path, read_only=True)


def test_reads_a_live_store_through_its_write_ahead_log(database: Path) -> None:
    """While a writer holds the file open, a reader sees its commits, old and new."""
    with SQLiteSecureObjectStore.open(database, create=True) as writer:
        writer.commit(UnitOfWork(upserts=[make_upsert(NS, "c")]))
        with SQLiteSecureObjectStore.open(database, read_only=True) as reader:
            assert reader.namespace_counts() == {NS: 3}
            assert reader.epoch() == 2
            writer.commit(UnitOfWork(upserts=[make_upsert(NS, "d")]))
            assert reader.namespace_counts() == {NS: 4}
            assert reader.epoch() == writer.epoch() == 3
            with pytest.raises(StoreUnavailable, match="read-only"):
                reader.commit(UnitOfWork(upserts=[make_upsert(NS, "e")]))
            assert reader.epoch() == 3
