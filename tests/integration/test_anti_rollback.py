"""Restoring an older copy of the database over a live store is refused when it is opened.

Real SQLite files: a copy of the data directory is taken, more is written,
the copy is put back. The mark beside the key file remembers the newer
commit count; the negative control deletes the mark and the same restore
goes unnoticed. PostgreSQL keeps a mark where ``FLOWVAULT_HIGH_WATER_FILE``
says, and a sequence set back stands in for a restored dump.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run
from structlog.testing import capture_logs

from flowvault.adapters.system import MarkFileStore
from flowvault.application import StoreEpoch, encode_master_key, parse_mark
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import IntegrityFailure, StoreRolledBack, WorkflowState


def _settings(home: Path) -> Settings:
    return Settings(backend="sqlite", home=home)


def _write(settings: Settings, steps: range) -> None:
    with bootstrap(settings) as runtime:
        for step in steps:
            runtime.state("main").save(WorkflowState(step=step))


def _epoch(runtime: Runtime) -> int:
    store = runtime.store
    assert isinstance(store, StoreEpoch)
    return store.epoch()


def _restore_older_copy(settings: Settings, tmp_path: Path) -> None:
    """Write, copy the data directory, write more, then put the copy back."""
    _write(settings, range(3))
    older = tmp_path / "older-data"
    shutil.copytree(settings.data_dir, older)
    _write(settings, range(3, 8))
    shutil.rmtree(settings.data_dir)
    shutil.copytree(older, settings.data_dir)


def test_a_restored_older_copy_is_refused_on_open(tmp_path: Path) -> None:
    """The mark holds the newer count; opening the older copy fails before anything runs."""
    settings = _settings(tmp_path / "home")
    _restore_older_copy(settings, tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    assert mark.parent == settings.keys_dir
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings)
    assert refused.value.details["epoch"] < refused.value.details["high_water"]  # type: ignore[operator]
    cli = _run(tmp_path, "workflows", "list", home=settings.home)
    assert cli.returncode == 1
    assert "STORE_ROLLED_BACK" in cli.stderr
    assert "flowvault accept-restore" in cli.stderr
    audit = _run(tmp_path, "ledger", "verify", "--all", home=settings.home)
    assert audit.returncode == 0, "a read-only audit of the restored copy still runs"


def test_without_the_mark_the_same_restore_goes_unseen(tmp_path: Path) -> None:
    """The negative control: the older copy is self-consistent, only the mark knows better."""
    settings = _settings(tmp_path / "home")
    _restore_older_copy(settings, tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    mark.unlink()
    with capture_logs() as logs, bootstrap(settings) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2)
    assert "high_water_mark_started" in [entry["event"] for entry in logs]


def test_accept_restore_reopens_a_deliberately_restored_copy(tmp_path: Path) -> None:
    """accept-restore needs --yes off a terminal, then sets the mark to the copy's count."""
    settings = _settings(tmp_path / "home")
    _restore_older_copy(settings, tmp_path)
    refused = _run(tmp_path, "accept-restore", home=settings.home)
    assert refused.returncode == 1
    assert "--yes" in refused.stderr
    with pytest.raises(StoreRolledBack):
        bootstrap(settings)
    accepted = _run(tmp_path, "accept-restore", "--yes", "--json", home=settings.home)
    assert accepted.returncode == 0, accepted.stderr
    document = _document(accepted)
    assert isinstance(document["previous"], int)
    assert isinstance(document["epoch"], int)
    assert document["previous"] > document["epoch"]
    with bootstrap(settings) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2)
        runtime.state("main").save(WorkflowState(step=99))
        after = _epoch(runtime)
    mark = settings.high_water_path
    assert mark is not None
    stored = MarkFileStore(mark).read()
    assert stored is not None
    with bootstrap(settings) as runtime:
        assert parse_mark(stored, runtime.repository, "") == after


def test_every_commit_advances_the_mark_before_it_returns(tmp_path: Path) -> None:
    """After each acknowledged commit the file already holds the store's count."""
    settings = _settings(tmp_path / "home")
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings) as runtime:
        for step in range(5):
            runtime.state("main").save(WorkflowState(step=step))
            stored = MarkFileStore(mark).read()
            assert stored is not None
            assert parse_mark(stored, runtime.repository, "") == _epoch(runtime)


def test_an_edited_mark_is_refused(tmp_path: Path) -> None:
    """A mark raised by hand (without the key) fails its MAC: INTEGRITY_FAILURE on open."""
    settings = _settings(tmp_path / "home")
    _write(settings, range(2))
    mark = settings.high_water_path
    assert mark is not None
    MarkFileStore(mark).update(lambda current: (current or b"").replace(b"epoch ", b"epoch 9"))
    with pytest.raises(IntegrityFailure, match="high-water mark"):
        bootstrap(settings)


@pytest.mark.postgres
def test_postgres_keeps_a_mark_where_the_host_names_it(
    tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """A sequence set back (as a restored dump would) is refused against the host's mark."""
    mark = tmp_path / "marks" / "pg.high-water"
    settings = Settings(
        backend="postgres",
        home=tmp_path / "home",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        key=encode_master_key(bytes(range(64, 96))),
        high_water_file=mark,
    )
    assert settings.high_water_path == mark
    with bootstrap(settings) as runtime:
        for step in range(4):
            runtime.state("main").save(WorkflowState(step=step))
        assert parse_mark(MarkFileStore(mark).read() or b"", runtime.repository, "") == _epoch(
            runtime
        )
    with postgres_server.admin() as admin:
        admin.execute(f"SELECT setval('\"{pg_schema}\".store_epoch', 1)")
    with pytest.raises(StoreRolledBack):
        bootstrap(settings)
    unguarded = settings.model_copy(update={"high_water_file": None})
    assert unguarded.high_water_path is None
    with bootstrap(unguarded) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=3)
