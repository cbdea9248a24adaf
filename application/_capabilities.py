"""The store's optional capabilities, looked up once when it is opened.

Beyond ``SecureObjectStore`` a store may offer thirteen small capabilities
(``ports``), eight of them in two tiers:

- the durable-store tier, what tells this store from an older or cut-down
  copy of it: ``StoreEpoch`` and ``StreamCatalog``, and two that only make
  the checks cheaper, ``StreamHeads`` and ``StreamHeadBatch``;
- the maintenance tier, what keys and disks need: ``StoreStats``,
  ``SealCounter`` and ``Compactor``, and ``Vacuumer``, an operator's extra;

``RecordLock``, which only makes contended state updates faster,
``StoreClock``, the server's time that run leases are judged by, and three
reads that only save round trips, ``LabelListing``, ``LabelLoad`` and
``BatchLoad``: for a store without them ``list_by_label``,
``load_by_label`` and ``load_many`` here answer the same through ``list``
and ``load``.

Services hold one ``StoreCapabilities`` and call through it, rather than
asking the store on every call; a store offering part of a tier keeps the
parts it offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Final, Protocol

from flowvault.application._record_reads import key_digest_names, label_listing_args, label_page
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    FilterOp,
    LabelFilter,
    LabelValue,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoredRecord,
)
from flowvault.application.ports import (
    MAX_HEAD_BATCH,
    MAX_LOAD_BATCH,
    BatchLoad,
    Compactor,
    LabelListing,
    LabelLoad,
    RecordLock,
    SealCounter,
    StoreClock,
    StoreEpoch,
    StoreStats,
    StreamCatalog,
    StreamHeadBatch,
    StreamHeads,
    Vacuumer,
)
from flowvault.domain import InvalidInput, LedgerEvent

_LOWEST: Final[tuple[LabelValue, LabelValue]] = (-(2**63 - 1), "")
"""The least integer and the least text a label holds: ``GE`` each selects that type's values."""


class HeadReader(Protocol):
    """What every store offers for a stream's head: the fallback of ``head_indexes``."""

    def ledger_head(self, stream: str) -> LedgerEvent | None: ...


class RecordReader(Protocol):
    """What every store offers to read records: the fallbacks of the two optional reads."""

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None: ...

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage: ...


DURABLE_TIER: Final = "durable store"
MAINTENANCE_TIER: Final = "maintenance"

_GUARANTEES: Final = (
    (DURABLE_TIER, "epoch", "an older copy of the store put back is not refused (no StoreEpoch)"),
    (
        DURABLE_TIER,
        "catalog",
        "streams cannot be listed: no whole-store audit, and the high-water mark knows only "
        "streams this host wrote (no StreamCatalog)",
    ),
    (
        MAINTENANCE_TIER,
        "stats",
        "no key is created for the store, no key rotation, no record counts (no StoreStats)",
    ),
    (
        MAINTENANCE_TIER,
        "seals",
        "the nonce budget is counted per process and restarts at zero (no SealCounter)",
    ),
    (
        MAINTENANCE_TIER,
        "compactor",
        "deleted and overwritten bytes stay on disk until the backend reuses them (no Compactor)",
    ),
)
"""What flowvault cannot promise without each capability that carries a guarantee.

``heads``, ``head_batch``, ``vacuumer``, ``record_lock`` and ``clock`` are
left out: without them the same checks run, only slower, ``compact``
compacts without rebuilding, contended updates retry on their guards alone,
and run leases follow the host's clock.
"""


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """The optional parts of one store; each is the store itself, or ``None`` where it lacks it.

    A call through a field costs what a call on the store does: the lookup
    was made once, by ``of``.
    """

    epoch: StoreEpoch | None = None
    catalog: StreamCatalog | None = None
    heads: StreamHeads | None = None
    head_batch: StreamHeadBatch | None = None
    stats: StoreStats | None = None
    seals: SealCounter | None = None
    compactor: Compactor | None = None
    vacuumer: Vacuumer | None = None
    record_lock: RecordLock | None = None
    clock: StoreClock | None = None
    label_listing: LabelListing | None = None
    label_load: LabelLoad | None = None
    batch_load: BatchLoad | None = None

    @classmethod
    def of(cls, store: object) -> StoreCapabilities:
        """Return what ``store`` offers, found by shape as the protocols define it."""
        return cls(
            epoch=store if isinstance(store, StoreEpoch) else None,
            catalog=store if isinstance(store, StreamCatalog) else None,
            heads=store if isinstance(store, StreamHeads) else None,
            head_batch=store if isinstance(store, StreamHeadBatch) else None,
            stats=store if isinstance(store, StoreStats) else None,
            seals=store if isinstance(store, SealCounter) else None,
            compactor=store if isinstance(store, Compactor) else None,
            vacuumer=store if isinstance(store, Vacuumer) else None,
            record_lock=store if isinstance(store, RecordLock) else None,
            clock=store if isinstance(store, StoreClock) else None,
            label_listing=store if isinstance(store, LabelListing) else None,
            label_load=store if isinstance(store, LabelLoad) else None,
            batch_load=store if isinstance(store, BatchLoad) else None,
        )

    def lost(self) -> dict[str, tuple[str, ...]]:
        """Return, per tier, what flowvault cannot guarantee for this store; empty if nothing."""
        lost: dict[str, tuple[str, ...]] = {}
        for tier, field, without in _GUARANTEES:
            if getattr(self, field) is None:
                lost[tier] = (*lost.get(tier, ()), without)
        return lost

    def head_indexes(self, store: HeadReader, names: Sequence[str]) -> dict[str, int]:
        """Return each named stream's head index, by the quickest call ``store`` offers.

        A batch store answers ``MAX_HEAD_BATCH`` names a call; otherwise each
        name costs one call. Streams with no event are left out.
        """
        if self.head_batch is not None:
            found: dict[str, int] = {}
            for start in range(0, len(names), MAX_HEAD_BATCH):
                chunk = names[start : start + MAX_HEAD_BATCH]
                found.update(self.head_batch.ledger_head_indexes(chunk))
            return found
        if self.heads is not None:
            indexes = {name: self.heads.ledger_head_index(name) for name in names}
            return {name: index for name, index in indexes.items() if index is not None}
        heads = {name: store.ledger_head(name) for name in names}
        return {name: head.index for name, head in heads.items() if head is not None}

    def list_by_label(
        self,
        store: RecordReader,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of ``LabelListing.list_by_label``, from the capability or from ``list``.

        Without the capability every record of the namespace carrying the
        label (and matching ``filters``) past the cursor is read through
        ``list``, one type of value at a time, and sorted here: the same
        page, at a cost that grows with the namespace rather than the page.
        """
        if self.label_listing is not None:
            return self.label_listing.list_by_label(
                namespace, label, descending=descending, filters=filters, cursor=cursor, limit=limit
            )
        limit, position = label_listing_args(
            namespace, label, descending=descending, filters=filters, cursor=cursor, limit=limit
        )
        segments = list(_LOWEST[::-1] if descending else _LOWEST)
        if position is not None:
            while isinstance(segments[0], str) != isinstance(position.value, str):
                segments.pop(0)
        candidates: list[RecordMetadata] = []
        for bottom in segments:
            wanted: list[RecordFilter] = [*filters, LabelFilter(label, bottom, FilterOp.GE)]
            if position is not None and isinstance(position.value, str) == isinstance(bottom, str):
                op = FilterOp.LE if descending else FilterOp.GE
                wanted.append(LabelFilter(label, position.value, op))
            candidates += _every_match(store, namespace, wanted)
        return label_page(
            candidates, label, descending=descending, position=position, limit=limit
        )

    def load_by_label(
        self,
        store: RecordReader,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> list[StoredRecord]:
        """Return ``LabelLoad.load_by_label``, from the capability or by listing and loading.

        Without the capability the first page of ``list_by_label`` is read,
        then its records in one ``load_many``; a record deleted or rewritten
        between the two reads is left out, so what is returned still holds
        the place and the metadata it was listed with.
        """
        if self.label_load is not None:
            return self.label_load.load_by_label(
                namespace, label, descending=descending, filters=filters, limit=limit
            )
        page = self.list_by_label(
            store, namespace, label, descending=descending, filters=filters, limit=limit
        )
        loaded = self.load_many(store, namespace, [meta.key_digest for meta in page.items])
        return [
            record
            for meta in page.items
            if (record := loaded.get(meta.key_digest)) is not None and record.metadata == meta
        ]

    def load_many(
        self, store: RecordReader, namespace: str, key_digests: Sequence[str]
    ) -> dict[str, StoredRecord]:
        """Return the stored records among ``key_digests``, by the quickest call ``store`` offers.

        A batch store answers ``MAX_LOAD_BATCH`` names a call; otherwise each
        name costs one ``load``. Absent records are left out; any number of
        names is taken.
        """
        if not isinstance(namespace, str):
            raise InvalidInput("namespace must be text")
        names = key_digest_names(key_digests)
        if self.batch_load is not None:
            found: dict[str, StoredRecord] = {}
            for start in range(0, len(names), MAX_LOAD_BATCH):
                chunk = names[start : start + MAX_LOAD_BATCH]
                found.update(self.batch_load.load_many(namespace, chunk))
            return found
        records = {name: store.load(namespace, name) for name in names}
        return {name: record for name, record in records.items() if record is not None}

    def __repr__(self) -> str:
        offered = [part.name for part in fields(self) if getattr(self, part.name) is not None]
        return f"StoreCapabilities({', '.join(offered)})"


def _every_match(
    store: RecordReader, namespace: str, filters: Sequence[RecordFilter]
) -> list[RecordMetadata]:
    """Return every record ``list`` finds for ``filters``, page after page."""
    found: list[RecordMetadata] = []
    cursor: str | None = None
    while True:
        page = store.list(namespace, filters=filters, cursor=cursor, limit=MAX_LIST_LIMIT)
        found += page.items
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


__all__ = ["DURABLE_TIER", "MAINTENANCE_TIER", "StoreCapabilities"]
