"""The common human-approval flow in two calls, over the run, checkpoint and approval services.

Pausing a run for a decision takes a checkpoint, a request bound to it and
a status change; deciding takes the decision and, once approved, the move
back to ``running``. Each step is the service's own call, with its guards,
ledger events and receipts; this module only orders them, checks the
caller's input before the first write, and makes a retried call finish
what an interrupted one began instead of refusing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from pydantic import ConfigDict, Field

from flowvault.application._approvals import ApprovalService
from flowvault.application._checkpoints import CheckpointService
from flowvault.application._run_service import RunService
from flowvault.domain import (
    Approval,
    ApprovalStatus,
    Checkpoint,
    GraphRun,
    InvalidInput,
    JsonValue,
    content_hash,
)
from flowvault.domain._approvals import MAX_AUDIENCE, Decisions, PrintableText
from flowvault.domain._graph_runs import RUN_LIFECYCLE
from flowvault.domain._values import ValueModel

AWAITING_APPROVAL = "awaiting_approval"
RUNNING = "running"
APPROVE = "approve"
LONGEST_WAIT = timedelta(days=3650)


class _Request(ValueModel):
    """The caller's side of a request, checked with the domain's own field types before writing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    audience: PrintableText = Field(min_length=1, max_length=MAX_AUDIENCE)
    prompt: str
    allowed_decisions: Decisions


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    """What a decision left: the approval, its checkpoint and the run as they now are."""

    approval: Approval
    checkpoint: Checkpoint
    run: GraphRun

    @property
    def approved(self) -> bool:
        """Whether the approval is settled as ``approve`` (the run is then ``running`` again)."""
        return self.approval.status is ApprovalStatus.DECIDED and self.approval.decision == APPROVE

    @property
    def resume_from(self) -> Checkpoint | None:
        """The consumed checkpoint to resume from once approved; ``None`` otherwise."""
        return self.checkpoint if self.approved else None


class ApprovalFlow:
    """Pause a run for one human decision, then decide and resume it: two calls, not ten.

    ``runtime.approval_flow`` is one; the services it calls stay available
    for anything it does not cover (``docs/approvals.md``).
    """

    def __init__(
        self, runs: RunService, checkpoints: CheckpointService, approvals: ApprovalService
    ) -> None:
        self._runs = runs
        self._checkpoints = checkpoints
        self._approvals = approvals

    def pause_for_approval(
        self,
        run_id: str,
        next_cursor: JsonValue,
        *,
        audience: str,
        prompt: str,
        state: JsonValue = None,
        expires_in: timedelta = timedelta(days=1),
        allowed_decisions: Sequence[str] = (APPROVE, "reject"),
    ) -> Approval:
        """Checkpoint a running run at ``next_cursor``, ask ``audience``, and move it to wait.

        ``prompt`` is what the deciders are asked; only its digest is
        stored. The approval expires ``expires_in`` after the checkpoint
        was created, so calling again with the same arguments after an
        interruption returns the same approval and completes the pause.

        Raises:
            InvalidInput: a malformed argument, before anything is written.
            InvalidTransition: the run cannot wait for approval from its
                status (it has not started running, or has ended).
            NotFound: no such run.
            Any error of ``create_checkpoint``, ``request_approval`` and
            ``set_status``, which this calls in that order.

        """
        _Request(audience=audience, prompt=prompt, allowed_decisions=allowed_decisions)
        prompt_digest = content_hash(prompt)
        if not isinstance(expires_in, timedelta) or not timedelta(0) < expires_in <= LONGEST_WAIT:
            raise InvalidInput("expires_in must be a timedelta above zero and at most 3650 days")
        run = self._runs.get_run(run_id)
        if run.status != AWAITING_APPROVAL:
            RUN_LIFECYCLE.assert_transition(run.status, AWAITING_APPROVAL)
        checkpoint = self._checkpoints.create_checkpoint(
            run_id,
            next_cursor,
            state=state,
            budgets={},
            counters={},
            dependency_summary=None,
            terminal_cursor=None,
            event_cursor=0,
        )
        approval = self._approvals.request_approval(
            checkpoint.checkpoint_id,
            expected_state_digest=checkpoint.state_digest,
            expected_budgets=checkpoint.budgets,
            expected_counters=checkpoint.counters,
            expected_dependency_digest=checkpoint.dependency_digest,
            audience=audience,
            prompt_digest=prompt_digest,
            allowed_decisions=allowed_decisions,
            expires_at=checkpoint.created_at + expires_in,
        )
        if run.status != AWAITING_APPROVAL:
            self._runs.set_status(run_id, AWAITING_APPROVAL, expected_status=run.status)
        return approval

    def decide_and_resume(
        self, approval_id: str, decision: str, actor: str, *, signature: bytes | None = None
    ) -> ApprovalOutcome:
        """Record ``actor``'s decision; once it settles as ``approve``, move the run to ``running``.

        The returned outcome's ``resume_from`` is the consumed checkpoint
        (its ``next_cursor`` and ``state``) to continue from. A rejected run
        is left ``awaiting_approval`` for the host to end
        (``finish_run(..., "cancelled", expected_status="awaiting_approval")``);
        a quorum approval still collecting votes leaves everything as it is.
        The same call again (a retry after a lost reply) returns the same
        outcome and writes nothing new.

        Raises:
            Any error of ``decide`` (``APPROVAL_EXPIRED``,
            ``APPROVAL_ALREADY_DECIDED``, ...) and of ``set_status``.

        """
        approval, checkpoint = self._approvals.decide(
            approval_id, decision, actor, signature=signature
        )
        run = self._runs.get_run(approval.run_id)
        outcome = ApprovalOutcome(approval, checkpoint, run)
        if outcome.approved and run.status == AWAITING_APPROVAL:
            run = self._runs.set_status(run.run_id, RUNNING, expected_status=AWAITING_APPROVAL)
            outcome = ApprovalOutcome(approval, checkpoint, run)
        return outcome
