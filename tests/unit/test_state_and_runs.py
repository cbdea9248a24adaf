"""State repository, reset fingerprints and run repository, on memory and SQLite."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    Guard,
    HistoryEvent,
    ResultRepository,
    RetryPolicy,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    UnitOfWork,
    UnreadableItem,
    Upsert,
)
from flowvault.application._runs import RUNS
from flowvault.application._state import (
    RESET_EVENT,
    STATE_NAMESPACE,
    STATE_WRITTEN_EVENT,
    cold_fingerprint,
    reset_progress,
)
from flowvault.application.testing import FrozenClock
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    NotFound,
    RevisionConflict,
    SchemaTooNew,
    WorkflowResult,
    WorkflowState,
)
from flowvault.domain._canonical import canonical_json
from flowvault.domain._envelope import Sensitivity
from flowvault.domain._fingerprint import Readability

MARKER = "state-marker-7d1e-do-not-leak"
KEY = bytes(range(32))


class Counter(BaseModel):
    """A host's typed state document."""

    model_config = ConfigDict(frozen=True)
    count: int = 0
    note: str = ""


DECIDER_TAG = "flowvault.decider/1"
"""The keyed digest an approval's decider gets; a reset's actor gets the same."""


class World:
    """Repositories over one store, with a clock the test controls."""

    def __init__(self, store: SecureObjectStore, path: Path | None = None) -> None:
        self.store = store
        self.path = path
        self.clock = FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)
        self.runs = ResultRepository(self.repository)

    def state(self, scope: str = "main") -> StateRepository[Counter]:
        return StateRepository(self.repository, scope, model=Counter)


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


class CrashOnDelete:
    """A store that dies (raises) on the first unit of work holding a delete: an injected fault."""

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def commit(self, unit: UnitOfWork) -> None:
        if unit.deletes:
            raise RuntimeError("injected crash between the reset event and the delete")
        self._inner.commit(unit)


# -- load, save, update -----------------------------------------------------------


def test_absent_state_loads_as_default(world: World) -> None:
    """Loading a scope never written returns the model's default and no revision."""
    snapshot = world.state().load()
    assert snapshot.state == Counter()
    assert snapshot.revision is None


def test_save_then_load_returns_state_and_revision(world: World) -> None:
    """A saved state loads back with the exact revision written."""
    assert world.state().save(Counter(count=4)) == 1
    assert world.state().save(Counter(count=5)) == 2
    snapshot = world.state().load()
    assert (snapshot.state, snapshot.revision) == (Counter(count=5), 2)


def test_default_model_keeps_any_json_fields(world: World) -> None:
    """Without a model the state is a WorkflowState holding whatever fields were saved."""
    state = StateRepository(world.repository, "plain")
    state.save(WorkflowState(step=3, items=["a", "b"]))
    loaded = state.load().state
    assert loaded.model_dump() == {"step": 3, "items": ["a", "b"]}


def test_scopes_are_isolated(world: World) -> None:
    """Two scopes hold independent states."""
    world.state("a").save(Counter(count=1))
    world.state("b").save(Counter(count=2))
    assert world.state("a").load().state.count == 1
    assert world.state("b").load().state.count == 2


@pytest.mark.parametrize("scope", ["", "has space", "x" * 65, "../up", "-lead"])
def test_malformed_scope_is_invalid_input(world: World, scope: str) -> None:
    """Scopes outside the documented grammar are refused."""
    with pytest.raises(InvalidInput):
        StateRepository(world.repository, scope)


def test_concurrent_updates_lose_nothing(world: World) -> None:
    """Four threads doing 50 increments each end at exactly 200."""
    state = world.state()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        for _ in range(50):
            try:
                StateRepository(world.repository, "main", model=Counter, max_retries=1000).update(
                    lambda s: s.model_copy(update={"count": s.count + 1})
                )
            except BaseException as exc:  # surfaced in the main thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    snapshot = state.load()
    assert snapshot.state.count == 200
    assert snapshot.revision == 200


def test_max_retries_caps_the_re_runs_of_fn(world: World) -> None:
    """A function that always loses its race runs once and max_retries more times, then fails."""
    state = StateRepository(world.repository, "main", model=Counter, max_retries=3)
    rival = world.state()
    calls = []

    def fn(current: Counter) -> Counter:
        calls.append(current.count)
        rival.save(Counter(count=current.count + 100))
        return current.model_copy(update={"count": current.count + 1})

    with pytest.raises(RevisionConflict) as caught:
        state.update(fn)
    assert calls == [0, 100, 200, 300]
    assert caught.value.details["tries"] == 4
    assert caught.value.details["scope"] == "main"


class FakeTime:
    """A monotonic clock that only sleeping moves: the injected clock of a retry policy."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def policy(self, **options: float) -> RetryPolicy:
        return RetryPolicy(
            sleep=self.sleep,
            monotonic=lambda: self.now,
            jitter=lambda low, high: high,
            **options,  # type: ignore[arg-type]
        )


def test_a_lost_race_is_re_run_until_the_time_budget_is_spent(world: World) -> None:
    """No fixed count: fn re-runs after each jittered pause until the budget is gone, then fails."""
    clock = FakeTime()
    policy = clock.policy(time_budget=1.0, first_pause=0.01, longest_pause=0.1)
    state = StateRepository(world.repository, "main", model=Counter, retry=policy)
    rival = world.state()
    calls = []

    def fn(current: Counter) -> Counter:
        calls.append(current.count)
        rival.save(Counter(count=current.count + 1))
        return current

    with pytest.raises(RevisionConflict) as caught:
        state.update(fn)
    assert clock.sleeps[:5] == [0.01, 0.02, 0.04, 0.08, 0.1]
    assert max(clock.sleeps) == 0.1
    assert clock.now == pytest.approx(1.0)
    assert len(calls) == len(clock.sleeps) + 1 == 14
    assert caught.value.details == {"tries": 14, "milliseconds": 1000, "scope": "main"}
    assert "gave up after 14 tries in 1.0 s" in str(caught.value)


def test_the_default_policy_outlasts_a_long_run_of_lost_races(world: World) -> None:
    """Twenty lost races in a row, far past the old eight tries, and the update still lands."""
    state = StateRepository(world.repository, "main", model=Counter)
    rival = world.state()
    calls = []

    def fn(current: Counter) -> Counter:
        calls.append(current.count)
        if len(calls) <= 20:
            rival.save(Counter(count=current.count + 1))
        return current.model_copy(update={"note": "mine"})

    new, revision = state.update(fn)
    assert (new, revision) == (Counter(count=20, note="mine"), 21)
    assert state.load().state == new


@pytest.mark.parametrize(
    "options",
    [{"time_budget": -1.0}, {"first_pause": -0.1}, {"max_retries": -1}, {"max_retries": 1.5}],
)
def test_a_malformed_retry_policy_is_invalid_input(options: dict[str, float]) -> None:
    """Negative times and counts are refused when the policy is made, not when it is used."""
    with pytest.raises(InvalidInput):
        RetryPolicy(**options)  # type: ignore[arg-type]


@pytest.mark.postgres
def test_updates_queue_for_the_state_row_on_a_store_with_a_record_lock(
    postgres_server, pg_schema: str
) -> None:
    """An update waits while another holds the row's lock, then runs fn once, on what it left."""
    from flowvault.adapters.postgres import PostgresSecureObjectStore  # noqa: PLC0415

    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        world = World(store)
        calls: list[int] = []
        done = threading.Event()

        def increment(current: Counter) -> Counter:
            calls.append(current.count)
            return current.model_copy(update={"count": current.count + 1})

        def update() -> None:
            world.state().update(increment)
            done.set()

        digest = world.repository.key_digest(STATE_NAMESPACE, "main")
        with store.record_locked(STATE_NAMESPACE, digest):
            waiting = threading.Thread(target=update)
            waiting.start()
            assert not done.wait(0.5), "the update did not wait for the row's lock"
            world.state().save(Counter(count=10))
        waiting.join(10)
        assert done.is_set()
        assert calls == [10]
        assert world.state().load().state.count == 11


def test_update_with_writes_commits_siblings_atomically(world: World) -> None:
    """The state write and sibling writes land together."""
    state = world.state()

    def fn(current: Counter) -> tuple[Counter, list[Upsert]]:
        sibling = world.repository.prepare("catalogue", "index", {"n": 1}, expected=Guard.ABSENT)
        return current.model_copy(update={"count": 1}), [sibling]

    new, revision = state.update_with_writes(fn)
    assert (new.count, revision) == (1, 1)
    assert world.repository.read("catalogue", "index") is not None


def test_failing_sibling_guard_is_reported_at_once_and_rolls_back(world: World) -> None:
    """A stale sibling is its own conflict, raised on the first try; the state stays as it was."""
    state = world.state()
    state.save(Counter(count=7))
    before = state.load()
    calls = []

    def fn(current: Counter) -> tuple[Counter, list[Upsert]]:
        calls.append(current.count)
        stale = world.repository.prepare("catalogue", "index", {"n": 1}, expected=5)
        return current.model_copy(update={"count": 8}), [stale]

    with pytest.raises(RevisionConflict) as caught:
        state.update_with_writes(fn)
    assert calls == [7]
    assert caught.value.details == {
        "guard": "upsert",
        "namespace": "catalogue",
        "key_digest": world.repository.key_digest("catalogue", "index"),
        "expected": 5,
        "actual": None,
    }
    assert state.load() == before
    assert world.repository.read("catalogue", "index") is None


class SiblingsFirst:
    """A store that checks a unit's upserts last to first: the port promises no order."""

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def commit(self, unit: UnitOfWork) -> None:
        self._inner.commit(replace(unit, upserts=unit.upserts[::-1]))


@pytest.mark.parametrize("siblings_first", [False, True])
def test_a_sibling_guard_lost_with_the_state_is_a_lost_race(
    world: World, siblings_first: bool
) -> None:
    """A rival that moved the state and the sibling together makes fn re-run, not fail.

    Whichever guard the store reports, the state's or the sibling's, the
    state moved since the load, so it is a lost race.
    """
    store = SiblingsFirst(world.store) if siblings_first else world.store
    repository = SealedRepository(store, AesGcmCipher(KEY), world.clock)  # type: ignore[arg-type]
    state = StateRepository(repository, "main", model=Counter)
    rival = world.state()
    state.save(Counter(count=1))
    first = world.repository.prepare("catalogue", "index", {"n": 1}, expected=Guard.ABSENT)
    world.store.commit(UnitOfWork(upserts=[first]))
    calls = []

    def fn(current: Counter) -> tuple[Counter, list[Upsert]]:
        calls.append(current.count)
        sibling = world.repository.prepare(
            "catalogue", "index", {"n": current.count + 1}, expected=current.count
        )
        if len(calls) == 1:
            rival.update_with_writes(lambda now: (now.model_copy(update={"count": 2}), [sibling]))
            sibling = world.repository.prepare("catalogue", "index", {"n": 0}, expected=1)
        return current.model_copy(update={"count": current.count + 1}), [sibling]

    new, revision = state.update_with_writes(fn)
    assert calls == [1, 2]
    assert (new.count, revision) == (3, 3)
    stored = world.repository.read("catalogue", "index")
    assert stored is not None
    assert (stored.document, stored.revision) == ({"n": 3}, 3)


def test_update_with_events_appends_to_history(world: World) -> None:
    """Events from the function land in the scope's history with sanitised payloads."""
    state = world.state()

    def fn(current: Counter) -> tuple[Counter, list[HistoryEvent]]:
        events = [
            HistoryEvent("step.done", {"step": current.count, "password": "hunter2"}),
            HistoryEvent("note.added"),
        ]
        return current.model_copy(update={"count": current.count + 1}), events

    state.update_with_events(fn)
    state.update_with_events(fn)
    history = state.history()
    assert [e.type for e in history] == ["step.done", "note.added", STATE_WRITTEN_EVENT] * 2
    assert [e.index for e in history] == [0, 1, 2, 3, 4, 5]
    assert history[0].payload == {"step": 0, "password": "[REDACTED]"}
    assert history[3].payload == {"step": 1, "password": "[REDACTED]"}
    assert [history[2].payload, history[5].payload] == [{"revision": 1}, {"revision": 2}]


def test_to_write_lets_hosts_compose_units(world: World) -> None:
    """A prepared state write commits in a host's own unit of work, with its own guard."""
    state = world.state()
    unit = state.to_write(Counter(count=3), expected_revision=None)
    other = world.repository.prepare("host", "thing", {"ok": True}, expected=Guard.ABSENT)
    world.store.commit(UnitOfWork(upserts=[*unit.upserts, other], appends=unit.appends))
    assert state.load().revision == 1
    assert [e.type for e in state.history()] == [STATE_WRITTEN_EVENT]
    with pytest.raises(RevisionConflict):
        world.store.commit(state.to_write(Counter(), expected_revision=None))
    with pytest.raises(InvalidInput):
        state.to_write(WorkflowState(), expected_revision=1)  # type: ignore[arg-type]


def test_other_class_or_newer_schema_is_never_read_silently(world: World) -> None:
    """A state written under another class or a newer schema is a typed error on load."""
    StateRepository(
        world.repository, "main", model=Counter, sensitivity=Sensitivity.RESTRICTED
    ).save(Counter(count=1))
    with pytest.raises(IntegrityFailure):
        world.state().load()
    StateRepository(world.repository, "v2", model=Counter, schema_version=2).save(Counter())
    with pytest.raises(SchemaTooNew):
        world.state("v2").load()
    assert StateRepository(world.repository, "v2", model=Counter, schema_version=3).load()


# -- probe and fingerprint ----------------------------------------------------------


def test_fresh_state_is_readable(world: World) -> None:
    """A healthy, just-written state probes and fingerprints as readable."""
    world.state().save(Counter(count=1, note=MARKER))
    probe = world.state().probe()
    assert probe.readability is Readability.READABLE
    assert probe.state == Counter(count=1, note=MARKER)
    fingerprint = world.state().fingerprint()
    assert (fingerprint.readability, fingerprint.reason_class) == (Readability.READABLE, "readable")
    assert fingerprint.revision == 1
    assert fingerprint.payload_digest is not None
    assert MARKER not in canonical_json(fingerprint.model_dump(mode="json"))


def test_absent_state_fingerprints_as_absent(world: World) -> None:
    """A scope never written is absent, with empty metadata."""
    fingerprint = world.state().fingerprint()
    assert fingerprint == cold_fingerprint("main")
    assert fingerprint.key_digest is None


def _plant_unreadable(world: World) -> None:
    world.state().save(Counter(count=1))
    record = world.store.load(STATE_NAMESPACE, world.repository.key_digest(STATE_NAMESPACE, "main"))
    assert record is not None
    header = record.metadata.header.model_copy(update={"revision": 2})
    world.store.commit(
        UnitOfWork(upserts=[Upsert(header=header, payload=record.payload[:-4], expected=1)])
    )


def test_damaged_state_is_unreadable_and_reason_can_be_overridden(world: World) -> None:
    """A row that does not open probes as unreadable; a caller may name the reason."""
    _plant_unreadable(world)
    probe = world.state().probe()
    assert probe.readability is Readability.UNREADABLE
    assert probe.state is None
    assert probe.metadata is not None
    assert world.state().fingerprint().reason_class == "unreadable"
    assert world.state().fingerprint("decrypt_failed").reason_class == "decrypt_failed"
    with pytest.raises(InvalidInput):
        world.state().fingerprint("Not A Token")


# -- reset --------------------------------------------------------------------------


def test_reset_records_then_deletes_only_the_state(world: World) -> None:
    """Reset appends a fingerprinted event, deletes the state row, and leaves other rows alone."""
    world.state().save(Counter(count=1, note=MARKER))
    world.state("other").save(Counter(count=9))
    fingerprint = world.state().reset(actor="ops", source="test", reason_class="corrupt")
    assert fingerprint.readability is Readability.READABLE
    assert fingerprint.reason_class == "corrupt"
    assert world.state().load().revision is None
    assert world.state("other").load().state.count == 9
    written, event = world.state().history()
    assert (written.type, event.type) == (STATE_WRITTEN_EVENT, RESET_EVENT)
    assert isinstance(event.payload, dict)
    assert event.payload["actor"] == world.repository.keyed_digest(DECIDER_TAG, "ops")
    assert event.payload["source"] == "test"
    assert event.payload["fingerprint"] == fingerprint.model_dump(mode="json")
    assert MARKER not in canonical_json(event.payload)


def test_reset_of_absent_state_succeeds_and_says_so(world: World) -> None:
    """Resetting a scope with no state records an event that says it was absent."""
    fingerprint = world.state().reset(actor="ops", source="test")
    assert fingerprint.readability is Readability.ABSENT
    (event,) = world.state().history()
    assert event.payload["fingerprint"]["readability"] == "absent"  # type: ignore[index,call-overload]


def test_reset_removes_an_unreadable_state(world: World) -> None:
    """The recovery path works exactly when the state cannot be read."""
    _plant_unreadable(world)
    fingerprint = world.state().reset(actor="ops", source="test")
    assert fingerprint.readability is Readability.UNREADABLE
    assert world.state().probe().readability is Readability.ABSENT


class RivalBeforeAppends:
    """A store where a rival appends to the history just before the next append-only units."""

    def __init__(self, inner: SecureObjectStore, rival: Callable[[], object], times: int) -> None:
        self._inner = inner
        self._rival = rival
        self.times = times

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def commit(self, unit: UnitOfWork) -> None:
        if unit.appends and not unit.upserts and self.times > 0:
            self.times -= 1
            self._rival()
        self._inner.commit(unit)


@pytest.mark.parametrize(("races", "lands"), [(2, True), (3, False)])
def test_a_reset_retries_its_history_append_under_the_policy(
    world: World, races: int, lands: bool
) -> None:
    """Each race lost to another writer of the history is re-run, up to the policy's max_retries."""
    raced = RivalBeforeAppends(
        world.store, lambda: world.state().reset(actor="rival", source="rival"), races
    )
    repository = SealedRepository(raced, AesGcmCipher(KEY), world.clock)  # type: ignore[arg-type]
    state = StateRepository(
        repository, "main", model=Counter, retry=FakeTime().policy(max_retries=2)
    )
    if lands:
        state.reset(actor="ops", source="ours")
    else:
        with pytest.raises(RevisionConflict) as caught:
            state.reset(actor="ops", source="ours")
        assert caught.value.details["tries"] == 3
    history = world.state().history()
    sources = [event.payload["source"] for event in history if isinstance(event.payload, dict)]
    assert sources == ["rival"] * races + (["ours"] if lands else [])


def test_crash_between_event_and_delete_is_recoverable(world: World) -> None:
    """A fault after the event keeps event and state; a second reset completes."""
    world.state().save(Counter(count=1))
    crashing = SealedRepository(CrashOnDelete(world.store), AesGcmCipher(KEY), world.clock)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="injected crash"):
        StateRepository(crashing, "main", model=Counter).reset(actor="ops", source="test")
    assert [e.type for e in world.state().history()] == [STATE_WRITTEN_EVENT, RESET_EVENT]
    assert world.state().load().state.count == 1
    world.state().reset(actor="ops", source="retry")
    assert [e.type for e in world.state().history()] == [
        STATE_WRITTEN_EVENT,
        RESET_EVENT,
        RESET_EVENT,
    ]
    assert world.state().load().revision is None


def test_reset_progress_dry_run_and_cold_root(world: World) -> None:
    """The verb's use case: dry runs delete nothing; a cold root reports absent."""
    world.state().save(Counter(count=2))
    dry = reset_progress(world.state(), "main", actor="ops", source="t", dry_run=True)
    assert (dry.applied, dry.cold_root) == (False, False)
    assert world.state().load().revision == 1
    assert [e.type for e in world.state().history()] == [STATE_WRITTEN_EVENT]
    cold = reset_progress(None, "main", actor="ops", source="t")
    assert cold.cold_root
    assert cold.fingerprint.readability is Readability.ABSENT
    done = reset_progress(world.state(), "main", actor="ops", source="t")
    assert done.applied
    assert world.state().load().revision is None


# -- runs ---------------------------------------------------------------------------

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _run(run_id: str, finished: datetime = T0, **extra: object) -> WorkflowResult:
    return WorkflowResult.model_validate(
        {
            "run_id": run_id,
            "status": "completed",
            "started_at": finished - timedelta(minutes=5),
            "finished_at": finished,
            "output": {"note": MARKER},
            **extra,
        }
    )


def test_run_round_trip(world: World) -> None:
    """A saved run loads back equal; saving it again replaces it."""
    run = _run("run-001")
    world.runs.save(run)
    assert world.runs.load("run-001") == run
    failed = _run("run-001", status="failed", error_code="TIMEOUT")
    world.runs.save(failed)
    assert world.runs.load("run-001") == failed


@pytest.mark.parametrize(
    "run_id", ["", "ab", "-run", "run/1", "run..1", "r" * 129, "run 1", "ü-run"]
)
def test_run_id_grammar_is_enforced(world: World, run_id: str) -> None:
    """Run ids outside the documented grammar are INVALID_INPUT for load."""
    with pytest.raises(InvalidInput):
        world.runs.load(run_id)


def test_missing_run_is_not_found(world: World) -> None:
    """Loading a run never saved is NOT_FOUND."""
    with pytest.raises(NotFound):
        world.runs.load("run-404")


def test_run_resealed_under_another_id_is_rejected(world: World) -> None:
    """A valid run B sealed under A's key is refused by load, and reported apart by list."""
    world.runs.save(_run("run-ccc"))
    forged = world.repository.prepare(
        RUNS, "run-aaa", _run("run-bbb").model_dump(mode="json"), expected=Guard.ABSENT
    )
    world.store.commit(UnitOfWork(upserts=[forged]))
    with pytest.raises(IntegrityFailure):
        world.runs.load("run-aaa")
    listed = world.runs.list()
    assert [run.run_id for run in listed.items] == ["run-ccc"]
    assert listed.unreadable == (UnreadableItem(forged.metadata.key_digest, "INTEGRITY_FAILURE"),)


def test_runs_list_newest_first_with_since_and_pages(world: World) -> None:
    """Runs come newest first, filtered by finish date, in pages."""
    for n in range(5):
        world.clock.advance(timedelta(minutes=1))
        world.runs.save(_run(f"run-{n:03d}", finished=T0 + timedelta(days=n)))
    page = world.runs.list(limit=2)
    assert [r.run_id for r in page.items] == ["run-004", "run-003"]
    rest = world.runs.list(cursor=page.next_cursor, limit=10)
    assert [r.run_id for r in rest.items] == ["run-002", "run-001", "run-000"]
    since = world.runs.list(since=date(2026, 3, 3))
    assert [r.run_id for r in since.items] == ["run-004", "run-003", "run-002"]
    with pytest.raises(InvalidInput):
        world.runs.list(since=datetime(2026, 3, 3))


def test_run_copied_to_another_id_on_disk_is_rejected(tmp_path: Path) -> None:
    """A run row copied with raw SQL under run B's key digest does not load as B."""
    path = tmp_path / "data" / "store.db"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        world = World(store, path)
        world.runs.save(_run("run-aaa"))
        source, target = (world.repository.key_digest(RUNS, r) for r in ("run-aaa", "run-bbb"))
        with sqlite3.connect(path) as raw:
            columns = [row[1] for row in raw.execute("PRAGMA table_info(records)")]
            copied = [c for c in columns if c != "id"]
            select = ", ".join("?" if c == "key_digest" else c for c in copied)
            raw.execute(
                f"INSERT INTO records ({', '.join(copied)}) SELECT {select} FROM records "  # noqa: S608
                "WHERE key_digest = ?",
                (target, source),
            )
        with pytest.raises(IntegrityFailure):
            world.runs.load("run-bbb")
        assert world.runs.load("run-aaa").run_id == "run-aaa"


def test_runs_write_no_plaintext_files(tmp_path: Path) -> None:
    """Saving runs on SQLite leaves only the database files behind, none holding plaintext."""
    path = tmp_path / "data" / "store.db"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        World(store, path).runs.save(_run("run-001"))
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["store.db"]
    assert MARKER.encode() not in path.read_bytes()


def test_conflict_pauses_grow_and_stay_capped() -> None:
    """Lost races wait a random pause under a doubling ceiling that never passes 50 ms."""
    ceilings: list[float] = []
    policy = RetryPolicy(jitter=lambda low, high: ceilings.append(high) or low)
    assert [policy.pause(lost) for lost in range(1, 10)] == [0.0] * 9
    assert ceilings[:4] == [0.0005, 0.001, 0.002, 0.004]
    assert max(ceilings) == 0.05
    assert policy.pause(5000) == 0.0, "a long contended run keeps the cap, never overflows"
    assert ceilings[-1] == 0.05


def test_the_reset_actor_is_recorded_as_a_keyed_digest_only(world: World) -> None:
    """A reset event names its actor by a decider's keyed digest: one per person, none in clear."""
    actor = "ops-person@example.org"
    world.state().save(Counter(count=1))
    world.state().reset(actor=actor, source="test")
    world.state().save(Counter(count=2))
    world.state().reset(actor=actor, source="test")
    world.state().reset(actor="someone-else", source="test")
    resets = [event for event in world.state().history() if event.type == RESET_EVENT]
    digests = [event.payload["actor"] for event in resets if isinstance(event.payload, dict)]
    expected = world.repository.keyed_digest(DECIDER_TAG, actor)
    assert digests[:2] == [expected, expected]
    assert digests[2] == world.repository.keyed_digest(DECIDER_TAG, "someone-else") != expected
    for event in resets:
        assert actor not in canonical_json(event.payload)
        assert "someone-else" not in canonical_json(event.payload)
