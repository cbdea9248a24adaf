"""Cross-checking a record against the ledger event that last wrote it.

A record written in the same unit as an event of its stream carries that
event's index in its header, and so in its associated data. Someone who can
edit the database but lacks the keys can still put back an older row whole,
ciphertext and revision together; it opens, but it names an older event, and
the stream then holds a later event that wrote the record. Events that
leave the record as it is (a tombstone, a reset interrupted before its
delete) may follow the bound one; each must carry its chain MAC, so an
editor cannot dress a writing event up as one of them.

The row and the stream head are read one after the other, not in one
snapshot, so a write landing in between looks like staleness; a row is
called stale only when it is still the same row after the evidence was seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, Generic, Protocol, TypeVar

from flowvault.application._records import RecordMetadata
from flowvault.application._streams import mac_matches
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import EnvelopeHeader, IntegrityFailure, LedgerEvent, RevisionConflict

FRESH_READ_TRIES: Final = 16
"""Reads of a row that keeps being rewritten between its load and its stream's head."""

_PAGE: Final = 200


class _Digester(Protocol):
    def keyed_digest(self, tag: str, data: bytes | str) -> str: ...


class _Opened(Protocol):
    @property
    def metadata(self) -> RecordMetadata: ...


_O = TypeVar("_O", bound=_Opened)

LeavesRecord = Callable[[LedgerEvent, EnvelopeHeader], bool]
"""Whether an event after the bound one leaves the record as that header describes it."""


class StreamPolicy(Generic[_O]):
    """How one kind of record relates to the events of its stream."""

    __slots__ = ("_digester", "_leaves", "_unbound", "_what")

    def __init__(
        self,
        what: str,
        digester: _Digester,
        *,
        leaves_record: LeavesRecord,
        unbound_stale: Callable[[LedgerEvent, _O], bool],
    ) -> None:
        self._what = what
        self._digester = digester
        self._leaves = leaves_record
        self._unbound = unbound_stale

    def _is_stale(
        self,
        store: SecureObjectStore,
        stream: str,
        opened: _O,
        head: LedgerEvent | None,
    ) -> bool:
        """Return whether ``stream``, whose head is ``head``, shows the row is not current.

        A row naming an event the stream lacks counts as stale too: its
        newer history was cut off. A row written without an index (before
        schema 5) is judged by the head alone, as the kind of record allows.
        """
        header = opened.metadata.header
        bound = header.ledger_index
        if bound is None:
            return head is not None and self._unbound(head, opened)
        if head is None or head.index < bound:
            return True
        if head.index == bound:
            return False
        for event in _events_after(store, stream, bound, head.index):
            if event is None:
                return True
            if not (self._leaves(event, header) and mac_matches(event, self._digester)):
                return True
        return False

    def read(
        self,
        store: SecureObjectStore,
        stream: str,
        read: Callable[[], _O | None],
        *,
        with_head: bool = True,
    ) -> tuple[_O | None, LedgerEvent | None]:
        """Read a row with ``read`` and return it with the head it was checked against.

        A writer needs the head event to chain its own onto. A reader does
        not (``with_head=False``): when the stream's head index is the one
        the row names, the row is current and no event is decoded at all,
        and the head returned is ``None``.

        Raises:
            IntegrityFailure: the row is older than its stream says, and it
                was still the same row after that was seen.
            RevisionConflict: the row kept changing under every attempt.

        """
        for _ in range(FRESH_READ_TRIES):
            opened = read()
            if not with_head and _named_head(store, stream, opened):
                return opened, None
            head = store.ledger_head(stream)
            if opened is None:
                return None, head
            metadata = opened.metadata
            if not self._is_stale(store, stream, opened, head):
                return opened, head
            now = store.peek_metadata(metadata.namespace, metadata.key_digest)
            if now is not None and _same_row(now, metadata):
                raise IntegrityFailure(
                    f"{self._what} is older than its ledger: a later event of its stream "
                    "wrote it, or the event it names is missing (a replayed or rolled-back row)",
                    namespace=metadata.namespace,
                    key_digest=metadata.key_digest,
                    revision=metadata.revision,
                    ledger_index=metadata.header.ledger_index,
                )
        raise RevisionConflict(f"{self._what} kept changing while it was read; retry")

    def check_listed(
        self, store: SecureObjectStore, stream: str, listed: _O, reread: Callable[[], _O | None]
    ) -> _O | None:
        """Check a row a listing already read; read it again (``reread``) only if it looked stale.

        Returns the row, or ``None`` if it was deleted meanwhile.
        """
        pending = [listed]

        def read() -> _O | None:
            return pending.pop() if pending else reread()

        return self.read(store, stream, read, with_head=False)[0]


def _named_head(store: SecureObjectStore, stream: str, opened: _Opened | None) -> bool:
    """Whether the row is absent, or names the stream's head by its index alone.

    The ``StreamHeads`` capability is looked up by attribute: a runtime
    protocol check costs more than the query it would save.
    """
    if opened is None:
        return True
    bound = opened.metadata.header.ledger_index
    if bound is None:
        return False
    head_index: Callable[[str], int | None] | None = getattr(store, "ledger_head_index", None)
    return head_index is not None and head_index(stream) == bound


def _same_row(now: RecordMetadata, then: RecordMetadata) -> bool:
    return (now.revision, now.payload_digest) == (then.revision, then.payload_digest)


def _events_after(
    store: SecureObjectStore, stream: str, bound: int, last: int
) -> Iterator[LedgerEvent | None]:
    """Yield events ``bound + 1 .. last``; ``None`` where retained events skip some."""
    expected = bound + 1
    while expected <= last:
        page = store.read_ledger(stream, from_index=expected, limit=_PAGE)
        if page.gap or not page.events:
            yield None
            return
        for event in page.events:
            if event.index != expected:
                yield None
                return
            if event.index > last:
                return
            yield event
            expected += 1
