"""Run ownership: leases, their renewal, recovery of expired ones and fencing of the host that lost.

Two hosts share one store, each with its own run service and host id; the
lease scenarios run on the memory adapter and a real SQLite file under one
clock the test moves. On PostgreSQL leases follow the server's clock, which
the last tests prove with host clocks set far apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    DefinitionRegistry,
    LeaseKeeper,
    RunService,
    SealedRepository,
    SecureObjectStore,
    StoreCapabilities,
    TerminalReceipts,
    UnitOfWork,
)
from flowvault.application._graph_namespaces import GRAPH_RUN_RECEIPTS, GRAPH_RUNS
from flowvault.application._streams import read_stream, run_stream
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.composition import Settings, bootstrap
from flowvault.domain import (
    GraphRun,
    IntegrityFailure,
    InvalidInput,
    InvalidTransition,
    LedgerEvent,
    RevisionConflict,
    RunFenced,
)

KEY = bytes(range(32))
LEASE = timedelta(seconds=30)


class Hosts:
    """Hosts ``a`` and ``b`` over one store and one clock, plus an unowned service."""

    def __init__(self, store: SecureObjectStore, clock: FrozenClock | None = None) -> None:
        self.store = store
        self.clock = clock or FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)
        DefinitionRegistry(self.repository, self.clock).register_definition("triage", {"n": 1})
        self.a = self.host("host-a", self.repository)
        self.b = self.host("host-b", self.repository)

    def host(
        self,
        host_id: str | None,
        repository: SealedRepository,
        clock: FrozenClock | None = None,
    ) -> RunService:
        at = clock or self.clock
        return RunService(
            repository,
            at,
            SequentialIds(f"run-{(host_id or 'x')[-1]}"),
            definitions=DefinitionRegistry(repository, at),
            receipts=TerminalReceipts(repository, repository),
            host_id=host_id,
            lease=LEASE,
        )

    def start(self, service: RunService, *, running: bool = True) -> str:
        run_id = service.start_run("triage", {"ask": 1})[0].run_id
        if running:
            service.set_status(run_id, "running", expected_status="accepted")
        return run_id

    def events(self, run_id: str) -> list[LedgerEvent]:
        return list(read_stream(self.store, run_stream(run_id)))

    def visible(self, run_id: str) -> tuple[object, ...]:
        """Everything a refused write must leave as it was."""
        pages = tuple(
            self.store.list(space, limit=200) for space in (GRAPH_RUNS, GRAPH_RUN_RECEIPTS)
        )
        return (*pages, tuple(self.events(run_id)))


@pytest.fixture(params=["memory", "sqlite"])
def hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hosts]:
    """Provide two hosts over a fresh store on each backend whose clock the test owns."""
    store: SecureObjectStore
    if request.param == "memory":
        store = InMemorySecureObjectStore()
    else:
        store = SQLiteSecureObjectStore.open(tmp_path / "data" / "store.db", create=True)
    try:
        yield Hosts(store)
    finally:
        store.close()


def test_a_run_is_owned_by_its_host_under_a_lease(hosts: Hosts) -> None:
    """Starting and running hold a lease from the host's clock; pausing and ending release it."""
    run_id = hosts.start(hosts.a, running=False)
    run = hosts.a.get_run(run_id)
    assert (run.owner, run.lease_expires_at) == ("host-a", hosts.clock.now() + LEASE)
    hosts.clock.advance(timedelta(seconds=7))
    hosts.a.set_status(run_id, "running", expected_status="accepted")
    assert hosts.a.get_run(run_id).lease_expires_at == hosts.clock.now() + LEASE
    hosts.a.set_status(run_id, "awaiting_approval", expected_status="running")
    paused = hosts.a.get_run(run_id)
    assert (paused.owner, paused.lease_expires_at) == (None, None)
    hosts.b.set_status(run_id, "running", expected_status="awaiting_approval")
    assert hosts.b.get_run(run_id).owner == "host-b"
    hosts.b.finish_run(run_id, "completed", expected_status="running", final_state=None)
    ended = hosts.b.get_run(run_id)
    assert (ended.owner, ended.lease_expires_at) == (None, None)


def test_a_live_lease_is_not_recovered(hosts: Hosts) -> None:
    """Another host's recovery leaves accepted and running runs whose lease is live alone."""
    accepted, running = hosts.start(hosts.a, running=False), hosts.start(hosts.a)
    hosts.clock.advance(LEASE - timedelta(microseconds=1))
    assert hosts.b.recover_incomplete_runs() == 0
    assert hosts.a.get_run(accepted).status == "accepted"
    hosts.a.finish_run(running, "completed", expected_status="running", final_state=None)
    assert hosts.a.get_run(running).status == "completed"


def test_an_expired_lease_is_taken_over_and_names_its_previous_owner(hosts: Hosts) -> None:
    """Past its lease a run ends interrupted, owned by the recovering host, naming A by digest."""
    accepted, running = hosts.start(hosts.a, running=False), hosts.start(hosts.a)
    paused = hosts.start(hosts.a)
    hosts.a.set_status(paused, "checkpointed", expected_status="running")
    hosts.clock.advance(LEASE)
    assert hosts.b.recover_incomplete_runs() == 2
    for run_id in (accepted, running):
        run = hosts.b.get_run(run_id)
        assert (run.status, run.owner, run.lease_expires_at) == (
            "interrupted_non_resumable",
            "host-b",
            None,
        )
        ended = hosts.events(run_id)[-1]
        assert ended.type == "run.interrupted_non_resumable"
        assert isinstance(ended.payload, dict)
        assert ended.payload["detail"] == {
            "reason": "lease_expired",
            "previous_owner": hosts.b.owner_digest("host-a"),
        }
        assert "host-a" not in str(ended.payload)
    assert hosts.a.get_run(paused).status == "checkpointed"
    assert hosts.b.recover_incomplete_runs() == 0


def test_the_host_that_lost_its_run_is_fenced_and_changes_nothing(hosts: Hosts) -> None:
    """Every write A tries on a run B took over is RUN_FENCED and leaves the store as it was."""
    run_id = hosts.start(hosts.a)
    hosts.clock.advance(LEASE)
    assert hosts.b.recover_incomplete_runs() == 1
    before = hosts.visible(run_id)
    writes: list[Callable[[], object]] = [
        lambda: hosts.a.finish_run(run_id, "completed", expected_status="running", final_state=1),
        lambda: hosts.a.set_status(run_id, "checkpointed", expected_status="running"),
        lambda: hosts.a.append_run_events(run_id, [("node.done", {"n": 1})]),
        lambda: hosts.a.renew_lease(run_id),
    ]
    for write in writes:
        with pytest.raises(RunFenced) as refused:
            write()
        assert refused.value.code == "RUN_FENCED"
        assert isinstance(refused.value, RevisionConflict)
        assert "host-a" not in str(refused.value.details)
        assert hosts.visible(run_id) == before


def test_a_live_run_of_another_host_is_fenced_but_an_accepted_one_can_be_claimed(
    hosts: Hosts,
) -> None:
    """Only the owner writes a running run; moving an accepted run to running hands it over."""
    running = hosts.start(hosts.a)
    before = hosts.visible(running)
    with pytest.raises(RunFenced):
        hosts.b.append_run_events(running, [("node.done", {})])
    with pytest.raises(RunFenced):
        hosts.b.set_status(running, "cancelled", expected_status="running")
    assert hosts.visible(running) == before
    accepted = hosts.start(hosts.a, running=False)
    hosts.b.set_status(accepted, "running", expected_status="accepted")
    assert hosts.b.get_run(accepted).owner == "host-b"
    with pytest.raises(RunFenced):
        hosts.a.set_status(accepted, "cancelled", expected_status="accepted")


def test_a_commit_that_loses_to_a_takeover_is_fenced(hosts: Hosts) -> None:
    """A unit built before B's takeover and committed after it is refused, never merged."""
    run_id = hosts.start(hosts.a)
    hosts.clock.advance(LEASE)
    racing = InterleavingStore(hosts.store, hosts.b.recover_incomplete_runs)
    late = hosts.host("host-a", SealedRepository(racing, AesGcmCipher(KEY), hosts.clock))  # type: ignore[arg-type]
    with pytest.raises(RunFenced):
        late.finish_run(run_id, "completed", expected_status="running", final_state=None)
    assert racing.interleaved
    run = hosts.a.get_run(run_id)
    assert (run.status, run.owner) == ("interrupted_non_resumable", "host-b")
    assert hosts.events(run_id)[-1].type == "run.interrupted_non_resumable"


def test_renewal_moves_the_expiry_so_the_run_is_not_taken_over(hosts: Hosts) -> None:
    """``renew_lease`` sets the expiry one lease from now, with an event; recovery then waits."""
    run_id = hosts.start(hosts.a)
    hosts.clock.advance(LEASE - timedelta(seconds=1))
    renewed = hosts.a.renew_lease(run_id)
    assert renewed.lease_expires_at == hosts.clock.now() + LEASE
    assert hosts.a.get_run(run_id) == renewed
    assert hosts.events(run_id)[-1].type == "run.lease_renewed"
    hosts.clock.advance(timedelta(seconds=2))
    assert hosts.b.recover_incomplete_runs() == 0
    hosts.clock.advance(LEASE)
    assert hosts.b.recover_incomplete_runs() == 1


def test_appending_renews_once_half_the_lease_is_gone(hosts: Hosts) -> None:
    """An append early in the lease writes only its events; past half the lease it renews too."""
    run_id = hosts.start(hosts.a)
    first = hosts.a.get_run(run_id)
    hosts.clock.advance(LEASE / 2 - timedelta(seconds=1))
    appended = hosts.a.append_run_events(run_id, [("node.done", {"n": 1})])
    assert [event.type for event in appended] == ["node.done"]
    assert hosts.a.get_run(run_id) == first
    hosts.clock.advance(timedelta(seconds=2))
    appended = hosts.a.append_run_events(run_id, [("node.done", {"n": 2})])
    assert [event.type for event in appended] == ["node.done"]
    assert [event.type for event in hosts.events(run_id)[-2:]] == ["node.done", "run.lease_renewed"]
    assert hosts.a.get_run(run_id).lease_expires_at == hosts.clock.now() + LEASE


def test_renew_leases_renews_this_hosts_leased_runs_only(hosts: Hosts) -> None:
    """A keeper's ``renew_leases`` renews A's accepted and running runs, not B's or paused ones."""
    mine = [hosts.start(hosts.a, running=False), hosts.start(hosts.a)]
    paused = hosts.start(hosts.a)
    hosts.a.set_status(paused, "checkpointed", expected_status="running")
    theirs = hosts.start(hosts.b)
    hosts.clock.advance(timedelta(seconds=20))
    assert hosts.a.renew_leases() == 2
    for run_id in mine:
        assert hosts.a.get_run(run_id).lease_expires_at == hosts.clock.now() + LEASE
    hosts.clock.advance(timedelta(seconds=20))
    assert hosts.a.recover_incomplete_runs() == 1
    assert hosts.a.get_run(theirs).status == "interrupted_non_resumable"
    assert {hosts.a.get_run(run_id).status for run_id in mine} == {"accepted", "running"}


def test_renewing_what_holds_no_lease_is_refused(hosts: Hosts) -> None:
    """Paused runs, other hosts' runs and a service without a host id cannot renew."""
    run_id = hosts.start(hosts.a)
    hosts.a.set_status(run_id, "checkpointed", expected_status="running")
    with pytest.raises(RunFenced):
        hosts.b.renew_lease(hosts.start(hosts.a))
    unowned = hosts.host(None, hosts.repository)
    for call in (lambda: unowned.renew_lease(run_id), unowned.renew_leases):
        with pytest.raises(InvalidInput):
            call()
    with pytest.raises(InvalidTransition):
        hosts.a.renew_lease(run_id)
    hosts.a.set_status(run_id, "running", expected_status="checkpointed")
    hosts.a.set_status(run_id, "awaiting_approval", expected_status="running")
    with pytest.raises(InvalidTransition):
        hosts.b.renew_lease(run_id)


def test_a_restart_under_a_fixed_host_id_lets_the_old_leases_lapse(hosts: Hosts) -> None:
    """A second service with A's id renews only what it took; A's old run is recovered."""
    left = hosts.start(hosts.a)
    restarted = RunService(
        hosts.repository,
        hosts.clock,
        SequentialIds("run-restarted"),
        definitions=DefinitionRegistry(hosts.repository, hosts.clock),
        receipts=TerminalReceipts(hosts.repository, hosts.repository),
        host_id="host-a",
        lease=LEASE,
    )
    taken = hosts.start(restarted)
    hosts.clock.advance(timedelta(seconds=20))
    assert restarted.renew_leases() == 1
    assert restarted.get_run(left).lease_expires_at == hosts.clock.now() + timedelta(seconds=10)
    hosts.clock.advance(timedelta(seconds=20))
    assert hosts.b.recover_incomplete_runs() == 1
    assert hosts.b.get_run(left).status == "interrupted_non_resumable"
    assert hosts.b.get_run(taken).status == "running"
    with pytest.raises(RunFenced):
        hosts.a.set_status(left, "failed", expected_status="running")
    assert hosts.a.renew_leases() == 0, "the lost run is dropped from what A keeps"


def test_one_run_failing_to_renew_does_not_stop_the_others(hosts: Hosts) -> None:
    """A run whose record fails verification is raised after every other lease is renewed."""
    broken, kept = hosts.start(hosts.a), hosts.start(hosts.a)
    hosts.clock.advance(timedelta(seconds=20))
    real = hosts.a.renew_lease

    def renew(run_id: str) -> GraphRun:
        if run_id == broken:
            raise IntegrityFailure("injected: the run record fails verification")
        return real(run_id)

    hosts.a.renew_lease = renew  # type: ignore[method-assign]
    for _ in range(2):
        with pytest.raises(IntegrityFailure):
            hosts.a.renew_leases()
        assert hosts.a.get_run(kept).lease_expires_at == hosts.clock.now() + LEASE
        hosts.clock.advance(timedelta(seconds=5))


def test_runs_written_without_an_owner_are_recovered_at_once(hosts: Hosts) -> None:
    """A service without a host id writes unowned runs, which hold no lease, as before leases."""
    unowned = hosts.host(None, hosts.repository)
    run_id = hosts.start(unowned)
    assert hosts.b.recover_incomplete_runs() == 1
    assert hosts.b.get_run(run_id).owner == "host-b"


def test_records_from_before_leases_load_unowned_and_expired() -> None:
    """A run record without owner and lease fields reads as no owner and no live lease."""
    old = {
        "run_id": "run-1",
        "definition_id": "triage",
        "definition_version": "sha256:" + "0" * 64,
        "status": "running",
        "started_at": "2026-01-01T00:00:00Z",
        "revision": 2,
    }
    run = GraphRun.model_validate(old)
    assert (run.owner, run.lease_expires_at) == (None, None)
    assert not run.lease_live(datetime(2020, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    "options",
    [
        {"host_id": ""},
        {"host_id": "-x"},
        {"host_id": "a b"},
        {"host_id": 7},
        {"lease": timedelta(0)},
        {"lease": timedelta(hours=2)},
        {"lease": 30},
    ],
)
def test_a_bad_host_id_or_lease_is_refused(options: dict[str, object]) -> None:
    """Host ids are short printable names; leases last from a second to an hour."""
    repository = SealedRepository(InMemorySecureObjectStore(), AesGcmCipher(KEY), FrozenClock())
    with pytest.raises(InvalidInput):
        RunService(
            repository,
            FrozenClock(),
            SequentialIds(),
            definitions=DefinitionRegistry(repository, FrozenClock()),
            receipts=TerminalReceipts(repository, repository),
            **options,  # type: ignore[arg-type]
        )


def test_settings_bound_the_lease_and_each_runtime_draws_its_own_host_id(tmp_path: Path) -> None:
    """FLOWVAULT_RUN_LEASE is 1-3600 s (30 by default); unset host ids differ per runtime."""
    home = {"FLOWVAULT_HOME": str(tmp_path)}
    assert Settings.from_env(home).run_lease == 30
    for refused in (
        {"FLOWVAULT_RUN_LEASE": "0.5"},
        {"FLOWVAULT_RUN_LEASE": "3601"},
        {"FLOWVAULT_HOST_ID": "a b"},
        {"FLOWVAULT_HOST_ID": "-a"},
    ):
        with pytest.raises(InvalidInput):
            Settings.from_env({**home, **refused})
    with bootstrap(Settings(backend="memory")) as one, bootstrap(Settings(backend="memory")) as two:
        assert one.runs.host_id != two.runs.host_id
        assert str(one.runs.host_id).split("-")[-2] == str(os.getpid())
    clock = FrozenClock()
    fixed = Settings.from_env(
        {**home, "FLOWVAULT_BACKEND": "memory", "FLOWVAULT_HOST_ID": "worker-7",
         "FLOWVAULT_RUN_LEASE": "5"}
    )  # fmt: skip
    with bootstrap(fixed, clock=clock) as runtime:
        runtime.definitions.register_definition("triage", {"n": 1})
        run = runtime.runs.start_run("triage", None)[0]
    assert (run.owner, run.lease_expires_at) == ("worker-7", clock.now() + timedelta(seconds=5))


def _eventually(done: Callable[[], bool]) -> None:
    """Wait for a background thread's effect; the bound is reached only on a failure."""
    for _ in range(2000):
        if done():
            return
        time.sleep(0.01)
    raise AssertionError("the keeper never did it")


def test_a_lease_keeper_renews_this_hosts_leases_until_stopped(hosts: Hosts) -> None:
    """The keeper's thread renews A's leases, not B's; after ``stop`` it is gone."""
    mine, theirs = hosts.start(hosts.a), hosts.start(hosts.b)
    hosts.clock.advance(timedelta(seconds=20))
    renewed = hosts.clock.now() + LEASE
    with LeaseKeeper(hosts.a, 0.01) as keeper:
        _eventually(lambda: hosts.a.get_run(mine).lease_expires_at == renewed)
        assert keeper.running
    assert not keeper.running
    passes = keeper.passes
    assert passes >= 1
    assert hosts.b.get_run(theirs).lease_expires_at == renewed - timedelta(seconds=20)


def test_a_lease_keeper_outlives_a_failed_pass_and_refuses_bad_set_up(tmp_path: Path) -> None:
    """A pass on a closed store is logged and the next one runs; no host or interval is refused."""
    store = SQLiteSecureObjectStore.open(tmp_path / "data" / "store.db", create=True)
    hosts = Hosts(store)
    hosts.start(hosts.a)
    store.close()
    keeper = LeaseKeeper(hosts.a, 0.01).start()
    try:
        _eventually(lambda: keeper.passes >= 2)
        assert keeper.running
    finally:
        keeper.stop()
    assert not keeper.running
    with pytest.raises(InvalidInput):
        LeaseKeeper(hosts.host(None, hosts.repository), 1)
    for interval in (0, -1, True, "1"):
        with pytest.raises(InvalidInput):
            LeaseKeeper(hosts.a, interval)  # type: ignore[arg-type]


def test_the_runtime_keeper_renews_every_third_of_the_lease() -> None:
    """``Runtime.lease_keeper()`` keeps the runtime's own runs, by default a third of the lease."""
    clock = FrozenClock()
    settings = Settings(backend="memory", host_id="worker-9", run_lease=3)
    with bootstrap(settings, clock=clock) as runtime:
        runtime.definitions.register_definition("triage", {"n": 1})
        run_id = runtime.runs.start_run("triage", None)[0].run_id
        clock.advance(timedelta(seconds=2))
        keeper = runtime.lease_keeper(0.01)
        with keeper:
            _eventually(
                lambda: (
                    runtime.runs.get_run(run_id).lease_expires_at
                    == clock.now() + timedelta(seconds=3)
                )
            )
        assert not keeper.running


# -- PostgreSQL: the server's clock ------------------------------------------------


@pytest.mark.postgres
def test_postgres_judges_leases_by_the_server_clock(postgres_server: Any, pg_schema: str) -> None:
    """Hosts whose own clocks are a day apart, behind and ahead, agree the lease is live."""
    from flowvault.adapters.postgres import PostgresSecureObjectStore  # noqa: PLC0415

    store = PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, pool_size=2, create=True
    )
    try:
        assert StoreCapabilities.of(store).clock is store
        behind = FrozenClock(datetime.now(UTC) - timedelta(days=1))
        ahead = FrozenClock(datetime.now(UTC) + timedelta(days=1))
        world = Hosts(store, behind)
        run_id = world.start(world.a)
        lease_end = world.a.get_run(run_id).lease_expires_at
        assert lease_end is not None
        assert lease_end > behind.now() + LEASE
        late = world.host("host-b", SealedRepository(store, AesGcmCipher(KEY), ahead), ahead)
        assert late.recover_incomplete_runs() == 0
        assert late.get_run(run_id).status == "running"
    finally:
        store.close()


class InterleavingStore:
    """A store that runs ``before`` ahead of its first commit: another host's write lands first."""

    def __init__(self, store: SecureObjectStore, before: Callable[[], object]) -> None:
        self._store = store
        self._before = before
        self.interleaved = False

    def commit(self, unit: UnitOfWork) -> None:
        if not self.interleaved:
            self.interleaved = True
            self._before()
        self._store.commit(unit)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)
