"""The ``StoreEpoch`` contract: a durable commit count that only grows.

Mix ``StoreEpochContract`` into a store's contract test class next to
``SecureObjectStoreContract``; it reuses the same ``make_store`` hook. An
adapter whose storage can be opened a second time (a file, a schema)
overrides ``reopen_store`` so the count is also read through another store.
"""

from __future__ import annotations

import pytest

from flowvault.application import (
    Delete,
    Guard,
    LedgerTrim,
    SecureObjectStore,
    StoreEpoch,
    UnitOfWork,
)
from flowvault.application.testing._fakes import make_event, make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import RevisionConflict
from flowvault.domain._envelope import natural_key_digest

NS = "contract"


def _epoch(store: SecureObjectStore) -> int:
    assert isinstance(store, StoreEpoch)
    return store.epoch()


def _grows(store: SecureObjectStore, unit: UnitOfWork) -> int:
    """Commit ``unit`` and return the epoch after it, asserting it rose."""
    before = _epoch(store)
    store.commit(unit)
    after = _epoch(store)
    assert after > before, f"the epoch stayed at {before} across a commit of {unit!r}"
    return after


class StoreEpochContract(StoreHarness):
    """What every ``StoreEpoch`` adapter must do."""

    def reopen_store(self, store: SecureObjectStore) -> SecureObjectStore | None:
        """Return a second store over ``store``'s storage, or ``None`` if it has none to share.

        The default is ``None``: a store held in memory cannot be opened twice.
        The test closes what this returns.
        """
        return None

    def test_satisfies_the_store_epoch_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``StoreEpoch`` at runtime."""
        assert isinstance(store, StoreEpoch)

    def test_fresh_store_is_at_epoch_zero(self, store: SecureObjectStore) -> None:
        """Nothing was committed yet, so the count is 0."""
        assert _epoch(store) == 0

    def test_every_non_empty_commit_raises_the_epoch(self, store: SecureObjectStore) -> None:
        """Mixed units, a lone ledger append, a lone upsert, a lone delete and a trim all count.

        An anti-rollback check compares counts, so any unit that changes the
        store must leave it higher: a copy taken before that unit then shows
        a lower count than the live store.
        """
        first = make_event("s", 0)
        second = make_event("s", 1, first)
        epochs = [
            _grows(store, UnitOfWork(upserts=[make_upsert(NS, "a")], appends=[first])),
            _grows(store, UnitOfWork(appends=[second])),
            _grows(store, UnitOfWork(upserts=[make_upsert(NS, "b")])),
            _grows(store, UnitOfWork(deletes=[Delete(NS, natural_key_digest(NS, "b"), 1)])),
            _grows(store, UnitOfWork(upserts=[make_upsert(NS, "a", b"v2", expected=1)])),
            _grows(store, UnitOfWork(trims=[LedgerTrim("s", 1)])),
            _grows(store, UnitOfWork(deletes=[Delete(NS, natural_key_digest(NS, "a"), Guard.ANY)])),
        ]
        assert epochs == sorted(set(epochs))
        assert store.load(NS, natural_key_digest(NS, "a")) is None

    def test_reads_and_empty_units_never_lower_the_epoch(self, store: SecureObjectStore) -> None:
        """Reads leave the count as it is; an empty unit may raise it or not, never lower it."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        before = _epoch(store)
        store.load(NS, natural_key_digest(NS, "a"))
        store.list(NS)
        store.read_ledger("s")
        assert _epoch(store) == before
        store.commit(UnitOfWork())
        assert _epoch(store) >= before

    def test_refused_unit_leaves_data_and_never_lowers_the_epoch(
        self, store: SecureObjectStore
    ) -> None:
        """A unit refused by a stale guard changes no data; the count does not go back.

        Whether a refused unit raised the count is the adapter's choice (a
        sequence outside the transaction may); only a decrease is wrong.
        """
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "taken")]))
        before = _epoch(store)
        doomed = UnitOfWork(
            upserts=[make_upsert(NS, "new"), make_upsert(NS, "taken", b"stale", expected=7)],
            appends=[make_event("s", 0)],
        )
        with pytest.raises(RevisionConflict):
            store.commit(doomed)
        assert store.peek_metadata(NS, natural_key_digest(NS, "new")) is None
        taken = store.load(NS, natural_key_digest(NS, "taken"))
        assert taken is not None
        assert taken.payload == b"sealed"
        assert store.ledger_head("s") is None
        after = _epoch(store)
        assert after >= before
        assert _grows(store, UnitOfWork(upserts=[make_upsert(NS, "new")])) > after

    def test_a_second_store_over_the_same_storage_sees_the_same_epoch(
        self, store: SecureObjectStore
    ) -> None:
        """The count is stored, not kept by the store object: another opening reads it too.

        Adapters without shareable storage return ``None`` from
        ``reopen_store``; then only the first store's count is checked.
        """
        for n in range(3):
            store.commit(UnitOfWork(upserts=[make_upsert(NS, f"r{n}")]))
        epoch = _epoch(store)
        assert epoch >= 3
        other = self.reopen_store(store)
        if other is None:
            return
        try:
            assert _epoch(other) == epoch
            other.commit(UnitOfWork(upserts=[make_upsert(NS, "from-other")]))
            assert _epoch(store) == _epoch(other) > epoch
        finally:
            other.close()
