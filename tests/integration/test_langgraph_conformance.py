"""LangGraph's own checkpointer conformance suite, run against ``FlowvaultSaver`` on every backend.

``langgraph-checkpoint-conformance`` detects which capabilities a saver
implements and runs each one's tests; these tests require every base and
extended capability to be detected and every one of its tests to pass.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)

from flowvault.adapters.langgraph import AsyncFlowvaultSaver, FlowvaultSaver
from flowvault.composition import Settings, bootstrap

KEY = secrets.token_bytes(32)
EVERY_CAPABILITY = {capability.value for capability in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
CONFORMANCE_TESTS = 81
"""Tests the suite's version 0.0.2 runs over all eight capabilities."""


def _assert_full(opener: Callable[[], AbstractContextManager[FlowvaultSaver]], name: str) -> None:
    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[FlowvaultSaver]:
        with opener() as saver:
            yield saver

    report = asyncio.run(validate(factory))
    results = report.results
    assert set(results) == EVERY_CAPABILITY
    failures = {
        capability: result.failures
        for capability, result in results.items()
        if not (result.detected and result.passed)
    }
    assert failures == {}
    assert sum(result.tests_passed for result in results.values()) == CONFORMANCE_TESTS
    assert sum(result.tests_failed for result in results.values()) == 0


def test_memory_store_passes_every_capability() -> None:
    """The in-memory store, through ``from_conn_string(":memory:")``."""
    _assert_full(lambda: FlowvaultSaver.from_conn_string(":memory:", key=KEY), "flowvault-memory")


def test_sqlite_file_passes_every_capability(tmp_path: Path) -> None:
    """A SQLite file per capability suite, through ``from_conn_string(path)``."""
    files = iter(range(100))

    def opener() -> AbstractContextManager[FlowvaultSaver]:
        return FlowvaultSaver.from_conn_string(str(tmp_path / f"graph-{next(files)}.db"), key=KEY)

    _assert_full(opener, "flowvault-sqlite")


def test_sqlite_runtime_with_its_high_water_mark_passes_every_capability(tmp_path: Path) -> None:
    """The runtime route: a saver over ``bootstrap(...)``, whose store keeps its high-water mark."""
    homes = iter(range(100))

    class _Opened:
        def __enter__(self) -> FlowvaultSaver:
            settings = Settings(backend="sqlite", home=tmp_path / f"home-{next(homes)}")
            self.runtime = bootstrap(settings, key=KEY, create=True)
            assert self.runtime.mark is not None
            return FlowvaultSaver.from_runtime(self.runtime)

        def __exit__(self, *_: object) -> None:
            self.runtime.close()

    _assert_full(_Opened, "flowvault-sqlite-runtime")


@pytest.mark.postgres
def test_postgres_passes_every_capability(postgres_server: object, pg_schema: str) -> None:
    """A fresh PostgreSQL schema, through ``from_conn_string(dsn)``."""
    dsn = postgres_server.dsn  # type: ignore[attr-defined]
    _assert_full(
        lambda: FlowvaultSaver.from_conn_string(dsn, key=KEY, postgres_schema=pg_schema),
        "flowvault-postgres",
    )


def test_the_async_twin_opens_with_async_with(tmp_path: Path) -> None:
    """``AsyncFlowvaultSaver.from_conn_string`` is an async context manager, as LangGraph's are."""

    async def scenario() -> None:
        path = str(tmp_path / "async.db")
        async with AsyncFlowvaultSaver.from_conn_string(path, key=KEY) as saver:
            config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            assert await saver.aget_tuple(config) is None
            assert [item async for item in saver.alist(config)] == []

    asyncio.run(scenario())
