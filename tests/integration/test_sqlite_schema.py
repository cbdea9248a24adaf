"""Schema versions: released files keep opening, newer ones are refused untouched."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flowvault.adapters.sqlite import SCHEMA_VERSION, SQLiteSecureObjectStore, _schema
from flowvault.application import (
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    Order,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application.testing import make_event, make_upsert
from flowvault.domain import (
    GENESIS_HASH,
    EnvelopeHeader,
    LedgerEvent,
    SchemaTooNew,
    Sensitivity,
    StoreUnavailable,
    verify_chain,
)
from flowvault.domain._envelope import natural_key_digest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sqlite"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UNICODE_NS = "工作流/ß"
AUDIT = "audit/\N{GREEK SMALL LETTER ALPHA}"


# -- what the v1 fixture holds, rebuilt from first principles ------------------


def _upsert(namespace: str, key: str, payload: bytes, **fields) -> Upsert:
    labels = fields.pop("labels")
    header = EnvelopeHeader(
        namespace=namespace,
        key_digest=natural_key_digest(namespace, key),
        schema_version=1,
        **fields,
    )
    return Upsert(header=header, payload=payload, expected=Guard.ANY, labels=labels)


def fixture_upserts(version: int = 1) -> list[Upsert]:
    """Return the records the fixture of ``version`` holds: v1's, with ledger indexes from v5."""
    confidential, restricted = Sensitivity.CONFIDENTIAL, Sensitivity.RESTRICTED
    linked = V5_LEDGER_INDEXES if version >= 5 else {}
    return [
        _upsert(
            "orders", "order-1", b"\x00sealed-order-1\xff", sensitivity=confidential,
            key_id="k1", revision=2, written_at=T0 + timedelta(seconds=1),
            labels={"status": "open", "n": 3}, ledger_index=linked.get("order-1"),
        ),
        _upsert(
            "orders", "order-2", b"sealed-order-2", sensitivity=restricted,
            key_id="k2", revision=1, written_at=T0, labels={"status": "closed", "n": 2**53 + 1},
        ),
        _upsert(
            UNICODE_NS, "run-1", b"", sensitivity=Sensitivity.PUBLIC,
            key_id="k1", revision=7, written_at=T0 + timedelta(seconds=2),
            ledger_index=linked.get("run-1"), labels={},
        ),
    ]  # fmt: skip


def _chain(stream: str, bodies: list[dict]) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    for index, body in enumerate(bodies):
        previous = events[-1].event_hash if events else GENESIS_HASH
        occurred = T0 + timedelta(minutes=index)
        events.append(
            LedgerEvent.create(
                stream=stream, index=index, occurred_at=occurred, previous_hash=previous, **body
            )
        )
    return events


def fixture_events() -> dict[str, list[LedgerEvent]]:
    """Return every event the v1 fixture's streams were written with (trimmed ones too)."""
    orders = _chain("orders", [{"type": "order.changed", "payload": {"n": n}} for n in range(4)])
    audit = _chain(
        AUDIT,
        [
            {
                "type": "workflow.created",
                "payload": {"who": "ops", "mixed": [1, 2.5, None, True, "ü"]},
                "to_state": "draft",
                "event_key": "create-1",
            },
            {
                "type": "workflow.approved",
                "payload": {},
                "from_state": "draft",
                "to_state": "approved",
            },
        ],
    )
    return {"orders": orders, AUDIT: audit}


FIXTURE_TRIM = ("orders", 2)
"""The ``orders`` stream was trimmed before index 2, so the fixture holds a gap."""

RELEASED = [f"schema_v{version}.sql" for version in range(1, SCHEMA_VERSION + 1)]
"""Every fixture holds the v1 records and events; v2 on adds ``V2_SEAL_COUNTS``, v4 ``V4_EPOCH``.

From v5 on, two of its records carry ``V5_LEDGER_INDEXES``.
"""
V2_SEAL_COUNTS = {"k1": 192, "k2": 64}
V4_EPOCH = 7
V5_LEDGER_INDEXES = {"order-1": 3, "run-1": 2**53 - 1}
"""The ledger index each v5 record was written with, by natural key; ``order-2`` has none."""


def fixture_version(fixture: str) -> int:
    """Return the schema version of a ``schema_v<n>.sql`` fixture."""
    return int(fixture.removeprefix("schema_v").removesuffix(".sql"))


# -- loading SQL text fixtures -------------------------------------------------


def _statements(text: str) -> list[str]:
    """Split SQL text into complete statements without executescript()."""
    statements, buffer = [], ""
    for line in text.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer)
            buffer = ""
    assert all(part.startswith("--") for part in buffer.split("\n") if part.strip())
    return statements


def load_fixture(name: str, target: Path) -> Path:
    """Build a private database at ``target`` from a SQL fixture, with plain sqlite3."""
    target.parent.mkdir(mode=0o700)
    raw = sqlite3.connect(target, isolation_level=None)
    try:
        for statement in _statements((FIXTURES / name).read_text(encoding="utf-8")):
            raw.execute(statement)
    finally:
        raw.close()
    target.chmod(0o600)
    return target


def _schema_of(path: Path) -> list[tuple[str, str, str | None]]:
    raw = sqlite3.connect(path)
    try:
        return raw.execute(
            "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
    finally:
        raw.close()


def _identity(metadata: RecordMetadata) -> tuple[str, str]:
    return metadata.namespace, metadata.key_digest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


# -- released versions ---------------------------------------------------------


def test_every_released_version_has_a_fixture() -> None:
    """Each schema version this code can write has a frozen SQL fixture."""
    for version in range(1, SCHEMA_VERSION + 1):
        assert (FIXTURES / f"schema_v{version}.sql").is_file()


@pytest.mark.parametrize("fixture", RELEASED)
def test_released_fixture_records_read_back(tmp_path: Path, fixture: str) -> None:
    """Every record of a released file loads with its header, labels and payload intact.

    Peeked and listed in every order, it has the same header too.
    """
    path = load_fixture(fixture, tmp_path / "data" / "store.db")
    upserts = fixture_upserts(fixture_version(fixture))
    with SQLiteSecureObjectStore.open(path) as store:
        for upsert in upserts:
            header = upsert.header
            loaded = store.load(header.namespace, header.key_digest)
            assert loaded is not None
            assert loaded.metadata == upsert.metadata
            assert loaded.payload == upsert.payload
            assert store.peek_metadata(header.namespace, header.key_digest) == upsert.metadata
        for order in Order:
            listed = [*store.list("orders", order=order).items, *store.list(UNICODE_NS).items]
            assert sorted(listed, key=_identity) == sorted(
                (upsert.metadata for upsert in upserts), key=_identity
            )
        assert dict(store.namespace_counts()) == {"orders": 2, UNICODE_NS: 1}
        assert dict(store.key_id_counts()) == {"k1": 2, "k2": 1}
        big = store.list("orders", filters=[LabelFilter("n", 2**53, FilterOp.GT)]).items
        assert [meta.labels["status"] for meta in big] == ["closed"]


@pytest.mark.parametrize("fixture", RELEASED)
def test_released_fixture_ledger_reads_back(tmp_path: Path, fixture: str) -> None:
    """A released file's streams read back hash for hash, with the trimmed stream's gap."""
    path = load_fixture(fixture, tmp_path / "data" / "store.db")
    events = fixture_events()
    stream, trimmed_before = FIXTURE_TRIM
    with SQLiteSecureObjectStore.open(path) as store:
        audit = store.read_ledger(AUDIT)
        assert list(audit.events) == events[AUDIT]
        assert verify_chain(audit.events).ok
        assert not audit.gap
        orders = store.read_ledger(stream)
        assert orders.gap
        assert list(orders.events) == events[stream][trimmed_before:]
        assert store.ledger_head(stream) == events[stream][-1]


@pytest.mark.parametrize("fixture", RELEASED)
def test_released_fixture_accepts_new_writes(tmp_path: Path, fixture: str) -> None:
    """A released file can be written after opening: guards see its revisions and stream heads."""
    path = load_fixture(fixture, tmp_path / "data" / "store.db")
    head = fixture_events()["orders"][-1]
    with SQLiteSecureObjectStore.open(path) as store:
        epoch = store.epoch()
        store.commit(
            UnitOfWork(
                upserts=[make_upsert("orders", "order-1", b"v3", expected=2)],
                appends=[make_event("orders", 4, head)],
            )
        )
        assert store.read_ledger("orders", from_index=4).events[0].previous_hash == (
            head.event_hash
        )
        assert store.epoch() == epoch + 1


@pytest.mark.parametrize("fixture", RELEASED)
def test_upgraded_fixture_matches_a_fresh_store(tmp_path: Path, fixture: str) -> None:
    """Opening any released fixture yields exactly the schema a new store gets."""
    old = load_fixture(fixture, tmp_path / "old" / "store.db")
    SQLiteSecureObjectStore.open(old).close()
    fresh = tmp_path / "fresh" / "store.db"
    SQLiteSecureObjectStore.open(fresh).close()
    assert _schema_of(old) == _schema_of(fresh)


def test_v1_upgrade_adds_empty_seal_counts_and_keeps_data(tmp_path: Path) -> None:
    """A v1 file gains the seal counter table on open, empty, with its records and ledger kept.

    The migration cannot know how many seals a v1 build made, so it invents no count.
    """
    path = load_fixture("schema_v1.sql", tmp_path / "data" / "store.db")
    with SQLiteSecureObjectStore.open(path) as store:
        assert store.seal_counts() == {}
        assert store.key_id_counts() == {"k1": 2, "k2": 1}
        assert store.ledger_head(AUDIT) == fixture_events()[AUDIT][-1]
        assert store.reserve_seals("k1", 64) == 64
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert raw.execute("SELECT key_id, reserved FROM seal_counters").fetchall() == [("k1", 64)]
    finally:
        raw.close()


def test_v2_fixture_seal_counts_read_back_and_grow(tmp_path: Path) -> None:
    """A v2 file's seal counts read back and the next reservation adds to them."""
    path = load_fixture("schema_v2.sql", tmp_path / "data" / "store.db")
    with SQLiteSecureObjectStore.open(path) as store:
        assert store.seal_counts() == V2_SEAL_COUNTS
        assert store.reserve_seals("k2", 64) == V2_SEAL_COUNTS["k2"] + 64
        assert store.has_records() is True


def test_v2_upgrade_adds_chain_mac_null_for_old_events(tmp_path: Path) -> None:
    """A v2 file gains ``chain_mac`` on open: its events keep none, new ones keep theirs."""
    path = load_fixture("schema_v2.sql", tmp_path / "data" / "store.db")
    head = fixture_events()["orders"][-1]
    keyed = make_event("orders", 4, head).model_copy(update={"chain_mac": "sha256:" + "ab" * 32})
    with SQLiteSecureObjectStore.open(path) as store:
        assert [event.chain_mac for event in store.read_ledger(AUDIT).events] == [None, None]
        store.commit(UnitOfWork(appends=[keyed]))
        assert store.ledger_head("orders") == keyed
        assert store.read_ledger("orders", from_index=4).events == (keyed,)
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        stored = raw.execute("SELECT stream, idx, chain_mac FROM ledger_events ORDER BY 1, 2")
        assert stored.fetchall() == [
            (AUDIT, 0, None),
            (AUDIT, 1, None),
            ("orders", 2, None),
            ("orders", 3, None),
            ("orders", 4, keyed.chain_mac),
        ]
    finally:
        raw.close()


def test_v3_upgrade_starts_the_epoch_at_zero_and_counts(tmp_path: Path) -> None:
    """A v3 file gains ``store_epoch`` on open at 0; each commit then raises it by one.

    No count of the commits made before v4 exists, so the migration starts
    at 0 rather than invent one.
    """
    path = load_fixture("schema_v3.sql", tmp_path / "data" / "store.db")
    with SQLiteSecureObjectStore.open(path) as store:
        assert store.epoch() == 0
        store.commit(UnitOfWork(upserts=[make_upsert("orders", "order-9")]))
        store.commit(
            UnitOfWork(deletes=[Delete("orders", natural_key_digest("orders", "order-9"), 1)])
        )
        assert store.epoch() == 2
        assert store.namespace_counts() == {"orders": 2, UNICODE_NS: 1}
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert raw.execute("SELECT id, epoch FROM store_epoch").fetchall() == [(1, 2)]
    finally:
        raw.close()


def test_v4_fixture_epoch_reads_back_and_grows(tmp_path: Path) -> None:
    """A v4 file's epoch reads back through the upgrade, and the next commit raises it.

    A read-only open refuses the v4 file now (it cannot migrate it); the v5
    fixture shows the epoch read-only.
    """
    path = load_fixture("schema_v4.sql", tmp_path / "data" / "store.db")
    with pytest.raises(StoreUnavailable):
        SQLiteSecureObjectStore.open(path, read_only=True)
    with SQLiteSecureObjectStore.open(path) as store:
        assert store.epoch() == V4_EPOCH
        assert store.reserve_seals("k1", 1) == V2_SEAL_COUNTS["k1"] + 1
        store.compact()
        store.vacuum()
        assert store.epoch() == V4_EPOCH
        store.commit(UnitOfWork(upserts=[make_upsert("orders", "order-9")]))
        assert store.epoch() == V4_EPOCH + 1


def test_v4_upgrade_adds_ledger_index_null_for_old_rows(tmp_path: Path) -> None:
    """A v4 file gains ``ledger_index`` on open: its records keep none, new writes keep theirs.

    Rows written before v5 had no ledger link, and no migration can invent
    one: it is bound into each sealed payload's associated data.
    """
    path = load_fixture("schema_v4.sql", tmp_path / "data" / "store.db")
    linked = make_upsert("orders", "order-1", b"v3", expected=2, ledger_index=4)
    large = make_upsert("orders", "order-9", ledger_index=2**40)
    with SQLiteSecureObjectStore.open(path) as store:
        assert [meta.header.ledger_index for meta in store.list("orders").items] == [None, None]
        store.commit(UnitOfWork(upserts=[linked, large]))
        for upsert in (linked, large):
            digest = upsert.header.key_digest
            assert store.peek_metadata("orders", digest) == upsert.metadata
        newest_first = store.list("orders", order=Order.WRITTEN_AT_DESC).items
        assert {meta.key_digest: meta.header.ledger_index for meta in newest_first} == {
            linked.header.key_digest: 4,
            large.header.key_digest: 2**40,
            natural_key_digest("orders", "order-2"): None,
        }
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        stored = raw.execute("SELECT id, revision, ledger_index FROM records ORDER BY id")
        assert stored.fetchall() == [(1, 1, None), (2, 7, None), (3, 3, 4), (4, 1, 2**40)]
    finally:
        raw.close()


def test_v5_fixture_ledger_indexes_read_back_and_change(tmp_path: Path) -> None:
    """A v5 file's ledger indexes read back, read-only too; a new revision replaces or drops one.

    It holds v4's epoch, which a read-only open reads as well.
    """
    path = load_fixture("schema_v5.sql", tmp_path / "data" / "store.db")
    digests = {key: natural_key_digest("orders", key) for key in ("order-1", "order-2")}
    with SQLiteSecureObjectStore.open(path, read_only=True) as store:
        assert store.epoch() == V4_EPOCH
        run = store.peek_metadata(UNICODE_NS, natural_key_digest(UNICODE_NS, "run-1"))
        assert run is not None
        assert run.header.ledger_index == V5_LEDGER_INDEXES["run-1"]
        listed = {meta.key_digest: meta.header.ledger_index for meta in store.list("orders").items}
        assert listed == {digests["order-1"]: 3, digests["order-2"]: None}
    with SQLiteSecureObjectStore.open(path) as store:
        store.commit(
            UnitOfWork(
                upserts=[
                    make_upsert("orders", "order-1", b"v3", expected=2),
                    make_upsert("orders", "order-2", b"v2", expected=1, ledger_index=0),
                ]
            )
        )
        listed = {meta.key_digest: meta.header.ledger_index for meta in store.list("orders").items}
        assert listed == {digests["order-1"]: None, digests["order-2"]: 0}


def test_fresh_store_records_the_schema_version(tmp_path: Path) -> None:
    """A new file is stamped with SCHEMA_VERSION."""
    path = tmp_path / "data" / "store.db"
    SQLiteSecureObjectStore.open(path).close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()


# -- newer and broken schemas --------------------------------------------------


def _stamp(path: Path, version: int) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute(f"PRAGMA user_version = {version}")
    raw.close()


@pytest.mark.parametrize("made_by", ["flowvault", "plain sqlite3"])
def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path, made_by: str) -> None:
    """A file stamped SCHEMA_VERSION + 1 raises SchemaTooNew; not one byte changes."""
    path = tmp_path / "data" / "store.db"
    if made_by == "flowvault":
        SQLiteSecureObjectStore.open(path).close()
    else:
        load_fixture("schema_v1.sql", path)
    _stamp(path, SCHEMA_VERSION + 1)
    before = _sha256(path)
    with pytest.raises(SchemaTooNew) as caught:
        SQLiteSecureObjectStore.open(path)
    assert caught.value.details == {"found": SCHEMA_VERSION + 1, "supported": SCHEMA_VERSION}
    assert "upgrade flowvault" in str(caught.value)
    assert _sha256(path) == before
    assert [sidecar for sidecar in _sidecars(path) if sidecar.exists()] == []


def test_failed_migration_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    """A step that fails rolls the whole migration back; the next open starts cleanly."""
    path = tmp_path / "data" / "store.db"
    broken = (_schema.MIGRATIONS[0] + ("CREATE TABLE broken (",),)
    monkeypatch.setattr(_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreUnavailable):
        SQLiteSecureObjectStore.open(path)
    assert _schema_of(path) == []
    monkeypatch.undo()
    with SQLiteSecureObjectStore.open(path) as store:
        assert store.has_records() is False


def _snapshot(path: Path) -> tuple[object, ...]:
    """Return the file's schema, version and rows, read with plain sqlite3."""
    raw = sqlite3.connect(path)
    try:
        rows = [
            raw.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()  # noqa: S608
            for table in ("records", "record_labels", "ledger_events", "ledger_streams")
        ]
        return (raw.execute("PRAGMA user_version").fetchone(), *rows)
    finally:
        raw.close()


def test_failed_upgrade_leaves_a_v1_file_as_it_was(tmp_path: Path, monkeypatch) -> None:
    """A v2 step that fails rolls back to the v1 schema, data intact; the next open upgrades it."""
    path = load_fixture("schema_v1.sql", tmp_path / "data" / "store.db")
    before = (_schema_of(path), _snapshot(path))
    broken = (_schema.MIGRATIONS[0], (*_schema.MIGRATIONS[1], "CREATE TABLE broken ("))
    monkeypatch.setattr(_schema, "MIGRATIONS", broken)
    with pytest.raises(StoreUnavailable):
        SQLiteSecureObjectStore.open(path)
    assert (_schema_of(path), _snapshot(path)) == before
    monkeypatch.undo()
    with SQLiteSecureObjectStore.open(path) as store:
        assert store.seal_counts() == {}
        assert store.namespace_counts() == {"orders": 2, UNICODE_NS: 1}


def test_concurrent_first_opens_migrate_once(tmp_path: Path) -> None:
    """Stores opening one new file at the same moment all succeed on a single schema."""
    path = tmp_path / "data" / "store.db"
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_and_close() -> None:
        barrier.wait()
        try:
            SQLiteSecureObjectStore.open(path).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_and_close) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    fresh = tmp_path / "fresh" / "store.db"
    SQLiteSecureObjectStore.open(fresh).close()
    assert _schema_of(path) == _schema_of(fresh)
