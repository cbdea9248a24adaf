"""Only ``flowvault init`` and ``create=True`` create a store; every other open finds it or refuses.

Real SQLite files and a real PostgreSQL schema: a missing home, or a
misspelt schema, is opened by the library and by the CLI verbs that used
to create one, as real subprocesses; afterwards nothing exists, neither
the file, its directory, its key, nor the schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application._keys import encode_master_key
from flowvault.composition import Settings, bootstrap
from flowvault.domain import NotFound, WorkflowState

VERBS = [
    ["reset-progress", "--scope", "main", "--yes"],
    ["fingerprint", "--scope", "main"],
    ["status"],
    ["ledger", "verify", "--all"],
    ["workflows", "list"],
    ["runs", "list"],
]
"""The verbs that created a store on a cold root before set-up became explicit."""


def _schema_exists(postgres_server: Any, schema: str) -> bool:
    with postgres_server.admin() as admin:
        found = admin.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    return found is not None


def _pg_env(postgres_server: Any, schema: str, key: bytes) -> dict[str, str]:
    return {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": schema,
        "FLOWVAULT_KEY": encode_master_key(key),
    }


def _cold_or_not_found(result: Any) -> None:
    """Check the verb reported a cold root, or NOT_FOUND with a fix naming ``init``."""
    document = _document(result)
    if result.returncode == 0:
        assert document["cold_root"] is True, document
        return
    assert result.returncode == 1, result.stdout + result.stderr
    error = document["error"]
    assert isinstance(error, dict)
    assert error["code"] == "NOT_FOUND"
    assert "flowvault init" in str(error["fix"])


def test_bootstrap_without_create_refuses_a_missing_sqlite_store(tmp_path: Path) -> None:
    """No file, no directory, no key: the home stays absent and the fix names both ways."""
    home = tmp_path / "home"
    with pytest.raises(NotFound) as refused:
        bootstrap(Settings(backend="sqlite", home=home))
    assert "flowvault init" in refused.value.message
    assert "create=True" in refused.value.message
    assert not home.exists()
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=1))
    with bootstrap(Settings(backend="sqlite", home=home)) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=1)


def test_the_sqlite_adapter_creates_only_when_asked(tmp_path: Path) -> None:
    """``open`` without ``create`` refuses a missing file and leaves its directory uncreated."""
    path = tmp_path / "data" / "flowvault.db"
    with pytest.raises(NotFound):
        SQLiteSecureObjectStore.open(path)
    assert not path.parent.exists()
    SQLiteSecureObjectStore.open(path, create=True).close()
    SQLiteSecureObjectStore.open(path).close()


@pytest.mark.parametrize("verb", VERBS, ids=lambda verb: " ".join(verb[:2]))
def test_cli_verbs_on_a_missing_sqlite_home_create_nothing(tmp_path: Path, verb: list[str]) -> None:
    """Each verb reports a cold root or NOT_FOUND naming init; the home is never made."""
    home = tmp_path / "home"
    result = _run(tmp_path, *verb, "--json", home=home)
    _cold_or_not_found(result)
    assert not home.exists()


@pytest.mark.postgres
def test_bootstrap_without_create_refuses_a_misspelt_schema(
    postgres_server: Any, pg_schema: str
) -> None:
    """A schema that does not exist is refused, and is not created by the refusal."""
    settings = Settings(
        backend="postgres",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        key=encode_master_key(generate_master_key()),
    )
    with pytest.raises(NotFound) as refused:
        bootstrap(settings)
    assert "flowvault init" in refused.value.message
    assert not _schema_exists(postgres_server, pg_schema)
    with pytest.raises(NotFound):
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema)
    assert not _schema_exists(postgres_server, pg_schema)


@pytest.mark.postgres
def test_an_empty_schema_is_not_filled_without_create(postgres_server: Any, pg_schema: str) -> None:
    """A schema a DBA made for the role holds no store until init: no table is created in it."""
    with postgres_server.admin() as admin:
        admin.execute(f'CREATE SCHEMA "{pg_schema}"')
    with pytest.raises(NotFound):
        PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema)
    with postgres_server.admin() as admin:
        tables = admin.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (pg_schema,)
        ).fetchone()
    assert tables == (0,)


@pytest.mark.postgres
@pytest.mark.parametrize("verb", VERBS, ids=lambda verb: " ".join(verb[:2]))
def test_cli_verbs_on_a_misspelt_schema_create_nothing(
    tmp_path: Path, postgres_server: Any, pg_schema: str, verb: list[str]
) -> None:
    """Each verb reports a cold root or NOT_FOUND naming init; the schema is never made."""
    env = _pg_env(postgres_server, pg_schema, generate_master_key())
    result = _run(tmp_path, *verb, "--json", home=tmp_path / "home", **env)
    _cold_or_not_found(result)
    assert not _schema_exists(postgres_server, pg_schema)
    assert not (tmp_path / "home").exists()


@pytest.mark.postgres
def test_init_creates_the_schema_the_other_verbs_then_use(
    tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """After ``init`` the same verbs find the store: reset-progress records its event."""
    env = _pg_env(postgres_server, pg_schema, generate_master_key())
    home = tmp_path / "home"
    assert _run(tmp_path, "init", "--json", home=home, **env).returncode == 0
    assert _schema_exists(postgres_server, pg_schema)
    result = _run(
        tmp_path, "reset-progress", "--scope", "main", "--yes", "--json", home=home, **env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert _document(result)["cold_root"] is False
