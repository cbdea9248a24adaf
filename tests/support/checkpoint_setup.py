"""A checkpoint and its approval request, set up alike wherever a test only needs them to exist."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from flowvault.application import ApprovalService, CheckpointService
from flowvault.composition import Runtime
from flowvault.domain import Approval, Checkpoint, GraphRun, JsonValue, content_hash


def create_checkpoint(
    checkpoints: CheckpointService, run_id: str, cursor: JsonValue, state: JsonValue
) -> Checkpoint:
    """Checkpoint ``run_id`` at ``cursor``; budgets, counters and dependencies are fixed."""
    return checkpoints.create_checkpoint(
        run_id,
        cursor,
        state=state,
        budgets={"tokens": 10},
        counters={"nodes": 1},
        dependency_summary={"tools": []},
        terminal_cursor=None,
        event_cursor=1,
    )


def request_approval(
    approvals: ApprovalService,
    checkpoint: Checkpoint,
    audience: str,
    expires_at: datetime,
    decisions: Sequence[str] = ("approve", "reject"),
) -> Approval:
    """Ask ``audience`` about ``checkpoint`` as it stands, so the request's guards all match."""
    return approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience=audience,
        prompt_digest=content_hash(f"prompt {audience}"),
        allowed_decisions=list(decisions),
        expires_at=expires_at,
    )


def checkpointed_run(runtime: Runtime, definition: str) -> tuple[GraphRun, Checkpoint]:
    """Start a run of a one-node ``definition``, mark it running and checkpoint it."""
    runs = runtime.runs
    runtime.definitions.register_definition(definition, {"nodes": ["a"]})
    run, _ = runs.start_run(definition, {"t": 1})
    runs.set_status(run.run_id, "running", expected_status="accepted")
    return run, create_checkpoint(runtime.checkpoints, run.run_id, {"node": 1}, {"s": 1})
