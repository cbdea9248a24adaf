"""Fixtures shared by the integration tests of the bundled SQL adapters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql as pg_sql

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """Yield a SQL store and a function running one raw statement on its tables."""
    if request.param == "sqlite":
        store = SQLiteSecureObjectStore.open(tmp_path / "store.db", create=True)

        def raw(statement: str, params: tuple[object, ...] = ()) -> None:
            store._writer.connection.execute(statement, params)

        try:
            yield store, raw
        finally:
            store.close()
        return
    server = request.getfixturevalue("postgres_server")
    schema = request.getfixturevalue("pg_schema")
    store = PostgresSecureObjectStore.open(server.dsn, schema=schema, create=True)
    admin = server.admin()
    admin.execute(pg_sql.SQL("SET search_path TO {}").format(pg_sql.Identifier(schema)))

    def raw(statement: str, params: tuple[object, ...] = ()) -> None:
        admin.execute(statement.replace("?", "%s"), params)

    try:
        yield store, raw
    finally:
        admin.close()
        store.close()
