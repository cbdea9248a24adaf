"""Re-sealing onto a new primary key: same content and revision, guarded, resumable."""

from __future__ import annotations

import dataclasses

import pytest
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.crypto._cipher import derive_integrity_key, key_id_of
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    BlobStore,
    Guard,
    SealedRepository,
    SecureObjectStore,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.application._keys import KeyRing
from flowvault.application._rotation import MAX_BATCH_BYTES, KeyRotation
from flowvault.application.testing import FrozenClock, SequentialIds, make_header
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    StoreUnavailable,
    WorkOrder,
)

OLD = bytes(range(32))
NEW = bytes(range(32, 64))
RING = KeyRing(primary=OLD).promote(NEW, integrity=derive_integrity_key(OLD))


def _repository(store: SecureObjectStore, ring: KeyRing, clock: FrozenClock) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher.from_ring(ring), clock)


def _order(key: str) -> WorkOrder:
    return WorkOrder.model_validate(
        {
            "kind": "invoice.review",
            "parameters": {"amount": 1200},
            "requester": "someone@example.org",
            "idempotency_key": key,
        }
    )


class Old:
    """A store filled under the old key, and repositories under the old and the new ring."""

    def __init__(self, store: SecureObjectStore | None = None, records: int = 25) -> None:
        self.store = store or InMemorySecureObjectStore()
        self.clock = FrozenClock()
        self.before = _repository(self.store, KeyRing(primary=OLD), self.clock)
        for n in range(records):
            self.before.write("things", f"t{n}", {"n": n}, expected=Guard.ABSENT, labels={"n": n})
        self.after = _repository(self.store, RING, self.clock)


def test_reseal_keeps_content_revision_time_and_labels() -> None:
    """Only the key id changes: readers holding the revision stay valid."""
    old = Old(records=1)
    old.before.write("things", "t0", {"n": "changed"}, expected=1, labels={"n": 7})
    digest = old.before.key_digest("things", "t0")
    record = old.store.load("things", digest)
    assert record is not None
    upsert = old.after.reseal(record)
    assert upsert is not None
    assert upsert.reseal
    old.store.commit(UnitOfWork(upserts=[upsert]))
    opened = old.after.read("things", "t0")
    assert opened is not None
    assert opened.document == {"n": "changed"}
    assert opened.revision == 2
    assert opened.metadata.header.written_at == record.metadata.header.written_at
    assert dict(opened.metadata.labels) == {"n": 7}
    assert opened.metadata.header.key_id == key_id_of(NEW)
    again = old.store.load("things", digest)
    assert again is not None
    assert old.after.reseal(again) is None


def test_a_damaged_record_is_not_laundered_under_the_new_key() -> None:
    """Re-sealing verifies first: a tampered row stays an INTEGRITY_FAILURE, not a fresh seal."""
    old = Old(records=1)
    digest = old.before.key_digest("things", "t0")
    record = old.store.load("things", digest)
    assert record is not None
    flipped = bytearray(record.payload)
    flipped[-1] ^= 1
    with pytest.raises(IntegrityFailure):
        old.after.reseal(dataclasses.replace(record, payload=bytes(flipped)))


def test_reseal_upserts_must_keep_the_guarded_revision() -> None:
    """A reseal is an exact guard that writes the revision it expects, nothing else."""
    header = make_header("ns", "a", revision=3)
    replaced = "sha256:" + "0" * 64
    assert Upsert(header=header, payload=b"", expected=3, replaces=replaced).reseal
    with pytest.raises(InvalidInput):
        Upsert(header=header, payload=b"", expected=2, replaces=replaced)
    with pytest.raises(InvalidInput):
        Upsert(header=header, payload=b"", expected=Guard.ANY, replaces=replaced)


def test_rotation_moves_every_namespace_and_workflows_still_read() -> None:
    """Workflows (whose document version must equal the row revision) survive rotation."""
    old = Old(records=30)
    workflows = workflow_services(old.before, old.clock, SequentialIds("wf")).workflows
    created = [workflows.create(_order(f"req-{n}"))[0] for n in range(5)]
    workflows.transition(
        created[0].workflow_id, "planning", expected_state="intake", expected_version=1
    )
    rotation = KeyRotation(old.after, batch_size=7)
    total = rotation.pending()
    assert total == sum(old.store.namespace_counts().values())
    seen: list[tuple[int, int]] = []
    report = rotation.run(progress=lambda done, of: seen.append((done, of)))
    assert report.remaining == 0
    assert report.resealed == total
    assert report.compacted is True
    assert KeyRotation(old.after).run().compacted is None
    assert dict(report.by_key) == {key_id_of(NEW): total}
    assert seen[-1] == (total, total)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    after = workflow_services(old.after, old.clock, SequentialIds("wf2")).workflows
    for record in created:
        assert after.get(record.workflow_id).workflow_id == record.workflow_id
    assert after.get(created[0].workflow_id).state == "planning"
    retired = _repository(old.store, RING.without(OLD), old.clock)
    for n in range(30):
        opened = retired.read("things", f"t{n}")
        assert opened is not None
        assert opened.document == {"n": n}


class _ConcurrentWriter:
    """A store that lets a writer change one record just before rotation's first commit.

    The injected fault stands for another process committing between
    rotation's read and its write; the store itself stays the real one.
    """

    def __init__(self, store: InMemorySecureObjectStore, write: object) -> None:
        self._store = store
        self._write = write
        self.fired = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def commit(self, unit: UnitOfWork) -> None:
        if not self.fired and any(upsert.reseal for upsert in unit.upserts):
            self.fired = True
            self._write()  # type: ignore[operator]
        self._store.commit(unit)


def test_a_record_changed_meanwhile_is_reread_never_overwritten() -> None:
    """The batch's guard fails; the writer's value stands and the rest is still rotated."""
    old = Old(records=10)
    writer = _repository(old.store, RING, old.clock)
    wrapped = _ConcurrentWriter(
        old.store,  # type: ignore[arg-type]
        lambda: writer.write("things", "t3", {"n": "writer"}, expected=1),
    )
    rotation = KeyRotation(_repository(wrapped, RING, old.clock))  # type: ignore[arg-type]
    report = rotation.run()
    assert wrapped.fired
    assert report.remaining == 0
    assert report.resealed == 9
    assert report.changed_meanwhile == 1
    opened = old.after.read("things", "t3")
    assert opened is not None
    assert opened.document == {"n": "writer"}
    assert opened.revision == 2


class _FailsOnce:
    """A store whose n-th commit fails as if the disk vanished (an injected fault)."""

    def __init__(self, store: InMemorySecureObjectStore, fail_at: int) -> None:
        self._store = store
        self._left = fail_at

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def commit(self, unit: UnitOfWork) -> None:
        self._left -= 1
        if self._left == 0:
            raise StoreUnavailable("injected")
        self._store.commit(unit)


def test_an_interrupted_rotation_resumes_by_running_again() -> None:
    """Rotation keeps no state: what is still under the old key is what is left to do."""
    old = Old(records=40)
    failing = _FailsOnce(old.store, fail_at=3)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        KeyRotation(_repository(failing, RING, old.clock), batch_size=10).run()  # type: ignore[arg-type]
    halfway = KeyRotation(old.after, batch_size=10)
    assert halfway.pending() == 20
    assert halfway.run().remaining == 0
    for n in range(40):
        opened = old.after.read("things", f"t{n}")
        assert opened is not None
        assert opened.document == {"n": n}


def test_rotation_needs_counts_and_a_sane_batch() -> None:
    """A batch outside 1..1000, or a store that cannot count by key id, is refused up front."""
    old = Old(records=1)
    for size in (0, 1001):
        with pytest.raises(InvalidInput):
            KeyRotation(old.after, batch_size=size)

    class Plain:
        def __getattr__(self, name: str) -> object:
            if name in {"key_id_counts", "namespace_counts", "has_records"}:
                raise AttributeError(name)
            return getattr(old.store, name)

    with pytest.raises(InvalidInput):
        KeyRotation(_repository(Plain(), RING, old.clock))  # type: ignore[arg-type]


def test_stored_record_payload_stays_out_of_reprs() -> None:
    """A reseal upsert shows no ciphertext in its repr, like every other upsert."""
    old = Old(records=1)
    record = old.store.load("things", old.before.key_digest("things", "t0"))
    assert isinstance(record, StoredRecord)
    upsert = old.after.reseal(record)
    assert upsert is not None
    assert record.payload.hex() not in repr(upsert)
    assert "payload=" not in repr(upsert)


def test_a_batch_reseals_at_most_its_byte_budget() -> None:
    """Large rows (blob chunks) are re-sealed in batches under 32 MiB, however many fit by count."""
    old = Old(records=3)
    data = bytes(range(256)) * (40 * 4096)
    BlobStore(old.before).write("blobs", "large", data)
    units: list[int] = []
    commit = old.store.commit

    def counting(unit: UnitOfWork) -> None:
        units.append(sum(len(upsert.payload) for upsert in unit.upserts))
        commit(unit)

    old.store.commit = counting  # type: ignore[method-assign]
    report = KeyRotation(old.after).run()
    assert report.resealed == 3 + 1 + 41
    assert len(units) == 4  # the manifest, the 41 chunks in two batches, the three documents
    assert max(units) <= MAX_BATCH_BYTES
    assert sum(1 for size in units if size > MAX_BATCH_BYTES // 4) == 2
    assert BlobStore(old.after).read("blobs", "large") == data
