"""Model-based tests of the workflow service against a plain in-test model."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from hypothesis import event as note_event
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)
from workflow_services import WorkflowServices, workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import SealedRepository, WorkflowEventService
from flowvault.application._workflow_records import stream_of
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import (
    ApprovalAlreadyDecided,
    FlowvaultError,
    IdempotencyConflict,
    InvalidInput,
    InvalidTransition,
    NotFound,
    RevisionConflict,
    WorkOrder,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE
from flowvault.domain._workflow import DECISION_TYPES

ALL_STATES = sorted(DEFAULT_LIFECYCLE.states)
TARGETS = [*ALL_STATES, "no_such_state"]
TERMINAL = DEFAULT_LIFECYCLE.terminal
DECISION_STATE = "decision"
APPROVED = "decision.approved"
CREATED = "workflow.created"
TRANSITIONED = "workflow.transitioned"
PURGED = "action_result.purged"

HASHES = ["sha256:" + char * 64 for char in "abc"]
BAD_HASHES = ["sha256:" + "a" * 63, "md5:" + "a" * 32, ""]
RESULTS = [{"n": 1}, {"n": 2}, {"n": True}, ["x", "y"], "plain"]
RETENTIONS = [
    timedelta(seconds=1),
    timedelta(seconds=2),
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=30),
]
BAD_RETENTIONS = [
    timedelta(0),
    timedelta(milliseconds=999),
    timedelta(days=30, microseconds=1),
    timedelta(seconds=-1),
]
START_PATHS = [
    (),
    ("planning",),
    ("planning", "executing"),
    ("planning", "decision"),
    ("planning", "executing", "decision"),
]
ADVANCES = [
    timedelta(seconds=1),
    timedelta(seconds=2),
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=31),
]

IDEMPOTENCY_KEYS = ["idem-1", "idem-2", "idem-3"]
EVENT_KEYS = ["ev-1", "ev-2"]
ORDER_VARIANTS = [
    ("invoice.review", {"amount": 10, "iban": "DE00 1234"}, 0),
    ("invoice.review", {"amount": 11, "iban": "DE00 1234"}, 0),
    ("invoice.review", {"amount": 10, "iban": "DE00 1234"}, 5),
    ("email.send", {"to": "someone@example.org"}, 0),
]
BAD_EVENT_TYPE = "Not A Type"
EVENT_TYPES = ["note.added", "review.commented", *sorted(DECISION_TYPES), BAD_EVENT_TYPE]
_OMIT = object()


def _order(key: str, variant: int) -> WorkOrder:
    kind, parameters, priority = ORDER_VARIANTS[variant]
    return WorkOrder(
        kind=kind,
        parameters=parameters,
        requester="requester-1",
        idempotency_key=key,
        priority=priority,
    )


def _build_service() -> tuple[WorkflowServices, InMemorySecureObjectStore, FrozenClock]:
    clock = FrozenClock()
    store = InMemorySecureObjectStore()
    repository = SealedRepository(store, AesGcmCipher(bytes(32)), clock)
    return workflow_services(repository, clock, SequentialIds("wf")), store, clock


def _payload_is_valid(event_type: str, payload: dict[str, object]) -> bool:
    if event_type in DECISION_TYPES:
        action_hash = payload.get("action_hash")
        if not isinstance(action_hash, str) or not action_hash.startswith("sha256:"):
            return False
        if payload.get("approved") is not (event_type == APPROVED):
            return False
    if "decided_by" in payload:
        decider = payload["decided_by"]
        return isinstance(decider, str) and bool(decider)
    return True


@dataclass
class ModelWorkflow:
    """What the model expects of one workflow."""

    state: str
    version: int
    parameters: dict[str, object]
    scrubbed: bool = False
    events: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    purged: Counter[str] = field(default_factory=Counter)
    decided: dict[int, object] = field(default_factory=dict)
    """The action hash of each decision event, by its index."""

    def decided_in_this_visit(self, action_hash: object) -> bool:
        """Whether a decision on ``action_hash`` was made since the decision state was entered."""
        for index in range(len(self.events) - 1, -1, -1):
            _, from_state, to_state = self.events[index]
            if to_state is None:
                continue
            if (from_state, to_state) != (DECISION_STATE, DECISION_STATE):
                return False
            if self.decided.get(index, _OMIT) == action_hash:
                return True
        return False


@dataclass(frozen=True)
class ModelResult:
    """What the model expects of one stored action result."""

    result: object
    expires_at: datetime


@dataclass(frozen=True)
class ModelEvent:
    """What the model remembers of an event written under an event key."""

    event_type: str
    payload: dict[str, object]
    index: int


def _refusal(
    current: ModelWorkflow,
    event_type: str,
    payload: dict[str, object],
    expected: tuple[str, int],
) -> type[FlowvaultError] | None:
    """Return the error a valid, new event must get, in the service's order; ``None`` if none."""
    if expected != (current.state, current.version):
        return RevisionConflict
    if event_type in DECISION_TYPES and current.state != DECISION_STATE:
        return InvalidTransition
    if event_type == BAD_EVENT_TYPE:
        return InvalidInput
    if event_type in DECISION_TYPES and current.decided_in_this_visit(payload["action_hash"]):
        return ApprovalAlreadyDecided
    return None


class WorkflowModel(RuleBasedStateMachine):
    """Drive the workflow services and check them against plain dictionaries."""

    workflows = Bundle("workflows")

    def __init__(self) -> None:
        super().__init__()
        services, self.store, self.clock = _build_service()
        self.service = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results
        self.model: dict[str, ModelWorkflow] = {}
        self.idempotency: dict[str, tuple[int, str]] = {}
        self.event_keys: dict[tuple[str, str], ModelEvent] = {}
        self.results: dict[tuple[str, str], ModelResult] = {}
        self.result_keys: set[tuple[str, str]] = set()

    # -- helpers --------------------------------------------------------------

    def _snapshot(self) -> object:
        workflows = {
            workflow_id: (
                self.service.get(workflow_id),
                len(self.workflow_events.events(workflow_id, verify=False)),
            )
            for workflow_id in self.model
        }
        results = {
            key: self.action_results.get_action_result(*key) for key in sorted(self.result_keys)
        }
        return workflows, results, self.store.namespace_counts()

    def _refused(self, error: type[FlowvaultError], call: Callable[[], object]) -> None:
        before = self._snapshot()
        with pytest.raises(FlowvaultError) as caught:
            call()
        assert caught.type is error, caught.value
        note_event(f"refused: {error.__name__}")
        assert self._snapshot() == before

    def _expected(self, data: st.DataObject, current: ModelWorkflow) -> tuple[str, int]:
        if data.draw(st.sampled_from([True, True, True, True, False]), label="fresh"):
            return current.state, current.version
        state = data.draw(st.sampled_from(ALL_STATES), label="expected_state")
        version = data.draw(st.integers(1, current.version + 1), label="expected_version")
        return state, version

    # -- rules ----------------------------------------------------------------

    @initialize(
        target=workflows,
        variant=st.integers(0, len(ORDER_VARIANTS) - 1),
        path=st.sampled_from(START_PATHS),
        retention=st.sampled_from([None, *RETENTIONS[:2]]),
    )
    def first_workflow(
        self, variant: int, path: tuple[str, ...], retention: timedelta | None
    ) -> object:
        """Start with one workflow part-way along its lifecycle, maybe holding a result."""
        workflow_id = self.create(key=IDEMPOTENCY_KEYS[0], variant=variant)
        assert isinstance(workflow_id, str)
        for target in path:
            current = self.model[workflow_id]
            self.service.transition(
                workflow_id,
                target,
                expected_state=current.state,
                expected_version=current.version,
            )
            current.events.append((TRANSITIONED, current.state, target))
            current.state = target
            current.version += 1
        if retention is not None:
            self.action_results.put_action_result(
                workflow_id, HASHES[0], RESULTS[0], retention=retention
            )
            now = self.clock.now()
            self.results[(workflow_id, HASHES[0])] = ModelResult(RESULTS[0], now + retention)
            self.result_keys.add((workflow_id, HASHES[0]))
        return workflow_id

    @rule(
        target=workflows,
        key=st.sampled_from(IDEMPOTENCY_KEYS),
        variant=st.integers(0, len(ORDER_VARIANTS) - 1),
    )
    def create(self, key: str, variant: int) -> object:
        """Create a workflow, replay a reused key, or refuse it for another order."""
        order = _order(key, variant)
        known = self.idempotency.get(key)
        if known is not None and known[0] != variant:
            self._refused(IdempotencyConflict, lambda: self.service.create(order))
            return multiple()
        before = self._snapshot()
        record, created = self.service.create(order)
        if known is not None:
            assert not created
            assert record.workflow_id == known[1]
            assert self._snapshot() == before
            note_event("create replayed")
            return multiple()
        assert created
        assert record.workflow_id not in self.model
        assert (record.state, record.state_version) == ("intake", 1)
        assert record.work_order == order
        self.idempotency[key] = (variant, record.workflow_id)
        self.model[record.workflow_id] = ModelWorkflow(
            state="intake",
            version=1,
            parameters=dict(order.parameters),
            events=[(CREATED, None, "intake")],
        )
        return record.workflow_id

    @rule(workflow_id=workflows, data=st.data())
    def transition(self, workflow_id: str, data: st.DataObject) -> None:
        """Move a workflow, or refuse a stale expectation or a forbidden target."""
        current = self.model[workflow_id]
        legal = sorted(DEFAULT_LIFECYCLE.transitions.get(current.state, ()))
        live = [state for state in legal if state not in TERMINAL]
        bias = data.draw(st.sampled_from(["live", "live", "legal", "any"]), label="bias")
        pool = {"live": live, "legal": legal}.get(bias) or TARGETS
        target = data.draw(st.sampled_from(pool), label="target")
        expected_state, expected_version = self._expected(data, current)

        def call() -> object:
            return self.service.transition(
                workflow_id,
                target,
                expected_state=expected_state,
                expected_version=expected_version,
            )

        if (expected_state, expected_version) != (current.state, current.version):
            self._refused(RevisionConflict, call)
            return
        if not DEFAULT_LIFECYCLE.can_transition(current.state, target):
            self._refused(InvalidTransition, call)
            return
        record = call()
        note_event(f"transitioned to {'terminal' if target in TERMINAL else target}")
        current.events.append((TRANSITIONED, current.state, target))
        current.state = target
        current.version += 1
        current.scrubbed = current.scrubbed or target in TERMINAL
        assert record.state == target
        assert record.state_version == current.version

    @rule(workflow_id=workflows, event_type=st.sampled_from(sorted(DECISION_TYPES)))
    def transition_with_decision_type(self, workflow_id: str, event_type: str) -> None:
        """Refuse a transition that tries to pass itself off as a decision receipt."""
        current = self.model[workflow_id]
        legal = sorted(DEFAULT_LIFECYCLE.transitions.get(current.state, ())) or ["failed"]
        self._refused(
            InvalidInput,
            lambda: self.service.transition(
                workflow_id,
                legal[0],
                expected_state=current.state,
                expected_version=current.version,
                event_type=event_type,
            ),
        )

    def _draw_event(
        self, data: st.DataObject, workflow_id: str, event_key: str | None
    ) -> tuple[str, dict[str, object]]:
        known = None if event_key is None else self.event_keys.get((workflow_id, event_key))
        shape = data.draw(st.sampled_from(["reuse", "valid", "valid", "random"]), label="shape")
        if shape == "reuse" and known is not None:
            return known.event_type, dict(known.payload)
        event_type = data.draw(st.sampled_from(EVENT_TYPES), label="event_type")
        if shape != "random":
            payload: dict[str, object] = {
                "note": data.draw(st.sampled_from(["first", "second"]), label="note")
            }
            if event_type in DECISION_TYPES:
                payload["action_hash"] = data.draw(st.sampled_from(HASHES), label="hash")
                payload["approved"] = event_type == APPROVED
            if data.draw(st.booleans(), label="with_decider"):
                payload["decided_by"] = "alice"
            return event_type, payload
        fields = {
            "action_hash": data.draw(
                st.sampled_from([_OMIT, *HASHES, "md5:" + "a" * 32, 7]), label="hash"
            ),
            "approved": data.draw(st.sampled_from([_OMIT, True, False, "yes"]), label="approved"),
            "decided_by": data.draw(st.sampled_from([_OMIT, "alice", ""]), label="decided_by"),
            "note": data.draw(st.sampled_from([_OMIT, "first", "second"]), label="note"),
        }
        return event_type, {name: value for name, value in fields.items() if value is not _OMIT}

    @rule(workflow_id=workflows, event_key=st.sampled_from([None, *EVENT_KEYS]), data=st.data())
    def append_event(self, workflow_id: str, event_key: str | None, data: st.DataObject) -> None:
        """Append a same-state event or decision, replay its key, or refuse it."""
        current = self.model[workflow_id]
        event_type, payload = self._draw_event(data, workflow_id, event_key)
        expected_state, expected_version = self._expected(data, current)

        def call() -> tuple[object, object, bool]:
            return self.workflow_events.append_event(
                workflow_id,
                event_type,
                expected_state=expected_state,
                expected_version=expected_version,
                payload=payload,
                event_key=event_key,
            )

        known = None if event_key is None else self.event_keys.get((workflow_id, event_key))
        if not _payload_is_valid(event_type, payload):
            self._refused(InvalidInput, call)
            return
        if known is not None:
            same = (known.event_type, canonical_bytes(known.payload)) == (
                event_type,
                canonical_bytes(payload),
            )
            if not same:
                self._refused(IdempotencyConflict, call)
                return
            before = self._snapshot()
            record, event, created = call()
            assert not created
            assert (event.index, event.type) == (known.index, event_type)
            assert record == self.service.get(workflow_id)
            assert self._snapshot() == before
            note_event("event key replayed")
            return
        refusal = _refusal(current, event_type, payload, (expected_state, expected_version))
        if refusal is not None:
            self._refused(refusal, call)
            return
        record, event, created = call()
        assert created
        note_event(f"appended {'decision' if event_type in DECISION_TYPES else 'event'}")
        assert event.index == len(current.events)
        if event_type in DECISION_TYPES:
            receipt = self.workflow_events.decision_receipt(workflow_id, event)
            assert (receipt.action_hash, receipt.approved) == (
                payload["action_hash"],
                event_type == APPROVED,
            )
            assert receipt.event_hash == event.event_hash
            assert (receipt.decider is None) == ("decided_by" not in payload)
        if event_key is not None:
            self.event_keys[(workflow_id, event_key)] = ModelEvent(
                event_type, dict(payload), event.index
            )
        if event_type in DECISION_TYPES:
            current.decided[len(current.events)] = payload["action_hash"]
        current.events.append((event_type, current.state, current.state))
        current.version += 1
        assert (record.state, record.state_version) == (current.state, current.version)

    @rule(
        workflow_id=workflows,
        action_hash=st.sampled_from(HASHES + BAD_HASHES),
        retention=st.sampled_from(RETENTIONS + BAD_RETENTIONS),
        data=st.data(),
    )
    def put_action_result(
        self, workflow_id: str, action_hash: str, retention: timedelta, data: st.DataObject
    ) -> None:
        """Store a result, replay identical content, or refuse a conflict or bad input."""
        key = (workflow_id, action_hash)
        now = self.clock.now()
        existing = self.results.get(key)
        if existing is not None and data.draw(st.booleans(), label="reuse_result"):
            result = existing.result
        else:
            result = data.draw(st.sampled_from(RESULTS), label="result")

        def call() -> object:
            return self.action_results.put_action_result(
                workflow_id, action_hash, result, retention=retention
            )

        if action_hash in BAD_HASHES or retention in BAD_RETENTIONS:
            self._refused(InvalidInput, call)
            return
        content = canonical_bytes(result)
        if existing is not None and existing.expires_at > now:
            if canonical_bytes(existing.result) != content:
                self._refused(IdempotencyConflict, call)
                return
            before = self._snapshot()
            stored = call()
            assert stored.expires_at == existing.expires_at
            assert self._snapshot() == before
            note_event("action result replayed")
            return
        stored = call()
        note_event("action result stored")
        if existing is not None:
            owner = self.model[workflow_id]
            owner.events.append((PURGED, None, None))
            owner.purged[action_hash] += 1
        assert stored.expires_at == now + retention
        assert canonical_bytes(stored.result) == content
        self.results[key] = ModelResult(result=result, expires_at=now + retention)
        self.result_keys.add(key)

    @rule(delta=st.sampled_from(ADVANCES))
    def advance_clock(self, delta: timedelta) -> None:
        """Move the frozen clock forward."""
        self.clock.advance(delta)

    @rule(batch_size=st.sampled_from([1, 2, 100]))
    def purge_expired(self, batch_size: int) -> None:
        """Purge exactly the expired results, leaving one tombstone for each."""
        now = self.clock.now()
        expired = [key for key, held in self.results.items() if held.expires_at <= now]
        assert self.action_results.purge_expired(batch_size=batch_size) == len(expired)
        note_event(f"purged {min(len(expired), 3)}{'+' if len(expired) >= 3 else ''}")
        for workflow_id, action_hash in expired:
            del self.results[(workflow_id, action_hash)]
            owner = self.model[workflow_id]
            owner.events.append((PURGED, None, None))
            owner.purged[action_hash] += 1

    @rule()
    def unknown_workflow(self) -> None:
        """Refuse every operation on a workflow that does not exist."""
        self._refused(NotFound, lambda: self.service.get("wf-missing"))
        self._refused(NotFound, lambda: self.workflow_events.events("wf-missing"))
        self._refused(
            NotFound,
            lambda: self.service.transition(
                "wf-missing", "planning", expected_state="intake", expected_version=1
            ),
        )
        self._refused(
            NotFound,
            lambda: self.workflow_events.append_event(
                "wf-missing", "note.added", expected_state="intake", expected_version=1
            ),
        )
        self._refused(
            NotFound,
            lambda: self.action_results.put_action_result("wf-missing", HASHES[0], {"n": 1}),
        )

    # -- invariants -----------------------------------------------------------

    @invariant()
    def records_match_model(self) -> None:
        """Check every stored workflow record against its model entry."""
        for workflow_id, expected in self.model.items():
            record = self.service.get(workflow_id)
            assert record.workflow_id == workflow_id
            assert (record.state, record.state_version) == (expected.state, expected.version)
            assert expected.scrubbed == (expected.state in TERMINAL)
            parameters = record.work_order.parameters
            assert parameters == ({} if expected.scrubbed else expected.parameters)
            assert (parameters == {}) == (record.state in TERMINAL)

    @invariant()
    def ledgers_match_model(self) -> None:
        """Check every ledger verifies, is complete and agrees with its record."""
        for workflow_id, expected in self.model.items():
            events = self.workflow_events.events(workflow_id)
            assert [(e.type, e.from_state, e.to_state) for e in events] == expected.events
            assert [e.index for e in events] == list(range(len(events)))
            assert {e.stream for e in events} == {stream_of(workflow_id)}
            state = None
            versioned = 0
            purged: Counter[str] = Counter()
            for event in events:
                if event.type == PURGED:
                    assert isinstance(event.payload, dict)
                    assert "result" not in event.payload
                    assert "workflow_id" not in event.payload
                    purged[str(event.payload["action_hash"])] += 1
                    continue
                assert event.from_state == state
                if event.type in DECISION_TYPES:
                    assert isinstance(event.payload, dict)
                    assert event.payload["approved"] is (event.type == APPROVED)
                    assert str(event.payload["action_hash"]).startswith("sha256:")
                if event.type not in (CREATED, TRANSITIONED):
                    assert event.to_state == event.from_state
                assert event.payload is None or "decided_by" not in str(event.payload)
                state = event.to_state
                versioned += 1
            assert state == expected.state
            assert versioned == expected.version
            assert purged == expected.purged

    @invariant()
    def action_results_match_model(self) -> None:
        """Check result bodies come back exactly for unexpired model entries."""
        now = self.clock.now()
        for key in self.result_keys:
            held = self.results.get(key)
            found = self.action_results.get_action_result(*key)
            if held is None or held.expires_at <= now:
                assert found is None
            else:
                assert found is not None
                assert canonical_bytes(found.result) == canonical_bytes(held.result)
                assert found.expires_at == held.expires_at
        for workflow_id in self.model:
            listed = self.action_results.list_action_results(workflow_id)
            assert all(item.result is None for item in listed)
            live = {
                action_hash
                for (owner, action_hash), held in self.results.items()
                if owner == workflow_id and held.expires_at > now
            }
            assert sorted(item.action_hash for item in listed) == sorted(live)


WorkflowModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestWorkflowModel = WorkflowModel.TestCase


def _race(count: int, work: Callable[[], object]) -> list[object]:
    barrier = threading.Barrier(count)
    outcomes: list[object] = [None] * count

    def run(slot: int) -> None:
        barrier.wait()
        try:
            outcomes[slot] = work()
        except FlowvaultError as exc:
            outcomes[slot] = exc

    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def test_concurrent_create_and_transition_have_one_winner() -> None:
    """Let exactly one of eight racing creates and eight racing transitions win."""
    services, _, _ = _build_service()
    service = services.workflows
    order = _order("idem-race", 0)
    created = _race(8, lambda: service.create(order))
    assert all(isinstance(outcome, tuple) for outcome in created), created
    assert sum(1 for _, fresh in created if fresh) == 1
    workflow_ids = {record.workflow_id for record, _ in created}
    assert len(workflow_ids) == 1
    (workflow_id,) = workflow_ids

    moved = _race(
        8,
        lambda: service.transition(
            workflow_id, "planning", expected_state="intake", expected_version=1
        ),
    )
    winners = [outcome for outcome in moved if not isinstance(outcome, Exception)]
    losers = [outcome for outcome in moved if isinstance(outcome, Exception)]
    assert len(winners) == 1
    assert all(type(loser) is RevisionConflict for loser in losers), losers
    record = service.get(workflow_id)
    assert (record.state, record.state_version) == ("planning", 2)
    events = services.events.events(workflow_id)
    assert [(e.type, e.from_state, e.to_state) for e in events] == [
        (CREATED, None, "intake"),
        (TRANSITIONED, "intake", "planning"),
    ]


def _decision_workflow() -> tuple[WorkflowEventService, str]:
    services, _, _ = _build_service()
    service = services.workflows
    record, _ = service.create(_order("idem-decision", 0))
    workflow_id = record.workflow_id
    service.transition(workflow_id, "planning", expected_state="intake", expected_version=1)
    service.transition(workflow_id, "decision", expected_state="planning", expected_version=2)
    return services.events, workflow_id


def test_decision_with_malformed_action_hash_is_refused() -> None:
    """Refuse a decision whose action_hash is not a full sha256 digest."""
    service, workflow_id = _decision_workflow()
    with pytest.raises(InvalidInput):
        service.append_event(
            workflow_id,
            APPROVED,
            expected_state="decision",
            expected_version=3,
            payload={"action_hash": "sha256:not-a-digest", "approved": True},
        )


def test_event_key_reuse_with_true_then_one_conflicts() -> None:
    """Refuse an event key reused with a payload whose canonical JSON differs."""
    service, workflow_id = _decision_workflow()
    service.append_event(
        workflow_id,
        "note.added",
        expected_state="decision",
        expected_version=3,
        payload={"flag": True},
        event_key="ev-1",
    )
    with pytest.raises(IdempotencyConflict):
        service.append_event(
            workflow_id,
            "note.added",
            expected_state="decision",
            expected_version=4,
            payload={"flag": 1},
            event_key="ev-1",
        )
