"""How an asyncio host should reach flowvault's synchronous stores: the mechanisms measured.

From the repository root::

    python benchmarks/async_mechanisms.py [--quick] [--repeat N] [--postgres-dsn DSN]

``COROUTINES`` coroutines each make ``WRITES`` small durable writes, all at
once, on one runtime per backend (a SQLite file in a temporary directory,
and a fresh PostgreSQL schema, dropped afterwards). Three workloads: a state
save on the coroutine's own scope, an append to one shared stream, and a
CAS-guarded increment of one shared state record. Each mechanism hands the
blocking call to a thread a different way:

* ``inline``: no thread at all, the call blocks the event loop (the reference
  for what blocking costs);
* ``to_thread``: ``asyncio.to_thread`` per call (the loop's default executor);
* ``pool-N``: a bounded thread pool of ``N`` workers owned by the caller;
* ``writer``: one dedicated thread per store (a pool of one).

Every row reports writes/s (median over the repetitions), p50/p99 latency
of one call as its coroutine sees it, the event loop's worst lag (a ticker
coroutine asking to wake every millisecond), and the ratio of its rate to
``to_thread``'s. For SQLite it also reports how many units shared a sync
(group commit, ``commit_counts``). The last table weighs psycopg's native
``AsyncConnectionPool`` against the sync pool driven from threads, with a
minimal one-row ``INSERT`` and ``COMMIT`` loop and nothing of flowvault.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

from _harness import percentile

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.composition import Runtime, Settings, bootstrap, configure_logging
from flowvault.domain import FlowvaultError, WorkflowState

T = TypeVar("T")

DEFAULT_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
PG_POOL: Final = 4
"""The PostgreSQL pool size (flowvault's default), and so the thread pool's for ``pool-pg``."""

Dispatch = Callable[[Callable[[], T]], Awaitable[T]]
Workload = Callable[[Runtime, str, int, int], Callable[[], object]]


@dataclass
class Outcome:
    """One run of one workload under one mechanism."""

    seconds: float
    latencies_ms: list[float]
    errors: int
    max_lag_ms: float
    units: int = 0
    grouped_units: int = 0
    transactions: int = 0


@dataclass
class Row:
    """Every repetition of one (backend, workload, mechanism)."""

    backend: str
    workload: str
    mechanism: str
    outcomes: list[Outcome] = field(default_factory=list)

    def rate(self) -> float:
        """Median successful writes per second."""
        return statistics.median(
            (len(o.latencies_ms) - o.errors) / o.seconds for o in self.outcomes
        )

    def latency(self, q: float) -> float:
        """Percentile ``q`` (0-100) of every call's latency, over every repetition."""
        return percentile([ms for o in self.outcomes for ms in o.latencies_ms], q)

    def lag(self) -> float:
        """Return the worst event-loop lag seen in any repetition."""
        return max(o.max_lag_ms for o in self.outcomes)

    def errors(self) -> int:
        """Count the calls that raised, over every repetition."""
        return sum(o.errors for o in self.outcomes)

    def units_per_sync(self) -> float | None:
        """Return committed units per transaction (group commit), or ``None`` if not known."""
        transactions = sum(o.transactions for o in self.outcomes)
        units = sum(o.units for o in self.outcomes)
        return units / transactions if transactions else None


# -- the workloads --------------------------------------------------------------


def own_scope(runtime: Runtime, tag: str, worker: int, n: int) -> Callable[[], object]:
    """Save the state of the worker's own scope."""
    state = runtime.state(f"{tag}-s{worker}")
    return lambda: state.save(WorkflowState(n=n))


def shared_stream(runtime: Runtime, tag: str, worker: int, n: int) -> Callable[[], object]:
    """Append to the one stream every worker shares."""
    stream = runtime.stream(f"{tag}-shared")
    return lambda: stream.append("tick", {"worker": worker, "n": n})


def _bump(state: WorkflowState) -> WorkflowState:
    count = state.model_dump().get("count", 0)
    return WorkflowState(count=count + 1 if isinstance(count, int) else 1)


def contended_record(runtime: Runtime, tag: str, worker: int, n: int) -> Callable[[], object]:
    """Increment, CAS-guarded, the one state record every worker shares."""
    state = runtime.state(f"{tag}-hot")
    return lambda: state.update(_bump)


WORKLOADS: Final[tuple[tuple[str, Workload], ...]] = (
    ("own scope (state save)", own_scope),
    ("one stream (append)", shared_stream),
    ("one record (CAS increment)", contended_record),
)


# -- the mechanisms -------------------------------------------------------------


async def _inline(call: Callable[[], T]) -> T:
    return call()


async def _to_thread(call: Callable[[], T]) -> T:
    return await asyncio.to_thread(call)


def _pooled(pool: ThreadPoolExecutor) -> Dispatch[T]:
    async def dispatch(call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, call)

    return dispatch


@contextmanager
def mechanism(name: str) -> Iterator[Dispatch[object]]:
    """Yield the dispatcher ``name`` stands for, shutting its threads down afterwards."""
    if name == "inline":
        yield _inline
    elif name == "to_thread":
        yield _to_thread
    else:
        size = 1 if name == "writer" else int(name.removeprefix("pool-"))
        with ThreadPoolExecutor(max_workers=size, thread_name_prefix=name) as pool:
            yield _pooled(pool)


# -- one run --------------------------------------------------------------------


async def _ticker(stop: asyncio.Event, worst: list[float]) -> None:
    """Ask to wake every millisecond; record the worst overshoot (the loop's lag)."""
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(0.001)
        worst[0] = max(worst[0], (time.perf_counter() - asked - 0.001) * 1000)


async def _run(
    dispatch: Dispatch[object], calls: Sequence[Sequence[Callable[[], object]]]
) -> Outcome:
    latencies: list[float] = []
    errors = 0

    async def worker(mine: Sequence[Callable[[], object]]) -> None:
        nonlocal errors
        for call in mine:
            started = time.perf_counter()
            try:
                await dispatch(call)
            except FlowvaultError:
                errors += 1
            latencies.append((time.perf_counter() - started) * 1000)

    stop, worst = asyncio.Event(), [0.0]
    ticker = asyncio.create_task(_ticker(stop, worst))
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await asyncio.gather(*(worker(mine) for mine in calls))
    seconds = time.perf_counter() - started
    stop.set()
    await ticker
    return Outcome(seconds, latencies, errors, worst[0])


def run_once(
    runtime: Runtime, workload: Workload, name: str, tag: str, *, coroutines: int, writes: int
) -> Outcome:
    """Run ``workload`` under mechanism ``name`` on a fresh event loop."""
    calls = [[workload(runtime, tag, w, n) for n in range(writes)] for w in range(coroutines)]
    store = runtime.store
    before = store.commit_counts if isinstance(store, SQLiteSecureObjectStore) else None
    with mechanism(name) as dispatch:
        outcome = asyncio.run(_run(dispatch, calls))
    if before is not None and isinstance(store, SQLiteSecureObjectStore):
        after = store.commit_counts
        outcome.units = after.units - before.units
        outcome.grouped_units = after.grouped_units - before.grouped_units
        outcome.transactions = after.transactions - before.transactions
    return outcome


def measure(
    backend: str,
    runtime: Runtime,
    mechanisms: Sequence[str],
    *,
    repeat: int,
    coroutines: int,
    writes: int,
) -> list[Row]:
    """Every workload under every mechanism, repetitions interleaved."""
    rows = {
        (title, name): Row(backend, title, name) for title, _ in WORKLOADS for name in mechanisms
    }
    for rep in range(repeat):
        for w, (title, workload) in enumerate(WORKLOADS):
            for m, name in enumerate(mechanisms):
                tag = f"r{rep}w{w}m{m}"
                outcome = run_once(
                    runtime, workload, name, tag, coroutines=coroutines, writes=writes
                )
                rows[title, name].outcomes.append(outcome)
                sys.stderr.write(
                    f"{backend} {title} {name}: {len(outcome.latencies_ms) / outcome.seconds:.0f}/s"
                    f" lag {outcome.max_lag_ms:.1f} ms\n"
                )
    return list(rows.values())


# -- psycopg: native async pool against the sync pool in threads -------------------


def _pg_rows(dsn: str, schema: str, *, repeat: int, coroutines: int, writes: int) -> list[Row]:
    """Time a one-row ``INSERT`` + ``COMMIT`` per call: ``AsyncConnectionPool`` vs threads."""
    import psycopg  # noqa: PLC0415 - the postgres extra
    from psycopg import sql  # noqa: PLC0415
    from psycopg_pool import AsyncConnectionPool, ConnectionPool  # noqa: PLC0415

    table = sql.Identifier(schema, "ticks")
    insert = sql.SQL("INSERT INTO {} (worker, n) VALUES (%s, %s)").format(table)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        admin.execute(sql.SQL("CREATE TABLE {} (worker int, n int)").format(table))

    async def native() -> Outcome:
        async with AsyncConnectionPool(dsn, min_size=PG_POOL, max_size=PG_POOL) as pool:
            await pool.wait()

            async def call(worker: int, n: int) -> None:
                async with pool.connection() as connection:
                    await connection.execute(insert, (worker, n))

            return await _run_calls(call, coroutines, writes)

    async def threaded() -> Outcome:
        with (
            ConnectionPool(dsn, min_size=PG_POOL, max_size=PG_POOL) as pool,
            ThreadPoolExecutor(max_workers=PG_POOL) as threads,
        ):
            pool.wait()

            def write(worker: int, n: int) -> None:
                with pool.connection() as connection:
                    connection.execute(insert, (worker, n))

            async def call(worker: int, n: int) -> None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(threads, write, worker, n)

            return await _run_calls(call, coroutines, writes)

    native_row = Row("postgres (psycopg only)", "INSERT + COMMIT", "AsyncConnectionPool")
    thread_row = Row("postgres (psycopg only)", "INSERT + COMMIT", f"pool-{PG_POOL} + sync pool")
    for _ in range(repeat):
        native_row.outcomes.append(asyncio.run(native()))
        thread_row.outcomes.append(asyncio.run(threaded()))
    return [thread_row, native_row]


async def _run_calls(
    call: Callable[[int, int], Awaitable[None]], coroutines: int, writes: int
) -> Outcome:
    latencies: list[float] = []

    async def worker(w: int) -> None:
        for n in range(writes):
            started = time.perf_counter()
            await call(w, n)
            latencies.append((time.perf_counter() - started) * 1000)

    stop, worst = asyncio.Event(), [0.0]
    ticker = asyncio.create_task(_ticker(stop, worst))
    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(coroutines)))
    seconds = time.perf_counter() - started
    stop.set()
    await ticker
    return Outcome(seconds, latencies, 0, worst[0])


# -- report ---------------------------------------------------------------------


def table(rows: Sequence[Row], reference: str) -> str:
    """Render a markdown table; ``ratio`` is the rate over ``reference``'s, same workload."""
    lines = [
        "| backend | workload | mechanism | writes/s | ratio | p50 ms | p99 ms "
        "| max loop lag ms | errors | units/sync |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {(r.backend, r.workload): r.rate() for r in rows if r.mechanism == reference}
    for r in rows:
        ref = base.get((r.backend, r.workload))
        ratio = f"{r.rate() / ref:.2f}" if ref else "-"
        per_sync = r.units_per_sync()
        lines.append(
            f"| {r.backend} | {r.workload} | {r.mechanism} | {r.rate():.0f} | {ratio} "
            f"| {r.latency(50):.1f} | {r.latency(99):.1f} | {r.lag():.1f} | {r.errors()} "
            f"| {'-' if per_sync is None else f'{per_sync:.1f}'} |"
        )
    return "\n".join(lines)


def _settings(home: Path, backend: str, dsn: str, schema: str) -> Settings:
    config: dict[str, object] = {"backend": backend, "home": home}
    if backend == "postgres":
        config |= {"postgres_dsn": dsn, "postgres_schema": schema, "postgres_pool_size": PG_POOL}
    return Settings.model_validate(config)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the tables; exit 0."""
    parser = argparse.ArgumentParser(prog="benchmarks/async_mechanisms.py")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, same code paths")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--coroutines", type=int, default=100)
    parser.add_argument("--writes", type=int, default=20)
    parser.add_argument("--postgres-dsn", default=os.environ.get("TEST_POSTGRES_DSN", DEFAULT_DSN))
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.coroutines, args.writes = 1, 8, 2
    configure_logging("warning")
    load_before = os.getloadavg()
    sizes = {"repeat": args.repeat, "coroutines": args.coroutines, "writes": args.writes}
    rows: list[Row] = []
    key = secrets.token_bytes(32)
    with tempfile.TemporaryDirectory(prefix="fv-async-") as work:
        home = Path(work) / "sqlite"
        store = SQLiteSecureObjectStore.open(home / "store.db", create=True)
        with bootstrap(_settings(home, "sqlite", "", ""), key=key, store=store) as rt:
            mechanisms = ["inline", "to_thread", "pool-2", "pool-4", "pool-8", "pool-16", "writer"]
            rows += measure("sqlite", rt, mechanisms, **sizes)
        if not args.no_postgres:
            rows += _postgres(Path(work), args.postgres_dsn, key, sizes)
    load = f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    print(f"{os.cpu_count()} CPUs; {load}; sizes {sizes}\n")
    print(table([r for r in rows if "psycopg" not in r.backend], "to_thread"))
    print()
    print(table([r for r in rows if "psycopg" in r.backend], f"pool-{PG_POOL} + sync pool"))
    return 0


def _postgres(work: Path, dsn: str, key: bytes, sizes: dict[str, int]) -> list[Row]:
    from _baseline import drop_schema  # noqa: PLC0415

    schema = f"fvasync_{secrets.token_hex(6)}"
    try:
        settings = _settings(work / "pg", "postgres", dsn, schema)
        with bootstrap(settings, key=key, create=True) as rt:
            mechanisms = ["inline", "to_thread", f"pool-{PG_POOL}", "pool-16", "writer"]
            rows = measure("postgres", rt, mechanisms, **sizes)
        raw = f"{schema}_raw"
        try:
            rows += _pg_rows(dsn, raw, **sizes)
        finally:
            drop_schema(dsn, raw)
        return rows
    finally:
        drop_schema(dsn, schema)


if __name__ == "__main__":
    sys.exit(main())
