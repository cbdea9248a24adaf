"""Restoring an older copy of the database over a live store is refused when it is opened.

Real SQLite files: a copy of the data directory is taken, more is written,
the copy is put back. The mark beside the key file remembers the newer
commit count; the negative control deletes the mark and the same restore
goes unnoticed. PostgreSQL keeps a mark where ``FLOWVAULT_HIGH_WATER_FILE``
says, and a sequence set back stands in for a restored dump.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run
from psycopg import sql
from structlog.testing import capture_logs

from flowvault.adapters.system import MarkFileStore
from flowvault.application import MarkWrite, StoreEpoch, encode_master_key, parse_mark
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


def _mark_epoch(path: Path, runtime: Runtime) -> int:
    state = MarkFileStore(path).read()
    assert state is not None
    return parse_mark(state.head, runtime.repository, "").epoch


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


def _cut_newest_events(database: Path, count: int) -> str:
    """Delete the newest ``count`` events of the longest stream, as an editor without keys could.

    The stream's summary row is moved back to match and the commit count is
    set far above anything written, so the file shows no sign of the cut.
    """
    with closing(sqlite3.connect(database)) as connection, connection:
        stream, head = connection.execute(
            "SELECT stream, max(idx) FROM ledger_events GROUP BY stream ORDER BY 2 DESC LIMIT 1"
        ).fetchone()
        connection.execute(
            "DELETE FROM ledger_events WHERE stream = ? AND idx > ?", (stream, head - count)
        )
        connection.execute(
            "UPDATE ledger_streams SET head_index = ?, head_hash = ("
            "SELECT event_hash FROM ledger_events WHERE stream = ? AND idx = ?) WHERE stream = ?",
            (head - count, stream, head - count, stream),
        )
        connection.execute("UPDATE store_epoch SET epoch = 1000000000")
    return str(stream)


def test_a_restored_copy_with_its_count_raised_is_refused_by_stream_sizes(tmp_path: Path) -> None:
    """Setting the copy's commit count high hides it from the epoch, not from the sizes."""
    settings = _settings(tmp_path / "home")
    _restore_older_copy(settings, tmp_path)
    with closing(sqlite3.connect(settings.database_path)) as connection, connection:
        connection.execute("UPDATE store_epoch SET epoch = 1000000000")
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings)
    details = refused.value.details
    assert details["size"] < details["high_water"]  # type: ignore[operator]
    assert f"ledger stream {details['stream']} holds {details['size']} events" in (
        refused.value.message
    )
    mark = settings.high_water_path
    assert mark is not None
    mark.unlink()
    with bootstrap(settings) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2), (
            "the negative control: without the mark the same copy opens as if current"
        )


def test_events_cut_from_a_stream_are_refused_on_open(tmp_path: Path) -> None:
    """Deleting a stream's newest events, summary row and count made to match, is caught."""
    settings = _settings(tmp_path / "home")
    _write(settings, range(6))
    stream = _cut_newest_events(settings.database_path, 2)
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings)
    assert refused.value.details["stream"] == stream
    assert refused.value.details["high_water"] == refused.value.details["size"] + 2  # type: ignore[operator]
    cli = _run(tmp_path, "workflows", "list", home=settings.home)
    assert cli.returncode == 1
    assert "STORE_ROLLED_BACK" in cli.stderr


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
    with bootstrap(settings) as runtime:
        assert _mark_epoch(mark, runtime) == after


def test_every_commit_advances_the_mark_before_it_returns(tmp_path: Path) -> None:
    """After each acknowledged commit the file already holds the store's count."""
    settings = _settings(tmp_path / "home")
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings) as runtime:
        for step in range(5):
            runtime.state("main").save(WorkflowState(step=step))
            assert _mark_epoch(mark, runtime) == _epoch(runtime)


def test_an_edited_mark_is_refused(tmp_path: Path) -> None:
    """A mark raised by hand (without the key) fails its MAC: INTEGRITY_FAILURE on open."""
    settings = _settings(tmp_path / "home")
    _write(settings, range(2))
    mark = settings.high_water_path
    assert mark is not None
    MarkFileStore(mark).update(
        lambda current: MarkWrite(current.head.replace(b"epoch ", b"epoch 9")) if current else None
    )
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
        assert _mark_epoch(mark, runtime) == _epoch(runtime)
    with postgres_server.admin() as admin:
        admin.execute(f"SELECT setval('\"{pg_schema}\".store_epoch', 1)")
    with pytest.raises(StoreRolledBack):
        bootstrap(settings)
    unguarded = settings.model_copy(update={"high_water_file": None})
    assert unguarded.high_water_path is None
    with bootstrap(unguarded) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=3)
    with postgres_server.admin() as admin:
        admin.execute(f"SELECT setval('\"{pg_schema}\".store_epoch', 1000000000)")
        events = sql.Identifier(pg_schema, "ledger_events")
        stream, head = admin.execute(
            sql.SQL(
                "SELECT stream, max(idx) FROM {} GROUP BY stream ORDER BY 2 DESC LIMIT 1"
            ).format(events)
        ).fetchone()
        admin.execute(
            sql.SQL("DELETE FROM {} WHERE stream = %s AND idx = %s").format(events),
            (stream, head),
        )
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings)
    assert refused.value.details["stream"] == stream, "events cut from a stream, count raised"
