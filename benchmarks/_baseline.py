"""The raw baselines: what the same disk or server does with no flowvault in the way.

Each ratio in the report divides a flowvault rate by one of these, measured
in the same run, so the figures say what flowvault costs on top of its
storage engine rather than how fast the machine happened to be.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from _harness import Recorder, Sample

if TYPE_CHECKING:
    import psycopg

PAYLOAD_BYTES: Final = 500
"""About the size of a sealed workflow record's payload."""

BUSY_TIMEOUT: Final = 30.0
RAW_TABLE: Final = "bench_raw"
CONNECT_TIMEOUT: Final = 5


class RawDatabase(Protocol):
    """A baseline database: single-row write transactions and primary-key reads."""

    def write_sample(self, ops: int, row: int | None = None) -> Sample:
        """Run ``ops`` one-row UPDATE transactions (on ``row``, or on random rows)."""
        ...

    def read_sample(self, ops: int) -> Sample:
        """Run ``ops`` primary-key SELECTs of random rows."""
        ...

    def close(self) -> None:
        """Close the connections."""
        ...


def _rng(seed: int | None) -> random.Random:
    return random.Random(seed)  # noqa: S311 - picks rows to touch, not secrets


def _sqlite_connect(path: Path) -> sqlite3.Connection:
    """Autocommit connection in WAL mode with ``synchronous=FULL``, as flowvault's writer."""
    connection = sqlite3.connect(
        path, isolation_level=None, timeout=BUSY_TIMEOUT, check_same_thread=False
    )
    mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    connection.execute("PRAGMA synchronous=FULL")
    level = connection.execute("PRAGMA synchronous").fetchone()[0]
    if mode != "wal" or level != 2:
        connection.close()
        raise RuntimeError(f"raw SQLite baseline is not WAL/FULL ({mode}, {level})")
    return connection


class RawSqlite:
    """The stdlib ``sqlite3`` baseline on one long-lived connection.

    Writes take the write lock with ``BEGIN IMMEDIATE``, as flowvault's
    commits do, so concurrent processes queue on the busy timeout in both.
    """

    def __init__(self, path: Path, *, seed: int | None = None) -> None:
        self._connection = _sqlite_connect(path)
        count = self._connection.execute("SELECT count(*) FROM t").fetchone()[0]
        self._rows = int(count)
        self._random = _rng(seed)

    @staticmethod
    def create(path: Path, rows: int) -> None:
        """Create the table with ``rows`` rows of a ~500-byte blob, in one transaction."""
        connection = _sqlite_connect(path)
        try:
            connection.execute(
                "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v INTEGER, payload BLOB)"
            )
            connection.execute("BEGIN IMMEDIATE")
            connection.executemany(
                "INSERT OR REPLACE INTO t (id, v, payload) VALUES (?, 0, ?)",
                ((n, os.urandom(PAYLOAD_BYTES)) for n in range(rows)),
            )
            connection.execute("COMMIT")
        finally:
            connection.close()

    def write_sample(self, ops: int, row: int | None = None) -> Sample:
        """Run ``ops`` transactions of one single-row UPDATE each."""
        execute = self._connection.execute
        recorder = Recorder()
        for n in range(ops):
            target = self._random.randrange(self._rows) if row is None else row
            started = time.perf_counter()
            try:
                execute("BEGIN IMMEDIATE")
                execute("UPDATE t SET v=? WHERE id=?", (n, target))
                execute("COMMIT")
            except sqlite3.Error:
                recorder.errors += 1
                if self._connection.in_transaction:
                    execute("ROLLBACK")
                continue
            recorder.record(started)
        return recorder.sample()

    def read_sample(self, ops: int) -> Sample:
        """Run ``ops`` reads of a random row's blob."""
        execute = self._connection.execute
        recorder = Recorder()
        for _ in range(ops):
            target = self._random.randrange(self._rows)
            started = time.perf_counter()
            found = execute("SELECT payload FROM t WHERE id=?", (target,)).fetchone()
            if found is None or len(found[0]) != PAYLOAD_BYTES:
                recorder.errors += 1
                continue
            recorder.record(started)
        return recorder.sample()

    def close(self) -> None:
        """Close the connection."""
        self._connection.close()


def postgres_unreachable(dsn: str) -> str | None:
    """Return in one line why the server at ``dsn`` cannot be used, or ``None``."""
    try:
        import psycopg  # noqa: PLC0415 - only the PostgreSQL scenarios need the extra
    except ImportError:
        return "psycopg is not installed (the postgres extra)"
    try:
        with psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


def _pg_connect(dsn: str, *, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
    import psycopg  # noqa: PLC0415

    return psycopg.connect(
        dsn,
        autocommit=autocommit,
        connect_timeout=CONNECT_TIMEOUT,
        application_name="flowvault-bench-raw",
    )


def postgres_server_version(dsn: str) -> str:
    """Return the server's version string, for the report's metadata."""
    with _pg_connect(dsn, autocommit=True) as connection:
        found = connection.execute("SHOW server_version").fetchone()
    return "" if found is None else str(found[0])


def schema_exists(dsn: str, schema: str) -> bool:
    """Whether ``schema`` exists; the runner refuses to reuse (and later drop) one."""
    with _pg_connect(dsn, autocommit=True) as connection:
        found = connection.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    return found is not None


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a schema the runner created, with everything in it."""
    from psycopg import sql  # noqa: PLC0415

    with _pg_connect(dsn, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


class RawPostgres:
    """The psycopg baseline: one connection for write transactions, one for reads.

    Writes run with autocommit off and an explicit commit per UPDATE, so
    each is one durable transaction; reads use an autocommit connection so
    no transaction stays open between them.
    """

    def __init__(self, dsn: str, schema: str, *, seed: int | None = None) -> None:
        from psycopg import sql  # noqa: PLC0415

        table = sql.Identifier(schema, RAW_TABLE)
        self._update = sql.SQL("UPDATE {} SET v = %s WHERE id = %s").format(table)
        self._select = sql.SQL("SELECT payload FROM {} WHERE id = %s").format(table)
        self._writer = _pg_connect(dsn, autocommit=False)
        self._reader = _pg_connect(dsn, autocommit=True)
        count = self._reader.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
        self._rows = 0 if count is None else int(str(count[0]))
        self._random = _rng(seed)

    @staticmethod
    def create(dsn: str, schema: str, rows: int) -> None:
        """Create the baseline table in ``schema`` with ``rows`` rows of a ~500-byte blob."""
        from psycopg import sql  # noqa: PLC0415

        table = sql.Identifier(schema, RAW_TABLE)
        with _pg_connect(dsn, autocommit=False) as connection:
            connection.execute(
                sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, v bigint, payload bytea)").format(
                    table
                )
            )
            with connection.cursor() as cursor:
                cursor.executemany(
                    sql.SQL("INSERT INTO {} (id, v, payload) VALUES (%s, 0, %s)").format(table),
                    [(n, os.urandom(PAYLOAD_BYTES)) for n in range(rows)],
                )
            connection.commit()

    def write_sample(self, ops: int, row: int | None = None) -> Sample:
        """Run ``ops`` transactions of one single-row UPDATE each."""
        import psycopg  # noqa: PLC0415

        recorder = Recorder()
        for n in range(ops):
            target = self._random.randrange(self._rows) if row is None else row
            started = time.perf_counter()
            try:
                self._writer.execute(self._update, (n, target))
                self._writer.commit()
            except psycopg.Error:
                recorder.errors += 1
                self._writer.rollback()
                continue
            recorder.record(started)
        return recorder.sample()

    def read_sample(self, ops: int) -> Sample:
        """Run ``ops`` primary-key reads of a random row's blob."""
        recorder = Recorder()
        for _ in range(ops):
            target = self._random.randrange(self._rows)
            started = time.perf_counter()
            found = self._reader.execute(self._select, (target,)).fetchone()
            if found is None:
                recorder.errors += 1
                continue
            recorder.record(started)
        return recorder.sample()

    def close(self) -> None:
        """Close both connections."""
        self._writer.close()
        self._reader.close()


def open_raw(config: Mapping[str, object], *, seed: int | None = None) -> RawDatabase:
    """Open the baseline a worker process was configured with."""
    if config["kind"] == "sqlite":
        return RawSqlite(Path(str(config["path"])), seed=seed)
    return RawPostgres(str(config["dsn"]), str(config["schema"]), seed=seed)
