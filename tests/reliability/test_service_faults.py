"""Fault injection inside each adapter's commit: a unit that fails part-way leaves nothing.

For every atomic unit a service commits (workflow create, transition and
terminal transition, state reset, approval decision, run finish with its
receipt, definition delete) the adapter's commit is made to fail after each
of the unit's writes in turn and, on the disk backends, at the commit
itself. After every injection the call raised a typed error, the whole store
equals the snapshot taken before the unit, and the same call succeeds once
the fault is gone. A snapshot is every raw row of every table (the memory
adapter: its records and streams), so every record's metadata and payload
bytes and every stream's events and head, plus what the port lists.

The seams: the memory adapter's per-write apply steps; SQLite's
``apply_writes``, handed a connection wrapper whose write statements count;
PostgreSQL's ``PreparedUnit.apply``, handed the same kind of wrapper. A
commit-time failure is real: SQLite's ``COMMIT`` fails on a deferred foreign
key, PostgreSQL's on a deferred constraint trigger. The negative control
commits each write on its own (memory: no undo) and must leave a partial
unit the same snapshot comparison sees.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import reliability
from wiring import Wired

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import _store as sqlite_store
from flowvault.application import RecordMetadata, UnitOfWork
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime
from flowvault.domain import (
    ApprovalStatus,
    CheckpointStatus,
    FlowvaultError,
    NotFound,
    StoreUnavailable,
    WorkflowState,
    WorkOrder,
    content_hash,
)

COMMIT = 0
"""Stands for the commit itself in an injection point ``(unit, after)``."""
DEFINITION = "fault.approve"
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")

Snapshot = tuple[object, object]


def _is_write(statement: object) -> bool:
    return str(statement).lstrip().upper().startswith(WRITE_VERBS)


# -- where the fault goes ------------------------------------------------------


@dataclass
class Plan:
    """The fault of the next call: after ``after`` writes of unit ``unit``, or at its commit.

    With ``unit`` unset it only counts, per unit of the call, the writes applied.
    """

    unit: int | None = None
    after: int = COMMIT
    non_atomic: bool = False
    writes: list[int] = field(default_factory=list)
    fired: bool = False
    before_unit: Snapshot | None = None

    def arm(self, unit: int | None, after: int = COMMIT, *, non_atomic: bool = False) -> None:
        """Aim the fault and forget what the previous call counted."""
        self.unit, self.after, self.non_atomic = unit, after, non_atomic
        self.writes, self.fired, self.before_unit = [], False, None

    def disarm(self) -> None:
        """Count only, from now on."""
        self.unit, self.non_atomic = None, False

    @property
    def targeted(self) -> bool:
        """Whether the unit being committed now is the one to fail."""
        return self.unit is not None and self.unit == len(self.writes) - 1

    @property
    def at_commit(self) -> bool:
        """Whether the targeted unit fails at its commit rather than between writes."""
        return self.targeted and self.after == COMMIT

    def wrote(self) -> bool:
        """Count one applied write; return whether the fault fires now."""
        self.writes[-1] += 1
        if self.targeted and self.after == self.writes[-1]:
            self.fired = True
            return True
        return False


# -- snapshots -----------------------------------------------------------------


def _metadata(metadata: RecordMetadata) -> tuple[object, ...]:
    return (
        metadata.header.model_dump(mode="json"),
        dict(metadata.labels),
        metadata.byte_length,
        metadata.payload_digest,
    )


def _stream_names(store: Any) -> list[str]:
    names: list[str] = []
    while page := store.list_streams(after=names[-1] if names else None):
        names += page
    return names


def port_view(store: Any) -> dict[str, object]:
    """Return what a caller sees: every record's metadata per namespace, and the stream names.

    The raw view beside it holds every byte (payloads, events, heads); this
    one shows the same change from the port's side, in a few reads.
    """
    records: dict[tuple[str, str], object] = {}
    for namespace in sorted(store.namespace_counts()):
        cursor: str | None = None
        while True:
            page = store.list(namespace, cursor=cursor, limit=MAX_LIST_LIMIT)
            records.update({(namespace, meta.key_digest): _metadata(meta) for meta in page.items})
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    return {"records": records, "streams": _stream_names(store)}


def difference(before: Snapshot, after: Snapshot) -> str:
    """Name what differs between two snapshots: record keys, streams, raw tables."""
    found = []
    for part, old, new in (("port", before[0], after[0]), ("raw", before[1], after[1])):
        assert isinstance(old, dict)
        assert isinstance(new, dict)
        for section in sorted(set(old) | set(new)):
            left, right = old.get(section), new.get(section)
            if left == right:
                continue
            if isinstance(left, dict) and isinstance(right, dict):
                keys = {k for k in set(left) | set(right) if left.get(k) != right.get(k)}
                found.append(f"{part}.{section}: {len(keys)} entries differ")
            else:
                found.append(f"{part}.{section} differs")
    return "; ".join(found) or "nothing"


# -- injectors, one per backend --------------------------------------------------


class Injector:
    """Installs the seams of one backend and says what its injected faults look like."""

    name = ""
    commit_fault = False
    expected: tuple[str, str] = ("", "")
    """The error code and driver detail an injected fault must surface as."""
    expected_at_commit: tuple[str, str] = ("", "")

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
        self.store = store
        self.monkeypatch = monkeypatch
        self.plan = plan

    def install(self) -> None:
        """Count units at the port, and install the backend's write seam."""
        original = self.store.commit

        def commit(unit: UnitOfWork) -> None:
            if not unit.empty:
                self.plan.writes.append(0)
                if self.plan.targeted and len(self.plan.writes) > 1:
                    self.plan.before_unit = self.snapshot()
            original(unit)

        self.monkeypatch.setattr(self.store, "commit", commit)
        self.install_writes()

    def install_writes(self) -> None:
        raise NotImplementedError

    def raw(self) -> dict[str, object]:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        """Return the whole store: the port's view and the raw rows behind it."""
        return port_view(self.store), self.raw()

    @contextmanager
    def non_atomic(self) -> Iterator[None]:
        """Make the next calls' commits apply each write on its own (the negative control)."""
        yield

    def close(self) -> None:
        """Release anything the raw view opened."""


class MemoryInjector(Injector):
    """Fails inside the memory adapter's per-write apply steps, under its lock."""

    name = "memory"
    expected = ("STORE_UNAVAILABLE", "injected")

    def install_writes(self) -> None:
        for step in ("_apply_upsert", "_apply_delete", "_apply_append", "_apply_trim"):
            original = getattr(InMemorySecureObjectStore, step)
            self.monkeypatch.setattr(InMemorySecureObjectStore, step, self._counted(original))

    def _counted(self, original: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def step(store: Any, write: Any) -> None:
            original(store, write)
            if self.plan.wrote():
                raise StoreUnavailable("injected fault between writes", code="injected")

        return step

    def raw(self) -> dict[str, object]:
        store = self.store
        return {
            "records": {
                key: (_metadata(found.metadata), found.payload)
                for key, found in store._records.items()
            },
            "streams": {
                name: (stream.first_index, tuple(stream.events))
                for name, stream in store._streams.items()
            },
        }

    @contextmanager
    def non_atomic(self) -> Iterator[None]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(InMemorySecureObjectStore, "_undo_log", lambda _store, _unit: _no_undo)
            yield


def _no_undo() -> None:
    """Undo nothing: the broken variant leaves every applied write in place."""


def _io_error() -> sqlite3.OperationalError:
    """Return what SQLite raises when a page cannot be written (``SQLITE_IOERR_WRITE``)."""
    error = sqlite3.OperationalError("disk I/O error")
    error.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE
    error.sqlite_errorname = "SQLITE_IOERR_WRITE"
    return error


class _SqliteWrites:
    """The writer connection as ``apply_writes`` sees it: every row written is counted."""

    def __init__(self, connection: sqlite3.Connection, plan: Plan) -> None:
        self._connection = connection
        self._plan = plan

    def execute(self, statement: str, params: Any = ()) -> sqlite3.Cursor:
        cursor = self._connection.execute(statement, params)
        if _is_write(statement):
            self._wrote()
        return cursor

    def executemany(self, statement: str, rows: Any) -> None:
        for row in rows:
            self.execute(statement, row)

    def _wrote(self) -> None:
        if self._plan.non_atomic:
            self._connection.execute("COMMIT")
            self._connection.execute("BEGIN IMMEDIATE")
        if self._plan.wrote():
            raise _io_error()


ORPHAN_LABEL = (
    "INSERT INTO record_labels (record_id, namespace, name, text_value) "
    "VALUES (-1, 'fault', 'fault', 'commit')"
)
"""A label of no record: with foreign keys deferred, it makes the ``COMMIT`` itself fail."""


class SqliteInjector(Injector):
    """Fails between ``apply_writes``' statements, or at a ``COMMIT`` SQLite refuses."""

    name = "sqlite"
    commit_fault = True
    expected = ("STORE_UNAVAILABLE", "SQLITE_IOERR_WRITE")
    expected_at_commit = ("STORE_UNAVAILABLE", "SQLITE_CONSTRAINT_FOREIGNKEY")

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
        super().__init__(store, monkeypatch, plan)
        self._reader = sqlite3.connect(Path(store.path).absolute().as_uri() + "?mode=ro", uri=True)

    def install_writes(self) -> None:
        real = sqlite_store.apply_writes

        def apply_writes(connection: sqlite3.Connection, prepared: Any) -> None:
            real(cast("sqlite3.Connection", _SqliteWrites(connection, self.plan)), prepared)
            if self.plan.at_commit:
                self.plan.fired = True
                connection.execute("PRAGMA defer_foreign_keys = ON")
                connection.execute(ORPHAN_LABEL)

        self.monkeypatch.setattr(sqlite_store, "apply_writes", apply_writes)

    def raw(self) -> dict[str, object]:
        tables = (
            "records",
            "record_labels",
            "record_tags",
            "ledger_events",
            "ledger_streams",
            "store_epoch",
        )
        return {
            table: sorted(self._reader.execute(f"SELECT * FROM {table}").fetchall(), key=repr)  # noqa: S608
            for table in tables
        }

    @contextmanager
    def non_atomic(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        self._reader.close()


ARM_COMMIT_FAULT = "SELECT set_config('flowvault_test.fail_commit', 'on', true)"
FAULT_FUNCTION = """CREATE FUNCTION {schema}.fault_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('flowvault_test.fail_commit', true) = 'on' THEN
        RAISE EXCEPTION 'injected commit failure' USING ERRCODE = '58030';
    END IF;
    RETURN NULL;
END $$"""
FAULT_TRIGGER = (
    "CREATE CONSTRAINT TRIGGER fault_at_commit AFTER INSERT OR UPDATE OR DELETE ON {table} "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.fault_at_commit()"
)
"""Fires at ``COMMIT``, and fails it, only in a transaction that armed it (``set_config``)."""
PG_TABLES = ("records", "record_labels", "record_tags", "ledger_streams", "ledger_events")


class _PgCursor:
    """A cursor whose ``executemany`` writes, and counts, one row at a time."""

    def __init__(self, cursor: Any, writes: _PgWrites) -> None:
        self._cursor = cursor
        self._writes = writes

    def __enter__(self) -> _PgCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()

    def executemany(self, query: str, rows: Any) -> None:
        for row in rows:
            self._cursor.execute(query, row)
            self._writes.wrote()


class _PgWrites:
    """The unit's connection as ``PreparedUnit.apply`` sees it: every row written is counted."""

    def __init__(self, connection: Any, plan: Plan) -> None:
        self._connection = connection
        self._plan = plan

    def execute(self, query: str, params: Any = None, **options: Any) -> Any:
        cursor = self._connection.execute(query, params, **options)
        if _is_write(query):
            self.wrote()
        return cursor

    def cursor(self) -> _PgCursor:
        return _PgCursor(self._connection.cursor(), self)

    def wrote(self) -> None:
        if self._plan.non_atomic:
            self._connection.execute("COMMIT")
            self._connection.execute("BEGIN")
        if self._plan.wrote():
            raise psycopg.errors.DiskFull("injected: could not extend file")


class PostgresInjector(Injector):
    """Fails between ``PreparedUnit.apply``'s statements, or at a ``COMMIT`` the server refuses."""

    name = "postgres"
    commit_fault = True
    expected = ("STORE_UNAVAILABLE", "53100")
    expected_at_commit = ("STORE_UNAVAILABLE", "58030")

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch, plan: Plan, admin: Any) -> None:
        super().__init__(store, monkeypatch, plan)
        self._admin = admin
        self._schema = store.schema

    def install_writes(self) -> None:
        from psycopg import sql  # noqa: PLC0415

        from flowvault.adapters.postgres._commit import PreparedUnit  # noqa: PLC0415

        schema = sql.Identifier(self._schema)
        self._admin.execute(sql.SQL(FAULT_FUNCTION).format(schema=schema))
        for table in PG_TABLES:
            target = sql.Identifier(self._schema, table)
            self._admin.execute(sql.SQL(FAULT_TRIGGER).format(table=target, schema=schema))
        real = PreparedUnit.apply

        def apply(prepared: Any, connection: Any) -> None:
            if self.plan.at_commit:
                self.plan.fired = True
                connection.execute(ARM_COMMIT_FAULT)
            real(prepared, _PgWrites(connection, self.plan))

        self.monkeypatch.setattr(PreparedUnit, "apply", apply)

    def raw(self) -> dict[str, object]:
        from psycopg import sql  # noqa: PLC0415

        view: dict[str, object] = {}
        for table in PG_TABLES:
            query = sql.SQL("SELECT * FROM {}").format(sql.Identifier(self._schema, table))
            view[table] = sorted(self._admin.execute(query).fetchall(), key=repr)
        return view

    def close(self) -> None:
        self._admin.close()


def _driver_code(error: FlowvaultError) -> object:
    """Return the driver's own code an adapter put in the error's details."""
    return error.details.get("code", error.details.get("sqlstate"))


# -- the units -----------------------------------------------------------------


@dataclass
class Bench:
    """One runtime over the backend's store, and the fresh names each subject takes."""

    runtime: Runtime
    clock: FrozenClock
    rng: random.Random
    serial: int = 0

    def next(self) -> int:
        """Return a number no earlier subject used."""
        self.serial += 1
        return self.serial

    def filler(self) -> str:
        """Seeded padding, now and then large enough for out-of-line storage."""
        size = self.rng.choice((0, 16, 300, 5_000, 40_000))
        return "".join(self.rng.choices("abcdefghij", k=size))


@dataclass(frozen=True)
class Scenario:
    """One atomic unit: how to make a fresh subject, the call, and its visible effect."""

    name: str
    prepare: Callable[[Bench], Any]
    act: Callable[[Bench, Any], Any]
    check: Callable[[Bench, Any, Any], None]


def _order(bench: Bench, n: int) -> WorkOrder:
    return WorkOrder(
        kind="invoice.review",
        parameters={
            "invoice": f"INV-{n}",
            "amount": bench.rng.randint(1, 10**6),
            "note": bench.filler(),
        },
        requester="alice@example.org",
        idempotency_key=f"review-{n}",
    )


def _new_workflow(bench: Bench) -> str:
    record, _ = bench.runtime.workflows.create(_order(bench, bench.next()))
    return record.workflow_id


def _check_created(bench: Bench, _order: WorkOrder, result: Any) -> None:
    record, created = result
    assert created, "the retried create found an earlier, partial one"
    workflows = bench.runtime.workflows
    assert workflows.get(record.workflow_id) == record
    events = bench.runtime.workflow_events.events(record.workflow_id)
    assert [e.type for e in events] == ["workflow.created"]


def _check_moved(state: str) -> Callable[[Bench, Any, Any], None]:
    def check(bench: Bench, workflow_id: str, _result: Any) -> None:
        workflows = bench.runtime.workflows
        record = workflows.get(workflow_id)
        assert (record.state, record.state_version) == (state, 2)
        events = bench.runtime.workflow_events.events(workflow_id)
        assert [e.to_state for e in events] == ["intake", state]
        if workflows.machine.is_terminal(state):
            assert record.work_order.parameters == {}

    return check


def _new_scope(bench: Bench) -> str:
    scope = f"scope-{bench.next()}"
    bench.runtime.state(scope).save(WorkflowState(step=1, note=bench.filler()))
    return scope


def _reset(bench: Bench, scope: str) -> Any:
    return bench.runtime.state(scope).reset(actor="ops@example.org", source="fault-test")


def _check_reset(bench: Bench, scope: str, _result: Any) -> None:
    state = bench.runtime.state(scope)
    assert state.load().revision is None
    assert state.history()[-1].type == "workflow_state.reset"


def _new_run(bench: Bench) -> str:
    runs, definitions = bench.runtime.runs, bench.runtime.definitions
    try:
        definitions.get_definition(DEFINITION)
    except NotFound:
        definitions.register_definition(DEFINITION, {"nodes": ["draft", "approve", "pay"]})
    run, _ = runs.start_run(DEFINITION, {"invoice": f"INV-{bench.next()}"})
    runs.set_status(run.run_id, "running", expected_status="accepted")
    return run.run_id


def _new_approval(bench: Bench) -> tuple[str, str]:
    run_id = _new_run(bench)
    runtime = bench.runtime
    checkpoint = runtime.checkpoints.create_checkpoint(
        run_id,
        {"node": "pay"},
        state={"draft": bench.filler()},
        budgets={"tokens": 4200},
        counters={"nodes": 2},
        dependency_summary={"tools": ["bank"]},
        terminal_cursor=None,
        event_cursor=2,
    )
    approval = runtime.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="finance",
        prompt_digest=content_hash(f"Pay {run_id}?"),
        allowed_decisions=["approve", "reject"],
        expires_at=bench.clock.now() + timedelta(hours=4),
    )
    return approval.approval_id, checkpoint.checkpoint_id


def _check_decided(bench: Bench, subject: tuple[str, str], result: Any) -> None:
    approval_id, checkpoint_id = subject
    decided, consumed = result
    runtime = bench.runtime
    assert decided.status is ApprovalStatus.DECIDED
    assert runtime.approvals.get_approval(approval_id) == decided
    assert runtime.checkpoints.load_checkpoint(checkpoint_id) == consumed
    assert consumed.status is CheckpointStatus.CONSUMED


def _finish(bench: Bench, run_id: str) -> Any:
    return bench.runtime.runs.finish_run(
        run_id,
        "completed",
        expected_status="running",
        final_state={"paid": True, "note": bench.filler()},
        events=[("node.finished", {"node": "pay"})],
    )


def _check_finished(bench: Bench, run_id: str, receipt: Any) -> None:
    runs = bench.runtime.runs
    assert bench.runtime.receipts.terminal_receipt(run_id) == receipt
    assert runs.get_run(run_id).status == "completed"


def _fail(bench: Bench, run_id: str) -> Any:
    return bench.runtime.runs.set_status(
        run_id, "failed", expected_status="running", payload={"reason": "fault-test"}
    )


def _check_failed(bench: Bench, run_id: str, _result: Any) -> None:
    runs = bench.runtime.runs
    assert bench.runtime.receipts.terminal_receipt(run_id).status == "failed"
    assert runs.get_run(run_id).status == "failed"


def _new_definition(bench: Bench) -> str:
    definition_id = f"fault.def-{bench.next()}"
    definitions = bench.runtime.definitions
    definitions.register_definition(definition_id, {"nodes": ["a"], "note": bench.filler()})
    definitions.register_definition(definition_id, {"nodes": ["a", "b"]})
    return definition_id


def _check_deleted(bench: Bench, definition_id: str, removed: Any) -> None:
    assert removed == 2
    with pytest.raises(NotFound):
        bench.runtime.definitions.get_definition(definition_id)


SCENARIOS = (
    Scenario(
        "create",
        lambda bench: _order(bench, bench.next()),
        lambda bench, order: bench.runtime.workflows.create(order),
        _check_created,
    ),
    Scenario(
        "transition",
        _new_workflow,
        lambda bench, wf: bench.runtime.workflows.transition(
            wf, "planning", expected_state="intake", expected_version=1, payload={"by": "ops"}
        ),
        _check_moved("planning"),
    ),
    Scenario(
        "terminal transition",
        _new_workflow,
        lambda bench, wf: bench.runtime.workflows.transition(
            wf, "cancelled", expected_state="intake", expected_version=1
        ),
        _check_moved("cancelled"),
    ),
    Scenario("reset", _new_scope, _reset, _check_reset),
    Scenario(
        "approval decide",
        _new_approval,
        lambda bench, subject: bench.runtime.approvals.decide(
            subject[0], "approve", "bob@example.org"
        ),
        _check_decided,
    ),
    Scenario("run finish", _new_run, _finish, _check_finished),
    Scenario("run failed by set_status", _new_run, _fail, _check_failed),
    Scenario(
        "definition delete",
        _new_definition,
        lambda bench, definition_id: bench.runtime.definitions.delete_definition(definition_id),
        _check_deleted,
    ),
)


# -- the harness ---------------------------------------------------------------


@dataclass
class Tally:
    """What one backend's run counted."""

    trials: int = 0
    anomalies: list[str] = field(default_factory=list)
    points: dict[str, list[int]] = field(default_factory=dict)
    controls: int = 0
    caught: int = 0


def _expected(injector: Injector, after: int) -> tuple[str, str]:
    return injector.expected_at_commit if after == COMMIT else injector.expected


def _outcome(error: BaseException | None) -> tuple[str, object]:
    if not isinstance(error, FlowvaultError):
        return "no typed error", repr(error)
    return error.code, _driver_code(error)


def _call(act: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return act(), None
    except Exception as exc:  # any escape is an outcome the harness judges
        return None, exc


def _inject(
    bench: Bench, injector: Injector, scenario: Scenario, *, unit: int, after: int, label: str
) -> list[str]:
    """Fail one unit at one point; return what went wrong (nothing, when it held)."""
    plan = injector.plan
    subject = scenario.prepare(bench)
    before = injector.snapshot()
    plan.arm(unit, after)
    _, error = _call(lambda: scenario.act(bench, subject))
    plan.disarm()
    after_call = injector.snapshot()
    reference = before if unit == 0 else plan.before_unit
    problems = []
    if not plan.fired:
        problems.append("the fault never fired")
    if _outcome(error) != _expected(injector, after):
        problems.append(f"raised {_outcome(error)}, wanted {_expected(injector, after)}")
    if reference is None or after_call != reference:
        changed = "no snapshot" if reference is None else difference(reference, after_call)
        problems.append(f"the store changed: {changed}")
    result, retry_error = _call(lambda: scenario.act(bench, subject))
    if retry_error is not None:
        problems.append(f"the retry without the fault raised {retry_error!r}")
    else:
        _, check_error = _call(lambda: scenario.check(bench, subject, result))
        if check_error is not None:
            problems.append(f"the retry's effect is wrong: {check_error!r}")
    return [f"{label}: {problem}" for problem in problems]


def _control(bench: Bench, injector: Injector, scenario: Scenario) -> bool:
    """Fail the non-atomic variant after its first write; return whether the check saw it."""
    plan = injector.plan
    subject = scenario.prepare(bench)
    before = injector.snapshot()
    with injector.non_atomic():
        plan.arm(0, 1, non_atomic=True)
        _, error = _call(lambda: scenario.act(bench, subject))
        plan.disarm()
    assert plan.fired, scenario.name
    assert isinstance(error, FlowvaultError), (scenario.name, error)
    return injector.snapshot() != before


def _count(bench: Bench, injector: Injector, scenario: Scenario) -> list[int]:
    """Run the unit once without a fault; return the writes of each unit of the call."""
    subject = scenario.prepare(bench)
    injector.plan.arm(None)
    result = scenario.act(bench, subject)
    scenario.check(bench, subject, result)
    return list(injector.plan.writes)


def run_family(bench: Bench, injector: Injector, seed: int, rounds: int) -> Tally:
    """Inject at every point of every unit, ``rounds`` times; then run the controls."""
    tally = Tally()
    for scenario in SCENARIOS:
        writes = _count(bench, injector, scenario)
        assert writes, f"{scenario.name} committed nothing"
        assert all(writes), f"{scenario.name} committed an empty unit: {writes}"
        tally.points[scenario.name] = writes
        points = [(u, k) for u, count in enumerate(writes) for k in range(1, count + 1)]
        if injector.commit_fault:
            points += [(u, COMMIT) for u in range(len(writes))]
        for round_ in range(rounds):
            bench.rng.shuffle(points)
            for unit, after in points:
                where = "commit" if after == COMMIT else f"after write {after}/{writes[unit]}"
                label = (
                    f"seed={seed} backend={injector.name} round={round_} "
                    f"unit={scenario.name}#{unit} {where}"
                )
                tally.trials += 1
                tally.anomalies += _inject(
                    bench, injector, scenario, unit=unit, after=after, label=label
                )
    for scenario in SCENARIOS:
        tally.controls += 1
        tally.caught += _control(bench, injector, scenario)
    return tally


def _points(tally: Tally, commit_fault: bool) -> str:
    extra = "+c" if commit_fault else ""
    return ", ".join(
        f"{name} {'|'.join(f'{n}{extra}' for n in writes)}" for name, writes in tally.points.items()
    )


def _injector(
    wired: Wired, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Injector:
    plan = Plan()
    store = wired.runtime.store
    backend = wired.backend
    if backend == "memory":
        return MemoryInjector(store, monkeypatch, plan)
    if backend == "sqlite":
        return SqliteInjector(store, monkeypatch, plan)
    admin = request.getfixturevalue("postgres_server").admin()
    return PostgresInjector(store, monkeypatch, plan, admin)


def test_no_unit_is_visible_after_a_fault_between_its_writes(
    wired: Wired, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A fault after any write of a unit, or at its commit, leaves the store as it was.

    Every unit is injected at every point; each time the call raises a typed
    error, the full snapshot equals the one before the unit, and the same
    call then succeeds. A non-atomic commit, failed the same way, is caught.
    """
    seed = reliability.seed_base()
    watch = reliability.Stopwatch()
    injector = _injector(wired, monkeypatch, request)
    try:
        injector.install()
        bench = Bench(wired.runtime, wired.clock, random.Random(seed))
        tally = run_family(bench, injector, seed, reliability.size(ci=1, long=5))
    finally:
        injector.close()
    figure = reliability.record(
        reliability.Figure(
            family=f"Fault injection between writes ({wired.family})",
            trials=tally.trials,
            anomalies=len(tally.anomalies),
            control_caught=tally.caught == tally.controls,
            detail=(
                f"points per unit: {_points(tally, injector.commit_fault)}; "
                f"control caught {tally.caught}/{tally.controls}"
            ),
            seconds=watch.seconds,
        )
    )
    assert not tally.anomalies, "\n".join(tally.anomalies[:20])
    assert figure.control_caught, f"non-atomic commits went unseen: {tally.caught}/{tally.controls}"
