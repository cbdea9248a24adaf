"""Raw bytes sealed beside JSON documents: exact round trips, and neither opens as the other."""

from __future__ import annotations

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.crypto._cipher import derive_integrity_key
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    Delete,
    Guard,
    SealedRepository,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.application._audit import LedgerAudit, RecordReadability
from flowvault.application._keys import KeyRing
from flowvault.application._records import MAX_PAYLOAD_BYTES
from flowvault.application.testing import FrozenClock
from flowvault.domain import IntegrityFailure, InvalidInput, PayloadTooLarge

KEY = bytes(range(32))
NS = "raw"
SECRET_KEY = "patient-4471-jane.doe@example.org"


@pytest.fixture
def store() -> InMemorySecureObjectStore:
    """Provide an empty memory store."""
    return InMemorySecureObjectStore()


@pytest.fixture
def repo(store: InMemorySecureObjectStore) -> SealedRepository:
    """Provide a sealed repository over the store."""
    return SealedRepository(store, AesGcmCipher(KEY), FrozenClock())


def _row(store: InMemorySecureObjectStore, repo: SealedRepository, key: str) -> StoredRecord:
    record = store.load(NS, repo.key_digest(NS, key))
    assert record is not None
    return record


def _refused(call: object, wording: str) -> None:
    assert callable(call)
    with pytest.raises(IntegrityFailure) as caught:
        call()
    assert wording in str(caught.value)
    assert SECRET_KEY not in str(caught.value)
    assert SECRET_KEY not in repr(caught.value)


@pytest.mark.parametrize("data", [b"", b"\x00", bytes(range(256)) * 3, b'{"v":1}'])
def test_bytes_round_trip_exactly(
    store: InMemorySecureObjectStore, repo: SealedRepository, data: bytes
) -> None:
    """Any bytes, JSON-looking ones included, read back as written, with their labels."""
    upsert = repo.prepare_bytes(NS, SECRET_KEY, data, expected=Guard.ABSENT, labels={"n": 3})
    store.commit(UnitOfWork(upserts=[upsert]))
    opened = repo.read_bytes(NS, SECRET_KEY)
    assert opened is not None
    assert (opened.data, opened.revision, dict(opened.metadata.labels)) == (data, 1, {"n": 3})
    assert SECRET_KEY.encode() not in upsert.payload
    if len(data) >= 16:  # a shorter run can occur by chance in random ciphertext
        assert data not in upsert.payload
    assert repr(data) not in repr(opened)


def test_bytes_cost_no_base64(repo: SealedRepository) -> None:
    """The sealed size is the bytes plus a fixed overhead, up to a record's whole payload."""
    small = repo.prepare_bytes(NS, "a", b"x", expected=Guard.ABSENT)
    overhead = len(small.payload) - 1
    assert overhead < 100
    largest = MAX_PAYLOAD_BYTES - overhead
    assert len(repo.prepare_bytes(NS, "b", bytes(largest), expected=Guard.ABSENT).payload) == (
        MAX_PAYLOAD_BYTES
    )
    with pytest.raises(PayloadTooLarge):
        repo.prepare_bytes(NS, "c", bytes(largest + 1), expected=Guard.ABSENT)
    with pytest.raises(PayloadTooLarge):
        repo.prepare_bytes(NS, "d", bytes(MAX_PAYLOAD_BYTES + 1), expected=Guard.ABSENT)
    with pytest.raises(InvalidInput):
        repo.prepare_bytes(NS, "e", "text", expected=Guard.ABSENT)  # type: ignore[arg-type]


def test_edited_labels_are_refused(
    store: InMemorySecureObjectStore, repo: SealedRepository
) -> None:
    """A byte record's clear labels are checked against the sealed copy, as a document's are."""
    upsert = repo.prepare_bytes(NS, SECRET_KEY, b"data", expected=Guard.ABSENT, labels={"n": 3})
    store.commit(UnitOfWork(upserts=[upsert]))
    edited = Upsert(upsert.header, upsert.payload, Guard.ABSENT, {"n": 4})
    store.commit(UnitOfWork(deletes=[Delete(NS, upsert.header.key_digest, 1)]))
    store.commit(UnitOfWork(upserts=[edited]))
    _refused(lambda: repo.read_bytes(NS, SECRET_KEY), "labels differ")


def test_a_document_never_opens_as_bytes_nor_bytes_as_a_document(
    store: InMemorySecureObjectStore, repo: SealedRepository
) -> None:
    """The two body layouts are told apart inside the seal, whichever way they are opened."""
    repo.write(NS, "doc", {"a": 1}, expected=Guard.ABSENT)
    raw = repo.prepare_bytes(NS, "raw", b'{"v":1,"labels":{},"document":1}', expected=Guard.ABSENT)
    store.commit(UnitOfWork(upserts=[raw]))
    _refused(lambda: repo.read_bytes(NS, "doc"), "holds a document, not bytes")
    _refused(lambda: repo.read(NS, "raw"), "holds bytes, not a document")
    document = _row(store, repo, "doc")
    _refused(
        lambda: repo.open_bytes(document, namespace=NS, key_digest=document.metadata.key_digest),
        "holds a document, not bytes",
    )


def test_bytes_at_a_key_digest_open_only_at_that_row(
    store: InMemorySecureObjectStore, repo: SealedRepository
) -> None:
    """Sealed at a digest-named row, the bytes are refused when asked for at another."""
    here, there = repo.keyed_digest("test/1", "here"), repo.keyed_digest("test/1", "there")
    upsert = repo.prepare_bytes_at(NS, here, b"chunk", expected=Guard.ABSENT)
    store.commit(UnitOfWork(upserts=[upsert]))
    record = store.load(NS, here)
    assert record is not None
    assert repo.open_bytes(record, namespace=NS, key_digest=here).data == b"chunk"
    _refused(lambda: repo.open_bytes(record, namespace=NS, key_digest=there), "another row")
    moved = Upsert(
        upsert.header.model_copy(update={"key_digest": there}), upsert.payload, Guard.ABSENT
    )
    store.commit(UnitOfWork(upserts=[moved]))
    record = store.load(NS, there)
    assert record is not None
    _refused(lambda: repo.open_bytes(record, namespace=NS, key_digest=there), "authentication")


def test_rotation_reseals_bytes_and_the_audit_opens_them(
    store: InMemorySecureObjectStore, repo: SealedRepository
) -> None:
    """Re-sealing keeps the bytes and revision; the audit counts a byte record readable."""
    upsert = repo.prepare_bytes(NS, SECRET_KEY, b"\x00\xff", expected=Guard.ABSENT, labels={"n": 1})
    store.commit(UnitOfWork(upserts=[upsert]))
    repo.write(NS, "doc", {"a": 1}, expected=Guard.ABSENT)
    ring = KeyRing(primary=KEY).promote(bytes(range(32, 64)), integrity=derive_integrity_key(KEY))
    rotated = SealedRepository(store, AesGcmCipher.from_ring(ring), FrozenClock())
    resealed = rotated.reseal(_row(store, repo, SECRET_KEY))
    assert resealed is not None
    store.commit(UnitOfWork(upserts=[resealed]))
    opened = rotated.read_bytes(NS, SECRET_KEY)
    assert opened is not None
    assert (opened.data, opened.revision) == (b"\x00\xff", 1)
    audit = LedgerAudit(store, rotated).run()
    assert audit.records is not None
    assert audit.records[RecordReadability.READABLE] == 2
    assert audit.records[RecordReadability.UNREADABLE] == 0
