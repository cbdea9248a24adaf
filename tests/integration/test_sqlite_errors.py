"""Driver exceptions become flowvault errors by SQLite result code, never by message text."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flowvault.adapters.sqlite._errors import translate, translated
from flowvault.domain import (
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    StoreBusy,
    StoreUnavailable,
)

MARKER = "row-value-7f3a"


def _error(kind: type[sqlite3.Error], code: int | None, name: str | None) -> sqlite3.Error:
    """Build a driver exception whose text says one thing and whose code another."""
    exc = kind(f"database is locked near {MARKER!r}")
    if code is not None:
        exc.sqlite_errorcode = code
    if name is not None:
        exc.sqlite_errorname = name
    return exc


MAPPING = [
    (sqlite3.OperationalError, 5, "SQLITE_BUSY", StoreBusy),
    (sqlite3.OperationalError, 261, "SQLITE_BUSY_RECOVERY", StoreBusy),
    (sqlite3.OperationalError, 517, "SQLITE_BUSY_SNAPSHOT", StoreBusy),
    (sqlite3.OperationalError, 773, "SQLITE_BUSY_TIMEOUT", StoreBusy),
    (sqlite3.OperationalError, 6, "SQLITE_LOCKED", StoreBusy),
    (sqlite3.OperationalError, 262, "SQLITE_LOCKED_SHAREDCACHE", StoreBusy),
    (sqlite3.DatabaseError, 11, "SQLITE_CORRUPT", IntegrityFailure),
    (sqlite3.DatabaseError, 267, "SQLITE_CORRUPT_VTAB", IntegrityFailure),
    (sqlite3.DatabaseError, 26, "SQLITE_NOTADB", IntegrityFailure),
    (sqlite3.OperationalError, 10, "SQLITE_IOERR", StoreUnavailable),
    (sqlite3.OperationalError, 3338, "SQLITE_IOERR_FSYNC", StoreUnavailable),
    (sqlite3.OperationalError, 13, "SQLITE_FULL", StoreUnavailable),
    (sqlite3.OperationalError, 14, "SQLITE_CANTOPEN", StoreUnavailable),
    (sqlite3.OperationalError, 8, "SQLITE_READONLY", StoreUnavailable),
    (sqlite3.OperationalError, 1, "SQLITE_ERROR", StoreUnavailable),
    (sqlite3.IntegrityError, 2067, "SQLITE_CONSTRAINT_UNIQUE", StoreUnavailable),
    (sqlite3.DatabaseError, None, None, StoreUnavailable),
    (sqlite3.ProgrammingError, None, None, StoreUnavailable),
    (sqlite3.InterfaceError, None, None, StoreUnavailable),
]


@pytest.mark.parametrize(("kind", "code", "name", "expected"), MAPPING)
def test_result_codes_map_to_flowvault_errors(kind, code, name, expected) -> None:
    """Primary and extended codes decide the error class; the driver's text never does."""
    translated_error = translate(_error(kind, code, name), busy_timeout=2.5)
    assert type(translated_error) is expected
    assert MARKER not in str(translated_error)
    assert MARKER not in repr(translated_error)
    if name is not None:
        assert translated_error.details["code"] == name


def test_busy_message_names_the_timeout() -> None:
    """StoreBusy says how long the store waited."""
    busy = translate(_error(sqlite3.OperationalError, 5, "SQLITE_BUSY"), busy_timeout=0.2)
    assert busy.message == "database stayed locked past the busy timeout of 0.2 s"
    assert busy.details["busy_timeout_ms"] == 200


def test_translated_chains_the_driver_exception() -> None:
    """The flowvault error is raised from the original, so tracebacks keep the cause."""
    original = _error(sqlite3.OperationalError, 13, "SQLITE_FULL")
    with pytest.raises(StoreUnavailable) as caught, translated(30.0):
        raise original
    assert caught.value.__cause__ is original


def test_translated_leaves_flowvault_errors_alone() -> None:
    """Errors that are already flowvault's pass through unchanged."""
    mine = IntegrityFailure("stored row is malformed")
    with pytest.raises(IntegrityFailure) as caught, translated(30.0):
        raise mine
    assert caught.value is mine


def test_unencodable_text_is_invalid_input() -> None:
    """A lone surrogate cannot be bound to SQLite and is the caller's error, not the store's."""
    connection = sqlite3.connect(":memory:")
    with pytest.raises(InvalidInput), translated(30.0):
        connection.execute("SELECT ?", ("\ud800",))
    connection.close()


def test_real_closed_connection_is_unavailable() -> None:
    """The driver's ProgrammingError on a closed connection becomes StoreUnavailable."""
    connection = sqlite3.connect(":memory:")
    connection.close()
    with pytest.raises(StoreUnavailable), translated(30.0):
        connection.execute("SELECT 1")


def test_real_lock_contention_is_store_busy(tmp_path: Path) -> None:
    """A real SQLITE_BUSY from a second connection becomes StoreBusy."""
    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    waiter = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreBusy) as caught, translated(0):
            waiter.execute("SELECT * FROM sqlite_master").fetchall()
        assert isinstance(caught.value, FlowvaultError)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        waiter.close()
