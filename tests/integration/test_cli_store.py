"""The ``flowvault`` verbs init, status and doctor, run as real console-script subprocesses."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, TIMEOUT, cli_env
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.adapters.sqlite._schema import SCHEMA_VERSION
from flowvault.application._keys import encode_master_key
from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState

STATE_NAMESPACE = "flowvault.workflow-state"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _init(tmp_path: Path, home: Path) -> dict[str, object]:
    result = _run(tmp_path, "init", "--json", home=home)
    assert result.returncode == 0, result.stderr
    return _document(result)


def _write_states(home: Path, count: int) -> None:
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        for index in range(count):
            runtime.state(f"scope{index}").save(WorkflowState(step=index))


def _checks(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    checks = _document(result)["checks"]
    assert isinstance(checks, list)
    return {str(check["name"]): check for check in checks}


# -- init ------------------------------------------------------------------------


def test_init_creates_a_private_store_and_key(tmp_path: Path) -> None:
    """Init creates 0700 directories and 0600 files and prints paths and key id, never the key."""
    home = tmp_path / "home"
    result = _run(tmp_path, "init", home=home)
    assert result.returncode == 0, result.stderr
    key_file = home / "keys" / "store.key"
    database = home / "data" / "flowvault.db"
    for directory in (home, home / "data", home / "keys"):
        assert _mode(directory) == 0o700
    assert _mode(database) == 0o600
    assert _mode(key_file) == 0o600
    assert str(database) in result.stdout
    assert f"key file: {key_file} (created)" in result.stdout
    assert "key id: k" in result.stdout
    assert key_file.read_text().strip() not in result.stdout + result.stderr


def test_init_json_names_the_key_id_of_the_key_file(tmp_path: Path) -> None:
    """--json reports one document whose key id is the id of the key written."""
    home = tmp_path / "home"
    document = _init(tmp_path, home)
    assert document["backend"] == "sqlite"
    assert document["key_created"] is True
    assert document["key_file"] == str(home / "keys" / "store.key")
    assert document["location"] == str(home / "data" / "flowvault.db")
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        assert document["key_id"] == runtime.cipher.primary_key_id


def test_init_refuses_an_existing_store_and_changes_nothing(tmp_path: Path) -> None:
    """A second init exits 1 with INVALID_INPUT and leaves the data and the key as they were."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 1)
    key_before = (home / "keys" / "store.key").read_bytes()
    database_before = (home / "data" / "flowvault.db").read_bytes()
    result = _run(tmp_path, "init", home=home)
    assert result.returncode == 1
    assert "INVALID_INPUT" in result.stderr
    assert "already exists" in result.stderr
    assert result.stdout == ""
    assert (home / "keys" / "store.key").read_bytes() == key_before
    assert (home / "data" / "flowvault.db").read_bytes() == database_before
    as_json = _run(tmp_path, "init", "--json", home=home)
    assert as_json.returncode == 1
    error = _document(as_json)["error"]
    assert isinstance(error, dict)
    assert error["code"] == "INVALID_INPUT"


def test_init_refuses_the_memory_backend(tmp_path: Path) -> None:
    """The memory backend has nothing durable to create: init exits 1 and creates nothing."""
    home = tmp_path / "home"
    result = _run(tmp_path, "--backend", "memory", "init", home=home)
    assert result.returncode == 1
    assert "INVALID_INPUT" in result.stderr
    assert "memory" in result.stderr
    assert not home.exists()


# -- status ----------------------------------------------------------------------


def test_status_counts_records_per_namespace_and_key_id(tmp_path: Path) -> None:
    """--json status reports the schema version, counts, files and durability settings."""
    home = tmp_path / "home"
    key_id = _init(tmp_path, home)["key_id"]
    _write_states(home, 3)
    result = _run(tmp_path, "status", "--json", home=home, FLOWVAULT_SYNCHRONOUS="normal")
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["cold_root"] is False
    assert document["backend"] == "sqlite"
    assert document["store_schema_version"] == SCHEMA_VERSION
    assert document["supported_schema_version"] == SCHEMA_VERSION
    assert document["namespaces"] == [{"namespace": STATE_NAMESPACE, "records": 3}]
    assert document["key_ids"] == [{"key_id": key_id, "records": 3}]
    assert document["durability"] == {"synchronous": "normal", "busy_timeout_s": 30}
    files = {str(row["path"]): row["size_bytes"] for row in document["files"]}  # type: ignore[attr-defined]
    database = home / "data" / "flowvault.db"
    assert files[str(database)] == database.stat().st_size
    assert files[str(home / "keys" / "store.key")] == (home / "keys" / "store.key").stat().st_size
    assert files[f"{database}-wal"] is None


def test_status_human_output(tmp_path: Path) -> None:
    """Plain-text status names the backend, schema version, key id and namespace counts."""
    home = tmp_path / "home"
    key_id = str(_init(tmp_path, home)["key_id"])
    _write_states(home, 2)
    result = _run(tmp_path, "status", home=home)
    assert result.returncode == 0, result.stderr
    assert "backend: sqlite" in result.stdout
    assert f"schema version: {SCHEMA_VERSION} " in result.stdout
    assert f"{key_id}\t2" in result.stdout
    assert f"{STATE_NAMESPACE}\t2" in result.stdout
    assert "synchronous: full" in result.stdout


def test_status_needs_no_key_and_creates_none(tmp_path: Path) -> None:
    """Status reads counts only, so it works without the key and never writes one."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 1)
    key_file = home / "keys" / "store.key"
    key_file.unlink()
    result = _run(tmp_path, "status", "--json", home=home)
    assert result.returncode == 0, result.stderr
    assert _document(result)["namespaces"] == [{"namespace": STATE_NAMESPACE, "records": 1}]
    assert not key_file.exists()


def test_status_on_a_cold_root_creates_nothing(tmp_path: Path) -> None:
    """On a cold root status says so, exits 0 and creates no file or directory."""
    home = tmp_path / "absent" / "home"
    result = _run(tmp_path, "status", home=home)
    assert result.returncode == 0, result.stderr
    assert "cold root" in result.stdout
    as_json = _run(tmp_path, "status", "--json", home=home)
    assert as_json.returncode == 0, as_json.stderr
    assert _document(as_json)["cold_root"] is True
    assert not (tmp_path / "absent").exists()
    assert not (tmp_path / "xdg").exists()


# -- doctor ----------------------------------------------------------------------


def test_doctor_passes_on_a_fresh_store(tmp_path: Path) -> None:
    """Every check passes on a store made by init and holding records: exit 0."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 2)
    result = _run(tmp_path, "doctor", "--json", home=home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _document(result)["ok"] is True
    checks = _checks(result)
    assert all(check["ok"] for check in checks.values()), checks
    for name in (
        "permissions.data_dir",
        "permissions.database",
        "permissions.key_file",
        "pragma.journal_mode",
        "pragma.synchronous",
        "pragma.foreign_keys",
        "pragma.secure_delete",
        "pragma.trusted_schema",
        "key.found",
        "key.matches",
        "key.apart",
        "store.rollback",
        "store.integrity",
    ):
        assert name in checks
    human = _run(tmp_path, "doctor", home=home)
    assert human.returncode == 0
    assert human.stdout.rstrip().endswith("healthy")


def test_doctor_finds_a_loosened_data_directory(tmp_path: Path) -> None:
    """A 0770 data directory is an error finding with its chmod fix, and doctor exits 1."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 1)
    (home / "data").chmod(0o770)
    result = _run(tmp_path, "doctor", "--json", home=home)
    assert result.returncode == 1
    checks = _checks(result)
    finding = checks["permissions.data_dir"]
    assert finding["ok"] is False
    assert finding["severity"] == "error"
    assert "0770" in str(finding["finding"])
    assert finding["fix"] == f"chmod 700 {home / 'data'}"
    assert checks["key.matches"]["ok"] is True
    assert _mode(home / "data") == 0o770
    human = _run(tmp_path, "doctor", home=home)
    assert human.returncode == 1
    assert f"fix: chmod 700 {home / 'data'}" in human.stdout


def test_doctor_reports_a_missing_key_as_a_finding(tmp_path: Path) -> None:
    """A missing key file is a key.found finding (not KEY_REQUIRED); no key is created."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 1)
    key_file = home / "keys" / "store.key"
    key_file.unlink()
    result = _run(tmp_path, "doctor", "--json", home=home)
    assert result.returncode == 1
    checks = _checks(result)
    assert checks["key.found"]["ok"] is False
    assert str(key_file) in str(checks["key.found"]["finding"])
    assert checks["key.found"]["fix"]
    assert checks["key.matches"]["ok"] is False
    assert not key_file.exists()


def test_doctor_finds_records_under_another_key(tmp_path: Path) -> None:
    """A FLOWVAULT_KEY that is not the store's key is a key.matches finding."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 1)
    other = encode_master_key(bytes(range(32)))
    result = _run(tmp_path, "doctor", "--json", home=home, FLOWVAULT_KEY=other)
    assert result.returncode == 1
    checks = _checks(result)
    assert checks["key.found"]["ok"] is True
    assert checks["key.matches"]["ok"] is False


def _database(home: Path) -> Path:
    return Settings(backend="sqlite", home=home).database_path


def _copy_database(home: Path, target: Path) -> None:
    source = sqlite3.connect(_database(home))
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()


def test_doctor_finds_a_replayed_row_and_a_restored_copy(tmp_path: Path) -> None:
    """A row put back from an older copy fails store.integrity; the whole copy, store.rollback.

    Both used to leave doctor saying ``healthy``: opening every record
    proves seals, not that the row is the current one, and nothing
    compared the file with the high-water mark.
    """
    home = tmp_path / "home"
    _init(tmp_path, home)
    _write_states(home, 1)
    older = tmp_path / "older.db"
    _copy_database(home, older)
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        runtime.state("scope0").save(WorkflowState(step=7))
    healthy = _checks(_run(tmp_path, "doctor", "--json", home=home))
    assert healthy["store.integrity"]["ok"] is True
    assert healthy["store.rollback"]["ok"] is True

    old = sqlite3.connect(older)
    row = old.execute(
        "SELECT revision, written_at, ledger_index, labels, byte_length, payload_digest, "
        "payload FROM records WHERE namespace = ?",
        (STATE_NAMESPACE,),
    ).fetchone()
    old.close()
    live = sqlite3.connect(_database(home))
    with live:
        live.execute(
            "UPDATE records SET revision = ?, written_at = ?, ledger_index = ?, labels = ?, "
            "byte_length = ?, payload_digest = ?, payload = ? WHERE namespace = ?",
            (*row, STATE_NAMESPACE),
        )
    live.close()
    replayed = _run(tmp_path, "doctor", "--json", home=home)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    checks = _checks(replayed)
    assert checks["store.integrity"]["ok"] is False
    assert "1 record(s) are older than their stream" in str(checks["store.integrity"]["finding"])
    assert checks["store.rollback"]["ok"] is True
    verify = _run(tmp_path, "ledger", "verify", "--all", "--json", home=home)
    assert verify.returncode == 1
    document = _document(verify)
    assert document["ok"] is False
    assert [r["stream"] for r in document["stale_records"]] == ["scope/scope0"]  # type: ignore[union-attr, index]

    shutil.copyfile(older, _database(home))
    for sidecar in ("-wal", "-shm"):
        Path(str(_database(home)) + sidecar).unlink(missing_ok=True)
    restored = _checks(_run(tmp_path, "doctor", "--json", home=home))
    assert restored["store.rollback"]["ok"] is False
    assert restored["store.rollback"]["severity"] == "error"
    assert "accept-restore" in str(restored["store.rollback"]["fix"])


def test_doctor_on_a_cold_root_reports_no_store(tmp_path: Path) -> None:
    """On a cold root doctor reports 'no store', exits 1 and creates nothing."""
    home = tmp_path / "absent" / "home"
    result = _run(tmp_path, "doctor", "--json", home=home)
    assert result.returncode == 1
    checks = _checks(result)
    assert list(checks) == ["store"]
    assert "no store" in str(checks["store"]["finding"])
    assert not (tmp_path / "absent").exists()


# -- help ------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["init", "status", "doctor"])
def test_help_exits_zero_with_exit_codes(tmp_path: Path, verb: str) -> None:
    """--help exits 0, mentions --json and documents the exit statuses."""
    result = _run(tmp_path, verb, "--help")
    assert result.returncode == 0
    assert "--json" in result.stdout
    assert "exit codes" in result.stdout


# -- PostgreSQL ------------------------------------------------------------------


@pytest.mark.postgres
def test_status_on_postgres(tmp_path: Path, postgres_server, pg_schema: str) -> None:
    """Status against PostgreSQL reports the backend, its schema and the counts."""
    from flowvault.adapters.crypto._cipher import generate_master_key  # noqa: PLC0415

    dsn = postgres_server.dsn
    key = generate_master_key()
    settings = Settings(backend="postgres", postgres_dsn=dsn, postgres_schema=pg_schema)
    with bootstrap(settings, key=key, create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=1))
        key_id = runtime.cipher.primary_key_id
    result = _run(
        tmp_path,
        "status",
        "--json",
        FLOWVAULT_BACKEND="postgres",
        FLOWVAULT_POSTGRES_DSN=dsn,
        FLOWVAULT_POSTGRES_SCHEMA=pg_schema,
        FLOWVAULT_KEY=encode_master_key(key),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = _document(result)
    assert document["backend"] == "postgres"
    assert document["location"] == f"postgres schema {pg_schema}"
    assert document["namespaces"] == [{"namespace": STATE_NAMESPACE, "records": 1}]
    assert document["key_ids"] == [{"key_id": key_id, "records": 1}]
    assert isinstance(document["store_schema_version"], int)


@pytest.mark.parametrize("verb", [["status"], ["status", "--json"]])
def test_a_reader_that_stops_early_ends_the_output_quietly(tmp_path: Path, verb: list[str]) -> None:
    """``flowvault ... | head``: the rest is dropped, no traceback, exit status 141 (SIGPIPE)."""
    home = tmp_path / "home"
    _init(tmp_path, home)
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [str(FLOWVAULT), "--home", str(home), *verb],
            stdout=writer,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=cli_env(tmp_path),
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (141, "")
    assert _run(tmp_path, *verb, home=home).returncode == 0, "the same verb still runs"
