"""A workflow's event stream: same-state events, decision receipts, and reading it back.

A same-state event advances the workflow's version in the same unit of work
as its record, so the record's version guard orders it with every other
write. An event-key marker is bound to the workflow event it keyed: a retry
whose marker was deleted outside flowvault is refused, never turned into a
second event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._cursor import effective_limit
from flowvault.application._paging import Page, PageScope
from flowvault.application._record_kinds import DECIDER_TAG
from flowvault.application._records import Guard, UnitOfWork, Upsert
from flowvault.application._sealed import SealedDocument
from flowvault.application._streams import mac_matches, newest_first, read_stream
from flowvault.application._verified import verified_events, verified_page
from flowvault.application._workflow_records import (
    WorkflowRecords,
    check_action_hash,
    check_event_type,
    mapping,
    natural_key,
    position_after,
    stream_of,
)
from flowvault.application.ports import Clock
from flowvault.domain import (
    ApprovalAlreadyDecided,
    DecisionReceipt,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    RevisionConflict,
    WorkflowRecord,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._envelope import DIGEST_PATTERN
from flowvault.domain._sanitise import sanitise_payload
from flowvault.domain._workflow import DECISION_TYPES

EVENT_KEYS = "flowvault.workflow-event-keys"

DECISION_STATE = "decision"
"""Decision receipts are valid only while a workflow waits in this state."""

EVENT_PAGE = 200

Appended = tuple[WorkflowRecord, LedgerEvent, bool]
"""The record after an append, the event, and whether this call wrote it."""


class WorkflowEventService:
    """Append same-state events and decision receipts to workflows, and read their streams."""

    def __init__(self, records: WorkflowRecords, clock: Clock) -> None:
        self._records = records
        self._repo = records.repository
        self._store = records.store
        self._clock = clock

    def append_event(
        self,
        workflow_id: str,
        event_type: str,
        *,
        expected_state: str,
        expected_version: int,
        payload: Mapping[str, Any] | None = None,
        event_key: str | None = None,
    ) -> Appended:
        """Record a same-state event (a receipt) and advance the version.

        With ``event_key`` a retry returns the original event and ``False``;
        the same key with another type or payload is ``IdempotencyConflict``.
        Decision receipts need the decision state, an ``action_hash`` and an
        ``approved`` flag that agrees with their type; a ``decided_by`` value
        is replaced by its keyed digest before it reaches the ledger.
        """
        check_event_type(event_type)
        body = self._receipt_payload(event_type, payload or {})
        if event_key is not None:
            replayed = self._replay_event(workflow_id, event_key, event_type, body)
            if replayed is not None:
                return replayed

        def attempt() -> Appended | Literal[Lost.RACE]:
            unit, appended = self._append_unit(
                workflow_id,
                event_type,
                body,
                expected_state=expected_state,
                expected_version=expected_version,
                event_key=event_key,
            )
            try:
                if not self._records.commit(unit, workflow_id, expected_state, expected_version):
                    return LOST
            except RevisionConflict:
                if event_key is None:
                    raise
                replayed = self._replay_event(workflow_id, event_key, event_type, body)
                if replayed is None:
                    raise
                return replayed
            self._records.remember(appended[0], appended[1])
            return appended

        return settle(attempt, "workflow ledger", workflow_id=workflow_id)

    def _append_unit(
        self,
        workflow_id: str,
        event_type: str,
        body: JsonValue,
        *,
        expected_state: str,
        expected_version: int,
        event_key: str | None,
    ) -> tuple[UnitOfWork, Appended]:
        """Build the unit that appends one event and advances the record it is bound to."""
        current, head = self._records.write_base(workflow_id, expected_state, expected_version)
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
        index, previous = position_after(head, workflow_id)
        key_digest = None if event_key is None else self._event_key_digest(workflow_id, event_key)
        event = self._records.event(
            updated,
            index=index,
            previous_hash=previous,
            event_type=event_type,
            from_state=current.state,
            payload=body,
            event_key=key_digest,
        )
        upserts = [self._records.upsert(updated, current.state_version, index)]
        if event_key is not None:
            upserts.append(self._event_key_marker(workflow_id, event_key, index))
        return UnitOfWork(upserts=upserts, appends=[event]), (updated, event, True)

    def _event_key_marker(self, workflow_id: str, event_key: str, index: int) -> Upsert:
        return self._repo.prepare(
            EVENT_KEYS, natural_key(workflow_id, event_key), {"index": index}, expected=Guard.ABSENT
        )

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
            check_action_hash(body.get("action_hash"))
            if body.get("approved") is not (event_type == "decision.approved"):
                raise InvalidInput("a decision receipt's approved flag must agree with its type")
        if "decided_by" in body:
            decider = body.pop("decided_by")
            if not isinstance(decider, str) or not decider:
                raise InvalidInput("decided_by must be a non-empty string")
            body["decider"] = self._repo.keyed_digest(DECIDER_TAG, decider)
        return sanitise_payload(body)

    def _event_key_digest(self, workflow_id: str, event_key: str) -> str:
        return self._repo.key_digest(EVENT_KEYS, natural_key(workflow_id, event_key))

    def _replay_event(
        self, workflow_id: str, event_key: str, event_type: str, body: JsonValue
    ) -> Appended | None:
        marker = self._repo.read(EVENT_KEYS, natural_key(workflow_id, event_key))
        if marker is None:
            marker = self._missing_event_key(workflow_id, event_key)
        if marker is None:
            return None
        index = mapping(marker.document, marker.metadata).get("index")
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
        return self._records.load(workflow_id), event, False

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
            raced = self._repo.read(EVENT_KEYS, natural_key(workflow_id, event_key))
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
        decider = payload.get("decider")
        return DecisionReceipt(
            issued_at=event.occurred_at,
            workflow=self._records.digest(workflow_id),
            action_hash=action_hash,
            approved=event.type == "decision.approved",
            event_index=event.index,
            event_hash=event.event_hash,
            decider=decider if isinstance(decider, str) else None,
        )

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
        self._records.load(workflow_id)
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
        self._records.load(workflow_id)
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
