"""The graph run service: versioned definitions, CAS run lifecycle, run events, receipts.

Built only on the sealed repository and the store port, so it behaves the
same on every adapter. Every mutation is one unit of work: a run's record,
its events in ``run_stream(run_id)``, its idempotency marker and its terminal
receipt commit together or not at all. Every move to a terminal status,
whichever call makes it, writes the run's terminal receipt in that unit.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from flowvault.application._compaction import compact_after_commit
from flowvault.application._freshness import (
    DEFINITION_KIND,
    DELETED_FIELD,
    IDEMPOTENCY_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._graph import (
    RETENTION_TOMBSTONE,
    KeyedDigester,
    require_integrity,
    run_stream,
)
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._receipts import ReceiptSigner, sign_terminal_receipt
from flowvault.application._record_kind import purge_horizon
from flowvault.application._records import (
    MAX_LIST_LIMIT,
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
    MAINTENANCE_EVENTS,
    keyed,
    mac_matches,
    newest_first,
    next_position,
)
from flowvault.application._verified import verified_page
from flowvault.application.ports import Clock, IdFactory, SecureObjectStore
from flowvault.domain import (
    DefinitionReferenced,
    DefinitionVersion,
    GraphRun,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    TerminalReceipt,
    content_hash,
    sanitise_payload,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._envelope import DIGEST_PATTERN, format_instant
from flowvault.domain._graph_runs import DEFINITION_ID_PATTERN, RUN_LIFECYCLE

GRAPH_DEFINITIONS = "flowvault.graph-definitions"
"""Definition heads: which version is current."""
GRAPH_DEFINITION_VERSIONS = "flowvault.graph-definition-versions"
"""Every distinct definition content ever registered, keyed by id and content hash."""
GRAPH_RUNS = "flowvault.graph-runs"
GRAPH_RUN_IDEMPOTENCY = "flowvault.graph-run-idempotency"
GRAPH_RUN_RECEIPTS = "flowvault.graph-run-receipts"

RUN_EVENT_PAGE = MAX_LIST_LIMIT
"""Most events one ``read_run_events`` page returns."""
MAX_EVENT_BATCH = 200
"""Most caller events one append or finish may carry, so every unit stays bounded."""
PURGE_BATCH = 200
RECOVERY_BATCH = 100
RUN_RETRIES = 16
"""How often a write is rebuilt after losing a race whose outcome it re-checks."""
MAX_IDEMPOTENCY_KEY = 256

INTERRUPTED = "interrupted_non_resumable"
RESERVED_EVENT_PREFIXES = ("run.", "retention.")
"""Event types only the service writes, so a caller cannot forge a status change."""

_REQUEST_TAG = "flowvault.run-request/1"
_FINAL_STATE_TAG = "flowvault.run-final-state/1"
_RECEIPT_TAG = "flowvault.run-receipt/1"
_UNSIGNED = "sha256:" + "0" * 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class RunEventPage:
    """One page of a run's events; ``gap`` means events before the cursor were trimmed."""

    events: tuple[LedgerEvent, ...]
    next_cursor: int | None
    gap: bool


@dataclass(frozen=True, slots=True)
class _LoadedRun:
    """A run as read, with the row it came from."""

    run: GraphRun
    metadata: RecordMetadata


def _never_started(store: SecureObjectStore, head: LedgerEvent) -> bool:
    """Whether the run's stream begins with an event other than the one starting a run."""
    page = store.read_ledger(head.stream, from_index=0, limit=1)
    first = page.events[0] if page.events else None
    return first is not None and first.index == 0 and not first.type.startswith("run.")


def _purged_run(store: SecureObjectStore, head: LedgerEvent, digester: KeyedDigester) -> bool:
    """Whether the keyed retention tombstones ending the stream include its run's own.

    Purges of a run's checkpoints and approvals may tombstone its stream
    after the run itself was purged, so the run's tombstone need not be
    the head; nothing but tombstones follows it.
    """
    for event in newest_first(store, head):
        if event.type in MAINTENANCE_EVENTS:
            continue
        if event.type != RETENTION_TOMBSTONE or not mac_matches(event, digester):
            return False
        payload = event.payload
        if isinstance(payload, dict) and payload.get("kind") == "run":
            return True
    return False


def _leaves_run(event: LedgerEvent, _header: object) -> bool:
    """Caller, approval and retention events follow a run's own ``run.*`` event freely."""
    return not event.type.startswith("run.")


def _unbound_run_stale(head: LedgerEvent, loaded: _LoadedRun) -> bool:
    """Hold a run row without a ledger index to the status its newest ``run.*`` event set."""
    return head.type.startswith("run.") and head.to_state != loaded.run.status


def _receipt_unbound_stale(_head: LedgerEvent, _opened: SealedDocument) -> bool:
    """Accept a receipt written before receipts were bound: it is never rewritten."""
    return False


@dataclass(frozen=True, slots=True)
class _Draft:
    """An event before its position in the stream is known."""

    type: str
    payload: JsonValue
    from_state: str | None
    to_state: str | None


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def _joined(*parts: str) -> str:
    return "\x1f".join(parts)


def _ledger_only(conflict: RevisionConflict) -> bool:
    return conflict.details.get("guard") == "append"


class RunService:
    """Keep graph definitions and runs, move runs through their lifecycle, sign how they end.

    ``integrity`` MACs terminal receipts and digests final states; pass the
    sealed repository itself in normal use. Without it, everything but
    ending a run and ``terminal_receipt`` still works. ``signer``, an
    Ed25519 key, also signs each terminal receipt, so that it can be
    checked with the public key alone.
    """

    def __init__(
        self,
        repository: SealedRepository,
        clock: Clock,
        ids: IdFactory,
        *,
        integrity: KeyedDigester | None,
        signer: ReceiptSigner | None = None,
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._ids = ids
        self._integrity = integrity
        self._signer = signer
        self._fresh = StreamPolicy[_LoadedRun](
            "run record",
            repository,
            leaves_record=_leaves_run,
            unbound_stale=_unbound_run_stale,
        )
        self._fresh_marker = StreamPolicy[SealedDocument](
            "run idempotency marker", repository, leaves_record=leaves_unnamed
        )
        self._fresh_definition = StreamPolicy[SealedDocument](
            "graph definition", repository, leaves_record=leaves_unnamed
        )
        self._fresh_receipt = StreamPolicy[SealedDocument](
            "terminal receipt",
            repository,
            leaves_record=leaves_unnamed,
            unbound_stale=_receipt_unbound_stale,
        )

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository runs live in."""
        return self._repo

    # -- definitions ------------------------------------------------------------

    def register_definition(
        self, definition_id: str, spec: JsonValue, *, overwrite: bool = False
    ) -> DefinitionVersion:
        """Store ``spec`` as a version named by its content hash and make it current.

        The same content again is a no-op returning the existing version.
        Replacing a current version that runs reference needs ``overwrite``,
        so a host cannot silently change what a run's definition id means.

        Raises:
            DefinitionReferenced: the current version is referenced and
                ``overwrite`` is false.
            InvalidInput: a malformed id or a spec outside the JSON profile.

        """
        _check_definition_id(definition_id)
        version = content_hash(spec)
        for _ in range(RUN_RETRIES):
            try:
                return self._register(definition_id, spec, version, overwrite=overwrite)
            except RevisionConflict:
                continue
        raise RevisionConflict("definition kept changing; retry", definition_id=definition_id)

    def _register(
        self, definition_id: str, spec: JsonValue, version: str, *, overwrite: bool
    ) -> DefinitionVersion:
        head = self._head_row(definition_id)
        if head is None:
            made = self._new_version(definition_id, version)
            event = self._definition_event(
                definition_id, "definition.registered", record_payload(*self._digests(made))
            )
            upserts = [
                self._head_upsert(definition_id, version, Guard.ABSENT, event.index),
                self._version_upsert(made, spec, event.index),
            ]
            self._store.commit(UnitOfWork(upserts=upserts, appends=[event]))
            return made
        current = _head_version(head, definition_id)
        if current == version:
            return self._version(definition_id, version)[0]
        if not overwrite and self._referenced(
            "version", self._version_digest(definition_id, current)
        ):
            raise DefinitionReferenced(
                "runs reference the current definition version; pass overwrite=True to replace it",
                definition_id=definition_id,
            )
        existing = self._version_row(definition_id, version)
        made = (
            self._new_version(definition_id, version)
            if existing is None
            else _definition_version(existing, definition_id, version)[0]
        )
        written = self._digests(made) if existing is None else self._digests(made)[:1]
        event = self._definition_event(
            definition_id, "definition.registered", record_payload(*written)
        )
        upserts = [self._head_upsert(definition_id, version, head.revision, event.index)]
        if existing is None:
            upserts.append(self._version_upsert(made, spec, event.index))
        self._store.commit(UnitOfWork(upserts=upserts, appends=[event]))
        return made

    def _new_version(self, definition_id: str, version: str) -> DefinitionVersion:
        return DefinitionVersion(
            definition_id=definition_id, version=version, created_at=self._clock.now()
        )

    def get_definition(
        self, definition_id: str, version: str | None = None
    ) -> tuple[DefinitionVersion, JsonValue]:
        """Return a version of a definition and its spec; the current one by default.

        Raises:
            IntegrityFailure: the head or version row is older than the
                definition's record stream says, or missing although the
                stream records it and no delete.
            NotFound: no such definition or version.

        """
        _check_definition_id(definition_id)
        if version is None:
            version = self._head(definition_id)[0]
        return self._version(definition_id, _check_version(version))

    def definition_versions(self, definition_id: str) -> list[DefinitionVersion]:
        """Return every stored version of a definition, oldest first.

        Each row is checked against the definition's record stream; a row
        deleted while it is listed is skipped.
        """
        _check_definition_id(definition_id)
        self._head(definition_id)
        stream = self._definition_stream(definition_id)
        found = []
        for metadata in self._list_all(GRAPH_DEFINITION_VERSIONS, self._versions_of(definition_id)):
            listed = self._open_row(metadata)
            opened = (
                None
                if listed is None
                else self._fresh_definition.check_listed(
                    self._store, stream, listed, partial(self._open_row, metadata)
                )
            )
            if opened is not None:
                found.append(_definition_version(opened, definition_id)[0])
        return sorted(found, key=lambda item: (item.created_at, item.version))

    def delete_definition(self, definition_id: str) -> int:
        """Delete a definition's head and every version in one unit; return the versions removed.

        The unit appends ``definition.deleted`` to the definition's record
        stream, naming the deleted rows, so their absence is legitimate.

        Raises:
            DefinitionReferenced: any stored run references any version.
            NotFound: no such definition.

        """
        _check_definition_id(definition_id)
        digest = self._definition_digest(definition_id)
        for _ in range(RUN_RETRIES):
            revision = self._head(definition_id)[1]
            if self._referenced("definition", digest):
                raise DefinitionReferenced(
                    "runs still reference this definition", definition_id=definition_id
                )
            versions = list(
                self._list_all(GRAPH_DEFINITION_VERSIONS, self._versions_of(definition_id))
            )
            deletes = [Delete(GRAPH_DEFINITIONS, digest, revision)]
            deletes += [Delete(meta.namespace, meta.key_digest, meta.revision) for meta in versions]
            gone: list[JsonValue] = [delete.key_digest for delete in deletes]
            event = self._definition_event(
                definition_id, "definition.deleted", {DELETED_FIELD: gone}
            )
            try:
                self._store.commit(UnitOfWork(deletes=deletes, appends=[event]))
            except RevisionConflict:
                continue
            compact_after_commit(self._repo.capabilities.compactor)
            return len(versions)
        raise RevisionConflict("definition kept changing; retry", definition_id=definition_id)

    def _head(self, definition_id: str) -> tuple[str, int]:
        opened = self._head_row(definition_id)
        if opened is None:
            raise NotFound("no such definition", definition_id=definition_id)
        return _head_version(opened, definition_id), opened.revision

    def _head_row(self, definition_id: str) -> SealedDocument | None:
        """Read a definition's head; one its record stream vouches for must be there."""
        return self._fresh_definition.read_vouched(
            self._store,
            self._definition_stream(definition_id),
            (GRAPH_DEFINITIONS, self._definition_digest(definition_id)),
            lambda: self._repo.read(GRAPH_DEFINITIONS, definition_id),
        )

    def _version(self, definition_id: str, version: str) -> tuple[DefinitionVersion, JsonValue]:
        opened = self._version_row(definition_id, version)
        if opened is None:
            raise NotFound("no such definition version", definition_id=definition_id)
        return _definition_version(opened, definition_id, version)

    def _version_row(self, definition_id: str, version: str) -> SealedDocument | None:
        """Read a definition version; one its definition's stream vouches for must be there."""
        natural = _joined(definition_id, version)
        return self._fresh_definition.read_vouched(
            self._store,
            self._definition_stream(definition_id),
            (GRAPH_DEFINITION_VERSIONS, self._version_digest(definition_id, version)),
            lambda: self._repo.read(GRAPH_DEFINITION_VERSIONS, natural),
        )

    def _definition_stream(self, definition_id: str) -> str:
        """Name the record stream of a definition's head and versions."""
        return record_stream(DEFINITION_KIND, self._definition_digest(definition_id))

    def _definition_event(
        self, definition_id: str, event_type: str, payload: JsonValue
    ) -> LedgerEvent:
        return record_event(
            self._repo,
            self._definition_stream(definition_id),
            event_type,
            payload,
            self._clock.now(),
        )

    def _digests(self, made: DefinitionVersion) -> tuple[str, str]:
        """Return the key digests of a definition's head and of the version ``made``."""
        return (
            self._definition_digest(made.definition_id),
            self._version_digest(made.definition_id, made.version),
        )

    def _head_upsert(
        self, definition_id: str, current: str, expected: int | Guard, ledger_index: int
    ) -> Upsert:
        """Seal a definition head bound to the record-stream event committed with it."""
        document = {"definition_id": definition_id, "current": current}
        return self._repo.prepare(
            GRAPH_DEFINITIONS, definition_id, document, expected=expected, ledger_index=ledger_index
        )

    def _version_upsert(
        self, made: DefinitionVersion, spec: JsonValue, ledger_index: int
    ) -> Upsert:
        labels: dict[str, LabelValue] = {
            "definition": self._definition_digest(made.definition_id),
            "created_at": _micros(made.created_at),
        }
        return self._repo.prepare(
            GRAPH_DEFINITION_VERSIONS,
            _joined(made.definition_id, made.version),
            {"definition": made.model_dump(mode="json"), "spec": spec},
            expected=Guard.ABSENT,
            labels=labels,
            ledger_index=ledger_index,
        )

    def _definition_digest(self, definition_id: str) -> str:
        return self._repo.key_digest(GRAPH_DEFINITIONS, definition_id)

    def _version_digest(self, definition_id: str, version: str) -> str:
        return self._repo.key_digest(GRAPH_DEFINITION_VERSIONS, _joined(definition_id, version))

    def _versions_of(self, definition_id: str) -> list[LabelFilter]:
        return [LabelFilter("definition", self._definition_digest(definition_id))]

    def _referenced(self, label: str, digest: str) -> bool:
        page = self._store.list(GRAPH_RUNS, filters=[LabelFilter(label, digest)], limit=1)
        return bool(page.items)

    # -- runs -------------------------------------------------------------------

    def start_run(
        self,
        definition_id: str,
        input: JsonValue,
        *,
        budgets: Mapping[str, JsonValue] | None = None,
        version: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[GraphRun, bool]:
        """Accept a run pinned to the current (or given) definition version.

        Returns ``(run, created)``. With ``idempotency_key`` the same request
        again returns the first run and ``False``. The definition head is
        rewritten in the same unit, so a concurrent delete or replacement of
        the definition cannot miss this run's reference; the rewrite appends
        ``definition.referenced`` to the definition's record stream and binds
        the head to it, so the head from before the start cannot come back.

        Raises:
            IdempotencyConflict: the key was used for a different request.
            NotFound: no such definition or version.

        """
        _check_definition_id(definition_id)
        if version is not None:
            _check_version(version)
        request = {
            "definition_id": definition_id,
            "version": version,
            "input": input,
            "budgets": dict(budgets or {}),
        }
        fingerprint = self._repo.keyed_digest(_REQUEST_TAG, canonical_bytes(request))
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
            replayed = self._replay(idempotency_key, fingerprint)
            if replayed is not None:
                return replayed, False
        run_id = self._ids.new_id()
        for _ in range(RUN_RETRIES):
            run, unit = self._start_unit(run_id, request, idempotency_key, fingerprint)
            try:
                self._store.commit(unit)
            except RevisionConflict:
                if idempotency_key is not None:
                    replayed = self._replay(idempotency_key, fingerprint)
                    if replayed is not None:
                        return replayed, False
                continue
            return run, True
        raise RevisionConflict("definition kept changing while the run started; retry")

    def _start_unit(
        self,
        run_id: str,
        request: dict[str, JsonValue],
        idempotency_key: str | None,
        fingerprint: str,
    ) -> tuple[GraphRun, UnitOfWork]:
        definition_id = str(request["definition_id"])
        head = self._head_row(definition_id)
        if head is None:
            raise NotFound("no such definition", definition_id=definition_id)
        current = _head_version(head, definition_id)
        pinned = request["version"]
        if isinstance(pinned, str):
            self._version(definition_id, pinned)
        run = _new_run(
            run_id=run_id,
            definition_id=definition_id,
            definition_version=pinned or current,
            status=RUN_LIFECYCLE.initial,
            input=request["input"],
            budgets=request["budgets"],
            started_at=self._clock.now(),
            idempotency_key_digest=(
                None
                if idempotency_key is None
                else self._repo.key_digest(GRAPH_RUN_IDEMPOTENCY, idempotency_key)
            ),
            revision=1,
        )
        accepted = _Draft(
            "run.accepted", {"definition_version": run.definition_version}, None, run.status
        )
        appends = self._chain(run_id, [accepted], run.started_at)
        referenced = _Draft(
            "definition.referenced",
            record_payload(self._definition_digest(definition_id)),
            None,
            None,
        )
        appends += self._chain_on(
            self._definition_stream(definition_id), [referenced], run.started_at
        )
        upserts = [
            self._run_upsert(run, Guard.ABSENT, appends[0].index),
            self._head_upsert(definition_id, current, head.revision, appends[-1].index),
        ]
        if idempotency_key is not None:
            digest = self._repo.key_digest(GRAPH_RUN_IDEMPOTENCY, idempotency_key)
            stream = record_stream(IDEMPOTENCY_KIND, digest)
            recorded = _Draft("idempotency.recorded", record_payload(digest), None, None)
            appends += self._chain_on(stream, [recorded], run.started_at)
            marker = {"run_id": run_id, "fingerprint": fingerprint}
            upserts.append(
                self._repo.prepare(
                    GRAPH_RUN_IDEMPOTENCY,
                    idempotency_key,
                    marker,
                    expected=Guard.ABSENT,
                    ledger_index=appends[-1].index,
                )
            )
        return run, UnitOfWork(upserts=upserts, appends=appends)

    def _replay(self, idempotency_key: str, fingerprint: str) -> GraphRun | None:
        """Return the run an earlier start with this key made, or ``None`` if there was none.

        Raises:
            IntegrityFailure: the marker was deleted outside flowvault (its
                record stream records it and no purge).

        """
        digest = self._repo.key_digest(GRAPH_RUN_IDEMPOTENCY, idempotency_key)
        marker = self._fresh_marker.read_vouched(
            self._store,
            record_stream(IDEMPOTENCY_KIND, digest),
            (GRAPH_RUN_IDEMPOTENCY, digest),
            lambda: self._repo.read(GRAPH_RUN_IDEMPOTENCY, idempotency_key),
        )
        if marker is None:
            return None
        document = _mapping(marker)
        if document.get("fingerprint") != fingerprint:
            raise IdempotencyConflict("idempotency key was already used for a different run")
        run_id = document.get("run_id")
        if not isinstance(run_id, str):
            raise IntegrityFailure("run idempotency marker has an unexpected shape")
        return self.get_run(run_id)

    def get_run(self, run_id: str) -> GraphRun:
        """Return the run's current record; ``NotFound`` if there is none."""
        return self._load(run_id)

    def _load(self, run_id: str) -> GraphRun:
        """Read the current run, checked against the ``run.*`` events of its stream.

        A run is deleted only by a retention purge, whose tombstone the
        stream then ends with; missing without one, it was deleted outside
        flowvault. A stream that does not begin with a ``run.*`` event held
        events for a run id no run was started under (written before
        checkpoints and approvals checked their run), so there is no record
        to miss.
        """
        row = (GRAPH_RUNS, self._repo.key_digest(GRAPH_RUNS, run_id))
        loaded, _ = self._fresh.read_owned(
            self._store,
            run_stream(run_id),
            row,
            lambda: self._read_row(run_id),
            writer=lambda head: (
                None
                if _never_started(self._store, head) or _purged_run(self._store, head, self._repo)
                else head
            ),
        )
        if loaded is None:
            raise NotFound("no such run", run_id=run_id)
        return loaded.run

    def _read_row(self, run_id: str) -> _LoadedRun | None:
        opened = self._repo.read(GRAPH_RUNS, run_id)
        if opened is None:
            return None
        run = _run(opened)
        if run.run_id != run_id:
            raise IntegrityFailure("run record disagrees with its row", run_id=run_id)
        return _LoadedRun(run, opened.metadata)

    def _run_upsert(self, run: GraphRun, expected: int | Guard, ledger_index: int) -> Upsert:
        """Seal a run bound to the index of the last event committed with it."""
        labels: dict[str, LabelValue] = {
            "status": run.status,
            "definition": self._definition_digest(run.definition_id),
            "version": self._version_digest(run.definition_id, run.definition_version),
            "started_at": _micros(run.started_at),
        }
        if run.finished_at is not None:
            labels["finished_at"] = _micros(run.finished_at)
        return self._repo.prepare(
            GRAPH_RUNS,
            run.run_id,
            {"run": run.model_dump(mode="json")},
            expected=expected,
            labels=labels,
            ledger_index=ledger_index,
        )

    def set_status(
        self,
        run_id: str,
        target: str,
        *,
        expected_status: str,
        node_count: int | None = None,
        failed_attempts: int | None = None,
        payload: Mapping[str, object] | None = None,
    ) -> GraphRun:
        """Move a run to ``target`` if it still has ``expected_status``; record a ``run.*`` event.

        A terminal ``target`` stamps ``finished_at`` and writes the run's
        terminal receipt in the same unit, as ``finish_run`` does, over the
        final state the run already holds; use ``finish_run`` to store one.

        Raises:
            IntegrityKeyRequired: ``target`` is terminal and the service has
                no integrity key.
            RevisionConflict: the run has another status (both named).
            InvalidTransition: the run lifecycle forbids the move.
            NotFound: no such run.

        """
        _check_status(expected_status)
        for _ in range(RUN_RETRIES):
            current = self._load(run_id)
            _check_expected(current, expected_status)
            RUN_LIFECYCLE.assert_transition(current.status, target)
            ending = target in RUN_LIFECYCLE.terminal
            integrity = require_integrity(self._integrity) if ending else None
            now = self._clock.now()
            changes: dict[str, object] = {"status": target, "revision": current.revision + 1}
            if node_count is not None:
                changes["node_count"] = node_count
            if failed_attempts is not None:
                changes["failed_attempts"] = failed_attempts
            if ending:
                changes["finished_at"] = now
            updated = _changed_run(current, changes)
            detail: dict[str, JsonValue] = {"detail": sanitise_payload(payload or {})}
            if integrity is not None:
                unit = self._ending(integrity, current, updated, [], detail=detail, now=now)[1]
            else:
                moved = _Draft(
                    f"run.{target}", _status_payload(updated, detail), current.status, target
                )
                appends = self._chain(run_id, [moved], now)
                unit = UnitOfWork(
                    upserts=[self._run_upsert(updated, current.revision, appends[-1].index)],
                    appends=appends,
                )
            if self._commit_or_retry(unit, run_id, expected_status):
                return updated
        raise RevisionConflict("run ledger kept moving; retry", run_id=run_id)

    def _commit_or_retry(self, unit: UnitOfWork, run_id: str, expected_status: str) -> bool:
        """Commit; ``False`` when only the ledger head moved, so the caller rebuilds."""
        try:
            self._store.commit(unit)
        except RevisionConflict as conflict:
            if _ledger_only(conflict):
                return False
            _check_expected(self._load(run_id), expected_status)
            raise
        return True

    def list_runs(
        self, status: str | None = None, *, cursor: str | None = None, limit: int = 50
    ) -> Page[GraphRun]:
        """Return one page of runs, optionally of one status.

        Most recently written first (ties by key digest), at most ``limit``
        (capped at 200); pass ``next_cursor`` back for the next page. A run
        deleted while it is listed is skipped; one whose row does not verify,
        names another run or is older than its stream says is reported in
        ``unreadable`` by key digest, and the rest are listed.

        Raises:
            InvalidInput: an unknown status, a limit below 1, or a cursor that
                is malformed or was issued for another listing or status.

        """
        filters = [] if status is None else [LabelFilter("status", _check_status(status))]
        scope = PageScope(GRAPH_RUNS, () if status is None else (status,))
        return read_page(
            self._store,
            scope,
            GRAPH_RUNS,
            filters,
            lambda metadata: self._checked(self._listed_run(metadata)),
            cursor=cursor,
            limit=limit,
        )

    def _checked(self, listed: _LoadedRun | None) -> GraphRun | None:
        """Check a listed run against its stream, reading it again only if it looked stale."""
        if listed is None:
            return None
        run_id = listed.run.run_id
        loaded = self._fresh.check_listed(
            self._store, run_stream(run_id), listed, lambda: self._read_row(run_id)
        )
        return None if loaded is None else loaded.run

    def _listed_run(self, metadata: RecordMetadata) -> _LoadedRun | None:
        """Open a listed run, or ``None`` if it vanished since the listing."""
        record = self._store.load(metadata.namespace, metadata.key_digest)
        if record is None:
            return None
        run = _run(
            self._repo.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)
        )
        if self._repo.key_digest(GRAPH_RUNS, run.run_id) != metadata.key_digest:
            raise IntegrityFailure("run record names another run than its row")
        return _LoadedRun(run, metadata)

    def recover_incomplete_runs(self) -> int:
        """Mark every accepted or running run interrupted; return how many were marked.

        For a host starting up: no worker of its own can still be executing
        those runs. Each run moves through ``set_status``, so each gets its
        event and its terminal receipt in one unit; a run that moved on
        meanwhile is left alone.

        Raises:
            IntegrityKeyRequired: a run is to be ended and the service has no
                integrity key to write its receipt with.

        """
        return sum(self._recover(status) for status in ("accepted", "running"))

    def _recover(self, status: str) -> int:
        recovered = stalled = 0
        while stalled < RUN_RETRIES:
            page = self._store.list(
                GRAPH_RUNS, filters=[LabelFilter("status", status)], limit=RECOVERY_BATCH
            )
            if not page.items:
                break
            marked = 0
            for run in filter(None, map(self._checked, map(self._listed_run, page.items))):
                try:
                    self.set_status(
                        run.run_id,
                        INTERRUPTED,
                        expected_status=status,
                        payload={"reason": "recovered_at_startup"},
                    )
                except RevisionConflict:
                    continue
                marked += 1
            recovered += marked
            stalled = 0 if marked else stalled + 1
        return recovered

    # -- run events -------------------------------------------------------------

    def append_run_events(
        self, run_id: str, events: Sequence[tuple[str, object]]
    ) -> list[LedgerEvent]:
        """Append caller events (payloads sanitised) to an unfinished run's stream.

        Raises:
            InvalidInput: a reserved or malformed type, or too many events.
            InvalidTransition: the run has finished.
            NotFound: no such run.

        """
        for _ in range(RUN_RETRIES):
            run = self._load(run_id)
            if run.finished:
                raise InvalidTransition(
                    "a finished run takes no more events", current=run.status, target=run.status
                )
            appended = self._chain(run_id, _caller_drafts(events, run.status), self._clock.now())
            if not appended:
                return []
            try:
                self._store.commit(UnitOfWork(appends=appended))
            except RevisionConflict as conflict:
                if _ledger_only(conflict):
                    continue
                raise
            return appended
        raise RevisionConflict("run ledger kept moving; retry", run_id=run_id)

    def read_run_events(
        self, run_id: str, cursor: int | None = None, limit: int = RUN_EVENT_PAGE
    ) -> RunEventPage:
        """Return up to ``limit`` (at most 200) events from index ``cursor`` on.

        ``gap`` is true when events from ``cursor`` on were trimmed, so the
        page starts at the first retained event. Works after a run is purged,
        since its stream, tombstone included, stays. Each page is verified
        under the key against the event before it, so paging costs what it
        reads, never the whole stream again.

        Raises:
            IntegrityFailure: the page or its link to the event before it
                fails verification; ``details`` name the first bad index.
            NotFound: no such run.

        """
        start = 0 if cursor is None else cursor
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InvalidInput("cursor must be a non-negative event index")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be a positive integer")
        stream = run_stream(run_id)
        page = verified_page(
            self._store, stream, self._repo, from_index=start, limit=min(limit, RUN_EVENT_PAGE)
        )
        if not page.events and self._store.ledger_head(stream) is None:
            raise NotFound("no such run", run_id=run_id)
        return RunEventPage(events=page.events, next_cursor=page.next_index, gap=page.gap)

    def _chain(
        self, run_id: str, drafts: Sequence[_Draft], occurred_at: datetime
    ) -> list[LedgerEvent]:
        """Build consecutive events onto the run stream's current head."""
        return self._chain_on(run_stream(run_id), drafts, occurred_at)

    def _chain_on(
        self, stream: str, drafts: Sequence[_Draft], occurred_at: datetime
    ) -> list[LedgerEvent]:
        """Build consecutive events onto ``stream``'s current head."""
        index, previous = next_position(self._store, stream)
        chained = []
        for draft in drafts:
            draft_event = LedgerEvent.create(
                stream=stream,
                index=index,
                type=draft.type,
                occurred_at=occurred_at,
                payload=draft.payload,
                previous_hash=previous,
                from_state=draft.from_state,
                to_state=draft.to_state,
            )
            event = keyed(draft_event, self._repo)
            chained.append(event)
            index, previous = index + 1, event.event_hash
        return chained

    # -- terminal receipts ------------------------------------------------------

    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        expected_status: str,
        final_state: JsonValue,
        events: Sequence[tuple[str, object]] = (),
    ) -> TerminalReceipt:
        """End a run: status, final state, final events and a signed receipt in one unit.

        The receipt's ``events_digest`` covers the hashes of the events this
        call appends (the caller's, then ``run.<status>``), whose last hash
        commits to the run's whole chain. The ``run.<status>`` event names the
        receipt's key digest in ``records`` and the receipt's row names that
        event, so a receipt deleted outside flowvault is refused, not read as
        never issued. With a signer, the receipt also carries its Ed25519
        signature.

        Raises:
            IntegrityKeyRequired: the service has no integrity key.
            InvalidInput: ``status`` is not terminal.
            RevisionConflict / InvalidTransition / NotFound: as ``set_status``.

        """
        integrity = require_integrity(self._integrity)
        if not isinstance(status, str) or status not in RUN_LIFECYCLE.terminal:
            raise InvalidInput("finish_run needs a terminal status; use set_status otherwise")
        _check_status(expected_status)
        for _ in range(RUN_RETRIES):
            current = self._load(run_id)
            _check_expected(current, expected_status)
            RUN_LIFECYCLE.assert_transition(current.status, status)
            now = self._clock.now()
            updated = _changed_run(
                current,
                {
                    "status": status,
                    "finished_at": now,
                    "final_state": final_state,
                    "revision": current.revision + 1,
                },
            )
            drafts = _caller_drafts(events, current.status)
            receipt, unit = self._ending(integrity, current, updated, drafts, detail={}, now=now)
            if self._commit_or_retry(unit, run_id, expected_status):
                return receipt
        raise RevisionConflict("run ledger kept moving; retry", run_id=run_id)

    def _ending(
        self,
        integrity: KeyedDigester,
        current: GraphRun,
        updated: GraphRun,
        drafts: Sequence[_Draft],
        *,
        detail: dict[str, JsonValue],
        now: datetime,
    ) -> tuple[TerminalReceipt, UnitOfWork]:
        """Build the unit ending a run: the drafts, ``run.<status>``, the run and its receipt."""
        run_id, status = updated.run_id, updated.status
        final_digest = integrity.keyed_digest(
            _FINAL_STATE_TAG, canonical_bytes(updated.final_state)
        )
        receipt_digest = self._repo.key_digest(GRAPH_RUN_RECEIPTS, run_id)
        ended = _Draft(
            f"run.{status}",
            _status_payload(
                updated,
                {**detail, **record_payload(receipt_digest, final_state_digest=final_digest)},
            ),
            current.status,
            status,
        )
        appended = self._chain(run_id, [*drafts, ended], now)
        receipt = self._signed(integrity, updated, final_digest, appended, now)
        unit = UnitOfWork(
            upserts=[
                self._run_upsert(updated, current.revision, appended[-1].index),
                self._repo.prepare(
                    GRAPH_RUN_RECEIPTS,
                    run_id,
                    receipt.model_dump(mode="json", exclude_none=True),
                    expected=Guard.ABSENT,
                    ledger_index=appended[-1].index,
                ),
            ],
            appends=appended,
        )
        return receipt, unit

    def _signed(
        self,
        integrity: KeyedDigester,
        run: GraphRun,
        final_digest: str,
        appended: Sequence[LedgerEvent],
        issued_at: datetime,
    ) -> TerminalReceipt:
        draft = TerminalReceipt(
            issued_at=issued_at,
            run=self._repo.key_digest(GRAPH_RUNS, run.run_id),
            status=run.status,
            definition_version=run.definition_version,
            final_state_digest=final_digest,
            events_digest=content_hash([event.event_hash for event in appended]),
            event_count=len(appended),
            signature=_UNSIGNED,
        )
        if self._signer is not None:
            draft = sign_terminal_receipt(draft, self._signer)
        return draft.model_copy(update={"signature": _signature(integrity, draft)})

    def terminal_receipt(self, run_id: str) -> TerminalReceipt:
        """Return a finished run's receipt after checking its signature and its run.

        Raises:
            IntegrityKeyRequired: the service has no integrity key.
            IntegrityFailure: the signature or the run digest does not verify,
                the row names another event than the run's stream says wrote
                it, or it is missing although that event records it.
            NotFound: the run has no receipt.

        """
        integrity = require_integrity(self._integrity)
        digest = self._repo.key_digest(GRAPH_RUN_RECEIPTS, run_id)
        opened = self._fresh_receipt.read_vouched(
            self._store,
            run_stream(run_id),
            (GRAPH_RUN_RECEIPTS, digest),
            lambda: self._repo.read(GRAPH_RUN_RECEIPTS, run_id),
        )
        if opened is None:
            raise NotFound("run has no terminal receipt", run_id=run_id)
        try:
            receipt = TerminalReceipt.model_validate(opened.document)
        except InvalidInput:
            raise IntegrityFailure("sealed terminal receipt has an unexpected shape") from None
        if not hmac.compare_digest(_signature(integrity, receipt), receipt.signature):
            raise IntegrityFailure("terminal receipt signature does not verify", run_id=run_id)
        if receipt.run != self._repo.key_digest(GRAPH_RUNS, run_id):
            raise IntegrityFailure("terminal receipt names another run", run_id=run_id)
        return receipt

    # -- retention --------------------------------------------------------------

    def purge_finished_runs(
        self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH
    ) -> int:
        """Delete runs that finished before ``now - older_than``, in bounded batches.

        Each batch is one unit: the run records, their idempotency markers
        and, in each run's own stream, a digest-only ``RETENTION_TOMBSTONE``.
        The streams stay, so they still verify; receipts stay as proof.
        """
        if type(batch_size) is not int or not 1 <= batch_size <= MAX_LIST_LIMIT:
            raise InvalidInput(f"batch_size must be between 1 and {MAX_LIST_LIMIT}")
        horizon = purge_horizon(now, older_than)
        purged = stalled = 0
        while stalled < RUN_RETRIES:
            page = self._store.list(
                GRAPH_RUNS,
                filters=[LabelFilter("finished_at", horizon, FilterOp.LT)],
                limit=batch_size,
            )
            if not page.items:
                break
            unit, count = self._purge_unit(page.items)
            try:
                self._store.commit(unit)
            except RevisionConflict:
                stalled += 1
                continue
            purged += count
        if purged:
            compact_after_commit(self._repo.capabilities.compactor)
        return purged

    def _purge_unit(self, listed: Sequence[RecordMetadata]) -> tuple[UnitOfWork, int]:
        deletes: list[Delete] = []
        appends: list[LedgerEvent] = []
        now = self._clock.now()
        for metadata in listed:
            loaded = self._listed_run(metadata)
            run = None if loaded is None else loaded.run
            if run is None or run.finished_at is None:
                continue
            payload: dict[str, JsonValue] = {
                "kind": "run",
                "run": metadata.key_digest,
                "payload_digest": metadata.payload_digest,
                "finished_at": format_instant(run.finished_at),
            }
            deletes.append(Delete(GRAPH_RUNS, metadata.key_digest, metadata.revision))
            tombstone = _Draft(RETENTION_TOMBSTONE, payload, None, None)
            if run.idempotency_key_digest is not None:
                payload["idempotency_marker"] = run.idempotency_key_digest
                deletes.append(Delete(GRAPH_RUN_IDEMPOTENCY, run.idempotency_key_digest, Guard.ANY))
                marker_stream = record_stream(IDEMPOTENCY_KIND, run.idempotency_key_digest)
                appends += self._chain_on(marker_stream, [tombstone], now)
            appends += self._chain(run.run_id, [tombstone], now)
        count = sum(delete.namespace == GRAPH_RUNS for delete in deletes)
        return UnitOfWork(deletes=deletes, appends=appends), count

    # -- shared -----------------------------------------------------------------

    def _list_all(self, namespace: str, filters: list[LabelFilter]) -> Iterator[RecordMetadata]:
        cursor: str | None = None
        while True:
            page = self._store.list(namespace, filters=filters, cursor=cursor, limit=MAX_LIST_LIMIT)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def _open_row(self, metadata: RecordMetadata) -> SealedDocument | None:
        """Open a listed row, or ``None`` if it vanished since the listing."""
        record = self._store.load(metadata.namespace, metadata.key_digest)
        if record is None:
            return None
        return self._repo.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)

    def compact(self) -> bool:
        """Ask the store to drop stale copies of deleted bytes, if it can."""
        compactor = self._repo.capabilities.compactor
        return True if compactor is None else compactor.compact()


def _signature(integrity: KeyedDigester, receipt: TerminalReceipt) -> str:
    return integrity.keyed_digest(_RECEIPT_TAG, canonical_bytes(receipt.unsigned_body()))


def _status_payload(run: GraphRun, extra: dict[str, JsonValue]) -> JsonValue:
    return {"node_count": run.node_count, "failed_attempts": run.failed_attempts, **extra}


def _caller_drafts(events: Sequence[tuple[str, object]], status: str) -> list[_Draft]:
    if len(events) > MAX_EVENT_BATCH:
        raise InvalidInput(f"at most {MAX_EVENT_BATCH} events per call")
    drafts = []
    for event_type, payload in events:
        if not isinstance(event_type, str) or event_type.startswith(RESERVED_EVENT_PREFIXES):
            raise InvalidInput("event types must be text outside the run.* and retention.* names")
        drafts.append(_Draft(event_type, sanitise_payload(payload), status, status))
    return drafts


def _check_definition_id(definition_id: object) -> str:
    if not isinstance(definition_id, str) or not DEFINITION_ID_PATTERN.fullmatch(definition_id):
        raise InvalidInput("a definition id is 1-64 of [a-z0-9_.-], starting with a letter")
    return definition_id


def _check_version(version: object) -> str:
    if not isinstance(version, str) or not DIGEST_PATTERN.fullmatch(version):
        raise InvalidInput("a definition version is a sha256:<64 hex> content hash")
    return version


def _check_status(status: object) -> str:
    if not isinstance(status, str) or status not in RUN_LIFECYCLE.states:
        raise InvalidInput("not a run_lifecycle status")
    return status


def _check_idempotency_key(key: object) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
        raise InvalidInput(f"an idempotency key is 1-{MAX_IDEMPOTENCY_KEY} characters")


def _check_expected(run: GraphRun, expected_status: str) -> None:
    if run.status != expected_status:
        raise RevisionConflict(
            f"stale run: expected status {expected_status!r}, actual {run.status!r}",
            run_id=run.run_id,
            expected_status=expected_status,
            actual_status=run.status,
        )


def _mapping(opened: SealedDocument) -> dict[str, JsonValue]:
    if not isinstance(opened.document, dict):
        raise IntegrityFailure(
            "sealed document has an unexpected shape", key_digest=opened.metadata.key_digest
        )
    return opened.document


def _head_version(opened: SealedDocument, definition_id: str) -> str:
    document = _mapping(opened)
    current = document.get("current")
    if document.get("definition_id") != definition_id or not isinstance(current, str):
        raise IntegrityFailure("definition head disagrees with its row")
    return current


def _definition_version(
    opened: SealedDocument, definition_id: str, version: str | None = None
) -> tuple[DefinitionVersion, JsonValue]:
    document = _mapping(opened)
    try:
        made = DefinitionVersion.model_validate(document.get("definition"))
    except InvalidInput:
        raise IntegrityFailure("sealed definition version has an unexpected shape") from None
    spec = document.get("spec")
    if made.definition_id != definition_id or made.version != (version or made.version):
        raise IntegrityFailure("definition version disagrees with its row")
    if content_hash(spec) != made.version:
        raise IntegrityFailure("definition spec does not match its version hash")
    return made, spec


def _run(opened: SealedDocument) -> GraphRun:
    try:
        run = GraphRun.model_validate(_mapping(opened).get("run"))
    except InvalidInput:
        raise IntegrityFailure("sealed run has an unexpected shape") from None
    if run.revision != opened.revision:
        raise IntegrityFailure("run record disagrees with its row revision")
    return run


def _new_run(**fields: object) -> GraphRun:
    """Build a run from caller values, as a typed error that names fields but not values."""
    return GraphRun.model_validate(fields)


def _changed_run(run: GraphRun, changes: Mapping[str, object]) -> GraphRun:
    return _new_run(**{**run.model_dump(), **changes})
