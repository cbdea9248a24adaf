"""Selecting PostgreSQL through settings, and where its key comes from."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.application import Guard
from flowvault.application._keys import encode_master_key
from flowvault.composition import Settings, bootstrap
from flowvault.domain import IntegrityFailure, InvalidInput, KeyRequired

pytestmark = pytest.mark.postgres

PASSWORD = "pg-pass-5e1d"
DSN = f"postgresql://flowvault:{PASSWORD}@db.internal:5432/vault"


def _env(**extra: str) -> dict[str, str]:
    return {"FLOWVAULT_BACKEND": "Postgres", "FLOWVAULT_POSTGRES_DSN": DSN, **extra}


def test_postgres_settings_come_from_the_environment() -> None:
    """Every FLOWVAULT_POSTGRES_* variable reaches its setting; defaults fill the rest."""
    settings = Settings.from_env(
        _env(
            FLOWVAULT_POSTGRES_POOL_SIZE="12",
            FLOWVAULT_POSTGRES_STATEMENT_TIMEOUT="2.5",
            FLOWVAULT_POSTGRES_LOCK_TIMEOUT="0.5",
            FLOWVAULT_POSTGRES_SCHEMA="host_a",
        )
    )
    assert settings.backend == "postgres"
    assert settings.postgres_dsn is not None
    assert settings.postgres_dsn.get_secret_value() == DSN
    assert settings.postgres_pool_size == 12
    assert (settings.postgres_statement_timeout, settings.postgres_lock_timeout) == (2.5, 0.5)
    assert settings.postgres_schema == "host_a"
    defaults = Settings.from_env(_env())
    assert defaults.postgres_pool_size == 4
    assert defaults.postgres_schema == "flowvault"
    assert (defaults.postgres_statement_timeout, defaults.postgres_lock_timeout) == (30.0, 10.0)


def test_the_dsn_is_a_secret() -> None:
    """The DSN, which can hold a password, never shows in repr, str or a settings error."""
    settings = Settings.from_env(_env())
    assert PASSWORD not in repr(settings) + str(settings)
    with pytest.raises(InvalidInput) as caught:
        Settings.from_env(_env(FLOWVAULT_POSTGRES_POOL_SIZE="0"))
    assert PASSWORD not in str(caught.value)
    assert "FLOWVAULT_POSTGRES_POOL_SIZE" in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FLOWVAULT_POSTGRES_POOL_SIZE", "0"),
        ("FLOWVAULT_POSTGRES_POOL_SIZE", "101"),
        ("FLOWVAULT_POSTGRES_STATEMENT_TIMEOUT", "0"),
        ("FLOWVAULT_POSTGRES_LOCK_TIMEOUT", "-1"),
        ("FLOWVAULT_POSTGRES_LOCK_TIMEOUT", "nan"),
        ("FLOWVAULT_POSTGRES_SCHEMA", "Host_A"),
        ("FLOWVAULT_POSTGRES_SCHEMA", "pg_flowvault"),
        ("FLOWVAULT_POSTGRES_SCHEMA", "with-dash"),
        ("FLOWVAULT_POSTGRES_SCHEMA", "x" * 64),
    ],
)
def test_bad_postgres_settings_are_refused_by_name(variable: str, value: str) -> None:
    """Out-of-range pool sizes, timeouts and schema names fail naming the variable."""
    with pytest.raises(InvalidInput) as caught:
        Settings.from_env(_env(**{variable: value}))
    assert variable in str(caught.value)


def test_the_postgres_backend_needs_a_dsn() -> None:
    """Choosing postgres without FLOWVAULT_POSTGRES_DSN fails when the store is opened."""
    settings = Settings.from_env({"FLOWVAULT_BACKEND": "postgres"})
    with pytest.raises(InvalidInput) as caught:
        bootstrap(settings, create=True)
    assert "FLOWVAULT_POSTGRES_DSN" in str(caught.value)


def _settings(postgres_server, schema: str, key: bytes | None = None) -> Settings:
    environ = {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": schema,
        "FLOWVAULT_POSTGRES_POOL_SIZE": "2",
        "XDG_DATA_HOME": os.environ["XDG_DATA_HOME"],
    }
    if key is not None:
        environ["FLOWVAULT_KEY"] = encode_master_key(key)
    return Settings.from_env(environ)


def test_hosts_sharing_the_key_share_the_store(postgres_server, pg_schema: str) -> None:
    """Two runtimes with the same FLOWVAULT_KEY read each other's sealed records."""
    key = generate_master_key()
    with bootstrap(_settings(postgres_server, pg_schema, key), create=True) as first:
        store = first.capabilities.epoch
        assert isinstance(store, PostgresSecureObjectStore), "beneath its high-water mark"
        assert store.schema == pg_schema
        first.repository.write("shared", "doc", {"n": 1}, expected=Guard.ABSENT)
        with bootstrap(_settings(postgres_server, pg_schema, key), create=True) as second:
            opened = second.repository.read("shared", "doc")
            assert opened is not None
            assert opened.document == {"n": 1}


def test_no_key_is_ever_created_for_a_postgres_store(postgres_server, pg_schema: str) -> None:
    """Without an explicit key or FLOWVAULT_KEY, even an empty store is KEY_REQUIRED."""
    with pytest.raises(KeyRequired) as caught:
        bootstrap(_settings(postgres_server, pg_schema), create=True)
    assert "FLOWVAULT_KEY" in str(caught.value)
    key = generate_master_key()
    with bootstrap(_settings(postgres_server, pg_schema), key=key, create=True) as runtime:
        runtime.repository.write("shared", "doc", {"n": 1}, expected=Guard.ABSENT)
    with pytest.raises(KeyRequired) as caught:
        bootstrap(_settings(postgres_server, pg_schema), create=True)
    assert "FLOWVAULT_KEY" in str(caught.value)


def test_a_host_with_another_key_is_refused(postgres_server, pg_schema: str) -> None:
    """A host configured with a different key cannot open a store sealed under another."""
    with bootstrap(
        _settings(postgres_server, pg_schema, generate_master_key()), create=True
    ) as runtime:
        runtime.repository.write("shared", "doc", {"n": 1}, expected=Guard.ABSENT)
    with pytest.raises(IntegrityFailure):
        bootstrap(_settings(postgres_server, pg_schema, generate_master_key()), create=True)


def test_the_guide_example_runs(postgres_server, pg_schema: str, monkeypatch) -> None:
    """The Python example of docs/postgres.md runs as written against the test server."""
    guide = Path(__file__).resolve().parents[2] / "docs" / "postgres.md"
    (block,) = re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.DOTALL)
    for name, value in {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": pg_schema,
        "FLOWVAULT_KEY": encode_master_key(generate_master_key()),
    }.items():
        monkeypatch.setenv(name, value)
    bootstrap(Settings.from_env(), create=True).close()  # what `flowvault init` did first
    exec(compile(block, str(guide), "exec"), {})  # noqa: S102 - running our own docs
