"""The SQLite adapter: one database file in WAL mode, shared by threads and processes."""

from __future__ import annotations

import builtins
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from flowvault.adapters._rows import (
    Row,
    require_seal_count,
    require_text,
    stored_epoch,
    stream_state,
)
from flowvault.adapters._sql_store import Dialect, SqlStore, ledger_page, ledger_start
from flowvault.adapters.sqlite import _queries as sql
from flowvault.adapters.sqlite._checkpointer import CHECKPOINT_PASSIVE, Checkpointer
from flowvault.adapters.sqlite._commit import (
    PreparedUnit,
    apply_writes,
    check_guards,
)
from flowvault.adapters.sqlite._connect import (
    ConnectOptions,
    Synchronous,
    check_sqlite_version,
    configure,
    connect,
    rollback_quietly,
    transaction,
)
from flowvault.adapters.sqlite._errors import translated, translated_error
from flowvault.adapters.sqlite._files import SIDECAR_SUFFIXES, prepare, secure_sidecars
from flowvault.adapters.sqlite._group import (
    CommitCounts,
    CommitQueue,
    Ticket,
    commit_group,
    fail_group,
)
from flowvault.adapters.sqlite._locks import begin_immediate, checkpoint_truncate
from flowvault.adapters.sqlite._rows import metadata_from_row, record_from_row
from flowvault.adapters.sqlite._schema import (
    ensure_current,
    ensure_supported,
    migrate,
    newest_version,
    user_version,
)
from flowvault.application import (
    LedgerPage,
    StoreContents,
    UnitOfWork,
)
from flowvault.application import _observability as observe
from flowvault.domain import (
    NotFound,
    RevisionConflict,
    StoreBusy,
    StoreNotEmpty,
    StoreUnavailable,
)

T = TypeVar("T")

_OPEN_RETRY_PAUSE = 0.01
"""Seconds between tries to open a file that other processes are creating or migrating.

Switching a new file to WAL and migrating it can report busy at once,
without SQLite's busy handler waiting, when several processes open a
fresh store together; opening retries until the busy timeout instead.
"""


class _Handle:
    """One connection and the lock that keeps it to one thread at a time."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        """Close the connection once, after any operation on it has finished."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.connection.close()


class _ReaderSlot:
    """Holds a thread's reader in thread-local storage; collected when the thread ends."""

    def __init__(self, handle: _Handle) -> None:
        self.handle = handle


def _open_writer(options: ConnectOptions) -> sqlite3.Connection:
    """Connect, refuse a newer schema before anything writes, then configure and migrate."""
    connection = connect(options)
    try:
        version = user_version(connection)
        ensure_supported(version)
        configure(connection, options)
        if version < newest_version():
            migrate(connection)
        secure_sidecars(options.path)
    except BaseException:
        connection.close()
        raise
    return connection


def _open_read_only(options: ConnectOptions) -> sqlite3.Connection:
    """Connect with ``mode=ro``, refuse any schema but the current one, set safe pragmas."""
    connection = connect(options)
    try:
        ensure_current(user_version(connection))
        configure(connection, options)
    except BaseException:
        connection.close()
        raise
    return connection


def _read_only_options(path: Path, synchronous: Synchronous, busy_timeout: float) -> ConnectOptions:
    """Options for a read-only open; ``immutable`` when no process has the file open.

    A ``mode=ro`` connection to a WAL database creates ``-wal`` and ``-shm``
    files when they are missing and leaves them behind. With neither file
    present no connection is open and the log is empty, so the file is read
    as immutable, which creates nothing.
    """
    if not path.is_file():
        raise StoreUnavailable(f"no database file at {path}", path=str(path))
    sidecars = any(path.with_name(path.name + suffix).exists() for suffix in SIDECAR_SUFFIXES)
    return ConnectOptions(path, synchronous, busy_timeout, read_only=True, immutable=not sidecars)


def _refuse_denied_file(path: Path, *, read_only: bool) -> None:
    """Name the database file this user may not open; SQLite would report only ``CANTOPEN``."""
    wanted = os.R_OK if read_only else os.R_OK | os.W_OK
    if path.is_file() and not os.access(path, wanted):
        raise StoreUnavailable(
            f"permission denied: {path}",
            path=str(path),
            fix=f"run flowvault as the owner of {path}, or give this user access to it "
            "(chown or chmod)",
        )


def _refuse_empty_file(path: Path) -> None:
    """Refuse a 0-byte file with no write-ahead log: SQLite would take it for an empty store.

    Opened as a store, such a file would be given a schema (and the caller
    a new key): a truncated copy or a ``touch`` would silently become a
    new, empty store in place of the data it stands for.
    """
    try:
        empty = path.stat().st_size == 0
        log = path.with_name(path.name + "-wal")
        empty = empty and (not log.exists() or log.stat().st_size == 0)
    except FileNotFoundError:
        return
    if empty:
        raise StoreUnavailable(
            f"{path} is an empty file, not a flowvault store",
            path=str(path),
            fix="an empty file is not a store: restore the database from a backup, "
            "or remove the file and run 'flowvault init'",
        )


class SQLiteSecureObjectStore(SqlStore):
    """``SecureObjectStore`` over one SQLite file in WAL mode.

    Also ``StoreStats``, ``SealCounter``, ``StoreEpoch``, ``StoreFill``,
    ``LabelListing`` and ``BatchLoad``. Commits go
    through a single writer connection under a lock, and take SQLite's write
    lock with ``BEGIN IMMEDIATE`` so other processes queue up to the busy
    timeout; each thread reads through its own connection, and in WAL mode
    reads never wait for writes. A store does not survive ``fork``:
    a child process must open its own.
    """

    dialect = Dialect(sql, record_from_row, metadata_from_row)

    def __init__(self, options: ConnectOptions, writer: sqlite3.Connection) -> None:
        self._options = options
        self._pid = os.getpid()
        self._writer = _Handle(writer)
        self._queue = CommitQueue()
        self._counts = CommitCounts()
        self._readers: set[_Handle] = set()
        self._registry = threading.Lock()
        self._local = threading.local()
        self._closed = False
        self._checkpointer = None if options.read_only else Checkpointer(self._checkpoint_passive)

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        synchronous: Synchronous = "full",
        busy_timeout: float = 30.0,
        allow_insecure_permissions: bool = False,
        read_only: bool = False,
        create: bool = False,
    ) -> SQLiteSecureObjectStore:
        """Open the store at ``path``, migrating it as needed; create it only with ``create``.

        Without ``create`` a missing file is ``NotFound`` and nothing is
        created, not even its directory: a mistyped path never becomes a
        new, empty store.

        With ``read_only`` the file is only read: nothing is created, no mode
        is changed or checked, nothing is migrated, and no pragma that writes
        is set, so a copy of a database can be audited without changing a
        byte of it (or its modification time). ``commit`` and ``compact``
        then raise ``StoreUnavailable``, as does ``reserve_seals``. A file with no ``-wal``/``-shm``
        beside it is read as immutable (see ``ConnectOptions.immutable``), so
        none are left behind; do not write to it meanwhile.

        Raises:
            InsecurePermissions: the directory or file is open to other users
                and ``allow_insecure_permissions`` is false.
            SchemaTooNew: a newer flowvault wrote the file; it is left untouched.
            StoreUnavailable: the file cannot be opened or configured as required,
                this user may not read (or write) it, or (without ``create``) it is
                empty: 0 bytes and no write-ahead log.
            StoreBusy: another process held the database past ``busy_timeout``.
            NotFound: no file at ``path`` and ``create`` is false (not read-only).
            StoreUnavailable (read-only): the file is missing, or its schema is
                older than this code's (it cannot be migrated read-only).

        """
        check_sqlite_version()
        _refuse_denied_file(Path(path), read_only=read_only)
        if not create:
            _refuse_empty_file(Path(path))
        if read_only:
            options = _read_only_options(Path(path), synchronous, busy_timeout)
        else:
            options = ConnectOptions(Path(path), synchronous, busy_timeout)
            if not create and not options.path.is_file():
                raise NotFound(
                    f"no flowvault store at {options.path}; create it with create=True",
                    path=str(options.path),
                )
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                with translated(busy_timeout):
                    if read_only:
                        return cls(options, _open_read_only(options))
                    prepare(options.path, allow_insecure=allow_insecure_permissions)
                    return cls(options, _open_writer(options))
            except StoreBusy:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(_OPEN_RETRY_PAUSE * (1 + random.random()))  # noqa: S311 - jitter only

    @property
    def path(self) -> Path:
        """The database file."""
        return self._options.path

    @property
    def read_only(self) -> bool:
        """Whether the store was opened read-only."""
        return self._options.read_only

    def __repr__(self) -> str:
        return f"SQLiteSecureObjectStore(path={str(self.path)!r})"

    # -- connections ----------------------------------------------------------

    def _check_writable(self) -> None:
        self._check_usable()
        if self._options.read_only:
            raise StoreUnavailable("read-only: this store was opened for reading only")

    def _reader(self) -> _Handle:
        slot: _ReaderSlot | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._open_reader()
        return slot.handle

    def _open_reader(self) -> _ReaderSlot:
        """Open this thread's reader, registered so ``close`` can reach it."""
        connection = connect(self._options)
        handle = _Handle(connection)
        try:
            configure(connection, self._options)
        except BaseException:
            handle.close()
            raise
        with self._registry:
            if self._closed:
                handle.close()
                raise StoreUnavailable("the store is closed")
            self._readers.add(handle)
        slot = _ReaderSlot(handle)
        weakref.finalize(slot, self._retire, handle)
        self._local.slot = slot
        return slot

    def _retire(self, handle: _Handle) -> None:
        """Close a finished thread's reader; in a forked child, leave inherited ones alone."""
        if os.getpid() != self._pid:
            return
        with self._registry:
            self._readers.discard(handle)
        handle.close()

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on the writer connection if no commit holds it, else on the thread's reader.

        In WAL mode a connection drops its page cache whenever another
        connection has written since its last read, so a reader that follows
        every commit re-reads each page from the file. The writer's cache
        stays valid across its own commits; borrowing it while it is idle
        makes a read-after-write (load, transition, load) hit that cache.
        Written flat rather than as a context manager: reads are the hot
        path of every load, and two generator-based context managers cost
        more than a one-row statement.
        """
        self._check_usable()
        try:
            if self._writer.lock.acquire(blocking=False):
                try:
                    self._check_usable()
                    return work(self._writer.connection)
                finally:
                    self._writer.lock.release()
            handle = self._reader()
            with handle.lock:
                self._check_usable()
                return work(handle.connection)
        except Exception as exc:
            error = translated_error(exc, self._options.busy_timeout)
            if error is None:
                raise
            raise error from exc

    def _fetch(self, statement: str, params: Sequence[object]) -> builtins.list[Row]:
        """Return the rows of one read statement, run as ``_read`` runs its work."""
        return self._read(lambda connection: connection.execute(statement, params).fetchall())

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        self._check_usable()
        with translated(self._options.busy_timeout), self._writer.lock:
            self._check_usable()
            yield self._writer.connection

    # -- records --------------------------------------------------------------

    def commit(self, unit: UnitOfWork) -> None:
        """Check every guard, then apply every write, in one ``BEGIN IMMEDIATE`` transaction.

        Units committed by several threads at once share one transaction and
        one sync (see ``_group``); each still stands or falls on its own
        guards, and returns only once its transaction is durable.
        Raises ``StoreUnavailable`` on a store opened read-only, even for an empty unit.
        """
        self._check_writable()
        if unit.empty:
            return
        started = time.perf_counter()
        ticket = Ticket(unit, PreparedUnit.build(unit))
        self._queue.put(ticket)
        with self._writer.lock:
            while not ticket.resolved:
                self._commit_next_group()
        try:
            ticket.settle()
        except RevisionConflict as conflict:
            observe.revision_conflict("sqlite", unit, conflict.details.get("guard"))
            raise
        observe.unit_committed("sqlite", unit, started)

    def _commit_next_group(self) -> None:
        """Commit the queued units (the caller holds the writer lock).

        Every ticket taken off the queue is resolved before this returns or
        raises, even if an interrupt lands between taking and committing;
        otherwise its caller would wait for a group that no one commits.
        """
        group = self._queue.take()
        try:
            self._check_usable()
            commit_group(
                self._writer.connection,
                group,
                check=check_guards,
                apply=apply_writes,
                busy_timeout=self._options.busy_timeout,
            )
            self._counts.add(group)
            observe.store_synced("sqlite", len(group))
            if self._checkpointer is not None:
                self._checkpointer.committed(len(group))
        except StoreUnavailable as exc:
            fail_group(group, exc)
        finally:
            if not all(ticket.resolved for ticket in group):
                fail_group(group, StoreUnavailable("the commit was interrupted before it began"))

    @property
    def queued_units(self) -> int:
        """Units waiting for the writer (group commit's queue), for monitoring."""
        return len(self._queue)

    @property
    def commit_counts(self) -> CommitCounts:
        """How many transactions committed how many units, and how many shared a transaction."""
        return replace(self._counts)

    # -- ledger ---------------------------------------------------------------

    def _head_indexes_statement(self, names: Sequence[str]) -> tuple[str, Sequence[object]]:
        return sql.ledger_head_indexes(len(names)), names

    def _load_many_statement(
        self, namespace: str, names: Sequence[str]
    ) -> tuple[str, Sequence[object]]:
        return sql.load_many(len(names)), (namespace, *names)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Return retained events from ``from_index`` on, flagging trimmed ones.

        The stream's retention mark and its events are read in one read
        transaction, so a concurrent trim cannot split them.
        """
        start, limit = ledger_start(stream, from_index, limit)

        def page(connection: sqlite3.Connection) -> tuple[builtins.list[Row], builtins.list[Row]]:
            with transaction(connection, "BEGIN"):
                state = connection.execute(sql.STREAM_STATE, (stream,)).fetchall()
                rows = connection.execute(sql.LEDGER_PAGE, (stream, start, limit + 1)).fetchall()
            return state, rows

        state, rows = self._read(page)
        return ledger_page(stream_state(state[0]) if state else None, rows, from_index, limit)

    # -- stats ----------------------------------------------------------------

    def _checkpoint_passive(self) -> None:
        """Copy what the log holds into the database on this thread's own connection.

        Never on the writer connection: the bulk of the copy runs while
        commits go on. But SQLite starts the log over only when a write
        begins with every frame copied, and under steady writes new frames
        always land during the copy, so the log would grow without bound.
        A second pass copies the few frames written meanwhile with this
        process's commits held off, so the next write starts the log over.
        """
        handle = self._reader()
        with translated(self._options.busy_timeout), handle.lock:
            self._check_usable()
            handle.connection.execute(CHECKPOINT_PASSIVE).fetchall()
        with self._writer.lock, translated(self._options.busy_timeout), handle.lock:
            self._check_usable()
            handle.connection.execute(CHECKPOINT_PASSIVE).fetchall()

    def compact(self) -> bool:
        """Checkpoint the WAL into the database and truncate it.

        With ``secure_delete`` on, deleted and overwritten rows are zeroed in
        the database pages; the truncate removes the old page images still
        held in the WAL. Costs in proportion to the WAL, not the database.
        Raises ``StoreUnavailable`` on a store opened read-only.
        """
        self._check_writable()
        with self._writing() as connection:
            return checkpoint_truncate(connection, self._options.busy_timeout)

    def vacuum(self) -> bool:
        """Rebuild the database file without free pages, then compact.

        ``secure_delete`` already zeroes freed rows; ``VACUUM`` also rewrites
        every page and gives free pages back to the file system, so the file
        shrinks and keeps no trace of an earlier layout. It rewrites the
        whole file and holds the write lock meanwhile, so only the explicit
        ``flowvault compact`` calls it. Raises ``StoreUnavailable`` on a
        store opened read-only, ``StoreBusy`` when writers kept it out.
        """
        self._check_writable()
        with self._writing() as connection:
            connection.execute(sql.VACUUM)
            return checkpoint_truncate(connection, self._options.busy_timeout)

    # -- seal counts ----------------------------------------------------------

    def reserve_seals(self, key_id: str, count: int) -> int:
        """Add ``count`` to ``key_id``'s counter in a transaction of its own; return the total.

        It holds the writer lock as a group commit does, so it never lands
        inside another unit's transaction and no unit's rollback undoes it;
        it is as durable as a commit when it returns. Raises
        ``StoreUnavailable`` on a store opened read-only.
        """
        require_text(key_id, "key_id")
        require_seal_count(count)
        self._check_writable()
        with self._writing() as connection:
            begin_immediate(connection, self._options.busy_timeout)
            try:
                connection.execute(sql.RESERVE_SEALS, (key_id, count))
                rows = connection.execute(sql.RESERVED_SEALS, (key_id,)).fetchall()
                connection.execute("COMMIT")
            except BaseException:
                rollback_quietly(connection)
                raise
        total: int = rows[0][0]
        return total

    # -- fill -----------------------------------------------------------------

    def fill(self, contents: StoreContents) -> None:
        """Write ``contents`` in one ``BEGIN IMMEDIATE`` transaction, if the file holds nothing.

        Records go in as ``Guard.ANY`` upserts (any revision lands in an
        empty table) and events as appends, through the same writes a
        commit applies; a trim then sets each stream's first retained
        index. An interrupted fill leaves the file as empty as before.
        Raises ``StoreUnavailable`` on a store opened read-only.
        """
        self._write_contents(contents, _holding_anything, (sql.SET_EPOCH, (contents.epoch,)))

    def add(self, contents: StoreContents) -> None:
        """Write ``contents`` next to the file's rows in one ``BEGIN IMMEDIATE`` transaction.

        The same writes as ``fill``; refused if one of its records or
        streams exists. Seal counts are added to, and the epoch raised once.
        """

        def overlapping(connection: sqlite3.Connection) -> str | None:
            held = any(
                connection.execute(sql.HAS_RECORD, (meta.namespace, meta.key_digest)).fetchall()
                for meta in (record.metadata for record in contents.records)
            ) or any(
                connection.execute(sql.HAS_STREAM, (name, name)).fetchall()
                for name in contents.streams()
            )
            return "the store already holds one of these records or streams" if held else None

        self._write_contents(contents, overlapping, (sql.RAISE_EPOCH, ()))

    def _write_contents(
        self,
        contents: StoreContents,
        refusal: Callable[[sqlite3.Connection], str | None],
        epoch: tuple[str, tuple[int, ...]],
    ) -> None:
        """Apply ``contents`` in one transaction unless ``refusal`` names what is in the way."""
        self._check_writable()
        prepared = PreparedUnit.build(contents.unit())
        counts = sorted(contents.seal_counts.items())
        with self._writing() as connection:
            begin_immediate(connection, self._options.busy_timeout)
            try:
                refused = refusal(connection)
                if refused is not None:
                    raise StoreNotEmpty(refused)
                apply_writes(connection, prepared)
                connection.executemany(sql.RESERVE_SEALS, counts)
                connection.execute(*epoch)
                connection.execute("COMMIT")
            except BaseException:
                rollback_quietly(connection)
                raise

    # -- epoch ----------------------------------------------------------------

    def epoch(self) -> int:
        """Return the commit count stored in the file; a read-only store answers too.

        Every transaction that commits a unit raises it once (see ``_group``),
        so a restored older copy of the file shows a lower count.
        """
        return stored_epoch(self._fetch(sql.STORE_EPOCH, ()))

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Close every connection; later calls raise ``StoreUnavailable``.

        In a forked child it only marks the store closed: the inherited
        connections belong to the parent and are never touched.
        """
        if os.getpid() != self._pid:
            self._closed = True
            return
        if self._checkpointer is not None:
            self._checkpointer.stop()
        with self._registry:
            if self._closed:
                return
            self._closed = True
            handles = [self._writer, *self._readers]
            self._readers.clear()
        for handle in handles:
            handle.close()


def _holding_anything(connection: sqlite3.Connection) -> str | None:
    """Refuse a fill of a file that holds a record or a seal count."""
    held = connection.execute(sql.HAS_RECORDS).fetchall()[0][0]
    if held or connection.execute(sql.SEAL_COUNTS).fetchall():
        return "the store already holds data"
    return None
