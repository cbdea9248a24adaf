"""``flowvault status`` shows what an operator watches, on SQLite and PostgreSQL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_helpers import json_document, run_cli
from populated_store import populate

from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.application._keys import encode_master_key
from flowvault.composition import Settings

WORKFLOWS_BY_STATE = [{"state": "intake", "workflows": 2}, {"state": "planning", "workflows": 1}]


def _status(tmp_path: Path, home: Path | None = None, **env: str) -> dict[str, object]:
    result = run_cli(tmp_path, "status", "--json", home=home, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    return json_document(result)


def _ledger_totals(tmp_path: Path, home: Path | None = None, **env: str) -> tuple[int, int]:
    listed = run_cli(tmp_path, "ledger", "streams", "--all", "--json", home=home, **env)
    rows = json_document(listed)["streams"]
    assert isinstance(rows, list)
    return len(rows), sum(int(row["size"]) for row in rows)


def test_status_counts_workflows_approvals_and_the_ledger(tmp_path: Path) -> None:
    """Workflows by state, approvals by recorded status, streams and events, a mark in step."""
    home = tmp_path / "home"
    populate(home)
    document = _status(tmp_path, home)
    assert document["workflows_by_state"] == WORKFLOWS_BY_STATE
    assert (document["approvals_pending"], document["approvals_expired"]) == (2, 0)
    streams, events = _ledger_totals(tmp_path, home)
    assert (document["ledger_streams"], document["ledger_events"]) == (streams, events)
    assert document["high_water_state"] == "ok"
    assert document["high_water_lag_commits"] == 0
    assert document["commit_count"] == document["high_water_commit_count"]
    assert isinstance(document["commit_count"], int)
    assert document["commit_count"] > 0

    expired = run_cli(tmp_path, "approvals", "expire", home=home)
    assert expired.returncode == 0, expired.stderr
    after = _status(tmp_path, home)
    assert (after["approvals_pending"], after["approvals_expired"]) == (1, 1)
    assert after["ledger_events"] > events  # type: ignore[operator]

    human = run_cli(tmp_path, "status", home=home).stdout
    assert "workflows by state: intake 2, planning 1" in human
    assert "approvals pending: 1" in human
    assert "approvals expired: 1" in human
    assert "high-water mark: ok, lag 0 commit(s)" in human
    assert "busy timeout: 30 s" in human


def test_status_shows_a_restored_copy_as_negative_lag(tmp_path: Path) -> None:
    """A copy put back over newer commits is below the mark: rolled_back, lag below zero."""
    home = tmp_path / "home"
    populate(home)
    data = Settings(backend="sqlite", home=home).data_dir
    shutil.copytree(data, tmp_path / "older")
    assert run_cli(tmp_path, "approvals", "expire", home=home).returncode == 0
    shutil.rmtree(data)
    shutil.copytree(tmp_path / "older", data)
    document = _status(tmp_path, home)
    assert document["high_water_state"] == "rolled_back"
    lag = document["high_water_lag_commits"]
    assert isinstance(lag, int)
    assert lag < 0
    assert document["workflows_by_state"] == WORKFLOWS_BY_STATE


def test_status_without_the_key_still_counts_and_creates_no_key(tmp_path: Path) -> None:
    """Without a key the mark cannot be read (no_key, lag null); every count is still shown."""
    home = tmp_path / "home"
    populate(home)
    key_file = Settings(backend="sqlite", home=home).key_path
    key_file.rename(tmp_path / "kept.key")
    document = _status(tmp_path, home)
    assert document["high_water_state"] == "no_key"
    assert document["high_water_lag_commits"] is None
    assert document["workflows_by_state"] == WORKFLOWS_BY_STATE
    assert document["approvals_pending"] == 2
    assert not key_file.exists()


def test_status_on_a_cold_root_is_as_before(tmp_path: Path) -> None:
    """A cold root: cold_root true, zero counts, no mark state, and nothing created."""
    document = _status(tmp_path, tmp_path / "absent")
    assert document["cold_root"] is True
    assert document["ledger_streams"] == 0
    assert document["workflows_by_state"] == []
    assert document["high_water_state"] is None
    assert not (tmp_path / "absent").exists()


@pytest.mark.postgres
def test_status_activity_on_postgres(tmp_path: Path, postgres_server, pg_schema: str) -> None:
    """The same counts come from a PostgreSQL store."""
    key = generate_master_key()
    settings = Settings(
        backend="postgres", postgres_dsn=postgres_server.dsn, postgres_schema=pg_schema
    )
    populate(None, settings, key)
    env = {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": pg_schema,
        "FLOWVAULT_KEY": encode_master_key(key),
    }
    document = _status(tmp_path, **env)
    assert document["backend"] == "postgres"
    assert document["workflows_by_state"] == WORKFLOWS_BY_STATE
    assert (document["approvals_pending"], document["approvals_expired"]) == (2, 0)
    assert (document["ledger_streams"], document["ledger_events"]) == _ledger_totals(
        tmp_path, **env
    )
    assert document["durability"] == {"statement_timeout_s": 30, "lock_timeout_s": 10}
    assert isinstance(document["commit_count"], int)
    assert document["high_water_state"] in {"ok", "not_started"}
