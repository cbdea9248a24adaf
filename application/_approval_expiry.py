"""Approvals that pass their deadline: record the expiry, fail the runs left waiting.

An expiry is the same unit a decision commits (the approval settled, its
checkpoint consumed, events in both streams), so a late ``decide`` and the
expiry pass cannot both settle one approval.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from flowvault.application._approval_records import ApprovalRecords
from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._record_kinds import APPROVAL_TAG
from flowvault.application._records import MAX_LIST_LIMIT, LabelFilter
from flowvault.application._signing import signed
from flowvault.application._streams import next_position, run_stream
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import (
    Approval,
    ApprovalStatus,
    Checkpoint,
    InvalidTransition,
    NotFound,
    RevisionConflict,
)

AWAITING_APPROVAL: Final = "awaiting_approval"


@dataclass(frozen=True, slots=True)
class ExpiryReport:
    """What one expiry pass did."""

    expired_approvals: int
    failed_runs: int


class ApprovalExpiry:
    """Settle overdue approvals as expired and fail the runs no approval can resume."""

    def __init__(self, records: ApprovalRecords, key: KeyedDigester) -> None:
        self._records = records
        self._key = key
        self._store: SecureObjectStore = records.checkpoints.repository.store

    def expire(
        self,
        approval: Approval,
        revision: int,
        target: tuple[Checkpoint, int] | None,
        moment: datetime,
        position: tuple[int, str],
    ) -> bool:
        """Commit the expiry and the checkpoint's consumption; ``False`` when raced."""
        expired = signed(
            Approval,
            self._key,
            APPROVAL_TAG,
            {**approval.model_dump(), "status": ApprovalStatus.EXPIRED, "decided_at": moment},
        )
        consumed = None
        if target is not None:
            consumed = (self._records.checkpoints.consumed(target[0], moment), target[1])
        try:
            self._store.commit(
                self._records.outcome_unit(expired, revision, consumed, moment, position)
            )
        except RevisionConflict:
            return False
        return True

    def expire_overdue(self, moment: datetime) -> ExpiryReport:
        """Expire every approval pending past its deadline, then fail the stranded runs."""
        expired = 0
        pending = [LabelFilter("status", ApprovalStatus.PENDING.value)]
        for approval in list(self._records.listed(pending)):
            if approval.status_at(moment) is ApprovalStatus.EXPIRED:
                expired += self._expire_overdue(approval.approval_id, moment)
        failed = 0
        runs = self._records.checkpoints.runs
        if runs is not None:
            cursor: str | None = None
            waiting: list[str] = []
            while True:
                page = runs.list_runs(AWAITING_APPROVAL, cursor=cursor, limit=MAX_LIST_LIMIT)
                waiting += [run.run_id for run in page.items]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            failed = sum(self.fail_if_stranded(run_id) for run_id in waiting)
        return ExpiryReport(expired_approvals=expired, failed_runs=failed)

    def _expire_overdue(self, approval_id: str, moment: datetime) -> bool:
        """Commit one overdue approval's expiry; ``False`` if it settled or its run ended."""

        def attempt() -> bool | Literal[Lost.RACE]:
            found = self._records.find(approval_id)
            if found is None:
                return False
            approval, revision = found
            if approval.status_at(moment) is not ApprovalStatus.EXPIRED or (
                approval.status is not ApprovalStatus.PENDING
            ):
                return False
            position = next_position(self._store, run_stream(approval.run_id))
            try:
                self._records.checkpoints.require_live_run(approval.run_id)
            except (NotFound, InvalidTransition):
                return False
            target = self._records.pending_checkpoint(approval)
            if self.expire(approval, revision, target, moment, position):
                return True
            return LOST

        return settle(attempt, "approval", approval_id=approval_id)

    def fail_if_stranded(self, run_id: str) -> bool:
        """Fail a run awaiting approval whose newest approval expired and none is pending."""
        runs = self._records.checkpoints.runs
        if runs is None or not self._stranded(run_id):
            return False
        try:
            runs.set_status(
                run_id,
                "failed",
                expected_status=AWAITING_APPROVAL,
                payload={"reason": "approval_expired"},
            )
        except RevisionConflict:
            return False
        return True

    def _stranded(self, run_id: str) -> bool:
        runs = self._records.checkpoints.runs
        try:
            if runs is None or runs.get_run(run_id).status != AWAITING_APPROVAL:
                return False
        except NotFound:
            return False
        approvals = self._records.of_run(run_id)
        if not approvals or any(a.status is ApprovalStatus.PENDING for a in approvals):
            return False
        newest = max(approvals, key=lambda approval: approval.requested_at)
        return newest.status is ApprovalStatus.EXPIRED
