"""A store offering the port alone, its three optional reads answered by ``StoreCapabilities``.

The contract kit's label listing, label load and batch load tests run on it, so the
fallback is held to every rule an adapter offering the reads is held to.
"""

from __future__ import annotations

from collections.abc import Sequence

from flowvault.application import (
    MAX_LOAD_BATCH,
    LedgerPage,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    SecureObjectStore,
    StoreCapabilities,
    StoredRecord,
    UnitOfWork,
)
from flowvault.domain import InvalidInput, LedgerEvent


class PortOnlyReads:
    """A host's store offering the port alone; the three reads are the capabilities' fallback.

    ``load_many`` refuses more than ``MAX_LOAD_BATCH`` names, as the
    protocol does, before the fallback (which takes any number) answers.
    """

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner
        self._fallback = StoreCapabilities()
        assert StoreCapabilities.of(_Port(inner)) == StoreCapabilities()

    def list_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        return self._fallback.list_by_label(
            _Port(self._inner),
            namespace,
            label,
            descending=descending,
            filters=filters,
            cursor=cursor,
            limit=limit,
        )

    def load_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> list[StoredRecord]:
        return self._fallback.load_by_label(
            _Port(self._inner),
            namespace,
            label,
            descending=descending,
            filters=filters,
            limit=limit,
        )

    def load_many(self, namespace: str, key_digests: Sequence[str]) -> dict[str, StoredRecord]:
        if isinstance(key_digests, list | tuple) and len(key_digests) > MAX_LOAD_BATCH:
            raise InvalidInput(f"at most {MAX_LOAD_BATCH} key digests per call")
        return self._fallback.load_many(_Port(self._inner), namespace, key_digests)

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        return self._inner.load(namespace, key_digest)

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        return self._inner.peek_metadata(namespace, key_digest)

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        return self._inner.list(namespace, filters=filters, order=order, cursor=cursor, limit=limit)

    def commit(self, unit: UnitOfWork) -> None:
        self._inner.commit(unit)

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        return self._inner.ledger_head(stream)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        return self._inner.read_ledger(stream, from_index=from_index, limit=limit)

    def close(self) -> None:
        self._inner.close()


class _Port:
    """The inner store seen through the port alone, so the fallback cannot reach its own reads."""

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        return self._inner.load(namespace, key_digest)

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        return self._inner.list(namespace, filters=filters, order=order, cursor=cursor, limit=limit)
