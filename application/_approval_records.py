"""An approval's sealed row, its request slot and the checkpoint stream they are bound to.

Every write of an approval appends an event to its checkpoint's record
stream and binds the row to it, so an older approval, slot or checkpoint
put back is refused. The approval service and the expiry pass both read
approvals and commit their outcomes through this one class.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator, Sequence
from datetime import datetime

from flowvault.application._approval_receipts import approval_receipt
from flowvault.application._checkpoint_records import CheckpointRecords
from flowvault.application._freshness import (
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
)
from flowvault.application._instants import micros
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._natural_keys import joined
from flowvault.application._record_kind import Doomed, list_all, open_listed
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVAL_TAG,
    APPROVALS,
    CHECKPOINTS,
    checkpoint_stream,
)
from flowvault.application._records import (
    Delete,
    Guard,
    LabelFilter,
    LabelValue,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application._runs import RUNS
from flowvault.application._sealed import SealedDocument
from flowvault.application._signing import integrity_digest
from flowvault.application._streams import keyed, run_stream
from flowvault.application.ports import Clock
from flowvault.domain import (
    Approval,
    ApprovalStatus,
    Checkpoint,
    CheckpointIntegrityFailure,
    CheckpointStatus,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
)
from flowvault.domain._envelope import format_instant


def outcome_name(approval: Approval) -> str:
    """Name what a decision's unit did: ``voted`` while a quorum still waits, else the status."""
    return "voted" if approval.status is ApprovalStatus.PENDING else approval.status.value


class ApprovalRecords:
    """Find, verify and seal approvals; build the unit that records a decision or an expiry.

    Checkpoints are read and consumed only through ``checkpoints``, the
    checkpoint service's own record book.
    """

    def __init__(self, checkpoints: CheckpointRecords, clock: Clock, key: KeyedDigester) -> None:
        self._checkpoints = checkpoints
        self._clock = clock
        self._repo = checkpoints.repository
        self._store = self._repo.store
        self._key = key
        self._fresh = StreamPolicy[SealedDocument](
            "approval", self._repo, leaves_record=leaves_unnamed
        )
        self._fresh_slot = StreamPolicy[SealedDocument](
            "approval slot", self._repo, leaves_record=leaves_unnamed
        )

    @property
    def checkpoints(self) -> CheckpointRecords:
        """The checkpoint records approvals consume."""
        return self._checkpoints

    def require(self, approval_id: str) -> tuple[Approval, int]:
        """Return the verified approval and its revision; ``NotFound`` when absent."""
        found = self.find(approval_id)
        if found is None:
            raise NotFound("no such approval", approval_id=approval_id)
        return found

    def find(self, approval_id: str) -> tuple[Approval, int] | None:
        """Return the verified approval and its revision, or ``None`` when absent."""
        if not isinstance(approval_id, str) or not approval_id:
            raise InvalidInput("an approval id must be a non-empty string")
        opened = self._repo.read(APPROVALS, approval_id)
        if opened is None:
            return None
        return self._checked(opened, approval_id)

    def open_listed(self, metadata: RecordMetadata) -> tuple[Approval, int] | None:
        """Open and verify a listed row; ``None`` when it was deleted after it was listed."""
        opened = open_listed(self._repo, metadata)
        return None if opened is None else self._checked(opened)

    def listed(self, filters: Sequence[LabelFilter]) -> Iterator[Approval]:
        """Yield every verified approval matching ``filters``, skipping rows deleted meanwhile."""
        for metadata in list_all(self._store, APPROVALS, filters):
            checked = self.open_listed(metadata)
            if checked is not None:
                yield checked[0]

    def of_run(self, run_id: str) -> list[Approval]:
        """Return every approval requested in run ``run_id``."""
        filters = [LabelFilter("run", self._repo.key_digest(RUNS, run_id))]
        return [a for a in self.listed(filters) if a.run_id == run_id]

    def in_slot(self, checkpoint_id: str, audience: str) -> Approval | None:
        """Return the approval a request slot names; a slot its stream vouches for must exist."""
        natural = joined(checkpoint_id, audience)
        marker = self._fresh_slot.read_vouched(
            self._store,
            checkpoint_stream(self._repo, checkpoint_id),
            (APPROVAL_SLOTS, self._repo.key_digest(APPROVAL_SLOTS, natural)),
            lambda: self._repo.read(APPROVAL_SLOTS, natural),
        )
        if marker is None:
            return None
        document = marker.document
        approval_id = document.get("approval_id") if isinstance(document, dict) else None
        if not isinstance(approval_id, str):
            raise IntegrityFailure("approval slot has an unexpected shape")
        found = self.find(approval_id)
        if found is None:
            raise IntegrityFailure("approval slot names a missing approval")
        return found[0]

    def request_unit(self, approval: Approval) -> UnitOfWork:
        """Build the unit that records a new request: the approval, its slot, their event."""
        slot_key = joined(approval.checkpoint_id, approval.audience)
        event = record_event(
            self._repo,
            checkpoint_stream(self._repo, approval.checkpoint_id),
            "approval.requested",
            record_payload(
                self._repo.key_digest(APPROVALS, approval.approval_id),
                self._repo.key_digest(APPROVAL_SLOTS, slot_key),
            ),
            approval.requested_at,
        )
        slot = self._repo.prepare(
            APPROVAL_SLOTS,
            slot_key,
            {"approval_id": approval.approval_id},
            expected=Guard.ABSENT,
            ledger_index=event.index,
        )
        return UnitOfWork(
            upserts=[self._upsert(approval, Guard.ABSENT, event.index), slot], appends=[event]
        )

    def pending_checkpoint(self, approval: Approval) -> tuple[Checkpoint, int] | None:
        """Return the approval's checkpoint while it is pending; ``None`` once used or purged."""
        found = self._checkpoints.find(approval.checkpoint_id)
        if found is None or found[0].status is not CheckpointStatus.PENDING:
            return None
        if not hmac.compare_digest(found[0].integrity_digest, approval.checkpoint_digest):
            raise CheckpointIntegrityFailure(
                "checkpoint differs from the one the approval was requested for",
                checkpoint_id=approval.checkpoint_id,
            )
        return found

    def outcome_unit(
        self,
        outcome: Approval,
        revision: int,
        consumed: tuple[Checkpoint, int] | None,
        moment: datetime,
        position: tuple[int, str],
    ) -> UnitOfWork:
        """Build the unit that records a vote, decision or expiry.

        ``consumed`` is the checkpoint a settled approval consumes, with the
        revision it replaces. The run's stream receives the receipt's
        digests at ``position``: its head as read before the run was
        checked, so a run that ends in between makes this append conflict
        rather than land after the run's end.
        """
        written = [self._repo.key_digest(APPROVALS, outcome.approval_id)]
        if consumed is not None:
            written.append(self._repo.key_digest(CHECKPOINTS, outcome.checkpoint_id))
        bound = record_event(
            self._repo,
            checkpoint_stream(self._repo, outcome.checkpoint_id),
            f"checkpoint.approval_{outcome_name(outcome)}",
            record_payload(*written),
            moment,
        )
        upserts = [self._upsert(outcome, revision, bound.index)]
        if consumed is not None:
            upserts.append(self._checkpoints.upsert(*consumed, bound.index))
        appends = [bound, self._run_event(outcome, moment, position)]
        return UnitOfWork(upserts=upserts, appends=appends)

    def _run_event(
        self, approval: Approval, moment: datetime, position: tuple[int, str]
    ) -> LedgerEvent:
        """Build the run's ledger entry for an outcome, so the run shows who decided what.

        It holds the receipt's keyed digests only, and stays after
        retention removes the approval record.
        """
        index, previous = position
        receipt = approval_receipt(self._key, self._repo, approval, self._clock.now())
        event = LedgerEvent.create(
            stream=run_stream(approval.run_id),
            index=index,
            type=f"approval.{outcome_name(approval)}",
            occurred_at=moment,
            payload=receipt.body(),
            previous_hash=previous,
        )
        return keyed(event, self._repo)

    def doomed(self, metadata: RecordMetadata) -> Doomed | None:
        """Doom a listed settled approval with its slot, or ``None`` if it is not one."""
        checked = self.open_listed(metadata)
        if checked is None:
            return None
        approval, revision = checked
        if approval.decided_at is None:
            return None
        slot = self._repo.key_digest(
            APPROVAL_SLOTS, joined(approval.checkpoint_id, approval.audience)
        )
        tombstone: dict[str, JsonValue] = {
            "kind": "approval",
            "record": metadata.key_digest,
            "slot": slot,
            "requested_at": format_instant(approval.requested_at),
            "settled_at": format_instant(approval.decided_at),
        }
        deletes = (
            Delete(metadata.namespace, metadata.key_digest, revision),
            Delete(APPROVAL_SLOTS, slot, Guard.ANY),
        )
        streams = (
            run_stream(approval.run_id),
            checkpoint_stream(self._repo, approval.checkpoint_id),
        )
        return Doomed(deletes, streams, tombstone)

    def _checked(
        self, opened: SealedDocument, approval_id: str | None = None
    ) -> tuple[Approval, int] | None:
        """Verify a row, then check it against its checkpoint's stream, re-reading if stale.

        The stream is named by the checkpoint the verified approval names,
        so only an authentic approval chooses where it is checked.
        """
        approval = self._verified(opened)
        wanted = approval.approval_id if approval_id is None else approval_id
        if approval.approval_id != wanted:
            raise IntegrityFailure("approval names another approval than its key")
        current = self._fresh.check_listed(
            self._store,
            checkpoint_stream(self._repo, approval.checkpoint_id),
            opened,
            lambda: self._repo.read(APPROVALS, wanted),
        )
        if current is None:
            return None
        if current is not opened:
            approval = self._verified(current)
            if approval.approval_id != wanted:
                raise IntegrityFailure("approval names another approval than its key")
        return approval, current.revision

    def _verified(self, opened: SealedDocument) -> Approval:
        try:
            approval = Approval.model_validate(opened.document)
        except InvalidInput:
            raise IntegrityFailure(
                "approval has an unexpected shape", key_digest=opened.metadata.key_digest
            ) from None
        if self._repo.key_digest(APPROVALS, approval.approval_id) != opened.metadata.key_digest:
            raise IntegrityFailure(
                "approval is stored under another key", key_digest=opened.metadata.key_digest
            )
        if not hmac.compare_digest(
            integrity_digest(self._key, APPROVAL_TAG, approval), approval.integrity_digest
        ):
            raise IntegrityFailure(
                "approval failed its keyed integrity check",
                key_digest=opened.metadata.key_digest,
            )
        return approval

    def _upsert(self, approval: Approval, expected: int | Guard, ledger_index: int) -> Upsert:
        """Seal an approval bound to the checkpoint-stream event committed with it."""
        labels: dict[str, LabelValue] = {
            "run": self._repo.key_digest(RUNS, approval.run_id),
            "requested_at": micros(approval.requested_at),
            "status": approval.status.value,
        }
        if approval.decided_at is not None:
            labels["settled_at"] = micros(approval.decided_at)
        return self._repo.prepare(
            APPROVALS,
            approval.approval_id,
            approval.model_dump(mode="json"),
            expected=expected,
            labels=labels,
            ledger_index=ledger_index,
        )
