"""I/O errors: a failed write, sync or truncate surfaces as STORE_UNAVAILABLE and tears nothing.

For every mutating use case, the real SQLite adapter runs over APSW and a
VFS (``apsw_driver.FaultVFS``) that fails the k-th write, sync or truncate
of that one operation, counted together in call order over the database,
its log and its journal, for k = 1, 2, ... until the operation completes
without reaching k. Each k runs twice: the failure happens once
(transient), and every later write, sync and truncate of the operation
fails too (persistent). The long profile repeats it all at
``synchronous=NORMAL``, whose commits sync at other points.

Each failed operation must raise a flowvault error with code
``STORE_UNAVAILABLE``, except where the failure hits the compaction that
follows a scrub or purge whose commit has already landed: that call succeeds
(its change is durable) and the store must hold all of it. The files are
then reopened with the ordinary stdlib-backed store: ``PRAGMA
integrity_check`` passes and the store's whole logical content (every record
opened, every ledger verified) equals the state before the operation, or the
state after one of its units of work in order; an operation that returned
equals the state after all of them. An operation of several units (a reset
records its event and then deletes; retention purges in batches) may stop
between them; a single unit never shows half of itself.

The negative control swallows a sync instead (the VFS reports success and
drops the unsynced data): the same checker must see an operation that
reported success while its writes are missing.
"""

from __future__ import annotations

import itertools
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeAlias

import apsw_driver
import reliability
from apsw_driver import Action, FaultPlan, FaultVFS

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite._connect import Synchronous
from flowvault.application import HistoryEvent, RetentionPolicy, UnitOfWork
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.application.testing._fakes import EPOCH
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    FlowvaultError,
    StoreUnavailable,
    WorkflowState,
    WorkOrder,
    content_hash,
)
from flowvault.domain._canonical import canonical_json, digest_bytes
from flowvault.domain._ledger import verify_chain

KEY = bytes(range(32))
TEMPLATE_TIME = EPOCH + timedelta(days=1)
OPERATION_TIME = TEMPLATE_TIME + timedelta(minutes=1)
PURGE_TIME = OPERATION_TIME + timedelta(days=400)
RETENTION = RetentionPolicy(finished_runs=timedelta(days=30), batch_size=2)

Snapshot: TypeAlias = tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]
"""Every record (namespace, digest, revision, labels, document) and every stream's event hashes."""


# -- the databases the trials start from ---------------------------------------------

Ids: TypeAlias = dict[str, str]
"""Names of what an operation acts on, in its template database."""


def _runtime(home: Path, store: SQLiteSecureObjectStore, at: datetime, prefix: str) -> Runtime:
    return bootstrap(
        Settings(backend="sqlite", home=home),
        key=KEY,
        store=store,
        clock=FrozenClock(at),
        ids=SequentialIds(prefix),
    )


def _order(name: str) -> WorkOrder:
    return WorkOrder(
        kind="io.errors", parameters={"name": name}, requester="tester", idempotency_key=name
    )


def _workflow_in(runtime: Runtime, state: str) -> str:
    """Create a workflow and walk it to ``state`` along intake -> planning -> executing."""
    record, _ = runtime.workflows.create(_order(f"walked-to-{state}"))
    path = ["intake", "planning", "executing"]
    for version, (source, target) in enumerate(itertools.pairwise(path), start=1):
        if source == state:
            break
        runtime.workflows.transition(
            record.workflow_id, target, expected_state=source, expected_version=version
        )
    return record.workflow_id


def _checkpoint_for(runtime: Runtime, cursor: str) -> tuple[str, str]:
    """Start a running run and checkpoint it; return (run id, checkpoint id)."""
    runtime.definitions.register_definition("graph.io", {"nodes": ["draft", "approve"]})
    run, _ = runtime.runs.start_run("graph.io", {"cursor": cursor})
    runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
    checkpoint = runtime.checkpoints.create_checkpoint(
        run.run_id,
        {"node": cursor},
        state={"draft": cursor},
        budgets={"tokens": 100},
        counters={"nodes": 1},
        dependency_summary={"tools": []},
        terminal_cursor=None,
        event_cursor=1,
    )
    return run.run_id, checkpoint.checkpoint_id


def _request(runtime: Runtime, checkpoint_id: str) -> str:
    checkpoint = runtime.checkpoints.load_checkpoint(checkpoint_id)
    approval = runtime.approvals.request_approval(
        checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="finance",
        prompt_digest=content_hash(f"approve {checkpoint_id}?"),
        allowed_decisions=["approve", "reject"],
        expires_at=TEMPLATE_TIME + timedelta(hours=4),
    )
    return approval.approval_id


def _no_setup(runtime: Runtime) -> Ids:
    return {}


def _saved_state(runtime: Runtime) -> Ids:
    runtime.state("main").update_with_events(_stepped)
    return {}


def _pending_approval(runtime: Runtime) -> Ids:
    _, checkpoint = _checkpoint_for(runtime, "decide")
    return {"approval": _request(runtime, checkpoint)}


def _pending_checkpoint(runtime: Runtime) -> Ids:
    return {"checkpoint": _checkpoint_for(runtime, "consume")[1]}


def _purgeable(runtime: Runtime) -> Ids:
    """Something of every kind retention purges; three results make two batches."""
    workflow = _workflow_in(runtime, "executing")
    for n in range(3):
        runtime.action_results.put_action_result(
            workflow, content_hash(f"action-{n}"), {"n": n}, retention=timedelta(seconds=1)
        )
    _, settled = _checkpoint_for(runtime, "settled")
    runtime.approvals.decide(_request(runtime, settled), "reject", "carol@example.org")
    finished, _ = runtime.runs.start_run("graph.io", {"cursor": "done"})
    runtime.runs.set_status(finished.run_id, "running", expected_status="accepted")
    runtime.runs.finish_run(
        finished.run_id, "completed", expected_status="running", final_state={"ok": True}
    )
    runtime.idempotency.remember("request-1", {"n": 1}, {"status": "ok"})
    return {}


def build_template(home: Path, setup: Callable[[Runtime], Ids]) -> Ids:
    """Write, with the stdlib store, the database an operation starts from."""
    store = SQLiteSecureObjectStore.open(home / "data" / "flowvault.db", create=True)
    with _runtime(home, store, TEMPLATE_TIME, "tpl") as runtime:
        return setup(runtime)


def _clone(template: Path, home: Path) -> Path:
    """Copy the template database (closed cleanly: no log) into a fresh, private home."""
    data = home / "data"
    data.mkdir(parents=True, mode=0o700)
    target = data / "flowvault.db"
    shutil.copyfile(template / "data" / "flowvault.db", target)
    target.chmod(0o600)
    return target


# -- the operations ---------------------------------------------------------------


def _stepped(state: WorkflowState) -> tuple[WorkflowState, list[HistoryEvent]]:
    fields = state.model_dump()
    step = int(fields.get("step", 0)) + 1
    return WorkflowState(**{**fields, "step": step}), [HistoryEvent("state.stepped", {"to": step})]


@dataclass(frozen=True, slots=True)
class Operation:
    """A mutating use case: what its database holds first, and the call."""

    setup: Callable[[Runtime], Ids]
    call: Callable[[Runtime, Ids], object]


OPERATIONS: dict[str, Operation] = {
    "create": Operation(_no_setup, lambda rt, ids: rt.workflows.create(_order("new"))),
    "transition": Operation(
        lambda rt: {"workflow": _workflow_in(rt, "intake")},
        lambda rt, ids: rt.workflows.transition(
            ids["workflow"], "planning", expected_state="intake", expected_version=1
        ),
    ),
    "terminal transition (scrub + compact)": Operation(
        lambda rt: {"workflow": _workflow_in(rt, "executing")},
        lambda rt, ids: rt.workflows.transition(
            ids["workflow"], "completed", expected_state="executing", expected_version=3
        ),
    ),
    "state update": Operation(
        _saved_state, lambda rt, ids: rt.state("main").update_with_events(_stepped)
    ),
    "state reset": Operation(
        _saved_state, lambda rt, ids: rt.state("main").reset(actor="tester", source="io-errors")
    ),
    "approval decide": Operation(
        _pending_approval,
        lambda rt, ids: rt.approvals.decide(ids["approval"], "approve", "bob@example.org"),
    ),
    "checkpoint consume": Operation(
        _pending_checkpoint, lambda rt, ids: rt.checkpoints.consume_checkpoint(ids["checkpoint"])
    ),
    "retention purge": Operation(
        _purgeable, lambda rt, ids: rt.retention(RETENTION).run(PURGE_TIME)
    ),
}
"""Every mutating use case. Retention purges expired action results (two batches), a decided
approval, a consumed checkpoint, an idempotency record and a finished run, compacting after
each kind; a terminal transition scrubs the order and compacts."""


# -- what a store holds ------------------------------------------------------------


class Reader:
    """Reads a store's whole logical content: every record opened, every stream verified.

    Opening and verifying are remembered by exact content (a record's
    payload bytes, a stream's every field), so the template's unchanged
    records are opened once per run rather than once per trial; anything
    new or changed is opened and verified afresh.
    """

    def __init__(self) -> None:
        self._documents: dict[tuple[str, str, int, str], str] = {}
        self._chains: set[tuple[str, ...]] = set()

    def snapshot(self, runtime: Runtime) -> Snapshot:
        """Return every record (namespace, digest, revision, labels, document) and stream."""
        store = runtime.store
        records: list[tuple[str, ...]] = []
        stats = store.namespace_counts()  # type: ignore[attr-defined]
        for namespace in sorted(stats):
            cursor: str | None = None
            while True:
                page = store.list(namespace, cursor=cursor, limit=200)
                for metadata in page.items:
                    labels = canonical_json({k: str(v) for k, v in metadata.labels.items()})
                    document = self._document(runtime, namespace, metadata.key_digest)
                    revision = str(metadata.revision)
                    records.append((namespace, metadata.key_digest, revision, labels, document))
                cursor = page.next_cursor
                if cursor is None:
                    break
        streams: list[tuple[str, ...]] = []
        for stream in store.list_streams(limit=200):
            page = store.read_ledger(stream, limit=200)
            assert page.next_index is None, "streams in this fixture fit one page"
            content = tuple(repr(sorted(vars(event).items())) for event in page.events)
            if content not in self._chains:
                verify_chain(page.events).raise_for_defect()
                self._chains.add(content)
            streams.append((stream, *(event.event_hash for event in page.events)))
        return tuple(records), tuple(streams)

    def _document(self, runtime: Runtime, namespace: str, key_digest: str) -> str:
        record = runtime.store.load(namespace, key_digest)
        assert record is not None, f"{namespace} record listed but not loaded"
        key = (namespace, key_digest, record.metadata.revision, digest_bytes(record.payload))
        if key not in self._documents:
            opened = runtime.repository.open(record, namespace=namespace, key_digest=key_digest)
            self._documents[key] = canonical_json(opened.document)
        return self._documents[key]


READER = Reader()


def snapshot(runtime: Runtime) -> Snapshot:
    """Return the store's whole logical content (see ``Reader``)."""
    return READER.snapshot(runtime)


def reopened_snapshot(home: Path, path: Path) -> Snapshot:
    """Reopen with the stdlib store; check integrity; return the snapshot."""
    store = SQLiteSecureObjectStore.open(path, create=True)
    with _runtime(home, store, OPERATION_TIME, "check") as runtime:
        findings = apsw_driver.integrity_check(path)
        if findings != ["ok"]:
            raise AssertionError(f"integrity_check: {findings[:3]}")
        return snapshot(runtime)


@contextmanager
def _over_vfs(case: Case, home: Path, path: Path, vfs: FaultVFS) -> Iterator[Runtime]:
    with apsw_driver.adapter_over(vfs.vfs_name):
        store = apsw_driver.open_store(path, vfs.vfs_name, synchronous=case.synchronous)
        try:
            yield _runtime(home, store, OPERATION_TIME, "op")
        finally:
            store.close()


# -- the reference run and the trials ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    """One operation, the template it starts from, the ids it acts on, and the sync level."""

    name: str
    template: Path
    ids: Ids
    synchronous: Synchronous = "full"

    @property
    def label(self) -> str:
        return self.name if self.synchronous == "full" else f"{self.name} @{self.synchronous}"

    def run(self, runtime: Runtime) -> object:
        return OPERATIONS[self.name].call(runtime, self.ids)


def prepare_cases(name: str, root: Path, levels: Sequence[Synchronous]) -> list[Case]:
    """Build the operation's template database under ``root``; one case per sync level."""
    template = root / "template"
    ids = build_template(template, OPERATIONS[name].setup)
    return [Case(name, template, ids, level) for level in levels]


@dataclass(slots=True)
class Reference:
    """An operation run without faults: its I/O calls and the state after each unit of work."""

    calls: list[str]
    states: list[Snapshot]
    """The state before the operation, then after each of its commits."""

    def describe(self) -> str:
        kinds = {kind: self.calls.count(kind) for kind in ("write", "sync", "truncate")}
        return f"{len(self.calls)} ({kinds['write']}w/{kinds['sync']}s/{kinds['truncate']}t)"


def reference(case: Case, home: Path, vfs: FaultVFS) -> Reference:
    """Run the operation once without faults, snapshotting after every commit."""
    path = _clone(case.template, home)
    states = [reopened_snapshot(home, path)]
    with _over_vfs(case, home, path, vfs) as runtime:
        store = runtime.store
        commit = store.commit

        def recording(unit: UnitOfWork) -> None:
            commit(unit)
            states.append(snapshot(runtime))

        store.commit = recording  # type: ignore[method-assign]
        vfs.arm(None)
        try:
            case.run(runtime)
        finally:
            calls = vfs.disarm()
    vfs.settle()
    final = reopened_snapshot(home, path)
    assert final == states[-1], f"{case.label}: the reopened store differs from the reference run"
    return Reference(calls, states)


@dataclass(frozen=True, slots=True)
class Trial:
    """What one faulty run did: whether the plan fired, what the call raised, what reopened."""

    fired: bool
    calls: int
    """Writes, syncs and truncates the operation attempted, the failed ones included."""
    error: FlowvaultError | None
    seen: Snapshot | None
    broken: str | None = None
    """Why the reopened store could not be read, when it could not."""


def run_trial(
    case: Case, plan: FaultPlan | None, home: Path, vfs: FaultVFS, *, cut: bool = False
) -> Trial:
    """Run the operation under ``plan``, then reopen its files with the stdlib store.

    With ``cut`` the power goes as soon as the operation ends, so whatever it
    did not sync is lost; otherwise the store is closed in an orderly way.
    """
    path = _clone(case.template, home)
    error: FlowvaultError | None = None
    with _over_vfs(case, home, path, vfs) as runtime:
        vfs.arm(plan)
        try:
            case.run(runtime)
        except FlowvaultError as caught:
            error = caught
        finally:
            calls = len(vfs.disarm())
            fired = vfs.fired > 0
            if cut:
                vfs.cut()
    if cut:
        vfs.restart()
    vfs.settle()
    try:
        return Trial(fired, calls, error, reopened_snapshot(home, path))
    except (FlowvaultError, AssertionError) as broken:
        return Trial(fired, calls, error, None, f"reopen failed: {broken}")


def resumed(case: Case, home: Path) -> tuple[tuple[str, ...], ...]:
    """Run the operation again on the reopened store; return the records it leaves."""
    store = SQLiteSecureObjectStore.open(home / "data" / "flowvault.db", create=True)
    with _runtime(home, store, OPERATION_TIME, "again") as runtime:
        case.run(runtime)
        return snapshot(runtime)[0]


def judge(ref: Reference, trial: Trial) -> tuple[str | None, str]:
    """Return (what is wrong or ``None``, where the operation stopped)."""
    if trial.seen is None:
        return trial.broken, "unreadable"
    if trial.seen not in ref.states:
        return "the reopened store matches no state the operation can leave", "torn"
    position, units = ref.states.index(trial.seen), len(ref.states) - 1
    if trial.error is None and position != units:
        return f"reported success but only {position} of {units} units landed", "lost"
    if position == 0:
        return None, "absent"
    return None, "between units" if position < units else "present"


@dataclass(slots=True)
class Tally:
    """Counts over every operation."""

    trials: int = 0
    persistent: int = 0
    same_as_transient: int = 0
    """Persistent failures not run: no call followed the transient one, so nothing would differ."""
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    """Per operation: where the store was after each injected error."""
    failures: list[str] = field(default_factory=list)
    points: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Checker:
    """Judges one operation's trials against its reference run."""

    case: Case
    ref: Reference
    tally: Tally
    resumed_from: list[Snapshot | None] = field(default_factory=list)
    """States between units already resumed; each is resumed once."""

    def check(self, trial: Trial, k: int, mode: str, home: Path) -> None:
        """Record what is wrong with a trial whose failure fired at call ``k``."""
        kind = self.ref.calls[k - 1] if k <= len(self.ref.calls) else "extra call"
        where = f"{self.case.label}, {mode} failure at call k={k} ({kind})"
        failures = self.tally.failures
        error = trial.error
        problem, outcome = judge(self.ref, trial)
        if error is None and outcome == "present":
            outcome = "succeeded, compaction deferred"
        elif not isinstance(error, StoreUnavailable):
            failures.append(f"{where}: expected STORE_UNAVAILABLE, got {error!r}")
        elif error.code != "STORE_UNAVAILABLE":
            failures.append(f"{where}: code {error.code}, not STORE_UNAVAILABLE")
        if outcome == "between units" and trial.seen not in self.resumed_from:
            self.resumed_from.append(trial.seen)
            if resumed(self.case, home) != self.ref.states[-1][0]:
                problem = "stopped between units, and running it again does not complete it"
        if problem is not None:
            failures.append(f"{where}: {problem}")
        self.tally.outcomes.setdefault(self.case.label, Counter())[outcome] += 1

    def check_clean(self, trial: Trial, k: int) -> None:
        """Record what is wrong with the run whose planned call ``k`` never came."""
        where = f"{self.case.label}, failure planned at call k={k} (never reached)"
        calls = len(self.ref.calls)
        if k != calls + 1:
            self.tally.failures.append(f"{where}: ran out of calls at {k - 1}, not {calls}")
        problem = judge(self.ref, trial)[0]
        if trial.error is not None or problem is not None:
            self.tally.failures.append(f"{where}: {trial.error or problem}")


def exercise(case: Case, root: Path, vfs: FaultVFS, tally: Tally) -> None:
    """Fail every write, sync and truncate of the operation in turn, once and persistently.

    The persistent failure at ``k`` is run whenever the transient run made a
    later call; otherwise the two runs are the same call for call, so at CI
    size it runs only at the first and the last point (every point in the
    long profile).
    """
    ref = reference(case, root / "reference", vfs)
    tally.points[case.label] = ref.describe()
    checker = Checker(case, ref, tally)
    for k in itertools.count(1):
        home = root / f"transient-{k}"
        trial = run_trial(case, FaultPlan(k, Action.FAIL), home, vfs)
        tally.trials += 1
        if not trial.fired:
            checker.check_clean(trial, k)
            shutil.rmtree(home)
            return
        checker.check(trial, k, "transient", home)
        shutil.rmtree(home)
        sampled = reliability.is_long() or k in (1, len(ref.calls))
        if trial.calls <= k and not sampled:
            tally.same_as_transient += 1
            continue
        home = root / f"persistent-{k}"
        trial = run_trial(case, FaultPlan(k, Action.FAIL, persistent=True), home, vfs)
        tally.trials += 1
        tally.persistent += 1
        checker.check(trial, k, "persistent", home)
        shutil.rmtree(home)


@dataclass(slots=True)
class Control:
    """Swallowed syncs: how many, and what became of them."""

    lied: int = 0
    caught: int = 0
    """The checker flagged a loss the operation did not report."""
    surfaced: int = 0
    """The operation itself failed (a later read found the data missing); nothing to catch."""
    honest: list[str] = field(default_factory=list)
    """What the checker wrongly flagged in runs with the same cut and no lie."""


def swallowed_syncs(case: Case, root: Path, vfs: FaultVFS, control: Control) -> None:
    """Lie at each sync of the operation, then cut the power as it returns.

    The honest run (no lie, the same cut) must pass the checker, so a caught
    lie is the lie's doing and not the cut's.
    """
    ref = reference(case, root / "reference", vfs)
    honest = run_trial(case, None, root / "honest", vfs, cut=True)
    shutil.rmtree(root / "honest")
    wrong = judge(ref, honest)[0] or (f"raised {honest.error!r}" if honest.error else None)
    if wrong is not None:
        control.honest.append(f"{case.label}: {wrong}")
    for k, kind in enumerate(ref.calls, start=1):
        if kind != "sync":
            continue
        trial = run_trial(case, FaultPlan(k, Action.LIE), root / f"lie-{k}", vfs, cut=True)
        shutil.rmtree(root / f"lie-{k}")
        if trial.fired:
            control.lied += 1
            control.caught += judge(ref, trial)[0] is not None
            control.surfaced += trial.error is not None


def _slug(name: str) -> str:
    return re.sub(r"[^a-z]+", "-", name.lower()).strip("-")


def test_io_errors_surface_as_store_unavailable_and_tear_nothing(tmp_path: Path) -> None:
    """A failed write, sync or truncate raises STORE_UNAVAILABLE and tears no unit of work.

    For every mutating operation and every such call in it, failed once or
    for good, the store reopens sound and each of the operation's units is
    wholly present or wholly absent.
    """
    watch = reliability.Stopwatch()
    levels: list[Synchronous] = ["full", "normal"] if reliability.is_long() else ["full"]
    cases = [
        case for name in OPERATIONS for case in prepare_cases(name, tmp_path / _slug(name), levels)
    ]
    tally = Tally()
    with apsw_driver.registered("io-errors", volatile=False) as vfs:
        for case in cases:
            exercise(case, tmp_path / _slug(case.label) / "faults", vfs, tally)
    control = Control()
    with apsw_driver.registered("io-errors-lying", volatile=True) as lying:
        for case in cases:
            if case.synchronous == "full":
                swallowed_syncs(case, tmp_path / _slug(case.label) / "lies", lying, control)
    per_op = "; ".join(
        f"{label} {tally.points[label]}: "
        + ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
        for label, counts in tally.outcomes.items()
    )
    detail = (
        f"per op: injection points (writes/syncs/truncates), then where the store was after "
        f"each injected error: {per_op}. Each point failed once; failed persistently too in "
        f"{tally.persistent} trials; skipped at {tally.same_as_transient} points whose transient "
        f"run made no later write/sync/truncate (so identical). Control (a sync "
        f"reports success without persisting, power cut as the op returns): {control.lied} "
        f"swallowed syncs, {control.caught} caught by the checker, {control.surfaced} made the "
        f"op fail, the rest lost nothing; the same cut without the lie passes every op"
    )
    reliability.record(
        reliability.Figure(
            family="I/O errors (k-th write/sync/truncate)",
            trials=tally.trials,
            anomalies=len(tally.failures),
            control_caught=control.caught > 0 and not control.honest,
            detail=detail,
            seconds=watch.seconds,
        )
    )
    assert not tally.failures, "\n".join(tally.failures[:20])
    assert not control.honest, f"the control's honest runs failed the checker: {control.honest}"
    assert control.caught > 0, f"no swallowed sync was caught: the checker is blind ({detail})"
