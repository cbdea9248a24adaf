"""The high-water mark's file: two checksummed head slots, then the log; one fdatasync per update.

A mark is rewritten after every commit, so the update must be cheap and
must never leave a torn mark after a power cut. Each update appends its
log bytes after the log the current head covers, then writes the slot the
current head is not in, with a sequence number, the log's new size, and
CRCs of the head and of the appended bytes; one fdatasync covers both. A
reader takes the newest slot whose CRCs hold, its appended bytes included:
a torn slot or an append lost to a power cut leaves the slot before, whose
log is intact. The reader reports what it passed over to get there, since
damage that looks like a torn write is also how a newer head would be
hidden; whether that is acceptable is the caller's decision. A new mark is
written whole beside the path and linked into place, and compacting the log
writes a new file and renames it over the old one, so the path never names
a file with less than a whole head. The file is private (0600, owner only,
never a symlink), like the key file beside it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flowvault.adapters._paths import create_private_directories
from flowvault.application._mark_format import MarkState, MarkWrite
from flowvault.domain import InsecurePermissions, InvalidInput, StoreUnavailable

SLOT_BYTES: Final = 512
LOG_OFFSET: Final = 2 * SLOT_BYTES
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


def _never_written(data: bytes, index: int, holding: _Slot | None) -> bool:
    """Whether slot ``index`` is blank because no update has written it yet.

    Only the second slot of a file written whole (new, or compacted: its
    first slot's update wrote the whole log) is blank that way; any other
    blank slot was wiped.
    """
    blank = not data[index * SLOT_BYTES : (index + 1) * SLOT_BYTES].strip(b"\0")
    return (
        blank
        and index == 1
        and holding is not None
        and holding.index == 0
        and holding.tail_size == holding.log_size
    )


@dataclass(frozen=True, slots=True)
class _Found:
    """What a read of the head slots finds."""

    holding: _Slot | None
    """The newest slot whose CRCs hold, its appended bytes included."""
    sequence: int
    """The sequence number the next update writes."""
    passed_over: tuple[bytes, ...]
    """Heads of newer slots whose appended bytes fail, and ``b""`` for each slot that fails."""


def _current(fd: int) -> _Found:
    data = os.pread(fd, LOG_OFFSET, 0)
    found = [_unpack(data, index) for index in (0, 1)]
    slots = sorted(
        (slot for slot in found if slot is not None), key=lambda slot: slot.sequence, reverse=True
    )
    passed: list[bytes] = []
    holding = None
    for slot in slots:
        if _tail_holds(fd, slot):
            holding = slot
            break
        passed.append(slot.content)
    passed += [
        b""
        for index, slot in enumerate(found)
        if slot is None and not _never_written(data, index, holding)
    ]
    sequence = slots[0].sequence + 1 if slots else 1
    return _Found(holding, sequence, tuple(passed))


def _state(fd: int, found: _Found) -> MarkState:
    slot = found.holding
    if slot is None:
        return MarkState(b"", 0, lambda: b"", found.passed_over)
    size = slot.log_size

    def log() -> bytes:
        return os.pread(fd, size, LOG_OFFSET)

    return MarkState(slot.content, size, log, found.passed_over)


def _check_head(write: MarkWrite) -> None:
    if len(write.head) > _MAX_CONTENT:
        raise InvalidInput(f"a high-water mark's head holds at most {_MAX_CONTENT} bytes")


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
        """Return the newest intact mark with its log, and what was passed over to reach it.

        ``None`` when there is no file; an empty head when none is intact,
        and an empty head marked ``empty`` when the file holds no bytes.
        """
        fd = self._open_mark(os.O_RDONLY)
        if fd is None:
            return None
        try:
            self._check(fd)
            if os.fstat(fd).st_size == 0:
                return MarkState(b"", 0, lambda: b"", empty=True)
            state = _state(fd, _current(fd))
            log = state.log()
            return MarkState(state.head, state.log_size, lambda: log, state.passed_over)
        finally:
            os.close(fd)

    def update(self, change: Callable[[MarkState | None], MarkWrite | None]) -> None:
        """Lock, pass the newest intact mark to ``change``, write its result, then fdatasync.

        Without a file there is nothing to lock: ``change(None)`` is written
        whole and linked into place, unless another writer's file got there
        first, which is then updated like any other. An empty file is passed
        as ``None`` too.
        """
        while True:
            with self._locked() as fd:
                if fd is None:
                    write = change(None)
                    if write is None or self._publish(write):
                        return
                    continue
                self._update(fd, change)
                return

    def _update(self, fd: int, change: Callable[[MarkState | None], MarkWrite | None]) -> None:
        found = _current(fd)
        write = change(None if os.fstat(fd).st_size == 0 else _state(fd, found))
        if write is None:
            return
        _check_head(write)
        if write.replace_log:
            self._replace(write, found.sequence)
            return
        slot, sequence = found.holding, found.sequence
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

    def _replace(self, write: MarkWrite, sequence: int) -> None:
        """Write a whole new file beside the mark and rename it over the mark."""
        spare = self._path.with_name(self._path.name + ".new")
        self._write_whole(spare, write, sequence, os.O_TRUNC)
        os.replace(spare, self._path)
        self._sync_directory()

    def _publish(self, write: MarkWrite) -> bool:
        """Link a whole new mark into place unless a file is there; return whether it was not."""
        _check_head(write)
        spare = self._path.with_name(f".{self._path.name}.{secrets.token_hex(8)}.new")
        try:
            try:
                self._write_whole(spare, write, 1, os.O_EXCL)
                os.link(spare, self._path)
            finally:
                spare.unlink(missing_ok=True)
            self._sync_directory()
        except FileExistsError:
            return False
        except OSError as error:
            raise self._unusable(error) from None
        return True

    def _write_whole(self, spare: Path, write: MarkWrite, sequence: int, mode: int) -> None:
        """Write ``write`` as a file of its own at ``spare``: one slot, a blank one, the log."""
        flags = os.O_WRONLY | os.O_CREAT | mode | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(spare, flags, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
            log = write.append
            slot = _Slot(0, sequence, write.head, len(log), len(log), zlib.crc32(log))
            _pwrite_all(fd, _pack(slot) + bytes(SLOT_BYTES) + log, 0)
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self) -> Iterator[int | None]:
        """Open and lock the mark, again if a compaction renamed a new file over it meanwhile.

        Yields ``None`` when there is no mark file.
        """
        self._ensure_directory()
        while True:
            fd = self._open_mark(os.O_RDWR)
            if fd is None:
                yield None
                return
            try:
                self._check(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not self._still_the_mark(fd):
                    continue
                yield fd
                return
            except OSError as error:
                raise self._unusable(error) from None
            finally:
                os.close(fd)

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

    def _open_mark(self, access: int) -> int | None:
        """Open the mark file itself, never a link in its place; ``None`` when there is none."""
        try:
            return os.open(self._path, access | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise self._unusable(error) from None

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
