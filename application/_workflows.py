"""The workflow lifecycle: idempotent create, listing, and CAS transitions.

Built only on the sealed repository and the store port, so it behaves the
same on every adapter. Every mutation is one unit of work: the sealed
workflow record, its ledger event and any idempotency marker commit together
or not at all.

An idempotency marker is bound to an event of its own record stream, named
by the key's keyed digest: a retry whose marker was deleted outside
flowvault is refused, never turned into a second workflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._compaction import compact_after_commit
from flowvault.application._freshness import (
    IDEMPOTENCY_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_payload,
    record_stream,
)
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._records import Guard, LabelFilter, UnitOfWork
from flowvault.application._sealed import SealedDocument
from flowvault.application._streams import keyed, next_position
from flowvault.application._workflow_records import (
    WORKFLOWS,
    WorkflowRecords,
    check_digest,
    check_event_type,
    mapping,
    position_after,
)
from flowvault.application.ports import Clock, IdFactory
from flowvault.domain import (
    IdempotencyConflict,
    InvalidInput,
    LedgerEvent,
    RevisionConflict,
    StateMachine,
    WorkflowRecord,
    WorkOrder,
)
from flowvault.domain._ledger import GENESIS_HASH
from flowvault.domain._workflow import DECISION_TYPES

IDEMPOTENCY = "flowvault.workflow-idempotency"


class WorkflowService:
    """Create workflows, list them, and move them through their state machine."""

    def __init__(self, records: WorkflowRecords, clock: Clock, ids: IdFactory) -> None:
        self._records = records
        self._repo = records.repository
        self._store = records.store
        self._clock = clock
        self._ids = ids
        self._fresh_marker = StreamPolicy[SealedDocument](
            "workflow idempotency marker", self._repo, leaves_record=leaves_unnamed
        )

    @property
    def machine(self) -> StateMachine:
        """The state machine new workflows follow."""
        return self._records.machine

    def create(
        self, order: WorkOrder, *, original_content_hash: str | None = None
    ) -> tuple[WorkflowRecord, bool]:
        """Create a workflow for ``order``, or return the one its idempotency key made.

        Returns ``(record, created)``. Raises ``IdempotencyConflict`` when the
        key was used for a different order, and ``IntegrityFailure`` when its
        marker is missing although the ledger records the earlier create;
        nothing is written then.
        """
        fingerprint = order.fingerprint()
        existing = self._marker(order.idempotency_key)
        if existing is not None:
            return self._replay(existing, fingerprint), False
        check_digest(original_content_hash, "original_content_hash", optional=True)
        record = self._new_record(order, original_content_hash)
        machine = self._records.machine
        event = self._records.event(
            record,
            index=0,
            previous_hash=GENESIS_HASH,
            event_type="workflow.created",
            from_state=None,
            payload={**order.ledger_summary(), "machine": machine.version},
        )
        marker = {"workflow_id": record.workflow_id, "fingerprint": fingerprint}
        recorded = self._marker_event(order.idempotency_key, record)
        unit = UnitOfWork(
            upserts=[
                self._records.upsert(record, Guard.ABSENT, event.index),
                self._repo.prepare(
                    IDEMPOTENCY,
                    order.idempotency_key,
                    marker,
                    expected=Guard.ABSENT,
                    ledger_index=recorded.index,
                ),
            ],
            appends=[event, recorded],
        )
        try:
            self._store.commit(unit)
        except RevisionConflict:
            raced = self._marker(order.idempotency_key)
            if raced is None:
                raise
            return self._replay(raced, fingerprint), False
        self._records.remember(record, event)
        return record, True

    def _new_record(self, order: WorkOrder, original_content_hash: str | None) -> WorkflowRecord:
        now = self._clock.now()
        machine = self._records.machine
        return WorkflowRecord(
            workflow_id=self._ids.new_id(),
            state=machine.initial,
            state_version=1,
            machine_version=machine.version,
            work_order=order,
            created_at=now,
            updated_at=now,
            original_content_hash=original_content_hash,
        )

    def _marker_event(self, idempotency_key: str, record: WorkflowRecord) -> LedgerEvent:
        """Build the event of the marker's own record stream that the marker is bound to."""
        marker_digest = self._repo.key_digest(IDEMPOTENCY, idempotency_key)
        stream = record_stream(IDEMPOTENCY_KIND, marker_digest)
        index, previous = next_position(self._store, stream)
        return keyed(
            LedgerEvent.create(
                stream=stream,
                index=index,
                type="idempotency.recorded",
                occurred_at=record.created_at,
                payload=record_payload(marker_digest),
                previous_hash=previous,
            ),
            self._repo,
        )

    def _marker(self, idempotency_key: str) -> SealedDocument | None:
        """Read a create's marker; one its record stream vouches for must be there."""
        digest = self._repo.key_digest(IDEMPOTENCY, idempotency_key)
        return self._fresh_marker.read_vouched(
            self._store,
            record_stream(IDEMPOTENCY_KIND, digest),
            (IDEMPOTENCY, digest),
            lambda: self._repo.read(IDEMPOTENCY, idempotency_key),
        )

    def _replay(self, marker: SealedDocument, fingerprint: str) -> WorkflowRecord:
        document = mapping(marker.document, marker.metadata)
        if document.get("fingerprint") != fingerprint:
            raise IdempotencyConflict("idempotency key was already used for a different work order")
        return self.get(str(document["workflow_id"]))

    def get(self, workflow_id: str) -> WorkflowRecord:
        """Return the workflow's current record; ``NotFound`` if there is none."""
        return self._records.load(workflow_id)

    def list_workflows(
        self, state: str | None = None, limit: int = 50, *, cursor: str | None = None
    ) -> Page[WorkflowRecord]:
        """Return one page of workflows, optionally only those in ``state``.

        Most recently written first (ties by key digest), at most ``limit``
        (capped at 200); pass ``next_cursor`` back to read the next page. A
        workflow deleted while it is listed is skipped; one whose row does not
        verify, names another workflow or is older than its stream says is
        reported in ``unreadable`` by key digest, and the rest are listed.

        Raises:
            InvalidInput: ``limit`` is not a positive integer, ``state`` is no
                label text, or ``cursor`` is malformed or was issued for
                another listing or state.

        """
        filters = [] if state is None else [LabelFilter("state", state)]
        scope = PageScope(WORKFLOWS, () if state is None else (state,))
        return read_page(
            self._store, scope, WORKFLOWS, filters, self._records.listed, cursor=cursor, limit=limit
        )

    def transition(
        self,
        workflow_id: str,
        target: str,
        *,
        expected_state: str,
        expected_version: int,
        event_type: str = "workflow.transitioned",
        payload: Mapping[str, Any] | None = None,
        output_content_hash: str | None = None,
        stop_reason: str | None = None,
    ) -> WorkflowRecord:
        """Move a workflow to ``target`` if it is still at the expected state and version.

        The version advances and a ledger event records the move in the same
        unit. Entering a terminal state scrubs the work order's parameters.

        Raises:
            RevisionConflict: the workflow moved on (both versions named).
            InvalidTransition: the state machine forbids the move.
            InvalidInput: ``event_type`` is a decision receipt type.

        """
        check_event_type(event_type)
        if event_type in DECISION_TYPES:
            raise InvalidInput("decision receipts are written with append_event, not transition")
        records, machine = self._records, self._records.machine

        def attempt() -> WorkflowRecord | Literal[Lost.RACE]:
            current, head = records.write_base(workflow_id, expected_state, expected_version)
            machine.assert_transition(current.state, target)
            terminal = machine.is_terminal(target)
            updated = _validated(
                current,
                state=target,
                state_version=current.state_version + 1,
                updated_at=self._clock.now(),
                work_order=current.work_order.scrubbed() if terminal else current.work_order,
                output_content_hash=output_content_hash or current.output_content_hash,
                stop_reason=stop_reason or current.stop_reason,
            )
            index, previous = position_after(head, workflow_id)
            event = records.event(
                updated,
                index=index,
                previous_hash=previous,
                event_type=event_type,
                from_state=current.state,
                payload=payload or {},
            )
            unit = UnitOfWork(
                upserts=[records.upsert(updated, current.state_version, index)], appends=[event]
            )
            if not records.commit(unit, workflow_id, expected_state, expected_version):
                return LOST
            records.remember(updated, event)
            if terminal:
                compact_after_commit(self._repo.capabilities.compactor)
            return updated

        return settle(attempt, "workflow ledger", workflow_id=workflow_id)

    def compact(self) -> bool:
        """Ask the store to drop stale copies of scrubbed or purged bytes, if it can."""
        compactor = self._repo.capabilities.compactor
        return True if compactor is None else compactor.compact()


def _validated(record: WorkflowRecord, **changes: object) -> WorkflowRecord:
    """Apply host-supplied changes through validation, as a typed error when they are bad."""
    return WorkflowRecord.model_validate({**record.model_dump(), **changes})
