"""What every store does with a ``LedgerDrop``: part of the base contract.

Mixed into ``SecureObjectStoreContract``, whose ``store`` fixture it uses.
Capabilities a store may lack (``StreamCatalog``, ``StreamHeadBatch``,
``StoreEpoch``) are checked where the store offers them.
"""

from __future__ import annotations

import threading

import pytest

from flowvault.application import (
    LedgerDrop,
    LedgerTrim,
    SecureObjectStore,
    StoreEpoch,
    StreamCatalog,
    StreamHeadBatch,
    StreamHeads,
    UnitOfWork,
)
from flowvault.application.testing._fakes import make_event, make_upsert
from flowvault.domain import LedgerEvent, RevisionConflict

_NS = "drops"


def _chain(store: SecureObjectStore, stream: str, count: int) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    for index in range(count):
        events.append(make_event(stream, index, events[-1] if events else None))
    store.commit(UnitOfWork(appends=events))
    return events


def _gone(store: SecureObjectStore, stream: str) -> None:
    """Assert that every read answers for ``stream`` as for one never written."""
    assert store.ledger_head(stream) is None
    page = store.read_ledger(stream)
    assert (page.events, page.next_index, page.gap) == ((), None, False)
    assert store.read_ledger(stream, from_index=3).events == ()
    if isinstance(store, StreamHeads):
        assert store.ledger_head_index(stream) is None
    if isinstance(store, StreamHeadBatch):
        assert stream not in store.ledger_head_indexes([stream])
    if isinstance(store, StreamCatalog):
        assert stream not in store.list_streams()


class LedgerDropContract:
    """Drops remove a whole stream, guarded by its head, atomically with the rest of the unit."""

    def test_drop_removes_every_event_and_the_head(self, store: SecureObjectStore) -> None:
        """After a drop the stream reads as never written, trimmed or not; others are untouched."""
        kept = _chain(store, "kept", 2)
        events = _chain(store, "s", 5)
        store.commit(UnitOfWork(trims=[LedgerTrim("s", 2)]))
        store.commit(UnitOfWork(drops=[LedgerDrop("s", events[-1].index)]))
        _gone(store, "s")
        assert list(store.read_ledger("kept").events) == kept
        assert store.ledger_head("kept") == kept[-1]

    def test_drop_must_name_the_current_head(self, store: SecureObjectStore) -> None:
        """A drop naming an older head, a later one, or a stream without events drops nothing."""
        events = _chain(store, "s", 3)
        for stale in (0, 1, 3, 40):
            with pytest.raises(RevisionConflict) as caught:
                store.commit(UnitOfWork(drops=[LedgerDrop("s", stale)]))
            assert caught.value.details["stream"] == "s"
            assert caught.value.details["guard"] == "drop"
        with pytest.raises(RevisionConflict) as missing:
            store.commit(UnitOfWork(drops=[LedgerDrop("never", 0)]))
        assert missing.value.details["stream"] == "never"
        assert list(store.read_ledger("s").events) == events

    def test_an_append_since_the_read_head_fails_the_drop(self, store: SecureObjectStore) -> None:
        """A drop built on a head that another writer has since extended fails whole."""
        events = _chain(store, "s", 2)
        later = make_event("s", 2, events[-1])
        store.commit(UnitOfWork(appends=[later]))
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(drops=[LedgerDrop("s", events[-1].index)]))
        assert list(store.read_ledger("s").events) == [*events, later]

    def test_drop_commits_with_the_rest_of_its_unit(self, store: SecureObjectStore) -> None:
        """Upserts, appends to other streams and drops of one unit all land together."""
        dropped = _chain(store, "s", 3)
        other = _chain(store, "other", 1)
        upsert = make_upsert(_NS, "a")
        added = make_event("other", 1, other[-1])
        fresh = make_event("fresh", 0)
        store.commit(
            UnitOfWork(
                upserts=[upsert],
                appends=[added, fresh],
                drops=[LedgerDrop("s", dropped[-1].index)],
            )
        )
        _gone(store, "s")
        assert store.peek_metadata(_NS, upsert.header.key_digest) == upsert.metadata
        assert list(store.read_ledger("other").events) == [*other, added]
        assert store.ledger_head("fresh") == fresh

    def test_a_failing_guard_anywhere_in_the_unit_keeps_the_stream(
        self, store: SecureObjectStore
    ) -> None:
        """A stale record guard, append or second drop in the unit leaves the stream whole."""
        events = _chain(store, "s", 3)
        other = _chain(store, "other", 2)
        drop = LedgerDrop("s", events[-1].index)
        failing = [
            UnitOfWork(upserts=[make_upsert(_NS, "x", expected=2)], drops=[drop]),
            UnitOfWork(appends=[make_event("other", 5, other[-1])], drops=[drop]),
            UnitOfWork(drops=[drop, LedgerDrop("other", 0)]),
        ]
        for unit in failing:
            with pytest.raises(RevisionConflict):
                store.commit(unit)
            assert list(store.read_ledger("s").events) == events
            assert list(store.read_ledger("other").events) == other
        assert store.peek_metadata(_NS, make_upsert(_NS, "x").header.key_digest) is None

    def test_a_failed_drop_applies_nothing_else(self, store: SecureObjectStore) -> None:
        """A drop whose guard fails takes the unit's upserts and appends down with it."""
        events = _chain(store, "s", 2)
        upsert = make_upsert(_NS, "y")
        with pytest.raises(RevisionConflict):
            store.commit(
                UnitOfWork(
                    upserts=[upsert],
                    appends=[make_event("t", 0)],
                    drops=[LedgerDrop("s", events[0].index)],
                )
            )
        assert store.peek_metadata(_NS, upsert.header.key_digest) is None
        assert store.ledger_head("t") is None
        assert list(store.read_ledger("s").events) == events

    def test_a_dropped_stream_starts_again_at_index_zero(self, store: SecureObjectStore) -> None:
        """After a drop only index 0 from the genesis hash extends the stream."""
        events = _chain(store, "s", 3)
        store.commit(UnitOfWork(drops=[LedgerDrop("s", 2)]))
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(appends=[make_event("s", 3, events[-1])]))
        again = make_event("s", 0, payload="again")
        store.commit(UnitOfWork(appends=[again]))
        assert list(store.read_ledger("s").events) == [again]
        assert store.ledger_head("s") == again
        if isinstance(store, StreamCatalog):
            assert store.list_streams() == ["s"]
        store.commit(UnitOfWork(drops=[LedgerDrop("s", 0)]))
        _gone(store, "s")

    def test_racing_drops_and_appends_have_one_winner(self, store: SecureObjectStore) -> None:
        """Two drops and two appends built on one head, committed at once: exactly one lands.

        A barrier lines every round up, so all four read the same head and
        commit together; the stream is then either gone or one event longer.
        """
        workers, rounds = 4, 10
        heads = {n: _chain(store, f"race/{n}", 2)[-1] for n in range(rounds)}
        winners: dict[int, list[int]] = {n: [] for n in range(rounds)}
        lock = threading.Lock()
        barrier = threading.Barrier(workers, timeout=120)
        errors: list[BaseException] = []

        def racer(worker: int) -> None:
            try:
                for n in range(rounds):
                    barrier.wait()
                    head = store.ledger_head(f"race/{n}")
                    assert head == heads[n]
                    barrier.wait()
                    if worker % 2:
                        unit = UnitOfWork(drops=[LedgerDrop(head.stream, head.index)])
                    else:
                        added = make_event(head.stream, head.index + 1, head, payload=worker)
                        unit = UnitOfWork(appends=[added])
                    try:
                        store.commit(unit)
                    except RevisionConflict:
                        continue
                    with lock:
                        winners[n].append(worker)
            except threading.BrokenBarrierError:
                return
            except BaseException as exc:  # surfaced in the main thread
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=racer, args=(n,)) for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        for n, won in winners.items():
            assert len(won) == 1, (n, won)
            head = store.ledger_head(f"race/{n}")
            if won[0] % 2:
                _gone(store, f"race/{n}")
            else:
                assert head is not None
                assert (head.index, head.payload) == (2, won[0])
                assert len(store.read_ledger(f"race/{n}").events) == 3

    def test_a_drop_counts_as_a_commit(self, store: SecureObjectStore) -> None:
        """A unit that only drops raises the commit count; a refused one does not."""
        if not isinstance(store, StoreEpoch):
            pytest.skip("the adapter does not offer the optional StoreEpoch capability")
        _chain(store, "s", 2)
        before = store.epoch()
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(drops=[LedgerDrop("s", 0)]))
        assert store.epoch() == before
        store.commit(UnitOfWork(drops=[LedgerDrop("s", 1)]))
        assert store.epoch() > before


__all__ = ["LedgerDropContract"]
