"""The composition root: settings from the environment, selection, overrides, logging."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dependency_injector import providers
from log_capture import reset_flowvault_logging

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.system import RandomIdFactory, SystemClock
from flowvault.application import SecureObjectStore, UnitOfWork
from flowvault.application._high_water_store import HighWaterStore
from flowvault.application._observability import EventLog
from flowvault.application.testing import FrozenClock, SequentialIds, make_upsert
from flowvault.composition import Settings, bootstrap, build_container, configure_logging
from flowvault.domain import InvalidInput, StoreUnavailable


def test_settings_read_the_prefixed_environment() -> None:
    """FLOWVAULT_* variables become settings; others are ignored; paths keep their case."""
    settings = Settings.from_env(
        {
            "FLOWVAULT_BACKEND": "Memory",
            "FLOWVAULT_LOG_LEVEL": "DEBUG",
            "FLOWVAULT_HOME": "/Srv/Vault",
            "FLOWVAULT_SYNCHRONOUS": "NORMAL",
            "FLOWVAULT_BUSY_TIMEOUT": "2.5",
            "FLOWVAULT_ALLOW_INSECURE_PERMISSIONS": "true",
            "HOME": "/x",
        }
    )
    assert settings.backend == "memory"
    assert settings.log_level == "debug"
    assert settings.home == Path("/Srv/Vault")
    assert settings.database_path == Path("/Srv/Vault/data/flowvault.db")
    assert settings.keys_dir == Path("/Srv/Vault/keys")
    assert (settings.synchronous, settings.busy_timeout) == ("normal", 2.5)
    assert settings.allow_insecure_permissions is True


def test_settings_default_to_sqlite_in_the_user_data_dir() -> None:
    """Without variables the backend is SQLite under the XDG data home."""
    settings = Settings.from_env({"XDG_DATA_HOME": "/data/alice"})
    assert settings.backend == "sqlite"
    assert settings.home == Path("/data/alice/flowvault")
    assert settings.synchronous == "full"
    assert settings.busy_timeout == 30.0


def test_settings_never_show_the_key() -> None:
    """FLOWVAULT_KEY is kept as a secret: absent from repr, str and errors."""
    secret = "S3cr3tK3yMaterial-not-base64-but-private"
    settings = Settings.from_env({"FLOWVAULT_KEY": secret})
    assert secret not in repr(settings) + str(settings)
    with pytest.raises(InvalidInput) as caught:
        Settings.from_env({"FLOWVAULT_KEY": secret, "FLOWVAULT_BUSY_TIMEOUT": "-1"})
    assert secret not in str(caught.value)


@pytest.mark.parametrize(
    "environ",
    [
        {"FLOWVAULT_BACKEND": "oracle"},
        {"FLOWVAULT_BAKCEND": "memory"},
        {"FLOWVAULT_LOG_LEVEL": "x"},
    ],
)
def test_bad_settings_are_refused_by_name(environ: dict[str, str]) -> None:
    """Unknown values and misspelt variables fail with the variable named."""
    with pytest.raises(InvalidInput) as caught:
        Settings.from_env(environ)
    assert "FLOWVAULT_" in str(caught.value)


def test_container_selects_the_memory_backend() -> None:
    """The memory backend is a singleton store that satisfies the port."""
    container = build_container(Settings(backend="memory"))
    store = container.store()
    assert isinstance(store, InMemorySecureObjectStore)
    assert isinstance(store, SecureObjectStore)
    assert container.store() is store
    assert isinstance(container.clock(), SystemClock)
    assert isinstance(container.ids(), RandomIdFactory)


def test_container_reads_the_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without explicit settings the container reads FLOWVAULT_* variables."""
    monkeypatch.setenv("FLOWVAULT_LOG_FORMAT", "json")
    assert build_container().settings().log_format == "json"


def test_host_overrides_a_provider_with_its_own_adapter() -> None:
    """A host's own adapter replaces the selected one through override()."""
    container = build_container(Settings(backend="memory"))
    mine = InMemorySecureObjectStore()
    with container.store.override(providers.Object(mine)):
        assert container.store() is mine
    assert container.store() is not mine


def test_bootstrap_keeps_ports_the_host_passes() -> None:
    """The plain factory wires defaults and keeps explicitly passed ports."""
    clock, ids = FrozenClock(), SequentialIds()
    with bootstrap(Settings(backend="memory"), clock=clock, ids=ids, create=True) as runtime:
        assert runtime.clock is clock
        assert runtime.ids is ids
        runtime.store.commit(UnitOfWork(upserts=[make_upsert("ns", "a")]))
        assert runtime.store.load("ns", make_upsert("ns", "a").header.key_digest) is not None


def test_a_store_passed_to_bootstrap_is_the_hosts_to_guard_and_closes_with_it(
    tmp_path: Path,
) -> None:
    """``bootstrap(store=...)`` keeps no high-water mark; leaving the block closes the store."""
    mine = InMemorySecureObjectStore()
    settings = Settings(home=tmp_path, backend="memory", high_water_file=tmp_path / "mark")
    with bootstrap(settings, key=b"k" * 32, store=mine) as runtime:
        assert runtime.mark is None
        assert runtime.store is mine
    with pytest.raises(StoreUnavailable):
        mine.load("ns", "k")


def test_a_store_put_in_the_container_keeps_the_high_water_mark(tmp_path: Path) -> None:
    """Overriding the container's store provider keeps the mark the settings name."""
    mine = InMemorySecureObjectStore()
    settings = Settings(home=tmp_path, backend="memory", high_water_file=tmp_path / "mark")
    container = build_container(settings, key=b"k" * 32)
    with container.store.override(providers.Object(mine)):
        guarded = container.guarded_store()
        assert isinstance(guarded, HighWaterStore)
        assert container.rollback_guard() is not None
    unguarded = build_container(Settings(home=tmp_path, backend="memory"), key=b"k" * 32)
    with unguarded.store.override(providers.Object(InMemorySecureObjectStore())):
        assert unguarded.rollback_guard() is None


def test_importing_does_not_configure_logging() -> None:
    """Importing every flowvault layer in a fresh interpreter leaves structlog unconfigured."""
    probe = (
        "import structlog, flowvault.domain, flowvault.application, flowvault.adapters.memory,"
        " flowvault.composition; print(structlog.is_configured())"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_configure_logging_writes_json_when_not_a_tty() -> None:
    """Auto format renders JSON lines on a non-terminal stream, filtered by level."""
    stream = io.StringIO()
    try:
        configure_logging("info", "auto", stream)
        log = EventLog("flowvault.test")
        log.debug("hidden")
        log.info("shown", revision=3, api_key="hunter2-secret")
    finally:
        reset_flowvault_logging()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert (record["event"], record["revision"], record["level"]) == ("shown", 3, "info")
    assert record["api_key"] == "[REDACTED]"
    assert "hunter2" not in stream.getvalue()


def test_configure_logging_console_format() -> None:
    """The console format renders readable text, not JSON."""
    stream = io.StringIO()
    try:
        configure_logging("debug", "console", stream)
        EventLog("flowvault.test").debug("plain words")
    finally:
        reset_flowvault_logging()
    assert "plain words" in stream.getvalue()
    assert not stream.getvalue().lstrip().startswith("{")
