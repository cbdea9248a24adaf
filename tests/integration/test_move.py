"""Moving a whole store: SQLite to PostgreSQL and back, through an archive, and interrupted.

The source holds every record kind (``every_kind.populate``: a signed
decision, a trimmed stream and a retention tombstone among them) and
records sealed under two keys of a rotated ring. After each move the target must
read back row for row equal to the source (sealed bytes, headers, labels,
events from the first retained index, seal counts, commit count), answer
the same through the services, and pass the keyed audit ``ledger verify
--all`` runs. A tampered archive and an interrupted move must leave the
target without a row.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import psycopg
import pytest
from cli_helpers import FLOWVAULT, TIMEOUT, cli_env, json_document, run_cli
from every_kind import SCOPE, Written, populate, service_reads

from flowvault.adapters.crypto import AesGcmCipher, FileKeyStore
from flowvault.adapters.crypto._cipher import derive_integrity_key, generate_master_key
from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.postgres import _commit as postgres_commit
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite import _store as sqlite_store
from flowvault.application import (
    Guard,
    LedgerAudit,
    SecureObjectStore,
    StoreContents,
    StoreStats,
    TagFilter,
)
from flowvault.application._archive import MANIFEST, decode_archive, encode_archive
from flowvault.application._keys import KeyRing
from flowvault.application._sealed import CipherDigester
from flowvault.application._transfer import (
    EVENTS_PART,
    RECORDS_PART,
    fill_verified,
    read_contents,
)
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    IntegrityFailure,
    StoreNotEmpty,
    StoreUnavailable,
    WorkflowState,
    WorkOrder,
)
from flowvault.domain._canonical import canonical_bytes, parse_canonical

pytestmark = pytest.mark.postgres


def _sqlite(home: Path, key_file: Path | None = None) -> Settings:
    return Settings(backend="sqlite", home=home, key_file=key_file)


def _postgres(dsn: str, schema: str, key_file: Path) -> Settings:
    return Settings(
        backend="postgres",
        home=key_file.parent.parent,
        key_file=key_file,
        postgres_dsn=dsn,
        postgres_schema=schema,
    )


def _rotate(settings: Settings) -> None:
    """Add a new primary key to the ring, as ``keys add`` does."""
    keys = FileKeyStore(settings.keys_dir, file_name=settings.key_path.name)
    ring = keys.read_ring()
    assert ring is not None
    added = ring.promote(
        generate_master_key(), integrity=ring.integrity or derive_integrity_key(ring.primary)
    )
    keys.replace_ring(added, expected=ring)


def _keyed_home(source: Settings, home: Path) -> Settings:
    """Return the settings of the SQLite home ``home`` after copying the source's key file in.

    A move copies no key: the operator gives the target the source's.
    """
    keys = home / "keys"
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    copied = keys / source.key_path.name
    copied.write_bytes(source.key_path.read_bytes())
    copied.chmod(0o600)
    return _sqlite(home)


def _ring(settings: Settings) -> KeyRing:
    ring = FileKeyStore(settings.keys_dir, file_name=settings.key_path.name).read_ring()
    assert ring is not None
    return ring


@pytest.fixture
def source(tmp_path: Path) -> tuple[Settings, Written, dict[str, object]]:
    """Return a SQLite store of every kind, sealed under two keys, and what its services read."""
    settings = _sqlite(tmp_path / "source")
    with bootstrap(settings, create=True) as runtime:
        written = populate(runtime)
    _rotate(settings)
    with bootstrap(settings, create=True) as runtime:
        runtime.workflows.create(
            WorkOrder(kind="move.test", parameters={}, requester="t", idempotency_key="late")
        )
        repository = runtime.repository
        tags = {repository.keyed_digest("move.tag", f"colour={n}") for n in range(3)}
        repository.write(TAGGED, "t-1", {"v": 1}, expected=Guard.ABSENT, tags=tags)
        stats = runtime.capabilities.stats
        assert stats is not None
        assert len(stats.key_id_counts()) == 2
        reads = service_reads(runtime, written)
    assert reads["signed"], "the fixture holds a signed decision"
    return settings, written, reads


TAGGED = "host.tagged"
"""A host's namespace holding a record with tags, which every move must carry."""


def _raw(store: SecureObjectStore) -> StoreContents:
    return read_contents(store)


def _audit_clean(runtime: Runtime) -> None:
    report = runtime.audit().run()
    assert report.ok, report
    assert report.unreadable_count == 0


def _same_rows(left: StoreContents, right: StoreContents) -> None:
    assert left.records == right.records
    assert all(len(tags) == 3 for tags in _tags_in(left))
    assert left.events == right.events
    assert dict(left.seal_counts) == dict(right.seal_counts)
    assert left.epoch == right.epoch


def _tags_in(contents: StoreContents) -> list[frozenset[str]]:
    """Return the tags of the host's tagged records in ``contents``."""
    return [r.metadata.tags for r in contents.records if r.metadata.namespace == TAGGED]


def test_sqlite_to_postgres_and_back_copies_every_row_and_verifies(
    source: tuple[Settings, Written, dict[str, object]],
    tmp_path: Path,
    postgres_server,
    pg_schema: str,
) -> None:
    """Every record kind crosses SQLite -> PostgreSQL -> SQLite byte for byte and audits clean."""
    settings, written, reads = source
    ring = _ring(settings)
    with SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as original:
        contents = _raw(original)
    assert contents.epoch > 0
    assert any(event.index > 0 for event in contents.streams()["host.audit"][:1])

    schema = pg_schema
    pg_settings = _postgres(postgres_server.dsn, schema, settings.key_path)
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=schema, create=True) as target:
        fill_verified(contents, target, lambda store: bootstrap(settings, store=store).audit())
        _same_rows(_raw(target), contents)
        tagged = target.list(TAGGED, filters=[TagFilter(min(_tags_in(contents)[0]))]).items
        assert [meta.tags for meta in tagged] == _tags_in(contents)
    with bootstrap(pg_settings, create=True) as runtime:
        _audit_clean(runtime)
        assert service_reads(runtime, written) == reads

    back = _keyed_home(settings, tmp_path / "back")
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=schema, create=True) as moved:
        again = _raw(moved)
    with SQLiteSecureObjectStore.open(back.database_path, create=True) as target:
        fill_verified(again, target, lambda store: bootstrap(settings, store=store).audit())
    with SQLiteSecureObjectStore.open(back.database_path, read_only=True) as copied:
        _same_rows(_raw(copied), contents)
    with bootstrap(back, create=True) as runtime:
        _audit_clean(runtime)
        assert service_reads(runtime, written) == reads
    assert AesGcmCipher.from_ring(ring).key_ids() == AesGcmCipher.from_ring(_ring(back)).key_ids()


def test_cli_migrate_both_ways_then_refuses_a_filled_target(
    source: tuple[Settings, Written, dict[str, object]],
    tmp_path: Path,
    postgres_server,
    pg_schema: str,
) -> None:
    """``migrate --to postgres://`` and back to a SQLite home; a second run is STORE_NOT_EMPTY."""
    settings, written, reads = source
    schema = pg_schema
    moved = run_cli(
        tmp_path, "migrate", "--to", postgres_server.dsn, "--to-schema", schema, "--json",
        home=settings.home,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    document = json_document(moved)
    assert document["verified"] is True
    assert document["target"] == {"backend": "postgres", "schema": schema}
    assert "reading the target back" in moved.stderr
    assert postgres_server.dsn not in moved.stdout + moved.stderr

    again = run_cli(
        tmp_path, "migrate", "--to", postgres_server.dsn, "--to-schema", schema, "--json",
        home=settings.home,
    )  # fmt: skip
    assert again.returncode == 1
    assert json_document(again)["error"]["code"] == "STORE_NOT_EMPTY"  # type: ignore[index]

    pg_env = {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": schema,
        "FLOWVAULT_KEY_FILE": str(settings.key_path),
    }
    verified = run_cli(tmp_path, "ledger", "verify", "--all", "--json", **pg_env)
    assert verified.returncode == 0, verified.stdout
    back_home = tmp_path / "back"
    back = run_cli(tmp_path, "migrate", "--to", str(back_home), "--json", **pg_env)
    assert back.returncode == 0, back.stdout + back.stderr
    assert json_document(back)["records"] == document["records"]
    with bootstrap(_keyed_home(settings, back_home), create=True) as runtime:
        _audit_clean(runtime)
        assert service_reads(runtime, written) == reads


def _archive(settings: Settings) -> tuple[bytes, CipherDigester]:
    digester = CipherDigester(AesGcmCipher.from_ring(_ring(settings)))
    with SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as original:
        data, _ = encode_archive(_raw(original), digester, {"backend": "sqlite"})
    return data, digester


def _rezip(data: bytes, name: str, edit: object) -> bytes:
    """Return the archive with member ``name`` replaced by ``edit(old bytes)``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as old, zipfile.ZipFile(out, "w") as new:
        for member in old.namelist():
            body = old.read(member)
            new.writestr(member, edit(body) if member == name else body)  # type: ignore[operator]
    return out.getvalue()


def _flip_in_payload(body: bytes) -> bytes:
    line = parse_canonical(body.splitlines()[0].decode())
    assert isinstance(line, dict)
    payload = str(line["payload"])
    line["payload"] = ("A" if payload[10] != "A" else "B").join((payload[:10], payload[11:]))
    return canonical_bytes(line) + b"\n" + b"".join(body.splitlines(True)[1:])


def _drop_first_line(body: bytes) -> bytes:
    return b"".join(body.splitlines(True)[1:])


def _edit_manifest(body: bytes) -> bytes:
    document = parse_canonical(body.decode().rstrip("\n"))
    assert isinstance(document, dict)
    manifest = document["body"]
    assert isinstance(manifest, dict)
    manifest["source"] = {"backend": "postgres"}
    return canonical_bytes(document) + b"\n"


def _recount_manifest(data: bytes) -> object:
    """Drop an event line and rewrite the manifest's part entry to match, without the key."""

    def edit(body: bytes) -> bytes:
        return _drop_first_line(body)

    with zipfile.ZipFile(io.BytesIO(data)) as old:
        events = edit(old.read(EVENTS_PART))
    from flowvault.domain._canonical import digest_bytes  # noqa: PLC0415

    def manifest(body: bytes) -> bytes:
        document = parse_canonical(body.decode().rstrip("\n"))
        assert isinstance(document, dict)
        parts = document["body"]["parts"]  # type: ignore[index, call-overload]
        parts[EVENTS_PART] = {"lines": events.count(b"\n"), "digest": digest_bytes(events)}
        return canonical_bytes(document) + b"\n"

    return _rezip(_rezip(data, EVENTS_PART, edit), MANIFEST, manifest)


TAMPERS = {
    "a byte of a sealed payload": lambda data: _rezip(data, RECORDS_PART, _flip_in_payload),
    "a record dropped": lambda data: _rezip(data, RECORDS_PART, _drop_first_line),
    "the manifest edited": lambda data: _rezip(data, MANIFEST, _edit_manifest),
    "an event dropped and the manifest recounted": _recount_manifest,
    "a truncated file": lambda data: data[: len(data) // 2],
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_tampered_archive_is_refused_before_the_target_is_touched(
    source: tuple[Settings, Written, dict[str, object]], tmp_path: Path, tamper: str
) -> None:
    """Each change fails the manifest or a part's digest: ``IntegrityFailure``, no target made."""
    settings, _, _ = source
    data, digester = _archive(settings)
    decode_archive(data, digester)
    tampered = TAMPERS[tamper](data)
    with pytest.raises(IntegrityFailure):
        decode_archive(tampered, digester)
    archive = tmp_path / "tampered.zip"
    archive.write_bytes(tampered)
    target = tmp_path / "target"
    refused = run_cli(tmp_path, "import", str(archive), "--to", str(target), "--json",
                      home=settings.home)  # fmt: skip
    assert refused.returncode == 1
    assert json_document(refused)["error"]["code"] == "INTEGRITY_FAILURE"  # type: ignore[index]
    assert not target.exists()


def test_an_archive_under_another_key_is_refused(
    source: tuple[Settings, Written, dict[str, object]],
) -> None:
    """The manifest's MAC is keyed: another store's key cannot vouch for it."""
    settings, _, _ = source
    data, _ = _archive(settings)
    other = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=generate_master_key())))
    with pytest.raises(IntegrityFailure):
        decode_archive(data, other)


def test_export_then_import_into_postgres_and_sqlite(
    source: tuple[Settings, Written, dict[str, object]],
    tmp_path: Path,
    postgres_server,
    pg_schema: str,
) -> None:
    """One archive file fills a PostgreSQL schema and a SQLite home, each verified equal."""
    settings, written, reads = source
    archive = tmp_path / "store.fvz"
    exported = run_cli(tmp_path, "export", "--to", str(archive), "--json", home=settings.home)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert archive.stat().st_mode & 0o777 == 0o600
    assert run_cli(tmp_path, "export", "--to", str(archive), home=settings.home).returncode == 1

    schema = pg_schema
    imported = run_cli(
        tmp_path, "import", str(archive), "--to", postgres_server.dsn, "--to-schema", schema,
        "--json", home=settings.home,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stdout + imported.stderr
    with bootstrap(
        _postgres(postgres_server.dsn, schema, settings.key_path), create=True
    ) as runtime:
        _audit_clean(runtime)
        assert service_reads(runtime, written) == reads
    home = tmp_path / "imported"
    local = run_cli(tmp_path, "import", str(archive), "--to", str(home), home=settings.home)
    assert local.returncode == 0, local.stdout + local.stderr
    with (
        SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as original,
        SQLiteSecureObjectStore.open(_sqlite(home).database_path, read_only=True) as copied,
    ):
        _same_rows(_raw(copied), _raw(original))
        assert len(_tags_in(_raw(copied))) == 1


def _failing_statement(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    """Inject a fault: the fill's last statement (setting the epoch) fails, after every row."""
    failing = (
        "SELECT no_such_function(%s)"
        if module is postgres_commit
        else "UPDATE no_such_table SET x = ?"
    )
    monkeypatch.setattr(module.sql, "SET_EPOCH", failing)  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_fill_failing_at_its_last_statement_leaves_the_target_empty_and_can_run_again(
    source: tuple[Settings, Written, dict[str, object]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    """Every row is written before the fault; the one transaction takes them all back."""
    settings, _, _ = source
    with SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as original:
        contents = _raw(original)

    def audit(store: SecureObjectStore) -> LedgerAudit:
        return bootstrap(settings, store=store).audit()

    def target() -> SecureObjectStore:
        if backend == "sqlite":
            return SQLiteSecureObjectStore.open(tmp_path / "target" / "store.db", create=True)
        dsn = request.getfixturevalue("postgres_server").dsn
        return PostgresSecureObjectStore.open(
            dsn, schema=request.getfixturevalue("pg_schema"), create=True
        )

    with monkeypatch.context() as patched:
        _failing_statement(patched, sqlite_store if backend == "sqlite" else postgres_commit)
        with target() as store, pytest.raises(StoreUnavailable):
            fill_verified(contents, store, audit)
    with target() as store:
        assert isinstance(store, StoreStats)
        assert not store.has_records()
        assert _raw(store).epoch == 0
        fill_verified(contents, store, audit)
        _same_rows(_raw(store), contents)
        with pytest.raises(StoreNotEmpty):
            fill_verified(contents, store, audit)


def _waiting_on_a_lock(admin: psycopg.Connection) -> bool:
    """Whether a fill waits for the held epoch sequence (its ``setval``)."""
    rows = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE '%setval%store_epoch%'"
    ).fetchone()
    return rows is not None and rows[0] > 0


def test_a_migrate_killed_inside_its_transaction_leaves_the_target_empty(
    source: tuple[Settings, Written, dict[str, object]],
    tmp_path: Path,
    postgres_server,
    pg_schema: str,
) -> None:
    """SIGKILL while the fill waits at its last statement; the server rolls it all back.

    The test holds the target's epoch sequence (an open ``ALTER SEQUENCE``),
    so the fill writes every row and then waits; the kill lands there, not
    at a moment chosen by a timer. The source stays as it was, and a rerun
    succeeds.
    """
    settings, _, _ = source
    with SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as original:
        before = _raw(original)
    schema = pg_schema
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=schema, create=True).close()
    with (
        psycopg.connect(postgres_server.dsn) as holder,
        psycopg.connect(postgres_server.dsn, autocommit=True) as admin,
    ):
        holder.execute(f'ALTER SEQUENCE "{schema}".store_epoch INCREMENT BY 1')
        process = subprocess.Popen(
            [str(FLOWVAULT), "--home", str(settings.home), "migrate", "--to", postgres_server.dsn,
             "--to-schema", schema],
            env=cli_env(tmp_path, FLOWVAULT_POSTGRES_LOCK_TIMEOUT="600"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + TIMEOUT
            while not _waiting_on_a_lock(admin):
                assert process.poll() is None, "migrate ended before it reached the epoch"
                assert time.monotonic() < deadline
                time.sleep(0.01)
            os.kill(process.pid, signal.SIGKILL)
        finally:
            process.wait(timeout=TIMEOUT)
        holder.rollback()
    with PostgresSecureObjectStore.open(postgres_server.dsn, schema=schema, create=True) as target:
        assert not target.has_records()
        assert target.seal_counts() == {}
    with SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as original:
        _same_rows(_raw(original), before)
    rerun = run_cli(tmp_path, "migrate", "--to", postgres_server.dsn, "--to-schema", schema,
                    home=settings.home)  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr


# -- one scope ----------------------------------------------------------------------


def _state(settings: Settings, scope: str = SCOPE) -> tuple[object, int | None]:
    with bootstrap(settings) as runtime:
        snapshot = runtime.state(scope).load()
    return snapshot.state, snapshot.revision


def _with_other_data(settings: Settings) -> None:
    """Write a workflow and another scope, so the target is a live store, not an empty one."""
    with bootstrap(settings, create=True) as runtime:
        runtime.workflows.create(
            WorkOrder(kind="other.test", parameters={}, requester="t", idempotency_key="there")
        )
        runtime.state("other").save(WorkflowState(workflow_id="wf-other", stage="intake"))


def _rows(settings: Settings) -> StoreContents:
    with bootstrap(settings) as runtime:
        return _raw(runtime.repository.store)


def test_a_scope_crosses_sqlite_to_postgres_and_back_into_stores_holding_other_data(
    source: tuple[Settings, Written, dict[str, object]],
    tmp_path: Path,
    postgres_server,
    pg_schema: str,
) -> None:
    """``export --scope`` then ``import`` adds the scope, loading the same state, audit clean."""
    settings, _, _ = source
    expected = _state(settings)
    archive = tmp_path / "scope.fvz"
    exported = run_cli(
        tmp_path, "export", "--scope", SCOPE, "--to", str(archive), "--json", home=settings.home
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    document = json_document(exported)
    manifest = document["manifest"]
    assert isinstance(manifest, dict)
    assert manifest["scope"] == SCOPE
    assert set(document) == {"schema_version", "archive", "bytes", "signed", "manifest"}
    assert document["signed"] is False
    assert manifest["parts"][RECORDS_PART]["lines"] == 1

    pg = _postgres(postgres_server.dsn, pg_schema, settings.key_path)
    _with_other_data(pg)
    with bootstrap(pg) as runtime:
        seals_before = dict(runtime.capabilities.seals.seal_counts())  # type: ignore[union-attr]
    imported = run_cli(
        tmp_path, "import", str(archive), "--to", postgres_server.dsn, "--to-schema", pg_schema,
        "--json", home=settings.home,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stdout + imported.stderr
    added = json_document(imported)
    assert set(added) == {
        "schema_version", "archive", "source", "target", "scope", "revision", "records",
        "events", "streams", "epoch", "seal_counts", "records_digest", "events_digest", "verified",
    }  # fmt: skip
    assert (added["scope"], added["verified"], added["records"]) == (SCOPE, True, 1)
    assert added["revision"] == expected[1]
    assert _state(pg) == expected
    assert _state(pg, "other")[1] == 1
    with bootstrap(pg) as runtime:
        _audit_clean(runtime)
        seals_after = dict(runtime.capabilities.seals.seal_counts())  # type: ignore[union-attr]
    assert all(seals_after[key] >= count for key, count in seals_before.items())

    pg_env = {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": postgres_server.dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": pg_schema,
        "FLOWVAULT_KEY_FILE": str(settings.key_path),
    }
    back_archive = tmp_path / "back.fvz"
    back = run_cli(tmp_path, "export", "--scope", SCOPE, "--to", str(back_archive), **pg_env)
    assert back.returncode == 0, back.stdout + back.stderr
    local = _keyed_home(settings, tmp_path / "local")
    _with_other_data(local)
    into = run_cli(tmp_path, "import", str(back_archive), "--to", str(local.home),
                   home=settings.home)  # fmt: skip
    assert into.returncode == 0, into.stdout + into.stderr
    assert _state(local) == expected
    with bootstrap(local) as runtime:
        _audit_clean(runtime)


def test_importing_a_scope_the_target_holds_is_refused_and_writes_nothing(
    source: tuple[Settings, Written, dict[str, object]], tmp_path: Path
) -> None:
    """A second import of the scope, or a whole-store archive into a live store: refused whole."""
    settings, _, _ = source
    archive = tmp_path / "scope.fvz"
    assert run_cli(tmp_path, "export", "--scope", SCOPE, "--to", str(archive),
                   home=settings.home).returncode == 0  # fmt: skip
    whole = tmp_path / "whole.fvz"
    assert run_cli(tmp_path, "export", "--to", str(whole), home=settings.home).returncode == 0
    target = _keyed_home(settings, tmp_path / "target")
    _with_other_data(target)
    first = run_cli(tmp_path, "import", str(archive), "--to", str(target.home), home=settings.home)
    assert first.returncode == 0, first.stdout + first.stderr
    before = _rows(target)
    for refused_archive in (archive, whole):
        again = run_cli(tmp_path, "import", str(refused_archive), "--to", str(target.home),
                        "--json", home=settings.home)  # fmt: skip
        assert again.returncode == 1
        assert json_document(again)["error"]["code"] == "STORE_NOT_EMPTY"  # type: ignore[index]
        _same_rows(_rows(target), before)

    same_scope = _keyed_home(settings, tmp_path / "same-scope")
    with bootstrap(same_scope, create=True) as runtime:
        runtime.state(SCOPE).save(WorkflowState(workflow_id="wf-here", stage="intake"))
    held = _rows(same_scope)
    clash = run_cli(tmp_path, "import", str(archive), "--to", str(same_scope.home),
                    "--json", home=settings.home)  # fmt: skip
    assert json_document(clash)["error"]["code"] == "STORE_NOT_EMPTY"  # type: ignore[index]
    _same_rows(_rows(same_scope), held)


@pytest.mark.parametrize("tamper", ["a byte of a sealed payload", "the manifest edited"])
def test_a_tampered_scope_archive_is_refused_and_writes_nothing(
    source: tuple[Settings, Written, dict[str, object]], tmp_path: Path, tamper: str
) -> None:
    """An edited scope archive fails its MAC or a part's digest before the target is opened."""
    settings, _, _ = source
    archive = tmp_path / "scope.fvz"
    assert run_cli(tmp_path, "export", "--scope", SCOPE, "--to", str(archive),
                   home=settings.home).returncode == 0  # fmt: skip
    tampered = tmp_path / "tampered.fvz"
    tampered.write_bytes(TAMPERS[tamper](archive.read_bytes()))
    target = _keyed_home(settings, tmp_path / "target")
    _with_other_data(target)
    before = _rows(target)
    refused = run_cli(tmp_path, "import", str(tampered), "--to", str(target.home), "--json",
                      home=settings.home)  # fmt: skip
    assert refused.returncode == 1
    assert json_document(refused)["error"]["code"] == "INTEGRITY_FAILURE"  # type: ignore[index]
    _same_rows(_rows(target), before)


def test_export_of_a_scope_the_store_never_held_is_not_found(
    source: tuple[Settings, Written, dict[str, object]], tmp_path: Path
) -> None:
    """No row and no history: ``NOT_FOUND``, and no file is written."""
    settings, _, _ = source
    archive = tmp_path / "none.fvz"
    missing = run_cli(tmp_path, "export", "--scope", "never", "--to", str(archive), "--json",
                      home=settings.home)  # fmt: skip
    assert json_document(missing)["error"]["code"] == "NOT_FOUND"  # type: ignore[index]
    assert not archive.exists()


# -- a signed archive ---------------------------------------------------------------


def _strip_signature(body: bytes) -> bytes:
    document = parse_canonical(body.decode().rstrip("\n"))
    assert isinstance(document, dict)
    del document["signature"]
    return canonical_bytes(document) + b"\n"


def test_a_signed_archive_checks_with_the_public_key_alone_and_import_refuses_others(
    source: tuple[Settings, Written, dict[str, object]], tmp_path: Path
) -> None:
    """The right key verifies; another key, a stripped signature or an edited manifest do not."""
    settings, _, _ = source
    key = tmp_path / "signing" / "export.pem"
    assert run_cli(tmp_path, "keys", "signing-key", "--out", str(key)).returncode == 0
    public = Path(f"{key}.pub")
    other = tmp_path / "other.pem"
    assert run_cli(tmp_path, "keys", "signing-key", "--out", str(other)).returncode == 0
    unkeyed = run_cli(tmp_path, "export", "--sign", "--to", str(tmp_path / "x.fvz"), "--json",
                      home=settings.home)  # fmt: skip
    assert json_document(unkeyed)["error"]["code"] == "KEY_REQUIRED"  # type: ignore[index]
    archive = tmp_path / "signed.fvz"
    signed = run_cli(tmp_path, "export", "--sign", "--scope", SCOPE, "--to", str(archive),
                     "--json", home=settings.home, FLOWVAULT_SIGNING_KEY_FILE=str(key))  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr
    assert json_document(signed)["signed"] is True

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = run_cli(elsewhere, "import", str(archive), "--check", "--public-key", str(public),
                      "--json", home=elsewhere / "home")  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    document = json_document(checked)
    assert set(document) == {
        "schema_version", "archive", "mac_checked", "signature_checked", "records", "events",
        "manifest",
    }  # fmt: skip
    assert (document["records"], document["events"]) == (None, None)
    assert (document["mac_checked"], document["signature_checked"]) == (False, True)
    assert document["manifest"]["scope"] == SCOPE  # type: ignore[index]
    assert not (elsewhere / "home").exists(), "a check with the public key opens no store"

    keyed = run_cli(tmp_path, "import", str(archive), "--check", "--public-key", str(public),
                    "--json", home=settings.home)  # fmt: skip
    assert json_document(keyed)["mac_checked"] is True
    assert json_document(keyed)["records"] == 1

    unsigned = tmp_path / "unsigned.fvz"
    assert run_cli(tmp_path, "export", "--scope", SCOPE, "--to", str(unsigned),
                   home=settings.home).returncode == 0  # fmt: skip
    stripped = tmp_path / "stripped.fvz"
    stripped.write_bytes(_rezip(archive.read_bytes(), MANIFEST, _strip_signature))
    edited = tmp_path / "edited.fvz"
    edited.write_bytes(_rezip(archive.read_bytes(), MANIFEST, _edit_manifest))
    flipped = tmp_path / "flipped.fvz"
    flipped.write_bytes(TAMPERS["a byte of a sealed payload"](archive.read_bytes()))
    for candidate, pem in (
        (archive, f"{other}.pub"),
        (unsigned, str(public)),
        (stripped, str(public)),
        (edited, str(public)),
        (flipped, str(public)),
    ):
        refused = run_cli(elsewhere, "import", str(candidate), "--check", "--public-key", pem,
                          "--json", home=elsewhere / "home")  # fmt: skip
        assert refused.returncode == 1, candidate
        assert json_document(refused)["error"]["code"] == "INTEGRITY_FAILURE"  # type: ignore[index]
        target = tmp_path / f"target-{candidate.stem}"
        into = run_cli(tmp_path, "import", str(candidate), "--public-key", pem, "--to",
                       str(target), "--json", home=settings.home)  # fmt: skip
        assert json_document(into)["error"]["code"] == "INTEGRITY_FAILURE"  # type: ignore[index]
        assert not target.exists()
    target = tmp_path / "target"
    accepted = run_cli(tmp_path, "import", str(archive), "--public-key", str(public), "--to",
                       str(target), "--json", home=settings.home)  # fmt: skip
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
