"""The workflow service: idempotent create, CAS transitions, receipts, action results.

Built only on the sealed repository and the store port, so it behaves the
same on every adapter. Every mutation is one unit of work: the sealed
workflow record, its ledger event and any idempotency marker commit together
or not at all.

An idempotency marker is bound to an event of its own record stream, named
by the key's keyed digest, and an event-key marker to the workflow event it
keyed: a retry whose marker was deleted outside flowvault is refused, never
turned into a second workflow or a second event.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from flowvault.application._compaction import compact_after_commit
from flowvault.application._cursor import effective_limit
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    IDEMPOTENCY_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._records import (
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    LabelValue,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import (
    keyed,
    mac_matches,
    newest_first,
    next_position,
    read_stream,
)
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application._verified import verified_events, verified_page
from flowvault.application._write_cache import WriteCache
from flowvault.application.ports import Clock, IdFactory
from flowvault.domain import (
    DEFAULT_LIFECYCLE,
    GENESIS_HASH,
    ActionResult,
    ApprovalAlreadyDecided,
    DecisionReceipt,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidDefinition,
    InvalidInput,
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    StateMachine,
    WorkflowRecord,
    WorkOrder,
    sanitise_payload,
)
from flowvault.domain._canonical import MAX_SAFE_INTEGER, canonical_bytes
from flowvault.domain._envelope import DIGEST_PATTERN, format_instant
from flowvault.domain._workflow import DECISION_TYPES

WORKFLOWS = "flowvault.workflows"
IDEMPOTENCY = "flowvault.workflow-idempotency"
EVENT_KEYS = "flowvault.workflow-event-keys"
ACTION_RESULTS = "flowvault.action-results"

DECISION_STATE = "decision"
"""Decision receipts are valid only while a workflow waits in this state."""

DEFAULT_RETENTION = timedelta(hours=24)
MIN_RETENTION = timedelta(seconds=1)
MAX_RETENTION = timedelta(days=30)
PURGE_BATCH = 100
EVENT_PAGE = 200
LEDGER_RETRIES = 8
"""How often a write is rebuilt when only the ledger head moved under it."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def stream_of(workflow_id: str) -> str:
    """Name of the ledger stream that records one workflow's history."""
    if not isinstance(workflow_id, str):
        raise InvalidInput("a workflow id must be text")
    return f"workflow/{workflow_id}"


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def _joined(*parts: str) -> str:
    if not all(isinstance(part, str) for part in parts):
        raise InvalidInput("ids, action hashes and event keys must be text")
    return "\x1f".join(parts)


def _ledger_only(conflict: RevisionConflict) -> bool:
    return conflict.details.get("guard") == "append"


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A workflow record as read, with the row it came from."""

    record: WorkflowRecord
    metadata: RecordMetadata


def _leaves_record(event: LedgerEvent, _header: object) -> bool:
    """Only events that name no state (tombstones) follow a record's own event."""
    return event.to_state is None


class WorkflowService:
    """Create workflows, move them through their state machine, keep their evidence."""

    def __init__(
        self,
        repository: SealedRepository,
        clock: Clock,
        ids: IdFactory,
        *,
        machine: StateMachine = DEFAULT_LIFECYCLE,
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._ids = ids
        self._machine = machine
        self._fresh = StreamPolicy[_Loaded](
            "workflow record",
            repository,
            leaves_record=_leaves_record,
        )
        self._fresh_marker = StreamPolicy[SealedDocument](
            "workflow idempotency marker", repository, leaves_record=leaves_unnamed
        )
        self._fresh_result = StreamPolicy[SealedDocument](
            "action result", repository, leaves_record=leaves_unnamed
        )
        self._written = WriteCache[str, tuple[WorkflowRecord, LedgerEvent]]()

    @property
    def machine(self) -> StateMachine:
        """The state machine new workflows follow."""
        return self._machine

    # -- workflows ------------------------------------------------------------

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
        _check_digest(original_content_hash, "original_content_hash", optional=True)
        now = self._clock.now()
        record = WorkflowRecord(
            workflow_id=self._ids.new_id(),
            state=self._machine.initial,
            state_version=1,
            machine_version=self._machine.version,
            work_order=order,
            created_at=now,
            updated_at=now,
            original_content_hash=original_content_hash,
        )
        summary = {**order.ledger_summary(), "machine": self._machine.version}
        event = self._event(
            record,
            index=0,
            previous_hash=GENESIS_HASH,
            event_type="workflow.created",
            from_state=None,
            payload=summary,
        )
        marker = {"workflow_id": record.workflow_id, "fingerprint": fingerprint}
        marker_digest = self._repo.key_digest(IDEMPOTENCY, order.idempotency_key)
        index, previous = next_position(self._store, record_stream(IDEMPOTENCY_KIND, marker_digest))
        recorded = keyed(
            LedgerEvent.create(
                stream=record_stream(IDEMPOTENCY_KIND, marker_digest),
                index=index,
                type="idempotency.recorded",
                occurred_at=now,
                payload=record_payload(marker_digest),
                previous_hash=previous,
            ),
            self._repo,
        )
        unit = UnitOfWork(
            upserts=[
                self._record_upsert(record, Guard.ABSENT, event.index),
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
        self._written.put(record.workflow_id, (record, event))
        return record, True

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
        document = _mapping(marker.document, marker.metadata)
        if document.get("fingerprint") != fingerprint:
            raise IdempotencyConflict("idempotency key was already used for a different work order")
        return self.get(str(document["workflow_id"]))

    def get(self, workflow_id: str) -> WorkflowRecord:
        """Return the workflow's current record; ``NotFound`` if there is none."""
        return self._load(workflow_id)

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
            self._store, scope, WORKFLOWS, filters, self._listed_record, cursor=cursor, limit=limit
        )

    def _listed_record(self, metadata: RecordMetadata) -> WorkflowRecord | None:
        listed = self._listed(metadata)
        loaded = None if listed is None else self._checked(listed)
        return None if loaded is None else loaded.record

    def _checked(self, listed: _Loaded) -> _Loaded | None:
        """Check a listed row against its stream, reading it again only if it looked stale."""
        workflow_id = listed.record.workflow_id
        return self._fresh.check_listed(
            self._store, stream_of(workflow_id), listed, lambda: self._read_row(workflow_id)
        )

    def _listed(self, metadata: RecordMetadata) -> _Loaded | None:
        stored = self._store.load(metadata.namespace, metadata.key_digest)
        if stored is None:
            return None
        opened = self._repo.open(
            stored, namespace=metadata.namespace, key_digest=metadata.key_digest
        )
        record = self._verified(opened)
        if self._repo.key_digest(WORKFLOWS, record.workflow_id) != metadata.key_digest:
            raise IntegrityFailure("workflow record names another workflow than its row")
        return _Loaded(record, opened.metadata)

    def _read_row(self, workflow_id: str) -> _Loaded | None:
        opened = self._repo.read(WORKFLOWS, workflow_id)
        if opened is None:
            return None
        record = self._verified(opened)
        if record.workflow_id != workflow_id:
            raise IntegrityFailure(
                "workflow record disagrees with its row", workflow_id=workflow_id
            )
        return _Loaded(record, opened.metadata)

    def _write_base(
        self, workflow_id: str, expected_state: str, expected_version: int
    ) -> tuple[WorkflowRecord, LedgerEvent | None]:
        """Return the record and stream head a write starts from.

        This process's own last commit when it is the version the caller
        expects (the commit's guards prove it still current), else a read.
        """
        written = self._written.take(workflow_id) if isinstance(workflow_id, str) else None
        if written is not None:
            record = written[0]
            if (record.state, record.state_version) == (expected_state, expected_version):
                return written
        return self._read(workflow_id)

    def _read(self, workflow_id: str) -> tuple[WorkflowRecord, LedgerEvent | None]:
        """Read the current record, checked against its stream, and the head it was checked on."""
        loaded, head = self._fresh.read(
            self._store, stream_of(workflow_id), lambda: self._read_row(workflow_id)
        )
        if loaded is None:
            raise NotFound("no such workflow", workflow_id=workflow_id)
        return loaded.record, head

    def _load(self, workflow_id: str) -> WorkflowRecord:
        """Read the current record; one missing while its stream holds events was deleted.

        No path deletes a workflow record, and its create commits the record
        with the stream's first event.
        """
        row = (WORKFLOWS, self._repo.key_digest(WORKFLOWS, workflow_id))
        loaded, _ = self._fresh.read_owned(
            self._store,
            stream_of(workflow_id),
            row,
            lambda: self._read_row(workflow_id),
            writer=lambda head: head,
        )
        if loaded is None:
            raise NotFound("no such workflow", workflow_id=workflow_id)
        return loaded.record

    @staticmethod
    def _verified(opened: SealedDocument) -> WorkflowRecord:
        """Parse an opened workflow row and check its version against the row's revision."""
        document = _mapping(opened.document, opened.metadata)
        try:
            record = WorkflowRecord.model_validate(document.get("record"))
        except InvalidInput:
            raise IntegrityFailure("sealed workflow has an unexpected shape") from None
        if record.state_version != opened.revision:
            raise IntegrityFailure("workflow record disagrees with its row")
        return record

    def _record_upsert(
        self, record: WorkflowRecord, expected: int | Guard, ledger_index: int
    ) -> Upsert:
        """Seal a record bound to the index of the event committed with it."""
        document = {"record": record.model_dump(mode="json")}
        return self._repo.prepare(
            WORKFLOWS,
            record.workflow_id,
            document,
            expected=expected,
            labels={"state": record.state},
            ledger_index=ledger_index,
        )

    def _check_expected(
        self, record: WorkflowRecord, expected_state: str, expected_version: int
    ) -> None:
        if not isinstance(expected_state, str) or type(expected_version) is not int:
            raise InvalidInput("expected_state must be text and expected_version an integer")
        if not 1 <= expected_version <= MAX_SAFE_INTEGER:
            raise InvalidInput(f"expected_version must be within 1..{MAX_SAFE_INTEGER}")
        if (record.state, record.state_version) != (expected_state, expected_version):
            raise RevisionConflict(
                f"stale workflow: expected {expected_state}@{expected_version}, "
                f"actual {record.state}@{record.state_version}",
                workflow_id=record.workflow_id,
                expected_state=expected_state,
                expected_version=expected_version,
                actual_state=record.state,
                actual_version=record.state_version,
            )
        if record.machine_version != self._machine.version:
            raise InvalidDefinition(
                "workflow follows another state machine than this service",
                workflow_id=record.workflow_id,
                machine=record.machine_version,
            )

    def _event(
        self,
        record: WorkflowRecord,
        *,
        index: int,
        previous_hash: str,
        event_type: str,
        from_state: str | None,
        payload: object,
        event_key: str | None = None,
    ) -> LedgerEvent:
        event = LedgerEvent.create(
            stream=stream_of(record.workflow_id),
            index=index,
            type=event_type,
            occurred_at=record.updated_at,
            payload=sanitise_payload(payload),
            previous_hash=previous_hash,
            from_state=from_state,
            to_state=record.state,
            event_key=event_key,
        )
        return keyed(event, self._repo)

    def _next_position(self, workflow_id: str) -> tuple[int, str]:
        """Return where a tombstone goes; the cached head of this stream is then stale."""
        self._written.forget(workflow_id)
        return _position_after(self._store.ledger_head(stream_of(workflow_id)), workflow_id)

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
        _check_event_type(event_type)
        if event_type in DECISION_TYPES:
            raise InvalidInput("decision receipts are written with append_event, not transition")
        for _ in range(LEDGER_RETRIES):
            current, head = self._write_base(workflow_id, expected_state, expected_version)
            self._check_expected(current, expected_state, expected_version)
            self._machine.assert_transition(current.state, target)
            terminal = self._machine.is_terminal(target)
            updated = _validated(
                current,
                state=target,
                state_version=current.state_version + 1,
                updated_at=self._clock.now(),
                work_order=current.work_order.scrubbed() if terminal else current.work_order,
                output_content_hash=output_content_hash or current.output_content_hash,
                stop_reason=stop_reason or current.stop_reason,
            )
            index, previous = _position_after(head, workflow_id)
            event = self._event(
                updated,
                index=index,
                previous_hash=previous,
                event_type=event_type,
                from_state=current.state,
                payload=payload or {},
            )
            unit = UnitOfWork(
                upserts=[self._record_upsert(updated, current.state_version, index)],
                appends=[event],
            )
            if self._commit_or_retry(unit, workflow_id, expected_state, expected_version):
                self._written.put(workflow_id, (updated, event))
                if terminal:
                    compact_after_commit(self._repo.capabilities.compactor)
                return updated
        raise RevisionConflict("workflow ledger kept moving; retry", workflow_id=workflow_id)

    def _commit_or_retry(
        self, unit: UnitOfWork, workflow_id: str, expected_state: str, expected_version: int
    ) -> bool:
        """Commit; ``False`` when only the ledger head moved, so the caller rebuilds."""
        try:
            self._store.commit(unit)
        except RevisionConflict as conflict:
            if _ledger_only(conflict):
                return False
            current = self._load(workflow_id)
            self._check_expected(current, expected_state, expected_version)
            raise
        return True

    # -- same-state events and decisions -------------------------------------

    def append_event(
        self,
        workflow_id: str,
        event_type: str,
        *,
        expected_state: str,
        expected_version: int,
        payload: Mapping[str, Any] | None = None,
        event_key: str | None = None,
    ) -> tuple[WorkflowRecord, LedgerEvent, bool]:
        """Record a same-state event (a receipt) and advance the version.

        With ``event_key`` a retry returns the original event and ``False``;
        the same key with another type or payload is ``IdempotencyConflict``.
        Decision receipts need the decision state, an ``action_hash`` and an
        ``approved`` flag that agrees with their type; a ``decided_by`` value
        is replaced by its keyed digest before it reaches the ledger.
        """
        _check_event_type(event_type)
        body = self._receipt_payload(event_type, payload or {})
        if event_key is not None:
            replayed = self._replay_event(workflow_id, event_key, event_type, body)
            if replayed is not None:
                return replayed
        for _ in range(LEDGER_RETRIES):
            current, head = self._write_base(workflow_id, expected_state, expected_version)
            self._check_expected(current, expected_state, expected_version)
            if event_type in DECISION_TYPES and current.state != DECISION_STATE:
                raise InvalidTransition(
                    f"decision receipts need state {DECISION_STATE!r}, not {current.state!r}",
                    current=current.state,
                    target=current.state,
                )
            if event_type in DECISION_TYPES:
                self._refuse_second_decision(workflow_id, head, body)
            updated = current.model_copy(
                update={"state_version": current.state_version + 1, "updated_at": self._clock.now()}
            )
            index, previous = _position_after(head, workflow_id)
            key_digest = (
                None if event_key is None else self._event_key_digest(workflow_id, event_key)
            )
            event = self._event(
                updated,
                index=index,
                previous_hash=previous,
                event_type=event_type,
                from_state=current.state,
                payload=body,
                event_key=key_digest,
            )
            upserts = [self._record_upsert(updated, current.state_version, index)]
            if event_key is not None:
                marker = {"index": index}
                upserts.append(
                    self._repo.prepare(
                        EVENT_KEYS, _joined(workflow_id, event_key), marker, expected=Guard.ABSENT
                    )
                )
            unit = UnitOfWork(upserts=upserts, appends=[event])
            try:
                if self._commit_or_retry(unit, workflow_id, expected_state, expected_version):
                    self._written.put(workflow_id, (updated, event))
                    return updated, event, True
            except RevisionConflict:
                if event_key is None:
                    raise
                replayed = self._replay_event(workflow_id, event_key, event_type, body)
                if replayed is None:
                    raise
                return replayed
        raise RevisionConflict("workflow ledger kept moving; retry", workflow_id=workflow_id)

    def _refuse_second_decision(
        self, workflow_id: str, head: LedgerEvent | None, body: JsonValue
    ) -> None:
        """Refuse a decision on an action already decided since the workflow entered this state.

        Walks the stream back from ``head`` to the event that entered the
        decision state. The record's version guard makes the walk and the
        append one step: a decision committed meanwhile moves the version,
        so the second writer gets ``RevisionConflict`` and, retried, this.
        """
        if head is None:
            return
        action_hash = body.get("action_hash") if isinstance(body, dict) else None
        for event in newest_first(self._store, head):
            if event.to_state is None:
                continue
            if event.from_state != DECISION_STATE or event.to_state != DECISION_STATE:
                return
            payload = event.payload
            if (
                event.type in DECISION_TYPES
                and isinstance(payload, dict)
                and payload.get("action_hash") == action_hash
            ):
                raise ApprovalAlreadyDecided(
                    "this action is already decided while the workflow is in the decision "
                    "state; a retry of that decision must reuse its event_key",
                    workflow_id=workflow_id,
                    action_hash=str(action_hash),
                    ledger_index=event.index,
                )

    def _receipt_payload(self, event_type: str, payload: Mapping[str, Any]) -> JsonValue:
        body = dict(payload)
        if event_type in DECISION_TYPES:
            _check_action_hash(body.get("action_hash"))
            if body.get("approved") is not (event_type == "decision.approved"):
                raise InvalidInput("a decision receipt's approved flag must agree with its type")
        if "decided_by" in body:
            decider = body.pop("decided_by")
            if not isinstance(decider, str) or not decider:
                raise InvalidInput("decided_by must be a non-empty string")
            body["decider"] = self._repo.keyed_digest("flowvault.decider/1", decider)
        return sanitise_payload(body)

    def _event_key_digest(self, workflow_id: str, event_key: str) -> str:
        return self._repo.key_digest(EVENT_KEYS, _joined(workflow_id, event_key))

    def _replay_event(
        self, workflow_id: str, event_key: str, event_type: str, body: JsonValue
    ) -> tuple[WorkflowRecord, LedgerEvent, bool] | None:
        marker = self._repo.read(EVENT_KEYS, _joined(workflow_id, event_key))
        if marker is None:
            marker = self._missing_event_key(workflow_id, event_key)
        if marker is None:
            return None
        index = _mapping(marker.document, marker.metadata).get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise IntegrityFailure("event key marker has an unexpected shape")
        page = self._store.read_ledger(stream_of(workflow_id), from_index=index, limit=1)
        if not page.events or page.events[0].index != index:
            raise IntegrityFailure("event key names an event the ledger does not hold")
        event = page.events[0]
        if event.computed_hash() != event.event_hash or not mac_matches(event, self._repo):
            raise IntegrityFailure("the event an event key names fails its chain MAC")
        if event.type != event_type or canonical_bytes(event.payload) != canonical_bytes(body):
            raise IdempotencyConflict("event key was already used for a different event")
        return self.get(workflow_id), event, False

    def _missing_event_key(self, workflow_id: str, event_key: str) -> SealedDocument | None:
        """Look for the event an absent marker would have keyed; refuse if it is there.

        Every keyed event carries its marker's digest as ``event_key``, so the
        workflow's stream shows whether the key was used, marker or not. A
        marker written meanwhile is returned instead.

        Raises:
            IntegrityFailure: the stream holds the keyed event but its marker
                was deleted outside flowvault.

        """
        digest = self._event_key_digest(workflow_id, event_key)
        for event in read_stream(self._store, stream_of(workflow_id)):
            if event.event_key != digest:
                continue
            raced = self._repo.read(EVENT_KEYS, _joined(workflow_id, event_key))
            if raced is not None:
                return raced
            raise IntegrityFailure(
                "event key marker is missing, but the workflow's ledger holds the event "
                "it keyed: it was deleted outside flowvault; restore it from a backup",
                namespace=EVENT_KEYS,
                key_digest=digest,
                ledger_index=event.index,
            )
        return None

    def decision_receipt(self, workflow_id: str, event: LedgerEvent) -> DecisionReceipt:
        """Build the auditor's receipt for a recorded decision event."""
        if event.type not in DECISION_TYPES or event.stream != stream_of(workflow_id):
            raise InvalidInput("not a decision event of this workflow")
        payload = event.payload if isinstance(event.payload, dict) else {}
        action_hash = payload.get("action_hash")
        if not isinstance(action_hash, str) or not DIGEST_PATTERN.fullmatch(action_hash):
            raise InvalidInput("the decision event carries no sha256:<64 hex> action_hash")
        return DecisionReceipt(
            issued_at=event.occurred_at,
            workflow=self._repo.key_digest(WORKFLOWS, workflow_id),
            action_hash=action_hash,
            approved=event.type == "decision.approved",
            event_index=event.index,
            event_hash=event.event_hash,
            decider=_optional_text(payload.get("decider")),
        )

    # -- ledger ---------------------------------------------------------------

    def events(self, workflow_id: str, *, verify: bool = True) -> list[LedgerEvent]:
        """Return the workflow's whole retained ledger, verified under the key unless told not to.

        The plain chain, every event's chain MAC and the retained prefix are
        checked, so a forged, unkeyed, reordered or cut history is refused
        rather than returned. ``verify=False`` returns the rows as stored,
        for a caller that verifies them itself.

        Raises:
            NotFound: no such workflow.
            IntegrityFailure: the stream fails verification; ``details`` name
                the first bad index and the defect.

        """
        self._load(workflow_id)
        if not verify:
            return list(read_stream(self._store, stream_of(workflow_id)))
        return verified_events(self._store, stream_of(workflow_id), self._repo)

    def event_page(
        self, workflow_id: str, cursor: str | None = None, limit: int = EVENT_PAGE
    ) -> Page[LedgerEvent]:
        """Return one page of the workflow's retained ledger, oldest first, verified under the key.

        Events come in index order, at most ``limit`` (capped at 200); pass
        ``next_cursor`` back for the next page. Each page is verified against
        the event before it, so paging costs what it reads. A stream that
        fails verification is one defect, not one bad item: it raises.

        Raises:
            InvalidInput: ``limit`` is not a positive integer, or ``cursor`` is
                malformed or was issued for another listing.
            NotFound: no such workflow.
            IntegrityFailure: the page or its link to the event before it
                fails verification; ``details`` name the first bad index.

        """
        self._load(workflow_id)
        stream = stream_of(workflow_id)
        scope = PageScope("workflow-events", (stream,))
        page = verified_page(
            self._store,
            stream,
            self._repo,
            from_index=scope.index(cursor),
            limit=effective_limit(limit),
        )
        return Page(page.events, (), scope.issue(page.next_index))

    # -- action results -------------------------------------------------------

    def put_action_result(
        self,
        workflow_id: str,
        action_hash: str,
        result: JsonValue,
        *,
        retention: timedelta = DEFAULT_RETENTION,
    ) -> ActionResult:
        """Seal ``result`` for ``retention``; the same content again returns the first.

        Each write appends ``action_result.stored`` to the result's record
        stream and binds the row to it, so an older row put back is refused,
        and a row deleted outside flowvault is refused rather than written
        anew as if the action had never run.

        Raises:
            InvalidInput: retention outside 1 s .. 30 days, or a non-JSON result.
            IdempotencyConflict: another result is stored under ``action_hash``.
            IntegrityFailure: the stored row is older than its record stream
                says, or is missing although the stream records it and no purge.
            NotFound: no such workflow.

        """
        _check_action_hash(action_hash)
        if not isinstance(retention, timedelta) or not MIN_RETENTION <= retention <= MAX_RETENTION:
            raise InvalidInput("retention must be between 1 second and 30 days")
        self._load(workflow_id)
        raw = canonical_bytes(result)
        content = self._repo.keyed_digest("flowvault.result/1", raw)
        now = self._clock.now()
        natural = _joined(workflow_id, action_hash)
        digest = self._repo.key_digest(ACTION_RESULTS, natural)
        for _ in range(LEDGER_RETRIES):
            existing = self._read_result(natural)
            expected: int | Guard = Guard.ABSENT
            tombstones: list[LedgerEvent] = []
            if existing is not None:
                stored = _action_result(existing)
                if stored.expires_at > now:
                    if stored.content_hash != content:
                        raise IdempotencyConflict(
                            "action hash was already used for a different result"
                        )
                    return stored
                expected = existing.revision
                tombstones.append(self._tombstone(stored, *self._next_position(workflow_id)))
            made = ActionResult(
                workflow_id=workflow_id,
                action_hash=action_hash,
                content_hash=content,
                size_bytes=len(raw),
                created_at=now,
                expires_at=now + retention,
                result=result,
            )
            labels: dict[str, LabelValue] = {
                "workflow": self._repo.key_digest(WORKFLOWS, workflow_id),
                "expires_at": _micros(made.expires_at),
            }
            event = record_event(
                self._repo,
                record_stream(ACTION_RESULT_KIND, digest),
                "action_result.stored",
                record_payload(digest),
                now,
            )
            upsert = self._repo.prepare(
                ACTION_RESULTS,
                natural,
                made.model_dump(mode="json"),
                expected=expected,
                labels=labels,
                ledger_index=event.index,
            )
            try:
                self._store.commit(UnitOfWork(upserts=[upsert], appends=[*tombstones, event]))
            except RevisionConflict:
                continue
            if tombstones:
                compact_after_commit(self._repo.capabilities.compactor)
            return made
        raise RevisionConflict("action result kept changing; retry", workflow_id=workflow_id)

    def get_action_result(self, workflow_id: str, action_hash: str) -> ActionResult | None:
        """Return the result with its body, or ``None`` if absent or expired.

        Raises:
            IntegrityFailure: the row is older than its record stream says, or
                is missing although the stream records it and no purge.

        """
        opened = self._read_result(_joined(workflow_id, action_hash))
        if opened is None:
            return None
        stored = _action_result(opened)
        return stored if stored.expires_at > self._clock.now() else None

    def _read_result(self, natural: str) -> SealedDocument | None:
        """Read an action result's row; one its record stream vouches for must be there."""
        digest = self._repo.key_digest(ACTION_RESULTS, natural)
        return self._fresh_result.read_vouched(
            self._store,
            record_stream(ACTION_RESULT_KIND, digest),
            (ACTION_RESULTS, digest),
            lambda: self._repo.read(ACTION_RESULTS, natural),
        )

    def list_action_results(self, workflow_id: str) -> list[ActionResult]:
        """Return the unexpired results of a workflow, oldest first, without bodies.

        Each row is checked against its record stream; a row deleted while
        it is listed is skipped.

        Raises:
            IntegrityFailure: a row does not verify or is older than its stream says.

        """
        self._load(workflow_id)
        now = self._clock.now()
        filters = [
            LabelFilter("workflow", self._repo.key_digest(WORKFLOWS, workflow_id)),
            LabelFilter("expires_at", _micros(now), FilterOp.GT),
        ]
        found = []
        for meta in self._list_all(ACTION_RESULTS, filters):
            opened = self._checked_result(meta)
            if opened is not None:
                found.append(_action_result(opened).model_copy(update={"result": None}))
        return sorted(found, key=lambda item: (item.created_at, item.action_hash))

    def _checked_result(self, metadata: RecordMetadata) -> SealedDocument | None:
        """Open a listed result and check it against its record stream; ``None`` if gone."""
        opened = self._open_row(metadata)
        if opened is None:
            return None
        return self._fresh_result.check_listed(
            self._store,
            record_stream(ACTION_RESULT_KIND, metadata.key_digest),
            opened,
            lambda: self._open_row(metadata),
        )

    def _list_all(self, namespace: str, filters: list[LabelFilter]) -> Iterator[RecordMetadata]:
        cursor: str | None = None
        while True:
            page = self._store.list(namespace, filters=filters, cursor=cursor, limit=200)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def _open_row(self, metadata: RecordMetadata) -> SealedDocument | None:
        record = self._store.load(metadata.namespace, metadata.key_digest)
        if record is None:
            return None
        return self._repo.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)

    def purge_expired(self, now: datetime | None = None, *, batch_size: int = PURGE_BATCH) -> int:
        """Delete expired action results in bounded batches, each leaving tombstone events.

        Every batch is one unit of work: the deletions; in each affected
        workflow's ledger, an ``action_result.purged`` event naming the action
        hash, content digest, size and expiry (never the body); and in each
        result's record stream a ``RETENTION_TOMBSTONE``, so the row is
        legitimately gone. Compacts the store afterwards so the purged bytes
        do not linger on disk.

        Raises:
            IntegrityFailure: an expired row is older than its record stream
                says; nothing of its batch is deleted.

        """
        if now is not None and (not isinstance(now, datetime) or now.utcoffset() is None):
            raise InvalidInput("now must be a timezone-aware datetime")
        cutoff = _micros(now or self._clock.now())
        purged = 0
        stalled = 0
        while stalled < LEDGER_RETRIES:
            page = self._store.list(
                ACTION_RESULTS,
                filters=[LabelFilter("expires_at", cutoff, FilterOp.LE)],
                limit=batch_size,
            )
            if not page.items:
                break
            unit = self._purge_unit(page.items)
            if not unit.deletes:
                stalled += 1
                continue
            try:
                self._store.commit(unit)
            except RevisionConflict:
                stalled += 1
                continue
            purged += len(unit.deletes)
        if purged:
            compact_after_commit(self._repo.capabilities.compactor)
        return purged

    def _tombstone(self, stored: ActionResult, index: int, previous_hash: str) -> LedgerEvent:
        """Build the record that a result was removed: digests and times, never the body."""
        event = LedgerEvent.create(
            stream=stream_of(stored.workflow_id),
            index=index,
            type="action_result.purged",
            occurred_at=self._clock.now(),
            payload=stored.model_dump(mode="json", exclude={"result", "workflow_id"}),
            previous_hash=previous_hash,
        )
        return keyed(event, self._repo)

    def _purge_unit(self, expired: tuple[RecordMetadata, ...]) -> UnitOfWork:
        deletes, appends = [], []
        heads: dict[str, tuple[int, str]] = {}
        for metadata in expired:
            opened = self._checked_result(metadata)
            if opened is None:
                continue
            stored = _action_result(opened)
            stream = stream_of(stored.workflow_id)
            if stream not in heads:
                heads[stream] = self._next_position(stored.workflow_id)
            event = self._tombstone(stored, *heads[stream])
            heads[stream] = (event.index + 1, event.event_hash)
            deletes.append(Delete(metadata.namespace, metadata.key_digest, opened.revision))
            appends.append(event)
            tombstone: dict[str, JsonValue] = {
                "kind": "action_result",
                "record": metadata.key_digest,
                "expires_at": format_instant(stored.expires_at),
                "purged_at": format_instant(event.occurred_at),
            }
            appends.append(
                record_event(
                    self._repo,
                    record_stream(ACTION_RESULT_KIND, metadata.key_digest),
                    RETENTION_TOMBSTONE,
                    tombstone,
                    event.occurred_at,
                )
            )
        return UnitOfWork(deletes=deletes, appends=appends)

    def compact(self) -> bool:
        """Ask the store to drop stale copies of scrubbed or purged bytes, if it can."""
        compactor = self._repo.capabilities.compactor
        return True if compactor is None else compactor.compact()


def _position_after(head: LedgerEvent | None, workflow_id: str) -> tuple[int, str]:
    if head is None:
        raise IntegrityFailure("workflow ledger is empty", workflow_id=workflow_id)
    return head.index + 1, head.event_hash


def _mapping(document: JsonValue, metadata: RecordMetadata) -> dict[str, JsonValue]:
    if not isinstance(document, dict):
        raise IntegrityFailure(
            "sealed document has an unexpected shape", key_digest=metadata.key_digest
        )
    return document


def _action_result(opened: SealedDocument) -> ActionResult:
    try:
        return ActionResult.model_validate(_mapping(opened.document, opened.metadata))
    except InvalidInput:
        raise IntegrityFailure("sealed action result has an unexpected shape") from None


def _optional_text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None


def _check_action_hash(action_hash: object) -> None:
    _check_digest(action_hash, "action_hash")


def _check_digest(value: object, name: str, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not DIGEST_PATTERN.fullmatch(value):
        raise InvalidInput(f"{name} must be a sha256:<64 hex> digest")


def _check_event_type(event_type: object) -> None:
    if not isinstance(event_type, str):
        raise InvalidInput("event_type must be text")


def _validated(record: WorkflowRecord, **changes: object) -> WorkflowRecord:
    """Apply host-supplied changes through validation, as a typed error when they are bad."""
    return WorkflowRecord.model_validate({**record.model_dump(), **changes})
