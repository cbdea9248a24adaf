"""The key ring kept in a private file, created atomically and refused when exposed.

A key file is as secret as every record it seals: it must be a regular file
owned by the current user, unreadable by anyone else, in a directory only
its owner can change. Creation publishes a fully written, fsynced file with
``link`` so concurrent first starts agree on one key and a crash leaves
either no key file or a complete one, never a torn one. Rewriting the ring
(a key added or retired) renames a complete, fsynced file over the old one
under an exclusive lock, so readers see the old ring or the new, whole.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
from pathlib import Path
from typing import NamedTuple

from flowvault.adapters._paths import create_private_directories
from flowvault.application._keys import (
    MASTER_KEY_BYTES,
    KeyRing,
    encode_master_key,
    format_key_ring,
    parse_key_ring,
)
from flowvault.application._observability import EventLog
from flowvault.domain import InsecurePermissions, InvalidInput, RevisionConflict, StoreUnavailable

_log = EventLog(__name__)

_FILE_MODE = 0o600
_DIR_MODE = 0o700


class _Private(NamedTuple):
    """How a key path is named, which mode it needs and what in it other users must not reach."""

    noun: str
    mode: int
    forbidden: int
    reach: str
    owner_fix: str


_PRIVATE_DIR = _Private(
    "keys directory", _DIR_MODE, 0o022, "writable by", "choose a directory you own"
)
_PRIVATE_FILE = _Private("key file", _FILE_MODE, 0o077, "open to", "run as the file's owner")
_MAX_KEY_FILE_BYTES = 64 * 1024
_PUBLISH_ATTEMPTS = 3


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_capped(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= _MAX_KEY_FILE_BYTES:
        chunk = os.read(fd, _MAX_KEY_FILE_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class FileKeyStore:
    """``KeyRingStore`` holding the key ring as base64 text in a 0600 file in a 0700 directory.

    A single key is one line, as older builds wrote it; a ring of several
    keys is the format of ``format_key_ring``.

    ``allow_insecure_permissions`` downgrades mode and ownership problems to
    a logged warning for hosts whose filesystem cannot express them; a
    symlink or a non-regular file is always refused, since it lets someone
    else choose which key the store uses.
    """

    def __init__(
        self,
        keys_dir: Path,
        *,
        file_name: str = "store.key",
        allow_insecure_permissions: bool = False,
    ) -> None:
        if not file_name or file_name in {".", ".."} or "/" in file_name or "\0" in file_name:
            raise InvalidInput("a key file name must be a single path component")
        self._dir = Path(keys_dir)
        self._path = self._dir / file_name
        self._allow_insecure = allow_insecure_permissions

    @property
    def location(self) -> str:
        """Return the key file's path, for messages that tell an operator where to look."""
        return str(self._path)

    def read(self) -> bytes | None:
        """Return the primary key of the stored ring, or ``None`` when there is no key file."""
        ring = self.read_ring()
        return None if ring is None else ring.primary

    def read_ring(self) -> KeyRing | None:
        """Return the stored ring, or ``None`` when the key file does not exist.

        Raises:
            InsecurePermissions: the file or its directory is exposed to
                other users, or the file is a symlink or not a regular file.
            InvalidInput: the file's content is not a key or a key ring.

        """
        content = self._read_content()
        if content is None:
            return None
        if len(content) > _MAX_KEY_FILE_BYTES:
            raise InvalidInput(f"key file {self._path} is too large to be a key ring")
        return parse_key_ring(content, f"key file {self._path}")

    def read_bytes(self) -> bytes | None:
        """Return the file's raw content under the key file's checks, or ``None`` if absent.

        For other secrets kept the same way, such as the receipt signing key.
        """
        return self._read_content()

    def create_bytes(self, content: bytes) -> bool:
        """Publish ``content`` as the file, complete and fsynced; ``False`` if one exists."""
        if not isinstance(content, bytes) or len(content) > _MAX_KEY_FILE_BYTES:
            raise InvalidInput("a secret file's content must be bytes of a bounded size")
        self._ensure_dir()
        return self._publish_bytes(content)

    def replace_ring(self, ring: KeyRing, *, expected: KeyRing) -> None:
        """Write ``ring`` over the key file atomically, if the file still holds ``expected``.

        Raises:
            RevisionConflict: the key file changed since ``expected`` was read.
            InsecurePermissions: the file or its directory is exposed.

        """
        if not isinstance(ring, KeyRing) or not isinstance(expected, KeyRing):
            raise InvalidInput("a key ring must be a KeyRing")
        self._ensure_dir()
        lock = os.open(
            self._dir / f".{self._path.name}.lock",
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            _FILE_MODE,
        )
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.read_ring() != expected:
                raise RevisionConflict(
                    f"key file {self._path} changed meanwhile; read it again and retry",
                    guard="key ring",
                )
            temp = self._write_temp(format_key_ring(ring).encode("ascii"))
            try:
                os.replace(temp, self._path)
            except BaseException:
                os.unlink(temp)
                raise
            _fsync_dir(self._dir)
        finally:
            os.close(lock)

    def _read_content(self) -> bytes | None:
        try:
            before = os.lstat(self._path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            self._check_dir()
            raise
        self._check_dir()
        self._check_file(before)
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise self._symlink_refused() from None
            raise
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
                self._check_file(opened)
            return _read_capped(fd)
        finally:
            os.close(fd)

    def create(self, key: bytes) -> bytes:
        """Store ``key`` atomically unless a key file appeared first; return the key that won.

        Raises:
            InvalidInput: ``key`` is not a master key.
            InsecurePermissions: the keys directory, or a key file that won
                the race, is exposed to other users.

        """
        if not isinstance(key, bytes) or len(key) != MASTER_KEY_BYTES:
            raise InvalidInput(f"a master key must be exactly {MASTER_KEY_BYTES} bytes")
        self._ensure_dir()
        for _ in range(_PUBLISH_ATTEMPTS):
            if self._publish(key):
                return key
            existing = self.read()
            if existing is not None:
                return existing
        raise StoreUnavailable(f"key file {self._path} keeps vanishing while it is created")

    def _publish(self, key: bytes) -> bool:
        """Link a complete temporary key file into place; return whether this call won."""
        return self._publish_bytes((encode_master_key(key) + "\n").encode("ascii"))

    def _publish_bytes(self, content: bytes) -> bool:
        temp = self._write_temp(content)
        try:
            os.link(temp, self._path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)
            _fsync_dir(self._dir)
        return True

    def _write_temp(self, content: bytes) -> Path:
        temp = self._dir / f".{self._path.name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
            _write_all(fd, content)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(temp)
            raise
        os.close(fd)
        return temp

    def _ensure_dir(self) -> None:
        """Create the keys directory, and any missing parents, private to their owner; vet it.

        Parents made by ``makedirs`` would get the umask's mode, and a parent
        others can write lets them swap the keys directory for their own.
        """
        for created in create_private_directories(self._dir, _DIR_MODE):
            _fsync_dir(created.parent)
        self._check_dir()

    def _check_dir(self) -> None:
        try:
            info = os.stat(self._dir)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(info.st_mode):
            raise InvalidInput(f"keys directory {self._dir} is not a directory")
        self._check_private(_PRIVATE_DIR, self._dir, info)

    def _check_file(self, info: os.stat_result) -> None:
        if stat.S_ISLNK(info.st_mode):
            raise self._symlink_refused()
        if not stat.S_ISREG(info.st_mode):
            raise InsecurePermissions(
                f"key file {self._path} is not a regular file: replace it with a regular "
                f"key file readable only by you (`chmod {_FILE_MODE:o} {self._path}`)",
                path=str(self._path),
            )
        self._check_private(_PRIVATE_FILE, self._path, info)

    def _check_private(self, private: _Private, path: Path, info: os.stat_result) -> None:
        """Refuse (or warn of) a key path another user owns or can reach."""
        if info.st_uid != os.geteuid():
            self._exposed(
                f"{private.noun} {path} is owned by uid {info.st_uid}, not by the current user "
                f"(uid {os.geteuid()})",
                f"run `chown {os.geteuid()} {path}` or {private.owner_fix}",
            )
        if info.st_mode & private.forbidden:
            self._exposed(
                f"{private.noun} {path} is {private.reach} other users "
                f"(mode {stat.S_IMODE(info.st_mode):04o})",
                f"run `chmod {private.mode:o} {path}`",
            )

    def _symlink_refused(self) -> InsecurePermissions:
        return InsecurePermissions(
            f"key file {self._path} is a symlink, so whoever controls its target controls "
            f"the key: replace the symlink with the real file (copy the target's content to "
            f"a regular file at {self._path}, then run `chmod {_FILE_MODE:o} {self._path}`)",
            path=str(self._path),
        )

    def _exposed(self, problem: str, fix: str) -> None:
        """Refuse an exposed key, or only warn when the host allowed insecure permissions."""
        if self._allow_insecure:
            _log.warning("insecure_key_permissions", problem=problem, fix=fix)
            return
        raise InsecurePermissions(f"{problem}: {fix}", path=str(self._path))

    def __repr__(self) -> str:
        return f"FileKeyStore(location={self.location!r})"
