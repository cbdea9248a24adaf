"""A write starts from this process's own last commit, and a stale start costs only a reload.

The workflow service keeps the record and stream head each of its commits
left, so the next transition of the same workflow neither loads nor opens
the row. These tests show the saving and, on every adapter, that nothing
else changes: a write by someone else is seen (a stale-version caller is
told so, nothing is written), and a row put back behind the cache is still
refused when the next write's guard meets it.
"""

from __future__ import annotations

from collections import Counter

import pytest
from row_edits import PassThroughStore, RowEditor
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.application import SealedRepository, SecureObjectStore, StoredRecord
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application._write_cache import WriteCache
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import IntegrityFailure, LedgerEvent, RevisionConflict, WorkOrder

KEY = bytes(range(7, 39))
SECRET = "write-cache-secret-61d0-never-in-errors"


class CountingStore(PassThroughStore):
    """Counts the reads a service makes through the port."""

    def __init__(self, inner: SecureObjectStore) -> None:
        super().__init__(inner)
        self.reads: Counter[str] = Counter()

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        self.reads["load"] += 1
        return self._inner.load(namespace, key_digest)

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        self.reads["ledger_head"] += 1
        return self._inner.ledger_head(stream)


class World(RowEditor):
    """Two workflow services over one store: this process's, and another writer's."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.clock = FrozenClock()
        super().__init__(store, SealedRepository(store, AesGcmCipher(KEY), self.clock))
        self.counted = CountingStore(store)
        mine = SealedRepository(self.counted, AesGcmCipher(KEY), self.clock)  # type: ignore[arg-type]
        services = workflow_services(mine, self.clock, SequentialIds("wf"))
        self.service = services.workflows
        self.workflow_events = services.events
        self.other = workflow_services(
            self.repository, self.clock, SequentialIds("other")
        ).workflows

    def create(self) -> str:
        order = WorkOrder(
            kind="invoice.review",
            parameters={"iban": SECRET},
            requester="alice@example.org",
            idempotency_key="req-1",
        )
        record, _ = self.service.create(order)
        return record.workflow_id


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def test_a_workflow_this_process_wrote_is_not_read_back(world: World) -> None:
    """After its own create, a chain of transitions loads no row and reads no head."""
    workflow_id = world.create()
    world.counted.reads.clear()
    version = 1
    for state, target in (("intake", "planning"), ("planning", "executing")):
        world.service.transition(
            workflow_id, target, expected_state=state, expected_version=version
        )
        version += 1
    world.workflow_events.append_event(
        workflow_id, "note.added", expected_state="executing", expected_version=version
    )
    assert world.counted.reads == Counter()
    assert world.other.get(workflow_id).state_version == version + 1
    assert world.store.ledger_head(stream_of(workflow_id)).index == 3  # type: ignore[union-attr]


def test_a_write_by_another_writer_is_seen_not_overwritten(world: World) -> None:
    """Once another writer moved on, the cached version is stale: the store decides."""
    workflow_id = world.create()
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    world.other.transition(workflow_id, "executing", expected_state="planning", expected_version=2)
    before = world.store.ledger_head(stream_of(workflow_id))
    with pytest.raises(RevisionConflict) as caught:
        world.service.transition(
            workflow_id, "decision", expected_state="planning", expected_version=2
        )
    assert "actual executing@3" in str(caught.value)
    assert world.store.ledger_head(stream_of(workflow_id)) == before
    moved = world.service.transition(
        workflow_id, "decision", expected_state="executing", expected_version=3
    )
    assert (moved.state, moved.state_version) == ("decision", 4)
    assert world.other.get(workflow_id) == moved


def test_a_row_put_back_behind_the_cache_is_refused_at_the_next_write(world: World) -> None:
    """The cache holds the true version; the replayed row fails the guard and is then caught."""
    workflow_id = world.create()
    old = world.row(WORKFLOWS, workflow_id)
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    world.replay(old)
    with pytest.raises(IntegrityFailure) as caught:
        world.service.transition(
            workflow_id, "executing", expected_state="planning", expected_version=2
        )
    assert "older than its ledger" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert world.store.ledger_head(stream_of(workflow_id)).index == 1  # type: ignore[union-attr]


def test_an_entry_is_used_once_and_the_oldest_goes_first() -> None:
    """``take`` removes, so a failed write leaves nothing stale; the least recent go first."""
    cache = WriteCache[str, int](capacity=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)
    cache.put("c", 4)
    assert len(cache) == 2
    assert cache.take("b") is None
    assert cache.take("a") == 3
    assert cache.take("a") is None
    cache.forget("c")
    assert len(cache) == 0
