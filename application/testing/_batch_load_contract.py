"""The ``BatchLoad`` contract: many records of one namespace loaded in one call.

Mix ``BatchLoadContract`` into a store's contract test class next to
``SecureObjectStoreContract``; it reuses the same ``make_store`` hook.
"""

from __future__ import annotations

import pytest

from flowvault.application import (
    MAX_LOAD_BATCH,
    BatchLoad,
    Delete,
    SecureObjectStore,
    StoreCapabilities,
    StoredRecord,
    UnitOfWork,
)
from flowvault.application.testing._fakes import make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import InvalidInput
from flowvault.domain._envelope import natural_key_digest

NS = "batch"


def _digest(key: str, namespace: str = NS) -> str:
    return natural_key_digest(namespace, key)


def _batch(store: SecureObjectStore) -> BatchLoad:
    assert isinstance(store, BatchLoad)
    return store


def _write(store: SecureObjectStore, count: int) -> list[str]:
    upserts = [
        make_upsert(NS, f"k{n:03d}", f"sealed {n}".encode(), labels={"n": n}) for n in range(count)
    ]
    upserts.append(make_upsert("elsewhere", "k000", b"other namespace"))
    store.commit(UnitOfWork(upserts=upserts))
    return [_digest(f"k{n:03d}") for n in range(count)]


def _one_by_one(store: SecureObjectStore, names: list[str]) -> dict[str, StoredRecord]:
    return {name: record for name in names if (record := store.load(NS, name)) is not None}


class BatchLoadContract(StoreHarness):
    """What every ``BatchLoad`` adapter must do."""

    def test_satisfies_the_batch_load_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``BatchLoad`` at runtime."""
        assert isinstance(store, BatchLoad)

    def test_loads_what_load_loads_leaving_out_absent_records(
        self, store: SecureObjectStore
    ) -> None:
        """Each present record as ``load`` returns it, payload included; absent ones left out.

        Names may repeat; a record of another namespace with the same key
        digest is not returned.
        """
        digests = _write(store, 12)
        absent = [_digest("never"), _digest("k000", "elsewhere")]
        names = [digests[3], *absent, digests[0], digests[3], digests[11], digests[3]]
        found = _batch(store).load_many(NS, names)
        assert found == _one_by_one(store, names)
        assert set(found) == {digests[0], digests[3], digests[11]}
        assert found[digests[11]].payload == b"sealed 11"
        assert _batch(store).load_many(NS, []) == {}
        assert _batch(store).load_many(NS, absent) == {}

    def test_deleted_and_rewritten_records_load_as_stored_now(
        self, store: SecureObjectStore
    ) -> None:
        """A deleted record is gone from the answer; a rewritten one comes at its new revision."""
        digests = _write(store, 4)
        store.commit(
            UnitOfWork(
                upserts=[make_upsert(NS, "k001", b"again", expected=1)],
                deletes=[Delete(NS, digests[0], 1)],
            )
        )
        found = _batch(store).load_many(NS, digests)
        assert set(found) == set(digests[1:])
        assert found[digests[1]].payload == b"again"
        assert found[digests[1]].metadata.revision == 2

    def test_at_most_max_load_batch_names(self, store: SecureObjectStore) -> None:
        """``MAX_LOAD_BATCH`` names are taken; one more, a bare string or a non-text name is not."""
        digests = _write(store, 3)
        most = [*digests, *(_digest(f"absent{n}") for n in range(MAX_LOAD_BATCH - 3))]
        assert len(most) == MAX_LOAD_BATCH
        assert set(_batch(store).load_many(NS, most)) == set(digests)
        bad: list[object] = [[*most, _digest("one more")], digests[0], [digests[0], 7], 7, None]
        for names in bad:
            with pytest.raises(InvalidInput):
                _batch(store).load_many(NS, names)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            _batch(store).load_many(7, digests)  # type: ignore[arg-type]

    def test_the_fallback_loads_the_same_records(self, store: SecureObjectStore) -> None:
        """``StoreCapabilities`` answers alike with the capability, without it, and past the cap.

        Through the capability a long list is split into ``MAX_LOAD_BATCH``
        names a call; without it each name is one ``load``.
        """
        digests = _write(store, 20)
        names = [*digests, *(_digest(f"absent{n}") for n in range(2 * MAX_LOAD_BATCH)), *digests]
        expected = _one_by_one(store, names)
        assert StoreCapabilities().load_many(store, NS, names) == expected
        assert StoreCapabilities.of(store).load_many(store, NS, names) == expected
        assert StoreCapabilities().load_many(store, NS, digests[:5]) == _batch(store).load_many(
            NS, digests[:5]
        )
        for bad in (digests[0], [digests[0], 7]):
            with pytest.raises(InvalidInput):
                StoreCapabilities().load_many(store, NS, bad)  # type: ignore[arg-type]
