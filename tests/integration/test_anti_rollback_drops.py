"""Dropped streams and the high-water mark, on real SQLite files and the real PostgreSQL server.

A stream dropped on record (``drop_unit``) opens, whether the mark saw the
drop or not, and the full audit passes; the same stream deleted in SQL, as
someone with write access to the database and no key would, is refused
with ``STORE_ROLLED_BACK``. The negative control deletes the mark: then the
same deletion goes unseen.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import json_document, run_cli
from log_capture import capture_logs
from psycopg import sql

from flowvault.adapters.system import MarkFileStore
from flowvault.application import DROP_REGISTRY, SecureObjectStore, drop_unit
from flowvault.application._high_water_store import HighWaterStore
from flowvault.application._keys import encode_master_key
from flowvault.application._mark_format import parse_mark, replay_log
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import StoreRolledBack

STREAMS = ("langgraph/a", "langgraph/b", "langgraph/c")


def _fill(runtime: Runtime) -> None:
    for name in STREAMS:
        for step in range(3):
            runtime.stream(name).append("test.step", {"step": step})


def _remembered(path: Path, runtime: Runtime) -> dict[str, int]:
    state = MarkFileStore(path).read()
    assert state is not None
    mark = parse_mark(state.head, runtime.repository, "")
    return replay_log(mark, state.log(), runtime.repository, "")


def _past_the_mark(runtime: Runtime) -> SecureObjectStore:
    """Return the store under the mark's decorator: the mark does not see a commit there."""
    store = runtime.store
    assert isinstance(store, HighWaterStore)
    return store.wrapped


def _sqlite(tmp_path: Path) -> Settings:
    return Settings(backend="sqlite", home=tmp_path / "home", mark_sync="strict")


def test_streams_dropped_on_record_open_verify_and_are_forgotten(tmp_path: Path) -> None:
    """Dropped through the store, the streams leave the mark; the audit verifies the registry."""
    settings = _sqlite(tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings, create=True) as runtime:
        _fill(runtime)
        unit = drop_unit(
            runtime.store,
            runtime.repository,
            *STREAMS[:2],
            occurred_at=runtime.clock.now(),
            reason="thread_deleted",
        )
        runtime.store.commit(unit)
        assert set(_remembered(mark, runtime)) >= {STREAMS[2], DROP_REGISTRY}
        assert not set(STREAMS[:2]) & set(_remembered(mark, runtime))
    with bootstrap(settings) as runtime:
        assert runtime.store.ledger_head(STREAMS[0]) is None
    verify = run_cli(tmp_path, "ledger", "verify", "--all", "--json", home=settings.home)
    assert verify.returncode == 0, verify.stderr
    report = json_document(verify)
    assert report["ok"] is True
    assert report["rolled_back"] is None


def test_a_stream_deleted_in_sql_is_refused_and_one_dropped_on_record_opens(
    tmp_path: Path,
) -> None:
    """Rows deleted without the key are refused; the registry event is what makes a drop good."""
    settings = _sqlite(tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings, create=True) as runtime:
        _fill(runtime)
        unit = drop_unit(
            runtime.store,
            runtime.repository,
            STREAMS[0],
            occurred_at=runtime.clock.now(),
            reason="thread_deleted",
        )
        _past_the_mark(runtime).commit(unit)
    with closing(sqlite3.connect(settings.database_path)) as connection, connection:
        for table in ("ledger_events", "ledger_streams"):
            connection.execute(f"DELETE FROM {table} WHERE stream = ?", (STREAMS[1],))  # noqa: S608
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings)
    assert refused.value.details["stream"] == STREAMS[1]
    assert refused.value.details["streams"] == 1, "the stream dropped on record is not counted"
    mark.unlink()
    with capture_logs() as logs, bootstrap(settings) as runtime:
        assert runtime.store.ledger_head(STREAMS[1]) is None, "without the mark it goes unseen"
    assert "high_water_mark_started" in [entry["event"] for entry in logs]


def test_a_drop_the_mark_missed_is_accepted_once_and_forgotten(tmp_path: Path) -> None:
    """A drop committed past the mark's decorator is found in the registry on open."""
    settings = _sqlite(tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings, create=True) as runtime:
        _fill(runtime)
        unit = drop_unit(
            runtime.store,
            runtime.repository,
            STREAMS[0],
            occurred_at=runtime.clock.now(),
            reason="retention",
        )
        _past_the_mark(runtime).commit(unit)
        assert STREAMS[0] in _remembered(mark, runtime)
    with capture_logs() as logs, bootstrap(settings) as runtime:
        assert STREAMS[0] not in _remembered(mark, runtime)
    assert "high_water_mark_drops_accepted" in [entry["event"] for entry in logs]


@pytest.mark.postgres
def test_postgres_refuses_a_stream_deleted_in_sql_and_opens_one_dropped_on_record(
    tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """The same two drops on PostgreSQL, against a host's mark."""
    mark = tmp_path / "marks" / "pg.high-water"
    settings = Settings(
        backend="postgres",
        home=tmp_path / "home",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        key=encode_master_key(bytes(range(64, 96))),
        high_water_file=mark,
        mark_sync="strict",
    )
    with bootstrap(settings, create=True) as runtime:
        _fill(runtime)
        unit = drop_unit(
            runtime.store,
            runtime.repository,
            STREAMS[0],
            occurred_at=runtime.clock.now(),
            reason="thread_deleted",
        )
        _past_the_mark(runtime).commit(unit)
    with bootstrap(settings) as runtime:
        assert STREAMS[0] not in _remembered(mark, runtime)
    with postgres_server.admin() as admin:
        for table in ("ledger_events", "ledger_streams"):
            admin.execute(
                sql.SQL("DELETE FROM {} WHERE stream = %s").format(
                    sql.Identifier(pg_schema, table)
                ),
                (STREAMS[1],),
            )
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings)
    assert refused.value.details["stream"] == STREAMS[1]
