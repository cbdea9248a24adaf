"""Sealed records on a real SQLite file: no plaintext on disk, and raw tampering is caught."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowvault.adapters.sqlite._rows import metadata_from_row
from flowvault.application import Guard, LabelFilter
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import FlowvaultError, IntegrityFailure

NS = "cases"
MARKER = "plaintext-marker-51c0ffee"
KEY_MARKER = "patient-4471-jane.doe@example.org"


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Runtime]:
    """Open a sealed SQLite vault in a fresh home."""
    with bootstrap(Settings(backend="sqlite", home=tmp_path), create=True) as opened:
        yield opened


def _raw(vault: Runtime) -> sqlite3.Connection:
    return sqlite3.connect(vault.settings.database_path, isolation_level=None)


def _scan(paths: list[Path], needles: list[str]) -> list[str]:
    found = []
    for path in paths:
        if path.exists():
            data = path.read_bytes()
            found += [f"{needle} in {path.name}" for needle in needles if needle.encode() in data]
    return found


def test_plaintext_never_lands_on_disk(tmp_path: Path) -> None:
    """Markers in payloads and natural keys appear in no byte of the db, WAL or shm files."""
    settings = Settings(backend="sqlite", home=tmp_path)
    database = settings.database_path
    files = [
        database,
        database.with_name("flowvault.db-wal"),
        database.with_name("flowvault.db-shm"),
    ]
    needles = [MARKER, KEY_MARKER, MARKER.encode().hex()]
    with bootstrap(settings, create=True) as vault:
        for n in range(50):
            vault.repository.write(
                NS, f"{KEY_MARKER}-{n}", {"note": MARKER, "n": n}, expected=Guard.ABSENT
            )
        vault.repository.write(NS, f"{KEY_MARKER}-0", {"note": MARKER * 3}, expected=1)
        assert database.with_name("flowvault.db-wal").exists()
        assert _scan(files, needles) == []
    assert _scan(files, needles) == []
    assert database.stat().st_size > 0


def _write_victim(vault: Runtime, key: str = "victim") -> None:
    vault.repository.write(
        NS,
        key,
        {"note": MARKER},
        expected=Guard.ABSENT,
        labels={"status": "open", "due": 7},
        tags={"sha256:" + "0" * 64},
    )


def _flip(value: object) -> object:
    if value is None:
        return 0
    if isinstance(value, bytes):
        middle = len(value) // 2
        return value[:middle] + bytes([value[middle] ^ 0x01]) + value[middle + 1 :]
    if isinstance(value, int):
        return value + 1
    assert isinstance(value, str)
    return value[:-1] + ("a" if value[-1] != "a" else "b")


def _record_columns(vault: Runtime) -> list[str]:
    with _raw(vault) as raw:
        return [row[1] for row in raw.execute("PRAGMA table_info(records)")]


IDENTITY_COLUMNS = {"namespace", "key_digest"}
INTERNAL_COLUMNS = {"id"}


def test_every_record_column_is_covered(vault: Runtime) -> None:
    """The tamper matrix below knows every column of the records table."""
    known = IDENTITY_COLUMNS | INTERNAL_COLUMNS | {
        "revision", "sensitivity", "schema_version", "key_id", "written_at",
        "ledger_index", "labels", "byte_length", "payload_digest", "payload", "tags",
    }  # fmt: skip
    assert set(_record_columns(vault)) == known


@pytest.mark.parametrize(
    "column",
    [
        "revision",
        "sensitivity",
        "schema_version",
        "key_id",
        "written_at",
        "ledger_index",
        "labels",
        "byte_length",
        "payload_digest",
        "payload",
        "tags",
    ],
)
def test_flipped_byte_in_a_sealed_column_fails_closed(vault: Runtime, column: str) -> None:
    """Changing any stored field of a sealed record with raw SQL fails its read closed.

    The victim has no ledger index, so that column is flipped from NULL to 0.
    """
    _write_victim(vault)
    _write_victim(vault, "bystander")
    digest = vault.repository.key_digest(NS, "victim")
    with _raw(vault) as raw:
        (value,) = raw.execute(
            f"SELECT {column} FROM records WHERE key_digest = ?",  # noqa: S608 - fixed column list
            (digest,),
        ).fetchone()
        raw.execute(
            f"UPDATE records SET {column} = ? WHERE key_digest = ?",  # noqa: S608
            (_flip(value), digest),
        )
    with pytest.raises(IntegrityFailure) as caught:
        vault.repository.read(NS, "victim")
    assert caught.value.code == "INTEGRITY_FAILURE"
    assert MARKER not in repr(caught.value) + str(caught.value)
    assert vault.repository.read(NS, "bystander") is not None


@pytest.mark.parametrize("column", sorted(IDENTITY_COLUMNS))
def test_flipped_identity_column_hides_the_record(vault: Runtime, column: str) -> None:
    """A changed namespace or key digest leaves the record unreachable, never misattributed."""
    _write_victim(vault)
    digest = vault.repository.key_digest(NS, "victim")
    with _raw(vault) as raw:
        (value,) = raw.execute(
            f"SELECT {column} FROM records WHERE key_digest = ?",  # noqa: S608
            (digest,),
        ).fetchone()
        raw.execute(
            f"UPDATE records SET {column} = ? WHERE key_digest = ?",  # noqa: S608
            (_flip(value), digest),
        )
    assert vault.repository.read(NS, "victim") is None
    for meta in vault.store.list(NS).items + vault.store.list(str(_flip(NS))).items:
        record = vault.store.load(meta.namespace, meta.key_digest)
        assert record is not None
        with pytest.raises(IntegrityFailure):
            vault.repository.open(record, namespace=meta.namespace, key_digest=meta.key_digest)


def test_swapped_ciphertexts_both_fail(vault: Runtime) -> None:
    """Swapping two rows' payloads (with their lengths and digests) breaks both reads."""
    _write_victim(vault, "a")
    _write_victim(vault, "b")
    a, b = (vault.repository.key_digest(NS, key) for key in ("a", "b"))
    columns = "payload, payload_digest, byte_length"
    with _raw(vault) as raw:
        rows = {
            digest: raw.execute(
                f"SELECT {columns} FROM records WHERE key_digest = ?",  # noqa: S608
                (digest,),
            ).fetchone()
            for digest in (a, b)
        }
        for target, source in ((a, b), (b, a)):
            raw.execute(
                "UPDATE records SET payload = ?, payload_digest = ?, byte_length = ?"
                " WHERE key_digest = ?",
                (*rows[source], target),
            )
    for key in ("a", "b"):
        with pytest.raises(IntegrityFailure):
            vault.repository.read(NS, key)


def test_tampered_label_index_cannot_forge_a_label(vault: Runtime) -> None:
    """An edited label index is refused by a filter it would steer; the labels stay true."""
    _write_victim(vault)
    with _raw(vault) as raw:
        raw.execute("UPDATE record_labels SET text_value = 'closed' WHERE name = 'status'")
    with pytest.raises(IntegrityFailure):
        vault.store.list(NS, filters=[LabelFilter("status", "closed")])
    opened = vault.repository.read(NS, "victim")
    assert opened is not None
    assert opened.metadata.labels["status"] == "open"


def test_malformed_row_is_a_typed_error(vault: Runtime) -> None:
    """Garbage in a typed column surfaces as a flowvault error, never a driver or pydantic one."""
    _write_victim(vault)
    with _raw(vault) as raw:
        raw.execute("UPDATE records SET sensitivity = 'top-secret', written_at = 'yesterday'")
    with pytest.raises(FlowvaultError):
        vault.repository.read(NS, "victim")


@pytest.mark.parametrize(
    ("stored", "kind"),
    [("5_000", "text"), ("0x5", "text"), (b"\x05", "blob"), (2.5, "real"), (2**53, "integer")],
)
def test_ledger_index_that_is_not_an_index_is_a_malformed_row(
    vault: Runtime, stored: object, kind: str
) -> None:
    """A ``ledger_index`` cell holding anything but NULL or an index in range is malformed.

    Text such as ``5_000`` stays text in an INTEGER column, and lax validation
    would read it as 5000; every read of the row refuses it instead.
    """
    _write_victim(vault)
    digest = vault.repository.key_digest(NS, "victim")
    with _raw(vault) as raw:
        raw.execute("UPDATE records SET ledger_index = ? WHERE key_digest = ?", (stored, digest))
        found = raw.execute(
            "SELECT typeof(ledger_index) FROM records WHERE key_digest = ?", (digest,)
        )
        assert found.fetchone() == (kind,)
    reads = (
        lambda: vault.store.load(NS, digest),
        lambda: vault.store.peek_metadata(NS, digest),
        lambda: vault.store.list(NS),
    )
    for read in reads:
        with pytest.raises(IntegrityFailure) as caught:
            read()
        assert caught.value.details == {"table": "records"}


@pytest.mark.parametrize("stored", [True, "5", -1])
def test_row_codec_refuses_a_ledger_index_a_driver_could_hand_back(stored: object) -> None:
    """A boolean, numeric text or a negative number is refused by the row codec itself.

    No bundled driver returns them for the column, but lax validation would take them.
    """
    row = (
        NS, "sha256:" + "ab" * 32, 1, "confidential", 1, "k1", "2026-01-01T00:00:00.000000Z",
        stored, "{}", 0, "sha256:" + "cd" * 32, "[]",
    )  # fmt: skip
    with pytest.raises(IntegrityFailure):
        metadata_from_row(row)
    assert metadata_from_row((*row[:7], 5, *row[8:])).header.ledger_index == 5
