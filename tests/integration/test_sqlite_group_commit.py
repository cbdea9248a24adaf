"""Group commit on a real file: concurrent units share one transaction yet keep their own fate.

A raw connection holding SQLite's write lock stands in for a slow commit, so
units queue up behind it in a known order; releasing it lets the next
writer commit the whole queue at once.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite import _store as sqlite_store
from flowvault.adapters.sqlite._group import MAX_GROUP
from flowvault.application import UnitOfWork
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import FlowvaultError, RevisionConflict, StoreUnavailable
from flowvault.domain._envelope import natural_key_digest

NS = "orders"
WAIT = 20.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteSecureObjectStore]:
    """Open a store on disk; close it after the test."""
    opened = SQLiteSecureObjectStore.open(
        tmp_path / "data" / "store.db", busy_timeout=WAIT, create=True
    )
    try:
        yield opened
    finally:
        opened.close()


class Caller:
    """One thread committing one unit, and what its ``commit`` did."""

    def __init__(self, store: SQLiteSecureObjectStore, unit: UnitOfWork) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(store, unit))

    def _run(self, store: SQLiteSecureObjectStore, unit: UnitOfWork) -> None:
        try:
            store.commit(unit)
        except BaseException as exc:  # kept for the test to judge
            self.error = exc

    def start(self) -> Caller:
        self._thread.start()
        return self

    def join(self) -> BaseException | None:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "a caller never returned"
        return self.error


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


@contextmanager
def write_locked(store: SQLiteSecureObjectStore) -> Iterator[None]:
    """Hold SQLite's write lock from another connection until the block ends."""
    holder = sqlite3.connect(store.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        yield
        holder.execute("ROLLBACK")
    finally:
        holder.close()


def queue_behind_lock(store: SQLiteSecureObjectStore, units: list[UnitOfWork]) -> list[Caller]:
    """Start a leader that blocks on the lock, then queue ``units`` in order; release; join all.

    Returns the callers of ``units`` (the leader's own unit is a throwaway).
    """
    callers: list[Caller] = []
    with write_locked(store):
        leader = Caller(store, UnitOfWork(upserts=[make_upsert(NS, "leader")])).start()
        _until(lambda: store.queued_units == 0 and _leader_waiting(store), "the leader")
        for number, unit in enumerate(units, start=1):
            callers.append(Caller(store, unit).start())
            _until(lambda n=number: store.queued_units == n, f"unit {number} to queue")
    assert leader.join() is None
    for caller in callers:
        caller.join()
    return callers


def _leader_waiting(store: SQLiteSecureObjectStore) -> bool:
    """Whether the leader has taken its own unit off the queue (it then waits in BEGIN)."""
    return store.queued_units == 0 and store.commit_counts.transactions == 0


def _revision(store: SQLiteSecureObjectStore, key: str) -> int | None:
    meta = store.peek_metadata(NS, natural_key_digest(NS, key))
    return None if meta is None else meta.revision


def test_units_queued_together_commit_in_one_transaction(store: SQLiteSecureObjectStore) -> None:
    """Seven units queued behind a busy writer land in one transaction, all acknowledged."""
    units = [UnitOfWork(upserts=[make_upsert(NS, f"k{n}")]) for n in range(7)]
    callers = queue_behind_lock(store, units)
    assert [caller.error for caller in callers] == [None] * 7
    counts = store.commit_counts
    assert (counts.transactions, counts.units, counts.grouped_units) == (2, 8, 7)
    assert all(_revision(store, f"k{n}") == 1 for n in range(7))
    assert store.epoch() == counts.transactions


def test_a_failing_guard_fails_only_its_own_unit(store: SQLiteSecureObjectStore) -> None:
    """A stale guard (record or ledger head) rolls back its own unit and no other."""
    first = make_event("s", 0)
    units = [
        UnitOfWork(upserts=[make_upsert(NS, "a")]),
        UnitOfWork(upserts=[make_upsert(NS, "b", expected=4)], appends=[make_event("t", 0)]),
        UnitOfWork(appends=[first]),
        UnitOfWork(appends=[make_event("s", 0)]),
    ]
    callers = queue_behind_lock(store, units)
    errors = [caller.error for caller in callers]
    assert errors[0] is None
    assert isinstance(errors[1], RevisionConflict)
    assert errors[2] is None
    assert isinstance(errors[3], FlowvaultError)
    assert errors[3].code == "REVISION_CONFLICT"
    assert _revision(store, "a") == 1
    assert _revision(store, "b") is None
    assert store.ledger_head("t") is None
    assert store.ledger_head("s") == first
    assert store.commit_counts.grouped_units == 2
    assert store.epoch() == store.commit_counts.transactions


def test_a_group_whose_every_unit_fails_leaves_the_epoch(store: SQLiteSecureObjectStore) -> None:
    """A group that rolls back commits nothing, so its transaction does not count."""
    units = [UnitOfWork(upserts=[make_upsert(NS, f"k{n}", expected=4)]) for n in range(3)]
    callers = queue_behind_lock(store, units)
    assert all(isinstance(caller.error, RevisionConflict) for caller in callers)
    assert store.epoch() == store.commit_counts.transactions == 1


def test_units_of_one_group_see_each_others_writes(store: SQLiteSecureObjectStore) -> None:
    """Units apply in queue order, so a later unit's guard sees an earlier unit's write."""
    first = make_event("s", 0)
    units = [
        UnitOfWork(upserts=[make_upsert(NS, "a")], appends=[first]),
        UnitOfWork(upserts=[make_upsert(NS, "a", expected=1)], appends=[make_event("s", 1, first)]),
    ]
    callers = queue_behind_lock(store, units)
    assert [caller.error for caller in callers] == [None, None]
    assert _revision(store, "a") == 2
    head = store.ledger_head("s")
    assert head is not None
    assert head.index == 1


def test_a_failed_transaction_fails_every_unit_of_its_group(
    store: SQLiteSecureObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error while applying the third unit loses the whole group, and only it."""
    real = sqlite_store.apply_writes
    applied: list[int] = []

    def failing(connection: sqlite3.Connection, prepared: Any) -> None:
        applied.append(1)
        if len(applied) == 4:
            raise sqlite3.OperationalError("disk I/O error")
        real(connection, prepared)

    monkeypatch.setattr(sqlite_store, "apply_writes", failing)
    units = [UnitOfWork(upserts=[make_upsert(NS, f"k{n}")]) for n in range(4)]
    callers = queue_behind_lock(store, units)
    errors = [caller.error for caller in callers]
    assert all(isinstance(error, StoreUnavailable) for error in errors), errors
    assert len({id(error) for error in errors}) == 4, "threads must not share one exception"
    assert all(_revision(store, f"k{n}") is None for n in range(4))
    assert _revision(store, "leader") == 1
    assert store.epoch() == 1, "the lost group's transaction must not have raised the epoch"
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "k0")]))
    assert _revision(store, "k0") == 1
    assert store.epoch() == 2


def test_many_threads_lose_no_unit(store: SQLiteSecureObjectStore) -> None:
    """Eight threads appending to their own streams: every acknowledged event is there."""
    per_thread = 40
    heads: dict[int, int] = {}

    def append(lane: int) -> None:
        previous = None
        for index in range(per_thread):
            event = make_event(f"lane-{lane}", index, previous)
            store.commit(UnitOfWork(upserts=[make_upsert(NS, f"{lane}-{index}")], appends=[event]))
            heads[lane] = index
            previous = event

    threads = [threading.Thread(target=append, args=(lane,)) for lane in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 3)
    assert heads == dict.fromkeys(range(8), per_thread - 1)
    for lane in range(8):
        head = store.ledger_head(f"lane-{lane}")
        assert head is not None
        assert head.index == per_thread - 1
    counts = store.commit_counts
    assert counts.units == 8 * per_thread
    assert counts.transactions <= counts.units


def test_a_group_holds_at_most_max_group_units(store: SQLiteSecureObjectStore) -> None:
    """Seventy queued units commit as groups of 64 and 6, behind the leader's own."""
    units = [UnitOfWork(upserts=[make_upsert(NS, f"k{n}")]) for n in range(70)]
    callers = queue_behind_lock(store, units)
    assert all(caller.error is None for caller in callers)
    counts = store.commit_counts
    assert MAX_GROUP == 64
    assert (counts.transactions, counts.units, counts.grouped_units) == (3, 71, 70)


def test_an_interrupted_leader_fails_its_group_instead_of_stranding_it(
    store: SQLiteSecureObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt in the thread committing a group reaches that thread; the rest fail typed."""
    real = sqlite_store.commit_group
    calls: list[int] = []

    def interrupted(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(*args, **kwargs)

    monkeypatch.setattr(sqlite_store, "commit_group", interrupted)
    units = [UnitOfWork(upserts=[make_upsert(NS, f"k{n}")]) for n in range(3)]
    callers = queue_behind_lock(store, units)
    errors = [caller.error for caller in callers]
    assert sum(isinstance(error, KeyboardInterrupt) for error in errors) == 1
    assert sum(isinstance(error, StoreUnavailable) for error in errors) == 2
    assert all(_revision(store, f"k{n}") is None for n in range(3))
    monkeypatch.setattr(sqlite_store, "commit_group", real)
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "k0")]))
    assert _revision(store, "k0") == 1
