"""The workflow state repository: one sealed state document per scope, under CAS.

Each scope (a host's bucket or profile) has one state row and one history
stream in the ledger. Every write appends a ``workflow_state.written`` event
in the same unit, and the row's header names that event's index, so a row
replayed from an older revision is caught against the history. Updates
re-run a pure function from a fresh load when another writer got there
first, under a ``RetryPolicy``; on a store with a ``RecordLock`` they queue
for the state row instead of racing for it; resets write their audit event
before they delete, so a crash in between leaves the trail and the data,
never neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Generic, TypeVar, overload

from pydantic import BaseModel, ValidationError

from flowvault.application._backoff import DEFAULT_RETRY, RetryPolicy
from flowvault.application._compaction import compact_after_commit
from flowvault.application._freshness import StreamPolicy
from flowvault.application._record_kinds import DECIDER_TAG
from flowvault.application._records import Delete, Guard, RecordMetadata, UnitOfWork, Upsert
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import (
    MAINTENANCE_EVENTS,
    keyed,
    newest_first,
    next_position,
)
from flowvault.application._verified import verified_events
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import (
    EnvelopeHeader,
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    ResetFingerprint,
    RevisionConflict,
    WorkflowState,
)
from flowvault.domain._envelope import Sensitivity
from flowvault.domain._fingerprint import Readability
from flowvault.domain._ledger import GENESIS_HASH
from flowvault.domain._sanitise import sanitise_payload
from flowvault.domain._state import REASON_PATTERN, SCOPE_PATTERN

STATE_NAMESPACE = "flowvault.workflow-state"
RESET_EVENT = "workflow_state.reset"
STATE_WRITTEN_EVENT = "workflow_state.written"
"""Appended with every state write, last in its unit; its payload is the revision written."""

M = TypeVar("M", bound=BaseModel)


def check_scope(scope: str) -> str:
    """Return ``scope`` if it is a valid scope name, else raise ``InvalidInput``."""
    if not isinstance(scope, str) or not SCOPE_PATTERN.fullmatch(scope):
        raise InvalidInput("a scope is 1-64 of [A-Za-z0-9._-], starting alphanumeric")
    return scope


def history_stream(scope: str) -> str:
    """Name of the ledger stream holding a scope's history."""
    return f"scope/{check_scope(scope)}"


def cold_fingerprint(scope: str, reason_class: str | None = None) -> ResetFingerprint:
    """Fingerprint of a scope on a cold root, where no store exists to look in."""
    return ResetFingerprint(
        scope=check_scope(scope),
        readability=Readability.ABSENT,
        reason_class=_reason(reason_class, Readability.ABSENT),
    )


def _reason(reason_class: str | None, derived: Readability) -> str:
    if reason_class is None:
        return derived.value
    if not isinstance(reason_class, str) or not REASON_PATTERN.fullmatch(reason_class):
        raise InvalidInput("a reason class is a short lowercase token such as 'corrupt'")
    return reason_class


def _reset_of(event: LedgerEvent, header: EnvelopeHeader) -> bool:
    """Whether ``event`` leaves the row as it is: a trim or vouch, or a reset of exactly this row.

    A reset that names this row is what a reset interrupted before its
    delete leaves behind.
    """
    payload = event.payload
    if event.type in MAINTENANCE_EVENTS:
        return True
    if event.type != RESET_EVENT or not isinstance(payload, dict):
        return False
    fingerprint = payload.get("fingerprint")
    if not isinstance(fingerprint, dict):
        return False
    revision = fingerprint.get("revision")
    return (
        type(revision) is int
        and revision == header.revision
        and fingerprint.get("key_digest") == header.key_digest
    )


def _last_write(store: SecureObjectStore, head: LedgerEvent) -> LedgerEvent | None:
    """Return the newest write-or-reset event of the history if it is a write.

    Trims and vouches are passed over: they are about the stream, not the row.
    """
    for event in newest_first(store, head):
        if event.type not in MAINTENANCE_EVENTS:
            return event if event.type == STATE_WRITTEN_EVENT else None
    return None


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """An event a state update appends to its scope's history stream."""

    type: str
    payload: JsonValue = None


@dataclass(frozen=True, slots=True)
class StateSnapshot(Generic[M]):
    """A state as loaded, with the exact revision read (``None`` when absent)."""

    state: M
    revision: int | None


@dataclass(frozen=True, slots=True)
class StateProbe(Generic[M]):
    """What reset needs to know: metadata, the state if it opens, and readability."""

    metadata: RecordMetadata | None
    state: M | None
    readability: Readability


class StateRepository(Generic[M]):
    """One typed, sealed state document per scope, updated by compare-and-swap.

    ``retry`` says how lost races are re-run; ``max_retries``, when given,
    caps its re-runs (``fn`` then runs at most ``max_retries + 1`` times).
    """

    @overload
    def __init__(
        self: StateRepository[WorkflowState],
        repository: SealedRepository,
        scope: str,
        *,
        model: None = None,
        sensitivity: Sensitivity = Sensitivity.CONFIDENTIAL,
        schema_version: int = 1,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_retries: int | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        repository: SealedRepository,
        scope: str,
        *,
        model: type[M],
        sensitivity: Sensitivity = Sensitivity.CONFIDENTIAL,
        schema_version: int = 1,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_retries: int | None = None,
    ) -> None: ...

    def __init__(
        self,
        repository: SealedRepository,
        scope: str,
        *,
        model: type[M] | None = None,
        sensitivity: Sensitivity = Sensitivity.CONFIDENTIAL,
        schema_version: int = 1,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_retries: int | None = None,
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._scope = check_scope(scope)
        self._model: type[M] = model or WorkflowState  # type: ignore[assignment]
        self._sensitivity = sensitivity
        self._schema_version = schema_version
        self._retry = retry if max_retries is None else replace(retry, max_retries=max_retries)
        self._fresh = StreamPolicy[SealedDocument](
            "workflow state", repository, leaves_record=_reset_of
        )

    @property
    def scope(self) -> str:
        """The scope this repository holds state for."""
        return self._scope

    # -- reading ---------------------------------------------------------------

    def load(self) -> StateSnapshot[M]:
        """Return the state and the revision read, or an empty default when absent.

        Raises:
            IntegrityFailure: the row does not verify, was written under
                another sensitivity class, or is older than its history (a
                later write or reset of the scope follows the event it names).
            SchemaTooNew: it was written under a newer schema than this repository's.

        """
        snapshot, _ = self._load(with_head=False)
        return snapshot

    def _load(self, *, with_head: bool = True) -> tuple[StateSnapshot[M], LedgerEvent | None]:
        """Return the state and, for a writer, the history head it was checked against."""
        opened, head = self._opened(self._read_row, with_head=with_head)
        if opened is None:
            return StateSnapshot(self._model(), None), head
        try:
            state = self._model.model_validate(opened.document)
        except (ValidationError, InvalidInput):
            raise IntegrityFailure("stored state does not match its model") from None
        return StateSnapshot(state, opened.revision), head

    def _opened(
        self, read: Callable[[], SealedDocument | None], *, with_head: bool
    ) -> tuple[SealedDocument | None, LedgerEvent | None]:
        """Read the row with ``read``, checked against the scope's history.

        An absent row whose history says it was written, and not reset
        since, was deleted (or moved) outside flowvault: reading it as empty
        would hand out, or let a writer overwrite, a default state.
        """
        stream = history_stream(self._scope)
        return self._fresh.read_owned(
            self._store,
            stream,
            (STATE_NAMESPACE, self._key_digest()),
            read,
            writer=partial(_last_write, self._store),
            with_head=with_head,
        )

    def check_current(self) -> None:
        """Check the row against the scope's history without opening it as the model.

        An audit calls this for every scope, whatever model, sensitivity
        and schema version its host uses.

        Raises:
            IntegrityFailure: the row does not verify, is older than its
                history, or is missing although its history says it exists.

        """
        self._opened(lambda: self._repo.read(STATE_NAMESPACE, self._scope), with_head=False)

    def _read_row(self) -> SealedDocument | None:
        return self._repo.read(
            STATE_NAMESPACE,
            self._scope,
            sensitivity=self._sensitivity,
            max_schema_version=self._schema_version,
        )

    def probe(self) -> StateProbe[M]:
        """Return metadata, the state when it opens, and its readability class."""
        metadata = self._store.peek_metadata(STATE_NAMESPACE, self._key_digest())
        if metadata is None:
            return StateProbe(None, None, Readability.ABSENT)
        try:
            snapshot = self.load()
        except FlowvaultError:
            return StateProbe(metadata, None, Readability.UNREADABLE)
        return StateProbe(metadata, snapshot.state, Readability.READABLE)

    def fingerprint(self, reason_class: str | None = None) -> ResetFingerprint:
        """Summarise the state row without plaintext; derive the class unless given."""
        probe = self.probe()
        metadata = probe.metadata
        if metadata is None:
            return cold_fingerprint(self._scope, reason_class)
        header = metadata.header
        return ResetFingerprint(
            scope=self._scope,
            readability=probe.readability,
            reason_class=_reason(reason_class, probe.readability),
            namespace=header.namespace,
            key_digest=header.key_digest,
            revision=header.revision,
            schema_version=header.schema_version,
            sensitivity=header.sensitivity.value,
            written_at=header.written_at,
            byte_length=metadata.byte_length,
            payload_digest=metadata.payload_digest,
        )

    def _key_digest(self) -> str:
        return self._repo.key_digest(STATE_NAMESPACE, self._scope)

    # -- writing ---------------------------------------------------------------

    def to_write(self, state: M, expected_revision: int | None) -> UnitOfWork:
        """Prepare (seal, do not commit) a state write guarded by ``expected_revision``.

        The unit holds the sealed row and its ``workflow_state.written``
        event; commit it as it is, or with its upserts and appends joined to
        the host's own writes. The event's position is read now, so a unit
        committed after another write of the scope fails as a conflict.
        """
        return self._unit(state, expected_revision, (), self._position())

    def _unit(
        self,
        state: M,
        expected_revision: int | None,
        drafts: Sequence[HistoryEvent],
        position: tuple[int, str],
    ) -> UnitOfWork:
        """Seal ``state`` bound to its written event, which follows ``drafts`` at ``position``."""
        index, previous = position
        upsert = self._seal(state, expected_revision, index + len(drafts))
        written = HistoryEvent(STATE_WRITTEN_EVENT, {"revision": upsert.header.revision})
        appends = self._events([*drafts, written], (index, previous))
        return UnitOfWork(upserts=[upsert], appends=appends)

    def _position(self) -> tuple[int, str]:
        return next_position(self._store, history_stream(self._scope))

    def _seal(self, state: M, expected_revision: int | None, ledger_index: int) -> Upsert:
        if not isinstance(state, self._model):
            raise InvalidInput(f"state must be a {self._model.__name__}")
        try:
            document = state.model_dump(mode="json")
        except (ValueError, TypeError):
            raise InvalidInput(f"the {self._model.__name__} does not serialise to JSON") from None
        return self._repo.prepare(
            STATE_NAMESPACE,
            self._scope,
            document,
            expected=Guard.ABSENT if expected_revision is None else expected_revision,
            sensitivity=self._sensitivity,
            schema_version=self._schema_version,
            ledger_index=ledger_index,
        )

    def save(self, state: M) -> int:
        """Write ``state`` whatever is stored now; return the revision written."""
        _, revision = self.update(lambda _: state)
        return revision

    def update(self, fn: Callable[[M], M]) -> tuple[M, int]:
        """Load, apply the pure ``fn``, write with CAS; re-run ``fn`` on a lost race.

        A lost race is a write refused because another writer changed the
        state (or its history) after the load, or a load that kept losing
        to other writers. Each one is followed by a jittered pause, then a
        fresh load and another run of ``fn``, as the repository's
        ``RetryPolicy`` allows; once it is spent, ``RevisionConflict``
        (``details``: scope, tries, milliseconds). On a store with a
        ``RecordLock`` each try holds the state row's lock from the load
        to the commit, so writers queue instead of racing.
        """
        return self._update(lambda state: (fn(state), (), ()))

    def update_with_writes(
        self, fn: Callable[[M], tuple[M, Sequence[Upsert | Delete]]]
    ) -> tuple[M, int]:
        """Update the state and commit ``fn``'s prepared sibling writes in the same unit.

        A sibling whose guard fails while the state is still as loaded is
        not a lost race, and re-running ``fn`` would not mend it: its
        ``RevisionConflict``, naming that sibling, is raised at once.
        """

        def step(state: M) -> tuple[M, Sequence[Upsert | Delete], Sequence[HistoryEvent]]:
            new, writes = fn(state)
            return new, writes, ()

        return self._update(step)

    def update_with_events(
        self, fn: Callable[[M], tuple[M, Sequence[HistoryEvent]]]
    ) -> tuple[M, int]:
        """Update the state and append ``fn``'s events to the scope's history, atomically."""

        def step(state: M) -> tuple[M, Sequence[Upsert | Delete], Sequence[HistoryEvent]]:
            new, events = fn(state)
            return new, (), events

        return self._update(step)

    def _update(
        self,
        step: Callable[[M], tuple[M, Sequence[Upsert | Delete], Sequence[HistoryEvent]]],
    ) -> tuple[M, int]:
        retries = self._retry.start()
        while True:
            with self._row_locked():
                done = self._try_update(step)
            if done is not None:
                return done
            retries.after_lost_race(f"state of scope {self._scope!r}", scope=self._scope)

    def _row_locked(self) -> AbstractContextManager[None]:
        lock = self._repo.capabilities.record_lock
        if lock is None:
            return nullcontext()
        return lock.record_locked(STATE_NAMESPACE, self._key_digest())

    def _try_update(
        self,
        step: Callable[[M], tuple[M, Sequence[Upsert | Delete], Sequence[HistoryEvent]]],
    ) -> tuple[M, int] | None:
        """Load, step and commit once; return ``None`` when another writer won the race."""
        try:
            snapshot, head = self._load()
        except RevisionConflict:
            return None
        new, writes, events = step(snapshot.state)
        own = self._unit(new, snapshot.revision, events, _after(head))
        unit = UnitOfWork(
            upserts=[*own.upserts, *(w for w in writes if isinstance(w, Upsert))],
            deletes=[w for w in writes if isinstance(w, Delete)],
            appends=own.appends,
        )
        try:
            self._store.commit(unit)
        except RevisionConflict as conflict:
            if self._names_sibling(conflict) and not self._moved(snapshot, head):
                raise
            return None
        return new, own.upserts[0].header.revision

    def _names_sibling(self, conflict: RevisionConflict) -> bool:
        """Whether ``conflict`` names a guard of neither the state row nor its history."""
        details = conflict.details
        if "stream" in details:
            return details["stream"] != history_stream(self._scope)
        own = (STATE_NAMESPACE, self._key_digest())
        return "key_digest" in details and (details.get("namespace"), details["key_digest"]) != own

    def _moved(self, snapshot: StateSnapshot[M], head: LedgerEvent | None) -> bool:
        """Whether the state row or its history changed since ``snapshot`` was loaded.

        A sibling guard checked before the state's own may fail only
        because another writer moved the state: that is a lost race.
        """
        metadata = self._store.peek_metadata(STATE_NAMESPACE, self._key_digest())
        revision = None if metadata is None else metadata.header.revision
        now = self._store.ledger_head(history_stream(self._scope))
        return revision != snapshot.revision or _after(now) != _after(head)

    def _events(
        self, drafts: Sequence[HistoryEvent], position: tuple[int, str]
    ) -> list[LedgerEvent]:
        stream = history_stream(self._scope)
        index, previous = position
        now = self._repo.clock.now()
        events = []
        for draft in drafts:
            event = keyed(
                LedgerEvent.create(
                    stream=stream,
                    index=index,
                    type=draft.type,
                    occurred_at=now,
                    payload=sanitise_payload(draft.payload),
                    previous_hash=previous,
                ),
                self._repo,
            )
            events.append(event)
            index, previous = index + 1, event.event_hash
        return events

    # -- reset -----------------------------------------------------------------

    def reset(
        self,
        *,
        actor: str,
        source: str,
        reason_class: str | None = None,
    ) -> ResetFingerprint:
        """Record a reset event, then delete only the state row; return the fingerprint.

        The event is committed before the delete: if the process dies in
        between, the trail exists and the state is still there, and running
        the reset again completes it. Resetting an absent state succeeds and
        records that it was absent. A reset that deleted compacts the store
        afterwards, so the state's old seals leave the write-ahead log too.
        The actor is recorded as the keyed digest a decider gets, so the
        ledger names no one in clear and one person has one digest.
        """
        fingerprint = self.fingerprint(reason_class)
        payload: dict[str, JsonValue] = {
            "fingerprint": fingerprint.model_dump(mode="json"),
            "actor": self._repo.keyed_digest(DECIDER_TAG, actor),
            "source": source,
            "reason": fingerprint.reason_class,
        }
        self._append_reset(payload)
        if fingerprint.revision is not None and fingerprint.key_digest is not None:
            self._store.commit(
                UnitOfWork(
                    deletes=[Delete(STATE_NAMESPACE, fingerprint.key_digest, fingerprint.revision)]
                )
            )
            compact_after_commit(self._repo.capabilities.compactor)
        return fingerprint

    def _append_reset(self, payload: JsonValue) -> None:
        retries = self._retry.start()
        while True:
            try:
                appends = self._events([HistoryEvent(RESET_EVENT, payload)], self._position())
                self._store.commit(UnitOfWork(appends=appends))
            except RevisionConflict:
                retries.after_lost_race(f"history of scope {self._scope!r}", scope=self._scope)
                continue
            return

    def history(self) -> list[LedgerEvent]:
        """Return the scope's history stream, oldest first, verified under the key.

        Raises:
            IntegrityFailure: the stream fails verification (a forged, unkeyed,
                reordered or cut history); ``details`` name the first bad index.

        """
        return verified_events(self._store, history_stream(self._scope), self._repo)


def _after(head: LedgerEvent | None) -> tuple[int, str]:
    """Return the position after ``head``, the stream's head as the writer read it."""
    return (0, GENESIS_HASH) if head is None else (head.index + 1, head.event_hash)


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    """The recovery verb's result: its fingerprint, and whether it deleted or found no store."""

    fingerprint: ResetFingerprint
    applied: bool
    cold_root: bool


def reset_progress(
    state: StateRepository[M] | None,
    scope: str,
    *,
    actor: str,
    source: str,
    reason_class: str | None = None,
    dry_run: bool = False,
) -> ResetOutcome:
    """Reset a scope's workflow state, or only fingerprint it with ``dry_run``.

    ``state`` is ``None`` on a cold root (no store exists): nothing is
    created, and the fingerprint says the state is absent.
    """
    if state is None:
        return ResetOutcome(cold_fingerprint(scope, reason_class), applied=False, cold_root=True)
    if dry_run:
        return ResetOutcome(state.fingerprint(reason_class), applied=False, cold_root=False)
    fingerprint = state.reset(actor=actor, source=source, reason_class=reason_class)
    return ResetOutcome(fingerprint, applied=True, cold_root=False)
