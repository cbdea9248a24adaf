"""A host appends events to a ledger stream without computing indexes, hashes or MACs."""

from __future__ import annotations

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.application import (
    Guard,
    SealedRepository,
    SecureObjectStore,
    StreamWriter,
    UnitOfWork,
    verified_events,
)
from flowvault.application.testing import FrozenClock
from flowvault.domain import RevisionConflict
from flowvault.domain._ledger import GENESIS_HASH
from flowvault.domain._sanitise import REDACTED

KEY = bytes(range(32))


def _repository(store: SecureObjectStore) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher(KEY), FrozenClock())


def _writer(store: SecureObjectStore, stream: str = "orders") -> StreamWriter:
    return StreamWriter(store, _repository(store), FrozenClock(), stream)


def test_events_chain_from_genesis_and_verify_under_the_key(
    backend_store: SecureObjectStore,
) -> None:
    """The first event sits at index 0 on the genesis hash, the next chains on it, both keyed."""
    writer = _writer(backend_store)
    first = writer.append("order.placed", {"qty": 3})
    second = writer.append("order.updated", {"qty": 4})
    assert (first.index, first.previous_hash) == (0, GENESIS_HASH)
    assert (second.index, second.previous_hash) == (1, first.event_hash)
    events = list(verified_events(backend_store, "orders", _repository(backend_store)))
    assert [event.type for event in events] == ["order.placed", "order.updated"]


def test_the_record_writes_commit_with_the_event(backend_store: SecureObjectStore) -> None:
    """An upsert handed to ``append`` is stored in the same unit as the event."""
    repository = _repository(backend_store)
    repository.write("orders", "o-1", {"qty": 3}, expected=Guard.ABSENT)
    update = repository.prepare("orders", "o-1", {"qty": 4}, expected=1)
    _writer(backend_store).append("order.updated", upserts=[update])
    opened = repository.read("orders", "o-1")
    assert opened is not None
    assert opened.document == {"qty": 4}


def test_a_stale_record_guard_writes_nothing(backend_store: SecureObjectStore) -> None:
    """A record that changed since it was prepared is refused, and the event is not appended."""
    repository = _repository(backend_store)
    repository.write("orders", "o-1", {"qty": 3}, expected=Guard.ABSENT)
    stale = repository.prepare("orders", "o-1", {"qty": 5}, expected=1)
    repository.write("orders", "o-1", {"qty": 4}, expected=1)
    with pytest.raises(RevisionConflict):
        _writer(backend_store).append("order.updated", upserts=[stale])
    assert backend_store.ledger_head("orders") is None
    opened = repository.read("orders", "o-1")
    assert opened is not None
    assert opened.document == {"qty": 4}


class _RivalFirst:
    """A store whose next commit is preceded by another writer's append to the same stream."""

    def __init__(self, store: SecureObjectStore, rival: StreamWriter) -> None:
        self._store = store
        self._rival = rival
        self.commits = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def commit(self, unit: UnitOfWork) -> None:
        self.commits += 1
        if self.commits == 1:
            self._rival.append("rival.appended")
        self._store.commit(unit)


def test_an_append_that_lost_the_head_is_rebuilt_on_the_new_head(
    backend_store: SecureObjectStore,
) -> None:
    """When another writer appends first, the event is chained again after it, not dropped."""
    rival = _writer(backend_store)
    racing = _RivalFirst(backend_store, rival)
    writer = StreamWriter(racing, _repository(backend_store), FrozenClock(), "orders")  # type: ignore[arg-type]
    event = writer.append("order.updated")
    assert racing.commits == 2
    assert event.index == 1
    types = [e.type for e in verified_events(backend_store, "orders", _repository(backend_store))]
    assert types == ["rival.appended", "order.updated"]


def test_secret_looking_payload_keys_are_redacted(backend_store: SecureObjectStore) -> None:
    """The payload is sanitised the way the services sanitise theirs."""
    event = _writer(backend_store).append("login", {"password": "hunter2", "user": "u-1"})
    assert event.payload == {"password": REDACTED, "user": "u-1"}
