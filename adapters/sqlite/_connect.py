"""Opening connections with the pragmas durability and safety rely on.

Every pragma is read back after it is set: compile-time defaults differ
between SQLite builds, and some settings (WAL on a network filesystem) can
be refused without an error.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TypeAlias
from urllib.parse import quote

from flowvault.domain import InvalidInput, StoreUnavailable

Synchronous: TypeAlias = Literal["full", "normal"]
"""``full`` syncs the log on every commit; ``normal`` may lose the last commits on power loss."""

_SYNCHRONOUS_LEVELS: Final = {"full": 2, "normal": 1}
MINIMUM_SQLITE: Final = (3, 31, 0)
"""``trusted_schema`` appeared in 3.31; row values and upserts are older."""


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """Where the database lives and how every connection to it is configured."""

    path: Path
    synchronous: Synchronous
    busy_timeout: float
    read_only: bool = False
    """Open with ``mode=ro``: SQLite refuses every write, and nothing is created."""
    immutable: bool = False
    """With ``read_only``, also ``immutable=1``: no locks and no ``-wal``/``-shm`` files.

    Only for a file no process has open (it has no write-ahead log); if one
    starts writing meanwhile, reads may see damage that is not there.
    """

    def __post_init__(self) -> None:
        if self.synchronous not in _SYNCHRONOUS_LEVELS:
            raise InvalidInput("synchronous must be 'full' or 'normal'")
        timeout: object = self.busy_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise InvalidInput("busy_timeout must be a non-negative number of seconds")
        if not math.isfinite(timeout) or timeout < 0:
            raise InvalidInput("busy_timeout must be a non-negative number of seconds")

    @property
    def busy_timeout_ms(self) -> int:
        """The busy timeout as SQLite takes it."""
        return round(self.busy_timeout * 1000)

    def uri(self) -> str:
        """Return the ``file:`` URI of a read-only connection, the path percent-encoded."""
        flags = "mode=ro&immutable=1" if self.immutable else "mode=ro"
        return f"file:{quote(str(self.path.absolute()))}?{flags}"

    def pragmas(self) -> tuple[tuple[str, str, object], ...]:
        """Return ``(name, value to set, value that must read back)`` for every pragma.

        A read-only connection sets only the pragmas that live in the
        connection; ``journal_mode`` would write the file header, and
        ``synchronous`` and ``secure_delete`` govern writes it never makes.
        ``query_only`` makes SQLite refuse any write even before the file would.
        ``wal_autocheckpoint`` is off because the store checkpoints in the
        background instead (``_checkpointer``).
        """
        if self.read_only:
            return (
                ("busy_timeout", str(self.busy_timeout_ms), self.busy_timeout_ms),
                ("foreign_keys", "ON", 1),
                ("trusted_schema", "OFF", 0),
                ("query_only", "ON", 1),
            )
        level = _SYNCHRONOUS_LEVELS[self.synchronous]
        return (
            ("busy_timeout", str(self.busy_timeout_ms), self.busy_timeout_ms),
            ("journal_mode", "WAL", "wal"),
            ("synchronous", self.synchronous.upper(), level),
            ("foreign_keys", "ON", 1),
            ("secure_delete", "ON", 1),
            ("trusted_schema", "OFF", 0),
            ("wal_autocheckpoint", "0", 0),
        )


def check_sqlite_version() -> None:
    """Refuse an SQLite library too old for the schema and pragmas used here."""
    if sqlite3.sqlite_version_info < MINIMUM_SQLITE:
        wanted = ".".join(map(str, MINIMUM_SQLITE))
        raise StoreUnavailable(
            f"SQLite {sqlite3.sqlite_version} is too old; flowvault needs {wanted} or newer"
        )


def connect(options: ConnectOptions) -> sqlite3.Connection:
    """Open a bare connection in autocommit mode; transactions are always explicit.

    A read-only connection goes through a ``file:`` URI with ``mode=ro``, so a
    missing file is an error rather than a new, empty database. TEXT values
    are decoded by ``bytes.decode`` (strict UTF-8, called without a Python
    frame per value): bytes that are not UTF-8 raise ``UnicodeDecodeError``,
    which ``translated`` turns into ``IntegrityFailure``, where the driver's
    own decoding would raise a code-less ``OperationalError`` quoting them.
    """
    if options.read_only:
        connection = sqlite3.connect(
            options.uri(),
            uri=True,
            isolation_level=None,
            timeout=options.busy_timeout,
            check_same_thread=False,
        )
    else:
        connection = sqlite3.connect(
            options.path,
            isolation_level=None,
            timeout=options.busy_timeout,
            check_same_thread=False,
        )
    connection.text_factory = bytes.decode
    return connection


def configure(connection: sqlite3.Connection, options: ConnectOptions) -> None:
    """Set every pragma and fail with ``StoreUnavailable`` naming any that did not stick."""
    for name, value, expected in options.pragmas():
        connection.execute(f"PRAGMA {name} = {value}").fetchall()
        found = connection.execute(f"PRAGMA {name}").fetchall()
        actual = found[0][0] if found else None
        if actual != expected:
            raise StoreUnavailable(_refusal(name, expected, actual), pragma=name)


def _refusal(name: str, expected: object, actual: object) -> str:
    if name == "journal_mode":
        return (
            f"SQLite refused journal_mode=WAL (it reports {actual!r}); WAL needs shared "
            "memory, which network filesystems do not provide: keep the database on a local disk"
        )
    return f"SQLite did not keep pragma {name} = {expected!r} (it reports {actual!r})"


def rollback_quietly(connection: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open, without hiding the error that got here."""
    if connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")


@contextlib.contextmanager
def transaction(connection: sqlite3.Connection, begin: str) -> Iterator[None]:
    """Run the block inside ``begin`` ... ``COMMIT``; roll back on any exception.

    ``begin`` is ``BEGIN IMMEDIATE`` for writes, taking the write lock before
    the first read so guards are checked against what the commit replaces,
    or ``BEGIN`` for a consistent multi-statement read.
    """
    connection.execute(begin)
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        rollback_quietly(connection)
        raise
