"""Blobs on a real SQLite file and the real PostgreSQL server: whole, sealed, and held together."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import BlobStore, SealedRepository, SecureObjectStore, UnitOfWork
from flowvault.application._blobs import BLOB_CHUNKS, CHUNK_BYTES
from flowvault.application.testing import FrozenClock
from flowvault.composition import Settings, bootstrap
from flowvault.domain import IntegrityFailure

NS = "lg.blobs"
MARKER = b"plaintext-marker-b10b-51c0ffee:"
KEY_MARKER = "thread-4471-jane.doe@example.org/channel:messages/v7"
DISK_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _canary(size: int) -> bytes:
    """Return ``size`` bytes of the marker repeated, so every chunk and every boundary holds it."""
    return (MARKER * (size // len(MARKER) + 1))[:size]


def _scan(paths: list[Path], needles: list[bytes]) -> list[str]:
    found = []
    for path in paths:
        if path.exists():
            data = path.read_bytes()
            found += [f"{needle!r} in {path.name}" for needle in needles if needle in data]
    return found


def test_a_blob_lands_on_disk_sealed(tmp_path: Path) -> None:
    """Neither the content nor the natural key appears in any byte of the db, WAL or shm file."""
    settings = Settings(backend="sqlite", home=tmp_path)
    database = settings.database_path
    files = [
        database,
        database.with_name("flowvault.db-wal"),
        database.with_name("flowvault.db-shm"),
    ]
    needles = [MARKER, KEY_MARKER.encode(), MARKER.hex().encode(), b"b10b-51c0ffee"]
    data = _canary(2 * CHUNK_BYTES + 4321)
    with bootstrap(settings, create=True) as vault:
        blobs = BlobStore(vault.repository)
        info = blobs.write(NS, KEY_MARKER, data, labels={"thread": "t1"})
        assert info.chunks == 3
        assert blobs.read(NS, KEY_MARKER) == data
        assert database.with_name("flowvault.db-wal").exists()
        assert _scan(files, needles) == []
    assert _scan(files, needles) == []
    with bootstrap(settings) as reopened:
        assert BlobStore(reopened.repository).read(NS, KEY_MARKER) == data


class RawRows:
    """The records table of a disk store, read and edited with the backend's own SQL."""

    def __init__(self, store: SecureObjectStore, request: pytest.FixtureRequest) -> None:
        self._run: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
        if isinstance(store, SQLiteSecureObjectStore):
            path = Path(store.path)

            def run_sqlite(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
                with closing(sqlite3.connect(path, isolation_level=None)) as raw:
                    return raw.execute(statement.replace("%s", "?"), params).fetchall()

            self._run = run_sqlite
        else:
            admin = request.getfixturevalue("postgres_server").admin()
            request.addfinalizer(admin.close)
            search = sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema))  # type: ignore[attr-defined]
            admin.execute(search)

            def run_postgres(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
                cursor = admin.execute(statement, params)  # type: ignore[arg-type]
                return cursor.fetchall() if cursor.description else []

            self._run = run_postgres

    def every_column(self) -> bytes:
        """Return every value of every record row, as bytes, to search for plaintext."""
        rows = self._run("SELECT * FROM records", ())
        return b"\n".join(
            bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
            for row in rows
            for value in row
        )

    def delete(self, namespace: str, key_digest: str) -> None:
        self._run(
            "DELETE FROM records WHERE namespace = %s AND key_digest = %s", (namespace, key_digest)
        )


@pytest.mark.parametrize("backend_store", DISK_BACKENDS, indirect=True)
def test_blobs_round_trip_sealed_and_whole(
    backend_store: SecureObjectStore, request: pytest.FixtureRequest
) -> None:
    """Each size reads back exact; rows hold no plaintext; a chunk row deleted by SQL is refused."""
    blobs = BlobStore(
        SealedRepository(backend_store, AesGcmCipher(bytes(range(32))), FrozenClock())
    )
    sizes = {"empty": 0, "one": 1, "chunk": CHUNK_BYTES, "chunk+1": CHUNK_BYTES + 1}
    written = {name: _canary(size) for name, size in sizes.items()}
    written["all-bytes"] = bytes(range(256)) * (CHUNK_BYTES // 128 + 1)
    writes = [blobs.prepare(NS, f"{KEY_MARKER}/{name}", data) for name, data in written.items()]
    backend_store.commit(
        UnitOfWork(upserts=[upsert for write in writes for upsert in write.upserts])
    )
    for name, data in written.items():
        assert blobs.read(NS, f"{KEY_MARKER}/{name}") == data
    rows = RawRows(backend_store, request)
    stored = rows.every_column()
    assert MARKER not in stored
    assert KEY_MARKER.encode() not in stored
    victim = f"{KEY_MARKER}/all-bytes"
    chunk = blobs.deletes(NS, victim)[2]
    assert chunk.namespace == BLOB_CHUNKS
    rows.delete(chunk.namespace, chunk.key_digest)
    with pytest.raises(IntegrityFailure) as caught:
        blobs.read(NS, victim)
    assert "chunk 1 of 3 is missing" in str(caught.value)
    assert KEY_MARKER not in str(caught.value) + repr(caught.value)
    assert blobs.read(NS, f"{KEY_MARKER}/chunk+1") == written["chunk+1"]
