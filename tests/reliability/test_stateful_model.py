"""Stateful model check: every call on every backend answers what a plain-dict model predicts.

One hypothesis ``RuleBasedStateMachine`` drives a real runtime (memory,
SQLite files on disk, a PostgreSQL schema) through sealed record writes and
CAS updates, raw ledger appends, idempotent workflow creation and keyed
events, request-bound idempotency, checkpoints, approvals, workflow state and
resets, the clock moving past deadlines, and closing and reopening the
store. ``store_model.StoreModel`` predicts each result and error code; after
every step every record the model knows must open with the predicted
content and revision, every ledger stream must verify with the predicted
length, and the store must hold nothing else. The negative controls run
the same machine over stores that lose ledger appends or honour a stale
guard, and the check must catch them.
"""

from __future__ import annotations

import builtins
import hashlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import pytest
import reliability
import store_model
from graph_services import graph_runs
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky, HypothesisException
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pydantic import SecretStr

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    Delete,
    Guard,
    LabelFilter,
    LedgerPage,
    Order,
    RecordMetadata,
    RecordPage,
    SecureObjectStore,
    StoredRecord,
    StoreStats,
    StreamCatalog,
    UnitOfWork,
    Upsert,
)
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    CHECKPOINT_KIND,
    DEFINITION_KIND,
    IDEMPOTENCY_KIND,
    RESULT_KIND,
    WITNESS_KIND,
)
from flowvault.application._graph_namespaces import (
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_DEFINITIONS,
    GRAPH_RUNS,
)
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    REQUEST_IDEMPOTENCY,
)
from flowvault.application._state import STATE_NAMESPACE
from flowvault.application._streams import keyed, read_stream
from flowvault.application._workflow_events import EVENT_KEYS
from flowvault.application._workflow_records import WORKFLOWS
from flowvault.application._workflows import IDEMPOTENCY
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.application.testing._fakes import EPOCH
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    FlowvaultError,
    LedgerEvent,
    RevisionConflict,
    WorkflowState,
    WorkOrder,
    content_hash,
)
from flowvault.domain._ledger import verify_chain

SEED = reliability.seed_base()
KEY = hashlib.sha256(f"flowvault-stateful-model/{SEED}".encode()).digest()
STEPS = 30
EXAMPLES = {
    "memory": reliability.size(120, 1200),
    "sqlite": reliability.size(40, 400),
    "postgres": reliability.size(30, 300),
}
"""Examples per backend: about 80 s for all three at CI size on a busy two-core machine."""
CONTROL_EXAMPLES = 100
"""Upper bound for a negative control; a working check stops it within the first few."""

RECORDS = "model.records"
RAW_STREAMS = ("model/alpha", "model/beta")
RECORD_KEYS = ("doc-1", "doc-2", "doc-3")
ORDER_KEYS = ("order-1", "order-2", "order-3")
EVENT_KEY_CHOICES = (None, "note-1", "note-1", "note-2")
RUNS = ("run-a", "run-b")
"""Started and running before each example: a checkpoint needs a live run."""
RUN_DEFINITION = "model.run"
SEEDED_RECORDS = {GRAPH_RUNS: len(RUNS), GRAPH_DEFINITIONS: 1, GRAPH_DEFINITION_VERSIONS: 1}
CURSORS = ("n1", "n2")
AUDIENCES = ("finance", "legal")
DEADLINE = EPOCH + timedelta(hours=2)
"""A fixed deadline, so a retried request stays identical while the clock moves."""
DEADLINES = {"soon": timedelta(minutes=20), "later": timedelta(hours=4)}
"""Deadlines relative to the request: the next clock step passes the first."""
DEADLINE_CHOICES = st.sampled_from(["fixed", "later", "later", "soon"])
DECISIONS = ("approve", "reject", "approve", "reject", "escalate")
"""Mostly allowed decisions; ``escalate`` is never allowed."""
ACTORS = ("bob@example.org", "carol@example.org")
REQUEST_KEYS = ("req-1", "req-2")
SCOPES = ("main", "side")
WORKFLOW_STATES = (
    "intake",
    "planning",
    "executing",
    "decision",
    "completed",
    "cancelled",
)
NAMESPACES = {
    "records": RECORDS,
    "workflows": WORKFLOWS,
    "workflow_orders": IDEMPOTENCY,
    "event_keys": EVENT_KEYS,
    "checkpoints": CHECKPOINTS,
    "approvals": APPROVALS,
    "approval_slots": APPROVAL_SLOTS,
    "request_idempotency": REQUEST_IDEMPOTENCY,
    "states": STATE_NAMESPACE,
}
ABSENT_WORKFLOW = "wf-never-created"
ABSENT_APPROVAL = "approval-never-requested"
ABSENT_CHECKPOINT = store_model.checkpoint_id("run-z", "nowhere")

REQUIRED_OUTCOMES = frozenset(
    {
        "record write (absent): ok",
        "record write (fresh): ok",
        "record write (stale): REVISION_CONFLICT",
        "ledger append (head): ok",
        "ledger append (behind): REVISION_CONFLICT",
        "workflow create: ok",
        "workflow create (retry): ok",
        "workflow create (retry): IDEMPOTENCY_CONFLICT",
        "workflow transition: ok",
        "workflow transition: REVISION_CONFLICT",
        "workflow event (keyed): ok",
        "workflow event (keyed retry): ok",
        "workflow event (keyed retry): IDEMPOTENCY_CONFLICT",
        "idempotency remember (retry): ok",
        "idempotency remember (retry): IDEMPOTENCY_CONFLICT",
        "checkpoint create (retry): ok",
        "checkpoint create (retry): IDEMPOTENCY_CONFLICT",
        "checkpoint consume: ok",
        "checkpoint consume: CHECKPOINT_CONSUMED",
        "approval request: ok",
        "approval decide: ok",
        "approval decide (second decider): APPROVAL_ALREADY_DECIDED",
        "approval decide (at the deadline): APPROVAL_EXPIRED",
        "state reset: ok",
        "close and reopen: ok",
    }
)
"""Outcomes every harness must have driven the runtime into, so a pass means something."""

T = TypeVar("T")
V = TypeVar("V")


RECORD_KINDS = frozenset(
    {
        ACTION_RESULT_KIND,
        CHECKPOINT_KIND,
        DEFINITION_KIND,
        IDEMPOTENCY_KIND,
        RESULT_KIND,
        WITNESS_KIND,
    }
)
"""Record streams, named by keyed digests: the model does not name them; the audit checks them."""


class _NamedIds:
    """Issue the given ids in order, so the seeded runs have the names the model uses."""

    def __init__(self, names: Iterator[str]) -> None:
        self._names = names

    def new_id(self) -> str:
        """Return the next name."""
        return next(self._names)


class Divergence(AssertionError):
    """The runtime answered something the model did not predict."""


@dataclass
class Tally:
    """Examples and steps a harness actually ran."""

    examples: int = 0
    steps: int = 0
    """Steps run, each followed by the full check against the model."""
    calls: int = 0
    """Calls into the runtime whose outcome the model predicted."""
    outcomes: Counter[str] = field(default_factory=Counter)
    """How often each operation met each outcome (``ok`` or an error code)."""


# -- faulty stores for the negative controls ---------------------------------------


class Fault:
    """Decides how a commit lands in the wrapped store; the plain fault commits it as it is."""

    def __call__(self, inner: SecureObjectStore, unit: UnitOfWork) -> None:
        inner.commit(unit)


class FaultyStore:
    """Delegates to a real store, but lets ``fault`` decide how each commit lands."""

    def __init__(self, inner: SecureObjectStore, fault: Fault) -> None:
        self._inner = inner
        self._fault = fault

    def commit(self, unit: UnitOfWork) -> None:
        """Hand the unit to the fault, which commits it (or a damaged version of it)."""
        self._fault(self._inner, unit)

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Delegate."""
        return self._inner.load(namespace, key_digest)

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        """Delegate."""
        return self._inner.peek_metadata(namespace, key_digest)

    def list(
        self,
        namespace: str,
        *,
        filters: tuple[LabelFilter, ...] | list[LabelFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Delegate."""
        return self._inner.list(namespace, filters=filters, order=order, cursor=cursor, limit=limit)

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Delegate."""
        return self._inner.ledger_head(stream)

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Delegate."""
        return self._inner.read_ledger(stream, from_index=from_index, limit=limit)

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        """Delegate."""
        return cast(StreamCatalog, self._inner).list_streams(after=after, limit=limit)

    def has_records(self) -> bool:
        """Delegate."""
        return cast(StoreStats, self._inner).has_records()

    def namespace_counts(self) -> dict[str, int]:
        """Delegate."""
        return dict(cast(StoreStats, self._inner).namespace_counts())

    def key_id_counts(self) -> dict[str, int]:
        """Delegate."""
        return dict(cast(StoreStats, self._inner).key_id_counts())

    def close(self) -> None:
        """Delegate."""
        self._inner.close()


class DropEveryFifthAppend(Fault):
    """Acknowledges every commit but silently loses every fifth ledger event."""

    def __init__(self) -> None:
        self._appends = 0

    def __call__(self, inner: SecureObjectStore, unit: UnitOfWork) -> None:
        kept = []
        for event in unit.appends:
            self._appends += 1
            if self._appends % 5:
                kept.append(event)
        thinned = UnitOfWork(
            upserts=unit.upserts, deletes=unit.deletes, appends=kept, trims=unit.trims
        )
        if not thinned.empty:
            inner.commit(thinned)


class HonourStaleGuardOnce(Fault):
    """Lets the first stale exact-revision write through, as a lost CAS check would."""

    def __init__(self) -> None:
        self._spent = False

    def __call__(self, inner: SecureObjectStore, unit: UnitOfWork) -> None:
        try:
            inner.commit(unit)
        except RevisionConflict:
            stale = [u for u in unit.upserts if isinstance(u.expected, int)]
            if self._spent or not stale or unit.appends or unit.deletes:
                raise
            self._spent = True
            for upsert in stale:
                header = upsert.header
                inner.commit(
                    UnitOfWork(deletes=[Delete(header.namespace, header.key_digest, Guard.ANY)])
                )
            forced = [
                Upsert(header=u.header, payload=u.payload, expected=Guard.ANY, labels=u.labels)
                for u in unit.upserts
            ]
            inner.commit(UnitOfWork(upserts=forced))


# -- backends ------------------------------------------------------------------------


class Backend:
    """Opens a runtime over one fresh store per example, reopens it, and disposes of it."""

    name: ClassVar[str]

    def __init__(self, fault: Fault | None) -> None:
        self._fault = fault

    def settings(self) -> Settings:
        """Return settings that name this example's store."""
        raise NotImplementedError

    def open_store(self, settings: Settings) -> SecureObjectStore:
        """Open the store directly, for the negative controls that wrap it."""
        raise NotImplementedError

    def open(self, clock: FrozenClock, ids: SequentialIds) -> Runtime:
        """Bootstrap a runtime with the test key, over this example's store."""
        settings = self.settings()
        store = None
        if self._fault is not None:
            store = FaultyStore(self.open_store(settings), self._fault)
        return bootstrap(settings, key=KEY, store=store, clock=clock, ids=ids, create=True)

    def reopen(self, runtime: Runtime, clock: FrozenClock, ids: SequentialIds) -> Runtime:
        """Close the runtime and bootstrap again over the same file or schema."""
        runtime.close()
        return self.open(clock, ids)

    def dispose(self, runtime: Runtime) -> None:
        """Close the runtime and remove what the example created."""
        runtime.close()


class MemoryBackend(Backend):
    """One in-memory store per example; reopening rebuilds the runtime over the same object."""

    name = "memory"

    def __init__(self, fault: Fault | None) -> None:
        super().__init__(fault)
        self._store: SecureObjectStore = InMemorySecureObjectStore()
        if fault is not None:
            self._store = FaultyStore(self._store, fault)

    def settings(self) -> Settings:
        """Memory settings; ``home`` is never touched."""
        return Settings(backend="memory", home=Path(tempfile.gettempdir()) / "unused")

    def open(self, clock: FrozenClock, ids: SequentialIds) -> Runtime:
        """Bootstrap over the example's store object."""
        return bootstrap(self.settings(), key=KEY, store=self._store, clock=clock, ids=ids)

    def reopen(self, runtime: Runtime, clock: FrozenClock, ids: SequentialIds) -> Runtime:
        """Keep the store (closing it would end it) and build a new runtime over it."""
        return self.open(clock, ids)


class SQLiteBackend(Backend):
    """One SQLite home per example, in a directory removed afterwards."""

    name = "sqlite"
    root: ClassVar[Path | None] = None
    """Where example homes are made; the test points it at its temporary directory."""

    def __init__(self, fault: Fault | None) -> None:
        super().__init__(fault)
        self._home = Path(tempfile.mkdtemp(prefix="example-", dir=self.root))

    def settings(self) -> Settings:
        """SQLite settings for the example's home, at the default durability."""
        return Settings(backend="sqlite", home=self._home)

    def open_store(self, settings: Settings) -> SecureObjectStore:
        """Open the database file the settings name."""
        return SQLiteSecureObjectStore.open(settings.database_path, create=True)

    def dispose(self, runtime: Runtime) -> None:
        """Close, then remove the home."""
        try:
            runtime.close()
        finally:
            shutil.rmtree(self._home, ignore_errors=True)


class PostgresBackend(Backend):
    """One throwaway schema per example on the test server, dropped afterwards."""

    name = "postgres"
    server: ClassVar[Any] = None

    def __init__(self, fault: Fault | None) -> None:
        super().__init__(fault)
        self._schema = str(self.server.new_schema())

    def settings(self) -> Settings:
        """PostgreSQL settings for the example's schema."""
        return Settings(
            backend="postgres",
            home=Path(tempfile.gettempdir()) / "unused",
            postgres_dsn=SecretStr(self.server.dsn),
            postgres_schema=self._schema,
            postgres_pool_size=2,
        )

    def open_store(self, settings: Settings) -> SecureObjectStore:
        """Open the schema the settings name."""
        return PostgresSecureObjectStore.open(
            self.server.dsn, schema=settings.postgres_schema, pool_size=2, create=True
        )

    def dispose(self, runtime: Runtime) -> None:
        """Close, then drop the schema."""
        try:
            runtime.close()
        finally:
            self.server.drop_schema(self._schema)


# -- the state machine ---------------------------------------------------------------

PICKS = st.integers(0, 7)
"""Which object a rule acts on: mostly a live one, sometimes any, rarely one never made.

Rules that act on objects run only once one exists (``precondition``), so
steps are not spent on an empty store; ``NOT_FOUND`` stays reachable.
"""
FRESH = st.sampled_from([True, True, True, False])
"""Whether a caller acts on what it just read (mostly) or on a stale view."""
AGAIN = st.sampled_from([None, None, "same", "other"])
"""Whether a call is retried at once, with the same body or another one."""


def _order(key: str, variant: int) -> WorkOrder:
    return WorkOrder(
        kind="model.order",
        parameters={"variant": variant, "amount": 100 + variant},
        requester="alice@example.org",
        idempotency_key=key,
    )


def _pick(
    known: dict[str, V], pick: int, absent: str, live: Callable[[V], bool] = lambda _: True
) -> str:
    """Name a live object (picks 0-4), any known one (5-6), or one never made (7)."""
    names = sorted(known)
    alive = [name for name in names if live(known[name])]
    if pick < 5 and alive:
        return alive[pick % len(alive)]
    return absent if pick == 7 or not names else names[pick % len(names)]


def _pending(checkpoint: store_model.Checkpoint) -> bool:
    return checkpoint.consumed_at is None


def _stale(revision: int) -> int:
    """Return a revision a caller could have read earlier (a future one at revision 1)."""
    return revision + 1 if revision == 1 else revision - 1


class VaultMachine(RuleBasedStateMachine):
    """Drives one runtime and one model side by side; any disagreement is a divergence."""

    backend_type: ClassVar[type[Backend]]
    fault_type: ClassVar[type[Fault] | None] = None
    tally: ClassVar[Tally]

    def __init__(self) -> None:
        super().__init__()
        self.clock = FrozenClock(EPOCH)
        self.ids = SequentialIds("id")
        self.model = store_model.StoreModel(now=self.clock.now(), id_prefix="id")
        fault = None if self.fault_type is None else self.fault_type()
        self.backend = self.backend_type(fault)
        self.runtime = self.backend.open(self.clock, self.ids)
        self._start_runs()
        self._verified: dict[str, list[LedgerEvent]] = {}
        self._started = False
        self.tally.examples += 1

    def _start_runs(self) -> None:
        """Start ``RUNS`` under their own ids, outside the model's id sequence, and run them."""
        names = iter(RUNS)
        repository = self.runtime.repository
        runs = graph_runs(repository, self.clock, _NamedIds(names))
        try:
            self.runtime.definitions.register_definition(RUN_DEFINITION, {"nodes": ["a"]})
            for name in RUNS:
                runs.start_run(RUN_DEFINITION, {})
                runs.set_status(name, "running", expected_status="accepted")
                self.model.run_events[name] = 2
        except FlowvaultError as exc:
            self.backend.dispose(self.runtime)
            raise self._diverged(f"starting the model's runs: raised {exc.code}") from exc

    def teardown(self) -> None:
        """Close the runtime and remove the example's store."""
        self.backend.dispose(self.runtime)

    # -- checking one call -----------------------------------------------------------

    def _diverged(self, what: str) -> Divergence:
        return Divergence(
            f"{self.backend.name}: {what} (seed {SEED}; replay with RELIABILITY_SEED={SEED})"
        )

    def _call(
        self, operation: str, what: str, predicted: store_model.Outcome[Any], call: Callable[[], T]
    ) -> T | None:
        """Run ``call``: it must raise exactly the predicted code, or return when none is."""
        self.tally.calls += 1
        self.tally.outcomes[f"{operation}: {predicted.code or 'ok'}"] += 1
        try:
            result = call()
        except FlowvaultError as exc:
            if exc.code != predicted.code:
                raise self._diverged(
                    f"{what}: raised {exc.code}, model predicted {predicted.code or 'success'}"
                ) from exc
            return None
        if predicted.code is not None:
            raise self._diverged(f"{what}: succeeded, model predicted {predicted.code}")
        return result

    def _agree(self, what: str, actual: object, predicted: object) -> None:
        if actual != predicted:
            raise self._diverged(f"{what}: got {actual!r}, model predicted {predicted!r}")

    def _check_workflow(self, what: str, record: Any, predicted: store_model.Workflow) -> None:
        parameters = {} if predicted.scrubbed else _order("x", predicted.variant).parameters
        self._agree(
            what,
            (record.workflow_id, record.state, record.state_version, record.work_order.parameters),
            (predicted.workflow_id, predicted.state, predicted.version, parameters),
        )

    def _check_checkpoint(self, what: str, actual: Any, predicted: store_model.Checkpoint) -> None:
        self._agree(
            what,
            (actual.checkpoint_id, actual.state, actual.status.value, actual.consumed_at),
            (
                predicted.checkpoint_id,
                {"v": predicted.variant},
                "pending" if predicted.consumed_at is None else "consumed",
                predicted.consumed_at,
            ),
        )

    def _check_approval(self, what: str, actual: Any, predicted: store_model.Approval) -> None:
        self._agree(
            what,
            (
                actual.approval_id,
                actual.checkpoint_id,
                actual.audience,
                actual.prompt_digest,
                actual.requested_at,
                actual.expires_at,
                actual.status.value,
                actual.decision,
                actual.actor,
                actual.decided_at,
            ),
            (
                predicted.approval_id,
                predicted.checkpoint_id,
                predicted.audience,
                content_hash({"prompt": predicted.prompt}),
                predicted.requested_at,
                predicted.expires_at,
                predicted.status,
                predicted.decision,
                predicted.actor,
                predicted.decided_at,
            ),
        )

    @initialize(
        key=st.sampled_from(ORDER_KEYS),
        variant=st.integers(0, 1),
        run=st.sampled_from(RUNS),
        cursor=st.sampled_from(CURSORS),
        audience=st.sampled_from(AUDIENCES),
        deadline=DEADLINE_CHOICES,
    )
    def start(
        self, key: str, variant: int, run: str, cursor: str, *, audience: str, deadline: str
    ) -> None:
        """Begin with a workflow and a checkpoint awaiting approval, so 30 steps reach far."""
        self.create_workflow(key, variant)
        self.create_checkpoint(run, cursor, variant)
        self.request_approval(0, audience, variant, deadline, fresh=True)

    # -- sealed records ---------------------------------------------------------------

    @rule(
        key=st.sampled_from(RECORD_KEYS),
        value=st.integers(0, 9),
        guard=st.sampled_from(["absent", "absent", "fresh", "fresh", "stale"]),
    )
    def write_record(self, key: str, value: int, guard: str) -> None:
        """Write a sealed record guarded ``ABSENT``, or by the revision read or a stale one."""
        document = {"value": value}
        expected: int | Guard = Guard.ABSENT
        if guard == "absent":
            predicted = self.model.create_record(key, document)
        else:
            current = self.model.records.get(key)
            revision = 1 if current is None else current[1]
            expected = revision if guard == "fresh" else _stale(revision)
            predicted = self.model.update_record(key, document, expected)
        written = self._call(
            f"record write ({guard})",
            f"write record {key} expecting {expected}",
            predicted,
            lambda: self.runtime.repository.write(RECORDS, key, document, expected=expected),
        )
        if written is not None:
            self._agree(f"write record {key} revision", written.revision, predicted.value)

    # -- raw ledger ---------------------------------------------------------------------

    @rule(
        stream=st.sampled_from(RAW_STREAMS),
        position=st.sampled_from(["head", "head", "behind", "ahead", "forged"]),
        value=st.integers(0, 9),
    )
    def append_ledger(self, stream: str, position: str, value: int) -> None:
        """Append on the head, or one position behind, ahead, or onto a forged hash."""
        index, previous = self.model.head(stream)
        if position == "behind" and index > 0:
            hashes = self.model.raw_streams[stream]
            index, previous = index - 1, hashes[-2] if index > 1 else store_model.GENESIS
        elif position in {"ahead", "behind"}:
            index += 1
        elif position == "forged":
            previous = content_hash({"forged": value})
        draft = LedgerEvent.create(
            stream=stream,
            index=index,
            type="model.appended",
            occurred_at=self.clock.now(),
            payload={"value": value},
            previous_hash=previous,
        )
        event = keyed(draft, self.runtime.repository)
        predicted = self.model.append(stream, index, previous, event.event_hash)
        self._call(
            f"ledger append ({position})",
            f"append {stream}@{index} ({position})",
            predicted,
            lambda: self.runtime.store.commit(UnitOfWork(appends=[event])),
        )

    # -- workflows -----------------------------------------------------------------------

    @rule(key=st.sampled_from(ORDER_KEYS), variant=st.integers(0, 1), again=AGAIN)
    def create_workflow(self, key: str, variant: int, again: str | None = None) -> None:
        """Create idempotently: a retry with the same order replays, another order conflicts."""
        self._create_workflow(key, variant)
        if again is not None:
            self._create_workflow(key, variant if again == "same" else 1 - variant)

    def _create_workflow(self, key: str, variant: int) -> None:
        retry = key in self.model.orders
        predicted = self.model.create_workflow(key, variant)
        made = self._call(
            "workflow create" + (" (retry)" if retry else ""),
            f"create workflow {key}/{variant}",
            predicted,
            lambda: self.runtime.workflows.create(_order(key, variant)),
        )
        if made is not None and predicted.value is not None:
            record, created = made
            workflow, expected_created = predicted.value
            self._check_workflow(f"create workflow {key}", record, workflow)
            self._agree(f"create workflow {key} created", created, expected_created)

    def _workflow_view(self, pick: int, fresh: bool) -> tuple[str, str, int]:
        workflow_id = _pick(
            self.model.workflows,
            pick,
            ABSENT_WORKFLOW,
            lambda w: w.state not in store_model.TERMINAL,
        )
        workflow = self.model.workflows.get(workflow_id)
        state, version = ("intake", 1) if workflow is None else (workflow.state, workflow.version)
        return workflow_id, state, version if fresh else _stale(version)

    @precondition(lambda self: bool(self.model.workflows))
    @rule(pick=PICKS, goal=st.sampled_from(WORKFLOW_STATES), fresh=FRESH)
    def transition_workflow(self, pick: int, goal: str, fresh: bool) -> None:
        """Move a workflow by CAS at the version read (fresh) or a stale one."""
        workflow_id, state, version = self._workflow_view(pick, fresh)
        predicted = self.model.transition(workflow_id, goal, state, version)
        moved = self._call(
            "workflow transition",
            f"transition {workflow_id} {state}@{version} -> {goal}",
            predicted,
            lambda: self.runtime.workflows.transition(
                workflow_id, goal, expected_state=state, expected_version=version
            ),
        )
        if moved is not None and predicted.value is not None:
            self._check_workflow(f"transition {workflow_id}", moved, predicted.value)

    @precondition(lambda self: bool(self.model.workflows))
    @rule(
        pick=PICKS,
        event_key=st.sampled_from(EVENT_KEY_CHOICES),
        variant=st.integers(0, 1),
        fresh=FRESH,
        again=AGAIN,
    )
    def append_workflow_event(
        self, pick: int, event_key: str | None, variant: int, fresh: bool, again: str | None
    ) -> None:
        """Append a same-state event; a keyed retry replays, other content conflicts.

        A retry repeats the first call as it was made, with the version the
        caller read before it.
        """
        workflow_id, state, version = self._workflow_view(pick, fresh)
        self._append_workflow_event(workflow_id, state, version, event_key, variant)
        if again is not None:
            retried = variant if again == "same" else 1 - variant
            self._append_workflow_event(workflow_id, state, version, event_key, retried)

    def _append_workflow_event(
        self, workflow_id: str, state: str, version: int, event_key: str | None, variant: int
    ) -> None:
        known = self.model.workflows.get(workflow_id)
        retry = event_key is not None and known is not None and known.keyed(event_key) is not None
        predicted = self.model.append_event(workflow_id, event_key, variant, state, version)
        kind = "" if event_key is None else " (keyed retry)" if retry else " (keyed)"
        appended = self._call(
            "workflow event" + kind,
            f"append event {workflow_id} key={event_key} v{variant} at {version}",
            predicted,
            lambda: self.runtime.workflow_events.append_event(
                workflow_id,
                "note.added",
                expected_state=state,
                expected_version=version,
                payload={"note": variant},
                event_key=event_key,
            ),
        )
        if appended is not None and predicted.value is not None:
            record, event, created = appended
            workflow, index, expected_created = predicted.value
            self._check_workflow(f"append event {workflow_id}", record, workflow)
            self._agree(
                f"append event {workflow_id} event",
                (event.index, event.type, created),
                (index, "note.added", expected_created),
            )

    # -- request-bound idempotency -------------------------------------------------------

    @rule(
        key=st.sampled_from(REQUEST_KEYS),
        request=st.integers(0, 1),
        response=st.integers(0, 2),
        recall=st.booleans(),
        again=AGAIN,
    )
    def request_idempotency(
        self, key: str, request: int, response: int, recall: bool, again: str | None
    ) -> None:
        """Remember or recall: the first response wins and replays only for its request."""
        self._request_idempotency(key, request, response, recall=recall)
        if again is not None:
            retried = request if again == "same" else 1 - request
            self._request_idempotency(key, retried, (response + 1) % 3, recall=recall)

    def _request_idempotency(self, key: str, request: int, response: int, *, recall: bool) -> None:
        service = self.runtime.idempotency
        if recall:
            predicted: store_model.Outcome[Any] = self.model.recall(key, request)
            answer = self._call(
                "idempotency recall",
                f"recall {key} r{request}",
                predicted,
                lambda: service.recall(key, {"request": request}),
            )
        else:
            retry = key in self.model.remembered
            predicted = self.model.remember(key, request, response)
            answer = self._call(
                "idempotency remember" + (" (retry)" if retry else ""),
                f"remember {key} r{request}",
                predicted,
                lambda: service.remember(key, {"request": request}, {"response": response}),
            )
        if predicted.code is None:
            expected = None if predicted.value is None else {"response": predicted.value}
            self._agree(f"idempotency {key}", answer, expected)

    # -- checkpoints and approvals -------------------------------------------------------

    @rule(
        run=st.sampled_from(RUNS),
        cursor=st.sampled_from(CURSORS),
        variant=st.integers(0, 1),
        again=AGAIN,
    )
    def create_checkpoint(
        self, run: str, cursor: str, variant: int, again: str | None = None
    ) -> None:
        """Create idempotently: same content returns the first, other content conflicts."""
        self._create_checkpoint(run, cursor, variant)
        if again is not None:
            self._create_checkpoint(run, cursor, variant if again == "same" else 1 - variant)

    def _create_checkpoint(self, run: str, cursor: str, variant: int) -> None:
        retry = store_model.checkpoint_id(run, cursor) in self.model.checkpoints
        predicted = self.model.create_checkpoint(run, cursor, variant)
        made = self._call(
            "checkpoint create" + (" (retry)" if retry else ""),
            f"create checkpoint {run}/{cursor} v{variant}",
            predicted,
            lambda: self.runtime.checkpoints.create_checkpoint(
                run,
                {"node": cursor},
                state={"v": variant},
                budgets={"tokens": 100},
                counters={"nodes": 1},
                dependency_summary={"tools": ["bank"]},
                terminal_cursor=None,
                event_cursor=0,
            ),
        )
        if made is not None and predicted.value is not None:
            self._check_checkpoint(f"create checkpoint {run}/{cursor}", made, predicted.value)

    @precondition(lambda self: bool(self.model.checkpoints))
    @rule(pick=PICKS, twice=st.booleans())
    def consume_checkpoint(self, pick: int, twice: bool) -> None:
        """Consume once: a second consume is ``CHECKPOINT_CONSUMED``."""
        cid = _pick(self.model.checkpoints, pick, ABSENT_CHECKPOINT, _pending)
        self._consume_checkpoint(cid)
        if twice:
            self._consume_checkpoint(cid)

    def _consume_checkpoint(self, cid: str) -> None:
        predicted = self.model.consume(cid)
        used = self._call(
            "checkpoint consume",
            f"consume {cid}",
            predicted,
            lambda: self.runtime.checkpoints.consume_checkpoint(cid),
        )
        if used is not None and predicted.value is not None:
            self._check_checkpoint(f"consume {cid}", used, predicted.value)

    @precondition(lambda self: bool(self.model.checkpoints))
    @rule(
        pick=PICKS,
        audience=st.sampled_from(AUDIENCES),
        prompt=st.integers(0, 1),
        deadline=DEADLINE_CHOICES,
        fresh=FRESH,
    )
    def request_approval(
        self, pick: int, audience: str, prompt: int, deadline: str, fresh: bool
    ) -> None:
        """Request approval on a checkpoint as the caller saw it (fresh) or a stale view."""
        expires_at = DEADLINE if deadline == "fixed" else self.clock.now() + DEADLINES[deadline]
        cid = _pick(self.model.checkpoints, pick, ABSENT_CHECKPOINT, _pending)
        known = self.model.checkpoints.get(cid)
        state = {"v": 0 if known is None else known.variant}
        predicted = self.model.request_approval(cid, audience, prompt, expires_at, fresh_view=fresh)
        made = self._call(
            "approval request" + ("" if fresh else " (stale view)"),
            f"request approval {cid}/{audience} p{prompt} until {expires_at:%H:%M}",
            predicted,
            lambda: self.runtime.approvals.request_approval(
                cid,
                expected_state_digest=content_hash(state),
                expected_budgets={"tokens": 100},
                expected_counters={"nodes": 1 if fresh else 2},
                expected_dependency_digest=content_hash({"tools": ["bank"]}),
                audience=audience,
                prompt_digest=content_hash({"prompt": prompt}),
                allowed_decisions=["approve", "reject"],
                expires_at=expires_at,
            ),
        )
        if made is not None and predicted.value is not None:
            self._check_approval(f"request approval {cid}/{audience}", made, predicted.value)

    @precondition(lambda self: bool(self.model.approvals))
    @rule(
        pick=PICKS,
        decision=st.sampled_from(DECISIONS),
        actor=st.sampled_from(ACTORS),
        late=st.sampled_from([False, False, False, True]),
        twice=st.booleans(),
    )
    def decide(self, pick: int, decision: str, actor: str, late: bool, twice: bool) -> None:
        """Decide exactly once, consuming the checkpoint; a second decide is refused.

        ``late`` decides at the approval's deadline, where it must expire;
        ``twice`` has another actor decide the same approval right after.
        """
        approval_id = _pick(
            self.model.approvals, pick, ABSENT_APPROVAL, lambda a: a.status == "pending"
        )
        known = self.model.approvals.get(approval_id)
        at = known.expires_at if late and known else self.clock.now()
        self._decide(approval_id, decision, actor, at, "(at the deadline)" if late else "")
        if twice:
            other = ACTORS[1 - ACTORS.index(actor)]
            self._decide(approval_id, decision, other, at, "(second decider)")

    def _decide(self, approval_id: str, decision: str, actor: str, at: datetime, how: str) -> None:
        predicted = self.model.decide(approval_id, decision, actor, at)
        decided = self._call(
            f"approval decide {how}".strip(),
            f"decide {approval_id} {decision} at {at:%H:%M}",
            predicted,
            lambda: self.runtime.approvals.decide(approval_id, decision, actor, now=at),
        )
        if decided is not None and predicted.value is not None:
            approval, checkpoint = decided
            expected_approval, expected_checkpoint = predicted.value
            self._check_approval(f"decide {approval_id}", approval, expected_approval)
            self._check_checkpoint(f"decide {approval_id} resume", checkpoint, expected_checkpoint)

    @rule(minutes=st.sampled_from([20, 60]))
    def advance_clock(self, minutes: int) -> None:
        """Time passes, so approvals reach their deadline."""
        self.tally.outcomes["clock advance: ok"] += 1
        self.model.now = self.clock.advance(timedelta(minutes=minutes))

    # -- workflow state ------------------------------------------------------------------

    @rule(
        scope=st.sampled_from(SCOPES),
        step=st.integers(0, 9),
        how=st.sampled_from(["save", "fresh", "stale", "reset"]),
    )
    def change_state(self, scope: str, step: int, how: str) -> None:
        """Save a scope's state, write it at a fresh or stale revision, or reset it."""
        state = self.runtime.state(scope)
        if how == "reset":
            self._reset_state(scope)
            return
        if how == "save":
            predicted = self.model.save_state(scope, step)
            revision = self._call(
                "state save",
                f"save state {scope}",
                predicted,
                lambda: state.save(WorkflowState(step=step)),
            )
            self._agree(f"save state {scope} revision", revision, predicted.value)
            return
        current = self.model.states.get(scope)
        read = None if current is None else current[1]
        expected = read if how == "fresh" else (1 if read is None else _stale(read))
        predicted = self.model.write_state(scope, step, expected)
        self._call(
            f"state write ({how})",
            f"write state {scope} at {expected}",
            predicted,
            lambda: self.runtime.store.commit(state.to_write(WorkflowState(step=step), expected)),
        )

    def _reset_state(self, scope: str) -> None:
        """Reset: record the event, delete only the state row, report what was there."""
        predicted = self.model.reset_state(scope)
        fingerprint = self._call(
            "state reset",
            f"reset state {scope}",
            predicted,
            lambda: self.runtime.state(scope).reset(actor="ops", source="stateful-model"),
        )
        if fingerprint is not None and predicted.value is not None:
            self._agree(
                f"reset state {scope}",
                (fingerprint.readability.value, fingerprint.revision),
                (predicted.value.readability, predicted.value.revision),
            )

    # -- durability ----------------------------------------------------------------------

    @rule()
    def reopen(self) -> None:
        """Close and bootstrap again over the same store with the same key: nothing changes."""
        self.tally.outcomes["close and reopen: ok"] += 1
        self.runtime = self.backend.reopen(self.runtime, self.clock, self.ids)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        """Every known record opens as predicted, every stream verifies, and nothing else exists."""
        if self._started:
            self.tally.steps += 1
        self._started = True
        try:
            revisions = self._check_namespaces()
            self._check_records(revisions)
            self._check_streams()
        except FlowvaultError as exc:
            raise self._diverged(f"reading back what the model knows raised {exc.code}") from exc

    def _listed(self, namespace: str) -> dict[str, int]:
        found: dict[str, int] = {}
        cursor: str | None = None
        while True:
            page = self.runtime.store.list(namespace, cursor=cursor, limit=200)
            found.update({meta.key_digest: meta.revision for meta in page.items})
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    def _check_namespaces(self) -> dict[str, dict[str, int]]:
        """Compare every namespace's key digests with the model's; return the revisions."""
        expected_keys = self.model.natural_keys()
        counts = cast(StoreStats, self.runtime.store).namespace_counts()
        predicted_counts = {
            NAMESPACES[kind]: len(keys) for kind, keys in expected_keys.items() if keys
        } | SEEDED_RECORDS
        self._agree("records per namespace", dict(counts), predicted_counts)
        revisions: dict[str, dict[str, int]] = {}
        digest = self.runtime.repository.key_digest
        for kind, keys in expected_keys.items():
            if not keys:
                continue
            namespace = NAMESPACES[kind]
            listed = self._listed(namespace)
            by_key = {key: listed.get(digest(namespace, key)) for key in keys}
            missing = sorted(key for key, revision in by_key.items() if revision is None)
            self._agree(f"{kind} missing from the listing", missing, [])
            self._agree(f"{kind} listed", len(listed), len(keys))
            revisions[kind] = {key: revision for key, revision in by_key.items() if revision}
        return revisions

    def _check_records(self, revisions: dict[str, dict[str, int]]) -> None:
        model, runtime = self.model, self.runtime
        read = runtime.repository.read
        for key, (document, revision) in model.records.items():
            self._agree(f"record {key} revision", revisions["records"][key], revision)
            opened = read(RECORDS, key)
            self._agree(f"record {key}", None if opened is None else opened.document, document)
        for workflow_id, workflow in model.workflows.items():
            record = runtime.workflows.get(workflow_id)
            self._check_workflow(f"workflow {workflow_id}", record, workflow)
            self._agree(
                f"workflow {workflow_id} revision",
                revisions["workflows"][workflow_id],
                workflow.version,
            )
            for event_key, _, index in workflow.event_keys:
                marker = read(EVENT_KEYS, store_model.joined(workflow_id, event_key))
                self._agree(
                    f"event key {event_key} of {workflow_id}",
                    None if marker is None else marker.document,
                    {"index": index},
                )
        for key, workflow_id in model.orders.items():
            marker = read(IDEMPOTENCY, key)
            named = marker.document.get("workflow_id") if marker and marker.document else None
            self._agree(f"order marker {key}", named, workflow_id)
        for cid, checkpoint in model.checkpoints.items():
            loaded = runtime.checkpoints.load_checkpoint(cid)
            self._check_checkpoint(f"checkpoint {cid}", loaded, checkpoint)
            self._agree(
                f"checkpoint {cid} revision", revisions["checkpoints"][cid], checkpoint.revision
            )
        for approval_id, approval in model.approvals.items():
            loaded_approval = runtime.approvals.get_approval(approval_id)
            self._check_approval(f"approval {approval_id}", loaded_approval, approval)
            self._agree(
                f"approval {approval_id} revision",
                revisions["approvals"][approval_id],
                approval.revision,
            )
        for (cid, audience), approval_id in model.slots.items():
            slot = read(APPROVAL_SLOTS, store_model.joined(cid, audience))
            self._agree(
                f"approval slot {cid}/{audience}",
                None if slot is None else slot.document,
                {"approval_id": approval_id},
            )
        for key, (request, response) in model.remembered.items():
            self._agree(
                f"remembered {key}",
                runtime.idempotency.recall(key, {"request": request}),
                {"response": response},
            )
        for scope in SCOPES:
            snapshot = runtime.state(scope).load()
            stored = model.states.get(scope)
            self._agree(
                f"state {scope}",
                (snapshot.state.model_dump(), snapshot.revision),
                ({}, None) if stored is None else ({"step": stored[0]}, stored[1]),
            )

    def _check_streams(self) -> None:
        lengths = self.model.stream_lengths()
        catalog: list[str] = []
        while True:
            page = cast(StreamCatalog, self.runtime.store).list_streams(
                after=catalog[-1] if catalog else None, limit=200
            )
            catalog.extend(page)
            if len(page) < 200:
                break
        record_streams = [name for name in catalog if name.partition("/")[0] in RECORD_KINDS]
        catalog = [name for name in catalog if name not in record_streams]
        self._agree("ledger streams", catalog, sorted(lengths))
        report = self.runtime.audit().run()
        self._agree("full audit", (report.ok, report.stale, report.failures), (True, (), ()))
        for stream, length in lengths.items():
            events = list(read_stream(self.runtime.store, stream))
            self._agree(f"stream {stream} length", len(events), length)
            self._verify(stream, events)
            if stream in self.model.raw_streams:
                self._agree(
                    f"stream {stream} events",
                    [event.event_hash for event in events],
                    self.model.raw_streams[stream],
                )

    def _verify(self, stream: str, events: list[LedgerEvent]) -> None:
        """Verify the chain; a prefix identical to one verified before is not rehashed."""
        known = self._verified.get(stream, [])
        if events[: len(known)] == known and known:
            verdict = verify_chain(
                events[len(known) :], start_index=len(known), previous_hash=known[-1].event_hash
            )
        else:
            verdict = verify_chain(events)
        if not verdict.ok:
            raise self._diverged(f"stream {stream} does not verify: {verdict.reason}")
        self._verified[stream] = events


# -- harnesses -----------------------------------------------------------------------


def _machine(
    backend: type[Backend], tally: Tally, fault: type[Fault] | None = None
) -> type[VaultMachine]:
    """Bind the machine to one backend, one tally and (for a control) one fault."""
    attributes = {"backend_type": backend, "tally": tally, "fault_type": fault}
    name = f"VaultMachine_{backend.name}" + ("" if fault is None else "_faulty")
    machine = type(name, (VaultMachine,), attributes)
    return seed(SEED)(machine)


def _settings(examples: int, *, control: bool = False) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        derandomize=False,
        print_blob=False,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        phases=(Phase.generate,) if control else (Phase.generate, Phase.shrink, Phase.explain),
    )


def _control_caught(backend: type[Backend], fault: type[Fault]) -> bool:
    """Run the same machine over a faulty store; the check must report a divergence."""
    tally = Tally()
    try:
        run_state_machine_as_test(
            _machine(backend, tally, fault), settings=_settings(CONTROL_EXAMPLES, control=True)
        )
    except Divergence:
        return True
    return False


def _harness(backend: type[Backend], family: str, faults: list[type[Fault]]) -> None:
    """Run the machine at this profile's size, run its controls, and record the figure."""
    watch = reliability.Stopwatch()
    tally = Tally()
    failure: Exception | None = None
    try:
        run_state_machine_as_test(
            _machine(backend, tally), settings=_settings(EXAMPLES[backend.name])
        )
    except Exception as exc:
        failure = exc
    harness_fault = isinstance(failure, HypothesisException) and not isinstance(failure, Flaky)
    anomalies = 0 if failure is None or harness_fault else 1
    caught = all(_control_caught(backend, fault) for fault in faults)
    reliability.record(
        reliability.Figure(
            family=family,
            trials=tally.steps,
            anomalies=anomalies,
            control_caught=caught,
            detail=(
                f"{tally.examples} examples x up to {STEPS} steps, {tally.calls} predicted calls "
                f"with {len(tally.outcomes)} distinct outcomes, seed {SEED}; controls: "
                + ", ".join(fault.__name__ for fault in faults)
            ),
            seconds=watch.seconds,
        )
    )
    if failure is not None:
        what = "could not run" if harness_fault else "diverged from the model"
        raise AssertionError(
            f"{family}: the runtime {what} (seed {SEED}; replay with RELIABILITY_SEED={SEED})"
        ) from failure
    assert tally.steps >= tally.examples > 0, f"{family}: no steps ran"
    missing = sorted(REQUIRED_OUTCOMES - set(tally.outcomes))
    assert not missing, f"{family}: never reached {missing} (seed {SEED})"
    assert caught, f"{family}: a faulty store passed the model check (seed {SEED})"


def test_memory_runtime_matches_the_model() -> None:
    """On the memory store every result and error code is the model's, and faults are caught."""
    _harness(MemoryBackend, "Stateful model (memory)", [DropEveryFifthAppend, HonourStaleGuardOnce])


def test_sqlite_runtime_matches_the_model(tmp_path: Path) -> None:
    """On SQLite files, across closes and reopens, every answer is the model's."""
    SQLiteBackend.root = tmp_path
    _harness(SQLiteBackend, "Stateful model (SQLite)", [DropEveryFifthAppend])


@pytest.mark.postgres
def test_postgres_runtime_matches_the_model(postgres_server: Any) -> None:
    """On PostgreSQL schemas, across closes and reopens, every answer is the model's."""
    PostgresBackend.server = postgres_server
    _harness(PostgresBackend, "Stateful model (PostgreSQL)", [DropEveryFifthAppend])
