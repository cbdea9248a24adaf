"""The database's directory and files, created private and refused when shared.

Sealed payloads are safe on disk, but digests, labels, the ledger and the
mere ability to delete or replace the file are not for other local users.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from pathlib import Path

from flowvault.adapters._paths import create_private_directories
from flowvault.application._observability import EventLog
from flowvault.domain import InsecurePermissions

log = EventLog(__name__)

_DIRECTORY_MODE = 0o700
_FILE_MODE = 0o600
_DIRECTORY_FORBIDDEN = 0o022
"""A directory others may write to lets them delete or swap the database."""
_FILE_FORBIDDEN = 0o077

SIDECAR_SUFFIXES = ("-wal", "-shm")


def prepare(path: Path, *, allow_insecure: bool) -> None:
    """Create what is missing with private modes, then check the modes found."""
    directory = path.parent
    _ensure_directory(directory)
    _check_mode(directory, _DIRECTORY_FORBIDDEN, _DIRECTORY_MODE, allow_insecure)
    _ensure_file(path)
    _check_mode(path, _FILE_FORBIDDEN, _FILE_MODE, allow_insecure)


def _ensure_directory(directory: Path) -> None:
    """Create the directory and any missing parents private to their owner."""
    create_private_directories(directory, _DIRECTORY_MODE)


def _ensure_file(path: Path) -> None:
    """Create an empty database file at 0600 so SQLite never creates it with the umask's mode."""
    flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, _FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(descriptor, _FILE_MODE)
    finally:
        os.close(descriptor)


def _check_mode(target: Path, forbidden: int, wanted: int, allow_insecure: bool) -> None:
    mode = stat.S_IMODE(target.stat().st_mode)
    if not mode & forbidden:
        return
    fix = f"chmod {wanted:o} {shlex.quote(str(target))}"
    if allow_insecure:
        log.warning("insecure_permissions", path=str(target), mode=f"{mode:o}", fix=fix)
        return
    kind = "directory" if target.is_dir() else "file"
    raise InsecurePermissions(
        f"the database {kind} {target} is open to other users (mode {mode:o}); run: {fix}",
        path=str(target),
        mode=f"{mode:o}",
    )


def secure_sidecars(path: Path) -> None:
    """Give the write-ahead log and shared-memory files the database file's private mode."""
    for suffix in SIDECAR_SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).chmod(_FILE_MODE)
