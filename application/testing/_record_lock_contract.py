"""The ``RecordLock`` contract: one holder per record at a time, released however the block ends.

Mix ``RecordLockContract`` into a store's contract test class; it reuses
the ``make_store`` hook. An adapter whose storage can be opened a second
time overrides ``reopen_store`` (as for ``StoreEpochContract``), so the
lock is also shown to hold across two stores, and calls inside it to work
on a store with a single connection, if that is what ``reopen_store`` opens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flowvault.application import RecordLock, SecureObjectStore, UnitOfWork
from flowvault.application.testing._fakes import make_event, make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import InvalidInput
from flowvault.domain._envelope import natural_key_digest

NS = "contract"
SETTLE = 0.3
"""Seconds a waiting holder is given to (wrongly) get in; long for a lock, short for a test."""
PATIENCE = 10.0
"""Seconds a holder may take to get a lock just released."""


def _lock(store: SecureObjectStore) -> RecordLock:
    assert isinstance(store, RecordLock)
    return store


class _Contender:
    """Another thread that takes a record's lock, says when it has it, and lets go when told."""

    def __init__(self, store: SecureObjectStore, key: str) -> None:
        self.inside = threading.Event()
        self.leave = threading.Event()
        self.failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(store, key), daemon=True)
        self._thread.start()

    def _run(self, store: SecureObjectStore, key: str) -> None:
        try:
            with _lock(store).record_locked(NS, natural_key_digest(NS, key)):
                self.inside.set()
                self.leave.wait(PATIENCE)
        except BaseException as exc:  # surfaced by finish()
            self.failure.append(exc)

    def finish(self) -> None:
        self.leave.set()
        self._thread.join(PATIENCE)
        assert not self._thread.is_alive(), "the contender never left its lock"
        assert self.failure == []


class RecordLockContract(StoreHarness):
    """What every ``RecordLock`` adapter must do."""

    def reopen_store(self, store: SecureObjectStore) -> SecureObjectStore | None:
        """Return a second store over ``store``'s storage, or ``None`` if it has none to share."""
        return None

    @contextmanager
    def _other(self, store: SecureObjectStore) -> Iterator[SecureObjectStore]:
        other = self.reopen_store(store)
        try:
            yield store if other is None else other
        finally:
            if other is not None:
                other.close()

    def test_satisfies_the_record_lock_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``RecordLock`` at runtime."""
        assert isinstance(store, RecordLock)

    @pytest.mark.parametrize("name", [7, None, b"ns"])
    def test_lock_names_that_are_not_text_are_invalid_input(
        self, store: SecureObjectStore, name: object
    ) -> None:
        """A namespace or key digest that is not text is refused before any lock is taken."""
        lock = _lock(store)
        with pytest.raises(InvalidInput), lock.record_locked(name, "digest"):  # type: ignore[arg-type]
            pass
        with pytest.raises(InvalidInput), lock.record_locked(NS, name):  # type: ignore[arg-type]
            pass

    def test_a_second_holder_waits_until_the_first_leaves(self, store: SecureObjectStore) -> None:
        """While one holder is inside, another (thread, or store over the same data) waits."""
        with self._other(store) as other:
            with _lock(store).record_locked(NS, natural_key_digest(NS, "k")):
                contender = _Contender(other, "k")
                assert not contender.inside.wait(SETTLE), "two holders of one record at once"
            assert contender.inside.wait(PATIENCE), "the lock was not released"
            contender.finish()

    def test_other_records_are_not_held_up(self, store: SecureObjectStore) -> None:
        """A lock on one record lets a holder of another in at once."""
        key = natural_key_digest(NS, "k")
        with self._other(store) as other, _lock(store).record_locked(NS, key):
            contender = _Contender(other, "another")
            assert contender.inside.wait(PATIENCE)
            contender.finish()

    def test_a_block_ending_in_an_exception_releases_the_lock(
        self, store: SecureObjectStore
    ) -> None:
        """The exception passes through unchanged and the next holder gets in."""
        key = natural_key_digest(NS, "k")
        with pytest.raises(LookupError), _lock(store).record_locked(NS, key):
            raise LookupError("from the block")
        with self._other(store) as other:
            contender = _Contender(other, "k")
            assert contender.inside.wait(PATIENCE)
            contender.finish()

    def test_the_holder_reads_and_commits_inside_its_lock(self, store: SecureObjectStore) -> None:
        """Calls the holding thread makes inside work, on a store with one connection too.

        A lock inside the lock, on the same or another record, runs at
        once under the outer one; others still wait until the outer ends.
        """
        with self._other(store) as single:
            digest = natural_key_digest(NS, "k")
            with _lock(single).record_locked(NS, digest):
                unit = UnitOfWork(upserts=[make_upsert(NS, "k")], appends=[make_event("s", 0)])
                single.commit(unit)
                with _lock(single).record_locked(NS, natural_key_digest(NS, "inner")):
                    assert single.load(NS, digest) is not None
                with _lock(single).record_locked(NS, digest):
                    assert single.ledger_head("s") is not None
                contender = _Contender(store, "k")
                assert not contender.inside.wait(SETTLE), "an inner block released the outer lock"
            assert contender.inside.wait(PATIENCE)
            contender.finish()
            assert store.peek_metadata(NS, digest) is not None
