"""The PostgreSQL adapter: one schema of a shared database, reached through a connection pool."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import psycopg

from flowvault.adapters._rows import (
    require_seal_count,
    require_text,
    stored_epoch,
    stream_state,
)
from flowvault.adapters._sql_store import Dialect, SqlStore, ledger_page, ledger_start
from flowvault.adapters.postgres import _queries as sql
from flowvault.adapters.postgres._commit import PreparedUnit, add, fill
from flowvault.adapters.postgres._connect import (
    APPLICATION_NAME,
    Connection,
    ConnectOptions,
    Pool,
    alive,
    check_encoding,
    make_pool,
    probe,
)
from flowvault.adapters.postgres._errors import RETRYABLE, translated
from flowvault.adapters.postgres._rows import metadata_from_row, record_from_row
from flowvault.adapters.postgres._schema import prepare_schema
from flowvault.application import (
    LedgerPage,
    StoreContents,
    UnitOfWork,
)
from flowvault.application import _observability as observe
from flowvault.domain import RevisionConflict, StoreUnavailable

T = TypeVar("T")

ATTEMPTS: Final = 5
"""How often a transaction is run when PostgreSQL reports a serialization failure or deadlock."""
LOSS_RERUNS: Final = 1
"""How often work whose connection was lost before ``COMMIT`` is run again, at once."""
_BACKOFF_BASE: Final = 0.005
_BACKOFF_CAP: Final = 0.25
_jitter = random.SystemRandom()


def _pause(attempt: int) -> None:
    """Sleep a random time below an exponentially growing cap, so retries do not collide again."""
    time.sleep(_jitter.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt)))


def _retryable(exc: psycopg.Error) -> bool:
    return getattr(exc, "sqlstate", None) in RETRYABLE


class PostgresSecureObjectStore(SqlStore):
    """``SecureObjectStore`` over one schema of a PostgreSQL database.

    Also ``StoreStats``, ``Compactor``, ``SealCounter``, ``StoreEpoch``,
    ``RecordLock``, ``StoreFill``, ``LabelListing`` and ``BatchLoad``.
    Several hosts may open the same schema at once: every unit of work is one
    READ COMMITTED transaction whose guards sit in the ``WHERE`` clauses of
    its writes, and ledger appends lock the stream's head row, so no update
    is lost and no stream forks. Serialization failures and deadlocks re-run
    the whole transaction a few times with jittered back-off. A store does
    not survive ``fork``: a child process must open its own.
    """

    dialect = Dialect(sql, record_from_row, metadata_from_row)

    def __init__(self, options: ConnectOptions, pool: Pool) -> None:
        self._options = options
        self._timeouts = options.timeouts
        self._pool = pool
        self._pid = os.getpid()
        self._closed = False
        self._held = threading.local()

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        schema: str = "flowvault",
        pool_size: int = 4,
        statement_timeout: float = 30.0,
        lock_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        application_name: str = APPLICATION_NAME,
        create: bool = False,
    ) -> PostgresSecureObjectStore:
        """Connect, then migrate ``schema`` as needed; create it only with ``create``.

        Without ``create`` a schema holding no flowvault tables is
        ``NotFound`` and nothing is written: a misspelt schema never
        becomes a new, empty store.

        ``statement_timeout`` and ``lock_timeout`` bound every statement and
        every lock wait; ``connect_timeout`` bounds each connection attempt
        (in whole seconds, at least 2, as libpq counts it) and the wait for
        a pooled connection, at open and on every call. A server that
        cannot be reached fails at once, or once the attempt times out,
        with a message naming the cause (``details["cause"]``) and
        ``details["fix"]``.

        Raises:
            InvalidInput: an option is out of range or the DSN is malformed.
            SchemaTooNew: a newer flowvault wrote the schema; it is left untouched.
            StoreUnavailable: the server cannot be reached or the schema set up.
            StoreBusy: the server held a lock past a timeout.
            NotFound: the schema holds no store and ``create`` is false.

        """
        options = ConnectOptions(
            dsn,
            schema,
            pool_size,
            statement_timeout,
            lock_timeout,
            connect_timeout,
            application_name,
        )
        probe(options)
        pool = make_pool(options)
        try:
            with translated(options.timeouts):
                pool.open(wait=True, timeout=options.connect_timeout)
                with pool.connection() as connection:
                    check_encoding(connection)
                    prepare_schema(connection, options.schema, create=create)
        except BaseException:
            pool.close()
            raise
        return cls(options, pool)

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding this store's tables."""
        return self._options.schema

    def __repr__(self) -> str:
        return f"PostgresSecureObjectStore(schema={self.schema!r})"

    # -- connections ----------------------------------------------------------

    @contextmanager
    def _borrow(self) -> Iterator[Connection]:
        """Lend a pooled connection that answered just now, or the one holding this thread's lock.

        A dead one (the server restarted, or ended the session) is dropped,
        and every idle connection is checked at once, so the next borrow
        gets a live or a new connection instead of the next dead one.
        """
        holding: Connection | None = getattr(self._held, "connection", None)
        if holding is not None:
            yield holding
            return
        for _ in range(self._options.pool_size + 1):
            with self._pool.connection() as connection:
                if alive(connection):
                    yield connection
                    return
            self._pool.check()
        raise StoreUnavailable("every database connection died as soon as it was made")

    def _run(self, work: Callable[[Connection], T], *, transaction: bool) -> T:
        """Run ``work`` on a live connection, in a transaction if asked; re-run on 40001/40P01.

        A statement outside a transaction is atomic on its own and sees one
        snapshot, so single-statement reads need no ``BEGIN``. Work whose
        connection is lost before ``COMMIT`` was sent is re-run once on
        another connection (``LOSS_RERUNS``): the server rolls back what the
        lost session did, so nothing can be applied twice. A loss during
        ``COMMIT`` is never re-run, nor one under ``record_locked``, whose
        lock went with the session.
        """
        self._check_usable()
        with translated(self._timeouts):
            attempt = 1
            reruns = 0
            while True:
                used: list[Connection] = []
                committing = False
                try:
                    with self._borrow() as connection:
                        used.append(connection)
                        if not transaction:
                            return work(connection)
                        with connection.transaction():
                            result = work(connection)
                            committing = True
                        return result
                except psycopg.Error as exc:
                    if reruns < LOSS_RERUNS and self._lost_uncommitted(used, committing):
                        reruns += 1
                        continue
                    if attempt >= ATTEMPTS or not _retryable(exc):
                        raise
                _pause(attempt)
                attempt += 1

    def _lost_uncommitted(self, used: Sequence[Connection], committing: bool) -> bool:
        """Return whether the run's own connection died before it could have committed."""
        holding = getattr(self._held, "connection", None) is not None
        return bool(used) and used[0].broken and not committing and not holding

    def _fetch(self, statement: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        return self._run(
            lambda connection: connection.execute(statement, params, binary=True).fetchall(),
            transaction=False,
        )

    # -- records --------------------------------------------------------------

    def commit(self, unit: UnitOfWork) -> None:
        """Apply every guarded write of ``unit`` in one READ COMMITTED transaction, or none.

        If the connection is lost before ``COMMIT`` was sent, the unit is
        run once more on another connection; the lost session's writes were
        rolled back, and the guards are checked again. If it is lost again,
        or while committing, ``StoreUnavailable`` is raised and the unit is
        either wholly applied or not at all; read back to learn which. A
        loss during ``COMMIT`` is never re-run, since a unit is not
        idempotent.
        """
        if unit.empty:
            self._check_usable()
            return
        started = time.perf_counter()
        prepared = PreparedUnit.build(unit)
        try:
            self._run(prepared.apply, transaction=True)
        except RevisionConflict as conflict:
            observe.revision_conflict("postgres", unit, conflict.details.get("guard"))
            raise
        observe.store_synced("postgres", 1)
        observe.unit_committed("postgres", unit, started)

    def fill(self, contents: StoreContents) -> None:
        """Write ``contents`` into this schema in one transaction, if it holds nothing.

        An interrupted fill (a lost connection, a killed process) is rolled
        back by the server, leaving the schema as empty as before.
        """
        self._run(lambda connection: fill(connection, contents), transaction=True)

    def add(self, contents: StoreContents) -> None:
        """Write ``contents`` next to this schema's rows in one transaction (see ``StoreFill``)."""
        self._run(lambda connection: add(connection, contents), transaction=True)

    @contextmanager
    def record_locked(self, namespace: str, key_digest: str) -> Iterator[None]:
        """Hold a session advisory lock on the record while the block runs.

        The lock's connection serves every call this thread makes inside
        the block, so a pool of one cannot starve it; a block inside it
        runs under the same lock. If the unlock fails the connection is
        closed, which ends its session and so its lock: a pooled session
        never keeps a lock nobody holds.
        """
        require_text(namespace, "namespace")
        require_text(key_digest, "key_digest")
        self._check_usable()
        if getattr(self._held, "connection", None) is not None:
            yield
            return
        name = f"flowvault:{self.schema}:{namespace}:{key_digest}"
        with self._borrow() as connection:
            with translated(self._timeouts):
                connection.execute(sql.LOCK_RECORD, (name,))
            self._held.connection = connection
            try:
                yield
            finally:
                self._held.connection = None
                try:
                    connection.execute(sql.UNLOCK_RECORD, (name,))
                except psycopg.Error:
                    connection.close()

    # -- ledger ---------------------------------------------------------------

    def _load_many_statement(
        self, namespace: str, names: Sequence[str]
    ) -> tuple[str, Sequence[object]]:
        return sql.LOAD_MANY, (namespace, list(names))

    def _head_indexes_statement(self, names: Sequence[str]) -> tuple[str, Sequence[object]]:
        return sql.LEDGER_HEAD_INDEXES, (names,)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Return retained events from ``from_index`` on, flagging trimmed ones.

        The stream's row and the page come from one statement, so one
        snapshot: the page must start at the row's first retained index and,
        when it is the last page, end at its head; anything else is
        ``IntegrityFailure`` (a cut-off, extended or edited stream).
        """
        start, limit = ledger_start(stream, from_index, limit)
        rows = self._fetch(sql.LEDGER_PAGE, (stream, stream, start, limit + 1))
        mark = None if rows[0][0] is None else stream_state(rows[0][:3])
        found = [row[3:] for row in rows if row[3] is not None]
        return ledger_page(mark, found, from_index, limit)

    # -- stats ----------------------------------------------------------------

    def compact(self) -> bool:
        """Return ``True``: there is nothing this adapter can do that PostgreSQL does not.

        Deleted and overwritten rows are dead tuples under MVCC; autovacuum
        (or an operator's ``VACUUM``) makes their space reusable, and no
        session command zeroes them or the WAL and backups that hold copies.
        Vacuuming is an operator job, on the server's schedule, not part of
        a unit of work; payloads are sealed, so stale copies stay ciphertext.
        """
        self._check_usable()
        return True

    # -- seal counts ----------------------------------------------------------

    def reserve_seals(self, key_id: str, count: int) -> int:
        """Add ``count`` to ``key_id``'s counter in one statement and transaction of its own.

        Errors map as a commit's do, and a serialization failure or deadlock
        re-runs it, which is safe because the failed run was rolled back, as
        does a connection lost before ``COMMIT``. A connection lost while
        committing raises ``StoreUnavailable`` without re-running: the
        reservation may have landed, which only over-counts.
        """
        require_text(key_id, "key_id")
        require_seal_count(count)
        rows = self._run(
            lambda connection: connection.execute(sql.RESERVE_SEALS, (key_id, count)).fetchall(),
            transaction=True,
        )
        total: int = rows[0][0]
        return total

    # -- epoch ----------------------------------------------------------------

    def epoch(self) -> int:
        """Return the schema's commit count: the ``store_epoch`` sequence's last value.

        Every committing unit calls ``nextval`` in its transaction; a unit
        that then fails or is re-run after a serialization failure may have
        raised it too, which the port allows.
        """
        return stored_epoch(self._fetch(sql.STORE_EPOCH, ()))

    # -- clock ----------------------------------------------------------------

    def store_now(self) -> datetime:
        """Return the server's clock in UTC, so every host judges run leases by one time."""
        moment: datetime = self._fetch(sql.STORE_NOW, ())[0][0]
        return moment.astimezone(UTC)

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Close the pool; later calls raise ``StoreUnavailable``.

        In a forked child it only marks the store closed: the inherited
        connections belong to the parent and are never touched.
        """
        if self._closed:
            return
        self._closed = True
        if os.getpid() == self._pid:
            self._pool.close()
