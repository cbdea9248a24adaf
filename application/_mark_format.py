"""The high-water mark's file format: a MAC'd head and the MAC-chained log of stream sizes.

A head names the store's commit count and summarises the log (its line
count, chain value and size after the last compaction) under one MAC; each
log line names the sizes of the streams some commits grew, or the streams
they dropped (``apply_line`` says how a line is read), and the head's
chain value is a MAC chain over every line. So the whole mark is one record
under the integrity key, and a reader can take the head alone or check the
log too. What the mark means, and when it is written, is ``_anti_rollback``'s.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.domain import IntegrityFailure, InvalidInput
from flowvault.domain._canonical import MAX_SAFE_INTEGER, canonical_bytes

MARK_TAG: Final = "flowvault.high-water/1"
"""Purpose tag of the head's MAC."""

LOG_TAG: Final = "flowvault.high-water-log/1"
"""Purpose tag of the MAC chain over the log's lines."""

MARK_HEADER: Final = "flowvault high-water mark 2"

LOG_GENESIS: Final = "sha256:" + "0" * 64
"""The chain value of an empty log."""


@dataclass(frozen=True, slots=True)
class MarkState:
    """What a ``MarkFile`` holds: the newest intact head and the log it covers."""

    head: bytes
    log_size: int
    log: Callable[[], bytes]
    """Read the whole log; only a check or a compaction needs it."""
    passed_over: tuple[bytes, ...] = ()
    """Heads the reader passed over that may be newer than ``head``.

    The head of a newer slot whose appended log bytes fail their check, or
    ``b""`` for a slot that fails its own. A torn write leaves these; so
    does damage that hides a newer head, which only the store can tell apart.
    """
    empty: bool = False
    """The file is there but holds no bytes."""


@dataclass(frozen=True, slots=True)
class MarkWrite:
    """A new head, with log bytes appended or, when ``replace_log``, replacing the log."""

    head: bytes
    append: bytes = b""
    replace_log: bool = False


class MarkFile(Protocol):
    """Where the mark lives: a small file outside the database directory."""

    @property
    def location(self) -> str:
        """Where the mark is, for messages."""
        ...

    def read(self) -> MarkState | None:
        """Return the mark, or ``None`` when there is no file.

        A file holding no intact head reads as an empty head, which no key
        verifies; one holding no bytes at all reads as an ``empty`` one.
        """
        ...

    def update(self, change: Callable[[MarkState | None], MarkWrite | None]) -> None:
        """Under an exclusive lock, pass the current mark to ``change`` and write its result.

        ``change`` gets ``None`` when there is no file, or an empty one.
        ``None`` from ``change`` leaves the mark as it is. The write is
        durable (fsynced; a torn write or a lost append never replaces a
        whole mark, it leaves the previous one) before this returns.
        """
        ...


@dataclass(frozen=True, slots=True)
class HighWaterMark:
    """A verified head: the commit count, and the log's line count, chain value and base size."""

    epoch: int
    records: int = 0
    chain: str = LOG_GENESIS
    base: int = 0
    """The log's size right after its last compaction."""


def _mac(digester: KeyedDigester, mark: HighWaterMark) -> str:
    fields = [MARK_HEADER, mark.epoch, mark.records, mark.chain, mark.base]
    return digester.keyed_digest(MARK_TAG, canonical_bytes(fields))


def format_mark(mark: HighWaterMark, digester: KeyedDigester) -> bytes:
    """Render a head: the header, the epoch, the log's summary, and the MAC over them."""
    return (
        f"{MARK_HEADER}\nepoch {mark.epoch}\n"
        f"log {mark.records} {mark.base} {mark.chain}\nmac {_mac(digester, mark)}\n"
    ).encode("ascii")


def _count(digits: str | None) -> int | None:
    if digits is None or not digits.isdigit() or len(digits) > 16:
        return None
    return int(digits) if int(digits) <= MAX_SAFE_INTEGER else None


def _field(line: str, name: str) -> str | None:
    return line[len(name) + 1 :] if line.startswith(name + " ") else None


def _is_digest(text: str) -> bool:
    hexpart = text.removeprefix("sha256:")
    return len(text) == 71 and len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart)


def _read_head(lines: list[str], digester: KeyedDigester) -> tuple[HighWaterMark, str] | None:
    """Return the head ``lines`` spell and the MAC it must carry, or ``None`` if malformed."""
    if len(lines) < 4 or lines[-1]:
        return None
    epoch = _count(_field(lines[1], "epoch"))
    if epoch is None:
        return None
    summary = (_field(lines[2], "log") or "").split(" ")
    if lines[0] != MARK_HEADER or len(lines) != 5 or len(summary) != 3:
        return None
    records, base = _count(summary[0]), _count(summary[1])
    if records is None or base is None or not _is_digest(summary[2]):
        return None
    mark = HighWaterMark(epoch, records, summary[2], base)
    return mark, _mac(digester, mark)


def parse_mark(content: bytes, digester: KeyedDigester, location: str) -> HighWaterMark:
    """Return the head a mark holds; ``IntegrityFailure`` if it is malformed or forged."""
    if not isinstance(content, bytes):
        raise InvalidInput("a high-water mark is read as bytes")
    try:
        lines = content.decode("ascii").split("\n")
    except UnicodeDecodeError:
        lines = []
    head = _read_head(lines, digester)
    mac = _field(lines[-2], "mac") if head is not None else None
    if head is None or mac is None or not hmac.compare_digest(mac, head[1]):
        raise IntegrityFailure(
            f"the high-water mark at {location} does not verify under the store key: it was "
            "edited, or belongs to a store under another key",
            location=location,
            fix="check that FLOWVAULT_KEY or the key file is this store's key (a wrong key "
            "damages nothing); only if it is, treat the mark as edited and restore it from a "
            "backup",
        )
    return head[0]


def log_link(digester: KeyedDigester, chain: str, line: bytes) -> str:
    return digester.keyed_digest(LOG_TAG, chain.encode("ascii") + b"\n" + line)


def log_line(sizes: Mapping[str, int]) -> bytes:
    return canonical_bytes(dict(sizes)) + b"\n"


def apply_line(sizes: dict[str, int], line: Mapping[str, object]) -> None:
    """Apply one log line to ``sizes``, the size of every stream remembered.

    A positive size raises the stream's, never lowers it. ``0`` forgets the
    stream: it was dropped. ``-n`` forgets it and then remembers ``n``: it
    was dropped and started again within the commits the line covers. A
    flowvault that predates drops skips sizes below 1 and so keeps
    remembering a dropped stream: it refuses the store rather than missing
    a cut.
    """
    for stream, size in line.items():
        if not isinstance(stream, str) or type(size) is not int:
            continue
        if size > 0:
            if size > sizes.get(stream, 0):
                sizes[stream] = size
            continue
        sizes.pop(stream, None)
        if size < 0:
            sizes[stream] = -size


def replay_log(
    mark: HighWaterMark, log: bytes, digester: KeyedDigester, location: str
) -> dict[str, int]:
    """Return every remembered stream's size, as the log's lines leave it, once its chain matches.

    Raises:
        IntegrityFailure: the log is not the one the head's MAC chain covers.

    """
    if not isinstance(log, bytes):
        raise InvalidInput("a high-water mark's log is read as bytes")
    lines = log.split(b"\n")
    chain = LOG_GENESIS
    for line in lines[:-1]:
        chain = log_link(digester, chain, line)
    if lines[-1] or len(lines) - 1 != mark.records or not hmac.compare_digest(chain, mark.chain):
        raise IntegrityFailure(
            f"the stream sizes of the high-water mark at {location} do not match its MAC "
            "chain: the log was edited, cut short or replaced",
            location=location,
        )
    sizes: dict[str, int] = {}
    for line in lines[:-1]:
        apply_line(sizes, json.loads(line))
    return sizes


__all__ = [
    "LOG_GENESIS",
    "LOG_TAG",
    "MARK_HEADER",
    "MARK_TAG",
    "HighWaterMark",
    "MarkFile",
    "MarkState",
    "MarkWrite",
    "apply_line",
    "format_mark",
    "log_line",
    "log_link",
    "parse_mark",
    "replay_log",
]
