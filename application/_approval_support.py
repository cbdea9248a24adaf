"""What the checkpoint, approval, idempotency and evidence services share.

Built only on the sealed repository and the store port. Every record is
addressed by a keyed digest of its natural key and carries a keyed integrity
digest that is checked on every read, so a record rebuilt without the
integrity key never verifies. Each change is one unit of work: an approval's
decision or expiry and its checkpoint's consumption commit together or not
at all, and retention deletions commit with their digest-only tombstones.

Each checkpoint has a record stream (``checkpoint_stream``) that also holds
the events of its approvals and their slots, so every row of those kinds
names the event that last wrote it and an older row put back is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from flowvault.application._compaction import compact_after_commit
from flowvault.application._freshness import CHECKPOINT_KIND, record_stream
from flowvault.application._graph import (
    RETENTION_TOMBSTONE,
    KeyedDigester,
)
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    Delete,
    LabelFilter,
    RecordMetadata,
    UnitOfWork,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import keyed, next_position
from flowvault.application.ports import Clock, SecureObjectStore
from flowvault.domain import (
    GENESIS_HASH,
    Approval,
    Checkpoint,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    RevisionConflict,
    Witness,
    sanitise_payload,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._envelope import format_instant

CHECKPOINTS = "flowvault.checkpoints"
APPROVALS = "flowvault.approvals"
APPROVAL_SLOTS = "flowvault.approval-slots"
"""One marker per (checkpoint, audience) naming the approval requested for it."""
REQUEST_IDEMPOTENCY = "flowvault.request-idempotency"
WITNESSES = "flowvault.witnesses"

CHECKPOINT_TAG = "flowvault.checkpoint/1"
APPROVAL_TAG = "flowvault.approval/1"
WITNESS_TAG = "flowvault.witness/1"
REQUEST_TAG = "flowvault.idempotency-request/1"
DECIDER_TAG = "flowvault.decider/1"
"""The workflow service's tag too, so one person has one digest in every receipt."""

MAX_WITNESS_BYTES: Final = 512 * 1024
"""Largest evidence body; base64 inside the sealed record stays under its 1 MiB limit."""
MAX_IDEMPOTENCY_KEY: Final = 256
MAX_ACTOR: Final = 256
PURGE_BATCH: Final = 200
RETRIES: Final = 8
"""How often a write is rebuilt when a concurrent writer moved what it was guarded on."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_Signed = TypeVar("_Signed", Checkpoint, Approval, Witness)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def _joined(*parts: str) -> str:
    return "\x1f".join(parts)


def _aware(moment: object, what: str) -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidInput(f"{what} must be a timezone-aware datetime")
    return moment


def _signed(
    model: type[_Signed], key: KeyedDigester, tag: str, fields: Mapping[str, Any]
) -> _Signed:
    """Validate ``fields`` and stamp the keyed digest of everything the model's body covers."""
    draft = model.model_validate({**fields, "integrity_digest": GENESIS_HASH})
    return draft.model_copy(update={"integrity_digest": _digest(key, tag, draft)})


def _digest(key: KeyedDigester, tag: str, value: Checkpoint | Approval | Witness) -> str:
    return key.keyed_digest(tag, canonical_bytes(value.integrity_body()))


def _horizon(now: datetime, older_than: timedelta) -> int:
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidInput("older_than must be a non-negative timedelta")
    try:
        return _micros(_aware(now, "now") - older_than)
    except OverflowError:
        raise InvalidInput("now - older_than lies before the first representable instant") from None


def _batch(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput("batch_size must be a positive integer")
    return min(batch_size, MAX_LIST_LIMIT)


def _list_all(
    store: SecureObjectStore, namespace: str, filters: Sequence[LabelFilter]
) -> Iterator[RecordMetadata]:
    cursor: str | None = None
    while True:
        page = store.list(namespace, filters=filters, cursor=cursor, limit=MAX_LIST_LIMIT)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def _open_listed(repository: SealedRepository, metadata: RecordMetadata) -> SealedDocument | None:
    """Open a listed record, or ``None`` when it was deleted after it was listed."""
    record = repository.store.load(metadata.namespace, metadata.key_digest)
    if record is None:
        return None
    return repository.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)


def checkpoint_stream(repository: SealedRepository, checkpoint_id: str) -> str:
    """Name the record stream of a checkpoint and of the approvals asked on it."""
    return record_stream(CHECKPOINT_KIND, repository.key_digest(CHECKPOINTS, checkpoint_id))


def _int_label(metadata: RecordMetadata, name: str) -> int:
    value = metadata.labels.get(name)
    return value if isinstance(value, int) else -1


# -- retention -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Doomed:
    """One record to purge: its deletions and the tombstone each of its streams receives.

    The owning stream (a run's, or the shared idempotency stream) tells the
    story; the record stream says the row is legitimately gone.
    """

    deletes: tuple[Delete, ...]
    streams: tuple[str, ...]
    tombstone: dict[str, JsonValue]


def _purge(
    repository: SealedRepository,
    clock: Clock,
    namespace: str,
    *,
    filters: Sequence[LabelFilter],
    batch_size: int,
    doom: Callable[[RecordMetadata], _Doomed | None],
) -> int:
    """Delete matching records a bounded batch per unit, each unit with its tombstones."""
    limit = _batch(batch_size)
    store = repository.store
    purged = stalled = 0
    while stalled < RETRIES:
        page = store.list(namespace, filters=filters, limit=limit)
        doomed = [item for item in map(doom, page.items) if item is not None]
        if not doomed:
            break
        try:
            store.commit(_purge_unit(repository, clock.now(), doomed))
        except RevisionConflict:
            stalled += 1
            continue
        purged += len(doomed)
    if purged:
        compact_after_commit(repository.capabilities.compactor)
    return purged


def _purge_unit(
    repository: SealedRepository, now: datetime, doomed: Sequence[_Doomed]
) -> UnitOfWork:
    """Chain each stream's tombstones consecutively onto its head, deletions alongside."""
    heads: dict[str, tuple[int, str]] = {}
    deletes: list[Delete] = []
    appends: list[LedgerEvent] = []
    for item in doomed:
        payload = sanitise_payload({**item.tombstone, "purged_at": format_instant(now)})
        for stream in item.streams:
            if stream not in heads:
                heads[stream] = next_position(repository.store, stream)
            index, previous = heads[stream]
            draft = LedgerEvent.create(
                stream=stream,
                index=index,
                type=RETENTION_TOMBSTONE,
                occurred_at=now,
                payload=payload,
                previous_hash=previous,
            )
            event = keyed(draft, repository)
            heads[stream] = (event.index + 1, event.event_hash)
            appends.append(event)
        deletes.extend(item.deletes)
    appends.sort(key=lambda event: (event.stream, event.index))
    return UnitOfWork(deletes=deletes, appends=appends)


# -- checkpoints ---------------------------------------------------------------
