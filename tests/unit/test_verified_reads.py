"""Every read that returns ledger events verifies them under the key, and trims are on record.

The store port only appends, so a history rewritten by someone without the
key (plain hashes recomputed, MACs dropped, forged or kept) is committed
here through the port itself: its appends are as well-formed as a database
editor could make them. A prefix cut without its ``ledger.trimmed`` event is
made with a bare ``LedgerTrim``, which is what deleting rows and raising a
stream's first index leaves. Every adapter runs these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from checkpoint_setup import checkpointed_run
from graph_services import graph_runs
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    DefinitionRegistry,
    Delete,
    Guard,
    HistoryEvent,
    LedgerAudit,
    LedgerPage,
    LedgerTrim,
    RunService,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    UnitOfWork,
    Upsert,
    WorkflowEventService,
    WorkflowService,
    trim_unit,
    verified_events,
)
from flowvault.application._audit import verify_stream
from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._record_audit import BoundRecords
from flowvault.application._record_kinds import CHECKPOINTS, WITNESSES
from flowvault.application._state import STATE_NAMESPACE, reset_progress
from flowvault.application._streams import keyed, read_stream
from flowvault.application._verified import StreamVerifier, verified_page
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application.testing import FrozenClock, SequentialIds, make_event
from flowvault.application.testing._fakes import EPOCH
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import IntegrityFailure, InvalidInput, LedgerEvent, WorkflowState, WorkOrder
from flowvault.domain._ledger import ChainDefect

KEY = bytes(range(7, 39))
STREAM = "host/orders"


@pytest.fixture
def repository(backend_store: SecureObjectStore) -> SealedRepository:
    """Provide a sealed repository (the integrity key's holder) over each backend."""
    return SealedRepository(backend_store, AesGcmCipher(KEY), FrozenClock())


def chain(
    count: int,
    digester: SealedRepository | None,
    *,
    stream: str = STREAM,
    after: LedgerEvent | None = None,
    note: str = "genuine",
) -> list[LedgerEvent]:
    """Return ``count`` events chained after ``after``, keyed when ``digester`` is given."""
    events: list[LedgerEvent] = []
    previous = after
    for _ in range(count):
        index = 0 if previous is None else previous.index + 1
        event = make_event(stream, index, previous, payload={"n": index, "note": note})
        if digester is not None:
            event = keyed(event, digester)
        events.append(event)
        previous = event
    return events


def append(store: SecureObjectStore, events: list[LedgerEvent]) -> None:
    """Commit ``events`` in units of at most 100 appends."""
    for start in range(0, len(events), 100):
        store.commit(UnitOfWork(appends=events[start : start + 100]))


def refusals(store: SecureObjectStore, repository: SealedRepository) -> dict[str, str | None]:
    """Run every verifier over ``STREAM``; return each one's defect, ``None`` when it passed."""
    found: dict[str, str | None] = {}

    def attempt(name: str, read: Callable[[], object]) -> None:
        try:
            read()
        except IntegrityFailure as failure:
            defect = failure.details.get("defect")
            found[name] = defect if isinstance(defect, str) else "integrity"
        else:
            found[name] = None

    attempt("events", lambda: verified_events(store, STREAM, repository))
    attempt("first page", lambda: verified_page(store, STREAM, repository, from_index=0, limit=10))
    audit = verify_stream(store, STREAM, repository)
    found["audit"] = None if audit.failure is None else audit.failure.defect.value
    return found


def test_an_intact_keyed_stream_reads_whole_and_page_by_page(
    backend_store: SecureObjectStore, repository: SealedRepository
) -> None:
    """Pages from any cursor, followed to the head, give exactly the whole stream."""
    events = chain(250, repository)
    append(backend_store, events)
    assert verified_events(backend_store, STREAM, repository) == events
    assert refusals(backend_store, repository) == {
        "events": None,
        "first page": None,
        "audit": None,
    }
    for cursor in (0, 1, 99, 200, 249):
        read: list[LedgerEvent] = []
        next_index: int | None = cursor
        while next_index is not None:
            page = verified_page(backend_store, STREAM, repository, from_index=next_index, limit=37)
            assert not page.gap
            read.extend(page.events)
            next_index = page.next_index
        assert read == events[cursor:]
    past = verified_page(backend_store, STREAM, repository, from_index=400, limit=10)
    assert (past.events, past.next_index) == ((), None)


@pytest.mark.parametrize(
    "rewrite",
    ["macs dropped", "macs kept", "macs forged"],
)
def test_a_history_rewritten_without_the_key_is_refused_by_every_reader(
    backend_store: SecureObjectStore, repository: SealedRepository, rewrite: str
) -> None:
    """Recomputed plain hashes pass a keyless check but no keyed one, whatever is done to MACs."""
    genuine = chain(6, repository)
    forged = chain(6, None, note="rewritten")
    if rewrite == "macs kept":
        forged = [
            event.model_copy(update={"chain_mac": real.chain_mac})
            for event, real in zip(forged, genuine, strict=True)
        ]
    elif rewrite == "macs forged":
        forged = [e.model_copy(update={"chain_mac": "sha256:" + "5a" * 32}) for e in forged]
    append(backend_store, forged)
    assert verify_stream(backend_store, STREAM).ok, "the keyless audit cannot tell"
    expected = "unkeyed" if rewrite == "macs dropped" else "forged"
    assert refusals(backend_store, repository) == {
        "events": expected,
        "first page": expected,
        "audit": expected,
    }


def test_unkeyed_events_pass_only_when_a_keyed_event_follows_them(
    backend_store: SecureObjectStore, repository: SealedRepository
) -> None:
    """A keyed event vouches for the unkeyed ones before it (its MAC covers their hashes).

    Without one after them, unkeyed events are what a rewrite that stripped
    every MAC leaves, so they are refused; a MAC missing after a keyed event
    is refused as stripped.
    """
    legacy = chain(3, None)
    append(backend_store, legacy)
    assert refusals(backend_store, repository)["events"] == "unkeyed"
    audit = verify_stream(backend_store, STREAM, repository)
    assert audit.failure is not None
    assert audit.failure.index == 0
    vouching = chain(1, repository, after=legacy[-1])
    append(backend_store, vouching)
    assert verified_events(backend_store, STREAM, repository) == legacy + vouching
    assert verify_stream(backend_store, STREAM, repository).unkeyed == 3
    page = verified_page(backend_store, STREAM, repository, from_index=1, limit=1)
    assert [event.index for event in page.events] == [1]
    stripped = chain(1, None, after=vouching[-1])
    append(backend_store, stripped)
    assert set(refusals(backend_store, repository).values()) == {"unkeyed"}


def test_a_prefix_cut_without_its_trim_event_is_truncated_for_every_reader(
    backend_store: SecureObjectStore, repository: SealedRepository
) -> None:
    """Deleting the first events and raising the first index is not retention."""
    append(backend_store, chain(30, repository))
    backend_store.commit(UnitOfWork(trims=[LedgerTrim(STREAM, 10)]))
    assert refusals(backend_store, repository) == {
        "events": "truncated",
        "first page": "truncated",
        "audit": "truncated",
    }
    with pytest.raises(IntegrityFailure) as caught:
        verified_page(backend_store, STREAM, repository, from_index=10, limit=5)
    assert caught.value.details["index"] == 10
    inside = verified_page(backend_store, STREAM, repository, from_index=20, limit=5)
    assert [event.index for event in inside.events] == list(range(20, 25))


def test_a_trim_with_its_keyed_event_is_retention_and_reads_on(
    backend_store: SecureObjectStore, repository: SealedRepository
) -> None:
    """``trim_unit`` records each trim; a later cut past what it names is still caught."""
    append(backend_store, chain(30, repository))
    backend_store.commit(
        trim_unit(backend_store, repository, STREAM, before_index=10, occurred_at=EPOCH)
    )
    events = verified_events(backend_store, STREAM, repository)
    assert [events[0].index, events[-1].index, events[-1].type] == [10, 30, "ledger.trimmed"]
    assert events[-1].payload == {"before_index": 10, "removed_hash": events[0].previous_hash}
    gap = verified_page(backend_store, STREAM, repository, from_index=3, limit=5)
    assert gap.gap
    assert gap.events[0].index == 10
    backend_store.commit(
        trim_unit(backend_store, repository, STREAM, before_index=31, occurred_at=EPOCH)
    )
    assert [e.index for e in verified_events(backend_store, STREAM, repository)] == [31]
    assert verify_stream(backend_store, STREAM, repository).ok
    with pytest.raises(InvalidInput):
        trim_unit(backend_store, repository, STREAM, before_index=20, occurred_at=EPOCH)


def test_a_trim_event_written_without_the_key_does_not_excuse_a_cut(
    backend_store: SecureObjectStore, repository: SealedRepository
) -> None:
    """An editor can write a ``ledger.trimmed`` event, but not its MAC."""
    events = chain(20, repository)
    append(backend_store, events)
    fake = LedgerEvent.create(
        stream=STREAM,
        index=20,
        type="ledger.trimmed",
        occurred_at=EPOCH,
        payload={"before_index": 5, "removed_hash": events[4].event_hash},
        previous_hash=events[-1].event_hash,
    )
    backend_store.commit(UnitOfWork(appends=[fake], trims=[LedgerTrim(STREAM, 5)]))
    assert set(refusals(backend_store, repository).values()) == {"unkeyed"}
    assert verify_stream(backend_store, STREAM).ok, "a keyless auditor cannot tell"


@dataclass
class CountingStore:
    """A store wrapper counting the events ``read_ledger`` hands out."""

    inner: SecureObjectStore
    events_read: int = 0
    calls: list[int] = field(default_factory=list)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        page = self.inner.read_ledger(stream, from_index=from_index, limit=limit)
        self.events_read += len(page.events)
        self.calls.append(from_index)
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_page_costs_what_it_reads_not_the_stream_before_it() -> None:
    """A page deep in a long stream is checked against the event before it, not from index 0."""
    store = InMemorySecureObjectStore()
    repository = SealedRepository(store, AesGcmCipher(KEY), FrozenClock())
    append(store, chain(100_000, repository))
    counting = CountingStore(store)
    page = verified_page(counting, STREAM, repository, from_index=99_800, limit=100)  # type: ignore[arg-type]
    assert [page.events[0].index, page.events[-1].index] == [99_800, 99_899]
    assert counting.events_read == 101
    assert counting.calls == [99_799]


def test_the_verifier_reports_the_first_broken_link() -> None:
    """Reordered, duplicated and skipped events fail at the first bad index, keyed or not."""
    store = InMemorySecureObjectStore()
    repository = SealedRepository(store, AesGcmCipher(KEY), FrozenClock())
    events = chain(6, repository)
    for sequence, defect, index in [
        ([*events[:2], events[3], events[2], *events[4:]], ChainDefect.GAP, 3),
        ([*events[:3], events[2], *events[3:]], ChainDefect.DUPLICATE_INDEX, 2),
        ([*events[:2], *events[3:]], ChainDefect.GAP, 3),
    ]:
        for digester in (repository, None):
            verifier = StreamVerifier(digester)
            verifier.feed(sequence)
            verifier.finish()
            assert verifier.failure is not None
            assert (verifier.failure.defect, verifier.failure.index) == (defect, index)


# -- the services' audit reads ------------------------------------------------------


def _world(
    store: SecureObjectStore,
) -> tuple[SealedRepository, WorkflowService, WorkflowEventService, RunService]:
    repository = SealedRepository(store, AesGcmCipher(KEY), FrozenClock())
    ids = SequentialIds("id")
    runs = graph_runs(repository, repository.clock, ids)
    services = workflow_services(repository, repository.clock, ids)
    return repository, services.workflows, services.events, runs


def _forge_after(store: SecureObjectStore, stream: str) -> None:
    """Append an event after ``stream``'s head without the key."""
    head = store.ledger_head(stream)
    assert head is not None
    store.commit(UnitOfWork(appends=[make_event(stream, head.index + 1, head)]))


def test_workflow_events_history_and_run_events_refuse_what_the_key_did_not_write(
    backend_store: SecureObjectStore,
) -> None:
    """The three audit reads of the services all refuse an event appended without the key.

    A workflow's read meets it first in the freshness check of its record
    (an event after the one the record names, with no MAC); the others in
    the chain's verification.
    """
    repository, workflows, events, runs = _world(backend_store)
    record, _ = workflows.create(WorkOrder(kind="k", requester="r", idempotency_key="i"))
    state = StateRepository(repository, "main")
    state.update_with_events(lambda _: (WorkflowState(step=1), [HistoryEvent("state.stepped")]))
    DefinitionRegistry(repository, repository.clock).register_definition("graph", {"nodes": ["a"]})
    run, _ = runs.start_run("graph", {"t": 1})
    assert events.events(record.workflow_id)
    assert state.history()
    assert runs.read_run_events(run.run_id).events
    reads: list[tuple[str, Callable[[], object]]] = [
        (stream_of(record.workflow_id), lambda: events.events(record.workflow_id)),
        ("scope/main", state.history),
        (f"run/{run.run_id}", lambda: runs.read_run_events(run.run_id)),
    ]
    for stream, read in reads:
        _forge_after(backend_store, stream)
        with pytest.raises(IntegrityFailure) as caught:
            read()
        details = caught.value.details
        assert details.get("defect") == "unkeyed" or "ledger_index" in details
    assert len(list(read_stream(backend_store, stream_of(record.workflow_id)))) == 2


def test_a_full_audit_fails_on_an_unreadable_or_a_replayed_record(
    backend_store: SecureObjectStore,
) -> None:
    """``ledger verify --all`` is not ok when a record does not open or is older than its stream."""
    repository, workflows, _events, runs = _world(backend_store)
    bound = BoundRecords(repository, workflows, runs)
    record, _ = workflows.create(WorkOrder(kind="k", requester="r", idempotency_key="i"))
    digest = repository.key_digest(WORKFLOWS, record.workflow_id)
    old = backend_store.load(WORKFLOWS, digest)
    assert old is not None
    workflows.transition(
        record.workflow_id, "planning", expected_state="intake", expected_version=1
    )
    assert LedgerAudit(backend_store, repository, bound).run().ok
    current = backend_store.peek_metadata(WORKFLOWS, digest)
    assert current is not None
    backend_store.commit(UnitOfWork(deletes=[Delete(WORKFLOWS, digest, current.revision)]))
    backend_store.commit(
        UnitOfWork(
            upserts=[
                Upsert(
                    header=old.metadata.header,
                    payload=old.payload,
                    expected=Guard.ABSENT,
                    labels=old.metadata.labels,
                )
            ]
        )
    )
    report = LedgerAudit(backend_store, repository, bound).run()
    assert not report.ok
    assert [stale.stream for stale in report.stale] == [stream_of(record.workflow_id)]
    assert all(stream.ok for stream in report.streams), "the chains themselves are intact"
    assert LedgerAudit(backend_store, repository).run().stale == (), "no bound reader, no check"
    other = SealedRepository(backend_store, AesGcmCipher(bytes(32 * [9])), FrozenClock())
    other.write("notes", "n-1", {"x": 1}, expected=Guard.ABSENT)
    unreadable = LedgerAudit(backend_store, repository).run()
    assert not unreadable.ok
    assert unreadable.unreadable_count == 1
    assert all(stream.ok for stream in unreadable.streams)


def test_the_raw_stream_reader_is_the_negative_control(
    backend_store: SecureObjectStore, repository: SealedRepository
) -> None:
    """``read_stream`` checks nothing: it returns the forged events the verifiers refuse."""
    append(backend_store, chain(4, None))
    assert len(list(read_stream(backend_store, STREAM))) == 4
    assert refusals(backend_store, repository)["events"] == "unkeyed"


def test_records_stay_current_after_their_streams_are_trimmed_on_record(
    backend_store: SecureObjectStore,
) -> None:
    """A trim event after a record's own event leaves a workflow, a run and a scope's state current.

    Trimming away the event a record names is another matter: the record
    can no longer be shown current, so it reads as stale.
    """
    repository, workflows, events, runs = _world(backend_store)
    record, _ = workflows.create(WorkOrder(kind="k", requester="r", idempotency_key="i"))
    events.append_event(
        record.workflow_id,
        "workflow.noted",
        expected_state=record.state,
        expected_version=record.state_version,
        payload={"note": 1},
    )
    state = StateRepository(repository, "main")
    for step in (1, 2):
        state.update_with_events(
            lambda _, step=step: (WorkflowState(step=step), [HistoryEvent("state.stepped")])
        )
    DefinitionRegistry(repository, repository.clock).register_definition("graph", {"nodes": ["a"]})
    run, _ = runs.start_run("graph", {"t": 1})
    runs.append_run_events(run.run_id, [("node.tick", {"n": 1}), ("node.tick", {"n": 2})])
    before = workflows.get(record.workflow_id)
    for stream in (stream_of(record.workflow_id), "scope/main", f"run/{run.run_id}"):
        backend_store.commit(
            trim_unit(backend_store, repository, stream, before_index=1, occurred_at=EPOCH)
        )
    assert workflows.get(record.workflow_id) == before
    assert events.events(record.workflow_id)[-1].type == "ledger.trimmed"
    assert state.load().state == WorkflowState(step=2)
    assert state.history()[0].index == 1
    assert runs.get_run(run.run_id).status == run.status
    assert runs.read_run_events(run.run_id).gap
    bound = BoundRecords(repository, workflows, runs)
    assert LedgerAudit(backend_store, repository, bound).run().ok
    head = backend_store.ledger_head("scope/main")
    assert head is not None
    backend_store.commit(
        trim_unit(
            backend_store, repository, "scope/main", before_index=head.index + 1, occurred_at=EPOCH
        )
    )
    with pytest.raises(IntegrityFailure):
        state.load()


def test_a_full_audit_finds_replayed_and_deleted_rows_of_record_streams(
    backend_store: SecureObjectStore,
) -> None:
    """Checkpoints, approvals and witnesses: a row put back or deleted is a finding.

    Their rows have no stream of their own; the record stream names, in
    each event, the rows it wrote, so the audit holds each row to the
    newest event naming it.
    """
    clock = FrozenClock()
    runtime = bootstrap(Settings(backend="memory"), key=KEY, clock=clock, store=backend_store)
    _, checkpoint = checkpointed_run(runtime, "graph")
    pending = backend_store.load(
        CHECKPOINTS, runtime.repository.key_digest(CHECKPOINTS, checkpoint.checkpoint_id)
    )
    assert pending is not None
    runtime.checkpoints.consume_checkpoint(checkpoint.checkpoint_id)
    witness = runtime.evidence.capture_witness(
        "https://x", b"seen", "text/plain", "web", clock.now()
    )
    audit = LedgerAudit(runtime.store, runtime.repository, runtime_bound(runtime))
    assert audit.run().ok

    current = backend_store.peek_metadata(CHECKPOINTS, pending.metadata.key_digest)
    assert current is not None
    backend_store.commit(
        UnitOfWork(deletes=[Delete(CHECKPOINTS, current.key_digest, current.revision)])
    )
    put_back = Upsert(
        header=pending.metadata.header,
        payload=pending.payload,
        expected=Guard.ABSENT,
        labels=pending.metadata.labels,
    )
    backend_store.commit(UnitOfWork(upserts=[put_back]))
    witness_digest = runtime.repository.key_digest(WITNESSES, witness.content_digest)
    row = backend_store.peek_metadata(WITNESSES, witness_digest)
    assert row is not None
    backend_store.commit(UnitOfWork(deletes=[Delete(WITNESSES, witness_digest, row.revision)]))
    report = audit.run()
    assert not report.ok
    assert all(stream.ok for stream in report.streams)
    found = {(stale.namespace, stale.key_digest) for stale in report.stale}
    assert found == {(CHECKPOINTS, pending.metadata.key_digest), (None, witness_digest)}


def runtime_bound(runtime: Runtime) -> BoundRecords:
    """Return the bound-record reader the CLI's audit builds, over a runtime's services."""
    return BoundRecords(runtime.repository, runtime.workflows, runtime.runs)


def test_a_state_row_deleted_outside_flowvault_is_refused_not_read_as_empty(
    backend_store: SecureObjectStore,
) -> None:
    """Its history says it was written: load, update and the audit refuse; a reset recovers.

    Reading the scope as empty would hand out a default state, and an
    update would write revision 1 over what was lost.
    """
    repository, workflows, _events, runs = _world(backend_store)
    state = StateRepository(repository, "main")
    state.save(WorkflowState(step=3))
    address = repository.key_digest(STATE_NAMESPACE, "main")
    row = backend_store.peek_metadata(STATE_NAMESPACE, address)
    assert row is not None
    backend_store.commit(UnitOfWork(deletes=[Delete(STATE_NAMESPACE, address, row.revision)]))
    for attempt in (state.load, lambda: state.save(WorkflowState(step=4))):
        with pytest.raises(IntegrityFailure) as caught:
            attempt()
        assert caught.value.details["missing"] is True
    assert backend_store.peek_metadata(STATE_NAMESPACE, address) is None
    report = LedgerAudit(backend_store, repository, BoundRecords(repository, workflows, runs)).run()
    assert [stale.stream for stale in report.stale] == ["scope/main"]
    reset_progress(state, "main", actor="ops", source="test", reason_class="corrupt")
    assert state.load().revision is None
    state.save(WorkflowState(step=5))
    assert state.load().state == WorkflowState(step=5)


def test_a_workflow_or_run_deleted_outside_flowvault_is_refused_not_unknown(
    backend_store: SecureObjectStore,
) -> None:
    """Their streams hold their events, so a missing record is deleted, not never written.

    A retried create is refused too (no second workflow), and the full
    audit lists both; a run purged by retention still reads as ``NOT_FOUND``.
    """
    repository, workflows, _events, runs = _world(backend_store)
    order = WorkOrder(kind="k", requester="r", idempotency_key="i")
    record, _ = workflows.create(order)
    DefinitionRegistry(repository, repository.clock).register_definition("graph", {"nodes": ["a"]})
    run, _ = runs.start_run("graph", {"t": 1})
    for namespace, natural in ((WORKFLOWS, record.workflow_id), (GRAPH_RUNS, run.run_id)):
        digest = repository.key_digest(namespace, natural)
        row = backend_store.peek_metadata(namespace, digest)
        assert row is not None
        backend_store.commit(UnitOfWork(deletes=[Delete(namespace, digest, row.revision)]))
    for call in (
        lambda: workflows.get(record.workflow_id),
        lambda: workflows.create(order),
        lambda: runs.get_run(run.run_id),
    ):
        with pytest.raises(IntegrityFailure) as caught:
            call()
        assert caught.value.details["missing"] is True
    assert backend_store.namespace_counts().get(WORKFLOWS, 0) == 0
    report = LedgerAudit(backend_store, repository, BoundRecords(repository, workflows, runs)).run()
    assert {stale.stream for stale in report.stale} >= {
        stream_of(record.workflow_id),
        f"run/{run.run_id}",
    }
