"""Dropping streams on the record: the unit's rules, the registry event, and what an audit sees.

``drop_unit`` pairs each ``LedgerDrop`` with a keyed ``ledger.dropped`` event
in the registry stream; ``proven_drops`` believes only events the key made.
Run on every adapter.
"""

from __future__ import annotations

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.application import (
    DROP_REGISTRY,
    Delete,
    Guard,
    LedgerAudit,
    LedgerDrop,
    LedgerTrim,
    SealedRepository,
    SecureObjectStore,
    UnitOfWork,
    drop_unit,
)
from flowvault.application._stream_drops import DROP_EVENT, MAX_DROPS_PER_UNIT, proven_drops
from flowvault.application._streams import keyed
from flowvault.application.testing import FrozenClock, make_event, make_upsert
from flowvault.domain import InvalidInput, LedgerEvent, RevisionConflict
from flowvault.domain._ledger import verify_chain

KEY = bytes(range(7, 39))
OTHER_KEY = bytes(range(40, 72))


def _repository(store: SecureObjectStore, key: bytes = KEY) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher(key), FrozenClock())


def _keyed_chain(repository: SealedRepository, stream: str, count: int) -> list[LedgerEvent]:
    """Append ``count`` keyed events to ``stream``, after its head if it has one."""
    store = repository.store
    events: list[LedgerEvent] = []
    previous = store.ledger_head(stream)
    for _ in range(count):
        index = 0 if previous is None else previous.index + 1
        previous = keyed(make_event(stream, index, previous), repository)
        events.append(previous)
    store.commit(UnitOfWork(appends=events))
    return events


def test_a_unit_never_both_extends_and_drops_one_stream() -> None:
    """Appending to, trimming or dropping twice a stream the unit drops is refused when built."""
    drop = LedgerDrop("s", 0)
    with pytest.raises(InvalidInput):
        UnitOfWork(appends=[make_event("s", 0)], drops=[drop])
    with pytest.raises(InvalidInput):
        UnitOfWork(trims=[LedgerTrim("s", 1)], drops=[drop])
    with pytest.raises(InvalidInput):
        UnitOfWork(drops=[drop, LedgerDrop("s", 3)])
    for bad in (-1, True, 1.0, "0"):
        with pytest.raises(InvalidInput):
            LedgerDrop("s", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        LedgerDrop(7, 0)  # type: ignore[arg-type]
    unit = UnitOfWork(appends=[make_event("t", 0)], drops=[drop])
    assert not unit.empty
    assert not UnitOfWork(drops=[drop]).empty


def test_drop_unit_records_each_drop_in_the_registry(backend_store: SecureObjectStore) -> None:
    """The unit drops the streams and appends one keyed event per stream naming its last event."""
    repository = _repository(backend_store)
    clock = FrozenClock()
    first = _keyed_chain(repository, "a", 3)
    second = _keyed_chain(repository, "b", 1)
    record = make_upsert("ns", "k")
    backend_store.commit(UnitOfWork(upserts=[record]))
    delete = Delete("ns", record.header.key_digest, Guard.ANY)
    unit = drop_unit(
        backend_store,
        repository,
        "a",
        "b",
        occurred_at=clock.now(),
        reason="thread_deleted",
        deletes=[delete],
    )
    assert [drop.stream for drop in unit.drops] == ["a", "b"]
    backend_store.commit(unit)
    assert backend_store.ledger_head("a") is None
    assert backend_store.ledger_head("b") is None
    assert backend_store.load("ns", record.header.key_digest) is None
    registry = backend_store.read_ledger(DROP_REGISTRY).events
    assert verify_chain(registry).ok
    assert [(event.type, event.payload) for event in registry] == [
        (
            DROP_EVENT,
            {
                "stream": "a",
                "last_index": 2,
                "last_hash": first[-1].event_hash,
                "reason": "thread_deleted",
            },
        ),
        (
            DROP_EVENT,
            {
                "stream": "b",
                "last_index": 0,
                "last_hash": second[-1].event_hash,
                "reason": "thread_deleted",
            },
        ),
    ]
    assert proven_drops(backend_store, repository) == {"a": 2, "b": 0}
    _keyed_chain(repository, "a", 2)
    backend_store.commit(
        drop_unit(backend_store, repository, "a", occurred_at=clock.now(), reason="retention")
    )
    assert proven_drops(backend_store, repository) == {"a": 2, "b": 0}, "the highest index counts"
    report = LedgerAudit(backend_store, repository).run()
    assert report.ok
    assert [audit.stream for audit in report.streams] == [DROP_REGISTRY]


def test_a_drop_built_on_an_old_head_fails_whole(backend_store: SecureObjectStore) -> None:
    """An event appended after the unit was built makes the commit fail; nothing is dropped."""
    repository = _repository(backend_store)
    events = _keyed_chain(repository, "a", 2)
    unit = drop_unit(backend_store, repository, "a", occurred_at=FrozenClock().now(), reason="x")
    later = keyed(make_event("a", 2, events[-1]), repository)
    backend_store.commit(UnitOfWork(appends=[later]))
    with pytest.raises(RevisionConflict):
        backend_store.commit(unit)
    assert backend_store.ledger_head("a") == later
    assert backend_store.ledger_head(DROP_REGISTRY) is None


def test_drop_unit_refuses_what_it_cannot_record(backend_store: SecureObjectStore) -> None:
    """No stream, an empty one, the registry, a repeat, too many, or free text as the reason."""
    repository = _repository(backend_store)
    now = FrozenClock().now()
    _keyed_chain(repository, "a", 1)
    backend_store.commit(drop_unit(backend_store, repository, "a", occurred_at=now, reason="r"))
    _keyed_chain(repository, "a", 1)
    refused = [
        ((), "r"),
        (("missing",), "r"),
        ((DROP_REGISTRY,), "r"),
        (("a", "a"), "r"),
        (("a",), "Deleted by Alice"),
        (("a",), ""),
        (tuple(f"s{n}" for n in range(MAX_DROPS_PER_UNIT + 1)), "r"),
    ]
    for streams, reason in refused:
        with pytest.raises(InvalidInput):
            drop_unit(backend_store, repository, *streams, occurred_at=now, reason=reason)


def test_only_events_the_key_made_prove_a_drop(backend_store: SecureObjectStore) -> None:
    """A drop event under another key, without a MAC, or with its payload edited proves nothing."""
    repository = _repository(backend_store)
    stranger = _repository(backend_store, OTHER_KEY)
    now = FrozenClock().now()
    _keyed_chain(repository, "a", 1)
    forged = drop_unit(backend_store, stranger, "a", occurred_at=now, reason="r")
    backend_store.commit(forged)
    assert proven_drops(backend_store, repository) == {}
    assert proven_drops(backend_store, stranger) == {"a": 0}
    head = backend_store.ledger_head(DROP_REGISTRY)
    assert head is not None
    bare = make_event(
        DROP_REGISTRY, 1, head, type=DROP_EVENT, payload={"stream": "b", "last_index": 9}
    )
    genuine = keyed(
        make_event(
            DROP_REGISTRY, 2, bare, type=DROP_EVENT, payload={"stream": "c", "last_index": 1}
        ),
        repository,
    )
    edited = make_event(
        DROP_REGISTRY, 2, bare, type=DROP_EVENT, payload={"stream": "c", "last_index": 99}
    )
    edited = edited.model_copy(
        update={"event_hash": genuine.event_hash, "chain_mac": genuine.chain_mac}
    )
    backend_store.commit(UnitOfWork(appends=[bare, edited]))
    assert proven_drops(backend_store, repository) == {}
