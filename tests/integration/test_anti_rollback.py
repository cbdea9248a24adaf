"""Restoring an older copy of the database over a live store is refused when it is opened.

Real SQLite files: a copy of the data directory is taken, more is written,
the copy is put back. The mark beside the key file remembers the newer
commit count; the negative control deletes the mark and the same restore
goes unnoticed. PostgreSQL keeps each host's mark of each store beside its
key by default, or where ``FLOWVAULT_HIGH_WATER_FILE`` says, and a sequence
set back stands in for a restored dump.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import zlib
from contextlib import closing
from pathlib import Path
from typing import Any, Literal

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run
from log_capture import capture_logs
from mark_lag import settle
from psycopg import sql

from flowvault.adapters.system import MarkFileStore
from flowvault.adapters.system._mark_file import LOG_OFFSET, SLOT_BYTES
from flowvault.application import StoreEpoch
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._keys import encode_master_key
from flowvault.application._mark_format import MarkWrite, parse_mark
from flowvault.application._sealed import CipherDigester
from flowvault.composition import Runtime, Settings, bootstrap, build_container
from flowvault.domain import FlowvaultError, IntegrityFailure, StoreRolledBack, WorkflowState

REFUSALS = {"STORE_ROLLED_BACK", "INTEGRITY_FAILURE"}
MarkSync = Literal["lagged", "strict"]


@pytest.fixture(params=["lagged", "strict"])
def mark_sync(request: pytest.FixtureRequest) -> MarkSync:
    """Both ways of writing the mark: in the background (the default) and before each ack."""
    mode: MarkSync = request.param
    return mode


def _settings(home: Path, mark_sync: MarkSync) -> Settings:
    """SQLite settings; the tests of the mark's bytes pin ``strict``, one log line per commit."""
    return Settings(backend="sqlite", home=home, mark_sync=mark_sync)


def _write(settings: Settings, steps: range) -> None:
    with bootstrap(settings, create=True) as runtime:
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


def test_a_restored_older_copy_is_refused_on_open(tmp_path: Path, mark_sync: MarkSync) -> None:
    """The mark holds the newer count; opening the older copy fails before anything runs."""
    settings = _settings(tmp_path / "home", mark_sync)
    _restore_older_copy(settings, tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    assert mark.parent == settings.keys_dir
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings, create=True)
    assert refused.value.details["epoch"] < refused.value.details["high_water"]  # type: ignore[operator]
    cli = _run(tmp_path, "workflows", "list", home=settings.home)
    assert cli.returncode == 1
    assert "STORE_ROLLED_BACK" in cli.stderr
    assert "flowvault accept-restore" in cli.stderr
    audit = _run(tmp_path, "ledger", "verify", "--all", "--json", home=settings.home)
    assert audit.returncode == 1, "a read-only audit of the restored copy runs and reports it"
    report = _document(audit)
    assert report["failures"] == []
    assert "commit" in str(report["rolled_back"])


def test_without_the_mark_the_same_restore_goes_unseen(tmp_path: Path, mark_sync: MarkSync) -> None:
    """The negative control: the older copy is self-consistent, only the mark knows better."""
    settings = _settings(tmp_path / "home", mark_sync)
    _restore_older_copy(settings, tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    mark.unlink()
    with capture_logs() as logs, bootstrap(settings, create=True) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2)
    assert "high_water_mark_started" in [entry["event"] for entry in logs]


def test_with_the_mark_off_nothing_is_checked_or_written(tmp_path: Path) -> None:
    """``FLOWVAULT_MARK_SYNC=off``: the restored copy opens, the open says so, the mark stays."""
    settings = _settings(tmp_path / "home", "strict")
    _restore_older_copy(settings, tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    kept = mark.read_bytes()
    off = Settings.from_env({"FLOWVAULT_HOME": str(settings.home), "FLOWVAULT_MARK_SYNC": "OFF"})
    assert off.mark_sync == "off"
    with capture_logs() as logs, bootstrap(off, create=True) as runtime:
        assert runtime.mark is None
        assert runtime.state("main").load().state == WorkflowState(step=2)
        runtime.state("main").save(WorkflowState(step=50))
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [
        "high_water_mark_off"
    ]
    assert mark.read_bytes() == kept
    with pytest.raises(StoreRolledBack):
        bootstrap(settings, create=True)


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


def test_a_restored_copy_with_its_count_raised_is_refused_by_stream_sizes(
    tmp_path: Path, mark_sync: MarkSync
) -> None:
    """Setting the copy's commit count high hides it from the epoch, not from the sizes."""
    settings = _settings(tmp_path / "home", mark_sync)
    _restore_older_copy(settings, tmp_path)
    with closing(sqlite3.connect(settings.database_path)) as connection, connection:
        connection.execute("UPDATE store_epoch SET epoch = 1000000000")
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings, create=True)
    details = refused.value.details
    assert details["size"] < details["high_water"]  # type: ignore[operator]
    assert f"ledger stream {details['stream']} holds {details['size']} events" in (
        refused.value.message
    )
    mark = settings.high_water_path
    assert mark is not None
    mark.unlink()
    with bootstrap(settings, create=True) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2), (
            "the negative control: without the mark the same copy opens as if current"
        )


def test_events_cut_from_a_stream_are_refused_on_open(tmp_path: Path, mark_sync: MarkSync) -> None:
    """Deleting a stream's newest events, summary row and count made to match, is caught."""
    settings = _settings(tmp_path / "home", mark_sync)
    _write(settings, range(6))
    stream = _cut_newest_events(settings.database_path, 2)
    with pytest.raises(StoreRolledBack) as refused:
        bootstrap(settings, create=True)
    assert refused.value.details["stream"] == stream
    assert refused.value.details["high_water"] == refused.value.details["size"] + 2  # type: ignore[operator]
    cli = _run(tmp_path, "workflows", "list", home=settings.home)
    assert cli.returncode == 1
    assert "STORE_ROLLED_BACK" in cli.stderr
    verify = _run(tmp_path, "ledger", "verify", "--all", "--json", home=settings.home)
    assert verify.returncode == 1, "the chains verify; only the mark shows the cut"
    audit = _document(verify)
    assert audit["ok"] is False
    assert audit["failures"] == []
    assert stream in str(audit["rolled_back"])
    doctor = _run(tmp_path, "doctor", "--json", home=settings.home)
    assert doctor.returncode == 1
    checks = {check["name"]: check for check in _document(doctor)["checks"]}  # type: ignore[union-attr]
    assert checks["store.rollback"]["ok"] is False


def test_accept_restore_reopens_a_deliberately_restored_copy(
    tmp_path: Path, mark_sync: MarkSync
) -> None:
    """accept-restore needs --yes off a terminal, then sets the mark to the copy's count."""
    settings = _settings(tmp_path / "home", mark_sync)
    _restore_older_copy(settings, tmp_path)
    refused = _run(tmp_path, "accept-restore", home=settings.home)
    assert refused.returncode == 1
    assert "--yes" in refused.stderr
    with pytest.raises(StoreRolledBack):
        bootstrap(settings, create=True)
    accepted = _run(tmp_path, "accept-restore", "--yes", "--json", home=settings.home)
    assert accepted.returncode == 0, accepted.stderr
    document = _document(accepted)
    assert isinstance(document["previous"], int)
    assert isinstance(document["epoch"], int)
    assert document["previous"] > document["epoch"]
    with bootstrap(settings, create=True) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2)
        runtime.state("main").save(WorkflowState(step=99))
        after = _epoch(runtime)
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings, create=True) as runtime:
        assert _mark_epoch(mark, runtime) == after


def test_in_the_strict_mode_every_commit_advances_the_mark_before_it_returns(
    tmp_path: Path,
) -> None:
    """After each acknowledged commit the file already holds the store's count."""
    settings = _settings(tmp_path / "home", "strict")
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings, create=True) as runtime:
        for step in range(5):
            runtime.state("main").save(WorkflowState(step=step))
            assert _mark_epoch(mark, runtime) == _epoch(runtime)


def test_by_default_the_mark_trails_the_commits_never_leads_and_close_writes_it(
    tmp_path: Path,
) -> None:
    """Read between commits, the mark is never above the store; it catches up, and at close."""
    settings = _settings(tmp_path / "home", "lagged")
    mark = settings.high_water_path
    assert mark is not None
    with bootstrap(settings, create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=0))
        settle(runtime)
        seen: list[tuple[int, int]] = []
        for step in range(1, 40):
            runtime.state("main").save(WorkflowState(step=step))
            seen.append((_mark_epoch(mark, runtime), _epoch(runtime)))
        assert all(marked <= count for marked, count in seen)
        settle(runtime)
        runtime.state("main").save(WorkflowState(step=99))
        last = _epoch(runtime)
    state = MarkFileStore(mark).read()
    assert state is not None
    assert parse_mark(state.head, runtime.repository, "").epoch == last


def test_an_edited_mark_is_refused(tmp_path: Path, mark_sync: MarkSync) -> None:
    """A mark raised by hand (without the key) fails its MAC: INTEGRITY_FAILURE on open."""
    settings = _settings(tmp_path / "home", mark_sync)
    _write(settings, range(2))
    mark = settings.high_water_path
    assert mark is not None
    MarkFileStore(mark).update(
        lambda current: MarkWrite(current.head.replace(b"epoch ", b"epoch 9")) if current else None
    )
    with pytest.raises(IntegrityFailure, match="high-water mark"):
        bootstrap(settings, create=True)


def _put_back(copy: Path, data_dir: Path) -> None:
    shutil.rmtree(data_dir)
    shutil.copytree(copy, data_dir)


def _last_commit(settings: Settings, tmp_path: Path) -> tuple[bytes, bytes]:
    """Commit three times, copy the data directory to ``before``, commit once more.

    Returns the mark's bytes before and after that last commit; the data
    directory after it is copied to ``after``.
    """
    mark = settings.high_water_path
    assert mark is not None
    _write(settings, range(3))
    shutil.copytree(settings.data_dir, tmp_path / "before")
    before = mark.read_bytes()
    _write(settings, range(3, 4))
    shutil.copytree(settings.data_dir, tmp_path / "after")
    return before, mark.read_bytes()


def _open_code(settings: Settings) -> str:
    """Bootstrap ``settings``; return the error code, or ``opened``."""
    try:
        bootstrap(settings, create=True).close()
    except FlowvaultError as exc:
        return exc.code
    return "opened"


def _refused(verdict: str) -> bool:
    return all(code in REFUSALS for code in verdict.split(" / "))


def _newest_slot(mark: bytes) -> int:
    sequences = [struct.unpack_from(">Q", mark, index * SLOT_BYTES + 4)[0] for index in (0, 1)]
    return sequences.index(max(sequences))


def test_no_flipped_byte_of_the_mark_lets_a_copy_one_commit_older_open(tmp_path: Path) -> None:
    """Every byte of both head slots and the log, flipped in turn, beside a copy one commit older.

    Four commits leave a mark of 1,092 bytes (two 512-byte head slots and a
    68-byte log), and the copy put back is at the count of the head before
    the newest: the one a fallback reaches. Each byte gets a one-bit flip and
    goes through the check every bootstrap runs (the container's guard over
    the restored SQLite files, opened once, since a whole bootstrap per byte
    takes ten times as long); every 32nd byte also goes through a whole
    ``bootstrap``. None opens. Every flip of the newest slot's checked bytes
    or of the line its update appended makes the reader fall back, which
    used to open the copy silently.
    """
    settings = _settings(tmp_path / "home", "strict")
    path = settings.high_water_path
    assert path is not None
    _, pristine = _last_commit(settings, tmp_path)
    _put_back(tmp_path / "before", settings.data_dir)
    assert len(pristine) == 1_092
    newest = _newest_slot(pristine) * SLOT_BYTES
    (length,) = struct.unpack_from(">I", pristine, newest + 12)
    checked = range(newest, newest + 36 + length)
    last_line = range(pristine.rindex(b"\n", LOG_OFFSET, len(pristine) - 1) + 1, len(pristine))
    container = build_container(settings)
    store = container.store()
    guard = container.rollback_guard()
    assert isinstance(guard, AntiRollback)
    assert isinstance(store, StoreEpoch)
    verdicts: dict[int, str] = {}
    fell_back: set[int] = set()
    try:
        head = MarkFileStore(path).read()
        assert head is not None
        digester = CipherDigester(container.cipher())
        assert store.epoch() == parse_mark(head.head, digester, "").epoch - 1
        fd = os.open(path, os.O_RDWR)
        try:
            for offset, byte in enumerate(pristine):
                os.pwrite(fd, bytes([byte ^ (1 << offset % 8)]), offset)
                state = MarkFileStore(path).read()
                if state is not None and state.passed_over:
                    fell_back.add(offset)
                try:
                    guard.check()
                    verdicts[offset] = "opened"
                except FlowvaultError as exc:
                    verdicts[offset] = exc.code
                if offset % 32 == 0:
                    verdicts[offset] += " / " + _open_code(settings)
                if not _refused(verdicts[offset]):
                    path.write_bytes(pristine)
                os.pwrite(fd, bytes([byte]), offset)
        finally:
            os.close(fd)
    finally:
        store.close()
    opened = {offset: verdict for offset, verdict in verdicts.items() if not _refused(verdict)}
    assert opened == {}
    assert len(verdicts) == len(pristine)
    assert set(checked) | set(last_line) <= fell_back
    assert {verdict.split(" / ")[0] for verdict in verdicts.values()} == REFUSALS


def test_a_mark_torn_by_a_crash_after_its_commit_still_opens(tmp_path: Path) -> None:
    """The newest head, or the log line it appended, half written over the mark before it.

    That is what a crash during the mark's update leaves: the commit is in
    the store, only part of the update's bytes reached the disk (past its
    first 100 bytes, the slot still holds the head two updates back; past
    its middle, the line reads as zeros). With the store holding the commit it opens, logs
    ``high_water_mark_torn_head_passed_over`` and writes the mark afresh;
    beside the copy taken before that commit the same torn mark is refused.
    """
    settings = _settings(tmp_path / "home", "strict")
    path = settings.high_water_path
    assert path is not None
    before, after = _last_commit(settings, tmp_path)
    slot = _newest_slot(after) * SLOT_BYTES
    cut = slot + 100
    line = len(before) + (len(after) - len(before)) // 2
    torn = {
        "slot": after[:cut] + before[cut : slot + SLOT_BYTES] + after[slot + SLOT_BYTES :],
        "log line": after[:line] + bytes(len(after) - line),
    }
    refusals = {"slot": IntegrityFailure, "log line": StoreRolledBack}
    for name, mark in torn.items():
        _put_back(tmp_path / "after", settings.data_dir)
        path.write_bytes(mark)
        with capture_logs() as logs, bootstrap(settings, create=True) as runtime:
            assert runtime.state("main").load().state == WorkflowState(step=3), name
            count = _epoch(runtime)
        events = [entry["event"] for entry in logs]
        assert "high_water_mark_torn_head_passed_over" in events, name
        state = MarkFileStore(path).read()
        assert state is not None
        assert state.passed_over == (), f"{name}: the mark was written afresh"
        with bootstrap(settings, create=True) as runtime:
            assert _mark_epoch(path, runtime) == count
        _put_back(tmp_path / "before", settings.data_dir)
        path.write_bytes(mark)
        with pytest.raises(refusals[name]):
            bootstrap(settings, create=True)


def test_an_older_mark_rebuilt_from_the_file_goes_unseen(tmp_path: Path) -> None:
    """A stated limit: whoever can write the mark can put back an older one, unseen.

    The slot framing (sequence, log size, CRCs) carries no MAC, so the head
    before the newest, still in the file, is rebuilt without the key into
    a mark that looks freshly written; beside the copy it counts, that copy
    opens with nothing logged.
    """
    settings = _settings(tmp_path / "home", "strict")
    path = settings.high_water_path
    assert path is not None
    _, after = _last_commit(settings, tmp_path)
    framing = struct.Struct(">4sQIQIII")
    older = (1 - _newest_slot(after)) * SLOT_BYTES
    magic, sequence, length, log_size, *_ = framing.unpack_from(after, older)
    head = after[older + framing.size : older + framing.size + length]
    log = after[LOG_OFFSET : LOG_OFFSET + log_size]
    crc = zlib.crc32(struct.pack(">QQII", sequence, log_size, log_size, zlib.crc32(log)) + head)
    slot = framing.pack(magic, sequence, length, log_size, log_size, zlib.crc32(log), crc) + head
    path.write_bytes(slot.ljust(SLOT_BYTES, b"\0") + bytes(SLOT_BYTES) + log)
    _put_back(tmp_path / "before", settings.data_dir)
    with capture_logs() as logs, bootstrap(settings, create=True) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2)
    assert [entry for entry in logs if entry["log_level"] == "warning"] == []


def test_an_emptied_mark_is_refused_until_the_restore_is_accepted(
    tmp_path: Path, mark_sync: MarkSync
) -> None:
    """A 0-byte mark beside a store holding commits is no missing mark; accept-restore clears it."""
    settings = _settings(tmp_path / "home", mark_sync)
    _restore_older_copy(settings, tmp_path)
    mark = settings.high_water_path
    assert mark is not None
    mark.write_bytes(b"")
    with pytest.raises(IntegrityFailure, match="is empty but the store holds"):
        bootstrap(settings, create=True)
    cli = _run(tmp_path, "workflows", "list", home=settings.home)
    assert cli.returncode == 1
    assert "INTEGRITY_FAILURE" in cli.stderr
    assert "flowvault accept-restore" in cli.stderr
    accepted = _run(tmp_path, "accept-restore", "--yes", "--json", home=settings.home)
    assert accepted.returncode == 0, accepted.stderr
    document = _document(accepted)
    assert document["previous"] is None
    assert isinstance(document["epoch"], int)
    with bootstrap(settings, create=True) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=2)
        assert _mark_epoch(mark, runtime) == document["epoch"]


@pytest.mark.postgres
def test_postgres_keeps_a_mark_where_the_host_names_it(
    tmp_path: Path, postgres_server: Any, pg_schema: str, mark_sync: MarkSync
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
        mark_sync=mark_sync,
    )
    assert settings.high_water_path == mark
    with bootstrap(settings, create=True) as runtime:
        for step in range(4):
            runtime.state("main").save(WorkflowState(step=step))
        count = _epoch(runtime)
    assert _mark_epoch(mark, runtime) == count
    with postgres_server.admin() as admin:
        admin.execute(f"SELECT setval('\"{pg_schema}\".store_epoch', 1)")
    with pytest.raises(StoreRolledBack):
        bootstrap(settings, create=True)
    unguarded = settings.model_copy(update={"high_water_file": None})
    assert unguarded.high_water_path not in {None, mark}, "a mark of its own, never written"
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
        bootstrap(settings, create=True)
    assert refused.value.details["stream"] == stream, "events cut from a stream, count raised"


def _pg_host(home: Path, postgres_server: Any, schema: str, key: bytes) -> Settings:
    """One host of a shared PostgreSQL store: its own home, the default mark, the shared key."""
    return Settings(
        backend="postgres",
        home=home,
        postgres_dsn=postgres_server.dsn,
        postgres_schema=schema,
        key=encode_master_key(key),
    )


def _save(settings: Settings, step: int) -> int:
    """Save one step as ``settings``' host and return the store's count after it."""
    with bootstrap(settings) as runtime:
        runtime.state("main").save(WorkflowState(step=step))
        return _epoch(runtime)


@pytest.mark.postgres
def test_every_postgres_host_that_saw_the_newer_state_refuses_a_restore_by_default(
    tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """Two hosts write one schema, each marking what it saw; a restore is refused by both.

    Each host's mark trails what the other committed, which it must not
    refuse; a host that last opened the store before the newer state, and
    a new one, trust what they find; accept-restore lets one host proceed.
    """
    key = bytes(range(96, 128))
    first = _pg_host(tmp_path / "first", postgres_server, pg_schema, key)
    second = _pg_host(tmp_path / "second", postgres_server, pg_schema, key)
    assert first.high_water_file is None
    assert second.high_water_file is None
    with bootstrap(first, create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=0))
    early = _pg_host(tmp_path / "early", postgres_server, pg_schema, key)
    _save(early, 1)
    older = _save(second, 1)
    _save(first, 2)
    _save(second, 3)
    newest = _save(first, 4)
    first_mark, second_mark = first.high_water_path, second.high_water_path
    assert first_mark is not None
    assert second_mark is not None
    with bootstrap(first) as runtime:
        assert _mark_epoch(first_mark, runtime) >= newest
        assert older < _mark_epoch(second_mark, runtime) < newest, "behind the other host"
    with postgres_server.admin() as admin:
        admin.execute(f"SELECT setval('\"{pg_schema}\".store_epoch', {older})")
    for host in (first, second):
        with pytest.raises(StoreRolledBack):
            bootstrap(host)
    for unaware in (early, _pg_host(tmp_path / "fresh", postgres_server, pg_schema, key)):
        with bootstrap(unaware) as runtime:
            assert runtime.state("main").load().state == WorkflowState(step=4)
    env = {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": pg_schema,
        "FLOWVAULT_KEY": encode_master_key(key),
    }
    accepted = _run(tmp_path, "accept-restore", "--yes", "--json", home=first.home, **env)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert _document(accepted)["mark"] == str(first_mark)
    _save(first, 5)
    with pytest.raises(StoreRolledBack):
        bootstrap(second)


def test_a_postgres_mark_is_named_from_the_store_not_the_password(tmp_path: Path) -> None:
    """Password and connection options keep the name; another schema or database changes it."""

    def mark(dsn: str, schema: str = "flowvault") -> Path | None:
        settings = Settings(
            backend="postgres", home=tmp_path, postgres_dsn=dsn, postgres_schema=schema
        )
        return settings.high_water_path

    base = mark("postgresql://app@db.internal:5432/vault")
    assert base is not None
    assert base.parent == tmp_path / "keys"
    assert "s3cret" not in str(mark("postgresql://app:s3cret@db.internal:5432/vault"))
    assert mark("postgresql://app:s3cret@db.internal:5432/vault?sslmode=require") == base
    assert mark("host=db.internal port=5432 dbname=vault user=app") == base
    assert mark("postgresql://app@db.internal:5432/vault", "other") != base
    assert mark("postgresql://app@db.internal:5432/archive") != base
    assert mark("postgresql://app@replica.internal:5432/vault") != base
