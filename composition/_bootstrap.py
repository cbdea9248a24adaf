"""One plain factory for hosts that do not want a DI container."""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar, overload

from pydantic import BaseModel

from flowvault.application import (
    ActionResultService,
    ApprovalFlow,
    ApprovalService,
    CheckpointService,
    Cipher,
    Clock,
    DefinitionRegistry,
    EvidenceService,
    IdempotencyService,
    IdFactory,
    LeaseKeeper,
    LedgerAudit,
    ResultRepository,
    RetentionJob,
    RetentionPolicy,
    RunService,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    StoreCapabilities,
    StreamWriter,
    TerminalReceipts,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._record_audit import BoundRecords
from flowvault.composition._container import Container, build_container, open_postgres
from flowvault.composition._settings import Settings
from flowvault.domain import InvalidInput, NotFound, WorkflowState

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Runtime:
    """The wired ports and the sealed repository a host hands to flowvault's services."""

    settings: Settings
    store: SecureObjectStore
    cipher: Cipher
    repository: SealedRepository
    workflows: WorkflowService
    workflow_events: WorkflowEventService
    action_results: ActionResultService
    results: ResultRepository
    runs: RunService
    definitions: DefinitionRegistry
    receipts: TerminalReceipts
    checkpoints: CheckpointService
    approvals: ApprovalService
    idempotency: IdempotencyService
    evidence: EvidenceService
    clock: Clock
    ids: IdFactory
    mark: AntiRollback | None = None
    """The high-water mark guarding ``store``; ``None`` where none is kept or the host guards it."""

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the store offers beyond the port, looked up once when it was opened."""
        return self.repository.capabilities

    def audit(self) -> LedgerAudit:
        """Return the audit ``ledger verify --all`` runs: keyed, with bound records and the mark.

        ``audit().run()`` verifies every stream under the key, opens every
        record, holds each bound record to its stream and compares the
        store with its high-water mark, writing nothing; ``ok`` is false
        on any finding.
        """
        bound = BoundRecords(self.repository, self.workflows, self.runs)
        return LedgerAudit(self.store, self.repository, bound, self.mark)

    def retention(self, policy: RetentionPolicy | None = None) -> RetentionJob:
        """Return the retention job over every service, under ``policy``."""
        return RetentionJob(
            self.clock,
            policy or RetentionPolicy(),
            action_results=self.action_results,
            runs=self.runs,
            checkpoints=self.checkpoints,
            approvals=self.approvals,
            idempotency=self.idempotency,
        )

    def lease_keeper(self, interval: float | None = None) -> LeaseKeeper:
        """Return an unstarted keeper renewing this host's run leases every ``interval`` seconds.

        By default every third of ``FLOWVAULT_RUN_LEASE``. Use it as a
        context manager around work whose steps may write nothing for long.
        """
        every = self.settings.run_lease / 3 if interval is None else interval
        return LeaseKeeper(self.runs, every)

    @property
    def approval_flow(self) -> ApprovalFlow:
        """The two-call approval flow over ``runs``, ``checkpoints`` and ``approvals``."""
        return ApprovalFlow(self.runs, self.checkpoints, self.approvals)

    @overload
    def state(self, scope: str) -> StateRepository[WorkflowState]: ...

    @overload
    def state(self, scope: str, *, model: type[M]) -> StateRepository[M]: ...

    def state(
        self, scope: str, *, model: type[M] | None = None
    ) -> StateRepository[WorkflowState] | StateRepository[M]:
        """Return the state repository of ``scope``, typed by ``model`` (``WorkflowState`` if none).

        ``load()`` returns a snapshot of ``model`` and ``save`` takes one,
        as a type checker sees it too.
        """
        if model is None:
            return StateRepository(self.repository, scope)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise InvalidInput("model must be a pydantic model class")
        return StateRepository(self.repository, scope, model=model)

    def stream(self, name: str) -> StreamWriter:
        """Return a writer that appends keyed events to the ledger stream ``name``."""
        return StreamWriter(self.store, self.repository, self.clock, name)

    def close(self) -> None:
        """Release the store's connections and files."""
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def bootstrap(
    settings: Settings | None = None,
    *,
    key: bytes | None = None,
    store: SecureObjectStore | None = None,
    clock: Clock | None = None,
    ids: IdFactory | None = None,
    create: bool = False,
) -> Runtime:
    """Wire flowvault from settings, keeping any port the host passes in.

    The store settings select must exist (``NotFound`` naming
    ``flowvault init``, with nothing created) unless ``create`` is true:
    a mistyped home or schema must never become a new store. A memory
    store always starts empty, and a store the host passes in is the
    host's. ``key`` is a 32-byte master key the host manages itself;
    without it the key comes from ``FLOWVAULT_KEY`` or the key file, and
    is created only for a store that holds no data yet. The store is
    checked against its high-water mark (``StoreRolledBack`` if older); a
    store the host passes in is the host's to guard.
    """
    container = build_container(settings, key=key, create=create)
    if store is not None:
        container.store.override(store)
        container.guard_enabled.override(False)
    if clock is not None:
        container.clock.override(clock)
    if ids is not None:
        container.ids.override(ids)
    opened = container.store()
    try:
        runtime = _assemble(container)
        if runtime.settings.recover_runs_on_open:
            runtime.runs.recover_incomplete_runs()
        return runtime
    except BaseException:
        if store is None:
            opened.close()
        raise


def run_host_id(settings: Settings) -> str:
    """Return the host id runs are owned under: ``FLOWVAULT_HOST_ID``, else a fresh one.

    The fresh one is ``<hostname>-<pid>-<8 hex>``: readable where it came
    from, and distinct for every runtime, even two in one process, so no
    two runtimes ever share a lease by accident.
    """
    if settings.host_id is not None:
        return settings.host_id
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:80].strip("-._") or "host"
    return f"{name}-{os.getpid()}-{secrets.token_hex(4)}"


def is_cold_root(settings: Settings) -> bool:
    """Whether nothing exists yet for ``settings``: opening would have to create a store.

    Recovery verbs use this to report on a cold root without creating one.
    A PostgreSQL schema is cold when it holds no flowvault tables; finding
    out connects to the server and creates nothing (a schema at an older
    version is migrated forward, as any open does).
    """
    if settings.backend == "sqlite":
        return not settings.database_path.exists()
    if settings.backend == "postgres":
        try:
            open_postgres(settings).close()
        except NotFound:
            return True
        return False
    return settings.backend == "memory"


def open_existing(settings: Settings, *, key: bytes | None = None) -> Runtime | None:
    """Open the store of ``settings`` if one exists; ``None`` on a cold root.

    The store is opened once: only a refusal is checked again, to tell a
    cold root from another ``NotFound``, so a PostgreSQL server is not
    connected to twice for every verb.
    """
    if settings.backend == "memory":
        return None
    try:
        return bootstrap(settings, key=key)
    except NotFound:
        if is_cold_root(settings):
            return None
        raise


def _assemble(container: Container) -> Runtime:
    repository = container.repository()
    clock, ids = container.clock(), container.ids()
    definitions = DefinitionRegistry(repository, clock)
    receipts = TerminalReceipts(repository, repository, signer=container.signer())
    settings = container.settings()
    runs = RunService(
        repository,
        clock,
        ids,
        definitions=definitions,
        receipts=receipts,
        host_id=run_host_id(settings),
        lease=timedelta(seconds=settings.run_lease),
    )
    checkpoints = CheckpointService(repository, clock, integrity=repository, runs=runs)
    return Runtime(
        settings=settings,
        store=container.guarded_store(),
        cipher=container.cipher(),
        repository=repository,
        workflows=container.workflows(),
        workflow_events=container.workflow_events(),
        action_results=container.action_results(),
        results=ResultRepository(repository),
        runs=runs,
        definitions=definitions,
        receipts=receipts,
        checkpoints=checkpoints,
        approvals=ApprovalService(
            repository,
            clock,
            ids,
            checkpoints=checkpoints,
            integrity=repository,
            signatures=container.signatures(),
        ),
        idempotency=IdempotencyService(repository, clock),
        evidence=EvidenceService(repository, clock, integrity=repository),
        clock=clock,
        ids=ids,
        mark=container.rollback_guard() if container.guard_enabled() else None,
    )
