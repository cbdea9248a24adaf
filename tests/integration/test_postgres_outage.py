"""Server-side connection loss: the unit in flight is all or nothing, and the pool recovers.

Backends are killed with ``pg_terminate_backend`` from a separate admin
connection, picked by the ``application_name`` the store's sessions carry
(unique per test, so no other store on the server is touched).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from contextlib import contextmanager

import pytest
from psycopg import sql

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.postgres._store import LOSS_RERUNS
from flowvault.application import UnitOfWork
from flowvault.application.testing import make_event, make_header, make_upsert
from flowvault.domain import LedgerEvent, StoreUnavailable
from flowvault.domain._ledger import verify_chain

pytestmark = pytest.mark.postgres

NS, STREAM = "outage", "outage-ledger"
PIDS = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
TERMINATE = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
WAITING = (
    "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
)


def _digest(key: str) -> str:
    return make_header(NS, key).key_digest


@pytest.fixture
def app_name() -> str:
    """Provide an application_name no other session on the server carries."""
    return f"fvtest-outage-{secrets.token_hex(4)}"


@pytest.fixture
def store(postgres_server, pg_schema: str, app_name: str):
    """Provide a store whose sessions carry ``app_name``."""
    opened = PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, pool_size=2, application_name=app_name, create=True
    )
    with opened:
        yield opened


def _kill_next_waiter(admin, app_name: str, killed: set[int]) -> None:
    """Wait until a session not killed before waits on a lock, then end it and the pool's others."""
    deadline = time.monotonic() + 10
    while not {row[0] for row in admin.execute(WAITING, (app_name,)).fetchall()} - killed:
        assert time.monotonic() < deadline, "the unit never reached the locked row"
        time.sleep(0.01)
    killed.update(row[0] for row in admin.execute(PIDS, (app_name,)).fetchall())
    assert admin.execute(TERMINATE, (app_name,)).fetchall()


def _ordered_keys() -> tuple[str, str]:
    """Two keys whose digests sort in this order, so the unit writes the first before the second."""
    first, second = "left", "right"
    return (first, second) if _digest(first) < _digest(second) else (second, first)


def _unit_behind_a_locked_row(store) -> tuple[UnitOfWork, str, str]:
    """Return a unit that creates one record, then updates one a test will lock, and appends."""
    created, locked = _ordered_keys()
    store.commit(
        UnitOfWork(upserts=[make_upsert(NS, locked, b"v1")], appends=[make_event(STREAM, 0)])
    )
    unit = UnitOfWork(
        upserts=[make_upsert(NS, created, b"new"), make_upsert(NS, locked, b"v2", expected=1)],
        appends=[make_event(STREAM, 1, store.ledger_head(STREAM))],
    )
    return unit, created, locked


def _commit_killed(store, postgres_server, app_name: str, unit: UnitOfWork, kills: int) -> list:
    """Commit ``unit`` while another session locks its second row; kill its first ``kills`` runs.

    Each run is killed after its first write, while it waits on the lock;
    the lock is released once the kills are done. Returns the commit's
    outcome: ``None`` or the error it raised.
    """
    locked = _ordered_keys()[1]
    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            store.commit(unit)
            outcome.append(None)
        except BaseException as exc:  # handed to the main thread
            outcome.append(exc)

    killed: set[int] = set()
    with postgres_server.admin() as admin, postgres_server.admin() as locker:
        locker.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        with locker.transaction():
            locker.execute(
                "SELECT 1 FROM records WHERE namespace = %s AND key_digest = %s FOR UPDATE",
                (NS, _digest(locked)),
            )
            worker = threading.Thread(target=commit)
            worker.start()
            for _ in range(kills):
                _kill_next_waiter(admin, app_name, killed)
        worker.join(timeout=30)
    assert len(outcome) == 1
    return outcome


def test_backend_killed_on_every_run_applies_nothing_and_the_pool_recovers(
    store, postgres_server, app_name: str
) -> None:
    """A unit killed after its first write on its run and its re-run leaves no trace."""
    unit, created, locked = _unit_behind_a_locked_row(store)
    before = (store.load(NS, _digest(locked)), store.read_ledger(STREAM))
    outcome = _commit_killed(store, postgres_server, app_name, unit, kills=LOSS_RERUNS + 1)
    assert isinstance(outcome[0], StoreUnavailable)
    assert outcome[0].code == "STORE_UNAVAILABLE"
    assert store.load(NS, _digest(created)) is None
    assert (store.load(NS, _digest(locked)), store.read_ledger(STREAM)) == before
    store.commit(unit)
    loaded = store.load(NS, _digest(locked))
    assert loaded is not None
    assert loaded.payload == b"v2"
    assert store.load(NS, _digest(created)) is not None
    assert store.ledger_head(STREAM) == unit.appends[0]


def test_a_unit_killed_before_commit_is_re_run_and_applied_once(
    store, postgres_server, app_name: str
) -> None:
    """A connection lost before COMMIT is not an error: the unit runs again, exactly once."""
    unit, created, locked = _unit_behind_a_locked_row(store)
    outcome = _commit_killed(store, postgres_server, app_name, unit, kills=1)
    assert outcome == [None]
    loaded = store.load(NS, _digest(locked))
    assert loaded is not None
    assert (loaded.payload, loaded.metadata.revision) == (b"v2", 2)
    assert store.load(NS, _digest(created)) is not None
    assert [event.index for event in _all_events(store)] == [0, 1]
    assert store.ledger_head(STREAM) == unit.appends[0]


def test_a_read_whose_connection_is_killed_is_re_run(
    store, postgres_server, app_name: str
) -> None:
    """A read on a session killed after the liveness check answers from a fresh connection."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "read")]))
    with postgres_server.admin() as admin:
        killed = False
        original = store._borrow

        @contextmanager
        def borrow_then_kill():
            nonlocal killed
            with original() as connection:
                if not killed:
                    killed = True
                    assert admin.execute(TERMINATE, (app_name,)).fetchall()
                yield connection

        store._borrow = borrow_then_kill
        assert store.load(NS, _digest("read")) is not None
    assert killed


def test_idle_connections_killed_are_replaced_without_an_error(
    store, postgres_server, app_name: str
) -> None:
    """After every pooled session dies (as in a server restart) the next calls just work."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
    with postgres_server.admin() as admin:
        assert admin.execute(TERMINATE, (app_name,)).fetchall()
    assert store.load(NS, _digest("a")) is not None
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v2", expected=1)]))
    assert store.peek_metadata(NS, _digest("a")).revision == 2


def _state(store) -> tuple[int, int, LedgerEvent | None]:
    """Return units applied by the counter, by the ledger, and the head; reads retried on loss."""
    while True:
        try:
            record = store.peek_metadata(NS, _digest("counter"))
            head = store.ledger_head(STREAM)
        except StoreUnavailable:
            continue
        return record.revision - 1, 0 if head is None else head.index + 1, head


def _all_events(store) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    while page := store.read_ledger(STREAM, from_index=len(events), limit=200).events:
        events += page
    return events


def test_repeated_kills_never_leave_a_unit_half_applied(
    store, postgres_server, app_name: str
) -> None:
    """Units that each move a counter and append an event stay paired through many kills."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "counter", b"0")]))
    outcomes: Counter[str] = Counter()
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        while not stop.is_set():
            done, count, head = _state(store)
            assert done == count
            unit = UnitOfWork(
                upserts=[make_upsert(NS, "counter", str(done + 1).encode(), expected=done + 1)],
                appends=[make_event(STREAM, count, head)],
            )
            try:
                store.commit(unit)
                outcomes["committed"] += 1
            except StoreUnavailable:
                after, _, _ = _state(store)
                outcomes["lost, then found applied" if after > done else "lost, not applied"] += 1

    def guarded() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    worker = threading.Thread(target=guarded)
    worker.start()
    kills = 0
    with postgres_server.admin() as admin:
        for _ in range(20):
            time.sleep(0.05)
            kills += len(admin.execute(TERMINATE, (app_name,)).fetchall())
    time.sleep(0.2)
    stop.set()
    worker.join(timeout=30)
    assert errors == []
    done, count, _ = _state(store)
    assert done == count == outcomes["committed"] + outcomes["lost, then found applied"]
    assert outcomes["committed"] > 0
    assert kills > 0
    events = _all_events(store)
    assert len(events) == count
    assert verify_chain(events).ok
    print(f"\nkills {kills}; outcomes {dict(outcomes)}")


def test_a_record_lock_lost_with_its_connection_leaves_no_lock_behind(
    store, postgres_server, app_name: str
) -> None:
    """Its session killed while held, the lock ends with it: a typed error, then the next holder.

    The holder's next call fails with ``STORE_UNAVAILABLE``, never a driver
    error from the failed unlock, and the record's lock is free at once.
    """
    digest = _digest("locked")
    with postgres_server.admin() as admin:
        with store.record_locked(NS, digest):
            admin.execute(TERMINATE, (app_name,))
            with pytest.raises(StoreUnavailable):
                store.load(NS, digest)
        started = time.monotonic()
        with store.record_locked(NS, digest):
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "locked")]))
        assert time.monotonic() - started < 5
    assert store.load(NS, digest) is not None
