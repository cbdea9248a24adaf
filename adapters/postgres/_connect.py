"""The connection pool, and the session settings every pooled connection gets.

A shared server may default to ``synchronous_commit = off``, to another
isolation level or to no timeouts at all; each new session sets what this
adapter relies on itself, so no role or database default can weaken it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import psycopg
from psycopg import IsolationLevel
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from flowvault.adapters.postgres._errors import Target, Timeouts, unreachable
from flowvault.domain import InvalidInput, StoreUnavailable

Connection: TypeAlias = psycopg.Connection[TupleRow]
Pool: TypeAlias = ConnectionPool[Connection]

SCHEMA_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
"""Lower-case, unquoted-safe identifiers; PostgreSQL reserves the ``pg_`` prefix."""
MAX_POOL_SIZE: Final = 100
MAX_SECONDS: Final = 3600.0
LIBPQ_MIN_CONNECT_S: Final = 2
"""libpq's connect_timeout is whole seconds and never below 2."""
APPLICATION_NAME: Final = "flowvault"
"""How the adapter's sessions show in ``pg_stat_activity``."""

_CONFIGURE: Final = (
    "SELECT set_config('search_path', %s, false), "
    "set_config('synchronous_commit', 'on', false), "
    "set_config('statement_timeout', %s, false), "
    "set_config('lock_timeout', %s, false)"
)


def check_schema_name(schema: object) -> str:
    """Return ``schema`` if it is a name the adapter will create and quote safely."""
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema) or schema.startswith("pg_"):
        raise InvalidInput(
            "the schema name must be 1..63 of [a-z0-9_], start with a letter or "
            "underscore, and not start with pg_"
        )
    return schema


def server_target(dsn: str) -> tuple[str, str, str]:
    """Return the host, port and database ``dsn`` reaches, as libpq fills them in.

    What stays the same when the store is restored from a dump: it names
    the store apart from the schema, and holds no password. Where the DSN
    is silent, libpq's environment (``PGHOST``, ``PGPORT``, ``PGDATABASE``,
    ``PGUSER``) and its defaults fill in, and a host name is compared
    without case, so ``db`` and ``DB:5432`` name one server; two different
    names for one server (an alias, an address) still name two.
    """
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        raise InvalidInput("the PostgreSQL DSN is not a valid connection string") from None

    def given(name: str, variable: str) -> str:
        return str(parts.get(name) or os.environ.get(variable) or "")

    host = given("host", "PGHOST").lower()
    port = given("port", "PGPORT") or "5432"
    dbname = given("dbname", "PGDATABASE") or given("user", "PGUSER")
    return host, port, dbname


def _check_seconds(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number of seconds")
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise InvalidInput(f"{name} must be more than 0 and at most {MAX_SECONDS:g} seconds")


def _milliseconds(seconds: float) -> int:
    """Round to whole milliseconds, never down to 0 (which PostgreSQL reads as no limit)."""
    return max(1, round(seconds * 1000))


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """Where the server is and how every session to it is configured.

    The DSN can hold a password, so it is kept out of ``repr`` and never put
    into a message.
    """

    dsn: str = field(repr=False)
    schema: str
    pool_size: int
    statement_timeout: float
    lock_timeout: float
    connect_timeout: float
    application_name: str = APPLICATION_NAME

    def __post_init__(self) -> None:
        check_schema_name(self.schema)
        size: object = self.pool_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_POOL_SIZE:
            raise InvalidInput(f"the pool size must be an integer from 1 to {MAX_POOL_SIZE}")
        _check_seconds(self.statement_timeout, "statement_timeout")
        _check_seconds(self.lock_timeout, "lock_timeout")
        _check_seconds(self.connect_timeout, "connect_timeout")
        if not isinstance(self.dsn, str):
            raise InvalidInput("the PostgreSQL DSN must be a string")
        try:
            conninfo_to_dict(self.dsn)
        except psycopg.Error:
            raise InvalidInput("the PostgreSQL DSN is not a valid connection string") from None

    @property
    def timeouts(self) -> Timeouts:
        """The session timeouts in milliseconds, as PostgreSQL takes them."""
        return Timeouts(
            statement_ms=_milliseconds(self.statement_timeout),
            lock_ms=_milliseconds(self.lock_timeout),
        )

    @property
    def libpq_connect_timeout(self) -> int:
        """``connect_timeout`` as libpq takes it: whole seconds, rounded up, at least 2."""
        return max(LIBPQ_MIN_CONNECT_S, math.ceil(self.connect_timeout))

    @property
    def connection_kwargs(self) -> dict[str, Any]:
        """What every connection is opened with, the probe's and the pool's alike."""
        return {
            "autocommit": True,
            "application_name": self.application_name,
            "connect_timeout": self.libpq_connect_timeout,
        }

    @property
    def search_path(self) -> str:
        """Only the adapter's schema, with temporary tables last so none can shadow a table."""
        return f'"{self.schema}", pg_temp'

    def configure(self, connection: Connection) -> None:
        """Set up one new pooled session (the pool's ``configure`` callback)."""
        connection.isolation_level = IsolationLevel.READ_COMMITTED
        timeouts = self.timeouts
        connection.execute(
            _CONFIGURE, (self.search_path, str(timeouts.statement_ms), str(timeouts.lock_ms))
        )


def check_encoding(connection: Connection) -> None:
    """Refuse a database whose text is not UTF-8: namespaces and labels are Unicode."""
    row = connection.execute("SELECT current_setting('server_encoding')").fetchone()
    encoding = None if row is None else row[0]
    if encoding != "UTF8":
        raise StoreUnavailable(
            f"the database encoding is {encoding}; flowvault needs a UTF8 database",
            encoding=str(encoding),
        )


def probe(options: ConnectOptions) -> None:
    """Make one connection and close it, or raise ``StoreUnavailable`` naming why not.

    The pool retries a failing connection attempt with back-off, and logs
    each, until its own timeout: a wrong database name or a refused port
    would surface only then, as a pool timeout that names no cause. One
    direct attempt first fails at once with the server's reason, or after
    ``connect_timeout`` when nothing answers.
    """
    try:
        psycopg.connect(options.dsn, **options.connection_kwargs).close()
    except psycopg.Error as exc:
        target = Target.of(exc, options.dsn, options.libpq_connect_timeout)
        raise unreachable(exc, target) from exc


def make_pool(options: ConnectOptions) -> Pool:
    """Build the pool, not yet open: fixed size, every new session configured.

    Connections are not checked by the pool itself: its check loop sleeps
    a growing back-off after each dead connection it meets, so after a
    server restart a pool of several dead connections would stall a caller
    for seconds. The store checks the connection it borrows instead, and on
    the first dead one sweeps them all (``ConnectionPool.check``).
    """
    pool: Pool = ConnectionPool(
        options.dsn,
        kwargs=options.connection_kwargs,
        min_size=options.pool_size,
        max_size=options.pool_size,
        open=False,
        configure=options.configure,
        timeout=options.connect_timeout,
        name=f"flowvault:{options.schema}",
    )
    return pool


def alive(connection: Connection) -> bool:
    """Return whether a pooled connection still answers (one empty round trip)."""
    try:
        ConnectionPool.check_connection(connection)
    except psycopg.OperationalError:
        return False
    return True
