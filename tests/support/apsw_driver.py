"""The SQLite adapter over APSW, with a file layer that can lose or fail writes.

Fault-injection plumbing for the power-loss and I/O-error families. The
adapter is the real one (its pragmas, transactions, guards and error
translation all run); only its ``connect`` is pointed at APSW, whose
bundled SQLite lets a Python VFS sit under every read, write, sync and
truncate of the database and its write-ahead log.

Three pieces:

- ``ApswConnection``: an ``apsw.Connection`` shaped like the part of
  ``sqlite3.Connection`` the adapter uses (``execute(...).fetchall()``,
  ``fetchone()``, ``executemany``, ``in_transaction``, ``close``). APSW
  exceptions are re-raised as the ``sqlite3`` exception class the stdlib
  would raise for the same result code, with ``sqlite_errorcode`` and
  ``sqlite_errorname`` set, so the adapter's own translation decides what
  the caller sees.
- ``adapter_over(vfs)``: points the adapter's ``connect`` at APSW and that
  VFS for the length of a ``with`` block (readers open lazily, so the block
  must span the store's whole life), and restores it afterwards.
- ``FaultVFS``: a VFS over the default one. With ``volatile=True`` it keeps
  every write and truncate of the database, its log and its journal in
  process memory until ``xSync`` of that file, the way an operating
  system's page cache does; reads and sizes see the pending state. ``cut()``
  is the power loss: pending data is dropped (``restart`` may let a random
  subset of it reach the disk first, as write-back before the loss would)
  and every later call on the old connections fails. Armed with a
  ``FaultPlan`` it fails, lies about, or cuts at the k-th write, sync or
  truncate (counted together, in call order) while the plan is armed.

What is and is not simulated:

- The ``-shm`` wal-index is not buffered: APSW hands the shared-memory
  methods straight to the default VFS, which maps the real file. That is
  faithful: after a crash the first connection to open the database finds
  no other holder of the dead-man lock, truncates the ``-shm`` and rebuilds
  it from the log, so whatever a cut leaves in it is never trusted. All
  old connections are closed before the database is reopened, so that
  reopening is such a first open.
- ``xSync`` writes the pending data to the real file but does not call the
  real ``fsync`` unless ``real_sync=True``: the real disk's durability is not
  what is under test (the machine running the tests never loses power),
  and a real flush per commit would cost the budget many times over.
- Creating and deleting files is immediate and durable; temporary files
  (no name, or not the database, its log or its journal) pass straight
  through and are not counted.
"""

from __future__ import annotations

import contextlib
import enum
import os
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import apsw

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite import _store as sqlite_store
from flowvault.adapters.sqlite._connect import ConnectOptions, Synchronous

# -- the connection shim ---------------------------------------------------------

_OPERATIONAL: Final = frozenset(
    {
        apsw.SQLITE_ERROR,
        apsw.SQLITE_PERM,
        apsw.SQLITE_ABORT,
        apsw.SQLITE_BUSY,
        apsw.SQLITE_LOCKED,
        apsw.SQLITE_READONLY,
        apsw.SQLITE_INTERRUPT,
        apsw.SQLITE_IOERR,
        apsw.SQLITE_FULL,
        apsw.SQLITE_CANTOPEN,
        apsw.SQLITE_PROTOCOL,
        apsw.SQLITE_EMPTY,
        apsw.SQLITE_SCHEMA,
    }
)
_BY_PRIMARY: Final[dict[int, type[sqlite3.Error]]] = {
    apsw.SQLITE_INTERNAL: sqlite3.InternalError,
    apsw.SQLITE_NOTFOUND: sqlite3.InternalError,
    apsw.SQLITE_CORRUPT: sqlite3.DatabaseError,
    apsw.SQLITE_TOOBIG: sqlite3.DataError,
    apsw.SQLITE_CONSTRAINT: sqlite3.IntegrityError,
    apsw.SQLITE_MISMATCH: sqlite3.IntegrityError,
    apsw.SQLITE_MISUSE: sqlite3.InterfaceError,
    apsw.SQLITE_RANGE: sqlite3.InterfaceError,
    **dict.fromkeys(_OPERATIONAL, sqlite3.OperationalError),
}
"""The class CPython's ``sqlite3`` raises per primary result code (otherwise ``DatabaseError``)."""


def result_code(exc: BaseException) -> int | None:
    """Return the extended result code an APSW exception carries, or ``None``.

    Exceptions raised by SQLite carry ``extendedresult``; one a Python VFS
    raised carries what the VFS set; APSW's own (a closed connection, bad
    bindings) carry none.
    """
    for attribute in ("extendedresult", "result"):
        code = getattr(exc, attribute, None)
        if isinstance(code, int) and code >= 0:
            return code
    return None


def as_sqlite3_error(exc: apsw.Error) -> sqlite3.Error:
    """Return the ``sqlite3`` exception the stdlib driver would raise for ``exc``."""
    code = result_code(exc)
    if code is None:
        return sqlite3.ProgrammingError(f"{type(exc).__name__}: {exc}")
    kind = _BY_PRIMARY.get(code & 0xFF, sqlite3.DatabaseError)
    error = kind(str(exc))
    name = apsw.mapping_extended_result_codes.get(code) or apsw.mapping_result_codes.get(
        code & 0xFF, f"SQLITE_UNKNOWN_{code}"
    )
    error.sqlite_errorcode = code
    error.sqlite_errorname = str(name)
    return error


@contextlib.contextmanager
def _as_sqlite3() -> Iterator[None]:
    try:
        yield
    except apsw.Error as exc:
        raise as_sqlite3_error(exc) from exc


class Rows:
    """A finished statement's rows; fetched eagerly so no statement stays open."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Return every row, as plain tuples."""
        return list(self._rows)

    def fetchone(self) -> tuple[Any, ...] | None:
        """Return the first row, or ``None``."""
        return self._rows[0] if self._rows else None


class ApswConnection:
    """The subset of ``sqlite3.Connection`` the adapter uses, over an ``apsw.Connection``.

    APSW never opens a transaction on its own, which is the stdlib's
    ``isolation_level=None``: every transaction is explicit.
    """

    def __init__(self, connection: apsw.Connection) -> None:
        self._connection = connection
        self.text_factory: object = str
        """Accepted and ignored: APSW decodes TEXT as UTF-8 itself."""

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Rows:
        """Run one statement to completion and return its rows."""
        with _as_sqlite3():
            return Rows(list(self._connection.execute(sql, tuple(parameters) or None)))

    def executemany(self, sql: str, seq_of_parameters: Sequence[Sequence[Any]]) -> Rows:
        """Run one statement once per parameter row, to completion."""
        bindings = [tuple(row) for row in seq_of_parameters]
        if not bindings:
            return Rows([])
        with _as_sqlite3():
            return Rows(list(self._connection.executemany(sql, bindings)))

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        with _as_sqlite3():
            return bool(self._connection.in_transaction)

    def close(self) -> None:
        """Close, ignoring errors: after a cut the old connection can only be let go."""
        with contextlib.suppress(apsw.Error):
            self._connection.close(True)


def open_apsw(options: ConnectOptions, vfs: str) -> ApswConnection:
    """Open what ``_connect.connect`` would, through APSW and the VFS named ``vfs``."""
    with _as_sqlite3():
        if options.read_only:
            flags = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
            connection = apsw.Connection(options.uri(), flags=flags, vfs=vfs)
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
            connection = apsw.Connection(str(options.path), flags=flags, vfs=vfs)
        connection.set_busy_timeout(options.busy_timeout_ms)
    return ApswConnection(connection)


@contextlib.contextmanager
def adapter_over(vfs: str) -> Iterator[None]:
    """Make the SQLite adapter open every connection through APSW and ``vfs`` in the block."""
    original = sqlite_store.connect

    def connect(options: ConnectOptions) -> ApswConnection:
        return open_apsw(options, vfs)

    sqlite_store.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite_store.connect = original


def open_store(
    path: Path, vfs: str, *, synchronous: Synchronous = "full"
) -> SQLiteSecureObjectStore:
    """Open the real ``SQLiteSecureObjectStore`` at ``path``; call inside ``adapter_over(vfs)``."""
    return SQLiteSecureObjectStore.open(
        path, synchronous=synchronous, busy_timeout=5.0, create=True
    )


# -- the file layer -------------------------------------------------------------

_DURABLE: Final = apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_MAIN_JOURNAL
"""Files whose loss matters; temporary and statement files pass straight through."""

_IOERR: Final = {
    "read": apsw.SQLITE_IOERR_READ,
    "write": apsw.SQLITE_IOERR_WRITE,
    "sync": apsw.SQLITE_IOERR_FSYNC,
    "truncate": apsw.SQLITE_IOERR_TRUNCATE,
    "size": apsw.SQLITE_IOERR_FSTAT,
    "delete": apsw.SQLITE_IOERR_DELETE,
}


def io_error(kind: str, why: str) -> apsw.IOError:
    """Return the exception a VFS raises so SQLite sees ``SQLITE_IOERR_<kind>``."""
    error = apsw.IOError(f"injected {kind} failure ({why})")
    setattr(error, "extendedresult", _IOERR[kind])  # noqa: B010 - not in APSW's stubs
    return error


class Action(enum.Enum):
    """What happens at the planned call."""

    FAIL = "fail"
    """Raise an I/O error instead of doing the call."""
    LIE = "lie"
    """Report success without doing it (a sync drops the file's unsynced data)."""
    CUT = "cut"
    """Lose power just before the call: see ``FaultVFS.cut``."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Act at the ``at``-th (1-based) write, sync or truncate while armed."""

    at: int
    action: Action
    persistent: bool = False
    """With ``FAIL``, also fail every later write, sync or truncate until disarmed."""


@dataclass(slots=True)
class _Pending:
    """A file's writes and truncates since its last sync, oldest first."""

    size: int
    ops: list[tuple[int, bytes | None]] = field(default_factory=list)
    """``(offset, data)`` for a write, ``(size, None)`` for a truncate."""

    def write(self, offset: int, data: bytes) -> None:
        self.ops.append((offset, data))
        self.size = max(self.size, offset + len(data))

    def truncate(self, size: int) -> None:
        self.ops.append((size, None))
        self.size = size

    def overlay(self, base: bytes, offset: int, amount: int) -> bytes:
        """Return what a read sees: the file's bytes with the pending ops applied in order."""
        buffer = bytearray(amount)
        buffer[: len(base)] = base[:amount]
        end = offset + amount
        for position, data in self.ops:
            if data is None:
                if position < end:
                    start = max(position - offset, 0)
                    buffer[start:] = bytes(amount - start)
                continue
            low, high = max(position, offset), min(position + len(data), end)
            if low < high:
                buffer[low - offset : high - offset] = data[low - position : high - position]
        return bytes(buffer[: max(0, min(amount, self.size - offset))])


def _apply(path: str, ops: Sequence[tuple[int, bytes | None]], real_sync: bool) -> None:
    """Write ``ops`` to the real file; only while no connection has it open (POSIX locks)."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for position, data in ops:
            if data is None:
                os.ftruncate(descriptor, position)
            else:
                os.pwrite(descriptor, data, position)
        if real_sync:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


class FaultVFS(apsw.VFS):
    """A VFS over the default one that can hold writes until sync, cut power, or fail calls."""

    def __init__(self, name: str, *, volatile: bool, real_sync: bool = False) -> None:
        self.vfs_name = name
        self.volatile = volatile
        self.real_sync = real_sync
        self._lock = threading.RLock()
        self._pending: dict[str, _Pending] = {}
        self._frozen: dict[str, _Pending] = {}
        self._open: Counter[str] = Counter()
        self._dead = False
        self._plan: FaultPlan | None = None
        self.calls: list[str] = []
        """Kinds of the writes, syncs and truncates seen while armed, in order."""
        self.touched: list[tuple[str, str, int, int]] = []
        """The same calls as (kind, file name, offset written or 0, thread ident), in order."""
        self.fired = 0
        """How many calls the plan acted on."""
        self._armed = False
        super().__init__(name, "")

    # -- control ----------------------------------------------------------------

    def arm(self, plan: FaultPlan | None) -> None:
        """Start counting writes, syncs and truncates; act on the planned one (if any)."""
        with self._lock:
            self._plan = plan
            self.calls = []
            self.touched = []
            self.fired = 0
            self._armed = True

    def disarm(self) -> list[str]:
        """Stop counting and acting; return the kinds of the calls counted."""
        with self._lock:
            self._plan = None
            self._armed = False
            return list(self.calls)

    @property
    def dead(self) -> bool:
        """Whether power was cut and not yet restored."""
        return self._dead

    def cut(self) -> None:
        """Lose power: unsynced data is set aside and every later call on old handles fails."""
        with self._lock:
            self._dead = True
            for path, pending in self._pending.items():
                self._frozen.setdefault(path, _Pending(pending.size)).ops.extend(pending.ops)
            self._pending = {}

    def restart(self, rng: random.Random | None = None, survival: float = 0.0) -> int:
        """Power on after a cut, once every old handle is closed; return how many ops survived.

        Each unsynced write or truncate reaches the disk with probability
        ``survival`` (in its original order), as write-back may have flushed
        some of it before the loss; the rest is gone.
        """
        with self._lock:
            if self._open:
                raise RuntimeError(f"restart with handles still open: {dict(self._open)}")
            survived = 0
            for path, pending in self._frozen.items():
                kept = [op for op in pending.ops if rng is not None and rng.random() < survival]
                survived += len(kept)
                _apply(path, kept, self.real_sync)
            self._frozen = {}
            self._dead = False
            self._plan = None
            return survived

    def settle(self) -> None:
        """Write every pending op to disk, as an orderly shutdown would; no handle may be open."""
        with self._lock:
            if self._open:
                raise RuntimeError(f"settle with handles still open: {dict(self._open)}")
            for path, pending in self._pending.items():
                _apply(path, pending.ops, self.real_sync)
            self._pending = {}

    # -- hooks for the files ------------------------------------------------------

    def _check_alive(self, kind: str) -> None:
        if self._dead:
            raise io_error(kind, "power was cut")

    def _mutating(self, kind: str, path: str | None, offset: int = 0) -> bool:
        """Count a write, sync or truncate; return ``True`` when it must be skipped (a lie)."""
        with self._lock:
            self._check_alive(kind)
            if path is None or not self._armed:
                return False
            self.calls.append(kind)
            self.touched.append((kind, os.path.basename(path), offset, threading.get_ident()))
            plan, count = self._plan, len(self.calls)
            if plan is None or count < plan.at or (count > plan.at and not plan.persistent):
                return False
            if plan.action is not Action.FAIL and count > plan.at:
                return False
            self.fired += 1
            if plan.action is Action.LIE:
                return True
            if plan.action is Action.CUT:
                self.cut()
            raise io_error(kind, f"call {count}")

    def _pending_for(self, path: str) -> _Pending | None:
        return self._pending.get(path)

    # -- VFS methods --------------------------------------------------------------

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> apsw.VFSFile:
        """Open through the default VFS; track the database, its log and journal by path."""
        if self._dead:
            error = apsw.CantOpenError("power was cut")
            setattr(error, "extendedresult", apsw.SQLITE_CANTOPEN)  # noqa: B010 - as above
            raise error
        path = name.filename() if isinstance(name, apsw.URIFilename) else name
        tracked = path if path is not None and flags[0] & _DURABLE else None
        return FaultFile(self, name, tracked, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        """Delete at once (and durably); a dead machine deletes nothing."""
        with self._lock:
            self._check_alive("delete")
            self._pending.pop(filename, None)
        super().xDelete(filename, syncdir)

    def opened(self, path: str) -> None:
        """Count a handle on ``path``: nothing may touch the real file behind SQLite's back."""
        with self._lock:
            self._open[path] += 1

    def closed(self, path: str) -> None:
        """Forget a handle on ``path``."""
        with self._lock:
            self._open[path] -= 1
            if self._open[path] <= 0:
                del self._open[path]


class FaultFile(apsw.VFSFile):
    """One open file: reads see pending data; writes, syncs and truncates go through the plan."""

    def __init__(
        self,
        vfs: FaultVFS,
        name: str | apsw.URIFilename | None,
        path: str | None,
        flags: list[int],
    ) -> None:
        super().__init__("", name, flags)
        self._vfs = vfs
        self._path = path
        self._closed = False
        if path is not None:
            vfs.opened(path)

    def _volatile(self) -> bool:
        return self._vfs.volatile and self._path is not None

    def xRead(self, amount: int, offset: int) -> bytes:
        """Read the file as the page cache shows it: the disk with pending ops on top."""
        self._vfs._check_alive("read")
        base = super().xRead(amount, offset)
        if not self._volatile():
            return base
        with self._vfs._lock:
            pending = self._vfs._pending_for(self._path or "")
            return base if pending is None else pending.overlay(base, offset, amount)

    def xWrite(self, data: bytes, offset: int) -> None:
        """Write, into memory until the next sync when volatile."""
        if self._vfs._mutating("write", self._path, offset):
            return
        if not self._volatile():
            super().xWrite(data, offset)
            return
        with self._vfs._lock:
            self._pending_or_new().write(offset, bytes(data))

    def xTruncate(self, newsize: int) -> None:
        """Truncate, in memory until the next sync when volatile."""
        if self._vfs._mutating("truncate", self._path):
            return
        if not self._volatile():
            super().xTruncate(newsize)
            return
        with self._vfs._lock:
            self._pending_or_new().truncate(newsize)

    def xSync(self, flags: int) -> None:
        """Apply the file's pending ops to the real file (see the module docstring on fsync)."""
        lie = self._vfs._mutating("sync", self._path)
        if not self._volatile():
            if not lie and self._vfs.real_sync:
                super().xSync(flags)
            return
        with self._vfs._lock:
            pending = self._vfs._pending.pop(self._path or "", None)
            if lie or pending is None:
                return
            for position, data in pending.ops:
                if data is None:
                    super().xTruncate(position)
                else:
                    super().xWrite(data, position)
        if self._vfs.real_sync:
            super().xSync(flags)

    def xFileSize(self) -> int:
        """Return the size the page cache shows."""
        self._vfs._check_alive("size")
        if self._volatile():
            with self._vfs._lock:
                pending = self._vfs._pending_for(self._path or "")
                if pending is not None:
                    return pending.size
        return int(super().xFileSize())

    def xClose(self) -> None:
        """Close the real handle; pending data stays, as it would in the page cache."""
        if not self._closed:
            self._closed = True
            if self._path is not None:
                self._vfs.closed(self._path)
        super().xClose()

    def _pending_or_new(self) -> _Pending:
        path = self._path or ""
        pending = self._vfs._pending_for(path)
        if pending is None:
            pending = _Pending(int(super().xFileSize()))
            self._vfs._pending[path] = pending
        return pending


@contextlib.contextmanager
def registered(name: str, *, volatile: bool, real_sync: bool = False) -> Iterator[FaultVFS]:
    """Register a ``FaultVFS`` for the block and unregister it afterwards."""
    vfs = FaultVFS(name, volatile=volatile, real_sync=real_sync)
    try:
        yield vfs
    finally:
        vfs.unregister()


def integrity_check(path: Path) -> list[str]:
    """Return ``PRAGMA integrity_check``'s findings via the stdlib driver (``["ok"]`` if sound)."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        try:
            rows = connection.execute("PRAGMA integrity_check").fetchall()
        except sqlite3.DatabaseError as exc:
            return [f"{type(exc).__name__}: {exc}"]
    return [str(row[0]) for row in rows]
