"""The ``SealCounter`` contract: durable seal counts per key id, outside every unit of work.

Mix ``SealCounterContract`` into a store's contract test class next to
``SecureObjectStoreContract``; it reuses the same ``make_store`` hook.
"""

from __future__ import annotations

import threading

import pytest

from flowvault.application import (
    SealCounter,
    SecureObjectStore,
    StoreStats,
    StreamCatalog,
    UnitOfWork,
)
from flowvault.application.testing._fakes import make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import InvalidInput, RevisionConflict, StoreUnavailable

NS = "contract"
THREADS = 4
RESERVATIONS = 200
COUNT = 3


def _counter(store: SecureObjectStore) -> SealCounter:
    assert isinstance(store, SealCounter)
    return store


def _run_together(workers: list[threading.Thread]) -> None:
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


class SealCounterContract(StoreHarness):
    """What every ``SealCounter`` adapter must do."""

    def test_satisfies_the_seal_counter_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``SealCounter`` at runtime."""
        assert isinstance(store, SealCounter)

    def test_fresh_store_has_no_counts(self, store: SecureObjectStore) -> None:
        """No key id has a count before its first reservation, records notwithstanding."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "r")]))
        assert dict(_counter(store).seal_counts()) == {}

    def test_reservations_return_running_totals_per_key(self, store: SecureObjectStore) -> None:
        """Each reservation returns its key's new total; keys count independently."""
        counter = _counter(store)
        assert counter.reserve_seals("k1", 5) == 5
        assert counter.reserve_seals("k2", 1) == 1
        assert counter.reserve_seals("k1", 64) == 69
        assert dict(counter.seal_counts()) == {"k1": 69, "k2": 1}

    @pytest.mark.parametrize(
        ("key_id", "count"),
        [("k1", 0), ("k1", -3), ("k1", True), ("k1", 2.0), ("k1", 2**32 + 1), (None, 1)],
    )
    def test_reservations_that_would_not_count_up_are_invalid_input(
        self, store: SecureObjectStore, key_id: object, count: object
    ) -> None:
        """A count outside 1..2^32, or a key id that is not text, adds nothing.

        A zero or negative count would leave the budget unchanged or move it
        back; no block of seals is ever larger than the whole budget.
        """
        with pytest.raises(InvalidInput):
            _counter(store).reserve_seals(key_id, count)  # type: ignore[arg-type]
        assert dict(_counter(store).seal_counts()) == {}

    def test_reservations_are_not_records(self, store: SecureObjectStore) -> None:
        """Counts show in no stats, listing or ledger read, so a key may still be made.

        ``has_records`` decides whether a new key file may be created; a
        reservation alone must not make the store look as if it held data.
        """
        _counter(store).reserve_seals("k1", 7)
        if isinstance(store, StoreStats):
            assert store.has_records() is False
            assert dict(store.namespace_counts()) == {}
            assert dict(store.key_id_counts()) == {}
        for namespace in (NS, "k1", "seal_counters"):
            assert store.list(namespace).items == ()
        assert store.ledger_head("k1") is None
        assert store.read_ledger("k1").events == ()
        if isinstance(store, StreamCatalog):
            assert store.list_streams() == []

    def test_failed_unit_does_not_undo_a_reservation(self, store: SecureObjectStore) -> None:
        """A reservation stands even if the unit sealed under it then fails its guard.

        The seals were made (their nonces used) whether or not the unit
        landed, so taking the count back would let the budget undercount.
        """
        counter = _counter(store)
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "taken")]))
        assert counter.reserve_seals("k1", 4) == 4
        doomed = UnitOfWork(upserts=[make_upsert(NS, "new"), make_upsert(NS, "taken")])
        with pytest.raises(RevisionConflict):
            store.commit(doomed)
        assert store.peek_metadata(NS, doomed.upserts[0].header.key_digest) is None
        assert dict(counter.seal_counts()) == {"k1": 4}
        assert counter.reserve_seals("k1", 1) == 5

    def test_closed_store_refuses_reservations(self, store: SecureObjectStore) -> None:
        """After ``close`` reserving and reading counts raise ``StoreUnavailable``."""
        counter = _counter(store)
        counter.reserve_seals("k1", 1)
        store.close()
        with pytest.raises(StoreUnavailable):
            counter.reserve_seals("k1", 1)
        with pytest.raises(StoreUnavailable):
            counter.seal_counts()

    def test_concurrent_reservations_add_up_exactly(self, store: SecureObjectStore) -> None:
        """Four threads reserving at once lose nothing, and no two get the same range.

        Each returned total ends a range of ``count`` seals no other
        reservation covers; a lost update would hand two callers one range.
        """
        counter = _counter(store)
        barrier = threading.Barrier(THREADS)
        totals: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def reserve() -> None:
            barrier.wait()
            try:
                mine = [counter.reserve_seals("hot", COUNT) for _ in range(RESERVATIONS)]
            except BaseException as exc:  # surfaced in the main thread
                errors.append(exc)
                return
            with lock:
                totals.extend(mine)

        _run_together([threading.Thread(target=reserve) for _ in range(THREADS)])
        assert errors == []
        expected = THREADS * RESERVATIONS * COUNT
        assert dict(counter.seal_counts()) == {"hot": expected}
        assert sorted(totals) == list(range(COUNT, expected + 1, COUNT))

    def test_reservations_racing_failed_units_are_never_undone(
        self, store: SecureObjectStore
    ) -> None:
        """Reservations made while other threads' units fail and roll back all stay counted.

        A reservation that slipped into another unit's transaction would
        vanish with that unit's rollback.
        """
        counter = _counter(store)
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "taken")]))
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def reserve() -> None:
            barrier.wait()
            try:
                for _ in range(50):
                    counter.reserve_seals("k1", 1)
            except BaseException as exc:  # surfaced in the main thread
                errors.append(exc)

        def fail_units(worker: int) -> None:
            barrier.wait()
            for attempt in range(50):
                unit = UnitOfWork(
                    upserts=[make_upsert(NS, f"w{worker}-{attempt}"), make_upsert(NS, "taken")]
                )
                try:
                    store.commit(unit)
                except RevisionConflict:
                    continue
                except BaseException as exc:  # surfaced in the main thread
                    errors.append(exc)
                    return
                errors.append(AssertionError("a unit with a failing guard was committed"))

        workers = [threading.Thread(target=reserve) for _ in range(2)]
        workers += [threading.Thread(target=fail_units, args=(n,)) for n in range(2)]
        _run_together(workers)
        assert errors == []
        assert dict(counter.seal_counts()) == {"k1": 100}
        if isinstance(store, StoreStats):
            assert dict(store.namespace_counts()) == {NS: 1}
