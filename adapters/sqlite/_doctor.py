"""Diagnosing an SQLite store from outside it: its files' modes and its settings read back.

``doctor`` and ``status`` use these while the store itself is open: the
store has then created the ``-wal`` and ``-shm`` files with private modes,
and its close removes them; a lone read-only connection would leave them
behind.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flowvault.adapters.sqlite._connect import ConnectOptions
from flowvault.application._checks import Check, Severity
from flowvault.domain import StoreUnavailable

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
EXPOSED = 0o077
"""Any group or other bit: the documented layout is 0700 directories and 0600 files."""
REFUSED_DIRECTORY = 0o022
"""What the stores refuse on a directory: others able to add, remove or swap its files."""


def file_mode_check(name: str, path: Path, *, directory: bool, strict: bool) -> Check:
    """Check type, owner and mode; a loose mode is only a warning when not ``strict``."""
    kind = "directory" if directory else "regular file"
    wanted = PRIVATE_DIR if directory else PRIVATE_FILE
    try:
        info = path.lstat()
    except FileNotFoundError:
        return Check(name, True, f"{path} is absent")
    is_kind = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not is_kind:
        fix = f"replace {path} with a real {kind} (a symlink lets its target's owner swap it)"
        return Check(name, False, f"{path} is not a {kind}", fix)
    severity: Severity = "error" if strict else "warning"
    if info.st_uid != os.geteuid():
        finding = f"{path} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
        return Check(name, False, finding, f"chown {os.geteuid()} {shlex.quote(str(path))}")
    mode = stat.S_IMODE(info.st_mode)
    fix = f"chmod {wanted:o} {shlex.quote(str(path))}"
    if mode & (REFUSED_DIRECTORY if directory else EXPOSED):
        finding = f"{path} has mode {mode:04o}: group or others can reach it"
        return Check(name, False, finding, fix, severity)
    if mode & EXPOSED:
        finding = (
            f"{path} has mode {mode:04o}: group or others can list it; the store accepts "
            f"this, {wanted:04o} also hides its file names"
        )
        return Check(name, False, finding, fix, "warning")
    return Check(name, True, f"{path} has mode {mode:04o}")


class DatabaseProbe:
    """A read-only connection to a database file, to read its pragmas back."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def schema_version(self) -> int | None:
        """Return the schema version the file records (its ``user_version``)."""
        version = self._pragma("user_version")
        return version if isinstance(version, int) else None

    def pragma_checks(self, options: ConnectOptions) -> list[Check]:
        """Check the journal mode, then set each per-connection pragma as the store does."""
        checks = [self._journal_check()]
        for name, value, wanted in options.pragmas():
            if name not in {"journal_mode", "busy_timeout"}:
                checks.append(self._pragma_check(name, value, wanted))
        return checks

    def _pragma(self, name: str) -> object:
        rows = self._connection.execute(f"PRAGMA {name}").fetchall()
        return rows[0][0] if rows else None

    def _pragma_check(self, name: str, value: str, wanted: object) -> Check:
        """Set a per-connection pragma as the store does and read it back."""
        self._connection.execute(f"PRAGMA {name} = {value}").fetchall()
        found = self._pragma(name)
        if found == wanted:
            return Check(f"pragma.{name}", True, f"{name} = {found!r} as required")
        return Check(
            f"pragma.{name}",
            False,
            f"SQLite keeps {name} = {found!r}, not {wanted!r}",
            "use an SQLite build that honours it (the store refuses to open otherwise)",
        )

    def _journal_check(self) -> Check:
        """Read the journal mode, which the file stores; setting it is the store's job."""
        found = self._pragma("journal_mode")
        if found == "wal":
            return Check("pragma.journal_mode", True, "journal_mode = 'wal' as required")
        return Check(
            "pragma.journal_mode",
            False,
            f"the database uses journal_mode {found!r}, not 'wal'",
            "keep the database on a local disk (WAL needs shared memory), then open it again",
        )


@contextmanager
def probe_database(path: Path, busy_timeout: float) -> Iterator[DatabaseProbe]:
    """Open ``path`` read-only for a ``DatabaseProbe``; ``StoreUnavailable`` if it cannot."""
    uri = path.resolve().as_uri() + "?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=busy_timeout)
    except sqlite3.Error as error:
        raise StoreUnavailable(f"cannot read {path}: {error}") from None
    try:
        yield DatabaseProbe(connection)
    finally:
        connection.close()
