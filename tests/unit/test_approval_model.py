"""The approval model as a state machine: quorums, rejections, expiry, retries, consume, resume.

Hypothesis drives the approval service (requests of k of n deciders under
either rejection rule, decisions by distinct and repeated deciders, the
clock moving past deadlines, expiry passes, resumes and consumes) against
a model written out plainly here, on memory and SQLite and, shorter, on
PostgreSQL. Every answer and every stored status must match the model.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from checkpoint_setup import create_checkpoint
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import SecureObjectStore
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import CheckpointConsumed, CheckpointStatus, FlowvaultError, content_hash

PEOPLE = ("ann", "ben", "cat", "dan")
BOARD = ("ann", "ben", "cat")
MINUTE = timedelta(minutes=1)


@dataclass
class ModelApproval:
    """What the model expects of one approval, its checkpoint and its run."""

    approval_id: str
    run_id: str
    checkpoint_id: str
    required: int
    closed: bool
    rejection: str
    expires_at: datetime
    status: str = "pending"
    decision: str | None = None
    decided_by: str | None = None
    votes: dict[str, str] = field(default_factory=dict)
    checkpoint: str = "pending"
    run: str = "awaiting_approval"

    @property
    def quorum(self) -> bool:
        return self.required > 1 or self.closed

    def tally(self) -> str | None:
        approvals = sum(d == "approve" for d in self.votes.values())
        rejections = len(self.votes) - approvals
        if self.rejection == "any" and rejections:
            return "reject"
        if approvals >= self.required:
            return "approve"
        if rejections >= self.required:
            return "reject"
        if self.closed and approvals + len(BOARD) - len(self.votes) < self.required:
            return "reject"
        return None

    def expire(self) -> None:
        self.status = "expired"
        self.checkpoint = "consumed"
        if self.run == "awaiting_approval":
            self.run = "failed"


def expected_decide(  # noqa: PLR0911 - one return per rule of the documented order
    a: ModelApproval, who: str, decision: str, now: datetime
) -> str:
    """Return the outcome the model expects (``ok`` or an error code), updating ``a``."""
    if a.status != "pending":
        cast = (
            a.votes.get(who) == decision
            if a.quorum
            else (a.decided_by, a.decision)
            == (
                who,
                decision,
            )
        )
        replay = a.status == "decided" and cast
        return "ok" if replay else "APPROVAL_ALREADY_DECIDED"
    if a.votes.get(who) == decision and now < a.expires_at and a.checkpoint == "pending":
        return "ok"
    if a.closed and who not in BOARD:
        return "APPROVAL_DECISION_NOT_ALLOWED"
    if who in a.votes and a.votes[who] != decision:
        return "APPROVAL_ALREADY_DECIDED"
    if a.run not in ("awaiting_approval", "running"):
        return "INVALID_TRANSITION"
    if now >= a.expires_at:
        a.expire()
        return "APPROVAL_EXPIRED"
    if a.checkpoint != "pending":
        return "CHECKPOINT_CONSUMED"
    if a.quorum:
        a.votes[who] = decision
        settled = a.tally()
    else:
        settled = decision
    if settled is not None:
        a.status, a.decision, a.decided_by, a.checkpoint = "decided", settled, who, "consumed"
    return "ok"


class ApprovalMachine(RuleBasedStateMachine):
    """Drive the approval service and hold it to ``ModelApproval``."""

    approvals = Bundle("approvals")

    def __init__(self, open_store: Callable[[], tuple[SecureObjectStore, Callable[[], None]]]):
        super().__init__()
        store, self._cleanup = open_store()
        self.clock = FrozenClock()
        self.home = Path(tempfile.mkdtemp(prefix="approval-model-"))
        self.runtime: Runtime = bootstrap(
            Settings(backend="memory", home=self.home / "home"),
            key=bytes(range(32)),
            store=store,
            clock=self.clock,
            ids=SequentialIds("model"),
        )
        self.runtime.definitions.register_definition("model.flow", {"nodes": ["a", "b"]})
        self.model: dict[str, ModelApproval] = {}

    def teardown(self) -> None:
        self.runtime.close()
        self._cleanup()
        shutil.rmtree(self.home, ignore_errors=True)

    @rule(
        target=approvals,
        required=st.integers(1, 3),
        closed=st.booleans(),
        rejection=st.sampled_from(["any", "quorum"]),
        minutes=st.integers(1, 90),
    )
    def request(self, required: int, closed: bool, rejection: str, minutes: int) -> str:
        if required == 1 and not closed:
            rejection = "any"
        runs = self.runtime.runs
        run, _ = runs.start_run("model.flow", {"n": len(self.model)})
        runs.set_status(run.run_id, "running", expected_status="accepted")
        checkpoint = create_checkpoint(self.runtime.checkpoints, run.run_id, {"at": 1}, {"s": 1})
        runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
        expires_at = self.clock.now() + minutes * MINUTE
        approval = self.runtime.approvals.request_approval(
            checkpoint.checkpoint_id,
            expected_state_digest=checkpoint.state_digest,
            expected_budgets=checkpoint.budgets,
            expected_counters=checkpoint.counters,
            expected_dependency_digest=checkpoint.dependency_digest,
            audience="board",
            prompt_digest=content_hash("go?"),
            allowed_decisions=["approve", "reject"],
            expires_at=expires_at,
            required=required,
            deciders=BOARD if closed else None,
            rejection=rejection,
        )
        self.model[approval.approval_id] = ModelApproval(
            approval.approval_id,
            run.run_id,
            checkpoint.checkpoint_id,
            required,
            closed,
            rejection,
            expires_at,
        )
        return approval.approval_id

    @rule(
        approval_id=approvals,
        who=st.sampled_from(PEOPLE),
        decision=st.sampled_from(["approve", "reject"]),
    )
    def decide(self, approval_id: str, who: str, decision: str) -> None:
        expected = expected_decide(self.model[approval_id], who, decision, self.clock.now())
        try:
            self.runtime.approvals.decide(approval_id, decision, who)
            outcome = "ok"
        except FlowvaultError as error:
            outcome = error.code
        assert outcome == expected

    @rule(approval_id=approvals, who=st.sampled_from(PEOPLE))
    def retry_after_lost_reply(self, approval_id: str, who: str) -> None:
        """Send a decision twice: the second answer must be the first one, with nothing written."""
        decision = self.model[approval_id].votes.get(who, "approve")
        try:
            first: object = self.runtime.approvals.decide(approval_id, decision, who)
        except FlowvaultError as error:
            first = error.code
        expected = expected_decide(self.model[approval_id], who, decision, self.clock.now())
        assert (first if isinstance(first, str) else "ok") == expected
        if expected != "ok":
            return
        store = self.runtime.store
        before = store.ledger_head(f"run/{self.model[approval_id].run_id}")
        assert self.runtime.approvals.decide(approval_id, decision, who) == first
        assert store.ledger_head(f"run/{self.model[approval_id].run_id}") == before

    @rule(minutes=st.integers(1, 60))
    def advance_clock(self, minutes: int) -> None:
        self.clock.advance(minutes * MINUTE)

    @rule()
    def expiry_pass(self) -> None:
        now = self.clock.now()
        expired = failed = 0
        for a in self.model.values():
            if a.status == "pending" and now >= a.expires_at and a.run != "failed":
                was = a.run
                a.expire()
                expired += 1
                failed += was != a.run
        report = self.runtime.approvals.expire_overdue()
        assert (report.expired_approvals, report.failed_runs) == (expired, failed)

    @rule(approval_id=approvals)
    def consume(self, approval_id: str) -> None:
        """Resume from the checkpoint directly (bypassing the approval): single use."""
        a = self.model[approval_id]
        try:
            self.runtime.checkpoints.consume_checkpoint(a.checkpoint_id)
            consumed = True
        except CheckpointConsumed:
            consumed = False
        assert consumed == (a.checkpoint == "pending")
        a.checkpoint = "consumed"

    @rule(approval_id=approvals)
    def resume(self, approval_id: str) -> None:
        """Resume the run once: awaiting_approval to running, whatever its approval says."""
        a = self.model[approval_id]
        try:
            self.runtime.runs.set_status(a.run_id, "running", expected_status="awaiting_approval")
            moved = True
        except FlowvaultError:
            moved = False
        assert moved == (a.run == "awaiting_approval")
        if moved:
            a.run = "running"

    @invariant()
    def stored_matches_model(self) -> None:
        now = self.clock.now()
        for a in self.model.values():
            approval = self.runtime.approvals.get_approval(a.approval_id)
            assert approval.status.value == a.status
            assert approval.decision == a.decision
            assert len(approval.votes) == len(a.votes)
            status_now = approval.status_at(now).value
            overdue = a.status == "pending" and now >= a.expires_at
            assert status_now == ("expired" if overdue else a.status)
            checkpoint = self.runtime.checkpoints.load_checkpoint(a.checkpoint_id)
            assert checkpoint.status is CheckpointStatus(a.checkpoint)
            assert self.runtime.runs.get_run(a.run_id).status == a.run


def _memory() -> tuple[SecureObjectStore, Callable[[], None]]:
    return InMemorySecureObjectStore(), lambda: None


def _sqlite() -> tuple[SecureObjectStore, Callable[[], None]]:
    folder = Path(tempfile.mkdtemp(prefix="approval-model-db-"))
    store = SQLiteSecureObjectStore.open(folder / "store.db", create=True)
    return store, lambda: shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(("opener", "examples"), [(_memory, 60), (_sqlite, 30)])
def test_approval_model(
    opener: Callable[[], tuple[SecureObjectStore, Callable[[], None]]], examples: int
) -> None:
    """0 divergences from the model on memory and SQLite."""
    run_state_machine_as_test(
        lambda: ApprovalMachine(opener),
        settings=settings(max_examples=examples, stateful_step_count=30, deadline=None),
    )


@pytest.mark.postgres
def test_approval_model_on_postgres(postgres_server: Any) -> None:
    """The same model, a shorter run, on PostgreSQL (a fresh schema per example)."""
    from flowvault.adapters.postgres import PostgresSecureObjectStore  # noqa: PLC0415

    server = postgres_server

    def opener() -> tuple[SecureObjectStore, Callable[[], None]]:
        schema = server.new_schema()
        store = PostgresSecureObjectStore.open(server.dsn, schema=schema, pool_size=1, create=True)
        return store, lambda: server.drop_schema(schema)

    run_state_machine_as_test(
        lambda: ApprovalMachine(opener),
        settings=settings(max_examples=10, stateful_step_count=20, deadline=None),
    )
