"""Opening a real SQLite vault: where keys come from, and when opening must refuse."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.application import Guard
from flowvault.application._keys import encode_master_key
from flowvault.application.testing import FrozenClock
from flowvault.composition import Settings, bootstrap
from flowvault.domain import InsecurePermissions, IntegrityFailure, InvalidInput, KeyRequired

NS = "orders"


def _settings(home: Path, **extra: object) -> Settings:
    return Settings(backend="sqlite", home=home, **extra)  # type: ignore[arg-type]


def test_first_open_creates_key_and_layout(tmp_path: Path) -> None:
    """A new vault gets a 0600 key file in keys/, apart from the 0600 database in data/."""
    home = tmp_path / "home"
    with bootstrap(_settings(home), create=True) as vault:
        vault.repository.write(NS, "o-1", {"total": 12}, expected=Guard.ABSENT)
    for directory in (home / "data", home / "keys"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for file in (home / "data" / "flowvault.db", home / "keys" / "store.key"):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert not (home / "data" / "flowvault.db-wal").exists()


def test_reopen_reads_with_the_key_file(tmp_path: Path) -> None:
    """A second open finds the key file and reads what the first wrote."""
    with bootstrap(_settings(tmp_path), create=True) as vault:
        vault.repository.write(NS, "o-1", {"total": 12}, expected=Guard.ABSENT)
    with bootstrap(_settings(tmp_path), create=True) as vault:
        opened = vault.repository.read(NS, "o-1")
    assert opened is not None
    assert opened.document == {"total": 12}


def test_missing_key_over_existing_data_is_refused(tmp_path: Path) -> None:
    """With data present and the key file gone, opening fails with KEY_REQUIRED and makes no key."""
    with bootstrap(_settings(tmp_path), create=True) as vault:
        vault.repository.write(NS, "o-1", {"total": 12}, expected=Guard.ABSENT)
    key_file = tmp_path / "keys" / "store.key"
    saved = key_file.read_bytes()
    key_file.unlink()
    with pytest.raises(KeyRequired) as caught:
        bootstrap(_settings(tmp_path), create=True)
    assert caught.value.code == "KEY_REQUIRED"
    assert str(key_file) in str(caught.value)
    assert "FLOWVAULT_KEY" in str(caught.value)
    assert not key_file.exists()
    key_file.write_bytes(saved)
    key_file.chmod(0o600)
    with bootstrap(_settings(tmp_path), create=True) as vault:
        assert vault.repository.read(NS, "o-1") is not None


def test_wrong_key_fails_closed_and_leaves_data(tmp_path: Path) -> None:
    """Opening with another key is INTEGRITY_FAILURE naming key ids; the data is untouched."""
    with bootstrap(_settings(tmp_path), create=True) as vault:
        vault.repository.write(NS, "o-1", {"total": 12}, expected=Guard.ABSENT)
        right_id = vault.cipher.primary_key_id
    database = tmp_path / "data" / "flowvault.db"
    before = database.read_bytes()
    wrong = generate_master_key()
    with pytest.raises(IntegrityFailure) as caught:
        bootstrap(_settings(tmp_path), key=wrong, create=True)
    assert right_id in str(caught.value)
    assert encode_master_key(wrong) not in str(caught.value) + repr(caught.value)
    env = {"FLOWVAULT_HOME": str(tmp_path), "FLOWVAULT_KEY": encode_master_key(wrong)}
    with pytest.raises(IntegrityFailure):
        bootstrap(Settings.from_env(env), create=True)
    assert database.read_bytes() == before
    with bootstrap(_settings(tmp_path), create=True) as vault:
        assert vault.repository.read(NS, "o-1") is not None


def test_environment_key_takes_precedence_over_the_file(tmp_path: Path) -> None:
    """FLOWVAULT_KEY is used instead of the key file, and no key file is created for it."""
    key = generate_master_key()
    env = {"FLOWVAULT_HOME": str(tmp_path), "FLOWVAULT_KEY": encode_master_key(key)}
    with bootstrap(Settings.from_env(env), create=True) as vault:
        vault.repository.write(NS, "o-1", {"total": 1}, expected=Guard.ABSENT)
    assert not (tmp_path / "keys" / "store.key").exists()
    with bootstrap(_settings(tmp_path), key=key, create=True) as vault:
        assert vault.repository.read(NS, "o-1") is not None


@pytest.mark.parametrize(
    "value", ["", "short", "A" * 44, "not base64 at all !!!!!!!!!!!!!!!!!!!!!!!!!"]
)
def test_malformed_environment_key_is_a_clear_error(tmp_path: Path, value: str) -> None:
    """A malformed FLOWVAULT_KEY fails with INVALID_INPUT naming the variable, not its value."""
    env = {"FLOWVAULT_HOME": str(tmp_path), "FLOWVAULT_KEY": value}
    with pytest.raises(InvalidInput) as caught:
        bootstrap(Settings.from_env(env), create=True).close()
    assert "FLOWVAULT_KEY" in str(caught.value)
    if value:
        assert value not in str(caught.value)


RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from flowvault.application import Guard
    from flowvault.composition import Settings, bootstrap

    home, name, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    while not go.exists():
        time.sleep(0.001)
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as vault:
        vault.repository.write("race", name, {"by": name}, expected=Guard.ABSENT)
        print(json.dumps({"key_id": vault.cipher.primary_key_id}))
    """
)


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_first_opens_agree_on_one_key(tmp_path: Path, round_: int) -> None:
    """Processes racing to open a new vault end up with one key, and each reads all records."""
    home, go = tmp_path / "home", tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(home), f"p{n}", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    time.sleep(0.3)
    go.touch()
    outputs = [racer.communicate(timeout=60) for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * 4, [err for _, err in outputs]
    assert len({out for out, _ in outputs}) == 1
    assert sorted(os.listdir(home / "keys")) == ["store.high-water", "store.key"]
    with bootstrap(_settings(home), create=True) as vault:
        for n in range(4):
            opened = vault.repository.read("race", f"p{n}")
            assert opened is not None
            assert opened.document == {"by": f"p{n}"}


def test_durability_settings_reach_the_database(tmp_path: Path) -> None:
    """FLOWVAULT_SYNCHRONOUS and FLOWVAULT_BUSY_TIMEOUT are what the open connection uses."""
    env = {
        "FLOWVAULT_HOME": str(tmp_path),
        "FLOWVAULT_SYNCHRONOUS": "normal",
        "FLOWVAULT_BUSY_TIMEOUT": "2.5",
    }
    with bootstrap(Settings.from_env(env), create=True) as vault:
        writer = vault.store._writer.connection  # type: ignore[attr-defined]
        assert writer.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    with bootstrap(_settings(tmp_path), create=True) as vault:
        writer = vault.store._writer.connection  # type: ignore[attr-defined]
        assert writer.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_insecure_home_is_refused_unless_allowed(tmp_path: Path) -> None:
    """A group-writable data directory is refused, and opens with the setting that allows it."""
    with bootstrap(_settings(tmp_path), create=True):
        pass
    (tmp_path / "data").chmod(0o770)
    with pytest.raises(InsecurePermissions) as caught:
        bootstrap(_settings(tmp_path), create=True)
    assert "chmod 700" in str(caught.value)
    env = {"FLOWVAULT_HOME": str(tmp_path), "FLOWVAULT_ALLOW_INSECURE_PERMISSIONS": "true"}
    with bootstrap(Settings.from_env(env), create=True) as vault:
        assert vault.store.peek_metadata(NS, vault.repository.key_digest(NS, "x")) is None


def test_recover_runs_on_open_interrupts_unfinished_runs(tmp_path: Path) -> None:
    """With FLOWVAULT_RECOVER_RUNS_ON_OPEN, opening takes over runs whose lease expired only."""
    clock = FrozenClock(datetime.now(UTC))
    with bootstrap(_settings(tmp_path), create=True, clock=clock) as vault:
        vault.definitions.register_definition("graph.demo", {"nodes": ["a"]})
        run, _ = vault.runs.start_run("graph.demo", {"n": 1})
    with bootstrap(_settings(tmp_path), clock=clock) as vault:
        assert vault.runs.get_run(run.run_id).status == "accepted"
    env = {"FLOWVAULT_HOME": str(tmp_path), "FLOWVAULT_RECOVER_RUNS_ON_OPEN": "true"}
    with bootstrap(Settings.from_env(env), clock=clock) as vault:
        assert vault.runs.get_run(run.run_id).status == "accepted"
    clock.advance(timedelta(seconds=30))
    with bootstrap(Settings.from_env(env), clock=clock) as vault:
        recovered = vault.runs.get_run(run.run_id)
    assert recovered.status == "interrupted_non_resumable"
    assert recovered.owner is not None
    assert recovered.owner != run.owner
