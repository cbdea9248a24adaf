"""A store holding a little of everything the CLI shows: workflows, scopes, runs, approvals."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from checkpoint_setup import create_checkpoint, request_approval

from flowvault.application import HistoryEvent
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import WorkflowState, WorkOrder, content_hash


def _paused_run(runtime: Runtime, expires_in: timedelta) -> tuple[str, str]:
    """Start, checkpoint and pause a run; return (run id, approval id)."""
    runs = runtime.runs
    run, _ = runs.start_run("wire.send", {"amount": 9000})
    runs.set_status(run.run_id, "running", expected_status="accepted")
    checkpoint = create_checkpoint(runtime.checkpoints, run.run_id, {"n": 1}, {"s": 1})
    runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
    approval = request_approval(
        runtime.approvals, checkpoint, "board", runtime.clock.now() + expires_in
    )
    return run.run_id, approval.approval_id


def populate(
    home: Path | None, settings: Settings | None = None, key: bytes | None = None
) -> dict[str, str]:
    """Write workflows in two states, scopes, runs, a pending and an overdue approval.

    The overdue approval is requested at a frozen instant long past, due an
    hour later: past its deadline, yet still recorded pending. Returns the ids.
    """
    settings = settings or Settings(backend="sqlite", home=home)
    ids: dict[str, str] = {}
    with bootstrap(settings, clock=FrozenClock(), key=key, create=True) as runtime:
        runtime.definitions.register_definition("wire.send", {"nodes": ["send"]})
        ids["overdue_run"], ids["overdue_approval"] = _paused_run(runtime, timedelta(hours=1))
    with bootstrap(settings, key=key, create=True) as runtime:
        for scope in ("main", "other"):
            runtime.state(scope).update_with_events(
                lambda _: (WorkflowState(step=1), [HistoryEvent("state.stepped")])
            )
        created = []
        for number in range(3):
            order = WorkOrder(kind="demo", requester="alice", idempotency_key=f"wf-{number}")
            created.append(runtime.workflows.create(order)[0])
        first = created[0]
        runtime.workflows.transition(
            first.workflow_id,
            "planning",
            expected_state=first.state,
            expected_version=first.state_version,
        )
        ids["workflow"] = first.workflow_id
        runtime.action_results.put_action_result(
            first.workflow_id, content_hash("a"), {"r": 1}, retention=timedelta(hours=1)
        )
        run, _ = runtime.runs.start_run("wire.send", {"ticket": "T-1"})
        runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
        runtime.runs.finish_run(
            run.run_id, "completed", expected_status="running", final_state={"ok": True}
        )
        ids["run"] = run.run_id
        ids["pending_run"], ids["approval"] = _paused_run(runtime, timedelta(hours=2))
        runtime.idempotency.remember("req-1", {"op": "pay"}, {"status": "ok"})
    return ids
