"""The async runtime: a twin of every service method, run off the event loop, sharing one store.

Each test drives its coroutines with ``asyncio.run`` on real stores: a
SQLite file, and the PostgreSQL server in a throwaway schema.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import Guard, SecureObjectStore, Upsert
from flowvault.composition import AsyncRuntime, Runtime, Settings, async_bootstrap, bootstrap
from flowvault.domain import RevisionConflict, StoreUnavailable, WorkflowState

KEY = secrets.token_bytes(32)
PORTS = {"settings", "store", "cipher", "repository", "clock", "ids", "mark"}
"""``Runtime`` fields that are wired ports, not services: reached through ``AsyncRuntime.sync``."""
CONCURRENT = 100

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _settings(backend: str, home: Path, request: pytest.FixtureRequest) -> Settings:
    if backend == "sqlite":
        return Settings(backend="sqlite", home=home)
    schema = request.getfixturevalue("pg_schema")
    dsn = request.getfixturevalue("postgres_server").dsn
    return Settings.model_validate(
        {"backend": "postgres", "home": home, "postgres_dsn": dsn, "postgres_schema": schema}
    )


@pytest.fixture(params=BACKENDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Provide the settings of a fresh store on each durable backend."""
    return _settings(request.param, tmp_path / "home", request)


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_")
        and callable(value)
        and not isinstance(inspect.getattr_static(cls, name), (property, staticmethod, classmethod))
    }


def _pairs(runtime: Runtime, aruntime: AsyncRuntime) -> Iterator[tuple[str, object, object]]:
    """Every service of ``runtime`` with its twin: fields, properties and factories alike."""
    for field in dataclasses.fields(runtime):
        if field.name not in PORTS:
            yield field.name, getattr(runtime, field.name), getattr(aruntime, field.name)
    yield "approval_flow", runtime.approval_flow, aruntime.approval_flow
    yield "state()", runtime.state("s"), aruntime.state("s")
    yield "stream()", runtime.stream("s"), aruntime.stream("s")
    yield "audit()", runtime.audit(), aruntime.audit()
    yield "retention()", runtime.retention(), aruntime.retention()
    yield "lease_keeper()", runtime.lease_keeper(), aruntime.lease_keeper()


def test_every_service_method_has_an_awaitable_twin_with_its_signature() -> None:
    """A new sync method, service or runtime member without a twin fails here."""
    runtime = bootstrap(Settings(backend="memory"), key=KEY)
    aruntime = AsyncRuntime.wrap(runtime)
    try:
        checked = 0
        for where, service, twin in _pairs(runtime, aruntime):
            assert getattr(twin, "sync", None) is service or where.endswith("()") or (
                where == "approval_flow"
            ), where
            for name in sorted(_public_methods(type(service))):
                method = getattr(twin, name, None)
                assert method is not None, f"{where}.{name} has no async twin"
                assert inspect.iscoroutinefunction(method), f"{where}.{name} is not awaitable"
                sync_params = list(inspect.signature(getattr(service, name)).parameters)
                assert list(inspect.signature(method).parameters) == sync_params, (where, name)
                checked += 1
        assert checked > 70, "the enumeration found too few methods to be complete"
        runtime_members = {n for n in dir(Runtime) if not n.startswith("_")}
        runtime_members |= {f.name for f in dataclasses.fields(Runtime)}
        for name in runtime_members - PORTS:
            twin_name = "aclose" if name == "close" else name
            assert hasattr(aruntime, twin_name), f"Runtime.{name} has no AsyncRuntime counterpart"
    finally:
        asyncio.run(aruntime.aclose())


class _ThreadLog:
    """Wrap a store and record the thread of every call made on it."""

    def __init__(self, store: SecureObjectStore) -> None:
        self._store = store
        self.threads: set[int] = set()
        self.names: list[str] = []
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not callable(value):
            return value

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.threads.add(threading.get_ident())
            self.names.append(name)
            self.calls += 1
            return value(*args, **kwargs)

        return recorded


def _bump(state: WorkflowState) -> WorkflowState:
    count = state.model_dump().get("count", 0)
    assert isinstance(count, int)
    return WorkflowState(count=count + 1)


def _count(snapshot_state: WorkflowState) -> int:
    count = snapshot_state.model_dump().get("count", 0)
    assert isinstance(count, int)
    return count


def test_the_event_loop_thread_never_touches_the_store(tmp_path: Path) -> None:
    """Opening, every kind of call, and closing: the store is reached only from other threads."""
    real = SQLiteSecureObjectStore.open(tmp_path / "store.db", create=True)
    log = _ThreadLog(real)
    loop_threads: set[int] = set()

    async def main() -> None:
        loop_threads.add(threading.get_ident())
        settings = Settings(backend="sqlite", home=tmp_path)
        store: Any = log
        async with await async_bootstrap(settings, key=KEY, store=store) as rt:
            await asyncio.gather(*(rt.state(f"s{n}").update(_bump) for n in range(20)))
            await asyncio.gather(*(rt.stream("shared").append("tick", {"n": n}) for n in range(20)))
            await rt.idempotency.remember("k", {"a": 1}, {"b": 2})
            assert await rt.idempotency.recall("k", {"a": 1}) == {"b": 2}
            await rt.definitions.register_definition("d", {"steps": []})
            run, _ = await rt.runs.start_run("d", {"x": 1})
            assert (await rt.runs.get_run(run.run_id)).run_id == run.run_id
            assert (await rt.audit().run()).ok
            await rt.retention().run()
            assert (await rt.state("s1").load()).revision == 1

    asyncio.run(main())
    real.close()
    assert log.calls > 60
    assert log.threads
    assert not log.threads & loop_threads


def test_concurrent_increments_of_one_record_lose_no_update(settings: Settings) -> None:
    """100 coroutines bump one CAS-guarded record: the count is exactly the successes."""

    async def main() -> tuple[int, int, int]:
        async with await async_bootstrap(settings, key=KEY, create=True) as rt:
            state = rt.state("hot")
            outcomes = await asyncio.gather(
                *(state.update(_bump) for _ in range(CONCURRENT)), return_exceptions=True
            )
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            assert all(isinstance(o, RevisionConflict) for o in failures), failures
            snapshot = await state.load()
            history = await state.history()
            return CONCURRENT - len(failures), _count(snapshot.state), len(history)

    successes, count, events = asyncio.run(main())
    assert successes > 0
    assert count == successes
    assert events == successes


def test_concurrent_appends_to_one_stream_leave_a_gap_free_chain(settings: Settings) -> None:
    """100 coroutines append to one stream: every index once, in order, and the chain verifies."""

    async def main() -> None:
        async with await async_bootstrap(settings, key=KEY, create=True) as rt:
            writer = rt.stream("shared")
            events = await asyncio.gather(
                *(writer.append("tick", {"n": n}) for n in range(CONCURRENT))
            )
            assert sorted(event.index for event in events) == list(range(CONCURRENT))
            assert len({event.event_hash for event in events}) == CONCURRENT
            report = await rt.audit().run(["shared"])
            assert report.ok
            assert [s.events for s in report.streams] == [CONCURRENT]

    asyncio.run(main())


def test_a_failing_unit_among_concurrent_ones_leaves_nothing_half_written(
    settings: Settings,
) -> None:
    """Half the coroutines carry a sibling whose guard fails and leave nothing; half land whole.

    A refused unit's state write, history event and sibling are all absent.
    """

    async def main() -> None:
        async with await async_bootstrap(settings, key=KEY, create=True) as rt:
            repository = rt.sync.repository
            state = rt.state("mixed")

            def stale(current: WorkflowState) -> tuple[WorkflowState, list[Upsert]]:
                sibling = repository.prepare("catalogue", "index", {"n": 1}, expected=5)
                return _bump(current), [sibling]

            def fresh(n: int) -> Callable[[WorkflowState], tuple[WorkflowState, list[Upsert]]]:
                def step(current: WorkflowState) -> tuple[WorkflowState, list[Upsert]]:
                    sibling = repository.prepare(
                        "catalogue", f"ok-{n}", {"n": n}, expected=Guard.ABSENT
                    )
                    return _bump(current), [sibling]

                return step

            calls = [
                state.update_with_writes(stale if n % 2 else fresh(n)) for n in range(CONCURRENT)
            ]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            refused = [n for n, o in enumerate(outcomes) if isinstance(o, RevisionConflict)]
            assert all(isinstance(o, (tuple, RevisionConflict)) for o in outcomes), outcomes
            assert refused == list(range(1, CONCURRENT, 2))
            snapshot = await state.load()
            assert _count(snapshot.state) == CONCURRENT // 2
            assert len(await state.history()) == CONCURRENT // 2

            def siblings() -> tuple[bool, int]:
                landed = sum(
                    repository.read("catalogue", f"ok-{n}") is not None
                    for n in range(0, CONCURRENT, 2)
                )
                return repository.read("catalogue", "index") is None, landed

            assert await asyncio.to_thread(siblings) == (True, CONCURRENT // 2)

    asyncio.run(main())


def _held(release: threading.Event, entered: threading.Event) -> Callable[[WorkflowState], Any]:
    def step(state: WorkflowState) -> WorkflowState:
        entered.set()
        assert release.wait(10)
        return _bump(state)

    return step


def test_cancellation_withdraws_an_unstarted_call_and_lets_a_started_one_finish(
    tmp_path: Path,
) -> None:
    """A call cancelled while queued never runs; one cancelled while running lands whole."""
    settings = Settings(backend="sqlite", home=tmp_path)

    async def main() -> None:
        async with await async_bootstrap(settings, key=KEY, create=True, threads=1) as rt:
            release, entered = threading.Event(), threading.Event()
            running = asyncio.create_task(rt.state("busy").update(_held(release, entered)))
            assert await asyncio.to_thread(entered.wait, 10)
            queued = asyncio.create_task(rt.stream("never").append("tick"))
            await asyncio.sleep(0.05)
            queued.cancel()
            running.cancel()
            release.set()
            for task in (queued, running):
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert (await rt.state("busy").load()).revision == 1
            assert await asyncio.to_thread(rt.sync.store.ledger_head, "never") is None
            assert (await rt.audit().run()).ok

    asyncio.run(main())


def test_close_waits_for_in_flight_work_then_refuses_as_the_sync_runtime_does(
    tmp_path: Path,
) -> None:
    """``aclose`` lets the running call land, closes the store, and later calls fail typed."""
    settings = Settings(backend="sqlite", home=tmp_path)

    async def main() -> AsyncRuntime:
        rt = await async_bootstrap(settings, key=KEY, create=True)
        release, entered = threading.Event(), threading.Event()
        running = asyncio.create_task(rt.state("busy").update(_held(release, entered)))
        assert await asyncio.to_thread(entered.wait, 10)
        closing = asyncio.create_task(rt.aclose())
        await asyncio.sleep(0.05)
        assert rt.closed
        assert not closing.done()
        with pytest.raises(StoreUnavailable):
            await rt.state("other").load()
        release.set()
        _, revision = await running
        assert revision == 1
        await closing
        await rt.aclose()
        with pytest.raises(StoreUnavailable) as refused:
            await rt.state("busy").load()
        with pytest.raises(StoreUnavailable) as sync_refused:
            rt.sync.state("busy").load()
        assert str(refused.value) == str(sync_refused.value)
        return rt

    asyncio.run(main())
    with bootstrap(settings, key=KEY) as reopened:
        assert reopened.state("busy").load().revision == 1


REQUEST = contextvars.ContextVar[str]("REQUEST", default="none")


def test_a_call_runs_in_its_coroutine_s_context(tmp_path: Path) -> None:
    """Context variables (log context, tracing spans) travel with each call to its thread."""
    seen: dict[str, str] = {}

    def record(name: str) -> Callable[[WorkflowState], WorkflowState]:
        def step(state: WorkflowState) -> WorkflowState:
            seen[name] = REQUEST.get()
            return _bump(state)

        return step

    async def one(rt: AsyncRuntime, name: str) -> None:
        REQUEST.set(name)
        await rt.state(name).update(record(name))

    async def main() -> None:
        settings = Settings(backend="sqlite", home=tmp_path)
        async with await async_bootstrap(settings, key=KEY, create=True) as rt:
            await asyncio.gather(*(one(rt, f"r{n}") for n in range(8)))

    asyncio.run(main())
    assert seen == {f"r{n}": f"r{n}" for n in range(8)}


def test_a_cancelled_bootstrap_closes_the_runtime_it_opened(tmp_path: Path) -> None:
    """The open finishes on its thread; the runtime no coroutine will get is closed, not leaked."""
    real = SQLiteSecureObjectStore.open(tmp_path / "store.db", create=True)
    log = _ThreadLog(real)

    async def main() -> None:
        store: Any = log
        settings = Settings(backend="sqlite", home=tmp_path)
        opening = asyncio.create_task(async_bootstrap(settings, key=KEY, store=store))
        await asyncio.sleep(0)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        for _ in range(500):
            if "close" in log.names:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert "close" in log.names
    with pytest.raises(StoreUnavailable):
        real.ledger_head("any")
