"""The store's optional capabilities: looked up once at open, in tiers, and what is lost without."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from log_capture import capture_logs

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.system import MarkFileStore
from flowvault.application import (
    MAX_LOAD_BATCH,
    FilterOp,
    LabelFilter,
    LedgerPage,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    SealedRepository,
    SecureObjectStore,
    StoreCapabilities,
    StoredRecord,
    UnitOfWork,
)
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._capabilities import DURABLE_TIER, MAINTENANCE_TIER
from flowvault.application._high_water_store import HighWaterStore
from flowvault.application._rotation import KeyRotation
from flowvault.application._sealed import CipherDigester
from flowvault.application.testing import make_upsert
from flowvault.composition import Settings, bootstrap
from flowvault.domain import InvalidInput, LedgerEvent, StoreUnavailable, WorkOrder

KEY = bytes(range(32))


class PortOnly:
    """A host's store offering the required port and nothing more."""

    def __init__(self) -> None:
        self._inner = InMemorySecureObjectStore()

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


def _order(key: str = "req-1") -> WorkOrder:
    return WorkOrder(kind="k.review", parameters={"p": 1}, requester="r", idempotency_key=key)


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record every store whose capabilities are looked up."""
    seen: list[object] = []
    real = StoreCapabilities.of

    def counted(store: object) -> StoreCapabilities:
        seen.append(store)
        return real(store)

    monkeypatch.setattr(StoreCapabilities, "of", staticmethod(counted))
    return seen


def test_a_bundled_store_offers_every_guarantee() -> None:
    """The memory store lacks only ``Vacuumer``, which carries no guarantee of its own."""
    store = InMemorySecureObjectStore()
    capabilities = StoreCapabilities.of(store)
    assert capabilities.vacuumer is None
    assert capabilities.epoch is capabilities.stats is capabilities.compactor is store
    assert capabilities.lost() == {}
    assert repr(capabilities) == (
        "StoreCapabilities(epoch, catalog, heads, head_batch, stats, seals, compactor, "
        "label_listing, label_load, batch_load)"
    )


def test_the_memory_and_sqlite_stores_offer_no_record_lock(tmp_path: Path) -> None:
    """SQLite serialises writers on its file and memory in its process: neither takes a lock."""
    from flowvault.adapters.sqlite import SQLiteSecureObjectStore  # noqa: PLC0415

    with SQLiteSecureObjectStore.open(tmp_path / "store.db", create=True) as sqlite_store:
        assert StoreCapabilities.of(sqlite_store).record_lock is None
    assert StoreCapabilities.of(InMemorySecureObjectStore()).record_lock is None


def test_a_store_with_the_port_alone_has_no_tier() -> None:
    """Every capability is ``None``, and each guarantee it would carry is named under its tier."""
    capabilities = StoreCapabilities.of(PortOnly())
    assert capabilities == StoreCapabilities()
    lost = capabilities.lost()
    assert list(lost) == [DURABLE_TIER, MAINTENANCE_TIER]
    assert [len(lost[DURABLE_TIER]), len(lost[MAINTENANCE_TIER])] == [2, 3]
    assert "StoreEpoch" in lost[DURABLE_TIER][0]
    assert "Compactor" in lost[MAINTENANCE_TIER][-1]


def test_opening_logs_once_what_a_store_without_the_tiers_loses(
    lookups: list[object],
) -> None:
    """One warning at open, and the services degrade as they did without the capabilities."""
    store = PortOnly()
    with capture_logs() as logs:
        vault = bootstrap(Settings(backend="memory"), key=KEY, store=store)
    with vault:
        missing = [entry for entry in logs if entry["event"] == "store_guarantees_missing"]
        assert missing == [
            {
                "event": "store_guarantees_missing",
                "store": "PortOnly",
                "lost": StoreCapabilities().lost(),
                "log_level": "warning",
            }
        ]
        assert vault.capabilities == StoreCapabilities()
        record, _ = vault.workflows.create(_order())
        done = vault.workflows.transition(
            record.workflow_id, "cancelled", expected_state="intake", expected_version=1
        )
        assert vault.workflows.get(done.workflow_id).state == "cancelled"
        assert vault.workflows.compact() is True
        assert vault.runs.compact() is True
        assert not vault.repository.budget.persistent
        with pytest.raises(InvalidInput):
            KeyRotation(vault.repository)
        with pytest.raises(StoreUnavailable):
            vault.audit().run()
    assert lookups == [store]


def test_a_bundled_store_opens_without_the_warning(lookups: list[object]) -> None:
    """Nothing is lost, so nothing is said; and the lookup is made once for every service."""
    with (
        capture_logs() as logs,
        bootstrap(Settings(backend="memory"), key=KEY, create=True) as vault,
    ):
        record, _ = vault.workflows.create(_order())
        assert vault.workflows.get(record.workflow_id).state == "intake"
        assert vault.audit().run().ok
    assert [entry for entry in logs if entry["event"] == "store_guarantees_missing"] == []
    assert len(lookups) == 1


def test_services_use_the_store_beneath_the_high_water_decorator(tmp_path: Path) -> None:
    """The capabilities are the wrapped store's, so no call goes through the decorator for one."""
    with bootstrap(Settings(backend="sqlite", home=tmp_path), key=KEY, create=True) as vault:
        guarded = vault.store
        assert isinstance(guarded, HighWaterStore)
        assert vault.capabilities.epoch is guarded.wrapped
        assert vault.capabilities.compactor is guarded.wrapped
        assert vault.repository.capabilities is vault.capabilities


def test_the_mark_refuses_a_store_without_a_commit_count(tmp_path: Path) -> None:
    """Fail closed at construction rather than on the first check."""
    digester = CipherDigester(AesGcmCipher(KEY))
    with pytest.raises(InvalidInput, match="StoreEpoch"):
        AntiRollback(PortOnly(), MarkFileStore(tmp_path / "mark"), digester)


def test_given_capabilities_are_used_as_they_are(lookups: list[object]) -> None:
    """A caller that looked them up already is not second-guessed."""
    store: SecureObjectStore = InMemorySecureObjectStore()
    given = StoreCapabilities(stats=InMemorySecureObjectStore())
    with bootstrap(Settings(backend="memory"), key=KEY, store=store) as vault:
        lookups.clear()
        repository = SealedRepository(store, vault.cipher, vault.clock, capabilities=given)
        assert repository.capabilities is given
        assert not repository.budget.persistent
    assert lookups == []


class CountedBatches(InMemorySecureObjectStore):
    """The memory store, counting its ``load_many`` calls and the names each carried."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def load_many(self, namespace: str, key_digests: Sequence[str]) -> dict[str, StoredRecord]:
        self.batches.append(len(key_digests))
        return super().load_many(namespace, key_digests)


def test_load_many_splits_a_long_list_into_batches_of_the_cap() -> None:
    """Through the capability, 450 distinct names cost three calls; through ``load``, none."""
    store = CountedBatches()
    upserts = [make_upsert("ns", f"k{n}") for n in range(5)]
    store.commit(UnitOfWork(upserts=upserts))
    names = [u.header.key_digest for u in upserts]
    names += [f"sha256:{n:064x}" for n in range(2 * MAX_LOAD_BATCH + 50 - len(names))]
    found = StoreCapabilities.of(store).load_many(store, "ns", [*names, *names])
    assert store.batches == [MAX_LOAD_BATCH, MAX_LOAD_BATCH, 50]
    assert set(found) == {u.header.key_digest for u in upserts}
    assert StoreCapabilities.of(PortOnly()) == StoreCapabilities()
    assert StoreCapabilities().load_many(store, "ns", names) == found
    assert store.batches == [MAX_LOAD_BATCH, MAX_LOAD_BATCH, 50]


def test_the_label_listing_fallback_reads_only_past_the_cursor() -> None:
    """Past a text cursor the fallback asks ``list`` for text values from the cursor's on alone."""
    port = PortOnly()
    port.commit(
        UnitOfWork(
            upserts=[make_upsert("ns", f"k{n}", labels={"cid": f"c{n:02d}"}) for n in range(9)]
            + [make_upsert("ns", "i", labels={"cid": 4})]
        )
    )
    asked: list[tuple[RecordFilter, ...]] = []
    real = port.list

    def listing(namespace: str, **kw: Any) -> RecordPage:
        asked.append(tuple(kw["filters"]))
        return real(namespace, **kw)

    port.list = listing  # type: ignore[method-assign]
    fallback = StoreCapabilities()
    first = fallback.list_by_label(port, "ns", "cid", descending=True, limit=3)
    assert [meta.labels["cid"] for meta in first.items] == ["c08", "c07", "c06"]
    asked.clear()
    rest = fallback.list_by_label(port, "ns", "cid", descending=True, cursor=first.next_cursor)
    expected: list[object] = [f"c{n:02d}" for n in range(5, -1, -1)]
    assert [meta.labels["cid"] for meta in rest.items] == [*expected, 4]
    assert asked[0] == (
        LabelFilter("cid", "", FilterOp.GE),
        LabelFilter("cid", "c06", FilterOp.LE),
    )
    assert asked[1] == (LabelFilter("cid", -(2**63 - 1), FilterOp.GE),)
