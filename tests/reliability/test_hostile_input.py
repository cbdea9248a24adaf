"""Hostile input against every public entry point: a typed error or success, never a partial write.

One table row per entry point: the public methods of the runtime's services,
the sealed repository, the store port, and the domain and application
helpers that parse or check caller input. Each row draws its arguments from
the strategies in ``tests/support/hostile.py`` and calls the entry point on a
runtime that already holds a workflow, an action result, a state, a run
result, a graph definition and run, checkpoints, an approval, an idempotency
record and a witness. The property, checked after every call:

* the call returns, or raises a ``FlowvaultError`` subclass; any other
  exception (``TypeError``, ``ValueError``, a pydantic ``ValidationError``,
  ``RecursionError``, an ``sqlite3`` error...) is an anomaly;
* when the call raises, the store is unchanged: every record (revision,
  payload digest, labels, write time) and every ledger stream (first index,
  head) equals the snapshot taken before the call. The one documented
  exception is ``ApprovalExpired``, which records the expiry before it is
  raised. The store's ``commit`` is counted, and a call that never reached
  it (the port's only way to write) is not snapshotted again.

Arguments typed as a model (a ``WorkOrder``, a ``WorkflowResult``, a state, an
``EnvelopeHeader``) are built through the model's own validation from hostile
field values, falling back to a valid value for each field it refuses, so
hostile content reaches the service; scalar arguments (ids, names,
revisions, limits, cursors, times, JSON values, bytes, sequences) take values
of any type. Every row runs on the memory store; a subset runs on SQLite
files, to catch driver-level surprises (64-bit overflow, surrogates in TEXT
binds). Hypothesis runs without its example database, from a fixed seed per
row (``RELIABILITY_SEED`` moves them all), so a failure replays.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import hostile
import pytest
import reliability
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from pydantic import BaseModel, ValidationError

from flowvault.application import (
    ActionResultService,
    ApprovalFlow,
    ApprovalService,
    BlobStore,
    CheckpointService,
    DefinitionRegistry,
    Delete,
    EvidenceService,
    FilterOp,
    Guard,
    HistoryEvent,
    IdempotencyService,
    LabelFilter,
    LedgerAudit,
    LedgerTrim,
    ListCursor,
    Order,
    ResultRepository,
    RetentionJob,
    RetentionPolicy,
    RunService,
    SealCounter,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    StoredRecord,
    StoreStats,
    StreamCatalog,
    StreamWriter,
    TerminalReceipts,
    UnitOfWork,
    Upsert,
    WorkflowEventService,
    WorkflowService,
    effective_limit,
)
from flowvault.application._audit import verify_stream
from flowvault.application._keys import parse_master_key
from flowvault.application._mark_format import LOG_GENESIS, HighWaterMark, parse_mark, replay_log
from flowvault.application._receipts import compare_with_receipt, issue_receipt
from flowvault.application._rotation import KeyRotation
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._runs import check_run_id
from flowvault.application._state import (
    check_scope,
    cold_fingerprint,
    history_stream,
    reset_progress,
)
from flowvault.application._streams import read_stream
from flowvault.application.testing import FrozenClock, SequentialIds, make_header
from flowvault.application.testing._fakes import EPOCH
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    Approval,
    ApprovalExpired,
    ApprovalStatus,
    Checkpoint,
    FlowvaultError,
    InvalidInput,
    LedgerEvent,
    RevisionConflict,
    StateMachine,
    TerminalReceipt,
    WorkflowResult,
    WorkflowState,
    WorkOrder,
    content_hash,
    parse_terminal_receipt,
)
from flowvault.domain._approvals import checkpoint_id_for
from flowvault.domain._canonical import (
    MAX_SAFE_INTEGER,
    canonical_bytes,
    canonical_json,
    parse_json,
    validate_json,
)
from flowvault.domain._envelope import Sensitivity, format_instant, natural_key_digest
from flowvault.domain._graph_runs import RUN_LIFECYCLE
from flowvault.domain._ledger import GENESIS_HASH, verify_chain
from flowvault.domain._receipt import HeadNote, HeadReceipt, ReceiptSignature, parse_receipt
from flowvault.domain._sanitise import sanitise_payload
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE

FAMILY = "Hostile input, service entry points"
MEMORY_EXAMPLES = reliability.size(1000, 100_000)
SQLITE_EXAMPLES = reliability.size(200, 10_000)
CONTROL_EXAMPLES = 200
RENEW_EVERY = 1000
BATCH = 2000
"""Examples per hypothesis run in the long profile (see ``exercise``)."""
KEY = bytes(range(32))
T0 = EPOCH
WORKFLOW_STATES = tuple(sorted(DEFAULT_LIFECYCLE.states))
RUN_STATES = tuple(sorted(RUN_LIFECYCLE.states))
TERMINAL_RUN_STATES = tuple(sorted(RUN_LIFECYCLE.terminal))

M = TypeVar("M", bound=BaseModel)
Arguments = dict[str, Any]
Snapshot = tuple[tuple[object, ...], tuple[object, ...]]


# -- the world every call lands in ---------------------------------------------------


@dataclass(frozen=True)
class Known:
    """Ids and values the populated runtime holds, mixed into hostile arguments."""

    workflow_id: str
    action_hash: str
    scope: str
    result_run_id: str
    definition_id: str
    definition_version: str
    run_id: str
    checkpoint: Checkpoint
    spare_checkpoint_id: str
    approval: Approval
    idempotency_key: str
    witness_digest: str
    namespaces: tuple[str, ...]
    key_digests: tuple[str, ...]
    streams: tuple[str, ...]
    record: StoredRecord


@dataclass
class World:
    """A populated runtime, what it holds, and how many commits reached its store."""

    runtime: Runtime
    known: Known
    commits: int = 0

    @property
    def store(self) -> SecureObjectStore:
        """The store under the runtime."""
        return self.runtime.store

    def count_commits(self) -> None:
        """Count every call of the store's ``commit``, the only way anything is written."""
        commit = self.store.commit

        def counted(unit: UnitOfWork) -> None:
            self.commits += 1
            commit(unit)

        self.store.commit = counted  # type: ignore[method-assign]


def _populate(runtime: Runtime) -> Known:
    """Write one of everything, so hostile calls also meet existing records."""
    order = WorkOrder(
        kind="invoice.review",
        parameters={"invoice": "INV-1", "amount": 1200},
        requester="alice@example.org",
        idempotency_key="order-1",
    )
    workflow, _ = runtime.workflows.create(order)
    workflow_id = workflow.workflow_id
    runtime.workflows.transition(
        workflow_id, "planning", expected_state="intake", expected_version=1
    )
    runtime.workflows.transition(
        workflow_id, "decision", expected_state="planning", expected_version=2
    )
    action_hash = content_hash({"action": "pay"})
    runtime.action_results.put_action_result(workflow_id, action_hash, {"paid": True})
    runtime.state("main").save(WorkflowState(step=1))
    runtime.results.save(
        WorkflowResult(run_id="run-001", status="completed", started_at=T0, finished_at=T0)
    )
    definition = runtime.definitions.register_definition("flow.main", {"nodes": ["a", "b"]})
    run, _ = runtime.runs.start_run("flow.main", {"x": 1}, idempotency_key="start-1")
    runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
    checkpoints = [
        runtime.checkpoints.create_checkpoint(
            run.run_id,
            cursor,
            state={"step": cursor},
            budgets={"tokens": 100},
            counters={"steps": cursor},
            dependency_summary=None,
            terminal_cursor=None,
            event_cursor=cursor,
        )
        for cursor in (1, 2)
    ]
    checkpoint = checkpoints[0]
    approval = runtime.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="finance",
        prompt_digest=content_hash("prompt"),
        allowed_decisions=["approve", "reject"],
        expires_at=T0 + timedelta(days=1),
    )
    runtime.idempotency.remember("req-1", {"q": 1}, {"a": 1})
    witness = runtime.evidence.capture_witness(
        "https://example.org/a", b"evidence", "text/plain", "web", T0
    )
    store = runtime.store
    assert isinstance(store, StoreStats)
    assert isinstance(store, StreamCatalog)
    namespaces = tuple(sorted(store.namespace_counts()))
    digests = tuple(meta.key_digest for ns in namespaces for meta in store.list(ns, limit=2).items)
    record = store.load(namespaces[0], digests[0])
    assert record is not None
    return Known(
        workflow_id=workflow_id,
        action_hash=action_hash,
        scope="main",
        result_run_id="run-001",
        definition_id=definition.definition_id,
        definition_version=definition.version,
        run_id=run.run_id,
        checkpoint=checkpoint,
        spare_checkpoint_id=checkpoints[1].checkpoint_id,
        approval=approval,
        idempotency_key="req-1",
        witness_digest=witness.content_digest,
        namespaces=namespaces,
        key_digests=digests,
        streams=tuple(store.list_streams()),
        record=record,
    )


@contextmanager
def open_world(backend: str, tmp_path: Path) -> Iterator[World]:
    """Bootstrap a populated runtime on ``backend`` (``memory`` or ``sqlite``)."""
    settings_ = Settings(backend=backend, home=tmp_path / "home", synchronous="normal")
    runtime = bootstrap(settings_, key=KEY, clock=FrozenClock(), ids=SequentialIds(), create=True)
    try:
        world = World(runtime, _populate(runtime))
        world.count_commits()
        yield world
    finally:
        runtime.close()


def snapshot(store: SecureObjectStore) -> Snapshot:
    """Read everything a write could change through the port: records and stream ends."""
    assert isinstance(store, StoreStats)
    assert isinstance(store, StreamCatalog)
    records: list[object] = []
    for namespace in sorted(store.namespace_counts()):
        cursor: str | None = None
        while True:
            page = store.list(namespace, cursor=cursor, limit=200)
            records += [
                (
                    namespace,
                    meta.key_digest,
                    meta.revision,
                    meta.payload_digest,
                    tuple(sorted(meta.labels.items())),
                    format_instant(meta.header.written_at),
                )
                for meta in page.items
            ]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    streams: list[object] = []
    after: str | None = None
    while names := store.list_streams(after=after, limit=200):
        for name in names:
            head = store.ledger_head(name)
            first = store.read_ledger(name, from_index=0, limit=1).events
            assert head is not None
            assert first
            streams.append((name, first[0].index, head.index, head.event_hash))
        after = names[-1]
    return tuple(records), tuple(streams)


# -- the property --------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What one call did: refused or not, and the anomaly if the property broke."""

    refused: bool
    anomaly: str | None = None
    error: BaseException | None = None


def _short(error: BaseException) -> str:
    text = str(error)
    return text if len(text) <= 160 else text[:160] + "..."


def judge(
    call: Callable[[], object],
    world: World,
    before: Snapshot,
    may_write: tuple[type[FlowvaultError], ...] = (),
) -> tuple[Verdict, Snapshot]:
    """Run ``call``; only success or a typed error that left ``before`` intact is fine.

    Returns the verdict and the store's snapshot after the call. A call
    that never reached ``commit`` cannot have changed the store, so the
    snapshot is retaken only when one did.
    """
    attempts = world.commits
    try:
        call()
    except FlowvaultError as error:
        if world.commits == attempts:
            return Verdict(True), before
        after = snapshot(world.store)
        if after != before and not isinstance(error, may_write):
            anomaly = f"partial write: {type(error).__name__} raised after the store changed"
            return Verdict(True, anomaly, error), after
        return Verdict(True), after
    except Exception as error:  # any other exception is what this looks for
        return Verdict(False, f"{type(error).__name__} escaped: {_short(error)}", error), before
    return Verdict(False), before if world.commits == attempts else snapshot(world.store)


# -- argument builders -----------------------------------------------------------------


def _refused_fields(error: ValidationError | InvalidInput) -> set[str]:
    """Name the fields a model refused: a host model's pydantic error, or flowvault's own."""
    if isinstance(error, InvalidInput):
        return set(str(error.details.get("fields", "")).split(","))
    return {str(issue["loc"][0]) for issue in error.errors() if issue["loc"]}


def _built(model: type[M], fields: Mapping[str, Any], fallback: Mapping[str, Any]) -> M:
    """Validate ``fields``; replace each refused field by its fallback, then all of them."""
    try:
        return model.model_validate(dict(fields))
    except (ValidationError, InvalidInput) as error:
        refused = _refused_fields(error)
    patched = {**fields, **{name: fallback[name] for name in refused if name in fallback}}
    try:
        return model.model_validate(patched)
    except (ValidationError, InvalidInput):
        return model.model_validate(dict(fallback))


def text(*known: str) -> st.SearchStrategy[Any]:
    """Hostile text of any type, with ``known`` values mixed in."""
    return hostile.hostile_text(known)


def args(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Arguments]:
    """Draw a dictionary of keyword arguments."""
    return st.fixed_dictionaries(fields)


INTS = hostile.hostile_ints()
JSON = hostile.hostile_json()
MAPPINGS = hostile.hostile_mapping()
TIMES = hostile.hostile_datetimes()
AGES = hostile.hostile_timedeltas()
opt = hostile.optional


def digests(k: Known) -> st.SearchStrategy[Any]:
    """Digest arguments: real ones, look-alikes and hostile text."""
    real = (k.action_hash, k.definition_version, k.witness_digest, GENESIS_HASH, *k.key_digests)
    forged = ("sha256:" + "G" * 64, "SHA256:" + "0" * 64, "sha256:" + "0" * 63)
    return text(*real, *forged)


def cursors() -> st.SearchStrategy[Any]:
    """List cursors: forged bodies in the real framing, junk, and wrong types."""
    return hostile.hostile_cursors(
        lambda body: base64.urlsafe_b64encode(_lenient(body)).decode("ascii")
    )


def _lenient(body: Mapping[str, object]) -> bytes:
    try:
        return canonical_bytes(dict(body))
    except FlowvaultError:
        return repr(sorted(body)).encode()


_ORDER_FALLBACK = {
    "kind": "invoice.review",
    "parameters": {},
    "requester": "alice@example.org",
    "idempotency_key": "order-2",
    "priority": 0,
}


def work_orders() -> st.SearchStrategy[WorkOrder]:
    """Work orders built from hostile kinds, parameters, requesters and keys."""
    fields = args(
        kind=text("invoice.review", "a"),
        parameters=MAPPINGS,
        requester=text("alice@example.org"),
        idempotency_key=text("order-1", "order-2"),
        priority=INTS,
    )
    return fields.map(lambda f: _built(WorkOrder, f, _ORDER_FALLBACK))


def workflow_results() -> st.SearchStrategy[WorkflowResult]:
    """Run results with hostile ids, statuses, times, outputs and summaries."""
    fallback = {"run_id": "run-002", "status": "completed", "started_at": T0, "finished_at": T0}
    fields = args(
        run_id=text("run-001", "run-002"),
        status=text(*TERMINAL_RUN_STATES),
        started_at=TIMES,
        finished_at=TIMES,
        workflow_id=opt(text()),
        output=JSON,
        summary=MAPPINGS,
        error_code=opt(text()),
    )
    return fields.map(lambda f: _built(WorkflowResult, f, fallback))


def workflow_states() -> st.SearchStrategy[Any]:
    """State documents with hostile field names and values, and values that are no state."""
    documents = st.dictionaries(hostile.hostile_text(allow_non_text=False), JSON, max_size=3)
    built = documents.map(lambda f: _built(WorkflowState, f, {}))
    return st.one_of(built, built, JSON)


def _event_or_default(fields: Arguments) -> LedgerEvent:
    try:
        return LedgerEvent.create(occurred_at=T0, previous_hash=GENESIS_HASH, **fields)
    except FlowvaultError:
        return LedgerEvent.create(
            stream="workflow/none",
            index=0,
            type="decision.approved",
            occurred_at=T0,
            payload={},
            previous_hash=GENESIS_HASH,
        )


def ledger_events(k: Known) -> st.SearchStrategy[LedgerEvent]:
    """Well-formed events with hostile streams, indexes, types and payloads."""
    fields = args(
        stream=text(*k.streams),
        index=INTS,
        type=text("decision.approved", "decision.rejected", "note.added"),
        payload=MAPPINGS,
    )
    return fields.map(_event_or_default)


def caller_events() -> st.SearchStrategy[Any]:
    """Event batches for runs: hostile types and payloads, reserved names, oversized batches."""
    pair = st.tuples(text("step.done", "run.completed", "retention.purged"), JSON)
    return st.one_of(
        st.lists(pair, max_size=4),
        st.integers(199, 202).map(lambda n: [("step.done", {})] * n),
    )


def keys(*known: str) -> st.SearchStrategy[Any]:
    """Draw mapping keys: hostile text and the hashable values of other types."""
    return st.one_of(
        hostile.hostile_text(known, allow_non_text=False), st.sampled_from((1, None, b"k", 1.5))
    )


def labels_() -> st.SearchStrategy[Any]:
    """Record labels: hostile names and values, too many of them, or none."""
    return opt(st.one_of(MAPPINGS, st.dictionaries(keys("state", "run"), st.one_of(INTS, text()))))


def expected_revisions() -> st.SearchStrategy[Any]:
    """Guards: sentinels, boundary integers and wrong types."""
    return st.one_of(st.sampled_from(Guard), INTS)


def sensitivities() -> st.SearchStrategy[Any]:
    """Sensitivity classes, their names as text, and anything else."""
    return opt(st.one_of(st.sampled_from(Sensitivity), text("public", "restricted")))


# -- calls that need a few lines ---------------------------------------------------------


def _state(world: World, a: Arguments) -> StateRepository[WorkflowState]:
    return world.runtime.state(a["scope"])


def _update(world: World, a: Arguments) -> object:
    return _state(world, a).update(lambda _: a["state"])


def _update_with_events(world: World, a: Arguments) -> object:
    drafts = [HistoryEvent(kind, payload) for kind, payload in a["events"]]
    return _state(world, a).update_with_events(lambda _: (a["state"], drafts))


def _update_with_writes(world: World, a: Arguments) -> object:
    repository = world.runtime.repository

    def step(_: WorkflowState) -> tuple[Any, list[Upsert | Delete]]:
        writes: list[Upsert | Delete] = [
            Delete(ns, digest, rev) for ns, digest, rev in a["deletes"]
        ]
        writes += [
            repository.prepare(ns, key, doc, expected=rev) for ns, key, doc, rev in a["upserts"]
        ]
        return a["state"], writes

    return _state(world, a).update_with_writes(step)


def _reset_progress(world: World, a: Arguments) -> object:
    state = None if a["cold"] else _state(world, a)
    return reset_progress(
        state,
        a["scope"],
        actor=a["actor"],
        source=a["source"],
        reason_class=a["reason_class"],
        dry_run=a["dry_run"],
    )


def _retention(world: World, a: Arguments) -> object:
    policy = RetentionPolicy(**a["policy"])
    return world.runtime.retention(policy).run(a["now"])


def _tampered_approval(world: World, a: Arguments) -> object:
    approval = world.known.approval.model_copy(update=a["changes"])
    return world.runtime.approvals.approval_receipt(approval)


def _header(namespace: object, key: object, revision: object) -> Any:
    try:
        return make_header(namespace, key, revision=revision)  # type: ignore[arg-type]
    except FlowvaultError:
        return make_header("hostile.records", "fallback", revision=1)


def _commit(world: World, a: Arguments) -> object:
    unit = UnitOfWork(
        upserts=[
            Upsert(header=_header(ns, key, rev), payload=payload, expected=expected, labels=labels)
            for ns, key, rev, payload, expected, labels in a["upserts"]
        ],
        deletes=[Delete(ns, digest, expected) for ns, digest, expected in a["deletes"]],
        appends=[
            LedgerEvent.create(
                stream=stream,
                index=index,
                type=kind,
                occurred_at=T0,
                payload=payload,
                previous_hash=previous,
            )
            for stream, index, kind, payload, previous in a["appends"]
        ],
        trims=[LedgerTrim(stream, before) for stream, before in a["trims"]],
    )
    world.store.commit(unit)
    return None


def _list(world: World, a: Arguments) -> object:
    filters = [LabelFilter(name, value, op) for name, value, op in a["filters"]]
    return world.store.list(
        a["namespace"], filters=filters, order=a["order"], cursor=a["cursor"], limit=a["limit"]
    )


def _verify_chain(world: World, a: Arguments) -> object:
    events = list(read_stream(world.store, a["stream"]))
    if events:
        position = a["position"] % len(events)
        events[position] = events[position].model_copy(update={a["field"]: a["value"]})
    options = {name: a[name] for name in ("start_index", "previous_hash") if a[name] is not None}
    return verify_chain(events, **options)


def _sanitise(world: World, a: Arguments) -> object:
    limits = {
        name: a[name] for name in ("max_depth", "max_string", "max_bytes") if a[name] is not None
    }
    return sanitise_payload(a["value"], **limits)


def _open(world: World, a: Arguments) -> object:
    return world.runtime.repository.open(
        world.known.record, namespace=a["namespace"], key_digest=a["key_digest"]
    )


def _options(a: Arguments, *names: str) -> Arguments:
    """Pass only the optional keyword arguments that were drawn."""
    return {name: a[name] for name in names if a[name] is not None}


# -- the table ------------------------------------------------------------------------


Call = Callable[[World, Arguments], object]


@dataclass(frozen=True)
class EntryPoint:
    """One public entry point, how to draw its arguments, and how to call it."""

    name: str
    arguments: Callable[[Known], st.SearchStrategy[Arguments]]
    call: Call
    sqlite: bool = False
    writes_before_refusing: tuple[type[FlowvaultError], ...] = ()


def _workflows(w: World) -> WorkflowService:
    return w.runtime.workflows


def _workflow_events(w: World) -> WorkflowEventService:
    return w.runtime.workflow_events


def _action_results(w: World) -> ActionResultService:
    return w.runtime.action_results


def _graph(w: World) -> RunService:
    return w.runtime.runs


def _definitions(w: World) -> DefinitionRegistry:
    return w.runtime.definitions


def _terminal_receipts(w: World) -> TerminalReceipts:
    return w.runtime.receipts


def _issue(w: World, a: Arguments) -> object:
    """Issue a receipt for a stored run over its stored events, as its ending would."""
    run = _graph(w).get_run(a["run_id"])
    appended = _graph(w).read_run_events(a["run_id"]).events
    return _terminal_receipts(w).issue(run, a["final_digest"], appended, a["issued_at"])


def _checkpoints(w: World) -> CheckpointService:
    return w.runtime.checkpoints


def _approvals(w: World) -> ApprovalService:
    return w.runtime.approvals


def _idempotency(w: World) -> IdempotencyService:
    return w.runtime.idempotency


def _evidence(w: World) -> EvidenceService:
    return w.runtime.evidence


def _runs(w: World) -> ResultRepository:
    return w.runtime.results


def _repo(w: World) -> SealedRepository:
    return w.runtime.repository


def _purge_args(k: Known) -> st.SearchStrategy[Arguments]:
    return args(now=TIMES, older_than=AGES, batch_size=INTS)


def _workflow_ids(k: Known) -> st.SearchStrategy[Any]:
    return text(k.workflow_id)


def _scopes(k: Known) -> st.SearchStrategy[Any]:
    return text(k.scope, "other")


def _definition_ids(k: Known) -> st.SearchStrategy[Any]:
    return text(k.definition_id, "flow.other")


def _run_ids(k: Known) -> st.SearchStrategy[Any]:
    return text(k.run_id)


def _checkpoint_ids(k: Known) -> st.SearchStrategy[Any]:
    return text(k.checkpoint.checkpoint_id, k.spare_checkpoint_id)


_DECIDER_PEM = (
    Ed25519PrivateKey.generate()
    .public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
)


def _approval_ids(k: Known) -> st.SearchStrategy[Any]:
    return text(k.approval.approval_id)


def _streams(k: Known) -> st.SearchStrategy[Any]:
    return text(*k.streams)


def _namespaces(k: Known) -> st.SearchStrategy[Any]:
    return text(*k.namespaces)


def _seal_namespaces(k: Known) -> st.SearchStrategy[Any]:
    return text(*k.namespaces, "hostile.records")


def _seal_args(k: Known) -> st.SearchStrategy[Arguments]:
    return args(
        namespace=_seal_namespaces(k),
        natural_key=text(k.workflow_id, k.scope, "main"),
        document=JSON,
        expected=expected_revisions(),
        sensitivity=sensitivities(),
        schema_version=opt(INTS),
        labels=labels_(),
    )


def _workflow_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "WorkflowService.create",
            lambda k: args(order=work_orders(), original_content_hash=opt(digests(k))),
            lambda w, a: _workflows(w).create(a["order"], **_options(a, "original_content_hash")),
            sqlite=True,
        ),
        EntryPoint(
            "WorkflowService.get",
            lambda k: args(workflow_id=_workflow_ids(k)),
            lambda w, a: _workflows(w).get(**a),
            sqlite=True,
        ),
        EntryPoint(
            "WorkflowService.list_workflows",
            lambda k: args(state=opt(text(*WORKFLOW_STATES)), limit=INTS, cursor=cursors()),
            lambda w, a: _workflows(w).list_workflows(**a),
            sqlite=True,
        ),
        EntryPoint(
            "WorkflowService.transition",
            lambda k: args(
                workflow_id=_workflow_ids(k),
                target=text(*WORKFLOW_STATES),
                expected_state=text(*WORKFLOW_STATES),
                expected_version=st.one_of(st.integers(1, 6), INTS),
                event_type=text("workflow.transitioned", "decision.approved", "a.b"),
                payload=opt(MAPPINGS),
                output_content_hash=opt(digests(k)),
                stop_reason=opt(text("operator")),
            ),
            lambda w, a: _workflows(w).transition(
                a["workflow_id"],
                a["target"],
                expected_state=a["expected_state"],
                expected_version=a["expected_version"],
                event_type=a["event_type"],
                payload=a["payload"],
                output_content_hash=a["output_content_hash"],
                stop_reason=a["stop_reason"],
            ),
        ),
        EntryPoint(
            "WorkflowEventService.append_event",
            lambda k: args(
                workflow_id=_workflow_ids(k),
                event_type=text("note.added", "decision.approved", "decision.rejected"),
                expected_state=text(*WORKFLOW_STATES),
                expected_version=st.one_of(st.integers(1, 6), INTS),
                payload=opt(
                    st.one_of(
                        MAPPINGS,
                        args(action_hash=digests(k), approved=st.booleans(), decided_by=text()),
                    )
                ),
                event_key=opt(text("key-1")),
            ),
            lambda w, a: _workflow_events(w).append_event(
                a["workflow_id"],
                a["event_type"],
                expected_state=a["expected_state"],
                expected_version=a["expected_version"],
                payload=a["payload"],
                event_key=a["event_key"],
            ),
        ),
        EntryPoint(
            "WorkflowEventService.decision_receipt",
            lambda k: args(workflow_id=_workflow_ids(k), event=ledger_events(k)),
            lambda w, a: _workflow_events(w).decision_receipt(**a),
        ),
        EntryPoint(
            "WorkflowEventService.events",
            lambda k: args(workflow_id=_workflow_ids(k), verify=st.booleans()),
            lambda w, a: _workflow_events(w).events(a["workflow_id"], verify=a["verify"]),
        ),
        EntryPoint(
            "WorkflowEventService.event_page",
            lambda k: args(workflow_id=_workflow_ids(k), cursor=cursors(), limit=INTS),
            lambda w, a: _workflow_events(w).event_page(**a),
        ),
        EntryPoint(
            "ActionResultService.put_action_result",
            lambda k: args(
                workflow_id=_workflow_ids(k), action_hash=digests(k), result=JSON, retention=AGES
            ),
            lambda w, a: _action_results(w).put_action_result(
                a["workflow_id"], a["action_hash"], a["result"], retention=a["retention"]
            ),
            sqlite=True,
        ),
        EntryPoint(
            "ActionResultService.get_action_result",
            lambda k: args(workflow_id=_workflow_ids(k), action_hash=digests(k)),
            lambda w, a: _action_results(w).get_action_result(**a),
        ),
        EntryPoint(
            "ActionResultService.list_action_results",
            lambda k: args(workflow_id=_workflow_ids(k)),
            lambda w, a: _action_results(w).list_action_results(**a),
        ),
        EntryPoint(
            "ActionResultService.purge_expired",
            lambda k: args(now=opt(TIMES), batch_size=INTS),
            lambda w, a: _action_results(w).purge_expired(a["now"], batch_size=a["batch_size"]),
            sqlite=True,
        ),
    ]


def _state_rows() -> list[EntryPoint]:
    return [
        EntryPoint("Runtime.state", lambda k: args(scope=_scopes(k)), _state),
        EntryPoint(
            "Runtime.state(model=)",
            lambda k: args(
                scope=_scopes(k), model=st.one_of(st.sampled_from([WorkflowState, dict]), JSON)
            ),
            lambda w, a: w.runtime.state(a["scope"], model=a["model"]).load(),
        ),
        EntryPoint(
            "StateRepository.load",
            lambda k: args(scope=_scopes(k)),
            lambda w, a: _state(w, a).load(),
            sqlite=True,
        ),
        EntryPoint(
            "StateRepository.probe",
            lambda k: args(scope=_scopes(k)),
            lambda w, a: _state(w, a).probe(),
        ),
        EntryPoint(
            "StateRepository.check_current",
            lambda k: args(scope=_scopes(k)),
            lambda w, a: _state(w, a).check_current(),
            sqlite=True,
        ),
        EntryPoint(
            "StateRepository.fingerprint",
            lambda k: args(scope=_scopes(k), reason_class=opt(text("corrupt"))),
            lambda w, a: _state(w, a).fingerprint(a["reason_class"]),
        ),
        EntryPoint(
            "StateRepository.to_write",
            lambda k: args(scope=_scopes(k), state=workflow_states(), revision=opt(INTS)),
            lambda w, a: _state(w, a).to_write(a["state"], a["revision"]),
        ),
        EntryPoint(
            "StateRepository.save",
            lambda k: args(scope=_scopes(k), state=workflow_states()),
            lambda w, a: _state(w, a).save(a["state"]),
            sqlite=True,
        ),
        EntryPoint(
            "StateRepository.update",
            lambda k: args(scope=_scopes(k), state=workflow_states()),
            _update,
        ),
        EntryPoint(
            "StateRepository.update_with_events",
            lambda k: args(
                scope=_scopes(k),
                state=workflow_states(),
                events=st.lists(st.tuples(text("note.added"), JSON), max_size=3),
            ),
            _update_with_events,
            sqlite=True,
        ),
        EntryPoint(
            "StateRepository.update_with_writes",
            lambda k: args(
                scope=_scopes(k),
                state=workflow_states(),
                deletes=st.lists(
                    st.tuples(text(*k.namespaces), text(*k.key_digests), expected_revisions()),
                    max_size=2,
                ),
                upserts=st.lists(
                    st.tuples(text(*k.namespaces), text("main"), JSON, expected_revisions()),
                    max_size=2,
                ),
            ),
            _update_with_writes,
        ),
        EntryPoint(
            "StateRepository.reset",
            lambda k: args(
                scope=_scopes(k),
                actor=text("cli"),
                source=text("test"),
                reason_class=opt(text("corrupt")),
            ),
            lambda w, a: _state(w, a).reset(
                actor=a["actor"], source=a["source"], reason_class=a["reason_class"]
            ),
            sqlite=True,
        ),
        EntryPoint(
            "StateRepository.history",
            lambda k: args(scope=_scopes(k)),
            lambda w, a: _state(w, a).history(),
        ),
        EntryPoint(
            "reset_progress",
            lambda k: args(
                scope=_scopes(k),
                actor=text("cli"),
                source=text("test"),
                reason_class=opt(text("corrupt")),
                dry_run=st.booleans(),
                cold=st.booleans(),
            ),
            _reset_progress,
        ),
        EntryPoint(
            "cold_fingerprint",
            lambda k: args(scope=_scopes(k), reason_class=opt(text("corrupt"))),
            lambda w, a: cold_fingerprint(**a),
        ),
        EntryPoint("check_scope", lambda k: args(scope=_scopes(k)), lambda w, a: check_scope(**a)),
        EntryPoint(
            "history_stream", lambda k: args(scope=_scopes(k)), lambda w, a: history_stream(**a)
        ),
    ]


def _run_result_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "ResultRepository.save",
            lambda k: args(result=workflow_results()),
            lambda w, a: _runs(w).save(**a),
            sqlite=True,
        ),
        EntryPoint(
            "ResultRepository.load",
            lambda k: args(run_id=text(k.result_run_id)),
            lambda w, a: _runs(w).load(**a),
            sqlite=True,
        ),
        EntryPoint(
            "ResultRepository.list",
            lambda k: args(since=opt(TIMES), cursor=cursors(), limit=INTS),
            lambda w, a: _runs(w).list(**a),
            sqlite=True,
        ),
        EntryPoint(
            "check_run_id",
            lambda k: args(run_id=text(k.result_run_id)),
            lambda w, a: check_run_id(**a),
        ),
    ]


def _graph_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "DefinitionRegistry.register_definition",
            lambda k: args(definition_id=_definition_ids(k), spec=JSON, overwrite=st.booleans()),
            lambda w, a: _definitions(w).register_definition(
                a["definition_id"], a["spec"], overwrite=a["overwrite"]
            ),
            sqlite=True,
        ),
        EntryPoint(
            "DefinitionRegistry.get_definition",
            lambda k: args(
                definition_id=_definition_ids(k), version=opt(text(k.definition_version))
            ),
            lambda w, a: _definitions(w).get_definition(**a),
        ),
        EntryPoint(
            "DefinitionRegistry.definition_versions",
            lambda k: args(definition_id=_definition_ids(k)),
            lambda w, a: _definitions(w).definition_versions(**a),
        ),
        EntryPoint(
            "DefinitionRegistry.delete_definition",
            lambda k: args(definition_id=_definition_ids(k)),
            lambda w, a: _definitions(w).delete_definition(**a),
        ),
        EntryPoint(
            "RunService.start_run",
            lambda k: args(
                definition_id=_definition_ids(k),
                input=JSON,
                budgets=opt(MAPPINGS),
                version=opt(text(k.definition_version)),
                idempotency_key=opt(text("start-1", "start-2")),
            ),
            lambda w, a: _graph(w).start_run(
                a["definition_id"],
                a["input"],
                budgets=a["budgets"],
                version=a["version"],
                idempotency_key=a["idempotency_key"],
            ),
            sqlite=True,
        ),
        EntryPoint(
            "RunService.get_run",
            lambda k: args(run_id=_run_ids(k)),
            lambda w, a: _graph(w).get_run(**a),
        ),
        EntryPoint(
            "RunService.set_status",
            lambda k: args(
                run_id=_run_ids(k),
                target=text(*RUN_STATES),
                expected_status=text(*RUN_STATES),
                node_count=opt(INTS),
                failed_attempts=opt(INTS),
                payload=opt(MAPPINGS),
            ),
            lambda w, a: _graph(w).set_status(
                a["run_id"],
                a["target"],
                expected_status=a["expected_status"],
                node_count=a["node_count"],
                failed_attempts=a["failed_attempts"],
                payload=a["payload"],
            ),
        ),
        EntryPoint(
            "RunService.list_runs",
            lambda k: args(status=opt(text(*RUN_STATES)), cursor=cursors(), limit=INTS),
            lambda w, a: _graph(w).list_runs(a["status"], cursor=a["cursor"], limit=a["limit"]),
            sqlite=True,
        ),
        EntryPoint(
            "RunService.append_run_events",
            lambda k: args(run_id=_run_ids(k), events=caller_events()),
            lambda w, a: _graph(w).append_run_events(**a),
        ),
        EntryPoint(
            "RunService.renew_lease",
            lambda k: args(run_id=_run_ids(k)),
            lambda w, a: _graph(w).renew_lease(**a),
        ),
        EntryPoint(
            "RunService.owner_digest",
            lambda k: args(owner=text("host-a", "")),
            lambda w, a: _graph(w).owner_digest(**a),
            sqlite=True,
        ),
        EntryPoint(
            "RunService.read_run_events",
            lambda k: args(run_id=_run_ids(k), cursor=opt(INTS), limit=INTS),
            lambda w, a: _graph(w).read_run_events(**a),
            sqlite=True,
        ),
        EntryPoint(
            "RunService.finish_run",
            lambda k: args(
                run_id=_run_ids(k),
                status=text(*TERMINAL_RUN_STATES),
                expected_status=text(*RUN_STATES),
                final_state=JSON,
                events=caller_events(),
            ),
            lambda w, a: _graph(w).finish_run(
                a["run_id"],
                a["status"],
                expected_status=a["expected_status"],
                final_state=a["final_state"],
                events=a["events"],
            ),
        ),
        EntryPoint(
            "purge_finished_runs",
            _purge_args,
            lambda w, a: purge_finished_runs(w.runtime.repository, w.runtime.clock, **a),
            sqlite=True,
        ),
    ]


def _definition_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "DefinitionRegistry.reference",
            lambda k: args(
                definition_id=_definition_ids(k),
                version=opt(text(k.definition_version)),
                at=TIMES,
            ),
            lambda w, a: _definitions(w).reference(**a),
        ),
    ]


def _receipt_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "TerminalReceipts.terminal_receipt",
            lambda k: args(run_id=_run_ids(k)),
            lambda w, a: _terminal_receipts(w).terminal_receipt(**a),
        ),
        EntryPoint(
            "TerminalReceipts.final_state_digest",
            lambda k: args(final_state=JSON),
            lambda w, a: _terminal_receipts(w).final_state_digest(**a),
        ),
        EntryPoint(
            "TerminalReceipts.receipt_digest",
            lambda k: args(run_id=_run_ids(k)),
            lambda w, a: _terminal_receipts(w).receipt_digest(**a),
        ),
        EntryPoint(
            "TerminalReceipts.issue",
            lambda k: args(run_id=_run_ids(k), final_digest=digests(k), issued_at=TIMES),
            _issue,
        ),
    ]


def _approval_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "CheckpointService.create_checkpoint",
            lambda k: args(
                run_id=text(k.run_id),
                next_cursor=JSON,
                state=JSON,
                budgets=MAPPINGS,
                counters=MAPPINGS,
                dependency_summary=JSON,
                terminal_cursor=JSON,
                event_cursor=INTS,
            ),
            lambda w, a: _checkpoints(w).create_checkpoint(
                a.pop("run_id"), a.pop("next_cursor"), **a
            ),
        ),
        EntryPoint(
            "CheckpointService.load_checkpoint",
            lambda k: args(checkpoint_id=_checkpoint_ids(k)),
            lambda w, a: _checkpoints(w).load_checkpoint(**a),
        ),
        EntryPoint(
            "CheckpointService.latest_checkpoint",
            lambda k: args(run_id=text(k.run_id)),
            lambda w, a: _checkpoints(w).latest_checkpoint(**a),
        ),
        EntryPoint(
            "CheckpointService.consume_checkpoint",
            lambda k: args(checkpoint_id=_checkpoint_ids(k)),
            lambda w, a: _checkpoints(w).consume_checkpoint(**a),
        ),
        EntryPoint(
            "CheckpointService.purge",
            _purge_args,
            lambda w, a: _checkpoints(w).purge(**a),
        ),
        EntryPoint(
            "ApprovalService.request_approval",
            lambda k: args(
                checkpoint_id=_checkpoint_ids(k),
                expected_state_digest=text(k.checkpoint.state_digest),
                expected_budgets=st.one_of(st.just(k.checkpoint.budgets), MAPPINGS),
                expected_counters=st.one_of(st.just(k.checkpoint.counters), MAPPINGS),
                expected_dependency_digest=text(k.checkpoint.dependency_digest),
                audience=text("finance", "ops"),
                prompt_digest=text(content_hash("prompt")),
                allowed_decisions=st.one_of(
                    st.lists(text("approve", "reject"), max_size=17), text("approve")
                ),
                expires_at=TIMES,
                required=st.one_of(st.just(1), INTS),
                deciders=opt(st.one_of(st.lists(text("ann", "ben"), max_size=4), text("ann"))),
                rejection=text("any", "quorum"),
            ),
            lambda w, a: _approvals(w).request_approval(a.pop("checkpoint_id"), **a),
        ),
        EntryPoint(
            "ApprovalService.get_approval",
            lambda k: args(approval_id=_approval_ids(k)),
            lambda w, a: _approvals(w).get_approval(**a),
        ),
        EntryPoint(
            "ApprovalService.decide",
            lambda k: args(
                approval_id=_approval_ids(k),
                decision=text("approve", "reject"),
                actor=text("bob@example.org"),
                now=opt(TIMES),
                signature=opt(st.one_of(st.binary(max_size=80), text("sig"))),
            ),
            lambda w, a: _approvals(w).decide(**a),
            writes_before_refusing=(ApprovalExpired,),
        ),
        EntryPoint(
            "ApprovalService.status_of",
            lambda k: args(approval=st.one_of(st.just(k.approval), text("approval"), JSON)),
            lambda w, a: _approvals(w).status_of(**a),
        ),
        EntryPoint(
            "ApprovalService.signed_decisions",
            lambda k: args(approval=st.one_of(st.just(k.approval), text("approval"), JSON)),
            lambda w, a: _approvals(w).signed_decisions(**a),
        ),
        EntryPoint(
            "ApprovalService.expire_overdue",
            lambda k: args(now=opt(TIMES)),
            lambda w, a: _approvals(w).expire_overdue(**a),
        ),
        EntryPoint(
            "ApprovalService.register_decider_key",
            lambda k: args(
                decider=text("bob@example.org"),
                public_key_pem=st.one_of(
                    st.just(_DECIDER_PEM), st.binary(max_size=200), text("key")
                ),
            ),
            lambda w, a: _approvals(w).register_decider_key(**a),
        ),
        EntryPoint(
            "ApprovalService.decision_statement",
            lambda k: args(approval_id=_approval_ids(k), decision=text("approve", "reject")),
            lambda w, a: _approvals(w).decision_statement(**a),
        ),
        EntryPoint(
            "ApprovalService.list_approvals",
            lambda k: args(
                run_id=opt(text(k.run_id)),
                status=opt(st.one_of(st.sampled_from(ApprovalStatus), text("pending"))),
                limit=INTS,
                cursor=cursors(),
            ),
            lambda w, a: _approvals(w).list_approvals(**a),
            sqlite=True,
        ),
        EntryPoint(
            "ApprovalService.approval_receipt",
            lambda k: args(
                changes=st.dictionaries(
                    st.sampled_from(
                        ("audience", "prompt_digest", "decision", "actor", "run_id", "approval_id")
                    ),
                    hostile.hostile_text(allow_non_text=False),
                    max_size=2,
                )
            ),
            _tampered_approval,
        ),
        EntryPoint(
            "ApprovalService.purge",
            _purge_args,
            lambda w, a: _approvals(w).purge(**a),
        ),
        EntryPoint(
            "IdempotencyService.remember",
            lambda k: args(key=text(k.idempotency_key, "req-2"), request=JSON, response=JSON),
            lambda w, a: _idempotency(w).remember(**a),
            sqlite=True,
        ),
        EntryPoint(
            "IdempotencyService.recall",
            lambda k: args(key=text(k.idempotency_key), request=JSON),
            lambda w, a: _idempotency(w).recall(**a),
            sqlite=True,
        ),
        EntryPoint(
            "IdempotencyService.purge",
            _purge_args,
            lambda w, a: _idempotency(w).purge(**a),
            sqlite=True,
        ),
        EntryPoint(
            "EvidenceService.capture_witness",
            lambda k: args(
                locator=text("https://example.org/a"),
                content=hostile.hostile_bytes(),
                media_type=text("text/plain"),
                authority_class=text("web"),
                retrieved_at=TIMES,
            ),
            lambda w, a: _evidence(w).capture_witness(**a),
            sqlite=True,
        ),
        EntryPoint(
            "EvidenceService.load_witness",
            lambda k: args(content_digest=text(k.witness_digest)),
            lambda w, a: _evidence(w).load_witness(**a),
        ),
        EntryPoint(
            "RetentionJob.run",
            lambda k: args(
                policy=args(
                    consumed_checkpoints=opt(AGES),
                    decided_approvals=opt(AGES),
                    idempotency_records=opt(AGES),
                    finished_runs=opt(AGES),
                    batch_size=INTS,
                ),
                now=opt(TIMES),
            ),
            _retention,
            sqlite=True,
        ),
    ]


_GENUINE_RECEIPT = HeadReceipt(
    HeadNote(
        stream="workflow/0a",
        size=3,
        head_hash="sha256:" + "ab" * 32,
        first_index=0,
        issued_at=EPOCH,
    ),
    (ReceiptSignature("flowvault-mac", b"\x01\x02\x03\x04", b"\x00" * 32),),
).text()


_GENUINE_TERMINAL_RECEIPT = TerminalReceipt(
    issued_at=EPOCH,
    run="sha256:" + "1" * 64,
    status="completed",
    definition_version="sha256:" + "2" * 64,
    final_state_digest="sha256:" + "3" * 64,
    events_digest="sha256:" + "4" * 64,
    event_count=1,
    signature="sha256:" + "5" * 64,
    signer_hint="01020304",
    ed25519_signature="A" * 86 + "==",
).text()


def _receipt_texts(genuine: str = _GENUINE_RECEIPT) -> st.SearchStrategy[Any]:
    """Hostile text, and a genuine receipt with a few characters replaced, inserted or cut."""
    cut = st.tuples(st.integers(0, len(genuine)), st.integers(0, 4), hostile.hostile_text())
    edited = cut.map(
        lambda c: c[2] if not isinstance(c[2], str) else
        genuine[: c[0]] + c[2][:3] + genuine[c[0] + c[1] :]
    )  # fmt: skip
    return st.one_of(hostile.hostile_text(), st.just(genuine), edited)


def _mark_texts() -> st.SearchStrategy[Any]:
    """Draw a well-formed mark under some key with a few bytes replaced, inserted or cut."""
    digest = b"sha256:" + b"ab" * 32
    genuine = st.sampled_from(
        [
            b"flowvault high-water mark 1\nepoch 12\nmac " + digest + b"\n",
            b"flowvault high-water mark 2\nepoch 12\nlog 3 90 %s\nmac %s\n" % (digest, digest),
        ]
    )
    edits = st.tuples(genuine, st.integers(0, 160), st.integers(0, 4), st.binary(max_size=3))
    return edits.map(lambda c: c[0][: c[1]] + c[3] + c[0][c[1] + c[2] :])


def _mark_logs() -> st.SearchStrategy[Any]:
    """Draw logs: hostile bytes and text, and genuine-looking lines with bytes edited."""
    sizes = st.dictionaries(st.text(max_size=8), st.integers(-2, MAX_SAFE_INTEGER), max_size=3)
    lines = st.lists(sizes, max_size=4).map(
        lambda found: b"".join(canonical_bytes(line) + b"\n" for line in found)
    )
    edited = st.tuples(lines, st.integers(0, 40), st.binary(max_size=3)).map(
        lambda c: c[0][: c[1]] + c[2] + c[0][c[1] + 1 :]
    )
    return st.one_of(hostile.hostile_bytes(), hostile.hostile_text(), lines, edited)


def _receipts(k: Known) -> st.SearchStrategy[Any]:
    """Receipts for streams the world holds or not, at hostile sizes, and non-receipts."""
    notes = st.builds(
        lambda stream, size, first: HeadNote(
            stream=stream,
            size=size,
            head_hash=GENESIS_HASH,
            first_index=min(first, size - 1),
            issued_at=EPOCH,
        ),
        st.sampled_from([*k.streams, "workflow/none"]) if k.streams else st.just("workflow/none"),
        st.sampled_from((1, 2, 3, 1000, MAX_SAFE_INTEGER + 1)),
        st.sampled_from((0, 1)),
    )
    genuine = notes.map(lambda n: HeadReceipt(n, ()))
    return st.one_of(genuine, st.sampled_from((None, "receipt", _GENUINE_RECEIPT, 3)))


def _audit_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "LedgerAudit.run",
            lambda k: args(streams=opt(st.lists(_streams(k), max_size=3))),
            lambda w, a: LedgerAudit(w.store, _repo(w)).run(a["streams"]),
        ),
        EntryPoint(
            "verify_stream",
            lambda k: args(stream=_streams(k)),
            lambda w, a: verify_stream(w.store, a["stream"]),
            sqlite=True,
        ),
        EntryPoint(
            "issue_receipt",
            lambda k: args(stream=_streams(k), issued_at=TIMES),
            lambda w, a: issue_receipt(w.store, _repo(w), a["stream"], issued_at=a["issued_at"]),
            sqlite=True,
        ),
        EntryPoint(
            "parse_receipt",
            lambda k: args(text=_receipt_texts()),
            lambda w, a: parse_receipt(a["text"]),
        ),
        EntryPoint(
            "parse_terminal_receipt",
            lambda k: args(
                text=st.one_of(_receipt_texts(_GENUINE_TERMINAL_RECEIPT), hostile.json_text())
            ),
            lambda w, a: parse_terminal_receipt(a["text"]),
        ),
        EntryPoint(
            "parse_mark",
            lambda k: args(content=st.one_of(hostile.hostile_bytes(), _mark_texts())),
            lambda w, a: parse_mark(a["content"], _repo(w), "mark"),
        ),
        EntryPoint(
            "replay_log",
            lambda k: args(log=_mark_logs(), records=st.integers(0, 5)),
            lambda w, a: replay_log(
                HighWaterMark(1, a["records"], LOG_GENESIS), a["log"], _repo(w), "mark"
            ),
        ),
        EntryPoint(
            "LedgerAudit.issue",
            lambda k: args(stream=_streams(k), issued_at=TIMES),
            lambda w, a: LedgerAudit(w.store, _repo(w)).issue(
                a["stream"], issued_at=a["issued_at"]
            ),
            sqlite=True,
        ),
        EntryPoint(
            "LedgerAudit.against",
            lambda k: args(receipts=st.lists(_receipts(k), max_size=2)),
            lambda w, a: LedgerAudit(w.store, _repo(w)).against(a["receipts"]),
            sqlite=True,
        ),
        EntryPoint(
            "compare_with_receipt",
            lambda k: args(note=_receipts(k).map(lambda r: getattr(r, "note", r))),
            lambda w, a: compare_with_receipt(w.store, a["note"]),
        ),
    ]


def _bytes_args(k: Known) -> st.SearchStrategy[Arguments]:
    return args(
        namespace=_seal_namespaces(k),
        natural_key=text(k.workflow_id, k.scope, "main"),
        data=st.one_of(hostile.hostile_bytes(), JSON),
        expected=expected_revisions(),
        labels=labels_(),
    )


def _blob_rows() -> list[EntryPoint]:
    def blobs(w: World) -> BlobStore:
        return BlobStore(_repo(w))

    def named(k: Known) -> st.SearchStrategy[Arguments]:
        return args(namespace=_seal_namespaces(k), natural_key=text(k.workflow_id, k.scope))

    return [
        EntryPoint(
            "BlobStore.prepare",
            _bytes_args,
            lambda w, a: blobs(w).prepare(
                a["namespace"],
                a["natural_key"],
                a["data"],
                expected=a["expected"],
                **_options(a, "labels"),
            ),
            sqlite=True,
        ),
        EntryPoint(
            "BlobStore.write",
            _bytes_args,
            lambda w, a: blobs(w).write(
                a["namespace"],
                a["natural_key"],
                a["data"],
                expected=a["expected"],
                **_options(a, "labels"),
            ),
            sqlite=True,
        ),
        EntryPoint("BlobStore.read", named, lambda w, a: blobs(w).read(**a), sqlite=True),
        EntryPoint("BlobStore.info", named, lambda w, a: blobs(w).info(**a), sqlite=True),
        EntryPoint("BlobStore.exists", named, lambda w, a: blobs(w).exists(**a), sqlite=True),
        EntryPoint("BlobStore.deletes", named, lambda w, a: blobs(w).deletes(**a), sqlite=True),
        EntryPoint(
            "BlobStore.deletes_at",
            lambda k: args(namespace=_seal_namespaces(k), key_digest=digests(k)),
            lambda w, a: blobs(w).deletes_at(a["namespace"], a["key_digest"]),
            sqlite=True,
        ),
        EntryPoint(
            "BlobStore.content_digest",
            lambda k: args(data=st.one_of(hostile.hostile_bytes(), JSON)),
            lambda w, a: blobs(w).content_digest(a["data"]),
        ),
    ]


def _sealed_rows() -> list[EntryPoint]:
    def sealed(method: str) -> Call:
        def call(w: World, a: Arguments) -> object:
            options = _options(a, "sensitivity", "schema_version", "labels")
            target = getattr(_repo(w), method)
            return target(
                a["namespace"], a["natural_key"], a["document"], expected=a["expected"], **options
            )

        return call

    return [
        EntryPoint(
            "SealedRepository.key_digest",
            lambda k: args(namespace=_seal_namespaces(k), natural_key=text(k.workflow_id)),
            lambda w, a: _repo(w).key_digest(**a),
        ),
        EntryPoint(
            "SealedRepository.keyed_digest",
            lambda k: args(
                tag=text("flowvault.decider/1"), data=st.one_of(text(), hostile.hostile_bytes())
            ),
            lambda w, a: _repo(w).keyed_digest(**a),
        ),
        EntryPoint("SealedRepository.prepare", _seal_args, sealed("prepare"), sqlite=True),
        EntryPoint("SealedRepository.write", _seal_args, sealed("write"), sqlite=True),
        EntryPoint(
            "SealedRepository.read",
            lambda k: args(
                namespace=_seal_namespaces(k),
                natural_key=text(k.workflow_id, k.scope),
                sensitivity=sensitivities(),
                max_schema_version=opt(INTS),
            ),
            lambda w, a: _repo(w).read(
                a["namespace"],
                a["natural_key"],
                sensitivity=a["sensitivity"],
                max_schema_version=a["max_schema_version"],
            ),
            sqlite=True,
        ),
        EntryPoint(
            "SealedRepository.open",
            lambda k: args(namespace=_seal_namespaces(k), key_digest=digests(k)),
            _open,
        ),
        EntryPoint(
            "SealedRepository.prepare_bytes",
            _bytes_args,
            lambda w, a: _repo(w).prepare_bytes(
                a["namespace"],
                a["natural_key"],
                a["data"],
                expected=a["expected"],
                **_options(a, "labels"),
            ),
            sqlite=True,
        ),
        EntryPoint(
            "SealedRepository.prepare_bytes_at",
            lambda k: args(
                namespace=_seal_namespaces(k),
                key_digest=digests(k),
                data=st.one_of(hostile.hostile_bytes(), JSON),
                expected=expected_revisions(),
                labels=labels_(),
            ),
            lambda w, a: _repo(w).prepare_bytes_at(
                a["namespace"],
                a["key_digest"],
                a["data"],
                expected=a["expected"],
                **_options(a, "labels"),
            ),
            sqlite=True,
        ),
        EntryPoint(
            "SealedRepository.read_bytes",
            lambda k: args(namespace=_seal_namespaces(k), natural_key=text(k.workflow_id, k.scope)),
            lambda w, a: _repo(w).read_bytes(a["namespace"], a["natural_key"]),
            sqlite=True,
        ),
        EntryPoint(
            "SealedRepository.open_bytes",
            lambda k: args(namespace=_seal_namespaces(k), key_digest=digests(k)),
            lambda w, a: _repo(w).open_bytes(
                w.known.record, namespace=a["namespace"], key_digest=a["key_digest"]
            ),
        ),
        EntryPoint(
            "SealedRepository.verify",
            lambda k: args(namespace=_seal_namespaces(k), key_digest=digests(k)),
            lambda w, a: _repo(w).verify(
                w.known.record, namespace=a["namespace"], key_digest=a["key_digest"]
            ),
        ),
        *_blob_rows(),
        EntryPoint(
            "SealedRepository.reseal",
            lambda k: args(stored=st.booleans(), junk=JSON),
            lambda w, a: _repo(w).reseal(w.known.record if a["stored"] else a["junk"]),
            sqlite=True,
        ),
        EntryPoint(
            "KeyRotation.run",
            lambda k: args(
                batch_size=INTS, progress=st.one_of(st.none(), st.just(_ignore_progress), JSON)
            ),
            lambda w, a: KeyRotation(_repo(w), batch_size=a["batch_size"]).run(
                progress=a["progress"]
            ),
            sqlite=True,
        ),
    ]


def _ignore_progress(done: int, total: int) -> None:
    """Accept what rotation reports, as a well-formed progress callback does."""


def _counter(w: World) -> SealCounter:
    assert isinstance(w.store, SealCounter)
    return w.store


def _store_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "store.load",
            lambda k: args(namespace=_namespaces(k), key_digest=digests(k)),
            lambda w, a: w.store.load(**a),
            sqlite=True,
        ),
        EntryPoint(
            "store.reserve_seals",
            lambda k: args(key_id=text("k0123456789ab"), count=INTS),
            lambda w, a: _counter(w).reserve_seals(**a),
            sqlite=True,
        ),
        EntryPoint(
            "store.peek_metadata",
            lambda k: args(namespace=_namespaces(k), key_digest=digests(k)),
            lambda w, a: w.store.peek_metadata(**a),
            sqlite=True,
        ),
        EntryPoint(
            "store.list",
            lambda k: args(
                namespace=_namespaces(k),
                filters=st.lists(
                    st.tuples(
                        text("state", "run", "status", "created_at"),
                        st.one_of(text(), INTS),
                        st.sampled_from(FilterOp),
                    ),
                    max_size=3,
                ),
                order=st.sampled_from(Order),
                cursor=cursors(),
                limit=INTS,
            ),
            _list,
            sqlite=True,
        ),
        EntryPoint(
            "store.commit",
            lambda k: args(
                upserts=st.lists(
                    st.tuples(
                        _namespaces(k),
                        text("main"),
                        INTS,
                        hostile.hostile_bytes(),
                        expected_revisions(),
                        st.one_of(st.just({}), MAPPINGS),
                    ),
                    max_size=2,
                ),
                deletes=st.lists(
                    st.tuples(_namespaces(k), digests(k), expected_revisions()), max_size=2
                ),
                appends=st.lists(
                    st.tuples(_streams(k), INTS, text("note.added"), JSON, digests(k)), max_size=2
                ),
                trims=st.lists(st.tuples(_streams(k), INTS), max_size=2),
            ),
            _commit,
            sqlite=True,
        ),
        EntryPoint(
            "store.ledger_head",
            lambda k: args(stream=_streams(k)),
            lambda w, a: w.store.ledger_head(**a),
            sqlite=True,
        ),
        EntryPoint(
            "store.ledger_head_index",
            lambda k: args(stream=_streams(k)),
            lambda w, a: w.store.ledger_head_index(**a),  # type: ignore[attr-defined]
            sqlite=True,
        ),
        EntryPoint(
            "store.ledger_head_indexes",
            lambda k: args(streams=st.one_of(st.lists(_streams(k), max_size=4), _streams(k))),
            lambda w, a: w.store.ledger_head_indexes(**a),  # type: ignore[attr-defined]
            sqlite=True,
        ),
        EntryPoint(
            "store.read_ledger",
            lambda k: args(stream=_streams(k), from_index=INTS, limit=INTS),
            lambda w, a: w.store.read_ledger(
                a["stream"], from_index=a["from_index"], limit=a["limit"]
            ),
            sqlite=True,
        ),
        EntryPoint(
            "store.list_streams",
            lambda k: args(after=opt(_streams(k)), limit=INTS),
            lambda w, a: w.store.list_streams(after=a["after"], limit=a["limit"]),  # type: ignore[attr-defined]
            sqlite=True,
        ),
    ]


def _helper_rows() -> list[EntryPoint]:
    states = text(*WORKFLOW_STATES)
    return [
        EntryPoint(
            "parse_json", lambda k: args(data=hostile.json_text()), lambda w, a: parse_json(**a)
        ),
        EntryPoint("validate_json", lambda k: args(value=JSON), lambda w, a: validate_json(**a)),
        EntryPoint("canonical_json", lambda k: args(value=JSON), lambda w, a: canonical_json(**a)),
        EntryPoint(
            "canonical_bytes", lambda k: args(value=JSON), lambda w, a: canonical_bytes(**a)
        ),
        EntryPoint("content_hash", lambda k: args(value=JSON), lambda w, a: content_hash(**a)),
        EntryPoint(
            "natural_key_digest",
            lambda k: args(namespace=text(*k.namespaces), natural_key=text()),
            lambda w, a: natural_key_digest(**a),
        ),
        EntryPoint("format_instant", lambda k: args(value=TIMES), lambda w, a: format_instant(**a)),
        EntryPoint(
            "sanitise_payload",
            lambda k: args(
                value=JSON, max_depth=opt(INTS), max_string=opt(INTS), max_bytes=opt(INTS)
            ),
            _sanitise,
        ),
        EntryPoint(
            "verify_chain",
            lambda k: args(
                stream=st.sampled_from(k.streams),
                position=st.integers(0, 20),
                field=st.sampled_from(
                    (
                        "stream",
                        "index",
                        "type",
                        "payload",
                        "previous_hash",
                        "event_hash",
                        "occurred_at",
                        "from_state",
                        "event_key",
                    )
                ),
                value=st.one_of(INTS, text(), JSON, TIMES),
                start_index=opt(INTS),
                previous_hash=opt(text(GENESIS_HASH)),
            ),
            _verify_chain,
        ),
        EntryPoint(
            "checkpoint_id_for",
            lambda k: args(run_id=text(k.run_id), next_cursor=JSON),
            lambda w, a: checkpoint_id_for(**a),
        ),
        EntryPoint(
            "LedgerEvent.create",
            lambda k: args(
                stream=text(*k.streams),
                index=INTS,
                type=text("note.added"),
                occurred_at=TIMES,
                payload=JSON,
                previous_hash=text(GENESIS_HASH),
                from_state=opt(states),
                to_state=opt(states),
                event_key=opt(text()),
            ),
            lambda w, a: LedgerEvent.create(**a),
        ),
        EntryPoint(
            "StateMachine.from_json",
            lambda k: args(
                data=st.one_of(
                    MAPPINGS,
                    JSON,
                    args(
                        name=text("flow"),
                        initial=text("a"),
                        states=st.lists(text("a", "b"), max_size=3),
                        terminal=st.lists(text("b"), max_size=2),
                        transitions=st.dictionaries(
                            keys("a"), st.lists(text("b"), max_size=2), max_size=2
                        ),
                    ),
                )
            ),
            lambda w, a: StateMachine.from_json(**a),
        ),
        EntryPoint(
            "StateMachine.assert_transition",
            lambda k: args(current=states, target=states),
            lambda w, a: DEFAULT_LIFECYCLE.assert_transition(**a),
        ),
        EntryPoint(
            "parse_master_key",
            lambda k: args(
                text=st.one_of(
                    text("A" * 43 + "="),
                    hostile.hostile_bytes(),
                    st.binary(min_size=30, max_size=34).map(
                        lambda raw: base64.urlsafe_b64encode(raw).decode()
                    ),
                ),
                source=text("FLOWVAULT_KEY"),
            ),
            lambda w, a: parse_master_key(**a),
        ),
        EntryPoint(
            "ListCursor.decode",
            lambda k: args(cursor=cursors(), order=st.sampled_from(Order)),
            lambda w, a: ListCursor.decode(**a),
        ),
        EntryPoint(
            "effective_limit", lambda k: args(limit=INTS), lambda w, a: effective_limit(**a)
        ),
    ]


def _stream(world: World, a: Arguments) -> StreamWriter:
    return world.runtime.stream(a["stream"])


def _append(world: World, a: Arguments) -> object:
    repository = world.runtime.repository
    upserts = [
        repository.prepare(namespace, key, document, expected=expected)
        for namespace, key, document, expected in a["upserts"]
    ]
    return _stream(world, a).append(a["event_type"], a["payload"], upserts=upserts)


def _stream_rows() -> list[EntryPoint]:
    return [
        EntryPoint("Runtime.stream", lambda k: args(stream=text("orders")), _stream),
        EntryPoint(
            "StreamWriter.append",
            lambda k: args(
                stream=text("orders"),
                event_type=text("order.updated"),
                payload=JSON,
                upserts=st.lists(
                    st.tuples(text(*k.namespaces), text("o-1"), JSON, expected_revisions()),
                    max_size=2,
                ),
            ),
            _append,
            sqlite=True,
        ),
    ]


def _approval_flow_rows() -> list[EntryPoint]:
    return [
        EntryPoint(
            "ApprovalFlow.pause_for_approval",
            lambda k: args(
                run_id=_run_ids(k),
                next_cursor=JSON,
                audience=text("finance", "ops"),
                prompt=text("Pay?"),
                state=JSON,
                expires_in=st.one_of(st.timedeltas(), INTS, TIMES),
                allowed_decisions=st.one_of(
                    st.lists(text("approve", "reject"), max_size=17), text("approve")
                ),
            ),
            lambda w, a: w.runtime.approval_flow.pause_for_approval(
                a.pop("run_id"), a.pop("next_cursor"), **a
            ),
            sqlite=True,
        ),
        EntryPoint(
            "ApprovalFlow.decide_and_resume",
            lambda k: args(
                approval_id=_approval_ids(k),
                decision=text("approve", "reject"),
                actor=text("bob@example.org"),
                signature=opt(st.one_of(st.binary(max_size=80), text("sig"))),
            ),
            lambda w, a: w.runtime.approval_flow.decide_and_resume(
                a.pop("approval_id"), a.pop("decision"), a.pop("actor"), **a
            ),
            writes_before_refusing=(ApprovalExpired,),
        ),
    ]


ENTRY_POINTS: tuple[EntryPoint, ...] = (
    *_workflow_rows(),
    *_state_rows(),
    *_stream_rows(),
    *_run_result_rows(),
    *_graph_rows(),
    *_definition_rows(),
    *_receipt_rows(),
    *_approval_rows(),
    *_approval_flow_rows(),
    *_audit_rows(),
    *_sealed_rows(),
    *_store_rows(),
    *_helper_rows(),
)
"""Every entry point the family covers, in the order the report lists them."""

SQLITE_ENTRY_POINTS = tuple(entry for entry in ENTRY_POINTS if entry.sqlite)

WITHOUT_INPUT = {
    "WorkflowService.compact": "takes no input",
    "WorkflowService.machine": "a property",
    "RunService.compact": "takes no input",
    "RunService.recover_incomplete_runs": "takes no input",
    "RunService.renew_leases": "takes no input",
    "RunService.host_id": "a property",
    "CheckpointService.repository": "a property",
    "CheckpointService.records": "a property",
    "SealedRepository.clock": "a property",
    "SealedRepository.store": "a property",
    "KeyRotation.pending": "takes no input",
    "StateRepository.scope": "a property",
    "StreamWriter.stream": "a property",
}
"""Public members with no caller input to be hostile with, so no row."""


# -- the harness ---------------------------------------------------------------------


@dataclass
class Tally:
    """Examples run and anomalies seen across the module, for its one figure."""

    watch: reliability.Stopwatch = field(default_factory=reliability.Stopwatch)
    trials: int = 0
    anomalies: int = 0
    memory_rows: int = 0
    sqlite_rows: int = 0
    leak_caught: bool | None = None
    partial_caught: bool | None = None


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    """Collect every row's counts, then record the family's figure once."""
    counts = Tally()
    yield counts
    controls = (counts.leak_caught, counts.partial_caught)
    reliability.record(
        reliability.Figure(
            family=FAMILY,
            trials=counts.trials,
            anomalies=counts.anomalies,
            control_caught=None if None in controls else all(controls),
            detail=(
                f"{counts.memory_rows} entry points on memory, "
                f"{counts.sqlite_rows} of them also on SQLite"
            ),
            seconds=counts.watch.seconds,
        )
    )


def seed_of(name: str, backend: str) -> int:
    """Return the row's seed: the run's base seed moved by a stable hash of the row."""
    return reliability.seed_base() + zlib.crc32(f"{backend}:{name}".encode())


class Worlds:
    """A row's world, replaced by a fresh one every ``RENEW_EVERY`` examples.

    Successful calls add records, and each commit retakes a snapshot of the
    whole store; renewing keeps that cost flat over a long run. Worlds are
    identical when fresh (fixed key, clock and ids), so drawn ids stay valid.
    """

    def __init__(self, backend: str, root: Path) -> None:
        self._backend = backend
        self._root = root
        self._opened = 0
        self._stack = ExitStack()
        self.current = self._open()

    def _open(self) -> World:
        self._opened += 1
        return self._stack.enter_context(open_world(self._backend, self._root / f"w{self._opened}"))

    def renew(self) -> World:
        """Close the current world and return a fresh one."""
        self._stack.close()
        self._stack = ExitStack()
        self.current = self._open()
        return self.current

    def close(self) -> None:
        """Close the current world."""
        self._stack.close()


def exercise(entry: EntryPoint, worlds: Worlds, examples: int, seed_value: int) -> int:
    """Run the property over ``examples`` drawn arguments, in batches; return how many ran.

    One hypothesis run remembers every choice it made, so a run of 10^5
    examples with huge strings grows by gigabytes; batches of ``BATCH``
    examples, each under its own seed, keep the long profile's memory flat.
    """
    ran = 0
    for batch, start in enumerate(range(0, examples, BATCH)):
        ran += _exercise_batch(entry, worlds, min(BATCH, examples - start), seed_value + batch)
    return ran


def _exercise_batch(entry: EntryPoint, worlds: Worlds, examples: int, seed_value: int) -> int:
    world = worlds.current
    state = {"before": snapshot(world.store)}
    ran = 0

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(entry.arguments(world.known))
    def holds(arguments: Arguments) -> None:
        nonlocal ran, world
        ran += 1
        if ran % RENEW_EVERY == 1 and ran > 1:
            world = worlds.renew()
            state["before"] = snapshot(world.store)
        verdict, state["before"] = judge(
            lambda: entry.call(world, dict(arguments)),
            world,
            state["before"],
            entry.writes_before_refusing,
        )
        if verdict.anomaly is not None:
            raise AssertionError(
                f"{entry.name} (seed {seed_value}, trial {ran}): {verdict.anomaly}"
            ) from verdict.error

    holds()
    return ran


def _run_row(entry: EntryPoint, backend: str, examples: int, tmp_path: Path, tally: Tally) -> None:
    worlds = Worlds(backend, tmp_path)
    try:
        tally.trials += exercise(entry, worlds, examples, seed_of(entry.name, backend))
    except AssertionError:
        tally.anomalies += 1
        raise
    finally:
        worlds.close()


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda entry: entry.name)
def test_entry_point_on_memory(entry: EntryPoint, tmp_path: Path, tally: Tally) -> None:
    """Hostile arguments get a typed error or success, and a refused call writes nothing."""
    tally.memory_rows += 1
    _run_row(entry, "memory", MEMORY_EXAMPLES, tmp_path, tally)


@pytest.mark.parametrize("entry", SQLITE_ENTRY_POINTS, ids=lambda entry: entry.name)
def test_entry_point_on_sqlite(entry: EntryPoint, tmp_path: Path, tally: Tally) -> None:
    """The same promise on an SQLite file: driver errors surface only as typed errors."""
    tally.sqlite_rows += 1
    _run_row(entry, "sqlite", SQLITE_EXAMPLES, tmp_path, tally)


# -- what the family found -----------------------------------------------------------

_NAIVE = datetime(2026, 1, 1)
_FIRST_DAY = datetime(1, 1, 1, tzinfo=UTC)
_HUGE = 10**4301
_SET = frozenset()
"""Not a JSON object key, and pydantic's JSON serialiser refuses it with a bare TypeError."""
_LATER = T0 + timedelta(days=2)

FOUND: tuple[tuple[str, Callable[[Known], Arguments]], ...] = (
    ("parse_json", lambda k: {"data": None}),
    ("StateMachine.assert_transition", lambda k: {"current": "intake", "target": [1]}),
    ("StateMachine.assert_transition", lambda k: {"current": "intake", "target": _HUGE}),
    ("verify_chain", lambda k: {**_chain(k), "start_index": "1"}),
    ("verify_chain", lambda k: {**_chain(k), "previous_hash": b"sha256:"}),
    ("sanitise_payload", lambda k: {**_limits(), "max_depth": "8"}),
    ("parse_master_key", lambda k: {"text": None, "source": "FLOWVAULT_KEY"}),
    ("parse_master_key", lambda k: {"text": bytearray(b"key"), "source": "FLOWVAULT_KEY"}),
    ("parse_master_key", lambda k: {"text": "", "source": _HUGE}),
    ("ListCursor.decode", lambda k: {"cursor": 7, "order": Order.KEY}),
    ("store.list", lambda k: {**_listing(k), "filters": [([1], 1, FilterOp.EQ)]}),
    ("store.list", lambda k: {**_listing(k), "cursor": ("not", "text")}),
    ("store.commit", lambda k: {**_unit(), "deletes": [(bytearray(b"ns"), "d", Guard.ANY)]}),
    ("store.commit", lambda k: {**_unit(), "trims": [(k.streams[0], "1")]}),
    ("store.commit", lambda k: {**_unit(), "trims": [(f"workflow/{k.workflow_id}", 1.5)]}),
    ("store.load", lambda k: {"namespace": bytearray(b"ns"), "key_digest": "d"}),
    ("store.ledger_head", lambda k: {"stream": {"a": 1}}),
    ("store.ledger_head_index", lambda k: {"stream": [k.streams[0]]}),
    ("store.ledger_head_indexes", lambda k: {"streams": [k.streams[0], [k.streams[0]]]}),
    ("store.read_ledger", lambda k: {"stream": k.streams[0], "from_index": "0", "limit": 1}),
    ("store.list_streams", lambda k: {"after": 1, "limit": 10}),
    ("SealedRepository.keyed_digest", lambda k: {"tag": "flowvault.decider/1", "data": None}),
    ("SealedRepository.keyed_digest", lambda k: {"tag": "flowvault.decider/1", "data": "\ud800"}),
    ("SealedRepository.prepare", lambda k: {**_seal(k), "expected": "1"}),
    ("SealedRepository.read", lambda k: {**_read(k), "namespace": [1]}),
    ("SealedRepository.read", lambda k: {**_read(k), "max_schema_version": "3"}),
    ("WorkflowService.create", lambda k: {"order": _order(), "original_content_hash": "x"}),
    ("WorkflowService.transition", lambda k: {**_move(k), "event_type": bytearray(b"t")}),
    ("WorkflowService.transition", lambda k: {**_move(k), "expected_version": _HUGE}),
    ("WorkflowEventService.append_event", lambda k: {**_note(k), "event_key": 1}),
    (
        "WorkflowEventService.append_event",
        lambda k: {**_note(k), "payload": {"decided_by": "\ud800"}},
    ),
    (
        "ActionResultService.get_action_result",
        lambda k: {"workflow_id": k.workflow_id, "action_hash": 1},
    ),
    ("ActionResultService.put_action_result", lambda k: {**_result(k), "retention": 1}),
    ("ActionResultService.purge_expired", lambda k: {"now": _NAIVE, "batch_size": 10}),
    (
        "WorkflowEventService.decision_receipt",
        lambda k: {"workflow_id": _HUGE, "event": _decision()},
    ),
    (
        "WorkflowEventService.decision_receipt",
        lambda k: {"workflow_id": k.workflow_id, "event": _decision(f"workflow/{k.workflow_id}")},
    ),
    ("RunService.read_run_events", lambda k: {"run_id": _HUGE, "cursor": None, "limit": 10}),
    ("StateRepository.fingerprint", lambda k: {"scope": "main", "reason_class": 1}),
    ("StateRepository.save", lambda k: {"scope": "main", "state": WorkflowState(blob=b"\xff")}),
    ("StateRepository.save", lambda k: {"scope": "main", "state": WorkflowState(deep=_deep())}),
    ("StateRepository.save", lambda k: {"scope": "main", "state": WorkflowState(odd={_SET: 1})}),
    ("ResultRepository.list", lambda k: {"since": "2026-01-01", "cursor": None, "limit": 10}),
    ("RunService.finish_run", lambda k: {**_finish(k), "status": bytearray(b"completed")}),
    ("purge_finished_runs", lambda k: _purge(_FIRST_DAY, timedelta(days=1), 10)),
    ("purge_finished_runs", lambda k: _purge(T0, None, 10)),
    ("purge_finished_runs", lambda k: _purge(T0, timedelta(days=1), b"1")),
    ("CheckpointService.purge", lambda k: _purge(_FIRST_DAY, timedelta(days=1), 10)),
    ("ApprovalService.purge", lambda k: _purge(_FIRST_DAY, timedelta(days=1), 10)),
    ("IdempotencyService.purge", lambda k: _purge(_FIRST_DAY, timedelta(days=1), 10)),
    ("RetentionJob.run", lambda k: {"policy": {"decided_approvals": "90 days"}, "now": _LATER}),
    ("RetentionJob.run", lambda k: {"policy": {}, "now": _FIRST_DAY}),
    ("RetentionJob.run", lambda k: {"policy": {}, "now": _NAIVE}),
    ("ApprovalService.list_approvals", lambda k: {"run_id": k.run_id, "status": [1], "limit": 5}),
    ("ApprovalService.request_approval", lambda k: {**_request(k), "allowed_decisions": None}),
)
"""Arguments that made an entry point fail before the fix the report lists, one per cause.

``RetentionJob.run`` with ``now`` on the first representable day first purged
expired action results, then refused: a partial write. The others raised
``TypeError``, ``ValueError``, ``AttributeError``, ``OverflowError``,
``UnicodeError`` or a pydantic ``ValidationError``.
"""


def _chain(k: Known) -> Arguments:
    fields = {"stream": k.streams[0], "position": 0, "field": "type", "value": "x"}
    return {**fields, "start_index": None, "previous_hash": None}


def _limits() -> Arguments:
    return {"value": {}, "max_depth": None, "max_string": None, "max_bytes": None}


def _listing(k: Known) -> Arguments:
    return {
        "namespace": k.namespaces[0],
        "filters": [],
        "order": Order.KEY,
        "cursor": None,
        "limit": 5,
    }


def _unit() -> Arguments:
    return {"upserts": [], "deletes": [], "appends": [], "trims": []}


def _seal(k: Known) -> Arguments:
    fields = {"namespace": k.namespaces[0], "natural_key": "key", "document": {}, "expected": 1}
    return {**fields, "sensitivity": None, "schema_version": None, "labels": None}


def _read(k: Known) -> Arguments:
    fields = {"namespace": "flowvault.workflows", "natural_key": k.workflow_id}
    return {**fields, "sensitivity": None, "max_schema_version": None}


def _order() -> WorkOrder:
    return WorkOrder.model_validate(_ORDER_FALLBACK)


def _move(k: Known) -> Arguments:
    fields = {"workflow_id": k.workflow_id, "target": "executing", "expected_state": "decision"}
    return {
        **fields,
        "expected_version": 4,
        "event_type": "workflow.transitioned",
        "payload": None,
        "output_content_hash": None,
        "stop_reason": None,
    }


def _note(k: Known) -> Arguments:
    fields = {"workflow_id": k.workflow_id, "event_type": "note.added"}
    return {
        **fields,
        "expected_state": "decision",
        "expected_version": 4,
        "payload": None,
        "event_key": None,
    }


def _result(k: Known) -> Arguments:
    fields = {"workflow_id": k.workflow_id, "action_hash": content_hash("other")}
    return {**fields, "result": {}, "retention": timedelta(hours=1)}


def _decision(stream: str = "x") -> LedgerEvent:
    """Build a decision event without the action hash a receipt needs."""
    return _event_or_default(
        {"stream": stream, "index": 0, "type": "decision.approved", "payload": {}}
    )


def _deep() -> object:
    return hostile.NASTY_MAPPINGS[1]


def _finish(k: Known) -> Arguments:
    fields = {"run_id": k.run_id, "status": "completed", "expected_status": "running"}
    return {**fields, "final_state": {}, "events": []}


def _purge(now: object, older_than: object, batch_size: object) -> Arguments:
    return {"now": now, "older_than": older_than, "batch_size": batch_size}


def _request(k: Known) -> Arguments:
    checkpoint = k.checkpoint
    return {
        "checkpoint_id": checkpoint.checkpoint_id,
        "expected_state_digest": checkpoint.state_digest,
        "expected_budgets": checkpoint.budgets,
        "expected_counters": checkpoint.counters,
        "expected_dependency_digest": checkpoint.dependency_digest,
        "audience": "ops",
        "prompt_digest": content_hash("prompt"),
        "allowed_decisions": ["approve"],
        "expires_at": T0 + timedelta(days=2),
    }


_ROWS = {entry.name: entry for entry in ENTRY_POINTS}


FOUND_ON_SQLITE: tuple[tuple[str, Callable[[Known], Arguments]], ...] = (
    ("store.read_ledger", lambda k: {"stream": k.streams[0], "from_index": "0", "limit": 1}),
)
"""The same, for a cause only the SQLite adapter had."""

_CASES = [
    *(pytest.param(name, build, "memory", id=name) for name, build in FOUND),
    *(pytest.param(name, build, "sqlite", id=f"sqlite:{name}") for name, build in FOUND_ON_SQLITE),
]


@pytest.mark.parametrize(("name", "build", "backend"), _CASES)
def test_found_examples_stay_fixed(
    name: str, build: Callable[[Known], Arguments], backend: str, tmp_path: Path
) -> None:
    """Each input that once crashed an entry point, or half-wrote, now meets the property."""
    entry = _ROWS[name]
    with open_world(backend, tmp_path) as world:
        arguments = build(world.known)
        verdict, _ = judge(
            lambda: entry.call(world, dict(arguments)),
            world,
            snapshot(world.store),
            entry.writes_before_refusing,
        )
    assert verdict.anomaly is None, f"{name}: {verdict.anomaly}"


# -- negative controls ------------------------------------------------------------------


class _HalfWritingStore:
    """A broken store: it applies a unit's first upsert, then reports a conflict."""

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner

    def commit(self, unit: UnitOfWork) -> None:
        if len(unit.upserts) + len(unit.appends) > 1:
            self._inner.commit(UnitOfWork(upserts=unit.upserts[:1]))
            raise RevisionConflict("simulated conflict after a partial write", guard="upsert")
        self._inner.commit(unit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _falsified(
    entry: EntryPoint, world: World, strategy: st.SearchStrategy[Arguments]
) -> str | None:
    """Return the anomaly the property finds for ``entry`` within the control budget."""
    before = snapshot(world.store)
    found: list[str] = []

    def breaks(arguments: Arguments) -> bool:
        verdict, _ = judge(
            lambda: entry.call(world, dict(arguments)),
            world,
            before,
            entry.writes_before_refusing,
        )
        if verdict.anomaly is not None:
            found.append(verdict.anomaly)
        return verdict.anomaly is not None

    try:
        find(
            strategy,
            breaks,
            settings=settings(
                max_examples=CONTROL_EXAMPLES,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    except NoSuchExample:
        return None
    return found[-1]


def _leaky_parse(world: World, a: Arguments) -> object:
    try:
        return parse_json(a["data"])
    except FlowvaultError as error:
        raise ValueError("malformed JSON") from error


def test_negative_controls(tmp_path: Path, tally: Tally) -> None:
    """The same check flags an entry point that leaks a ValueError and a store that half-writes."""
    leaky = EntryPoint(
        "parse_json (leaks ValueError)", lambda k: args(data=hostile.json_text()), _leaky_parse
    )
    with open_world("memory", tmp_path / "leak") as world:
        leak = _falsified(leaky, world, leaky.arguments(world.known))
    tally.leak_caught = leak is not None and "ValueError escaped" in leak

    create = next(entry for entry in ENTRY_POINTS if entry.name == "WorkflowService.create")
    with open_world("memory", tmp_path / "partial") as world:
        broken = bootstrap(
            Settings(backend="memory", home=tmp_path / "broken"),
            key=KEY,
            store=_HalfWritingStore(world.store),
            clock=FrozenClock(),
            ids=SequentialIds("broken"),
        )
        half_world = World(broken, world.known)
        half_world.count_commits()
        partial = _falsified(create, half_world, create.arguments(world.known))
    tally.partial_caught = partial is not None and partial.startswith("partial write")

    assert tally.leak_caught, f"the leak control was not caught: {leak}"
    assert tally.partial_caught, f"the half-writing store was not caught: {partial}"


def test_table_covers_every_public_method() -> None:
    """Every public method of every service, the repository and the store port has a row."""
    covered = {entry.name for entry in ENTRY_POINTS}
    classes: Sequence[tuple[str, type]] = (
        ("WorkflowService", WorkflowService),
        ("WorkflowEventService", WorkflowEventService),
        ("ActionResultService", ActionResultService),
        ("StateRepository", StateRepository),
        ("StreamWriter", StreamWriter),
        ("ResultRepository", ResultRepository),
        ("RunService", RunService),
        ("DefinitionRegistry", DefinitionRegistry),
        ("TerminalReceipts", TerminalReceipts),
        ("CheckpointService", CheckpointService),
        ("ApprovalService", ApprovalService),
        ("ApprovalFlow", ApprovalFlow),
        ("IdempotencyService", IdempotencyService),
        ("EvidenceService", EvidenceService),
        ("SealedRepository", SealedRepository),
        ("BlobStore", BlobStore),
        ("RetentionJob", RetentionJob),
        ("LedgerAudit", LedgerAudit),
        ("KeyRotation", KeyRotation),
        ("store", SecureObjectStore),
    )
    missing = [
        f"{prefix}.{name}"
        for prefix, cls in classes
        for name in vars(cls)
        if not name.startswith("_")
        and callable(getattr(cls, name))
        and f"{prefix}.{name}" not in covered
        and f"{prefix}.{name}" not in WITHOUT_INPUT
        and name != "close"
    ]
    assert not missing, f"entry points without a hostile-input row: {missing}"
