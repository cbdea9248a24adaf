"""The retention job: one pass over every kind of record that stops mattering."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from flowvault.application._action_results import ActionResultService
from flowvault.application._approvals import ApprovalService
from flowvault.application._checkpoints import CheckpointService
from flowvault.application._record_kind import purge_horizon
from flowvault.application._request_idempotency import IdempotencyService
from flowvault.application._retention_policy import AGES, RetentionPolicy
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._run_service import RunService
from flowvault.application.ports import Clock

Purger = Callable[[datetime, timedelta, int], int]


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """How many records of each kind one pass deleted."""

    action_results: int = 0
    consumed_checkpoints: int = 0
    decided_approvals: int = 0
    idempotency_records: int = 0
    finished_runs: int = 0
    expired_approvals: int = 0
    """Overdue approvals whose expiry the pass recorded (not deletions)."""
    failed_runs: int = 0
    """Runs left awaiting an expired approval that the pass moved to ``failed``."""

    @property
    def total(self) -> int:
        """All deletions of the pass (expiries are not deletions)."""
        return (
            self.action_results
            + self.consumed_checkpoints
            + self.decided_approvals
            + self.idempotency_records
            + self.finished_runs
        )


class RetentionJob:
    """Applies a ``RetentionPolicy`` to every service, each in bounded, tombstoned batches.

    Approvals go before checkpoints, so an approval's checkpoint is never
    deleted while the approval still names it.
    """

    def __init__(
        self,
        clock: Clock,
        policy: RetentionPolicy,
        *,
        action_results: ActionResultService,
        runs: RunService,
        checkpoints: CheckpointService,
        approvals: ApprovalService,
        idempotency: IdempotencyService,
    ) -> None:
        self._clock = clock
        self._policy = policy
        self._action_results = action_results
        self._runs = runs
        self._checkpoints = checkpoints
        self._approvals = approvals
        self._idempotency = idempotency

    def run(self, now: datetime | None = None) -> RetentionReport:
        """Expire overdue approvals, then delete everything past its horizon at ``now``.

        ``now`` is the clock's time by default. The expiry pass is
        ``ApprovalService.expire_overdue``, so no run waits on a dead approval.

        Every horizon is computed before anything is deleted, so a ``now``
        that is naive, or too early to subtract an age from, is refused
        with nothing purged.
        """
        at = self._clock.now() if now is None else now
        policy, batch = self._policy, self._policy.batch_size
        for name in ("", *AGES):
            age = getattr(policy, name) if name else timedelta(0)
            if age is not None:
                purge_horizon(at, age)

        def purge(horizon: timedelta | None, purger: Purger) -> int:
            return 0 if horizon is None else purger(at, horizon, batch)

        expiry = self._approvals.expire_overdue(at)
        return RetentionReport(
            expired_approvals=expiry.expired_approvals,
            failed_runs=expiry.failed_runs,
            action_results=self._action_results.purge_expired(at, batch_size=batch),
            decided_approvals=purge(policy.decided_approvals, self._approvals.purge),
            consumed_checkpoints=purge(policy.consumed_checkpoints, self._checkpoints.purge),
            idempotency_records=purge(policy.idempotency_records, self._idempotency.purge),
            finished_runs=purge(policy.finished_runs, self._purge_finished_runs),
        )

    def _purge_finished_runs(self, now: datetime, older_than: timedelta, batch_size: int) -> int:
        return purge_finished_runs(self._runs.repository, self._clock, now, older_than, batch_size)
