"""Power loss: with ``synchronous=FULL`` no acknowledged commit is ever lost.

The real SQLite adapter runs over APSW and a VFS that keeps every write
in memory until the file is synced (``apsw_driver.FaultVFS``). A trial runs
service calls, cuts the power (after a random number of acknowledged
calls, or at the k-th write or sync of a call in flight), lets a random
share of the unsynced writes reach the disk (none, in half the trials),
and reopens the real files with the ordinary stdlib-backed store. Every
call that returned must be there, the call in flight must be wholly there
or wholly absent, ``PRAGMA integrity_check`` must pass, and every record
must open and every ledger verify. A chain of trials shares one database,
so recovery also runs on databases that were recovered before. The
``-shm`` wal-index stays with the default VFS: a reopen after the cut
rebuilds it from the log (see ``apsw_driver``).

At ``synchronous=FULL`` the store is opened the way a host's settings open
it, so the high-water mark (written in the background, its default) is
advanced by the killed runtime and checked by every reopen: a mark that led
the database, naming a commit a cut took back, would refuse the reopen
with ``STORE_ROLLED_BACK``, counted as unsound.

The negative control is the same run at ``synchronous=NORMAL``, which does
not sync the log at commit: it must lose acknowledged commits, or the VFS
is not simulating a power loss at all. It runs without the mark, which
would refuse the rolled-back store rather than show what was lost.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import apsw_driver
import reliability
from apsw_driver import Action, FaultPlan, FaultVFS
from mark_lag import mark_trailed

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite._connect import Synchronous
from flowvault.adapters.system import MarkFileStore
from flowvault.application import HistoryEvent
from flowvault.application._state import STATE_WRITTEN_EVENT
from flowvault.application._workflow_records import stream_of
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import FlowvaultError, NotFound, WorkflowState, WorkOrder
from flowvault.domain._ledger import verify_chain
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE

KEY = bytes(range(32))
SCOPES = ("main", "aux")
CHAIN_LENGTH = 8
"""Trials sharing one database before a fresh one starts."""
MAX_UNITS = 8
"""Acknowledged calls before a cut, at most."""
MAX_POINT = 32
"""A mid-call cut lands at a write or sync numbered 1..MAX_POINT of the call."""

Entry: TypeAlias = tuple[object, ...] | None
Model: TypeAlias = dict[str, Entry]
"""``wf:<id>`` -> (state, version, events); ``scope:<name>`` -> (revision, step, calls).

A scope's calls are its history events other than ``workflow_state.written``:
one per update (its own event) and one per reset.
"""


class PlannedIds:
    """Sequential ids whose next value is known before a call uses it."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._issued = 0

    def upcoming(self) -> str:
        """Return the id the next ``new_id`` will issue."""
        return f"{self._prefix}-{self._issued + 1:06d}"

    def new_id(self) -> str:
        """Issue the next id."""
        self._issued += 1
        return f"{self._prefix}-{self._issued:06d}"


@dataclass(slots=True)
class Unit:
    """One service call and the model it leaves: after it, and in between its two commits."""

    name: str
    call: Callable[[Runtime], object]
    after: Model
    midway: Model | None = None


@dataclass(slots=True)
class Chain:
    """One database and what every acknowledged call so far put in it."""

    home: Path
    ids: PlannedIds
    clock: FrozenClock = field(default_factory=FrozenClock)
    model: Model = field(default_factory=dict)
    created: int = 0

    @property
    def path(self) -> Path:
        return self.home / "data" / "flowvault.db"


@dataclass(slots=True)
class Tally:
    """What one run of trials saw."""

    trials: int = 0
    mid_call: int = 0
    partial_writeback: int = 0
    acknowledged: int = 0
    lost: int = 0
    unsound: int = 0
    landed: int = 0
    absent: int = 0
    halfway: int = 0
    marked: int = 0
    """Reopens checked against the high-water mark the cut runtime advanced."""
    behind: int = 0
    """Of those, reopens where the mark trailed the store (its background write not yet made)."""
    failures: list[str] = field(default_factory=list)


def _step(state: WorkflowState) -> WorkflowState:
    fields = state.model_dump()
    return WorkflowState(**{**fields, "step": int(fields.get("step", 0)) + 1})


def _next_unit(chain: Chain, rng: random.Random) -> Unit:
    """Pick a call the model allows, with the model it should leave."""
    model = chain.model
    live = [
        key
        for key, entry in model.items()
        if key.startswith("wf:") and entry is not None and not _terminal(entry)
    ]
    roll = rng.random()
    if roll < 0.25 or not live:
        return _create(chain)
    if roll < 0.6:
        return _transition(chain, rng.choice(sorted(live)), rng)
    scope = rng.choice(SCOPES)
    if roll < 0.9:
        return _update(chain, scope)
    return _reset(chain, scope)


def _terminal(entry: tuple[object, ...]) -> bool:
    return DEFAULT_LIFECYCLE.is_terminal(str(entry[0]))


def _create(chain: Chain) -> Unit:
    workflow_id = chain.ids.upcoming()
    chain.created += 1
    order = WorkOrder(
        kind="power.loss",
        parameters={"n": chain.created},
        requester="tester",
        idempotency_key=f"{chain.home.name}-{chain.created}",
    )
    after = {**chain.model, f"wf:{workflow_id}": ("intake", 1, 1)}
    return Unit("create", lambda runtime: runtime.workflows.create(order), after)


def _transition(chain: Chain, key: str, rng: random.Random) -> Unit:
    state, version, events = chain.model[key] or ()
    target = rng.choice(sorted(DEFAULT_LIFECYCLE.targets(str(state))))
    workflow_id = key.removeprefix("wf:")
    after = {**chain.model, key: (target, int(str(version)) + 1, int(str(events)) + 1)}

    def call(runtime: Runtime) -> object:
        return runtime.workflows.transition(
            workflow_id, target, expected_state=str(state), expected_version=int(str(version))
        )

    return Unit(f"transition->{target}", call, after)


def _scope_entry(chain: Chain, scope: str) -> tuple[int | None, int | None, int]:
    entry = chain.model.get(f"scope:{scope}") or (None, None, 0)
    revision, step, history = entry
    return (
        None if revision is None else int(str(revision)),
        None if step is None else int(str(step)),
        int(str(history)),
    )


def _update(chain: Chain, scope: str) -> Unit:
    revision, step, history = _scope_entry(chain, scope)
    after = {**chain.model, f"scope:{scope}": ((revision or 0) + 1, (step or 0) + 1, history + 1)}

    def call(runtime: Runtime) -> object:
        return runtime.state(scope).update_with_events(
            lambda s: (_step(s), [HistoryEvent("state.stepped", {"scope": scope})])
        )

    return Unit("state update", call, after)


def _reset(chain: Chain, scope: str) -> Unit:
    revision, step, history = _scope_entry(chain, scope)
    after = {**chain.model, f"scope:{scope}": (None, None, history + 1)}
    midway = {**chain.model, f"scope:{scope}": (revision, step, history + 1)}

    def call(runtime: Runtime) -> object:
        return runtime.state(scope).reset(actor="tester", source="power-loss")

    return Unit("state reset", call, after, midway if revision is not None else None)


# -- observing a reopened store ----------------------------------------------------


def _observe(runtime: Runtime, keys: set[str]) -> Model:
    """Read every entity back through the services: records open, ledgers verify."""
    seen: Model = {}
    for key in sorted(keys):
        kind, _, name = key.partition(":")
        seen[key] = (
            _observe_workflow(runtime, name) if kind == "wf" else _observe_scope(runtime, name)
        )
    return seen


def _observe_workflow(runtime: Runtime, workflow_id: str) -> Entry:
    try:
        record = runtime.workflows.get(workflow_id)
    except NotFound:
        head = runtime.store.ledger_head(stream_of(workflow_id))
        return None if head is None else ("<ledger without record>", 0, head.index + 1)
    events = runtime.workflow_events.events(workflow_id, verify=True)
    return (record.state, record.state_version, len(events))


def _observe_scope(runtime: Runtime, scope: str) -> Entry:
    state = runtime.state(scope)
    history = state.history()
    verify_chain(history).raise_for_defect()
    snapshot = state.load()
    step = snapshot.state.model_dump().get("step") if snapshot.revision is not None else None
    calls = sum(event.type != STATE_WRITTEN_EVENT for event in history)
    entry = (snapshot.revision, step, calls)
    return None if entry == (None, None, 0) else entry


def _commits(entry: Entry, key: str) -> int:
    """How many acknowledged calls an entry stands for: versions, or history events."""
    if entry is None:
        return 0
    return int(str(entry[1] if key.startswith("wf:") else entry[2]))


def _lost(before: Model, seen: Model) -> int:
    return sum(
        max(0, _commits(entry, key) - _commits(seen.get(key), key)) for key, entry in before.items()
    )


# -- one trial ---------------------------------------------------------------------


def _settings(chain: Chain, synchronous: Synchronous) -> Settings:
    return Settings(backend="sqlite", home=chain.home, synchronous=synchronous)


def _new_chain(root: Path, number: int) -> Chain:
    home = root / f"chain-{number:04d}"
    chain = Chain(home=home, ids=PlannedIds(f"c{number}"))
    SQLiteSecureObjectStore.open(chain.path, create=True).close()
    return chain


def _run_until_cut(
    chain: Chain, vfs: FaultVFS, rng: random.Random, synchronous: Synchronous, tally: Tally
) -> Unit | None:
    """Run acknowledged calls, then cut; return the call in flight at the cut, if any."""
    units = rng.randint(0, MAX_UNITS)
    point = rng.randint(1, MAX_POINT) if rng.random() < 0.5 else None
    in_flight: Unit | None = None
    with apsw_driver.adapter_over(vfs.vfs_name):
        runtime = _open(chain, synchronous, chain.ids)
        try:
            for _ in range(units):
                unit = _next_unit(chain, rng)
                unit.call(runtime)
                chain.model = unit.after
                tally.acknowledged += 1
                chain.clock.advance()
            if point is not None:
                tally.mid_call += 1
                unit = _next_unit(chain, rng)
                vfs.arm(FaultPlan(point, Action.CUT))
                try:
                    unit.call(runtime)
                except FlowvaultError:
                    if not vfs.dead:
                        raise
                    in_flight = unit
                finally:
                    vfs.disarm()
                if in_flight is None:
                    chain.model = unit.after
                    tally.acknowledged += 1
            if not vfs.dead:
                vfs.cut()
        finally:
            runtime.close()
    return in_flight


def _open(chain: Chain, synchronous: Synchronous, ids: PlannedIds | None = None) -> Runtime:
    """Open the chain's store: through its high-water mark at FULL, as a host's own store else."""
    settings = _settings(chain, synchronous)
    if synchronous == "full":
        return bootstrap(settings, key=KEY, clock=chain.clock, ids=ids, create=True)
    store = SQLiteSecureObjectStore.open(chain.path, synchronous=synchronous, create=True)
    try:
        return bootstrap(settings, key=KEY, store=store, clock=chain.clock, ids=ids)
    except BaseException:
        store.close()
        raise


def _reopen_and_observe(
    chain: Chain, synchronous: Synchronous, keys: set[str], tally: Tally
) -> Model:
    """Reopen with the stdlib store; raise ``AssertionError`` unless the files are sound."""
    settings = _settings(chain, synchronous)
    mark = None if settings.high_water_path is None else MarkFileStore(settings.high_water_path)
    left = None if mark is None else mark.read()
    with _open(chain, synchronous) as runtime:
        if synchronous == "full":
            tally.marked += 1
            tally.behind += mark_trailed(left, runtime)
        findings = apsw_driver.integrity_check(chain.path)
        if findings != ["ok"]:
            raise AssertionError(f"integrity_check: {findings[:3]}")
        return _observe(runtime, keys)


def _verify(
    chain: Chain, in_flight: Unit | None, synchronous: Synchronous, tally: Tally
) -> str | None:
    """Reopen and compare with the model; return what is wrong, or ``None``, and move it on."""
    before = chain.model
    expected = [("landed", in_flight.after)] if in_flight else []
    if in_flight is not None and in_flight.midway is not None:
        expected.append(("halfway", in_flight.midway))
    expected.append(("absent", before))
    keys = set(before) | {key for _, model in expected for key in model}
    try:
        seen = _reopen_and_observe(chain, synchronous, keys, tally)
    except (FlowvaultError, AssertionError) as error:
        tally.unsound += 1
        return f"the reopened store is not sound: {error}"
    for outcome, model in expected:
        if all(seen.get(key) == model.get(key) for key in keys):
            if in_flight is not None:
                setattr(tally, outcome, getattr(tally, outcome) + 1)
            chain.model = model
            return None
    lost = _lost(before, seen)
    tally.lost += lost
    wrong = {
        key: (before.get(key), seen.get(key)) for key in keys if seen.get(key) != before.get(key)
    }
    flight = in_flight.name if in_flight else "none"
    return f"lost {lost} acknowledged commit(s); in flight: {flight}; expected vs seen: {wrong}"


def run_cuts(root: Path, synchronous: Synchronous, trials: int, seed: int) -> Tally:
    """Run ``trials`` cuts at ``synchronous``; count what a reopen no longer shows."""
    tally = Tally()
    chain_number = 0
    chain = _new_chain(root, chain_number)
    with apsw_driver.registered(f"powerloss-{synchronous}-{seed}", volatile=True) as vfs:
        for trial in range(trials):
            rng = random.Random(f"{seed}:{synchronous}:{trial}")
            if trial and trial % CHAIN_LENGTH == 0:
                chain_number += 1
                chain = _new_chain(root, chain_number)
            survival = 0.0 if rng.random() < 0.5 else rng.uniform(0.1, 0.9)
            tally.partial_writeback += survival > 0
            where = (
                f"RELIABILITY_SEED={seed} synchronous={synchronous} trial {trial} "
                f"(chain {chain_number}, survival {survival:.2f})"
            )
            try:
                in_flight = _run_until_cut(chain, vfs, rng, synchronous, tally)
            except Exception as error:
                raise AssertionError(f"{where}: a call failed before any cut") from error
            vfs.restart(rng, survival)
            tally.trials += 1
            problem = _verify(chain, in_flight, synchronous, tally)
            if problem is not None:
                tally.failures.append(f"{where}: {problem}")
                chain_number += 1
                chain = _new_chain(root, chain_number)
    return tally


def test_power_loss_at_synchronous_full_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    """With synchronous=FULL, every call that returned survives any cut, and the store opens sound.

    The call in flight at the cut lands wholly or not at all (a reset may
    also stop between its audit event and its delete, as documented). The
    same harness at synchronous=NORMAL must lose acknowledged commits.
    """
    watch = reliability.Stopwatch()
    seed = reliability.seed_base()
    full = run_cuts(tmp_path / "full", "full", reliability.size(300, 3000), seed)
    control = run_cuts(tmp_path / "normal", "normal", reliability.size(60, 300), seed)
    detail = (
        f"FULL: {full.trials} cuts ({full.mid_call} mid-call, {full.partial_writeback} with "
        f"partial write-back), {full.acknowledged} acknowledged calls, {full.lost} lost; "
        f"call in flight landed {full.landed}, absent {full.absent}, reset halfway "
        f"{full.halfway}; {full.marked} reopens passed the high-water mark ({full.behind} "
        f"with it trailing the store). Control NORMAL: {control.trials} cuts, "
        f"{control.lost} acknowledged commits lost in "
        f"{len(control.failures) - control.unsound} trials, {control.unsound} reopened unsound"
    )
    reliability.record(
        reliability.Figure(
            family="Power loss, synchronous=FULL (APSW VFS)",
            trials=full.trials,
            anomalies=len(full.failures),
            control_caught=control.lost > 0,
            detail=detail,
            seconds=watch.seconds,
        )
    )
    assert not full.failures, "\n".join(full.failures[:10])
    assert control.lost > 0, f"synchronous=NORMAL lost nothing: the cut is not real ({detail})"
