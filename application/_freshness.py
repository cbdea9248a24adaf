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

Records with no stream of their own (checkpoints, approvals and their
slots, idempotency markers, witnesses, action results, graph definitions
and their versions, run results) get a *record stream*, named by a keyed
digest so no natural key is in clear. Its events name, in a ``records``
list, the key digests of the rows they wrote; a retention tombstone, or an
event's ``deleted`` list, names the rows it deleted. The same stream tells
a row deleted outside flowvault (the stream still vouches for it) from one
never written, purged or deleted through its service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Final, Generic, Protocol, TypeVar

from flowvault.application._capabilities import StoreCapabilities
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._records import RecordMetadata
from flowvault.application._sealed import SealedRepository
from flowvault.application._streams import (
    chained_event,
    mac_matches,
    read_stream,
)
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application.ports import SecureObjectStore, StreamHeads
from flowvault.domain import (
    EnvelopeHeader,
    IntegrityFailure,
    JsonValue,
    LedgerEvent,
    RevisionConflict,
)

FRESH_READ_TRIES: Final = 16
"""Reads of a row that keeps being rewritten between its load and its stream's head."""

_PAGE: Final = 200


class _Repository(KeyedDigester, Protocol):
    """A keyed digester that also says what its store can do."""

    @property
    def capabilities(self) -> StoreCapabilities: ...


class _Opened(Protocol):
    @property
    def metadata(self) -> RecordMetadata: ...


_O = TypeVar("_O", bound=_Opened)

LeavesRecord = Callable[[LedgerEvent, EnvelopeHeader], bool]
"""Whether an event after the bound one leaves the record as that header describes it."""


class StreamPolicy(Generic[_O]):
    """How one kind of record relates to the events of its stream.

    A row written without a ledger index is held to every event of its
    stream, as if it named none: any event that wrote it is newer than it.
    """

    __slots__ = ("_digester", "_heads", "_leaves", "_what")

    def __init__(
        self,
        what: str,
        repository: _Repository,
        *,
        leaves_record: LeavesRecord,
    ) -> None:
        self._what = what
        self._digester = repository
        self._heads = repository.capabilities.heads
        self._leaves = leaves_record

    def _is_stale(
        self,
        store: SecureObjectStore,
        stream: str,
        opened: _O,
        head: LedgerEvent | None,
    ) -> bool:
        """Return whether ``stream``, whose head is ``head``, shows the row is not current.

        A row naming an event the stream lacks counts as stale too: its
        newer history was cut off.
        """
        header = opened.metadata.header
        bound = header.ledger_index
        if head is None:
            return bound is not None
        bound = -1 if bound is None else bound
        if head.index <= bound:
            return head.index < bound
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
            if not with_head and _named_head(self._heads, stream, opened):
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

    def read_vouched(
        self,
        store: SecureObjectStore,
        stream: str,
        row: tuple[str, str],
        read: Callable[[], _O | None],
    ) -> _O | None:
        """Read a record-stream row; absent is right only if unwritten or deleted by a keyed event.

        A record stream names many rows, so its head alone cannot say
        whether this one was removed on purpose: the newest event naming
        the row must be a deletion carrying a valid chain MAC (an editor
        cannot forge one to excuse a deletion).

        Raises:
            IntegrityFailure: the row is older than its stream says, or it is
                missing although its stream records it and no deletion.
            RevisionConflict: the row kept changing under every attempt.

        """
        key_digest = row[1]

        def writer(_head: LedgerEvent) -> LedgerEvent | None:
            last = last_writer(store, stream, key_digest)
            if last is None or (
                key_digest in deleted_by(last) and mac_matches(last, self._digester)
            ):
                return None
            return last

        return self.read_owned(store, stream, row, read, writer=writer)[0]

    def read_owned(
        self,
        store: SecureObjectStore,
        stream: str,
        row: tuple[str, str],
        read: Callable[[], _O | None],
        *,
        writer: Callable[[LedgerEvent], LedgerEvent | None],
        with_head: bool = False,
    ) -> tuple[_O | None, LedgerEvent | None]:
        """Read a row its stream vouches for; missing while the stream says it exists is refused.

        ``writer(head)`` returns the event that says the row exists, or
        ``None`` when the stream shows it removed on purpose (a purge, a
        reset) or never written. A row absent while such an event stands,
        once looked for again (a write may have landed between the reads),
        was deleted or moved outside flowvault.

        Raises:
            IntegrityFailure: the row is older than its stream says, or is
                missing (``details["missing"]``; ``details["ledger_index"]`` is
                the event that says it exists).
            RevisionConflict: the row kept changing under every attempt.

        """
        for _ in range(FRESH_READ_TRIES):
            opened, head = self.read(store, stream, read, with_head=with_head)
            if opened is not None:
                return opened, head
            head = store.ledger_head(stream) if head is None else head
            written = None if head is None else writer(head)
            if written is None:
                return None, head
            if store.peek_metadata(*row) is None:
                namespace, key_digest = row
                raise IntegrityFailure(
                    f"{self._what} is missing, but its ledger stream says it exists (event "
                    f"{written.index}) and was not removed since: it was deleted outside "
                    "flowvault; restore it from a backup",
                    namespace=namespace,
                    key_digest=key_digest,
                    ledger_index=written.index,
                    missing=True,
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


def _named_head(heads: StreamHeads | None, stream: str, opened: _Opened | None) -> bool:
    """Whether the row is absent, or names the stream's head by its index alone."""
    if opened is None:
        return True
    bound = opened.metadata.header.ledger_index
    if bound is None:
        return False
    return heads is not None and heads.ledger_head_index(stream) == bound


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


CHECKPOINT_KIND: Final = "checkpoint"
"""Record streams ``checkpoint/<digest>``: a checkpoint, its approvals and their slots."""
IDEMPOTENCY_KIND: Final = "idempotency"
"""Record streams ``idempotency/<digest>``: one idempotency marker each, of any service."""
WITNESS_KIND: Final = "witness"
"""Record streams ``witness/<digest>``: one evidence witness each."""
ACTION_RESULT_KIND: Final = "action-result"
"""Record streams ``action-result/<digest>``: one action result each."""
DEFINITION_KIND: Final = "definition"
"""Record streams ``definition/<digest>``: a graph definition's head and its versions."""
RESULT_KIND: Final = "result"
"""Record streams ``result/<digest>``: one run result each (``ResultRepository``)."""

RECORDS_FIELD: Final = "records"
"""Payload field of a record-stream event: the key digests of the rows it wrote."""
DELETED_FIELD: Final = "deleted"
"""Payload field of a record-stream event: the key digests of the rows it deleted."""

_TOMBSTONE_FIELDS: Final = ("record", "slot", "idempotency_marker")
"""Fields of a retention tombstone that name a row it deleted."""


def record_stream(kind: str, key_digest: str) -> str:
    """Name the stream that vouches for one record: its kind and key digest, no natural key."""
    return f"{kind}/{key_digest.removeprefix('sha256:')}"


def record_payload(*key_digests: str, **extra: JsonValue) -> dict[str, JsonValue]:
    """Return a record-stream event payload naming the rows its unit writes."""
    return {RECORDS_FIELD: list(key_digests), **extra}


def record_event(
    repository: SealedRepository,
    stream: str,
    event_type: str,
    payload: JsonValue,
    occurred_at: datetime,
) -> LedgerEvent:
    """Build the keyed event a record-stream unit appends at the stream's next position.

    Its index goes into the header of every row the unit writes; a writer
    racing for the same position loses at commit, and its retry re-reads.
    """
    head = repository.store.ledger_head(stream)
    return chained_event(repository, stream, event_type, payload, occurred_at, after=head)


def _named(payload: dict[str, JsonValue], field: str) -> frozenset[str]:
    listed = payload.get(field)
    named = listed if isinstance(listed, list) else []
    return frozenset(name for name in named if isinstance(name, str))


def deleted_by(event: LedgerEvent) -> frozenset[str]:
    """Return the key digests of the rows ``event`` deleted: a tombstone's, or its ``deleted``."""
    payload = event.payload
    if not isinstance(payload, dict):
        return frozenset()
    if event.type == RETENTION_TOMBSTONE:
        fields = [payload.get(field) for field in _TOMBSTONE_FIELDS]
        return frozenset(name for name in fields if isinstance(name, str))
    return _named(payload, DELETED_FIELD)


def written_by(event: LedgerEvent) -> frozenset[str]:
    """Return the key digests of the rows ``event`` wrote or deleted."""
    payload = event.payload
    if not isinstance(payload, dict) or event.type == RETENTION_TOMBSTONE:
        return deleted_by(event)
    return _named(payload, RECORDS_FIELD) | _named(payload, DELETED_FIELD)


def leaves_unnamed(event: LedgerEvent, header: EnvelopeHeader) -> bool:
    """Say whether a record-stream event leaves the row alone: it does not name it."""
    return header.key_digest not in written_by(event)


def last_writer(store: SecureObjectStore, stream: str, key_digest: str) -> LedgerEvent | None:
    """Return the newest event of ``stream`` that wrote or deleted the row ``key_digest``."""
    found = None
    for event in read_stream(store, stream):
        if key_digest in written_by(event):
            found = event
    return found
