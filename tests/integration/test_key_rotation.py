"""Key rotation over real stores: beside a live writer, and killed and resumed.

Rotation re-seals every record still under an older key onto the primary key,
in batches guarded by the revisions it read. What must hold whatever runs
beside it: no acknowledged write is lost or overwritten by a re-seal, every
record ends under the primary key at the revision it had, workflows (whose
rows must agree with their documents' versions) still read, and the old key
can then be retired without anything becoming unreadable. A rotation killed
part-way leaves a consistent store that the next run finishes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, TIMEOUT, cli_env, json_document, run_cli

from flowvault.adapters.crypto import FileKeyStore
from flowvault.adapters.crypto._cipher import derive_integrity_key, generate_master_key, key_id_of
from flowvault.application import Delete, Guard, StoreStats, UnitOfWork
from flowvault.application._keys import KeyRing
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application._rotation import KeyRotation
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import JsonValue, RevisionConflict, WorkflowRecord, WorkOrder

NS = "rotation"
RECORDS = 10_000
FILL_UNIT = 500
WRITER_EVERY = 10
"""The writer updates every tenth record: a thousand records spread over the key space."""
WRITER_PAUSE = 0.002
"""Seconds the writer waits between writes, so the rotation it races gets the CPU too."""
CRASH_RECORDS = 3_000
PROGRESS = re.compile(r"^re-sealed: (\d+)/(\d+)$")

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _key(number: int) -> str:
    return f"r{number:05d}"


def _original(number: int) -> dict[str, JsonValue]:
    return {"doc": number, "writer": 0}


def _fill(runtime: Runtime, count: int) -> None:
    """Write ``count`` records under the runtime's primary key, a few hundred per unit."""
    for start in range(0, count, FILL_UNIT):
        upserts = [
            runtime.repository.prepare(NS, _key(n), _original(n), expected=Guard.ABSENT)
            for n in range(start, min(start + FILL_UNIT, count))
        ]
        runtime.store.commit(UnitOfWork(upserts=upserts))


def _key_ids(runtime: Runtime) -> dict[str, int]:
    store = runtime.store
    assert isinstance(store, StoreStats)
    return dict(store.key_id_counts())


def _ring_file(settings: Settings) -> FileKeyStore:
    return FileKeyStore(settings.keys_dir, file_name=settings.key_path.name)


def _add_key(settings: Settings) -> tuple[str, str]:
    """Make a new primary key as ``keys add`` does; return (old key id, new key id)."""
    keys = _ring_file(settings)
    ring = keys.read_ring()
    assert ring is not None
    added = ring.promote(
        generate_master_key(), integrity=ring.integrity or derive_integrity_key(ring.primary)
    )
    keys.replace_ring(added, expected=ring)
    return key_id_of(ring.primary), key_id_of(added.primary)


def _retire(settings: Settings, runtime: Runtime, key_id: str) -> KeyRing:
    """Drop ``key_id`` from the ring as ``keys retire`` does, once no record uses it."""
    assert _key_ids(runtime).get(key_id, 0) == 0
    keys = _ring_file(settings)
    ring = keys.read_ring()
    assert ring is not None
    (old,) = [key for key in ring.previous if key_id_of(key) == key_id]
    retired = ring.without(old)
    keys.replace_ring(retired, expected=ring)
    return retired


@pytest.fixture(params=BACKENDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Provide settings for a fresh store: a SQLite home, or a PostgreSQL schema and a ring file.

    PostgreSQL never invents a key, so its ring lives in a 0600 file in a 0700
    directory named by the key-file setting, as every host sharing the store
    would have it.
    """
    home = tmp_path / "home"
    if request.param == "sqlite":
        return Settings(backend="sqlite", home=home)
    server = request.getfixturevalue("postgres_server")
    schema = request.getfixturevalue("pg_schema")
    keys_dir = tmp_path / "ring"
    keys_dir.mkdir(mode=0o700)
    keys_dir.chmod(0o700)
    FileKeyStore(keys_dir, file_name="ring.key").create(generate_master_key())
    assert (keys_dir / "ring.key").stat().st_mode & 0o777 == 0o600
    return Settings(
        backend="postgres",
        home=home,
        key_file=keys_dir / "ring.key",
        postgres_dsn=server.dsn,
        postgres_schema=schema,
    )


# -- rotation beside a writer -------------------------------------------------------


def _order(name: str) -> WorkOrder:
    return WorkOrder(
        kind="rotation.test", parameters={"name": name}, requester="tester", idempotency_key=name
    )


def _workflows(runtime: Runtime) -> dict[str, WorkflowRecord]:
    """Create four workflows and move two of them on, so their versions exceed 1."""
    records: dict[str, WorkflowRecord] = {}
    for number in range(4):
        record, created = runtime.workflows.create(_order(f"wf-{number}"))
        assert created
        for version, (source, target) in enumerate(
            [("intake", "planning"), ("planning", "executing")][: number % 3], start=1
        ):
            record = runtime.workflows.transition(
                record.workflow_id, target, expected_state=source, expected_version=version
            )
        records[record.workflow_id] = record
    assert {record.state_version for record in records.values()} == {1, 2, 3}
    return records


@dataclass
class Writer:
    """Updates its records in a loop with exact-revision writes, remembering what was acked."""

    runtime: Runtime
    numbers: list[int]
    stop: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    acked: dict[int, tuple[int, dict[str, JsonValue]]] = field(default_factory=dict)
    """Record number -> (revision, document) of its last acknowledged write."""
    writes: Counter[int] = field(default_factory=Counter)
    acks: int = 0
    """Acknowledged writes so far; an int, so it can be read while the thread runs."""
    conflicts: int = 0
    error: BaseException | None = None

    def run(self) -> None:
        try:
            sequence = 0
            while not self.stop.is_set():
                for number in self.numbers:
                    if self.stop.is_set():
                        break
                    sequence += 1
                    self._update(number, sequence)
                    self.started.set()
                    self.stop.wait(WRITER_PAUSE)
        except BaseException as exc:
            self.error = exc
            self.started.set()

    def _update(self, number: int, sequence: int) -> None:
        repository = self.runtime.repository
        while True:
            current = repository.read(NS, _key(number))
            assert current is not None
            document: dict[str, JsonValue] = {"doc": number, "writer": sequence}
            try:
                written = repository.write(NS, _key(number), document, expected=current.revision)
            except RevisionConflict:
                self.conflicts += 1
                continue
            self.acked[number] = (written.revision, document)
            self.writes[number] += 1
            self.acks += 1
            return


def _check_every_record(runtime: Runtime, writer: Writer, primary: str) -> None:
    """Open all records; each holds the writer's last ack or its original, under ``primary``."""
    for number in range(RECORDS):
        opened = runtime.repository.read(NS, _key(number))
        assert opened is not None, number
        assert opened.metadata.header.key_id == primary, number
        revision, document = writer.acked.get(number, (1, _original(number)))
        assert (opened.revision, opened.document) == (revision, document), number


def _check_listed_key_ids(runtime: Runtime, primary: str) -> None:
    """Page through the namespace's metadata: every row names the primary key."""
    listed, cursor = 0, None
    while True:
        page = runtime.store.list(NS, cursor=cursor, limit=MAX_LIST_LIMIT)
        assert {meta.header.key_id for meta in page.items} <= {primary}
        listed += len(page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert listed == RECORDS


def test_rotation_beside_a_writer_loses_no_update(settings: Settings) -> None:
    """Rotate 10,000 records while a thread keeps updating a thousand of them.

    The writer reads, then writes guarded by the exact revision it read, and
    retries on a conflict; rotation re-seals guarded by the revision it read
    and keeps it. Afterwards nothing is left under the old key, every record
    the writer touched holds its last acknowledged value at revision 1 + its
    acknowledged writes (so no re-seal replaced a write and none added a
    revision), and workflows, whose rows must match their documents'
    versions, still read and move on. Retiring the old key then leaves
    every record readable under a ring holding only the new key.
    """
    started = time.monotonic()
    with bootstrap(settings, create=True) as runtime:
        _fill(runtime, RECORDS)
        workflows = _workflows(runtime)
        old_id = runtime.cipher.primary_key_id
        total = sum(_key_ids(runtime).values())
        assert _key_ids(runtime) == {old_id: total}
    filled = time.monotonic()

    assert _add_key(settings)[0] == old_id
    with bootstrap(settings, create=True) as runtime:
        new_id = runtime.cipher.primary_key_id
        assert new_id != old_id
        assert runtime.cipher.key_ids() == {old_id, new_id}
        rotation = KeyRotation(runtime.repository)
        pending = rotation.pending()
        assert pending == total

        by_digest = sorted(
            range(0, RECORDS, WRITER_EVERY),
            key=lambda n: runtime.repository.key_digest(NS, _key(n)),
            reverse=True,
        )
        writer = Writer(runtime, by_digest)
        thread = threading.Thread(target=writer.run, name="rotation-writer", daemon=True)
        thread.start()
        assert writer.started.wait(TIMEOUT)
        progress: list[tuple[int, int]] = []
        try:
            report = rotation.run(progress=lambda done, of: progress.append((done, of)))
            during = writer.acks
        finally:
            writer.stop.set()
            thread.join(TIMEOUT)
        assert not thread.is_alive()
        assert writer.error is None, repr(writer.error)
        rotated = time.monotonic()

        assert report.primary_key_id == new_id
        assert report.remaining == 0
        assert report.by_key == {new_id: total}
        assert _key_ids(runtime) == {new_id: total}
        assert pending - len(writer.acked) <= report.resealed <= pending
        assert progress
        assert progress[-1][0] == report.resealed
        assert progress[-1][1] <= pending
        assert during > 0
        _check_listed_key_ids(runtime, new_id)
        for number, (revision, document) in writer.acked.items():
            opened = runtime.repository.read(NS, _key(number))
            assert opened is not None
            assert opened.metadata.header.key_id == new_id
            assert (opened.revision, opened.document) == (revision, document), number
            assert revision == 1 + writer.writes[number], number
        for workflow_id, record in workflows.items():
            assert runtime.workflows.get(workflow_id) == record

        _retire(settings, runtime, old_id)

    with bootstrap(settings, create=True) as runtime:
        assert runtime.cipher.key_ids() == {new_id}
        _check_every_record(runtime, writer, new_id)
        for workflow_id, record in workflows.items():
            assert runtime.workflows.get(workflow_id) == record
            assert len(runtime.workflow_events.events(workflow_id)) == record.state_version
        moved = next(record for record in workflows.values() if record.state == "intake")
        after = runtime.workflows.transition(
            moved.workflow_id, "planning", expected_state="intake", expected_version=1
        )
        assert runtime.workflows.get(moved.workflow_id) == after
        assert after.state_version == 2
    done = time.monotonic()
    print(  # shown with -s: where the time goes, and how hard the writer pushed
        f"{settings.backend}: fill {filled - started:.1f}s, rotate {rotated - filled:.1f}s, "
        f"check {done - rotated:.1f}s; resealed {report.resealed}, changed meanwhile "
        f"{report.changed_meanwhile}, writer acks {writer.acks} "
        f"({during} during rotation), conflicts {writer.conflicts}"
    )


def test_a_reseal_never_brings_back_the_content_of_a_deleted_record(tmp_path: Path) -> None:
    """A record deleted and created again meanwhile must not get its old content back.

    This is the step rotation commits for each record: load, re-seal guarded
    by the revision loaded, commit. Revisions restart at 1 when a record is
    created again (as a workflow state is after ``reset-progress``), so the
    exact guard alone cannot tell the new record from the one loaded; the
    re-seal must then be refused, or at least not replace the new content.
    """
    settings = Settings(backend="sqlite", home=tmp_path / "home")
    with bootstrap(settings, create=True) as runtime:
        runtime.repository.write(NS, "reborn", {"v": "before"}, expected=Guard.ABSENT)
    _add_key(settings)
    with bootstrap(settings, create=True) as runtime:
        digest = runtime.repository.key_digest(NS, "reborn")
        loaded = runtime.store.load(NS, digest)
        assert loaded is not None
        reseal = runtime.repository.reseal(loaded)
        assert reseal is not None
        runtime.store.commit(UnitOfWork(deletes=[Delete(NS, digest, expected=1)]))
        runtime.repository.write(NS, "reborn", {"v": "after"}, expected=Guard.ABSENT)
        with contextlib.suppress(RevisionConflict):
            runtime.store.commit(UnitOfWork(upserts=[reseal]))
        current = runtime.repository.read(NS, "reborn")
        assert current is not None
        assert current.document == {"v": "after"}, (
            "a stale re-seal replaced a record created after it was loaded: the deleted "
            "record's content came back and the acknowledged write was lost"
        )


# -- killed and resumed ------------------------------------------------------------------


def _counts_by_header(runtime: Runtime, count: int) -> Counter[str]:
    """Open every record; return how many each key id seals. Each must open."""
    found: Counter[str] = Counter()
    for number in range(count):
        opened = runtime.repository.read(NS, _key(number))
        assert opened is not None, number
        assert (opened.revision, opened.document) == (1, _original(number)), number
        found[opened.metadata.header.key_id] += 1
    return found


def _read_progress(process: subprocess.Popen[str]) -> Iterator[tuple[int, int]]:
    """Yield each ``re-sealed: N/M`` line the rotation writes on stderr, until it ends."""
    assert process.stderr is not None
    for line in process.stderr:
        matched = PROGRESS.match(line.strip())
        if matched:
            yield int(matched[1]), int(matched[2])


def test_a_killed_rotation_leaves_a_consistent_store_and_resumes(tmp_path: Path) -> None:
    """SIGKILL ``rotate-key`` after its first batches; the store stays whole and it resumes.

    Progress is printed after each batch commits, so every record it counted
    is durably under the new key; the rest are still under the old one, and
    all of them open with the ring. Running it again finishes the job.
    """
    home = tmp_path / "home"
    settings = Settings(backend="sqlite", home=home)
    with bootstrap(settings, create=True) as runtime:
        _fill(runtime, CRASH_RECORDS)
        old_id = runtime.cipher.primary_key_id
    added = run_cli(tmp_path, "keys", "add", "--json", home=home)
    assert added.returncode == 0, added.stderr
    new_id = json_document(added)["added"]
    assert isinstance(new_id, str)
    assert new_id != old_id

    process = subprocess.Popen(
        [str(FLOWVAULT), "--home", str(home), "rotate-key", "--batch-size", "50"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path, FLOWVAULT_PROGRESS_INTERVAL="0"),
    )
    watchdog = threading.Timer(TIMEOUT, process.kill)
    watchdog.start()
    try:
        reported = 0
        for done, total in _read_progress(process):
            assert total == CRASH_RECORDS
            if 0 < done < total:
                os.kill(process.pid, signal.SIGKILL)
                reported = done
                break
        process.wait(TIMEOUT)
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert reported > 0, "the rotation printed no progress before it ended"
    assert process.returncode == -signal.SIGKILL, "the rotation ended before it was killed"

    with contextlib.closing(sqlite3.connect(settings.database_path)) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    with bootstrap(settings, create=True) as runtime:
        found = _counts_by_header(runtime, CRASH_RECORDS)
    assert set(found) == {old_id, new_id}
    assert found[new_id] >= reported
    assert found[old_id] > 0
    assert found[old_id] + found[new_id] == CRASH_RECORDS
    print(f"killed after {reported} reported re-sealed; {found[new_id]} were under the new key")

    resumed = run_cli(tmp_path, "rotate-key", "--batch-size", "50", "--json", home=home)
    assert resumed.returncode == 0, resumed.stderr
    report = json_document(resumed)
    assert report["primary_key_id"] == new_id
    assert report["remaining"] == 0
    assert report["resealed"] == found[old_id]
    assert report["by_key"] == [{"key_id": new_id, "records": CRASH_RECORDS}]
    with bootstrap(settings, create=True) as runtime:
        assert _counts_by_header(runtime, CRASH_RECORDS) == {new_id: CRASH_RECORDS}
