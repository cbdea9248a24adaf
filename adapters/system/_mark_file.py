"""The high-water mark's file: two checksummed slots, one fdatasync per update.

A mark is rewritten after every commit, so the update must be cheap and
must never leave a torn mark after a power cut. Each update writes the slot
the last update did not, with a sequence number and a CRC; a reader takes
the valid slot with the higher sequence. A torn write spoils only the slot
being written, and the other still holds the previous mark. The file is
private (0600, owner only, never a symlink), like the key file beside it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from flowvault.adapters._paths import create_private_directories
from flowvault.domain import InsecurePermissions, InvalidInput, StoreUnavailable

SLOT_BYTES: Final = 512
_MAGIC: Final = b"FVHW"
_HEAD: Final = struct.Struct(">4sQII")
"""Magic, sequence number, content length, CRC-32 of the content."""
_MAX_CONTENT: Final = SLOT_BYTES - _HEAD.size
_FILE_MODE: Final = 0o600
_DIR_MODE: Final = 0o700


def _slot(data: bytes, index: int) -> tuple[int, bytes] | None:
    """Return ``(sequence, content)`` of a slot whose checksum holds, else ``None``."""
    raw = data[index * SLOT_BYTES : (index + 1) * SLOT_BYTES]
    if len(raw) < _HEAD.size:
        return None
    magic, sequence, length, crc = _HEAD.unpack_from(raw)
    content = raw[_HEAD.size : _HEAD.size + length]
    if magic != _MAGIC or length > _MAX_CONTENT or len(content) != length:
        return None
    return (sequence, content) if zlib.crc32(content) == crc else None


def _newest(data: bytes) -> tuple[int, int, bytes | None]:
    """Return the slot to write next, the next sequence, and the newest valid content."""
    slots = [(found, index) for index in (0, 1) if (found := _slot(data, index)) is not None]
    if not slots:
        return 0, 1, (b"" if data else None)
    (sequence, content), index = max(slots)
    return 1 - index, sequence + 1, content


class MarkFileStore:
    """A ``MarkFile`` at ``path``: read without a lock, updated under ``flock``."""

    def __init__(self, path: Path) -> None:
        if not path.name or path.name in {".", ".."}:
            raise InvalidInput("a high-water mark path must name a file")
        self._path = Path(path)

    @property
    def location(self) -> str:
        """The mark's path."""
        return str(self._path)

    def read(self) -> bytes | None:
        """Return the newest intact mark; ``b""`` if the file holds none, ``None`` if absent."""
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise self._unusable(error) from None
        try:
            self._check(fd)
            return _newest(os.pread(fd, 2 * SLOT_BYTES, 0))[2]
        finally:
            os.close(fd)

    def update(self, change: Callable[[bytes | None], bytes | None]) -> None:
        """Lock, read, and write ``change``'s result into the older slot, then fdatasync."""
        with self._locked() as (fd, created):
            data = os.pread(fd, 2 * SLOT_BYTES, 0)
            index, sequence, current = _newest(data)
            content = change(None if created else current)
            if content is None:
                return
            if len(content) > _MAX_CONTENT:
                raise InvalidInput(f"a high-water mark holds at most {_MAX_CONTENT} bytes")
            slot = _HEAD.pack(_MAGIC, sequence, len(content), zlib.crc32(content)) + content
            os.pwrite(fd, slot.ljust(SLOT_BYTES, b"\0"), index * SLOT_BYTES)
            os.fdatasync(fd)
            if created:
                self._sync_directory()

    @contextmanager
    def _locked(self) -> Iterator[tuple[int, bool]]:
        self._ensure_directory()
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        created = False
        try:
            try:
                fd = os.open(self._path, flags)
            except FileNotFoundError:
                fd = os.open(self._path, flags | os.O_CREAT | os.O_EXCL, _FILE_MODE)
                os.fchmod(fd, _FILE_MODE)
                created = True
        except FileExistsError:
            fd = os.open(self._path, flags)
        except OSError as error:
            raise self._unusable(error) from None
        try:
            self._check(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            created = created or os.fstat(fd).st_size == 0
            yield fd, created
        except OSError as error:
            raise self._unusable(error) from None
        finally:
            os.close(fd)

    def _check(self, fd: int) -> None:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise InsecurePermissions(
                f"high-water mark {self._path} is not a regular file you own: replace it",
                path=str(self._path),
            )
        if info.st_mode & 0o077:
            raise InsecurePermissions(
                f"high-water mark {self._path} is open to other users: "
                f"run `chmod {_FILE_MODE:o} {self._path}`",
                path=str(self._path),
            )

    def _ensure_directory(self) -> None:
        create_private_directories(self._path.parent, _DIR_MODE)

    def _sync_directory(self) -> None:
        fd = os.open(self._path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _unusable(self, error: OSError) -> InsecurePermissions | StoreUnavailable:
        if error.errno == errno.ELOOP:
            return InsecurePermissions(
                f"high-water mark {self._path} is a symlink: replace it with a regular file",
                path=str(self._path),
            )
        return StoreUnavailable(
            f"cannot use the high-water mark {self._path}: {error.strerror}",
            path=str(self._path),
        )

    def __repr__(self) -> str:
        return f"MarkFileStore(location={self.location!r})"


__all__ = ["SLOT_BYTES", "MarkFileStore"]
