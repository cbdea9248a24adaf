"""Whole-store anti-rollback: a MAC'd high-water mark of the store's commit count.

Every row and chain of an older copy of the database is genuine, so nothing
inside the store can show that the copy was put back over the live one.
The mark, kept outside the database (beside the keys), remembers the highest
commit count this host has seen; a store opened below it is refused with
``STORE_ROLLED_BACK``. It is advanced, and made durable, after every commit,
so the window it cannot see is the commit in flight. A MAC under the
integrity key keeps someone without the key from lowering or forging it.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import structlog

from flowvault.application._graph import KeyedDigester
from flowvault.application._records import (
    LabelFilter,
    LedgerPage,
    Order,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    UnitOfWork,
)
from flowvault.application.ports import SecureObjectStore, StoreEpoch
from flowvault.domain import (
    MAX_SAFE_INTEGER,
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    StoreRolledBack,
    canonical_bytes,
)

MARK_TAG: Final = "flowvault.high-water/1"
"""Purpose tag of the mark's MAC."""

MARK_HEADER: Final = "flowvault high-water mark 1"

_log = structlog.get_logger("flowvault.high_water")


class MarkFile(Protocol):
    """Where the mark lives: a small file outside the database directory."""

    @property
    def location(self) -> str:
        """Where the mark is, for messages."""
        ...

    def read(self) -> bytes | None:
        """Return the mark's bytes, or ``None`` when there is none."""
        ...

    def update(self, change: Callable[[bytes | None], bytes | None]) -> None:
        """Under an exclusive lock, pass the current bytes to ``change`` and write its result.

        ``None`` from ``change`` leaves the mark as it is. The write is
        durable (fsynced, and a torn write never replaces a whole mark)
        before this returns.
        """
        ...


def _mac(digester: KeyedDigester, epoch: int) -> str:
    return digester.keyed_digest(MARK_TAG, canonical_bytes([MARK_HEADER, epoch]))


def format_mark(epoch: int, digester: KeyedDigester) -> bytes:
    """Render the mark for ``epoch``: a header, the epoch, and its MAC."""
    return f"{MARK_HEADER}\nepoch {epoch}\nmac {_mac(digester, epoch)}\n".encode("ascii")


def parse_mark(content: bytes, digester: KeyedDigester, location: str) -> int:
    """Return the epoch a mark holds; ``IntegrityFailure`` if it is malformed or forged."""
    forged = IntegrityFailure(
        f"the high-water mark at {location} does not verify under the store key: it was "
        "edited, or belongs to a store under another key",
        location=location,
    )
    if not isinstance(content, bytes):
        raise InvalidInput("a high-water mark is read as bytes")
    try:
        header, epoch_line, mac_line, end = content.decode("ascii").split("\n")
    except (UnicodeDecodeError, ValueError):
        raise forged from None
    digits = epoch_line.removeprefix("epoch ")
    if header != MARK_HEADER or end or not digits.isdigit() or len(digits) > 16:
        raise forged
    epoch = int(digits)
    if epoch > MAX_SAFE_INTEGER or not mac_line.startswith("mac "):
        raise forged
    if not hmac.compare_digest(mac_line.removeprefix("mac "), _mac(digester, epoch)):
        raise forged
    return epoch


class AntiRollback:
    """Checks a store against its high-water mark on open, and advances the mark after commits."""

    def __init__(self, store: StoreEpoch, marks: MarkFile, digester: KeyedDigester) -> None:
        self._store = store
        self._marks = marks
        self._digester = digester
        self._written = -1
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        """Where the mark is kept."""
        return self._marks.location

    def check(self) -> int:
        """Refuse a store below the mark, then record its count; return the mark found.

        A missing mark is started at the store's count: there is nothing to
        compare with yet, as on a store's first open under this feature. It
        is logged as a warning unless the store is new, since deleting the
        mark is also how someone would hide a restore.

        Raises:
            StoreRolledBack: the store's count is below the mark.
            IntegrityFailure: the mark does not verify under the key.

        """
        content = self._marks.read()
        current = self._store.epoch()
        if content is None:
            if current:
                _log.warning("high_water_mark_started", location=self.location, epoch=current)
            self.advance()
            return 0
        seen = parse_mark(content, self._digester, self.location)
        if current < seen:
            raise StoreRolledBack(
                f"the store is at commit {current} but this host already saw it at commit "
                f"{seen} (high-water mark {self.location}): an older copy of the database "
                "was restored over it, and the commits since that copy are gone",
                epoch=current,
                high_water=seen,
            )
        self.advance()
        return seen

    def advance(self) -> None:
        """Raise the mark to the store's count if it is higher; never lower it.

        The file is shared by every process of this host, so the new mark
        is the higher of the one found and this store's count. Threads of
        one process take turns, so the units of one group commit, which
        share a count, write the mark once.
        """
        with self._lock:
            self._advance_to(self._store.epoch())

    def _advance_to(self, current: int) -> None:
        if current <= self._written:
            return

        def raised(content: bytes | None) -> bytes | None:
            if content is not None:
                try:
                    if parse_mark(content, self._digester, self.location) >= current:
                        return None
                except IntegrityFailure:
                    _log.warning("high_water_mark_replaced", location=self.location)
            return format_mark(current, self._digester)

        self._marks.update(raised)
        self._written = current

    def accept(self) -> tuple[int | None, int]:
        """Accept the store as it is after a deliberate restore: set the mark to its count.

        Returns the mark found (``None`` if none or unreadable) and the new one.
        """
        current = self._store.epoch()
        found: list[int | None] = [None]

        def replaced(content: bytes | None) -> bytes:
            if content is not None:
                try:
                    found[0] = parse_mark(content, self._digester, self.location)
                except IntegrityFailure:
                    found[0] = None
            return format_mark(current, self._digester)

        with self._lock:
            self._marks.update(replaced)
            self._written = current
        _log.warning(
            "high_water_mark_accepted", location=self.location, previous=found[0], epoch=current
        )
        return found[0], current


class HighWaterStore:
    """The store with its mark advanced after every commit; everything else passes through.

    Optional capabilities (``StoreStats``, ``Compactor``...) are forwarded as
    the wrapped store has them, so ``isinstance`` checks see the same store.
    """

    def __init__(self, store: SecureObjectStore, guard: AntiRollback) -> None:
        self._store = store
        self._guard = guard

    @property
    def wrapped(self) -> SecureObjectStore:
        """The store underneath."""
        return self._store

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Forward to the store."""
        return self._store.load(namespace, key_digest)

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        """Forward to the store."""
        return self._store.peek_metadata(namespace, key_digest)

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[LabelFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Forward to the store."""
        return self._store.list(namespace, filters=filters, order=order, cursor=cursor, limit=limit)

    def commit(self, unit: UnitOfWork) -> None:
        """Commit, then advance the mark past this commit before acknowledging it.

        The commit is durable once the store returns; a mark that cannot be
        written then is logged (``high_water_mark_deferred``) rather than
        raised, since an error would tell the caller the commit failed and
        its retry would conflict. The next commit or ``close`` writes it.
        """
        self._store.commit(unit)
        if not unit.empty:
            self._advance()

    def _advance(self) -> None:
        try:
            self._guard.advance()
        except FlowvaultError as exc:
            _log.warning("high_water_mark_deferred", code=exc.code, location=self._guard.location)

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Forward to the store."""
        return self._store.ledger_head(stream)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Forward to the store."""
        return self._store.read_ledger(stream, from_index=from_index, limit=limit)

    def close(self) -> None:
        """Advance the mark one last time, then close the store."""
        try:
            self._advance()
        finally:
            self._store.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def __repr__(self) -> str:
        return f"HighWaterStore({self._store!r})"


__all__ = [
    "MARK_HEADER",
    "MARK_TAG",
    "AntiRollback",
    "HighWaterStore",
    "MarkFile",
    "format_mark",
    "parse_mark",
]
