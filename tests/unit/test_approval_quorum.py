"""k-of-n approvals, signed decisions and expiry without a decide, on memory, SQLite and PostgreSQL.

Every test runs through a bootstrapped runtime, as a host uses the services.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from checkpoint_setup import create_checkpoint
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flowvault.application import SecureObjectStore
from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._record_kinds import APPROVALS, CHECKPOINTS
from flowvault.application._streams import run_stream
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    ApprovalAlreadyDecided,
    ApprovalDecisionNotAllowed,
    ApprovalExpired,
    ApprovalStatus,
    Checkpoint,
    CheckpointStatus,
    DecisionSignatureInvalid,
    FlowvaultError,
    GraphRun,
    InvalidInput,
    content_hash,
)

HOUR = timedelta(hours=1)
ANN, BEN, CAT, DAN = (f"decider-marker-{name}@example.org" for name in ("ann", "ben", "cat", "dan"))
BOARD = (ANN, BEN, CAT)


@pytest.fixture
def runtime(backend_store: SecureObjectStore, tmp_path: Path) -> Runtime:
    """Bootstrap a runtime over the parametrized backend's store, which its fixture closes."""
    return bootstrap(
        Settings(backend="memory", home=tmp_path / "home"),
        key=bytes(range(32)),
        store=backend_store,
        clock=FrozenClock(),
        ids=SequentialIds("quorum"),
    )


def paused(runtime: Runtime) -> tuple[GraphRun, Checkpoint]:
    """Start a run, checkpoint it while running, then leave it awaiting approval."""
    runs = runtime.runs
    runtime.definitions.register_definition("wire.send", {"nodes": ["draft", "approve", "send"]})
    run, _ = runs.start_run("wire.send", {"amount": 9000})
    runs.set_status(run.run_id, "running", expected_status="accepted")
    checkpoint = create_checkpoint(runtime.checkpoints, run.run_id, {"node": "send"}, {"d": 1})
    run = runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
    return run, checkpoint


def ask(
    runtime: Runtime,
    checkpoint: Checkpoint,
    *,
    required: int = 2,
    deciders: tuple[str, ...] | None = BOARD,
    rejection: str = "any",
    decisions: tuple[str, ...] = ("approve", "reject"),
    audience: str = "board",
    expires_in: timedelta = HOUR,
) -> str:
    """Request a quorum approval of ``checkpoint`` as it stands; return its id."""
    approval = runtime.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience=audience,
        prompt_digest=content_hash("Send 9,000 EUR?"),
        allowed_decisions=list(decisions),
        expires_at=runtime.clock.now() + expires_in,
        required=required,
        deciders=deciders,
        rejection=rejection,
    )
    return approval.approval_id


def written(runtime: Runtime, run_id: str) -> tuple[object, ...]:
    """Everything a refused call must leave exactly as it was."""
    store = runtime.store
    rows = [store.list(space, limit=200) for space in (CHECKPOINTS, APPROVALS, GRAPH_RUNS)]
    return (*rows, store.read_ledger(run_stream(run_id), limit=200))


# -- quorum --------------------------------------------------------------------------


def test_two_of_three_resumes_only_on_the_second_approval(runtime: Runtime) -> None:
    """The first approval is a vote; the second reaches the quorum and consumes the checkpoint."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint)
    first, still = runtime.approvals.decide(approval_id, "approve", ANN)
    assert first.status is ApprovalStatus.PENDING
    assert len(first.votes) == 1
    assert still.status is CheckpointStatus.PENDING
    assert runtime.checkpoints.load_checkpoint(checkpoint.checkpoint_id).status is (
        CheckpointStatus.PENDING
    )
    decided, resume_from = runtime.approvals.decide(approval_id, "approve", CAT)
    assert (decided.status, decided.decision) == (ApprovalStatus.DECIDED, "approve")
    assert resume_from.status is CheckpointStatus.CONSUMED
    events = runtime.store.read_ledger(run_stream(run.run_id), limit=200).events
    assert [e.type for e in events][-2:] == ["approval.voted", "approval.decided"]
    text = " ".join(e.model_dump_json() for e in events)
    assert "decider-marker" not in text
    receipt = runtime.approvals.approval_receipt(decided)
    assert receipt.required == 2
    assert receipt.votes is not None
    assert "decider-marker" not in receipt.model_dump_json()
    with pytest.raises(ApprovalAlreadyDecided):
        runtime.approvals.decide(approval_id, "approve", BEN)


def test_a_vote_retried_after_a_lost_reply_is_not_counted_twice(runtime: Runtime) -> None:
    """The same decider sending the same vote again gets the current result; it does not count."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint)
    first = runtime.approvals.decide(approval_id, "approve", ANN)
    before = written(runtime, run.run_id)
    assert runtime.approvals.decide(approval_id, "approve", ANN) == first
    assert written(runtime, run.run_id) == before
    with pytest.raises(ApprovalAlreadyDecided):
        runtime.approvals.decide(approval_id, "reject", ANN)
    assert written(runtime, run.run_id) == before
    decided, _ = runtime.approvals.decide(approval_id, "approve", BEN)
    assert runtime.approvals.decide(approval_id, "approve", ANN) == (
        decided,
        runtime.checkpoints.load_checkpoint(checkpoint.checkpoint_id),
    )


def test_a_decider_outside_the_audience_is_refused(runtime: Runtime) -> None:
    """Only named deciders vote: anyone else is refused and nothing is written."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint)
    before = written(runtime, run.run_id)
    with pytest.raises(ApprovalDecisionNotAllowed) as caught:
        runtime.approvals.decide(approval_id, "approve", DAN)
    assert "decider-marker" not in str(caught.value) + repr(caught.value)
    assert written(runtime, run.run_id) == before


@pytest.mark.parametrize(
    ("rejection", "votes", "outcome"),
    [
        ("any", [(ANN, "approve"), (BEN, "reject")], "reject"),
        ("quorum", [(ANN, "reject"), (BEN, "approve"), (CAT, "approve")], "approve"),
        ("quorum", [(ANN, "reject"), (BEN, "reject")], "reject"),
    ],
)
def test_rejection_rules(
    runtime: Runtime, rejection: str, votes: list[tuple[str, str]], outcome: str
) -> None:
    """Any rejection rejects under ``any``; under ``quorum`` it takes ``required`` of them."""
    _, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint, rejection=rejection)
    results = [runtime.approvals.decide(approval_id, d, who) for who, d in votes]
    assert [r[0].status for r in results[:-1]] == [ApprovalStatus.PENDING] * (len(votes) - 1)
    decided, consumed = results[-1]
    assert (decided.status, decided.decision) == (ApprovalStatus.DECIDED, outcome)
    assert consumed.status is CheckpointStatus.CONSUMED


def test_a_closed_audience_that_can_no_longer_approve_rejects(runtime: Runtime) -> None:
    """Three of four with two rejections under ``quorum``: approval is out of reach, so rejected."""
    _, checkpoint = paused(runtime)
    approval_id = ask(
        runtime, checkpoint, required=3, deciders=(ANN, BEN, CAT, DAN), rejection="quorum"
    )
    runtime.approvals.decide(approval_id, "reject", ANN)
    decided, _ = runtime.approvals.decide(approval_id, "reject", BEN)
    assert decided.decision == "reject"


def test_an_open_audience_counts_distinct_deciders(runtime: Runtime) -> None:
    """Without named deciders any distinct actors count, each once."""
    _, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint, required=2, deciders=None)
    runtime.approvals.decide(approval_id, "approve", DAN)
    runtime.approvals.decide(approval_id, "approve", DAN)
    assert runtime.approvals.get_approval(approval_id).status is ApprovalStatus.PENDING
    decided, _ = runtime.approvals.decide(approval_id, "approve", ANN)
    assert decided.status is ApprovalStatus.DECIDED


@pytest.mark.parametrize(
    "overrides",
    [
        {"required": 4},
        {"required": 0},
        {"decisions": ("approve", "hold")},
        {"deciders": (ANN, ANN)},
        {"rejection": "majority"},
        {"required": 1, "deciders": None, "rejection": "quorum"},
    ],
)
def test_malformed_quorum_requests_are_invalid_input(
    runtime: Runtime, overrides: dict[str, object]
) -> None:
    """An unmeetable quorum, other decisions, repeated deciders: INVALID_INPUT, nothing written."""
    run, checkpoint = paused(runtime)
    before = written(runtime, run.run_id)
    with pytest.raises(InvalidInput) as caught:
        ask(runtime, checkpoint, **overrides)  # type: ignore[arg-type]
    assert "decider-marker" not in str(caught.value) + repr(caught.value)
    assert written(runtime, run.run_id) == before


def test_racing_deciders_neither_exceed_nor_undercount_the_quorum(runtime: Runtime) -> None:
    """Five deciders at once on three of five: exactly three votes count, the others are refused."""
    _, checkpoint = paused(runtime)
    board = tuple(f"decider-marker-{n}@example.org" for n in range(5))
    approval_id = ask(runtime, checkpoint, required=3, deciders=board)
    barrier = threading.Barrier(len(board))
    outcomes: dict[str, object] = {}

    def vote(who: str) -> None:
        barrier.wait()
        try:
            outcomes[who] = runtime.approvals.decide(approval_id, "approve", who)[0].status
        except FlowvaultError as error:
            outcomes[who] = error.code

    threads = [threading.Thread(target=vote, args=(who,)) for who in board]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = runtime.approvals.get_approval(approval_id)
    assert final.status is ApprovalStatus.DECIDED
    assert len(final.votes) == 3
    counted = [
        v for v in outcomes.values() if v in (ApprovalStatus.PENDING, ApprovalStatus.DECIDED)
    ]
    assert len(counted) == 3
    assert (
        sorted(v for v in outcomes.values() if v not in counted) == ["APPROVAL_ALREADY_DECIDED"] * 2
    )
    assert runtime.checkpoints.load_checkpoint(checkpoint.checkpoint_id).status is (
        CheckpointStatus.CONSUMED
    )


def test_the_single_decider_flow_is_unchanged(runtime: Runtime) -> None:
    """Without a quorum one decision settles, with any allowed decision, and writes no votes."""
    _, checkpoint = paused(runtime)
    approval_id = ask(
        runtime, checkpoint, required=1, deciders=None, decisions=("approve", "hold", "reject")
    )
    decided, consumed = runtime.approvals.decide(approval_id, "hold", DAN)
    assert (decided.decision, decided.votes, decided.quorum) == ("hold", (), False)
    assert consumed.status is CheckpointStatus.CONSUMED
    assert (
        runtime.approvals.approval_receipt(decided).body().keys().isdisjoint({"required", "votes"})
    )


# -- signed decisions ----------------------------------------------------------------


def key_pair() -> tuple[Ed25519PrivateKey, bytes]:
    """Make a decider's key pair: the private key and the PEM public key to register."""
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def test_a_registered_decider_must_sign_and_the_signature_checks_offline(
    runtime: Runtime,
) -> None:
    """Unsigned or wrongly signed decisions are refused; the statement verifies by public key."""
    run, checkpoint = paused(runtime)
    ann_key, ann_public = key_pair()
    other_key, _ = key_pair()
    runtime.approvals.register_decider_key(ANN, ann_public)
    runtime.approvals.register_decider_key(ANN, ann_public)
    approval_id = ask(runtime, checkpoint)
    statement = runtime.approvals.decision_statement(approval_id, "approve")
    before = written(runtime, run.run_id)
    with pytest.raises(DecisionSignatureInvalid) as caught:
        runtime.approvals.decide(approval_id, "approve", ANN)
    assert caught.value.code == "DECISION_SIGNATURE_INVALID"
    for wrong in (other_key.sign(statement), ann_key.sign(statement + b" ")):
        with pytest.raises(DecisionSignatureInvalid):
            runtime.approvals.decide(approval_id, "approve", ANN, signature=wrong)
    reject_statement = runtime.approvals.decision_statement(approval_id, "reject")
    with pytest.raises(DecisionSignatureInvalid):
        runtime.approvals.decide(
            approval_id, "approve", ANN, signature=ann_key.sign(reject_statement)
        )
    assert written(runtime, run.run_id) == before
    voted, _ = runtime.approvals.decide(
        approval_id, "approve", ANN, signature=ann_key.sign(statement)
    )
    with pytest.raises(InvalidInput):
        runtime.approvals.decide(approval_id, "approve", BEN, signature=other_key.sign(statement))
    decided, _ = runtime.approvals.decide(approval_id, "approve", BEN)
    (signed,) = runtime.approvals.signed_decisions(decided)
    kept = json.loads(signed.to_json())
    assert json.loads(kept["statement"])["checkpoint_digest"] == checkpoint.integrity_digest
    assert "decider-marker" not in signed.to_json()
    ann_key.public_key().verify(bytes.fromhex(kept["signature"]), kept["statement"].encode())
    assert voted.votes[0].signature == kept["signature"]


def test_a_signature_is_bound_to_its_approval(runtime: Runtime) -> None:
    """A signature made for one approval does not count on another approval of the same decision."""
    _, checkpoint = paused(runtime)
    ann_key, ann_public = key_pair()
    runtime.approvals.register_decider_key(ANN, ann_public)
    first = ask(runtime, checkpoint, audience="board")
    second = ask(runtime, checkpoint, audience="risk")
    signature = ann_key.sign(runtime.approvals.decision_statement(first, "approve"))
    with pytest.raises(DecisionSignatureInvalid):
        runtime.approvals.decide(second, "approve", ANN, signature=signature)


def test_a_deleted_decider_key_is_refused_not_read_as_unsigned(runtime: Runtime) -> None:
    """Deleting a decider's key row outside flowvault does not let an unsigned decision pass."""
    from flowvault.application import Delete, Guard, UnitOfWork  # noqa: PLC0415
    from flowvault.application._decider_keys import DECIDER_KEYS  # noqa: PLC0415

    _, checkpoint = paused(runtime)
    _, ann_public = key_pair()
    runtime.approvals.register_decider_key(ANN, ann_public)
    approval_id = ask(runtime, checkpoint)
    (row,) = runtime.store.list(DECIDER_KEYS).items
    runtime.store.commit(UnitOfWork(deletes=[Delete(DECIDER_KEYS, row.key_digest, Guard.ANY)]))
    with pytest.raises(FlowvaultError) as caught:
        runtime.approvals.decide(approval_id, "approve", ANN)
    assert caught.value.code == "INTEGRITY_FAILURE"


def test_register_refuses_what_is_not_an_ed25519_public_key(runtime: Runtime) -> None:
    """A private key, garbage or another algorithm's key is INVALID_INPUT."""
    private, _ = key_pair()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for bad in (pem, b"not a key", b""):
        with pytest.raises(InvalidInput):
            runtime.approvals.register_decider_key(ANN, bad)


# -- expiry without a decide ---------------------------------------------------------


def test_an_overdue_approval_lists_as_expired_before_any_pass(runtime: Runtime) -> None:
    """Past its deadline a pending approval is listed as expired, not pending."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint, required=1, deciders=None)
    approvals = runtime.approvals
    pending = approvals.list_approvals(run.run_id, ApprovalStatus.PENDING).items
    assert [a.approval_id for a in pending] == [approval_id]
    assert isinstance(runtime.clock, FrozenClock)
    runtime.clock.advance(2 * HOUR)
    assert approvals.list_approvals(run.run_id, ApprovalStatus.PENDING).items == ()
    (listed,) = approvals.list_approvals(run.run_id, ApprovalStatus.EXPIRED).items
    (everywhere,) = approvals.list_approvals(status=ApprovalStatus.EXPIRED).items
    assert everywhere == listed
    assert listed.status_at(runtime.clock.now()) is ApprovalStatus.EXPIRED


def test_the_expiry_pass_records_expiry_and_fails_the_waiting_run(runtime: Runtime) -> None:
    """The pass expires the approval, consumes the checkpoint and moves the run to failed."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint, required=1, deciders=None)
    assert isinstance(runtime.clock, FrozenClock)
    assert runtime.approvals.expire_overdue().expired_approvals == 0
    runtime.clock.advance(2 * HOUR)
    report = runtime.approvals.expire_overdue()
    assert (report.expired_approvals, report.failed_runs) == (1, 1)
    assert runtime.approvals.get_approval(approval_id).status is ApprovalStatus.EXPIRED
    assert runtime.checkpoints.load_checkpoint(checkpoint.checkpoint_id).status is (
        CheckpointStatus.CONSUMED
    )
    assert runtime.runs.get_run(run.run_id).status == "failed"
    types = [e.type for e in runtime.store.read_ledger(run_stream(run.run_id), limit=200).events]
    assert types[-2:] == ["approval.expired", "run.failed"]
    again = runtime.approvals.expire_overdue()
    assert (again.expired_approvals, again.failed_runs) == (0, 0)


def test_a_late_decide_also_fails_the_run(runtime: Runtime) -> None:
    """APPROVAL_EXPIRED from decide leaves the run failed, not awaiting approval."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint, required=1, deciders=None)
    with pytest.raises(ApprovalExpired):
        runtime.approvals.decide(approval_id, "approve", ANN, now=runtime.clock.now() + 2 * HOUR)
    assert runtime.runs.get_run(run.run_id).status == "failed"


def test_the_pass_finishes_a_run_left_waiting_by_an_interrupted_pass(runtime: Runtime) -> None:
    """An expiry recorded without the run moved (a crash between) is finished by the next pass."""
    run, checkpoint = paused(runtime)
    approval_id = ask(runtime, checkpoint, required=1, deciders=None)
    assert isinstance(runtime.clock, FrozenClock)
    runtime.clock.advance(2 * HOUR)
    runs = runtime.runs
    runs.set_status(run.run_id, "running", expected_status="awaiting_approval")
    assert runtime.approvals.expire_overdue().failed_runs == 0
    runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
    assert runtime.approvals.get_approval(approval_id).status is ApprovalStatus.EXPIRED
    assert runtime.approvals.expire_overdue().failed_runs == 1
    assert runs.get_run(run.run_id).status == "failed"


def test_a_run_waiting_for_a_live_approval_is_left_alone(runtime: Runtime) -> None:
    """A run whose newest approval is pending and not overdue keeps waiting."""
    run, checkpoint = paused(runtime)
    ask(runtime, checkpoint, required=1, deciders=None, expires_in=3 * HOUR)
    assert isinstance(runtime.clock, FrozenClock)
    runtime.clock.advance(2 * HOUR)
    assert runtime.approvals.expire_overdue().failed_runs == 0
    assert runtime.runs.get_run(run.run_id).status == "awaiting_approval"


def test_retention_runs_the_expiry_pass(runtime: Runtime) -> None:
    """A retention run records overdue expiries and says how many runs it failed."""
    from flowvault.application import RetentionPolicy  # noqa: PLC0415

    run, checkpoint = paused(runtime)
    ask(runtime, checkpoint, required=1, deciders=None)
    assert isinstance(runtime.clock, FrozenClock)
    runtime.clock.advance(2 * HOUR)
    report = runtime.retention(RetentionPolicy()).run()
    assert (report.expired_approvals, report.failed_runs) == (1, 1)
    assert runtime.runs.get_run(run.run_id).status == "failed"
