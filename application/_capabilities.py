"""The store's optional capabilities, looked up once when it is opened.

Beyond ``SecureObjectStore`` a store may offer ten small capabilities
(``ports``), eight of them in two tiers:

- the durable-store tier, what tells this store from an older or cut-down
  copy of it: ``StoreEpoch`` and ``StreamCatalog``, and two that only make
  the checks cheaper, ``StreamHeads`` and ``StreamHeadBatch``;
- the maintenance tier, what keys and disks need: ``StoreStats``,
  ``SealCounter`` and ``Compactor``, and ``Vacuumer``, an operator's extra;

and ``RecordLock``, which only makes contended state updates faster, and
``StoreClock``, the server's time that run leases are judged by.

Services hold one ``StoreCapabilities`` and call through it, rather than
asking the store on every call; a store offering part of a tier keeps the
parts it offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Final, Protocol

from flowvault.application.ports import (
    MAX_HEAD_BATCH,
    Compactor,
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
from flowvault.domain import LedgerEvent


class HeadReader(Protocol):
    """What every store offers for a stream's head: the fallback of ``head_indexes``."""

    def ledger_head(self, stream: str) -> LedgerEvent | None: ...


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

    def __repr__(self) -> str:
        offered = [part.name for part in fields(self) if getattr(self, part.name) is not None]
        return f"StoreCapabilities({', '.join(offered)})"


__all__ = ["DURABLE_TIER", "MAINTENANCE_TIER", "StoreCapabilities"]
