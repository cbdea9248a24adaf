"""The high-water mark's file: two checksummed head slots, then the log; one fdatasync per update.

A mark is rewritten after every commit, so the update must be cheap and
must never leave a torn mark after a power cut. Each update appends its
log bytes after the log the current head covers, then writes the slot the
current head is not in, with a sequence number, the log's new size, and
CRCs of the head and of the appended bytes; one fdatasync covers both. A
reader takes the newest slot whose CRCs hold, its appended bytes included:
a torn slot or an append lost to a power cut leaves the slot before, whose
log is intact. Compacting the log writes a new file and renames it over the
old one. The file is private (0600, owner only, never a symlink), like the
key file beside it.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flowvault.adapters._paths import create_private_directories
from flowvault.application import MarkState, MarkWrite
from flowvault.domain import InsecurePermissions, InvalidInput, StoreUnavailable

SLOT_BYTES: Final = 512
LOG_OFFSET: Final = 2 * SLOT_BYTES
_EPOCH_ONLY_MAGIC: Final = b"FVHW"
_EPOCH_ONLY_HEAD: Final = struct.Struct(">4sQII")
"""Slots written before the log: magic, sequence number, content length, CRC-32 of the content."""
_MAGIC: Final = b"FVH2"
_HEAD: Final = struct.Struct(">4sQIQIII")
"""Magic, sequence, content length, log size, appended length, its CRC-32, the slot's CRC-32."""
_MAX_CONTENT: Final = SLOT_BYTES - _HEAD.size
_FILE_MODE: Final = 0o600
_DIR_MODE: Final = 0o700


@dataclass(frozen=True, slots=True)
class _Slot:
    index: int
    sequence: int
    content: bytes
    log_size: int = 0
    tail_size: int = 0
    tail_crc: int = 0


def _slot_crc(sequence: int, content: bytes, log_size: int, tail_size: int, tail_crc: int) -> int:
    return zlib.crc32(struct.pack(">QQII", sequence, log_size, tail_size, tail_crc) + content)


def _pack(slot: _Slot) -> bytes:
    fields = (slot.sequence, slot.content, slot.log_size, slot.tail_size, slot.tail_crc)
    head = _HEAD.pack(
        _MAGIC,
        slot.sequence,
        len(slot.content),
        slot.log_size,
        slot.tail_size,
        slot.tail_crc,
        _slot_crc(*fields),
    )
    return (head + slot.content).ljust(SLOT_BYTES, b"\0")


def _unpack(data: bytes, index: int) -> _Slot | None:
    """Return the slot at ``index`` if its own checksum holds, else ``None``."""
    raw = data[index * SLOT_BYTES : (index + 1) * SLOT_BYTES]
    if raw[:4] == _EPOCH_ONLY_MAGIC and len(raw) >= _EPOCH_ONLY_HEAD.size:
        _, sequence, length, crc = _EPOCH_ONLY_HEAD.unpack_from(raw)
        content = raw[_EPOCH_ONLY_HEAD.size : _EPOCH_ONLY_HEAD.size + length]
        if len(content) == length and zlib.crc32(content) == crc:
            return _Slot(index, sequence, content)
        return None
    if raw[:4] != _MAGIC or len(raw) < _HEAD.size:
        return None
    _, sequence, length, log_size, tail_size, tail_crc, crc = _HEAD.unpack_from(raw)
    content = raw[_HEAD.size : _HEAD.size + length]
    if len(content) != length or tail_size > log_size:
        return None
    if _slot_crc(sequence, content, log_size, tail_size, tail_crc) != crc:
        return None
    return _Slot(index, sequence, content, log_size, tail_size, tail_crc)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset``: a short write would leave a slot whose CRC fails."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _tail_holds(fd: int, slot: _Slot) -> bool:
    """Whether the bytes the slot's update appended reached the disk whole."""
    if not slot.tail_size:
        return True
    tail = os.pread(fd, slot.tail_size, LOG_OFFSET + slot.log_size - slot.tail_size)
    return len(tail) == slot.tail_size and zlib.crc32(tail) == slot.tail_crc


def _current(fd: int) -> tuple[_Slot | None, int, bool]:
    """Return the newest slot that holds, the next sequence, and whether the file has any bytes."""
    data = os.pread(fd, LOG_OFFSET, 0)
    slots = sorted(
        (slot for index in (0, 1) if (slot := _unpack(data, index)) is not None),
        key=lambda slot: slot.sequence,
        reverse=True,
    )
    sequence = slots[0].sequence + 1 if slots else 1
    holding = next((slot for slot in slots if _tail_holds(fd, slot)), None)
    return holding, sequence, bool(data)


def _state(fd: int, slot: _Slot | None, nonempty: bool) -> MarkState | None:
    if slot is None:
        return MarkState(b"", 0, lambda: b"") if nonempty else None
    size = slot.log_size

    def log() -> bytes:
        return os.pread(fd, size, LOG_OFFSET)

    return MarkState(slot.content, size, log)


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

    def read(self) -> MarkState | None:
        """Return the newest intact mark with its log; an empty head if none is intact."""
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise self._unusable(error) from None
        try:
            self._check(fd)
            slot, _, nonempty = _current(fd)
            state = _state(fd, slot, nonempty)
            if state is None:
                return None
            log = state.log()
            return MarkState(state.head, state.log_size, lambda: log)
        finally:
            os.close(fd)

    def update(self, change: Callable[[MarkState | None], MarkWrite | None]) -> None:
        """Lock, pass the newest intact mark to ``change``, write its result, then fdatasync."""
        with self._locked() as (fd, created):
            slot, sequence, nonempty = _current(fd)
            write = change(None if created else _state(fd, slot, nonempty))
            if write is None:
                return
            if len(write.head) > _MAX_CONTENT:
                raise InvalidInput(f"a high-water mark's head holds at most {_MAX_CONTENT} bytes")
            if write.replace_log:
                self._replace(write, sequence)
                return
            log_size = slot.log_size if slot is not None else 0
            tail_size, tail_crc = (slot.tail_size, slot.tail_crc) if slot is not None else (0, 0)
            if write.append:
                _pwrite_all(fd, write.append, LOG_OFFSET + log_size)
                log_size += len(write.append)
                tail_size, tail_crc = len(write.append), zlib.crc32(write.append)
            index = 1 - slot.index if slot is not None else 0
            new = _Slot(index, sequence, write.head, log_size, tail_size, tail_crc)
            _pwrite_all(fd, _pack(new), index * SLOT_BYTES)
            os.fdatasync(fd)
            if created:
                self._sync_directory()

    def _replace(self, write: MarkWrite, sequence: int) -> None:
        """Write a whole new file beside the mark and rename it over the mark."""
        spare = self._path.with_name(self._path.name + ".new")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(spare, flags, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
            log = write.append
            slot = _Slot(0, sequence, write.head, len(log), len(log), zlib.crc32(log))
            _pwrite_all(fd, _pack(slot) + bytes(SLOT_BYTES) + log, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(spare, self._path)
        self._sync_directory()

    @contextmanager
    def _locked(self) -> Iterator[tuple[int, bool]]:
        """Open and lock the mark, again if a compaction renamed a new file over it meanwhile."""
        self._ensure_directory()
        while True:
            fd, created = self._open_for_update()
            try:
                self._check(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not self._still_the_mark(fd):
                    continue
                created = created or os.fstat(fd).st_size == 0
                yield fd, created
                return
            except OSError as error:
                raise self._unusable(error) from None
            finally:
                os.close(fd)

    def _open_for_update(self) -> tuple[int, bool]:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                return os.open(self._path, flags), False
            except FileNotFoundError:
                fd = os.open(self._path, flags | os.O_CREAT | os.O_EXCL, _FILE_MODE)
                os.fchmod(fd, _FILE_MODE)
                return fd, True
        except FileExistsError:
            return os.open(self._path, flags), False
        except OSError as error:
            raise self._unusable(error) from None

    def _still_the_mark(self, fd: int) -> bool:
        try:
            named = os.stat(self._path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        opened = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)

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


__all__ = ["LOG_OFFSET", "SLOT_BYTES", "MarkFileStore"]
