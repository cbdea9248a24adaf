"""The retention job: every kind purged to its horizon, tombstoned, streams still verifying."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from graph_services import graph_runs
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    ApprovalService,
    CheckpointService,
    DefinitionRegistry,
    IdempotencyService,
    RetentionJob,
    RetentionPolicy,
    SealedRepository,
    SecureObjectStore,
    TerminalReceipts,
)
from flowvault.application._streams import read_stream, run_stream
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application._workflow_records import stream_of
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import WorkOrder, content_hash
from flowvault.domain._ledger import verify_chain


class Services:
    """Every retention-bearing service over one store and one frozen clock."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.store = store
        self.clock = FrozenClock()
        repo = SealedRepository(store, AesGcmCipher(bytes(range(32))), self.clock)
        services = workflow_services(repo, self.clock, SequentialIds("wf"))
        self.workflows = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results
        self.runs = graph_runs(repo, self.clock, SequentialIds("run"))
        self.definitions = DefinitionRegistry(repo, self.clock)
        self.receipts = TerminalReceipts(repo, repo)
        self.checkpoints = CheckpointService(repo, self.clock, integrity=repo)
        self.approvals = ApprovalService(
            repo, self.clock, SequentialIds("ap"), checkpoints=self.checkpoints, integrity=repo
        )
        self.idempotency = IdempotencyService(repo, self.clock)

    def job(self, policy: RetentionPolicy) -> RetentionJob:
        return RetentionJob(
            self.clock,
            policy,
            action_results=self.action_results,
            runs=self.runs,
            checkpoints=self.checkpoints,
            approvals=self.approvals,
            idempotency=self.idempotency,
        )

    def finished_run(self) -> str:
        run, _ = self.runs.start_run("graph.demo", {"ticket": "T-1"})
        self.runs.set_status(run.run_id, "running", expected_status="accepted")
        self.runs.finish_run(
            run.run_id, "completed", expected_status="running", final_state={"ok": True}
        )
        return run.run_id


def _verify(store: SecureObjectStore, stream: str) -> int:
    events = list(read_stream(store, stream))
    verify_chain(events).raise_for_defect()
    return sum(event.type == RETENTION_TOMBSTONE for event in events)


@pytest.fixture(params=["memory", "sqlite"])
def services(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Services]:
    """Provide the services on each backend."""
    if request.param == "memory":
        yield Services(InMemorySecureObjectStore())
        return
    with SQLiteSecureObjectStore.open(tmp_path / "data" / "store.db", create=True) as store:
        yield Services(store)


def test_job_purges_every_kind_past_its_horizon(services: Services) -> None:
    """One pass removes each expired kind once, leaves tombstones, and keeps runs by default."""
    s = services
    s.definitions.register_definition("graph.demo", {"nodes": ["plan", "approve", "act"]})
    run_id = s.finished_run()
    live, _ = s.runs.start_run("graph.demo", {"ticket": "T-2"})
    checkpoint = s.checkpoints.create_checkpoint(
        live.run_id,
        {"node": "approve"},
        state={"step": 2},
        budgets={"tokens": 100},
        counters={"nodes": 2},
        dependency_summary={"deps": []},
        terminal_cursor=None,
        event_cursor=1,
    )
    approval = s.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="finance-team",
        prompt_digest=content_hash("Pay invoice 17?"),
        allowed_decisions=["approve", "reject"],
        expires_at=s.clock.now() + timedelta(hours=1),
    )
    s.approvals.decide(approval.approval_id, "approve", "bob@example.org")
    s.idempotency.remember("req-1", {"op": "pay"}, {"status": "ok"})
    order = WorkOrder(kind="demo", requester="alice", idempotency_key="wf-1")
    workflow, _ = s.workflows.create(order)
    s.action_results.put_action_result(
        workflow.workflow_id, content_hash("a"), {"r": 1}, retention=timedelta(seconds=1)
    )

    s.clock.advance(timedelta(days=1))
    assert s.job(RetentionPolicy()).run().total == 1  # only the expired action result
    s.clock.advance(timedelta(days=365))
    report = s.job(RetentionPolicy()).run()
    assert (report.decided_approvals, report.consumed_checkpoints) == (1, 1)
    assert (report.idempotency_records, report.finished_runs) == (1, 0)
    assert s.runs.get_run(run_id).status == "completed"
    assert s.job(RetentionPolicy()).run().total == 0
    assert _verify(s.store, run_stream(live.run_id)) == 2
    assert _verify(s.store, stream_of(workflow.workflow_id)) == 0
    assert s.idempotency.recall("req-1", {"op": "pay"}) is None

    gone = s.job(RetentionPolicy(finished_runs=timedelta(days=30))).run()
    assert gone.finished_runs == 1
    assert _verify(s.store, run_stream(run_id)) == 1


def test_ten_thousand_finished_runs_purge_to_the_horizon() -> None:
    """Of 10,000 runs finished over 100 hours, exactly those older than 50 hours go."""
    s = Services(InMemorySecureObjectStore())
    s.definitions.register_definition("graph.demo", {"nodes": ["a"]})
    finished: list[tuple[str, int]] = []
    for hour in range(100):
        for _ in range(100):
            finished.append((s.finished_run(), hour))
        s.clock.advance(timedelta(hours=1))
    now = s.clock.now()
    report = s.job(RetentionPolicy(finished_runs=timedelta(hours=50), batch_size=200)).run(now)
    expected_gone = {run_id for run_id, hour in finished if hour < 50}
    assert report.finished_runs == len(expected_gone) == 5_000
    remaining: set[str] = set()
    cursor: str | None = None
    while True:
        page = s.runs.list_runs(cursor=cursor, limit=200)
        remaining |= {run.run_id for run in page.items}
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert remaining == {run_id for run_id, _ in finished} - expected_gone
    for run_id, _ in finished:
        tombstones = _verify(s.store, run_stream(run_id))
        assert tombstones == (1 if run_id in expected_gone else 0)
