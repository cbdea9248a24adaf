"""Records bound to the ledger event that wrote them: a replayed older row is caught.

A replay is simulated through the port itself: the older row's exact header
and ciphertext are committed back over the newer one with no guard, which
is what someone editing the database would leave behind. Every adapter
runs these, so the binding holds whatever stores the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from graph_services import graph_runs
from pydantic import BaseModel, ConfigDict
from row_edits import PassThroughStore, RowEditor
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.crypto._cipher import derive_integrity_key
from flowvault.application import (
    DefinitionRegistry,
    Guard,
    LedgerPage,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    TerminalReceipts,
    UnitOfWork,
    UnreadableItem,
    Upsert,
    WorkflowService,
)
from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._state import RESET_EVENT, STATE_NAMESPACE, STATE_WRITTEN_EVENT
from flowvault.application._streams import run_stream
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import (
    IntegrityFailure,
    LedgerEvent,
    RevisionConflict,
    WorkOrder,
    content_hash,
)
from flowvault.domain._canonical import canonical_bytes, canonical_json
from flowvault.domain._fingerprint import Readability

KEY = bytes(range(1, 33))
SECRET = "binding-secret-4f1c-never-in-errors"


class Counter(BaseModel):
    """A host's state document."""

    model_config = ConfigDict(frozen=True)
    count: int = 0
    note: str = ""


class World(RowEditor):
    """Workflow service and state repository over one store, with a controlled clock."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.clock = FrozenClock()
        super().__init__(store, SealedRepository(store, AesGcmCipher(KEY), self.clock))
        services = workflow_services(self.repository, self.clock, SequentialIds("wf"))
        self.service = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results
        self.runs = graph_runs(self.repository, self.clock, SequentialIds("run"))
        self.definitions = DefinitionRegistry(self.repository, self.clock)
        self.receipts = TerminalReceipts(self.repository, self.repository)

    def over(self, store: SecureObjectStore) -> WorkflowService:
        """Return a service reading through ``store`` (a wrapper around this world's store)."""
        repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)
        return workflow_services(repository, self.clock, SequentialIds("wf")).workflows

    def state(self, scope: str = "main") -> StateRepository[Counter]:
        return StateRepository(self.repository, scope, model=Counter)

    def order(self, key: str = "req-1") -> WorkOrder:
        return WorkOrder(
            kind="invoice.review",
            parameters={"iban": SECRET},
            requester="alice@example.org",
            idempotency_key=key,
        )

    def create(self) -> str:
        record, _ = self.service.create(self.order())
        return record.workflow_id


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def _stale(call: Callable[[], object]) -> IntegrityFailure:
    with pytest.raises(IntegrityFailure) as caught:
        call()
    failure = caught.value
    assert "older than its ledger" in str(failure)
    assert SECRET not in str(failure)
    assert SECRET not in repr(failure)
    assert SECRET not in canonical_json(dict(failure.details))
    return failure


# -- workflow records ---------------------------------------------------------


def test_each_workflow_write_names_the_event_committed_with_it(world: World) -> None:
    """Create, transition and append_event bind the row to the index of their own event."""
    workflow_id = world.create()
    assert world.row(WORKFLOWS, workflow_id).metadata.header.ledger_index == 0
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    assert world.row(WORKFLOWS, workflow_id).metadata.header.ledger_index == 1
    _, event, _ = world.workflow_events.append_event(
        workflow_id, "note.added", expected_state="planning", expected_version=2
    )
    header = world.row(WORKFLOWS, workflow_id).metadata.header
    assert header.ledger_index == event.index == 2
    assert b'"ledger_index":2' in header.aad()


def test_a_replayed_workflow_record_is_refused_by_every_read(world: World) -> None:
    """An older revision put back whole opens, but its event is no longer the newest writer."""
    workflow_id = world.create()
    old = world.row(WORKFLOWS, workflow_id)
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    world.replay(old)
    failure = _stale(lambda: world.service.get(workflow_id))
    assert failure.code == "INTEGRITY_FAILURE"
    assert failure.details["ledger_index"] == 0
    listed = world.service.list_workflows()
    assert listed.items == ()
    assert listed.unreadable == (UnreadableItem(old.metadata.key_digest, "INTEGRITY_FAILURE"),)
    _stale(lambda: world.workflow_events.events(workflow_id))
    _stale(
        lambda: world.service.transition(
            workflow_id, "planning", expected_state="intake", expected_version=1
        )
    )
    assert world.store.ledger_head(stream_of(workflow_id)).index == 1  # type: ignore[union-attr]


def test_tombstones_after_the_record_event_leave_it_current(world: World) -> None:
    """Purged action results append events that name no state; the record stays fresh."""
    workflow_id = world.create()
    old = world.row(WORKFLOWS, workflow_id)
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    for n in range(3):
        world.action_results.put_action_result(
            workflow_id, content_hash(f"a{n}"), {"n": n}, retention=timedelta(seconds=1)
        )
    world.clock.advance(timedelta(seconds=5))
    assert world.action_results.purge_expired() == 3
    assert world.store.ledger_head(stream_of(workflow_id)).index == 4  # type: ignore[union-attr]
    assert world.service.get(workflow_id).state_version == 2
    assert [r.state for r in world.service.list_workflows().items] == ["planning"]
    moved = world.service.transition(
        workflow_id, "executing", expected_state="planning", expected_version=2
    )
    assert world.row(WORKFLOWS, workflow_id).metadata.header.ledger_index == 5
    assert moved.state_version == 3
    world.replay(old)
    _stale(lambda: world.service.get(workflow_id))


class _ForgedTail(PassThroughStore):
    """A ledger showing one more event after the head: a tombstone without a valid MAC."""

    def __init__(self, inner: SecureObjectStore, forged: LedgerEvent) -> None:
        super().__init__(inner)
        self._forged = forged

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        return self._forged if stream == self._forged.stream else self._inner.ledger_head(stream)

    def ledger_head_index(self, stream: str) -> int | None:
        head = self.ledger_head(stream)
        return None if head is None else head.index

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        if stream != self._forged.stream or from_index != self._forged.index:
            return self._inner.read_ledger(stream, from_index=from_index, limit=limit)
        return LedgerPage(events=(self._forged,), next_index=None, gap=False)


def test_an_unkeyed_event_after_the_record_event_is_not_vouched_for(world: World) -> None:
    """An event that names no state but lacks its chain MAC cannot excuse a stale row."""
    workflow_id = world.create()
    head = world.store.ledger_head(stream_of(workflow_id))
    assert head is not None
    forged = LedgerEvent.create(
        stream=head.stream,
        index=1,
        type="action_result.purged",
        occurred_at=head.occurred_at,
        payload={},
        previous_hash=head.event_hash,
    )
    service = world.over(_ForgedTail(world.store, forged))  # type: ignore[arg-type]
    _stale(lambda: service.get(workflow_id))
    keyed = forged.model_copy(update={"chain_mac": _mac(world, forged)})
    assert world.over(_ForgedTail(world.store, keyed)).get(workflow_id).state_version == 1  # type: ignore[arg-type]


def _mac(world: World, event: LedgerEvent) -> str:
    from flowvault.application._streams import chain_mac  # noqa: PLC0415 - the MAC's one source

    return chain_mac(event, world.repository)


class _CutLedger(PassThroughStore):
    """A ledger whose newest events were cut off: the head lags the record."""

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        page = self._inner.read_ledger(stream, from_index=0, limit=1)
        return page.events[0] if page.events else None

    def ledger_head_index(self, stream: str) -> int | None:
        head = self.ledger_head(stream)
        return None if head is None else head.index


def test_a_record_naming_an_event_the_ledger_lacks_is_refused(world: World) -> None:
    """A row newer than its stream's head means the head was rolled back."""
    workflow_id = world.create()
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    service = world.over(_CutLedger(world.store))  # type: ignore[arg-type]
    _stale(lambda: service.get(workflow_id))


class _WriterInBetween(PassThroughStore):
    """Lets another writer commit between a record's load and its stream head's read."""

    def __init__(self, inner: SecureObjectStore, write: Callable[[], None], times: int) -> None:
        super().__init__(inner)
        self._write = write
        self.left = times

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        self._between()
        return self._inner.ledger_head(stream)

    def ledger_head_index(self, stream: str) -> int | None:
        self._between()
        head = self._inner.ledger_head(stream)
        return None if head is None else head.index

    def _between(self) -> None:
        if self.left:
            self.left -= 1
            self._write()


def test_a_write_landing_between_row_and_head_is_no_false_alarm(world: World) -> None:
    """The head then shows a newer writer; the row read again is that newer one."""
    workflow_id = world.create()
    moves = iter([("intake", "planning", 1), ("planning", "executing", 2)])

    def write() -> None:
        current, target, version = next(moves)
        world.service.transition(
            workflow_id, target, expected_state=current, expected_version=version
        )

    racing = _WriterInBetween(world.store, write, times=2)
    record = world.over(racing).get(workflow_id)  # type: ignore[arg-type]
    assert (record.state, record.state_version) == ("executing", 3)
    assert racing.left == 0


def test_a_row_rewritten_under_every_read_is_a_conflict_not_tampering(world: World) -> None:
    """A reader that never sees row and head agree gives up with RevisionConflict."""
    workflow_id = world.create()
    version = [1]

    def write() -> None:
        world.workflow_events.append_event(
            workflow_id, "tick", expected_state="intake", expected_version=version[0]
        )
        version[0] += 1

    with pytest.raises(RevisionConflict):
        world.over(_WriterInBetween(world.store, write, times=100)).get(workflow_id)  # type: ignore[arg-type]


def test_a_row_resealed_without_its_index_is_refused(world: World) -> None:
    """Without an index a row is held to every event of its stream: the create event wrote it.

    No release wrote workflow rows unbound, so such a row is refused like a
    replayed one, never judged by its state alone.
    """
    workflow_id = world.create()
    digest = world.repository.key_digest(WORKFLOWS, workflow_id)
    _unbind(world, WORKFLOWS, workflow_id)
    assert world.store.peek_metadata(WORKFLOWS, digest).header.ledger_index is None  # type: ignore[union-attr]
    _stale(lambda: world.service.get(workflow_id))


def _unbind(world: World, namespace: str, natural_key: str) -> None:
    """Re-seal the current row under the key with no ledger index, its payload unchanged."""
    stored = world.row(namespace, natural_key)
    opened = world.repository.open(
        stored, namespace=namespace, key_digest=stored.metadata.key_digest
    )
    header = stored.metadata.header.model_copy(update={"ledger_index": None})
    plaintext = canonical_bytes(
        {"v": 1, "labels": dict(stored.metadata.labels), "document": opened.document}
    )
    payload = world.repository.cipher.seal(header.key_id, plaintext, header.aad())
    world.store.commit(
        UnitOfWork(
            upserts=[
                Upsert(
                    header=header,
                    payload=payload,
                    expected=stored.metadata.revision,
                    labels=stored.metadata.labels,
                    replaces=stored.metadata.payload_digest,
                )
            ]
        )
    )


def test_resealing_under_a_new_key_keeps_the_binding(world: World) -> None:
    """Key rotation re-seals the row with the same ledger index, so it stays fresh."""
    workflow_id = world.create()
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    ring = AesGcmCipher(
        bytes(range(2, 34)), previous_keys=[KEY], integrity_key=derive_integrity_key(KEY)
    )
    rotating = SealedRepository(world.store, ring, world.clock)
    upsert = rotating.reseal(world.row(WORKFLOWS, workflow_id))
    assert upsert is not None
    assert upsert.header.ledger_index == 1
    world.store.commit(UnitOfWork(upserts=[upsert]))
    service = workflow_services(rotating, world.clock, SequentialIds("wf")).workflows
    assert service.get(workflow_id).state == "planning"


# -- state rows ---------------------------------------------------------------


def test_every_state_write_appends_the_event_its_row_names(world: World) -> None:
    """save, update and update_with_events each end their unit with a written event."""
    state = world.state()
    state.save(Counter(count=1))
    state.update(lambda c: c.model_copy(update={"count": c.count + 1}))
    history = state.history()
    assert [(e.type, e.payload) for e in history] == [
        (STATE_WRITTEN_EVENT, {"revision": 1}),
        (STATE_WRITTEN_EVENT, {"revision": 2}),
    ]
    assert world.row(STATE_NAMESPACE, "main").metadata.header.ledger_index == 1


def test_a_replayed_state_row_is_refused_and_reset_still_recovers(world: World) -> None:
    """The older row fails load, reads as unreadable, and the recovery verb removes it."""
    state = world.state()
    state.save(Counter(count=1, note=SECRET))
    old = world.row(STATE_NAMESPACE, "main")
    state.save(Counter(count=2))
    world.replay(old)
    failure = _stale(state.load)
    assert failure.details["revision"] == 1
    with pytest.raises(IntegrityFailure):
        state.update(lambda c: c)
    assert state.probe().readability is Readability.UNREADABLE
    fingerprint = state.reset(actor="ops", source="test")
    assert fingerprint.readability is Readability.UNREADABLE
    assert state.load().revision is None
    assert state.save(Counter(count=7)) == 1


def test_a_state_row_put_back_after_its_reset_and_a_new_write_is_refused(world: World) -> None:
    """The reset names the old revision, but the later write event does not excuse it."""
    state = world.state()
    state.save(Counter(count=1))
    old = world.row(STATE_NAMESPACE, "main")
    state.reset(actor="ops", source="test")
    state.save(Counter(count=2))
    world.replay(old)
    _stale(state.load)


def test_a_reset_interrupted_before_its_delete_leaves_the_row_readable(world: World) -> None:
    """The reset event names exactly this row, so the row is not taken for a replay.

    A row put back after a completed reset, with no write since, reads the
    same way: the store cannot tell the two apart, and running the reset
    again removes it either way.
    """
    state = world.state()
    state.save(Counter(count=1))
    old = world.row(STATE_NAMESPACE, "main")
    state.reset(actor="ops", source="test")
    world.replay(old)
    assert state.load().state.count == 1
    assert [e.type for e in state.history()] == [STATE_WRITTEN_EVENT, RESET_EVENT]
    state.reset(actor="ops", source="again")
    assert state.load().revision is None


def test_a_reset_naming_another_revision_does_not_excuse_the_row(world: World) -> None:
    """Only a reset of this very revision may follow the row's own event."""
    state = world.state()
    state.save(Counter(count=1))
    old = world.row(STATE_NAMESPACE, "main")
    state.save(Counter(count=2))
    state.reset(actor="ops", source="test")
    world.replay(old)
    _stale(state.load)


def test_an_unbound_state_row_reads_only_while_no_event_wrote_it(world: World) -> None:
    """A row with no index, in an empty stream, reads; once a bound write follows, it is stale."""
    state = world.state()
    unbound = world.repository.prepare(
        STATE_NAMESPACE, "main", {"count": 1, "note": ""}, expected=Guard.ABSENT
    )
    world.store.commit(UnitOfWork(upserts=[unbound]))
    assert state.load().state.count == 1
    old = world.row(STATE_NAMESPACE, "main")
    assert old.metadata.header.ledger_index is None
    state.save(Counter(count=2))
    assert world.row(STATE_NAMESPACE, "main").metadata.header.ledger_index == 0
    world.replay(old)
    _stale(state.load)


def test_a_host_unit_from_to_write_binds_the_row(world: World) -> None:
    """to_write hands over the row with its event; committed together, the row reads fresh."""
    state = world.state()
    unit = state.to_write(Counter(count=3), expected_revision=None)
    (upsert,) = unit.upserts
    (event,) = unit.appends
    assert (event.type, upsert.header.ledger_index) == (STATE_WRITTEN_EVENT, event.index)
    world.store.commit(unit)
    assert state.load().revision == 1
    late = state.to_write(Counter(count=4), expected_revision=1)
    state.save(Counter(count=5))
    with pytest.raises(RevisionConflict):
        world.store.commit(late)
    assert state.load().state.count == 5


# -- graph runs ---------------------------------------------------------------


def _run(world: World) -> str:
    world.definitions.register_definition("triage", {"nodes": ["plan"]})
    run, _ = world.runs.start_run("triage", {"ask": SECRET})
    return run.run_id


def test_each_run_write_names_its_last_run_event(world: World) -> None:
    """start, set_status and finish_run bind the run to the last event of their unit."""
    run_id = _run(world)
    assert world.row(GRAPH_RUNS, run_id).metadata.header.ledger_index == 0
    world.runs.set_status(run_id, "running", expected_status="accepted")
    assert world.row(GRAPH_RUNS, run_id).metadata.header.ledger_index == 1
    world.runs.append_run_events(run_id, [("node.done", {"node": "plan"})])
    assert world.runs.get_run(run_id).status == "running"
    world.runs.finish_run(
        run_id,
        "completed",
        expected_status="running",
        final_state={"ok": True},
        events=[("node.summary", {})],
    )
    head = world.store.ledger_head(run_stream(run_id))
    assert head is not None
    assert (head.type, head.index) == ("run.completed", 4)
    assert world.row(GRAPH_RUNS, run_id).metadata.header.ledger_index == 4
    assert world.runs.get_run(run_id).status == "completed"


def test_a_replayed_run_is_refused_by_reads_and_listings(world: World) -> None:
    """A run put back at an earlier status names an event a later run.* event follows."""
    run_id = _run(world)
    old = world.row(GRAPH_RUNS, run_id)
    world.runs.set_status(run_id, "running", expected_status="accepted")
    world.runs.append_run_events(run_id, [("node.done", {})])
    world.replay(old)
    _stale(lambda: world.runs.get_run(run_id))
    listed = world.runs.list_runs()
    assert listed.items == ()
    assert listed.unreadable == (UnreadableItem(old.metadata.key_digest, "INTEGRITY_FAILURE"),)
    _stale(lambda: world.runs.set_status(run_id, "running", expected_status="accepted"))
    _stale(world.runs.recover_incomplete_runs)


class _NoHeadIndex(PassThroughStore):
    """A host's adapter without the optional ``StreamHeads`` capability."""

    def __getattr__(self, name: str) -> object:
        if name == "ledger_head_index":
            raise AttributeError(name)
        return super().__getattr__(name)


class _CountingHeads(PassThroughStore):
    """Counts how a reader consulted the stream head."""

    def __init__(self, inner: SecureObjectStore) -> None:
        super().__init__(inner)
        self.events = self.indexes = 0

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        self.events += 1
        return self._inner.ledger_head(stream)

    def ledger_head_index(self, stream: str) -> int | None:
        self.indexes += 1
        head = self._inner.ledger_head(stream)
        return None if head is None else head.index


def test_readers_use_the_head_index_and_adapters_without_it_still_check(world: World) -> None:
    """A current row costs one index lookup; without the capability the head event is read."""
    workflow_id = world.create()
    counting = _CountingHeads(world.store)
    assert world.over(counting).get(workflow_id).state == "intake"  # type: ignore[arg-type]
    assert (counting.indexes, counting.events) == (1, 0)
    plain = world.over(_NoHeadIndex(world.store))  # type: ignore[arg-type]
    assert plain.get(workflow_id).state == "intake"
    old = world.row(WORKFLOWS, workflow_id)
    world.service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    world.replay(old)
    _stale(lambda: plain.get(workflow_id))
    _stale(lambda: world.over(counting).get(workflow_id))  # type: ignore[arg-type]
