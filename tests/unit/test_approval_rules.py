"""Approvals under real use: tied to a live run, final decisions, decide retried after a lost reply.

Every test runs through a bootstrapped runtime on memory, SQLite and
PostgreSQL, as a host uses the services.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from checkpoint_setup import create_checkpoint, request_approval

from flowvault.application import SecureObjectStore
from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._record_kinds import APPROVAL_SLOTS, APPROVALS, CHECKPOINTS
from flowvault.application._streams import run_stream
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    ApprovalAlreadyDecided,
    ApprovalStatus,
    Checkpoint,
    CheckpointStatus,
    FlowvaultError,
    GraphRun,
    InvalidTransition,
    NotFound,
    WorkOrder,
    content_hash,
)

GHOST = "no-such-run"
APPROVE, REJECT = "approve", "reject"
DECIDER = "decider-marker-bob@example.org"
OTHER_DECIDER = "decider-marker-carol@example.org"
HOUR = timedelta(hours=1)


@pytest.fixture
def runtime(backend_store: SecureObjectStore, tmp_path: Path) -> Runtime:
    """Bootstrap a runtime over the parametrized backend's store, which its fixture closes."""
    return bootstrap(
        Settings(backend="memory", home=tmp_path / "home"),
        key=bytes(range(32)),
        store=backend_store,
        clock=FrozenClock(),
        ids=SequentialIds("rule"),
    )


def snapshot(runtime: Runtime, *run_ids: str, workflow_id: str | None = None) -> tuple[object, ...]:
    """Everything a refused call must leave exactly as it was."""
    store = runtime.store
    spaces = (CHECKPOINTS, APPROVALS, APPROVAL_SLOTS, GRAPH_RUNS, WORKFLOWS)
    streams = [run_stream(run_id) for run_id in run_ids]
    if workflow_id is not None:
        streams.append(stream_of(workflow_id))
    return tuple(store.list(space, limit=200) for space in spaces) + tuple(
        store.read_ledger(stream, limit=200) for stream in streams
    )


def started(runtime: Runtime, status: str = "running") -> GraphRun:
    """Start a run and move it to ``running`` (and on to ``status`` through ``running``)."""
    runs = runtime.runs
    runtime.definitions.register_definition("invoice.pay", {"nodes": ["draft", "approve", "pay"]})
    run, _ = runs.start_run("invoice.pay", {"invoice": "INV-17"})
    run = runs.set_status(run.run_id, "running", expected_status="accepted")
    if status != "running":
        run = runs.set_status(run.run_id, status, expected_status="running")
    return run


def paused(runtime: Runtime) -> tuple[GraphRun, Checkpoint]:
    """Start a run, checkpoint it while running, then leave it awaiting approval."""
    run = started(runtime)
    checkpoint = create_checkpoint(runtime.checkpoints, run.run_id, {"node": "pay"}, {"d": 1})
    run = runtime.runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
    return run, checkpoint


# -- 1. checkpoints and approvals need a live run -----------------------------------


def test_checkpoint_for_a_run_never_started_is_not_found_and_writes_nothing(
    runtime: Runtime,
) -> None:
    """A run id no run was started under gets NOT_FOUND with the fix, and no ghost stream."""
    before = snapshot(runtime, GHOST)
    with pytest.raises(NotFound) as caught:
        create_checkpoint(runtime.checkpoints, GHOST, {"node": "pay"}, {"d": 1})
    assert caught.value.code == "NOT_FOUND"
    assert "start_run" in caught.value.message
    assert snapshot(runtime, GHOST) == before
    assert runtime.store.ledger_head(run_stream(GHOST)) is None
    with pytest.raises(NotFound):
        runtime.runs.get_run(GHOST)


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_checkpoint_for_a_finished_run_is_refused(runtime: Runtime, ending: str) -> None:
    """A run that has ended takes no checkpoint: INVALID_TRANSITION naming its status."""
    run = started(runtime, ending)
    before = snapshot(runtime, run.run_id)
    with pytest.raises(InvalidTransition) as caught:
        create_checkpoint(runtime.checkpoints, run.run_id, {"node": "pay"}, {"d": 1})
    assert caught.value.code == "INVALID_TRANSITION"
    assert caught.value.details["current"] == ending
    assert snapshot(runtime, run.run_id) == before


def test_request_on_a_run_that_ended_is_refused(runtime: Runtime) -> None:
    """A pending checkpoint of a run that has since ended cannot be put to a human."""
    run, checkpoint = paused(runtime)
    runtime.runs.set_status(run.run_id, "cancelled", expected_status="awaiting_approval")
    before = snapshot(runtime, run.run_id)
    with pytest.raises(InvalidTransition):
        request_approval(runtime.approvals, checkpoint, "finance", runtime.clock.now() + HOUR)
    assert snapshot(runtime, run.run_id) == before


@pytest.mark.parametrize("late", [False, True])
def test_decide_on_a_run_that_ended_is_refused(runtime: Runtime, late: bool) -> None:
    """Neither a decision nor, past the deadline, an expiry is recorded for an ended run."""
    run, checkpoint = paused(runtime)
    approval = request_approval(
        runtime.approvals, checkpoint, "finance", runtime.clock.now() + HOUR
    )
    runtime.runs.set_status(run.run_id, "cancelled", expected_status="awaiting_approval")
    before = snapshot(runtime, run.run_id)
    moment = runtime.clock.now() + (2 * HOUR if late else timedelta(0))
    with pytest.raises(InvalidTransition):
        runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER, now=moment)
    assert snapshot(runtime, run.run_id) == before
    assert runtime.approvals.get_approval(approval.approval_id).status is ApprovalStatus.PENDING
    loaded = runtime.checkpoints.load_checkpoint(checkpoint.checkpoint_id)
    assert loaded.status is CheckpointStatus.PENDING


def test_the_live_run_flow_still_works(runtime: Runtime) -> None:
    """Checkpoint, request and decide on a live run go through as before."""
    run, checkpoint = paused(runtime)
    approval = request_approval(
        runtime.approvals, checkpoint, "finance", runtime.clock.now() + HOUR
    )
    decided, resume_from = runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER)
    assert decided.status is ApprovalStatus.DECIDED
    assert resume_from.status is CheckpointStatus.CONSUMED
    assert runtime.runs.get_run(run.run_id).status == "awaiting_approval"


# -- 2. a workflow's decision on an action is final in its decision state -----------


def _in_decision(runtime: Runtime) -> str:
    order = WorkOrder(
        kind="invoice.payment",
        parameters={"invoice": "INV-17"},
        requester="alice@example.org",
        idempotency_key="payment-INV-17",
    )
    record, _ = runtime.workflows.create(order)
    wf = record.workflow_id
    runtime.workflows.transition(wf, "planning", expected_state="intake", expected_version=1)
    runtime.workflows.transition(wf, "decision", expected_state="planning", expected_version=2)
    return wf


def _decision(
    runtime: Runtime, wf: str, *, approved: bool, decider: str, version: int, key: str, action: str
) -> tuple[object, ...]:
    return runtime.workflow_events.append_event(
        wf,
        "decision.approved" if approved else "decision.rejected",
        expected_state="decision",
        expected_version=version,
        payload={"action_hash": action, "approved": approved, "decided_by": decider},
        event_key=key,
    )


def test_a_contradicting_decision_is_refused_and_a_retry_replays(runtime: Runtime) -> None:
    """Approved by one decider, the same action cannot be rejected by another; a retry replays."""
    wf = _in_decision(runtime)
    action = content_hash({"pay": "INV-17"})
    first = _decision(
        runtime, wf, approved=True, decider=DECIDER, version=3, key="bob-approves", action=action
    )
    assert first[2] is True
    before = snapshot(runtime, workflow_id=wf)
    for approved, decider, key in [
        (False, OTHER_DECIDER, "carol-rejects"),
        (True, OTHER_DECIDER, "carol-approves"),
        (True, DECIDER, "bob-again"),
    ]:
        with pytest.raises(ApprovalAlreadyDecided) as caught:
            _decision(
                runtime, wf, approved=approved, decider=decider, version=4, key=key, action=action
            )
        assert caught.value.code == "APPROVAL_ALREADY_DECIDED"
        assert caught.value.details["ledger_index"] == first[1].index  # type: ignore[attr-defined]
        assert DECIDER not in str(caught.value)
        assert OTHER_DECIDER not in str(caught.value)
        assert snapshot(runtime, workflow_id=wf) == before
    replayed = _decision(
        runtime, wf, approved=True, decider=DECIDER, version=3, key="bob-approves", action=action
    )
    assert replayed == (runtime.workflows.get(wf), first[1], False)
    decisions = [e for e in runtime.workflow_events.events(wf) if e.type.startswith("decision.")]
    assert [e.type for e in decisions] == ["decision.approved"]


def test_decisions_are_final_per_action_and_per_visit_of_the_decision_state(
    runtime: Runtime,
) -> None:
    """Another action can be decided in the same visit; the same one again only after leaving."""
    wf = _in_decision(runtime)
    action, other = content_hash({"pay": "INV-17"}), content_hash({"pay": "INV-18"})
    _decision(runtime, wf, approved=True, decider=DECIDER, version=3, key="a", action=action)
    _decision(runtime, wf, approved=False, decider=OTHER_DECIDER, version=4, key="b", action=other)
    with pytest.raises(ApprovalAlreadyDecided):
        _decision(
            runtime, wf, approved=False, decider=OTHER_DECIDER, version=5, key="c", action=action
        )
    runtime.workflows.transition(wf, "executing", expected_state="decision", expected_version=5)
    runtime.workflows.transition(wf, "decision", expected_state="executing", expected_version=6)
    _, event, created = _decision(
        runtime, wf, approved=False, decider=OTHER_DECIDER, version=7, key="d", action=action
    )  # type: ignore[misc]
    assert created is True
    assert event.type == "decision.rejected"  # type: ignore[attr-defined]


def test_racing_contradicting_decisions_record_one(runtime: Runtime) -> None:
    """Eight deciders racing on one action at one version: exactly one decision is recorded."""
    wf = _in_decision(runtime)
    action = content_hash({"pay": "INV-17"})
    barrier = threading.Barrier(8)
    outcomes: list[object] = []
    lock = threading.Lock()

    def worker(number: int) -> None:
        barrier.wait()
        try:
            outcome: object = _decision(
                runtime,
                wf,
                approved=number % 2 == 0,
                decider=f"decider-{number}",
                version=3,
                key=f"k{number}",
                action=action,
            )
        except FlowvaultError as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sum(isinstance(o, tuple) for o in outcomes) == 1
    losers = [type(o).__name__ for o in outcomes if not isinstance(o, tuple)]
    assert losers == ["RevisionConflict"] * 7
    decisions = [e for e in runtime.workflow_events.events(wf) if e.type.startswith("decision.")]
    assert len(decisions) == 1
    with pytest.raises(ApprovalAlreadyDecided):
        _decision(runtime, wf, approved=True, decider="late", version=4, key="late", action=action)


# -- 4. decide is idempotent for the same decider and decision ----------------------


def test_decide_retried_after_a_lost_reply_returns_the_first_result(runtime: Runtime) -> None:
    """The same decider and decision again gets the first result and writes nothing."""
    run, checkpoint = paused(runtime)
    approval = request_approval(
        runtime.approvals, checkpoint, "finance", runtime.clock.now() + HOUR
    )
    first = runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER)
    before = snapshot(runtime, run.run_id)
    later = runtime.clock.now() + timedelta(minutes=5)
    assert runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER) == first
    assert runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER, now=later) == first
    assert snapshot(runtime, run.run_id) == before
    for decision, actor in [(REJECT, DECIDER), (APPROVE, OTHER_DECIDER), (REJECT, OTHER_DECIDER)]:
        with pytest.raises(ApprovalAlreadyDecided) as caught:
            runtime.approvals.decide(approval.approval_id, decision, actor)
        assert DECIDER not in str(caught.value)
        assert OTHER_DECIDER not in str(caught.value)
        assert snapshot(runtime, run.run_id) == before
    events = runtime.runs.read_run_events(run.run_id).events
    assert sum(event.type == "approval.decided" for event in events) == 1


def test_decide_retry_still_replays_after_the_run_finished(runtime: Runtime) -> None:
    """A retry arriving after the run resumed and finished still gets the first result."""
    run, checkpoint = paused(runtime)
    approval = request_approval(
        runtime.approvals, checkpoint, "finance", runtime.clock.now() + HOUR
    )
    first = runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER)
    runtime.runs.set_status(run.run_id, "running", expected_status="awaiting_approval")
    runtime.runs.finish_run(
        run.run_id, "completed", expected_status="running", final_state={"paid": True}
    )
    before = snapshot(runtime, run.run_id)
    assert runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER) == first
    assert snapshot(runtime, run.run_id) == before
    with pytest.raises(ApprovalAlreadyDecided):
        runtime.approvals.decide(approval.approval_id, REJECT, DECIDER)


def test_one_decider_racing_itself_gets_one_result_everywhere(runtime: Runtime) -> None:
    """Eight copies of one decide on eight threads: every one returns the same decision."""
    run, checkpoint = paused(runtime)
    approval = request_approval(
        runtime.approvals, checkpoint, "finance", runtime.clock.now() + HOUR
    )
    barrier = threading.Barrier(8)
    outcomes: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            outcome: object = runtime.approvals.decide(approval.approval_id, APPROVE, DECIDER)
        except FlowvaultError as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outcomes) == 8
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    assert isinstance(outcomes[0], tuple)
    events = runtime.runs.read_run_events(run.run_id).events
    assert sum(event.type == "approval.decided" for event in events) == 1
