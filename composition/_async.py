"""The asyncio face of a runtime: an awaitable twin of every service method.

flowvault's stores block (a SQLite ``fsync``, a PostgreSQL round trip), so
an asyncio host must never call them on its event loop. ``AsyncRuntime``
runs every call on a bounded thread pool it owns (docs/async.md weighs it
against ``asyncio.to_thread``, one writer thread and psycopg's async pool,
with the figures). The threads are what let concurrent coroutines share
one store: SQLite's group commit carries the units of waiting threads in
one transaction and one sync, and a PostgreSQL call holds a pooled
connection only while it runs.

A call is one whole unit of work on its thread. A coroutine cancelled
before its call started leaves nothing; cancelled once it started, the
thread still finishes the unit, which may land: the coroutine is not told
the outcome, and the store never holds half a unit.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from pydantic import BaseModel

from flowvault.application import (
    ActionResultService,
    ApprovalFlow,
    ApprovalService,
    CheckpointService,
    Clock,
    DefinitionRegistry,
    Delete,
    EvidenceService,
    HistoryEvent,
    IdempotencyService,
    IdFactory,
    LeaseKeeper,
    LedgerAudit,
    ResultRepository,
    RetentionJob,
    RetentionPolicy,
    RunService,
    SecureObjectStore,
    StateRepository,
    StateSnapshot,
    StoreCapabilities,
    StreamWriter,
    TerminalReceipts,
    UnitOfWork,
    Upsert,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.application._state import StateProbe
from flowvault.application._worker import SQLITE_THREADS, Worker
from flowvault.composition._bootstrap import Runtime, bootstrap
from flowvault.composition._settings import Settings
from flowvault.domain import (
    LedgerEvent,
    ResetFingerprint,
    StateMachine,
    WorkflowState,
)

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)


class AsyncService(Generic[S]):
    """An async twin of one synchronous service: each ``twin`` attribute awaits its method."""

    __slots__ = ("_target", "_worker")

    def __init__(self, target: S, worker: Worker) -> None:
        self._target = target
        self._worker = worker

    @property
    def sync(self) -> S:
        """The synchronous service behind this twin (its calls block: not for the event loop)."""
        return self._target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self._target).__name__})"


class twin(Generic[S, P, R]):
    """Declare, on an ``AsyncService[S]``, the awaitable twin of ``S``'s method.

    ``twin(WorkflowService.get)`` gives a class attribute whose bound value
    is ``async def get(workflow_id: str) -> WorkflowRecord``: the parameter
    list and the return type are the method's own, as a type checker and
    ``inspect.signature`` see them.
    """

    def __init__(self, method: Callable[Concatenate[S, P], R]) -> None:
        self.method = method
        self.name = getattr(method, "__name__", "")

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(f"{owner.__name__}.{name} twins {self.name}, not {name}")

    @overload
    def __get__(self, instance: None, owner: type) -> Self: ...

    @overload
    def __get__(
        self, instance: AsyncService[S], owner: type
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(
        self, instance: AsyncService[S] | None, owner: type
    ) -> Self | Callable[P, Coroutine[Any, Any, R]]:
        if instance is None:
            return self
        return _bind(getattr(instance._target, self.name), instance._worker)


def _bind(method: Callable[P, R], worker: Worker) -> Callable[P, Coroutine[Any, Any, R]]:
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return await worker.run(functools.partial(method, *args, **kwargs))

    call.__name__ = getattr(method, "__name__", call.__name__)
    call.__qualname__ = getattr(method, "__qualname__", call.__qualname__)
    call.__doc__ = method.__doc__
    call.__wrapped__ = method  # type: ignore[attr-defined]  # inspect.signature reads it
    return call


# -- the services ---------------------------------------------------------------


class AsyncWorkflowService(AsyncService[WorkflowService]):
    """Awaitable ``WorkflowService``."""

    compact = twin(WorkflowService.compact)
    create = twin(WorkflowService.create)
    get = twin(WorkflowService.get)
    list_workflows = twin(WorkflowService.list_workflows)
    transition = twin(WorkflowService.transition)

    @property
    def machine(self) -> StateMachine:
        """The state machine new workflows follow."""
        return self._target.machine


class AsyncWorkflowEventService(AsyncService[WorkflowEventService]):
    """Awaitable ``WorkflowEventService``."""

    append_event = twin(WorkflowEventService.append_event)
    decision_receipt = twin(WorkflowEventService.decision_receipt)
    event_page = twin(WorkflowEventService.event_page)
    events = twin(WorkflowEventService.events)


class AsyncActionResultService(AsyncService[ActionResultService]):
    """Awaitable ``ActionResultService``."""

    get_action_result = twin(ActionResultService.get_action_result)
    list_action_results = twin(ActionResultService.list_action_results)
    purge_expired = twin(ActionResultService.purge_expired)
    put_action_result = twin(ActionResultService.put_action_result)


class AsyncResultRepository(AsyncService[ResultRepository]):
    """Awaitable ``ResultRepository``."""

    list = twin(ResultRepository.list)
    load = twin(ResultRepository.load)
    save = twin(ResultRepository.save)


class AsyncRunService(AsyncService[RunService]):
    """Awaitable ``RunService``."""

    append_run_events = twin(RunService.append_run_events)
    compact = twin(RunService.compact)
    finish_run = twin(RunService.finish_run)
    get_run = twin(RunService.get_run)
    list_runs = twin(RunService.list_runs)
    owner_digest = twin(RunService.owner_digest)
    read_run_events = twin(RunService.read_run_events)
    recover_incomplete_runs = twin(RunService.recover_incomplete_runs)
    renew_lease = twin(RunService.renew_lease)
    renew_leases = twin(RunService.renew_leases)
    set_status = twin(RunService.set_status)
    start_run = twin(RunService.start_run)

    @property
    def host_id(self) -> str | None:
        """The host this service writes runs as; ``None`` writes them unowned."""
        return self._target.host_id


class AsyncDefinitionRegistry(AsyncService[DefinitionRegistry]):
    """Awaitable ``DefinitionRegistry``."""

    definition_versions = twin(DefinitionRegistry.definition_versions)
    delete_definition = twin(DefinitionRegistry.delete_definition)
    get_definition = twin(DefinitionRegistry.get_definition)
    reference = twin(DefinitionRegistry.reference)
    register_definition = twin(DefinitionRegistry.register_definition)


class AsyncTerminalReceipts(AsyncService[TerminalReceipts]):
    """Awaitable ``TerminalReceipts``."""

    final_state_digest = twin(TerminalReceipts.final_state_digest)
    issue = twin(TerminalReceipts.issue)
    receipt_digest = twin(TerminalReceipts.receipt_digest)
    terminal_receipt = twin(TerminalReceipts.terminal_receipt)


class AsyncCheckpointService(AsyncService[CheckpointService]):
    """Awaitable ``CheckpointService``."""

    consume_checkpoint = twin(CheckpointService.consume_checkpoint)
    create_checkpoint = twin(CheckpointService.create_checkpoint)
    latest_checkpoint = twin(CheckpointService.latest_checkpoint)
    load_checkpoint = twin(CheckpointService.load_checkpoint)
    purge = twin(CheckpointService.purge)


class AsyncApprovalService(AsyncService[ApprovalService]):
    """Awaitable ``ApprovalService``."""

    approval_receipt = twin(ApprovalService.approval_receipt)
    decide = twin(ApprovalService.decide)
    decision_statement = twin(ApprovalService.decision_statement)
    expire_overdue = twin(ApprovalService.expire_overdue)
    get_approval = twin(ApprovalService.get_approval)
    list_approvals = twin(ApprovalService.list_approvals)
    purge = twin(ApprovalService.purge)
    register_decider_key = twin(ApprovalService.register_decider_key)
    request_approval = twin(ApprovalService.request_approval)
    signed_decisions = twin(ApprovalService.signed_decisions)
    status_of = twin(ApprovalService.status_of)


class AsyncIdempotencyService(AsyncService[IdempotencyService]):
    """Awaitable ``IdempotencyService``."""

    purge = twin(IdempotencyService.purge)
    recall = twin(IdempotencyService.recall)
    remember = twin(IdempotencyService.remember)


class AsyncEvidenceService(AsyncService[EvidenceService]):
    """Awaitable ``EvidenceService``."""

    capture_witness = twin(EvidenceService.capture_witness)
    load_witness = twin(EvidenceService.load_witness)


class AsyncStreamWriter(AsyncService[StreamWriter]):
    """Awaitable ``StreamWriter``."""

    append = twin(StreamWriter.append)

    @property
    def stream(self) -> str:
        """The ledger stream this writer appends to."""
        return self._target.stream


class AsyncApprovalFlow(AsyncService[ApprovalFlow]):
    """Awaitable ``ApprovalFlow``."""

    decide_and_resume = twin(ApprovalFlow.decide_and_resume)
    pause_for_approval = twin(ApprovalFlow.pause_for_approval)


class AsyncLedgerAudit(AsyncService[LedgerAudit]):
    """Awaitable ``LedgerAudit``; a ``progress`` callback is called on the worker thread."""

    against = twin(LedgerAudit.against)
    issue = twin(LedgerAudit.issue)
    run = twin(LedgerAudit.run)


class AsyncRetentionJob(AsyncService[RetentionJob]):
    """Awaitable ``RetentionJob``."""

    run = twin(RetentionJob.run)


class AsyncStateRepository(AsyncService[StateRepository[M]]):
    """Awaitable ``StateRepository``, typed by the same model.

    ``update``'s functions run on the worker thread, and again after a lost
    race, as they do in the synchronous repository: keep them pure and quick.
    """

    @property
    def scope(self) -> str:
        """The scope this repository reads and writes."""
        return self._target.scope

    async def check_current(self) -> None:
        """Await ``StateRepository.check_current``."""
        await self._worker.run(self._target.check_current)

    async def fingerprint(self, reason_class: str | None = None) -> ResetFingerprint:
        """Await ``StateRepository.fingerprint``."""
        return await self._worker.run(functools.partial(self._target.fingerprint, reason_class))

    async def history(self) -> list[LedgerEvent]:
        """Await ``StateRepository.history``."""
        return await self._worker.run(self._target.history)

    async def load(self) -> StateSnapshot[M]:
        """Await ``StateRepository.load``."""
        return await self._worker.run(self._target.load)

    async def probe(self) -> StateProbe[M]:
        """Await ``StateRepository.probe``."""
        return await self._worker.run(self._target.probe)

    async def reset(
        self, *, actor: str, source: str, reason_class: str | None = None
    ) -> ResetFingerprint:
        """Await ``StateRepository.reset``."""
        reset = functools.partial(
            self._target.reset, actor=actor, source=source, reason_class=reason_class
        )
        return await self._worker.run(reset)

    async def save(self, state: M) -> int:
        """Await ``StateRepository.save``."""
        return await self._worker.run(functools.partial(self._target.save, state))

    async def to_write(self, state: M, expected_revision: int | None) -> UnitOfWork:
        """Await ``StateRepository.to_write``."""
        return await self._worker.run(
            functools.partial(self._target.to_write, state, expected_revision)
        )

    async def update(self, fn: Callable[[M], M]) -> tuple[M, int]:
        """Await ``StateRepository.update``."""
        return await self._worker.run(functools.partial(self._target.update, fn))

    async def update_with_events(
        self, fn: Callable[[M], tuple[M, Sequence[HistoryEvent]]]
    ) -> tuple[M, int]:
        """Await ``StateRepository.update_with_events``."""
        return await self._worker.run(functools.partial(self._target.update_with_events, fn))

    async def update_with_writes(
        self, fn: Callable[[M], tuple[M, Sequence[Upsert | Delete]]]
    ) -> tuple[M, int]:
        """Await ``StateRepository.update_with_writes``."""
        return await self._worker.run(functools.partial(self._target.update_with_writes, fn))


class AsyncLeaseKeeper(AsyncService[LeaseKeeper]):
    """A ``LeaseKeeper`` started and stopped without blocking the loop; ``async with`` it."""

    @property
    def passes(self) -> int:
        """Renewal passes made so far."""
        return self._target.passes

    @property
    def running(self) -> bool:
        """Whether the keeper's thread is renewing."""
        return self._target.running

    async def start(self) -> Self:
        """Start renewing on the keeper's own thread; return this keeper."""
        await self._worker.run(self._target.start)
        return self

    async def stop(self) -> None:
        """Stop renewing and wait for the keeper's thread (on a worker thread)."""
        await self._worker.run(self._target.stop)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


class AsyncRuntime:
    """A runtime for asyncio hosts: the same services, every call awaitable.

    Each attribute named like one of ``Runtime``'s services is its async
    twin; ``sync`` is the runtime underneath (for the ports, and for code
    already on a thread). Build one with ``async_bootstrap`` or
    ``AsyncRuntime.wrap``, and close it with ``await aclose()`` or
    ``async with``: closing refuses new calls, waits for every accepted one,
    then closes the store. A call after that raises ``StoreUnavailable``,
    as the synchronous runtime does.
    """

    def __init__(self, runtime: Runtime, *, threads: int | None = None) -> None:
        self._runtime = runtime
        self._worker = Worker(default_threads(runtime.settings) if threads is None else threads)
        self._closing: Future[None] | None = None
        self._lock = threading.Lock()
        worker = self._worker
        self.workflows = AsyncWorkflowService(runtime.workflows, worker)
        self.workflow_events = AsyncWorkflowEventService(runtime.workflow_events, worker)
        self.action_results = AsyncActionResultService(runtime.action_results, worker)
        self.results = AsyncResultRepository(runtime.results, worker)
        self.runs = AsyncRunService(runtime.runs, worker)
        self.definitions = AsyncDefinitionRegistry(runtime.definitions, worker)
        self.receipts = AsyncTerminalReceipts(runtime.receipts, worker)
        self.checkpoints = AsyncCheckpointService(runtime.checkpoints, worker)
        self.approvals = AsyncApprovalService(runtime.approvals, worker)
        self.idempotency = AsyncIdempotencyService(runtime.idempotency, worker)
        self.evidence = AsyncEvidenceService(runtime.evidence, worker)
        self.approval_flow = AsyncApprovalFlow(runtime.approval_flow, worker)

    @classmethod
    def wrap(cls, runtime: Runtime, *, threads: int | None = None) -> AsyncRuntime:
        """Serve ``runtime`` to coroutines on ``threads`` worker threads (see ``default_threads``).

        The async runtime owns it from now on: ``aclose`` closes it.
        """
        return cls(runtime, threads=threads)

    @property
    def sync(self) -> Runtime:
        """The synchronous runtime underneath (its calls block: not for the event loop)."""
        return self._runtime

    @property
    def settings(self) -> Settings:
        """The settings the runtime was wired from."""
        return self._runtime.settings

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the store offers beyond the port, looked up once when it was opened."""
        return self._runtime.capabilities

    @property
    def threads(self) -> int:
        """How many worker threads run the calls."""
        return self._worker.threads

    @overload
    def state(self, scope: str) -> AsyncStateRepository[WorkflowState]: ...

    @overload
    def state(self, scope: str, *, model: type[M]) -> AsyncStateRepository[M]: ...

    def state(
        self, scope: str, *, model: type[M] | None = None
    ) -> AsyncStateRepository[WorkflowState] | AsyncStateRepository[M]:
        """Return the awaitable state repository of ``scope``, typed by ``model``."""
        if model is None:
            return AsyncStateRepository(self._runtime.state(scope), self._worker)
        return AsyncStateRepository(self._runtime.state(scope, model=model), self._worker)

    def stream(self, name: str) -> AsyncStreamWriter:
        """Return an awaitable writer appending keyed events to the ledger stream ``name``."""
        return AsyncStreamWriter(self._runtime.stream(name), self._worker)

    def audit(self) -> AsyncLedgerAudit:
        """Return the awaitable audit ``ledger verify --all`` runs."""
        return AsyncLedgerAudit(self._runtime.audit(), self._worker)

    def retention(self, policy: RetentionPolicy | None = None) -> AsyncRetentionJob:
        """Return the awaitable retention job over every service, under ``policy``."""
        return AsyncRetentionJob(self._runtime.retention(policy), self._worker)

    def lease_keeper(self, interval: float | None = None) -> AsyncLeaseKeeper:
        """Return an unstarted keeper renewing this host's run leases (see ``Runtime``)."""
        return AsyncLeaseKeeper(self._runtime.lease_keeper(interval), self._worker)

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` began."""
        return self._worker.closed

    async def aclose(self) -> None:
        """Refuse new calls, wait for the accepted ones, then close the store.

        Idempotent. Cancelling the awaiting coroutine does not stop the
        close, which finishes on its own thread.
        """
        with self._lock:
            closing = self._closing
            if closing is None:
                closing = self._closing = Future()
                threading.Thread(
                    target=self._close, args=(closing,), name="flowvault-async-close", daemon=True
                ).start()
        await asyncio.shield(asyncio.wrap_future(closing))

    def _close(self, closing: Future[None]) -> None:
        try:
            self._worker.shutdown()
            self._runtime.close()
        except BaseException as exc:  # handed to every awaiting coroutine
            closing.set_exception(exc)
        else:
            closing.set_result(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def default_threads(settings: Settings) -> int:
    """Worker threads for ``settings``' store: the pool size on PostgreSQL, else a few.

    More threads than pooled PostgreSQL connections would only wait for a
    connection; on SQLite a few waiting writers let group commit share a
    sync, and more add contention without adding syncs shared
    (docs/async.md has the figures).
    """
    if settings.backend == "postgres":
        return settings.postgres_pool_size
    return SQLITE_THREADS


async def async_bootstrap(
    settings: Settings | None = None,
    *,
    key: bytes | None = None,
    store: SecureObjectStore | None = None,
    clock: Clock | None = None,
    ids: IdFactory | None = None,
    create: bool = False,
    threads: int | None = None,
) -> AsyncRuntime:
    """``bootstrap`` on a thread (opening a store does I/O), wrapped in an ``AsyncRuntime``.

    If the awaiting coroutine is cancelled, the open finishes on its
    thread and the runtime it made is closed there, not leaked.
    """
    opened: Future[Runtime] = Future()

    def open_store() -> None:
        try:
            runtime = bootstrap(settings, key=key, store=store, clock=clock, ids=ids, create=create)
        except BaseException as exc:  # handed to the awaiting coroutine
            opened.set_exception(exc)
        else:
            opened.set_result(runtime)

    threading.Thread(target=open_store, name="flowvault-async-open", daemon=True).start()
    try:
        runtime = await asyncio.shield(asyncio.wrap_future(opened))
    except asyncio.CancelledError:
        opened.add_done_callback(_close_unclaimed)
        raise
    try:
        return AsyncRuntime.wrap(runtime, threads=threads)
    except BaseException:
        runtime.close()
        raise


def _close_unclaimed(opened: Future[Runtime]) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()
