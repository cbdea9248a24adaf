"""Vouching for a genuine stream no keyed verifier can prove: unkeyed events and bare cuts.

A stream whose events host code appended without a chain MAC and one whose
prefix host code dropped with no ``ledger.trimmed`` event fail every keyed
verifier; a key holder who compared the stream with a trusted copy vouches
for it with one keyed ``ledger.vouched`` event, after which it verifies and
the records it binds stay current. Everything else is refused: a stream
that already verifies, one edited or forged, a MAC missing after a keyed
event, a head other than the one compared. Every adapter runs these.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from graph_services import graph_runs
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.application import (
    DefinitionRegistry,
    HistoryEvent,
    LedgerAudit,
    LedgerTrim,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    TerminalReceipts,
    UnitOfWork,
    verified_events,
)
from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._record_audit import BoundRecords
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._state import history_stream
from flowvault.application._streams import VOUCH_EVENT, keyed, read_stream, run_stream
from flowvault.application._vouch import inspect_unvouched, vouch_unit
from flowvault.application._workflow_records import stream_of
from flowvault.application.testing import FrozenClock, SequentialIds, make_event
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    WorkOrder,
)
from flowvault.domain._ledger import ChainDefect

KEY = bytes(range(11, 43))
STREAM = "host/legacy"


class World:
    """A store with the services over it, and the integrity key's holder."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.store = store
        self.clock = FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)
        services = workflow_services(self.repository, self.clock, SequentialIds("wf"))
        self.workflows = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results
        self.runs = graph_runs(self.repository, self.clock, SequentialIds("run"))
        self.definitions = DefinitionRegistry(self.repository, self.clock)
        self.receipts = TerminalReceipts(self.repository, self.repository)

    def legacy(self, count: int, *, stream: str = STREAM) -> list[LedgerEvent]:
        """Append ``count`` events without a chain MAC, as schema 2 wrote them."""
        events: list[LedgerEvent] = []
        previous = self.store.ledger_head(stream)
        for _ in range(count):
            index = 0 if previous is None else previous.index + 1
            previous = make_event(stream, index, previous, payload={"n": index})
            events.append(previous)
        self.store.commit(UnitOfWork(appends=events))
        return events

    def keyed(self, count: int, *, stream: str = STREAM) -> list[LedgerEvent]:
        """Append ``count`` keyed events, as every service writes them."""
        events: list[LedgerEvent] = []
        previous = self.store.ledger_head(stream)
        for _ in range(count):
            index = 0 if previous is None else previous.index + 1
            previous = keyed(make_event(stream, index, previous), self.repository)
            events.append(previous)
        self.store.commit(UnitOfWork(appends=events))
        return events

    def cut(self, stream: str, before_index: int) -> None:
        """Drop a prefix without a trim event, as host code did before trims were on record."""
        self.store.commit(UnitOfWork(trims=[LedgerTrim(stream, before_index)]))

    def vouch(self, stream: str = STREAM, head_hash: str | None = None) -> LedgerEvent:
        seen = inspect_unvouched(self.store, stream, self.repository)
        unit = vouch_unit(
            self.repository,
            seen,
            head_hash=seen.head_hash if head_hash is None else head_hash,
            occurred_at=self.clock.now(),
        )
        self.store.commit(unit)
        head = self.store.ledger_head(stream)
        assert head is not None
        return head

    def defect(self, stream: str = STREAM) -> str | None:
        """Return the keyed verifier's defect for ``stream``, ``None`` when it verifies."""
        try:
            verified_events(self.store, stream, self.repository)
        except IntegrityFailure as failure:
            found = failure.details.get("defect")
            return found if isinstance(found, str) else "integrity"
        return None

    def audit_ok(self) -> bool:
        bound = BoundRecords(self.repository, self.workflows, self.runs)
        return LedgerAudit(self.store, self.repository, bound).run().ok


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def _nothing_written(world: World, stream: str, call: Callable[[], object]) -> Exception:
    """Run ``call``, which must fail, and check the stream is as it was."""
    before = list(read_stream(world.store, stream))
    with pytest.raises((InvalidInput, IntegrityFailure, NotFound, RevisionConflict)) as caught:
        call()
    assert list(read_stream(world.store, stream)) == before
    return caught.value


# -- what can be vouched for -------------------------------------------------------


def test_a_stream_without_macs_verifies_once_vouched_for(world: World) -> None:
    """Legacy events fail as ``unkeyed``; one keyed vouch after them covers them all."""
    world.legacy(5)
    assert world.defect() == ChainDefect.UNKEYED.value
    assert not world.audit_ok()
    seen = inspect_unvouched(world.store, STREAM, world.repository)
    assert (seen.events, seen.first_index, seen.head_index) == (5, 0, 4)
    assert seen.without_mac
    assert not seen.cut_prefix
    head = world.vouch()
    assert (head.type, head.index, head.payload) == (VOUCH_EVENT, 5, {"events": 5})
    assert world.defect() is None
    assert world.audit_ok()


def test_a_prefix_cut_without_a_trim_event_verifies_once_vouched_for(world: World) -> None:
    """A keyed stream cut before trims were on record: the vouch names the cut."""
    events = world.keyed(6)
    world.cut(STREAM, 3)
    assert world.defect() == ChainDefect.TRUNCATED.value
    seen = inspect_unvouched(world.store, STREAM, world.repository)
    assert seen.cut_prefix
    assert not seen.without_mac
    assert (seen.first_index, seen.removed_hash) == (3, events[2].event_hash)
    head = world.vouch()
    assert head.payload == {"events": 3, "before_index": 3, "removed_hash": events[2].event_hash}
    assert world.defect() is None


def test_a_legacy_stream_that_was_also_cut_needs_one_vouch(world: World) -> None:
    """Both at once, as a schema 2 store a host trimmed: one event accounts for both."""
    world.legacy(6)
    world.cut(STREAM, 2)
    seen = inspect_unvouched(world.store, STREAM, world.repository)
    assert seen.without_mac
    assert seen.cut_prefix
    world.vouch()
    assert world.defect() is None


def test_a_later_cut_after_a_vouch_is_still_caught(world: World) -> None:
    """The vouch accepts exactly the prefix it names; cutting more is truncation again."""
    world.legacy(6)
    world.cut(STREAM, 2)
    world.vouch()
    world.cut(STREAM, 4)
    assert world.defect() == ChainDefect.TRUNCATED.value


def test_an_unkeyed_vouch_is_refused_like_any_unkeyed_event(world: World) -> None:
    """Someone without the key can write the event, not its MAC."""
    world.legacy(3)
    head = world.store.ledger_head(STREAM)
    forged = make_event(STREAM, 3, head, type=VOUCH_EVENT, payload={"events": 3})
    world.store.commit(UnitOfWork(appends=[forged]))
    assert world.defect() == ChainDefect.UNKEYED.value


# -- what is refused ------------------------------------------------------------------


def test_a_stream_that_verifies_has_nothing_to_vouch_for(world: World) -> None:
    """Vouching is for what the key cannot prove; a keyed stream needs no word."""
    world.keyed(3)
    failure = _nothing_written(world, STREAM, world.vouch)
    assert isinstance(failure, InvalidInput)
    assert "nothing to vouch for" in str(failure)


def test_a_stream_with_no_event_is_not_found(world: World) -> None:
    """There is nothing to compare, so nothing to vouch for."""
    with pytest.raises(NotFound):
        inspect_unvouched(world.store, "host/none", world.repository)


def test_a_mac_missing_after_a_keyed_event_is_never_vouched_for(world: World) -> None:
    """MACs are stripped, never lost: a keyed stream with an unkeyed tail is tampering."""
    world.keyed(3)
    world.legacy(2)
    failure = _nothing_written(world, STREAM, world.vouch)
    assert isinstance(failure, IntegrityFailure)
    assert failure.details["defect"] == ChainDefect.UNKEYED.value


def test_an_edited_legacy_event_is_never_vouched_for(world: World) -> None:
    """The plain chain must hold: a legacy event edited after it was hashed is refused."""
    first = make_event(STREAM, 0, None, payload={"n": 0})
    second = make_event(STREAM, 1, first, payload={"n": 1})
    edited = second.model_copy(update={"payload": {"n": "edited"}})
    world.store.commit(UnitOfWork(appends=[first, edited]))
    failure = _nothing_written(world, STREAM, world.vouch)
    assert isinstance(failure, IntegrityFailure)
    assert failure.details["defect"] == ChainDefect.EDITED.value


def test_a_head_other_than_the_compared_one_is_refused(world: World) -> None:
    """What is vouched for is what was compared: a different head hash writes nothing."""
    world.legacy(3)
    seen = inspect_unvouched(world.store, STREAM, world.repository)
    wrong = "sha256:" + "0" * 64
    failure = _nothing_written(
        world,
        STREAM,
        lambda: world.store.commit(
            vouch_unit(world.repository, seen, head_hash=wrong, occurred_at=world.clock.now())
        ),
    )
    assert isinstance(failure, InvalidInput)
    assert wrong not in str(failure)


def test_an_append_after_the_inspection_makes_the_vouch_conflict(world: World) -> None:
    """The vouch extends the head that was compared; a later write wins, nothing is vouched."""
    world.legacy(3)
    seen = inspect_unvouched(world.store, STREAM, world.repository)
    unit = vouch_unit(
        world.repository, seen, head_hash=seen.head_hash, occurred_at=world.clock.now()
    )
    world.legacy(1)
    failure = _nothing_written(world, STREAM, lambda: world.store.commit(unit))
    assert isinstance(failure, RevisionConflict)


# -- the records a vouched stream binds -------------------------------------------------


def test_a_vouched_workflow_stream_keeps_its_record_current(world: World) -> None:
    """A vouch names no state: the workflow reads, moves on and audits clean after it."""
    record, _ = world.workflows.create(WorkOrder(kind="k", requester="r", idempotency_key="i"))
    workflow_id = record.workflow_id
    for _ in range(3):
        current = world.workflows.get(workflow_id)
        world.workflow_events.append_event(
            workflow_id,
            "workflow.noted",
            expected_state=current.state,
            expected_version=current.state_version,
        )
    before = world.workflows.get(workflow_id)
    world.cut(stream_of(workflow_id), 2)
    with pytest.raises(IntegrityFailure):
        world.workflow_events.events(workflow_id)
    world.vouch(stream_of(workflow_id))
    assert world.workflows.get(workflow_id) == before
    assert world.workflow_events.events(workflow_id)[-1].type == VOUCH_EVENT
    current = world.workflows.get(workflow_id)
    world.workflows.transition(
        workflow_id,
        "planning",
        expected_state=current.state,
        expected_version=current.state_version,
    )
    assert world.audit_ok()


def test_a_vouched_scope_keeps_its_state_current(world: World) -> None:
    """A vouch after a state write leaves the row as it is, like a trim."""
    state = StateRepository(world.repository, "main")
    for step in range(3):
        state.update_with_events(
            lambda current, step=step: (
                current.model_copy(update={"step": step}),
                [HistoryEvent("state.stepped")],
            )
        )
    stream = history_stream("main")
    world.cut(stream, 2)
    world.vouch(stream)
    assert state.load().state.step == 2
    state.check_current()
    assert world.audit_ok()


def test_a_vouched_run_stream_keeps_its_run_and_a_purged_run_stays_gone(world: World) -> None:
    """A vouch is no ``run.*`` event and no tombstone: a run reads on, a purged one stays purged."""
    world.definitions.register_definition("graph", {"nodes": ["a"]})
    live, _ = world.runs.start_run("graph", {"t": 1})
    world.runs.append_run_events(live.run_id, [("node.done", {"n": 1})])
    world.cut(run_stream(live.run_id), 1)
    world.vouch(run_stream(live.run_id))
    assert world.runs.get_run(live.run_id).status == "accepted"
    gone, _ = world.runs.start_run("graph", {"t": 2})
    world.runs.finish_run(gone.run_id, "cancelled", expected_status="accepted", final_state=None)
    world.clock.advance(timedelta(days=2))
    assert (
        purge_finished_runs(world.repository, world.clock, world.clock.now(), timedelta(days=1))
        == 1
    )
    assert (
        world.store.peek_metadata(GRAPH_RUNS, world.repository.key_digest(GRAPH_RUNS, gone.run_id))
        is None
    )
    world.cut(run_stream(gone.run_id), 1)
    world.vouch(run_stream(gone.run_id))
    with pytest.raises(NotFound):
        world.runs.get_run(gone.run_id)
