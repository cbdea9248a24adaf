"""No thread id, metadata value, channel value or prompt text of a graph reaches the store in clear.

A graph runs to its ``interrupt()`` and on to the end with canary strings in
every place LangGraph carries host data; the database files (SQLite's main
file, write-ahead log and shared memory) or every PostgreSQL table, the
logs, and the errors a tampered store raises must hold none of them.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command
from log_capture import capture_logs
from refund_graph import build

from flowvault.adapters.langgraph import FlowvaultSaver
from flowvault.composition import Settings, bootstrap
from flowvault.domain import IntegrityFailure

KEY = secrets.token_bytes(32)
THREAD = "canary-thread-7f3a9c"
ORDER = "canary-order-51d2e8"
OWNER = "canary-owner@example.com"
CANARIES = (THREAD, ORDER, OWNER, "refund order canary-order")
"""The thread id, a channel value, a metadata value, and the prompt text the interrupt shows."""


def _run_graph(settings: Settings) -> tuple[list[dict[str, Any]], IntegrityFailure]:
    config: Any = {"configurable": {"thread_id": THREAD}, "metadata": {"owner": OWNER}}
    with capture_logs(logging.DEBUG) as logs, bootstrap(settings, key=KEY, create=True) as runtime:
        saver = FlowvaultSaver.from_runtime(runtime)
        graph = build().compile(checkpointer=saver)
        graph.invoke({"order": ORDER}, config)
        graph.invoke(Command(resume="approve"), config)
        newest = saver.get_tuple(config)
        assert newest is not None
        assert newest.checkpoint["channel_values"]["result"] == "refunded"
        assert newest.metadata["owner"] == OWNER
        rows = saver._rows
        digest = rows.checkpoint_digest(
            rows.thread(THREAD), "", newest.config["configurable"]["checkpoint_id"]
        )
        runtime.store.commit(_delete(runtime.store, digest))
        with pytest.raises(IntegrityFailure) as refused:
            saver.get_tuple(config)
    return logs, refused.value


def _delete(store: Any, digest: str) -> Any:
    from flowvault.application import Delete, UnitOfWork  # noqa: PLC0415

    stored = store.peek_metadata("langgraph.checkpoints", digest)
    return UnitOfWork(deletes=[Delete("langgraph.checkpoints", digest, stored.revision)])


def _select_all(schema: str, table: str) -> Any:
    from psycopg import sql  # noqa: PLC0415 - the postgres extra

    return sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def _assert_clean(
    blobs: Iterator[bytes], logs: list[dict[str, Any]], error: IntegrityFailure
) -> None:
    scanned = 0
    for blob in blobs:
        scanned += len(blob)
        for canary in CANARIES:
            assert canary.encode() not in blob
    assert scanned > 0
    text = " ".join([str(error), repr(error), repr(error.details), repr(logs)])
    for canary in CANARIES:
        assert canary not in text


def test_sqlite_files_logs_and_errors_hold_no_canary(tmp_path: Path) -> None:
    """The database, its write-ahead log and shared memory, after a whole graph run."""
    settings = Settings(backend="sqlite", home=tmp_path / "home", synchronous="full")
    logs, error = _run_graph(settings)
    files = sorted(settings.data_dir.iterdir())
    assert settings.database_path in files
    _assert_clean((path.read_bytes() for path in files), logs, error)


@pytest.mark.postgres
def test_postgres_tables_logs_and_errors_hold_no_canary(
    tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """Every table of the schema, dumped as text, after a whole graph run."""
    settings = Settings(
        backend="postgres",
        home=tmp_path / "home",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
    )
    logs, error = _run_graph(settings)
    with postgres_server.admin() as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (pg_schema,),
        ).fetchall()
        dumps = [
            str(connection.execute(_select_all(pg_schema, name)).fetchall()).encode()
            for (name,) in tables
        ]
    _assert_clean(iter(dumps), logs, error)
