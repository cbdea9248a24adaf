"""A workflow's sealed record and its ledger stream, read and written as one.

The lifecycle, the event stream and the action results of a workflow each
write to its stream, and the first two advance its record too; they share
this one reader and writer, so every write of a record commits with the
event bound to it, and this process's own last commit stands in for a read
while its guards prove it current.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application._backoff import ledger_head_moved
from flowvault.application._freshness import StreamPolicy
from flowvault.application._natural_keys import joined
from flowvault.application._records import Guard, RecordMetadata, UnitOfWork, Upsert
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import keyed
from flowvault.application._write_cache import WriteCache
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import (
    IntegrityFailure,
    InvalidDefinition,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    StateMachine,
    WorkflowRecord,
)
from flowvault.domain._canonical import MAX_SAFE_INTEGER
from flowvault.domain._envelope import DIGEST_PATTERN
from flowvault.domain._sanitise import sanitise_payload
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE

WORKFLOWS = "flowvault.workflows"


def stream_of(workflow_id: str) -> str:
    """Name of the ledger stream that records one workflow's history."""
    if not isinstance(workflow_id, str):
        raise InvalidInput("a workflow id must be text")
    return f"workflow/{workflow_id}"


def natural_key(*parts: str) -> str:
    """Return the natural key of a workflow's id and another part, refusing any that is not text."""
    if not all(isinstance(part, str) for part in parts):
        raise InvalidInput("ids, action hashes and event keys must be text")
    return joined(*parts)


def position_after(head: LedgerEvent | None, workflow_id: str) -> tuple[int, str]:
    """Return the index and previous hash of the event that follows ``head``."""
    if head is None:
        raise IntegrityFailure("workflow ledger is empty", workflow_id=workflow_id)
    return head.index + 1, head.event_hash


def mapping(document: JsonValue, metadata: RecordMetadata) -> dict[str, JsonValue]:
    """Return a sealed document that must be an object, else ``IntegrityFailure``."""
    if not isinstance(document, dict):
        raise IntegrityFailure(
            "sealed document has an unexpected shape", key_digest=metadata.key_digest
        )
    return document


def check_digest(value: object, name: str, *, optional: bool = False) -> None:
    """Refuse ``value`` unless it is a ``sha256:<64 hex>`` digest (or ``None`` if optional)."""
    if optional and value is None:
        return
    if not isinstance(value, str) or not DIGEST_PATTERN.fullmatch(value):
        raise InvalidInput(f"{name} must be a sha256:<64 hex> digest")


def check_action_hash(action_hash: object) -> None:
    """Refuse an action hash that is no ``sha256:<64 hex>`` digest."""
    check_digest(action_hash, "action_hash")


def check_event_type(event_type: object) -> None:
    """Refuse an event type that is not text."""
    if not isinstance(event_type, str):
        raise InvalidInput("event_type must be text")


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A workflow record as read, with the row it came from."""

    record: WorkflowRecord
    metadata: RecordMetadata


def _leaves_record(event: LedgerEvent, _header: object) -> bool:
    """Only events that name no state (tombstones) follow a record's own event."""
    return event.to_state is None


class WorkflowRecords:
    """Read, verify and write workflow records and the stream events bound to them."""

    def __init__(
        self, repository: SealedRepository, *, machine: StateMachine = DEFAULT_LIFECYCLE
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._machine = machine
        self._fresh = StreamPolicy[_Loaded](
            "workflow record",
            repository,
            leaves_record=_leaves_record,
        )
        self._written = WriteCache[str, tuple[WorkflowRecord, LedgerEvent]]()

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository workflows live in."""
        return self._repo

    @property
    def store(self) -> SecureObjectStore:
        """The store under the repository."""
        return self._store

    @property
    def machine(self) -> StateMachine:
        """The state machine new workflows follow and writes are checked against."""
        return self._machine

    def digest(self, workflow_id: str) -> str:
        """Return the keyed digest that addresses a workflow's row."""
        return self._repo.key_digest(WORKFLOWS, workflow_id)

    def load(self, workflow_id: str) -> WorkflowRecord:
        """Read the current record; one missing while its stream holds events was deleted.

        No path deletes a workflow record, and its create commits the record
        with the stream's first event.
        """
        row = (WORKFLOWS, self.digest(workflow_id))
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

    def listed(self, metadata: RecordMetadata) -> WorkflowRecord | None:
        """Open a listed row and check it against its stream; ``None`` if it was deleted."""
        stored = self._store.load(metadata.namespace, metadata.key_digest)
        if stored is None:
            return None
        opened = self._repo.open(
            stored, namespace=metadata.namespace, key_digest=metadata.key_digest
        )
        record = _verified(opened)
        if self.digest(record.workflow_id) != metadata.key_digest:
            raise IntegrityFailure("workflow record names another workflow than its row")
        workflow_id = record.workflow_id
        loaded = self._fresh.check_listed(
            self._store,
            stream_of(workflow_id),
            _Loaded(record, opened.metadata),
            lambda: self._read_row(workflow_id),
        )
        return None if loaded is None else loaded.record

    def write_base(
        self, workflow_id: str, expected_state: str, expected_version: int
    ) -> tuple[WorkflowRecord, LedgerEvent | None]:
        """Return the record and stream head a write starts from, checked against expectations.

        This process's own last commit when it is the version the caller
        expects (the commit's guards prove it still current), else a read.
        """
        written = self._written.take(workflow_id) if isinstance(workflow_id, str) else None
        if written is not None:
            record = written[0]
            if (record.state, record.state_version) == (expected_state, expected_version):
                self.check_expected(record, expected_state, expected_version)
                return written
        base = self._read(workflow_id)
        self.check_expected(base[0], expected_state, expected_version)
        return base

    def check_expected(
        self, record: WorkflowRecord, expected_state: str, expected_version: int
    ) -> None:
        """Refuse a write whose caller expects another state or version, or another machine."""
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

    def upsert(self, record: WorkflowRecord, expected: int | Guard, ledger_index: int) -> Upsert:
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

    def event(
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
        """Build the keyed stream event that records a write of ``record``."""
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

    def commit(
        self, unit: UnitOfWork, workflow_id: str, expected_state: str, expected_version: int
    ) -> bool:
        """Commit; ``False`` when only the ledger head moved, so the caller rebuilds.

        Any other conflict is the caller's stale expectation, reported by
        name when a fresh read shows it, else raised as it came.
        """
        try:
            self._store.commit(unit)
        except RevisionConflict as conflict:
            if ledger_head_moved(conflict):
                return False
            self.check_expected(self.load(workflow_id), expected_state, expected_version)
            raise
        return True

    def remember(self, record: WorkflowRecord, event: LedgerEvent) -> None:
        """Keep this process's own commit as the base of the next write to the workflow."""
        self._written.put(record.workflow_id, (record, event))

    def next_position(self, workflow_id: str) -> tuple[int, str]:
        """Return where an event that writes no record goes; the cached head is then stale."""
        self._written.forget(workflow_id)
        return position_after(self._store.ledger_head(stream_of(workflow_id)), workflow_id)

    def _read(self, workflow_id: str) -> tuple[WorkflowRecord, LedgerEvent | None]:
        """Read the current record, checked against its stream, and the head it was checked on."""
        loaded, head = self._fresh.read(
            self._store, stream_of(workflow_id), lambda: self._read_row(workflow_id)
        )
        if loaded is None:
            raise NotFound("no such workflow", workflow_id=workflow_id)
        return loaded.record, head

    def _read_row(self, workflow_id: str) -> _Loaded | None:
        opened = self._repo.read(WORKFLOWS, workflow_id)
        if opened is None:
            return None
        record = _verified(opened)
        if record.workflow_id != workflow_id:
            raise IntegrityFailure(
                "workflow record disagrees with its row", workflow_id=workflow_id
            )
        return _Loaded(record, opened.metadata)


def _verified(opened: SealedDocument) -> WorkflowRecord:
    """Parse an opened workflow row and check its version against the row's revision."""
    document = mapping(opened.document, opened.metadata)
    try:
        record = WorkflowRecord.model_validate(document.get("record"))
    except InvalidInput:
        raise IntegrityFailure("sealed workflow has an unexpected shape") from None
    if record.state_version != opened.revision:
        raise IntegrityFailure("workflow record disagrees with its row")
    return record
