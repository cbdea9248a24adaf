"""The graph run service: the CAS run lifecycle and each run's event stream.

Built only on the sealed repository and the store port, so it behaves the
same on every adapter. Every mutation is one unit of work: a run's record,
its events in ``run_stream(run_id)``, its idempotency marker and, when it
ends, its terminal receipt commit together or not at all. Every move to a
terminal status, whichever call makes it, writes the run's terminal receipt
in that unit. Definitions are the ``DefinitionRegistry``'s and receipts the
``TerminalReceipts``'; this service reaches both through their public methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from flowvault.application._backoff import LOST, Lost, ledger_head_moved, settle
from flowvault.application._cursor import LIMIT_FIX
from flowvault.application._definitions import (
    DefinitionRegistry,
    check_definition_id,
    check_version,
)
from flowvault.application._freshness import (
    IDEMPOTENCY_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_payload,
    record_stream,
)
from flowvault.application._graph_namespaces import (
    GRAPH_RUN_IDEMPOTENCY,
    GRAPH_RUNS,
    definition_digest,
    version_digest,
)
from flowvault.application._instants import micros
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    Guard,
    LabelFilter,
    LabelValue,
    UnitOfWork,
    Upsert,
)
from flowvault.application._run_records import (
    LoadedRun,
    open_listed_run,
    sealed_mapping,
    sealed_run,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import (
    MAINTENANCE_EVENTS,
    keyed,
    mac_matches,
    newest_first,
    next_position,
    run_stream,
)
from flowvault.application._terminal_receipts import TerminalReceipts
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application._verified import verified_page
from flowvault.application.ports import Clock, IdFactory, SecureObjectStore
from flowvault.domain import (
    FlowvaultError,
    GraphRun,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    RunFenced,
    TerminalReceipt,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._graph_runs import HOST_ID_PATTERN, LEASED_STATUSES, RUN_LIFECYCLE
from flowvault.domain._sanitise import sanitise_payload

RUN_EVENT_PAGE = MAX_LIST_LIMIT
"""Most events one ``read_run_events`` page returns."""
MAX_EVENT_BATCH = 200
"""Most caller events one append or finish may carry, so every unit stays bounded."""
RECOVERY_BATCH = 100
MAX_IDEMPOTENCY_KEY = 256

INTERRUPTED = "interrupted_non_resumable"
LEASE_RENEWED = "run.lease_renewed"
"""The event a renewal commits with, so the renewed record is bound to its stream."""
DEFAULT_RUN_LEASE = timedelta(seconds=30)
"""How long a host holds a run it executes without writing to it or renewing."""
MIN_RUN_LEASE = timedelta(seconds=1)
MAX_RUN_LEASE = timedelta(hours=1)
_OWNER_TAG = "flowvault.run-owner/1"
RESERVED_EVENT_PREFIXES = ("run.", "retention.")
"""Event types only the service writes, so a caller cannot forge a status change."""

_REQUEST_TAG = "flowvault.run-request/1"


@dataclass(frozen=True, slots=True)
class RunEventPage:
    """One page of a run's events; ``gap`` means events before the cursor were trimmed."""

    events: tuple[LedgerEvent, ...]
    next_cursor: int | None
    gap: bool




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


@dataclass(frozen=True, slots=True)
class _Draft:
    """An event before its position in the stream is known."""

    type: str
    payload: JsonValue
    from_state: str | None
    to_state: str | None


class RunService:
    """Start runs, move them through their lifecycle and keep each run's event stream.

    ``definitions`` pins the version each run starts on; ``receipts`` writes
    the terminal receipt every ending commits with. With ``host_id``, every
    run this service starts or moves to ``running`` is owned by that host
    under a lease of ``lease`` that each of its writes renews; another
    host's write to it is refused (``RunFenced``), and recovery takes over
    only runs whose lease expired. Without one, runs are written unowned,
    as before leases existed, and recovery takes them over at once.
    """

    def __init__(
        self,
        repository: SealedRepository,
        clock: Clock,
        ids: IdFactory,
        *,
        definitions: DefinitionRegistry,
        receipts: TerminalReceipts,
        host_id: str | None = None,
        lease: timedelta = DEFAULT_RUN_LEASE,
    ) -> None:
        if host_id is not None:
            _check_host_id(host_id)
        if not isinstance(lease, timedelta) or not MIN_RUN_LEASE <= lease <= MAX_RUN_LEASE:
            raise InvalidInput("a run lease lasts from 1 second to 1 hour")
        self._host = host_id
        self._lease = lease
        self._held: set[str] = set()
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._ids = ids
        self._definitions = definitions
        self._receipts = receipts
        self._fresh = StreamPolicy[LoadedRun](
            "run record",
            repository,
            leaves_record=_leaves_run,
        )
        self._fresh_marker = StreamPolicy[SealedDocument](
            "run idempotency marker", repository, leaves_record=leaves_unnamed
        )

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository runs live in."""
        return self._repo

    @property
    def host_id(self) -> str | None:
        """The host this service writes runs as; ``None`` writes them unowned."""
        return self._host

    def owner_digest(self, owner: str) -> str:
        """Return the keyed digest naming host ``owner`` in labels and events, not the id in clear.

        Raises:
            InvalidInput: ``owner`` is not a host id.

        """
        return self._repo.keyed_digest(_OWNER_TAG, _check_host_id(owner))

    def _lease_now(self) -> datetime:
        """Return the time leases are judged by: the store's clock, else the host's."""
        store_clock = self._repo.capabilities.clock
        return self._clock.now() if store_clock is None else store_clock.store_now()

    def _lease_fields(self, status: str) -> dict[str, object]:
        """Hold a fresh lease on a run this host executes; release it once it pauses or ends."""
        if self._host is None or status not in LEASED_STATUSES:
            return {"owner": None, "lease_expires_at": None}
        return {"owner": self._host, "lease_expires_at": self._lease_now() + self._lease}

    def _track(self, run: GraphRun) -> GraphRun:
        """Remember whether this service holds ``run``'s lease, so only its keeper renews it.

        Kept in memory, not read from the owner label: a process restarted
        under a fixed host id must let its predecessor's leases lapse.
        """
        if self._host is not None and run.owner == self._host and run.status in LEASED_STATUSES:
            self._held.add(run.run_id)
        else:
            self._held.discard(run.run_id)
        return run

    def _check_owner(self, run: GraphRun) -> None:
        """Refuse a write to a run another host holds or took over: merging it would undo theirs."""
        if run.owner is not None and run.owner != self._host:
            raise RunFenced(
                "run is held by another host: its lease was taken over, or another host is "
                "executing it; stop working on it",
                run_id=run.run_id,
                status=run.status,
                owner=self.owner_digest(run.owner),
            )

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
        check_definition_id(definition_id)
        if version is not None:
            check_version(version)
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

        def attempt() -> tuple[GraphRun, bool] | Lost:
            run, unit = self._start_unit(run_id, request, idempotency_key, fingerprint)
            try:
                self._store.commit(unit)
            except RevisionConflict:
                replayed = None
                if idempotency_key is not None:
                    replayed = self._replay(idempotency_key, fingerprint)
                return LOST if replayed is None else (replayed, False)
            return self._track(run), True

        return settle(attempt, "definition", definition_id=definition_id)

    def _start_unit(
        self,
        run_id: str,
        request: dict[str, JsonValue],
        idempotency_key: str | None,
        fingerprint: str,
    ) -> tuple[GraphRun, UnitOfWork]:
        definition_id = str(request["definition_id"])
        pinned = request["version"]
        started_at = self._clock.now()
        reference = self._definitions.reference(
            definition_id, pinned if isinstance(pinned, str) else None, started_at
        )
        run = _new_run(
            run_id=run_id,
            definition_id=definition_id,
            definition_version=reference.version,
            status=RUN_LIFECYCLE.initial,
            input=request["input"],
            budgets=request["budgets"],
            started_at=started_at,
            idempotency_key_digest=(
                None
                if idempotency_key is None
                else self._repo.key_digest(GRAPH_RUN_IDEMPOTENCY, idempotency_key)
            ),
            revision=1,
            **self._lease_fields(RUN_LIFECYCLE.initial),
        )
        accepted = _Draft(
            "run.accepted", {"definition_version": run.definition_version}, None, run.status
        )
        appends = [*self._chain(run_id, [accepted], run.started_at), reference.event]
        upserts = [self._run_upsert(run, Guard.ABSENT, appends[0].index), reference.head]
        if idempotency_key is not None:
            marker = self._marker(idempotency_key, run_id, fingerprint, run.started_at)
            appends.append(marker[0])
            upserts.append(marker[1])
        return run, UnitOfWork(upserts=upserts, appends=appends)

    def _marker(
        self, idempotency_key: str, run_id: str, fingerprint: str, at: datetime
    ) -> tuple[LedgerEvent, Upsert]:
        """Build a start's idempotency marker, bound to the event its record stream gets."""
        digest = self._repo.key_digest(GRAPH_RUN_IDEMPOTENCY, idempotency_key)
        stream = record_stream(IDEMPOTENCY_KIND, digest)
        recorded = _Draft("idempotency.recorded", record_payload(digest), None, None)
        event = self._chain_on(stream, [recorded], at)[0]
        upsert = self._repo.prepare(
            GRAPH_RUN_IDEMPOTENCY,
            idempotency_key,
            {"run_id": run_id, "fingerprint": fingerprint},
            expected=Guard.ABSENT,
            ledger_index=event.index,
        )
        return event, upsert

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
        document = sealed_mapping(marker)
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
        flowvault.
        """
        row = (GRAPH_RUNS, self._repo.key_digest(GRAPH_RUNS, run_id))
        loaded, _ = self._fresh.read_owned(
            self._store,
            run_stream(run_id),
            row,
            lambda: self._read_row(run_id),
            writer=lambda head: None if _purged_run(self._store, head, self._repo) else head,
        )
        if loaded is None:
            raise NotFound("no such run", run_id=run_id)
        return loaded.run

    def _read_row(self, run_id: str) -> LoadedRun | None:
        opened = self._repo.read(GRAPH_RUNS, run_id)
        if opened is None:
            return None
        run = sealed_run(opened)
        if run.run_id != run_id:
            raise IntegrityFailure("run record disagrees with its row", run_id=run_id)
        return LoadedRun(run, opened.metadata)

    def _run_upsert(self, run: GraphRun, expected: int | Guard, ledger_index: int) -> Upsert:
        """Seal a run bound to the index of the last event committed with it."""
        labels: dict[str, LabelValue] = {
            "status": run.status,
            "definition": definition_digest(self._repo, run.definition_id),
            "version": version_digest(self._repo, run.definition_id, run.definition_version),
            "started_at": micros(run.started_at),
        }
        if run.finished_at is not None:
            labels["finished_at"] = micros(run.finished_at)
        if run.owner is not None:
            labels["owner"] = self.owner_digest(run.owner)
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
        Moving to ``running`` takes (or renews) this host's lease; pausing or
        ending releases it. Moving an ``accepted`` run to ``running`` claims
        it whichever host started it, so a starter can hand runs to workers.

        Raises:
            RunFenced: another host holds the run or took it over.
            RevisionConflict: the run has another status (both named).
            InvalidTransition: the run lifecycle forbids the move.
            NotFound: no such run.

        """
        _check_status(expected_status)
        counts = {"node_count": node_count, "failed_attempts": failed_attempts}

        def attempt() -> GraphRun | Lost:
            current = self._load(run_id)
            if (current.status, target) != ("accepted", "running"):
                self._check_owner(current)
            _check_expected(current, expected_status)
            RUN_LIFECYCLE.assert_transition(current.status, target)
            now = self._clock.now()
            detail: dict[str, JsonValue] = {"detail": sanitise_payload(payload or {})}
            changes: dict[str, object] = {"status": target, "revision": current.revision + 1}
            changes.update({name: value for name, value in counts.items() if value is not None})
            changes.update(self._lease_fields(target))
            if target in RUN_LIFECYCLE.terminal:
                changes["finished_at"] = now
                updated = _changed_run(current, changes)
                unit = self._ending(current, updated, [], detail=detail, now=now)[1]
            else:
                updated = _changed_run(current, changes)
                unit = self._moving(current, updated, detail, now)
            if not self._committed(unit, run_id, expected_status):
                return LOST
            return self._track(updated)

        return settle(attempt, "run ledger", run_id=run_id)

    def _moving(
        self, current: GraphRun, updated: GraphRun, detail: dict[str, JsonValue], now: datetime
    ) -> UnitOfWork:
        """Build the unit of a move that does not end the run: its event and the run."""
        moved = _Draft(
            f"run.{updated.status}",
            _status_payload(updated, detail),
            current.status,
            updated.status,
        )
        appends = self._chain(updated.run_id, [moved], now)
        return UnitOfWork(
            upserts=[self._run_upsert(updated, current.revision, appends[-1].index)],
            appends=appends,
        )

    def _committed(self, unit: UnitOfWork, run_id: str, expected_status: str) -> bool:
        """Commit; ``False`` when only the ledger head moved, so the caller rebuilds."""
        try:
            self._store.commit(unit)
        except RevisionConflict as conflict:
            if ledger_head_moved(conflict):
                return False
            reloaded = self._load(run_id)
            self._check_owner(reloaded)
            _check_expected(reloaded, expected_status)
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
            lambda metadata: self._checked(open_listed_run(self._repo, metadata)),
            cursor=cursor,
            limit=limit,
        )

    def _checked(self, listed: LoadedRun | None) -> GraphRun | None:
        """Check a listed run against its stream, reading it again only if it looked stale."""
        if listed is None:
            return None
        run_id = listed.run.run_id
        loaded = self._fresh.check_listed(
            self._store, run_stream(run_id), listed, lambda: self._read_row(run_id)
        )
        return None if loaded is None else loaded.run

    def recover_incomplete_runs(self) -> int:
        """Take over every accepted or running run whose lease expired; return how many.

        Each such run ends ``interrupted_non_resumable`` through the same
        unit as any ending (its event, naming the previous owner by digest,
        and its terminal receipt) and records this host as its owner, so the
        host that lost it is fenced (``RUN_FENCED``; after a recovery by a
        service without a host id, its writes fail as writes to an ended run,
        ``INVALID_TRANSITION``). A run whose owner still holds its lease
        (judged by the store's clock where it has one), one that moved on
        meanwhile, and paused runs are left alone. Runs written without an
        owner hold no lease and are taken over at once.
        """
        return sum(self._recover(status) for status in ("accepted", "running"))

    def _recover(self, status: str) -> int:
        """Take over the expired runs of ``status``, paging by key past the live ones.

        A run listed with a live lease is passed over unread: a listed row
        older than its stream can only show an earlier expiry, never a later
        one, and nothing is written for it. One that looks expired is read
        fresh, checked against its stream, and judged again before the
        takeover.
        """
        recovered, cursor = 0, None
        while True:
            page = self._store.list(
                GRAPH_RUNS,
                filters=[LabelFilter("status", status)],
                cursor=cursor,
                limit=RECOVERY_BATCH,
            )
            listed = (open_listed_run(self._repo, metadata) for metadata in page.items)
            now = self._lease_now()
            recovered += sum(
                self._take_over(loaded.run.run_id, status)
                for loaded in filter(None, listed)
                if not loaded.run.lease_live(now)
            )
            cursor = page.next_cursor
            if cursor is None:
                return recovered

    def _take_over(self, run_id: str, status: str) -> bool:
        """End one run interrupted if its lease expired; ``False`` if it is held or moved on.

        A lost commit is not retried: the run was renewed, ended, or taken
        over by another host meanwhile, and the next recovery judges it
        afresh, so no recovering host waits out a backoff while its own
        leases run down.
        """
        current = self._load(run_id)
        if current.status != status or current.lease_live(self._lease_now()):
            return False
        now = self._clock.now()
        updated = _changed_run(
            current,
            {
                "status": INTERRUPTED,
                "finished_at": now,
                "revision": current.revision + 1,
                "owner": self._host,
                "lease_expires_at": None,
            },
        )
        previous = None if current.owner is None else self.owner_digest(current.owner)
        detail: dict[str, JsonValue] = {
            "detail": {"reason": "lease_expired", "previous_owner": previous}
        }
        unit = self._ending(current, updated, [], detail=detail, now=now)[1]
        try:
            self._store.commit(unit)
        except RevisionConflict:
            return False
        return True

    # -- leases -----------------------------------------------------------------

    def renew_lease(self, run_id: str) -> GraphRun:
        """Extend this host's lease on a run it executes, for a step that writes nothing for long.

        Commits a ``run.lease_renewed`` event with the renewed record. Renew
        well within the lease (every third of it, say): a run whose lease
        expired may be taken over by any host's recovery.

        Raises:
            InvalidInput: this service has no host id.
            RunFenced: another host holds the run or took it over, or the
                run is accepted or running but unowned.
            InvalidTransition: the run is paused or ended, so holds no lease.
            NotFound: no such run.

        """
        host = self._host
        if host is None:
            raise InvalidInput("a run service without a host id holds no leases")

        def attempt() -> GraphRun | Lost:
            current = self._load(run_id)
            if current.owner != host or current.status not in LEASED_STATUSES:
                self._held.discard(run_id)
            self._check_owner(current)
            if current.status not in LEASED_STATUSES:
                raise InvalidTransition(
                    "only an accepted or running run holds a lease",
                    current=current.status,
                    target=current.status,
                )
            if current.owner != host:
                raise RunFenced(
                    "run is not held by this host; only its owner renews it",
                    run_id=run_id,
                    status=current.status,
                )
            updated = _changed_run(
                current,
                {**self._lease_fields(current.status), "revision": current.revision + 1},
            )
            appended = self._chain(run_id, [_renewal(updated)], self._clock.now())
            unit = UnitOfWork(
                upserts=[self._run_upsert(updated, current.revision, appended[-1].index)],
                appends=appended,
            )
            return self._track(updated) if self._renewed(unit, run_id) else LOST

        return settle(attempt, "run ledger", run_id=run_id)

    def renew_leases(self) -> int:
        """Renew every lease this service took and still holds; return how many were renewed.

        For a host's keeper to call every third of the lease or so. Only runs
        this service started, claimed or renewed count, not every run its
        host id owns, so runs left by an earlier process under the same fixed
        id lapse and are recovered. A run that ended, paused or was taken
        over meanwhile is dropped; a run that fails otherwise does not stop
        the others from being renewed, and the first such failure is raised
        after them.

        Raises:
            InvalidInput: this service has no host id.
            FlowvaultError: renewing one of the runs failed (after the rest).

        """
        if self._host is None:
            raise InvalidInput("a run service without a host id holds no leases")
        renewed = 0
        failure: FlowvaultError | None = None
        for run_id in sorted(self._held.copy()):
            try:
                self.renew_lease(run_id)
            except (RevisionConflict, InvalidTransition, NotFound):
                self._held.discard(run_id)
            except FlowvaultError as failed:
                failure = failure or failed
            else:
                renewed += 1
        if failure is not None:
            raise failure
        return renewed

    def _renewed(self, unit: UnitOfWork, run_id: str) -> bool:
        """Commit a renewal; ``False`` to rebuild it, unless the run changed hands meanwhile."""
        try:
            self._store.commit(unit)
        except RevisionConflict:
            self._check_owner(self._load(run_id))
            return False
        return True

    def _renewal_due(self, run: GraphRun) -> GraphRun | None:
        """Return the renewed run when this host's lease on it is past half its length."""
        if self._host is None or run.owner != self._host or run.status not in LEASED_STATUSES:
            return None
        now = self._lease_now()
        expires = run.lease_expires_at
        if expires is not None and expires - now > self._lease / 2:
            return None
        return _changed_run(
            run,
            {
                "owner": self._host,
                "lease_expires_at": now + self._lease,
                "revision": run.revision + 1,
            },
        )

    # -- run events -------------------------------------------------------------

    def append_run_events(
        self, run_id: str, events: Sequence[tuple[str, object]]
    ) -> list[LedgerEvent]:
        """Append caller events (payloads sanitised) to an unfinished run's stream.

        When less than half of this host's lease on the run is left, the
        same unit renews it, with a ``run.lease_renewed`` event after the
        caller's; the events returned are the caller's.

        Raises:
            InvalidInput: a reserved or malformed type, or too many events.
            RunFenced: another host holds the run or took it over.
            InvalidTransition: the run has finished.
            NotFound: no such run.

        """

        def attempt() -> list[LedgerEvent] | Lost:
            run = self._load(run_id)
            self._check_owner(run)
            if run.finished:
                raise InvalidTransition(
                    "a finished run takes no more events", current=run.status, target=run.status
                )
            drafts = _caller_drafts(events, run.status)
            if not drafts:
                return []
            renewed = self._renewal_due(run)
            if renewed is not None:
                drafts.append(_renewal(renewed))
            appended = self._chain(run_id, drafts, self._clock.now())
            upserts = (
                []
                if renewed is None
                else [self._run_upsert(renewed, run.revision, appended[-1].index)]
            )
            if not self._renewed(UnitOfWork(upserts=upserts, appends=appended), run_id):
                return LOST
            if renewed is not None:
                self._track(renewed)
            return appended[: len(events)]

        return settle(attempt, "run ledger", run_id=run_id)

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
            raise InvalidInput("limit must be a positive integer", fix=LIMIT_FIX)
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

    # -- endings ----------------------------------------------------------------

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
            InvalidInput: ``status`` is not terminal.
            RunFenced / RevisionConflict / InvalidTransition / NotFound: as
                ``set_status``.

        """
        if not isinstance(status, str) or status not in RUN_LIFECYCLE.terminal:
            raise InvalidInput("finish_run needs a terminal status; use set_status otherwise")
        _check_status(expected_status)

        def attempt() -> TerminalReceipt | Lost:
            current = self._load(run_id)
            self._check_owner(current)
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
                    "owner": None,
                    "lease_expires_at": None,
                },
            )
            drafts = _caller_drafts(events, current.status)
            receipt, unit = self._ending(current, updated, drafts, detail={}, now=now)
            return receipt if self._committed(unit, run_id, expected_status) else LOST

        receipt = settle(attempt, "run ledger", run_id=run_id)
        self._held.discard(run_id)
        return receipt

    def _ending(
        self,
        current: GraphRun,
        updated: GraphRun,
        drafts: Sequence[_Draft],
        *,
        detail: dict[str, JsonValue],
        now: datetime,
    ) -> tuple[TerminalReceipt, UnitOfWork]:
        """Build the unit ending a run: the drafts, ``run.<status>``, the run and its receipt."""
        run_id, status = updated.run_id, updated.status
        final_digest = self._receipts.final_state_digest(updated.final_state)
        receipt_digest = self._receipts.receipt_digest(run_id)
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
        issued = self._receipts.issue(updated, final_digest, appended, now)
        unit = UnitOfWork(
            upserts=[
                self._run_upsert(updated, current.revision, appended[-1].index),
                issued.upsert,
            ],
            appends=appended,
        )
        return issued.receipt, unit

    def compact(self) -> bool:
        """Ask the store to drop stale copies of deleted bytes, if it can."""
        compactor = self._repo.capabilities.compactor
        return True if compactor is None else compactor.compact()


def _renewal(run: GraphRun) -> _Draft:
    expires = run.lease_expires_at
    payload: JsonValue = {"lease_expires_at": None if expires is None else expires.isoformat()}
    return _Draft(LEASE_RENEWED, payload, run.status, run.status)


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


def _check_status(status: object) -> str:
    if not isinstance(status, str) or status not in RUN_LIFECYCLE.states:
        raise InvalidInput("not a run_lifecycle status")
    return status


def _check_host_id(host_id: object) -> str:
    if not isinstance(host_id, str) or not HOST_ID_PATTERN.fullmatch(host_id):
        raise InvalidInput("a host id is 1-128 of [A-Za-z0-9._:@-], starting alphanumeric")
    return host_id


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


def _new_run(**fields: object) -> GraphRun:
    """Build a run from caller values, as a typed error that names fields but not values."""
    return GraphRun.model_validate(fields)


def _changed_run(run: GraphRun, changes: Mapping[str, object]) -> GraphRun:
    return _new_run(**{**run.model_dump(), **changes})
