"""Records without a stream of their own, bound to a record stream: replays and deletions.

Checkpoints (with their approvals and slots), idempotency markers and
witnesses each write an event to a record stream named by a keyed digest
and name it in their header. An older row put back whole is refused, a row
deleted outside flowvault is told apart from one never written or purged,
and a retry whose marker was deleted is refused instead of repeated. The
attacks go through the port itself, which is what an editor of the
database leaves behind; every adapter runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from checkpoint_setup import create_checkpoint, request_approval
from graph_services import graph_runs
from row_edits import PassThroughStore, RowEditor, refused
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    ApprovalService,
    CheckpointService,
    DefinitionRegistry,
    EvidenceService,
    Guard,
    IdempotencyService,
    LedgerPage,
    SealedRepository,
    SecureObjectStore,
    StoredRecord,
    TerminalReceipts,
    UnreadableItem,
)
from flowvault.application._freshness import (
    CHECKPOINT_KIND,
    IDEMPOTENCY_KIND,
    WITNESS_KIND,
    record_stream,
)
from flowvault.application._graph_namespaces import GRAPH_RUN_IDEMPOTENCY
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    REQUEST_IDEMPOTENCY,
    WITNESSES,
)
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._streams import run_stream
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application._workflow_events import EVENT_KEYS
from flowvault.application._workflow_records import stream_of
from flowvault.application._workflows import IDEMPOTENCY
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import (
    Approval,
    Checkpoint,
    CheckpointStatus,
    FlowvaultError,
    IntegrityFailure,
    LedgerEvent,
    NotFound,
    WorkOrder,
)
from flowvault.domain._canonical import canonical_json

KEY = bytes(range(3, 35))
SECRET = "freshness-secret-9b2e-never-in-errors"
RUN = "run-0001"
DAY = timedelta(days=1)


class World(RowEditor):
    """Every service that writes record-stream rows, over one store and a frozen clock."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.clock = FrozenClock()
        super().__init__(store, SealedRepository(store, AesGcmCipher(KEY), self.clock))
        repo = self.repository
        self.checkpoints = CheckpointService(repo, self.clock, integrity=repo)
        self.approvals = ApprovalService(
            repo, self.clock, SequentialIds("ap"), checkpoints=self.checkpoints, integrity=repo
        )
        self.idempotency = IdempotencyService(repo, self.clock)
        self.evidence = EvidenceService(repo, self.clock, integrity=repo)
        services = workflow_services(repo, self.clock, SequentialIds("wf"))
        self.workflows = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results
        self.runs = graph_runs(repo, self.clock, SequentialIds("run"))
        self.definitions = DefinitionRegistry(repo, self.clock)
        self.receipts = TerminalReceipts(repo, repo)

    def checkpoint(self, cursor: str = "node-b") -> Checkpoint:
        return create_checkpoint(self.checkpoints, RUN, cursor, {"iban": SECRET})

    def request(self, checkpoint: Checkpoint, audience: str = "finance") -> Approval:
        expires_at = self.clock.now() + timedelta(hours=1)
        return request_approval(self.approvals, checkpoint, audience, expires_at)

    def checkpoint_stream(self, checkpoint_id: str) -> str:
        return record_stream(CHECKPOINT_KIND, self.digest(CHECKPOINTS, checkpoint_id))


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def _refused(call: Callable[[], object], wording: str) -> IntegrityFailure:
    """Check a refusal with none of this module's secrets in it."""
    return refused(call, wording, SECRET)


STALE = "older than its ledger"
DELETED = "deleted outside flowvault"


# -- checkpoints ----------------------------------------------------------------


def test_each_checkpoint_write_names_its_record_stream_event(world: World) -> None:
    """Create and consume append an event naming the row, and the row's header names it."""
    made = world.checkpoint()
    stream = world.checkpoint_stream(made.checkpoint_id)
    digest = world.digest(CHECKPOINTS, made.checkpoint_id)
    assert world.row(CHECKPOINTS, made.checkpoint_id).metadata.header.ledger_index == 0
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    events = world.events(stream)
    assert [e.type for e in events] == ["checkpoint.created", "checkpoint.consumed"]
    assert all(e.payload == {"records": [digest]} for e in events)
    assert world.row(CHECKPOINTS, made.checkpoint_id).metadata.header.ledger_index == 1
    assert SECRET not in canonical_json([e.payload for e in events])


def test_a_consumed_checkpoint_put_back_as_pending_is_never_consumed_again(world: World) -> None:
    """The older pending row opens, but a later event of its stream consumed it."""
    made = world.checkpoint()
    pending = world.row(CHECKPOINTS, made.checkpoint_id)
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    world.replay(pending)
    failure = _refused(lambda: world.checkpoints.load_checkpoint(made.checkpoint_id), STALE)
    assert failure.details["ledger_index"] == 0
    _refused(lambda: world.checkpoints.consume_checkpoint(made.checkpoint_id), STALE)
    _refused(lambda: world.checkpoints.latest_checkpoint(RUN), STALE)
    _refused(lambda: world.request(made), STALE)
    assert len(world.events(world.checkpoint_stream(made.checkpoint_id))) == 2


def test_a_deleted_checkpoint_is_refused_and_not_created_again(world: World) -> None:
    """Its stream still vouches for it: reads and a retried create refuse instead of NOT_FOUND."""
    made = world.checkpoint()
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    world.delete(CHECKPOINTS, world.digest(CHECKPOINTS, made.checkpoint_id))
    _refused(lambda: world.checkpoints.load_checkpoint(made.checkpoint_id), DELETED)
    _refused(world.checkpoint, DELETED)
    _refused(lambda: world.checkpoints.consume_checkpoint(made.checkpoint_id), DELETED)
    with pytest.raises(NotFound):
        world.checkpoints.load_checkpoint("cp_" + "0" * 32)


def test_a_purged_checkpoint_is_gone_and_its_row_cannot_come_back(world: World) -> None:
    """The purge's tombstone, in the run's stream and the record stream, closes the record."""
    made = world.checkpoint()
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    consumed = world.row(CHECKPOINTS, made.checkpoint_id)
    world.clock.advance(2 * DAY)
    assert world.checkpoints.purge(world.clock.now(), DAY) == 1
    stream = world.checkpoint_stream(made.checkpoint_id)
    assert world.events(stream)[-1].type == RETENTION_TOMBSTONE
    assert world.events(run_stream(RUN))[-1].type == RETENTION_TOMBSTONE
    with pytest.raises(NotFound):
        world.checkpoints.load_checkpoint(made.checkpoint_id)
    world.replay(consumed)
    failure = _refused(lambda: world.checkpoints.load_checkpoint(made.checkpoint_id), STALE)
    assert failure.details["ledger_index"] == 1


def test_unbound_checkpoint_rows_are_held_to_every_event(world: World) -> None:
    """A row without an index reads while no event wrote it, and is stale once one did.

    Such a row was written without its event, so its record stream is
    empty: here it is copied from another store.
    """
    elsewhere = World(InMemorySecureObjectStore())
    made = elsewhere.checkpoint()
    opened = elsewhere.repository.read(CHECKPOINTS, made.checkpoint_id)
    assert opened is not None
    world.repository.write(
        CHECKPOINTS,
        made.checkpoint_id,
        opened.document,
        expected=Guard.ABSENT,
        labels=dict(opened.metadata.labels),
    )
    assert world.checkpoints.load_checkpoint(made.checkpoint_id) == made
    unbound = world.row(CHECKPOINTS, made.checkpoint_id)
    assert unbound.metadata.header.ledger_index is None
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    assert world.row(CHECKPOINTS, made.checkpoint_id).metadata.header.ledger_index == 0
    world.replay(unbound)
    _refused(lambda: world.checkpoints.consume_checkpoint(made.checkpoint_id), STALE)


# -- approvals and their slots -------------------------------------------------


def test_request_and_decision_bind_approval_slot_and_checkpoint(world: World) -> None:
    """The request binds approval and slot; the decision binds approval and checkpoint."""
    made = world.checkpoint()
    approval = world.request(made)
    slot_key = f"{made.checkpoint_id}\x1ffinance"
    stream = world.checkpoint_stream(made.checkpoint_id)
    requested = world.events(stream)[-1]
    assert requested.type == "approval.requested"
    assert requested.payload == {
        "records": [
            world.digest(APPROVALS, approval.approval_id),
            world.digest(APPROVAL_SLOTS, slot_key),
        ]
    }
    for namespace, natural in ((APPROVALS, approval.approval_id), (APPROVAL_SLOTS, slot_key)):
        assert world.row(namespace, natural).metadata.header.ledger_index == requested.index
    world.approvals.decide(approval.approval_id, "approve", "dana")
    decided = world.events(stream)[-1]
    assert decided.type == "checkpoint.approval_decided"
    for namespace, natural in (
        (APPROVALS, approval.approval_id),
        (CHECKPOINTS, made.checkpoint_id),
    ):
        assert world.row(namespace, natural).metadata.header.ledger_index == decided.index
    assert [e.type for e in world.events(run_stream(RUN))] == ["approval.decided"]


def test_approval_rows_put_back_from_before_the_decision_are_never_decided_again(
    world: World,
) -> None:
    """Approval, slot and checkpoint replayed together: every read and a second decide refuse."""
    made = world.checkpoint()
    approval = world.request(made)
    slot_key = f"{made.checkpoint_id}\x1ffinance"
    old = [
        world.row(APPROVALS, approval.approval_id),
        world.row(APPROVAL_SLOTS, slot_key),
        world.row(CHECKPOINTS, made.checkpoint_id),
    ]
    world.approvals.decide(approval.approval_id, "approve", "dana")
    for row in old:
        world.replay(row)
        _refused(lambda: world.approvals.decide(approval.approval_id, "reject", "mallory"), STALE)
    _refused(lambda: world.approvals.get_approval(approval.approval_id), STALE)
    listed = world.approvals.list_approvals(RUN)
    assert listed.items == ()
    assert listed.unreadable == (UnreadableItem(old[0].metadata.key_digest, "INTEGRITY_FAILURE"),)
    _refused(lambda: world.request(made), STALE)
    decided = [e for e in world.events(run_stream(RUN)) if e.type == "approval.decided"]
    assert len(decided) == 1


def test_an_approval_alone_put_back_as_pending_is_refused(world: World) -> None:
    """Only the approval row replayed: it names the request, and the decision followed."""
    made = world.checkpoint()
    approval = world.request(made)
    pending = world.row(APPROVALS, approval.approval_id)
    world.approvals.decide(approval.approval_id, "approve", "dana")
    world.replay(pending)
    failure = _refused(lambda: world.approvals.get_approval(approval.approval_id), STALE)
    assert failure.details["ledger_index"] == 1


def test_a_deleted_slot_cannot_make_a_second_request(world: World) -> None:
    """The stream still records the request: the retry is refused, no second approval exists."""
    made = world.checkpoint()
    world.request(made)
    slot = world.digest(APPROVAL_SLOTS, f"{made.checkpoint_id}\x1ffinance")
    world.delete(APPROVAL_SLOTS, slot)
    failure = _refused(lambda: world.request(made), DELETED)
    assert failure.details["key_digest"] == slot
    assert len(world.store.list(APPROVALS, limit=10).items) == 1
    assert world.request(made, audience="legal").audience == "legal"


def test_approval_purge_closes_approval_and_slot(world: World) -> None:
    """A purged approval's tombstone names its slot; both rows put back are refused."""
    made = world.checkpoint()
    approval = world.request(made)
    world.approvals.decide(approval.approval_id, "approve", "dana")
    slot_key = f"{made.checkpoint_id}\x1ffinance"
    old_approval = world.row(APPROVALS, approval.approval_id)
    old_slot = world.row(APPROVAL_SLOTS, slot_key)
    world.clock.advance(2 * DAY)
    assert world.approvals.purge(world.clock.now(), DAY) == 1
    tombstone = world.events(world.checkpoint_stream(made.checkpoint_id))[-1]
    assert tombstone.type == RETENTION_TOMBSTONE
    assert isinstance(tombstone.payload, dict)
    assert tombstone.payload["slot"] == old_slot.metadata.key_digest
    with pytest.raises(NotFound):
        world.approvals.get_approval(approval.approval_id)
    world.replay(old_approval)
    _refused(lambda: world.approvals.get_approval(approval.approval_id), STALE)


# -- idempotency markers --------------------------------------------------------


def test_a_deleted_request_record_is_refused_not_forgotten(world: World) -> None:
    """Recall and remember refuse, so a response is never produced twice for one key."""
    world.idempotency.remember("req-1", {"op": SECRET}, {"status": 201})
    record = world.digest(REQUEST_IDEMPOTENCY, "req-1")
    assert world.events(record_stream(IDEMPOTENCY_KIND, record))[0].type == "idempotency.recorded"
    world.delete(REQUEST_IDEMPOTENCY, record)
    _refused(lambda: world.idempotency.recall("req-1", {"op": SECRET}), DELETED)
    _refused(lambda: world.idempotency.remember("req-1", {"op": SECRET}, {"status": 202}), DELETED)


def test_a_purged_request_record_is_gone_and_cannot_come_back(world: World) -> None:
    """After a purge the key is free again; the purged row put back is refused."""
    world.idempotency.remember("req-1", {"op": 1}, {"status": 201})
    old = world.row(REQUEST_IDEMPOTENCY, "req-1")
    world.clock.advance(2 * DAY)
    assert world.idempotency.purge(world.clock.now(), DAY) == 1
    assert world.idempotency.recall("req-1", {"op": 1}) is None
    world.replay(old)
    _refused(lambda: world.idempotency.recall("req-1", {"op": 1}), STALE)
    world.delete(REQUEST_IDEMPOTENCY, old.metadata.key_digest)
    assert world.idempotency.remember("req-1", {"op": 2}, {"status": 203}) == {"status": 203}


def _order(key: str = "order-1") -> WorkOrder:
    return WorkOrder(
        kind="invoice.review",
        parameters={"iban": SECRET},
        requester="alice@example.org",
        idempotency_key=key,
    )


def test_a_deleted_workflow_marker_cannot_make_a_second_workflow(world: World) -> None:
    """The marker's record stream recorded the create: the retry is refused, not repeated."""
    record, created = world.workflows.create(_order())
    assert created
    marker = world.digest(IDEMPOTENCY, "order-1")
    stream = record_stream(IDEMPOTENCY_KIND, marker)
    assert [e.type for e in world.events(stream)] == ["idempotency.recorded"]
    world.delete(IDEMPOTENCY, marker)
    _refused(lambda: world.workflows.create(_order()), DELETED)
    assert [w.workflow_id for w in world.workflows.list_workflows().items] == [record.workflow_id]


def test_a_deleted_event_key_marker_cannot_append_the_event_twice(world: World) -> None:
    """The keyed event carries the marker's digest, so the retry finds it and refuses."""
    record, _ = world.workflows.create(_order())
    world.workflow_events.append_event(
        record.workflow_id, "note.added", expected_state="intake", expected_version=1,
        event_key="note-1",
    )  # fmt: skip
    marker = world.digest(EVENT_KEYS, f"{record.workflow_id}\x1fnote-1")
    world.delete(EVENT_KEYS, marker)
    retry = lambda: world.workflow_events.append_event(  # noqa: E731
        record.workflow_id, "note.added", expected_state="intake", expected_version=1,
        event_key="note-1",
    )  # fmt: skip
    _refused(retry, DELETED)
    assert len(world.events(stream_of(record.workflow_id))) == 2


def test_a_deleted_run_marker_cannot_start_the_run_twice(world: World) -> None:
    """A start's marker is vouched for by its record stream; a purge tombstones that stream."""
    world.definitions.register_definition("flow.a", {"nodes": ["a"]})
    run, _ = world.runs.start_run("flow.a", {"n": 1}, idempotency_key="start-1")
    marker = world.digest(GRAPH_RUN_IDEMPOTENCY, "start-1")
    world.delete(GRAPH_RUN_IDEMPOTENCY, marker)
    _refused(lambda: world.runs.start_run("flow.a", {"n": 1}, idempotency_key="start-1"), DELETED)
    assert [r.run_id for r in world.runs.list_runs().items] == [run.run_id]


def test_a_purged_run_frees_its_key(world: World) -> None:
    """The run purge tombstones the marker's stream too, so a later start is a new run."""
    world.definitions.register_definition("flow.a", {"nodes": ["a"]})
    run, _ = world.runs.start_run("flow.a", {"n": 1}, idempotency_key="start-1")
    world.runs.finish_run(run.run_id, "cancelled", expected_status="accepted", final_state={})
    world.clock.advance(2 * DAY)
    assert purge_finished_runs(world.repository, world.clock, world.clock.now(), DAY) == 1
    stream = record_stream(IDEMPOTENCY_KIND, world.digest(GRAPH_RUN_IDEMPOTENCY, "start-1"))
    assert world.events(stream)[-1].type == RETENTION_TOMBSTONE
    again, created = world.runs.start_run("flow.a", {"n": 1}, idempotency_key="start-1")
    assert created
    assert again.run_id != run.run_id


# -- witnesses -----------------------------------------------------------------


def test_a_deleted_witness_is_refused_not_captured_again(world: World) -> None:
    """A witness's record stream says it was captured; its absence is tampering."""
    witness = world.evidence.capture_witness(
        "https://example.org/a", SECRET.encode(), "text/plain", "primary", world.clock.now()
    )
    record = world.digest(WITNESSES, witness.content_digest)
    stream = record_stream(WITNESS_KIND, record)
    assert [e.type for e in world.events(stream)] == ["witness.captured"]
    assert world.row(WITNESSES, witness.content_digest).metadata.header.ledger_index == 0
    world.delete(WITNESSES, record)
    _refused(lambda: world.evidence.load_witness(witness.content_digest), DELETED)
    _refused(
        lambda: world.evidence.capture_witness(
            "https://example.org/b", SECRET.encode(), "text/plain", "primary", world.clock.now()
        ),
        DELETED,
    )


def test_a_witness_put_back_without_a_later_locator_is_refused(world: World) -> None:
    """Adding a locator binds the row to ``witness.located``; the older row put back is stale."""
    content = SECRET.encode()
    witness = world.evidence.capture_witness(
        "https://example.org/a", content, "text/plain", "primary", world.clock.now()
    )
    one_locator = world.row(WITNESSES, witness.content_digest)
    grown = world.evidence.capture_witness(
        "https://example.org/b", content, "text/plain", "primary", world.clock.now()
    )
    record = world.digest(WITNESSES, witness.content_digest)
    events = world.events(record_stream(WITNESS_KIND, record))
    assert [e.type for e in events] == ["witness.captured", "witness.located"]
    assert all(e.payload == {"records": [record]} for e in events)
    assert world.row(WITNESSES, witness.content_digest).metadata.header.ledger_index == 1
    world.replay(one_locator)
    failure = _refused(lambda: world.evidence.load_witness(witness.content_digest), STALE)
    assert failure.details["ledger_index"] == 0
    _refused(
        lambda: world.evidence.capture_witness(
            "https://example.org/b", content, "text/plain", "primary", world.clock.now()
        ),
        STALE,
    )
    assert grown.locators == ("https://example.org/a", "https://example.org/b")


# -- what the record streams trust ------------------------------------------------


class _ForgedTombstone(PassThroughStore):
    """A record stream showing one more event: a tombstone for the row, without a valid MAC."""

    def __init__(self, inner: SecureObjectStore, forged: LedgerEvent) -> None:
        super().__init__(inner)
        self._forged = forged

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        return self._forged if stream == self._forged.stream else self._inner.ledger_head(stream)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        page = self._inner.read_ledger(stream, from_index=from_index, limit=limit)
        if stream != self._forged.stream:
            return page
        return LedgerPage(events=(*page.events, self._forged), next_index=None, gap=False)


def test_an_unkeyed_tombstone_does_not_excuse_a_deleted_row(world: World) -> None:
    """Deleting a row and appending a tombstone without the integrity key is still refused."""
    world.idempotency.remember("req-1", {"op": 1}, {"status": 201})
    record = world.digest(REQUEST_IDEMPOTENCY, "req-1")
    stream = record_stream(IDEMPOTENCY_KIND, record)
    head = world.store.ledger_head(stream)
    assert head is not None
    world.delete(REQUEST_IDEMPOTENCY, record)
    forged = LedgerEvent.create(
        stream=stream,
        index=1,
        type=RETENTION_TOMBSTONE,
        occurred_at=head.occurred_at,
        payload={"kind": "idempotency", "record": record},
        previous_hash=head.event_hash,
    )
    repository = SealedRepository(
        _ForgedTombstone(world.store, forged),  # type: ignore[arg-type]
        AesGcmCipher(KEY),
        world.clock,
    )
    service = IdempotencyService(repository, world.clock)
    _refused(lambda: service.recall("req-1", {"op": 1}), DELETED)


class _AbsentOnce(PassThroughStore):
    """Reports one row absent on its first load, as if it were written just after."""

    def __init__(self, inner: SecureObjectStore, namespace: str) -> None:
        super().__init__(inner)
        self._namespace = namespace
        self.hidden = 0

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        if namespace == self._namespace and not self.hidden:
            self.hidden += 1
            return None
        return self._inner.load(namespace, key_digest)


def test_a_row_written_between_read_and_stream_check_is_no_false_alarm(world: World) -> None:
    """An absent row whose stream then shows it is read again before anything is refused."""
    world.idempotency.remember("req-1", {"op": 1}, {"status": 201})
    racing = _AbsentOnce(world.store, REQUEST_IDEMPOTENCY)
    repository = SealedRepository(racing, AesGcmCipher(KEY), world.clock)  # type: ignore[arg-type]
    service = IdempotencyService(repository, world.clock)
    assert service.recall("req-1", {"op": 1}) == {"status": 201}
    assert racing.hidden == 1


def test_every_record_stream_event_is_keyed_and_names_only_digests(world: World) -> None:
    """Record-stream events carry their chain MAC and no natural key or payload."""
    from flowvault.application._streams import mac_matches  # noqa: PLC0415 - the MAC's one source

    made = world.checkpoint()
    approval = world.request(made)
    world.approvals.decide(approval.approval_id, "approve", "dana")
    world.idempotency.remember(SECRET, {"op": SECRET}, {"body": SECRET})
    world.evidence.capture_witness(
        "https://example.org/a", SECRET.encode(), "text/plain", "primary", world.clock.now()
    )
    world.workflows.create(_order(SECRET))
    streams = [name for name in _streams(world) if name.split("/")[0] in RECORD_FRESHNESS_KINDS]
    assert len(streams) == 4
    for name in streams:
        assert SECRET not in name
        for event in world.events(name):
            assert mac_matches(event, world.repository)
            assert SECRET not in canonical_json(event.payload)
            assert "dana" not in canonical_json(event.payload)


RECORD_FRESHNESS_KINDS = (CHECKPOINT_KIND, IDEMPOTENCY_KIND, WITNESS_KIND)


def _streams(world: World) -> list[str]:
    from flowvault.application._audit import list_all_streams  # noqa: PLC0415

    return list_all_streams(world.store)


def test_errors_are_typed_flowvault_errors(world: World) -> None:
    """A refused read is a FlowvaultError whose code is the stable INTEGRITY_FAILURE."""
    made = world.checkpoint()
    world.delete(CHECKPOINTS, world.digest(CHECKPOINTS, made.checkpoint_id))
    with pytest.raises(FlowvaultError) as caught:
        world.checkpoints.load_checkpoint(made.checkpoint_id)
    assert caught.value.code == "INTEGRITY_FAILURE"
    assert made.status is CheckpointStatus.PENDING
