"""Blobs: byte values sealed in chunks under one manifest, read back whole or refused."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.crypto._cipher import derive_integrity_key
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    BlobStore,
    Delete,
    Guard,
    SealedRepository,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.application._audit import LedgerAudit, RecordReadability
from flowvault.application._blobs import BLOB_CHUNKS, CHUNK_BYTES, MAX_BLOB_BYTES
from flowvault.application._keys import KeyRing
from flowvault.application._records import MAX_PAYLOAD_BYTES
from flowvault.application._rotation import KeyRotation
from flowvault.application.testing import FrozenClock
from flowvault.domain import (
    EnvelopeHeader,
    IntegrityFailure,
    InvalidInput,
    PayloadTooLarge,
    RevisionConflict,
)
from flowvault.domain._canonical import canonical_json

KEY = bytes(range(32))
NS = "lg.blobs"
SECRET_KEY = "thread-7731/channel:messages/v12"
OTHER_KEY = "thread-7731/channel:messages/v13"
MiB = 1024 * 1024


class Vault:
    """A memory store, a sealed repository over it and blobs over that."""

    def __init__(self, key: bytes = KEY, store: InMemorySecureObjectStore | None = None) -> None:
        self.store = store or InMemorySecureObjectStore()
        self.clock = FrozenClock()
        self.repo = SealedRepository(self.store, AesGcmCipher(key), self.clock)
        self.blobs = BlobStore(self.repo)

    def chunk_keys(self, natural_key: str) -> list[str]:
        """Return the blob's chunk key digests in index order (from its own deletes)."""
        return [d.key_digest for d in self.blobs.deletes(NS, natural_key)[1:]]

    def chunk(self, natural_key: str, index: int) -> StoredRecord:
        record = self.store.load(BLOB_CHUNKS, self.chunk_keys(natural_key)[index])
        assert record is not None
        return record

    def manifest(self, natural_key: str) -> StoredRecord:
        record = self.store.load(NS, self.repo.key_digest(NS, natural_key))
        assert record is not None
        return record

    def put(self, header: EnvelopeHeader, payload: bytes) -> None:
        """Write a row as a database editor could: whatever stands there is replaced."""
        if self.store.peek_metadata(header.namespace, header.key_digest) is not None:
            delete = Delete(header.namespace, header.key_digest, Guard.ANY)
            self.store.commit(UnitOfWork(deletes=[delete]))
        expected = Guard.ABSENT if header.revision == 1 else Guard.ANY
        self.store.commit(UnitOfWork(upserts=[Upsert(header, payload, expected)]))

    def rows(self) -> dict[str, int]:
        return dict(self.store.namespace_counts())


@pytest.fixture
def vault() -> Vault:
    """Provide an empty vault on the memory store."""
    return Vault()


def _content(size: int) -> bytes:
    return os.urandom(size)


def refused(call: Callable[[], object], wording: str) -> IntegrityFailure:
    """Assert ``call`` fails as INTEGRITY_FAILURE saying ``wording``, naming no natural key."""
    with pytest.raises(IntegrityFailure) as caught:
        call()
    failure = caught.value
    assert wording in str(failure)
    for text in (str(failure), repr(failure), canonical_json(dict(failure.details))):
        assert SECRET_KEY not in text
        assert "thread-7731" not in text
    return failure


# -- round trips -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "chunks"),
    [
        (0, 0),
        (1, 1),
        (CHUNK_BYTES, 1),
        (CHUNK_BYTES + 1, 2),
        (10 * MiB, 11),
    ],
    ids=["empty", "one-byte", "one-chunk", "one-chunk-plus-one", "10MiB"],
)
def test_round_trip(vault: Vault, size: int, chunks: int) -> None:
    """A blob reads back byte for byte; every sealed row stays within a record's limit."""
    data = _content(size)
    prepared = vault.blobs.prepare(NS, SECRET_KEY, data, labels={"thread": "t1"})
    assert len(prepared.upserts) == chunks + 1
    assert all(len(u.payload) <= MAX_PAYLOAD_BYTES for u in prepared.upserts)
    vault.store.commit(prepared.unit())
    assert vault.blobs.read(NS, SECRET_KEY) == data
    info = vault.blobs.info(NS, SECRET_KEY)
    assert info == prepared.info
    assert info is not None
    assert (info.size, info.chunks, info.revision) == (size, chunks, 1)
    assert info.digest == vault.blobs.content_digest(data) == prepared.digest
    assert vault.rows() == ({NS: 1, BLOB_CHUNKS: chunks} if chunks else {NS: 1})


def test_every_byte_value_survives_across_a_chunk_boundary(vault: Vault) -> None:
    """All 256 byte values, on both sides of a chunk boundary, read back unchanged."""
    data = bytes(range(256)) * (CHUNK_BYTES // 256 + 8)
    vault.blobs.write(NS, SECRET_KEY, data)
    assert vault.blobs.read(NS, SECRET_KEY) == data
    assert data[CHUNK_BYTES - 3 : CHUNK_BYTES + 3] == bytes([253, 254, 255, 0, 1, 2])


def test_absent_blob(vault: Vault) -> None:
    """No manifest: nothing to read, no digest, nothing to delete."""
    assert vault.blobs.read(NS, SECRET_KEY) is None
    assert vault.blobs.info(NS, SECRET_KEY) is None
    assert not vault.blobs.exists(NS, SECRET_KEY)
    assert vault.blobs.deletes(NS, SECRET_KEY) == ()


def test_digest_lookup_reads_the_manifest_alone(vault: Vault) -> None:
    """``info``/``exists`` answer from the manifest without loading a chunk."""
    data = _content(CHUNK_BYTES + 5)
    vault.blobs.write(NS, SECRET_KEY, data)
    loaded: list[str] = []
    load = vault.store.load

    def counting(namespace: str, key_digest: str) -> StoredRecord | None:
        loaded.append(namespace)
        return load(namespace, key_digest)

    vault.store.load = counting  # type: ignore[method-assign]
    assert vault.blobs.exists(NS, SECRET_KEY)
    info = vault.blobs.info(NS, SECRET_KEY)
    assert info is not None
    assert info.digest == vault.blobs.content_digest(data)
    assert info.digest != vault.blobs.content_digest(data + b"\x00")
    assert loaded == [NS, NS]


def test_rewrites_guard_every_row_and_drop_unused_chunks(vault: Vault) -> None:
    """A shorter rewrite deletes the chunks it no longer uses; a stale guard writes nothing."""
    vault.blobs.write(NS, SECRET_KEY, _content(2 * CHUNK_BYTES + 1))
    with pytest.raises(RevisionConflict):
        vault.blobs.prepare(NS, SECRET_KEY, b"x", expected=2)
    with pytest.raises(RevisionConflict):
        vault.blobs.write(NS, SECRET_KEY, b"x")
    shorter = _content(CHUNK_BYTES + 1)
    info = vault.blobs.write(NS, SECRET_KEY, shorter, expected=1)
    assert (info.revision, info.chunks) == (2, 2)
    assert vault.rows() == {NS: 1, BLOB_CHUNKS: 2}
    assert vault.blobs.read(NS, SECRET_KEY) == shorter
    longer = _content(3 * CHUNK_BYTES)
    info = vault.blobs.write(NS, SECRET_KEY, longer, expected=Guard.ANY)
    assert (info.revision, info.chunks, info.chunk_revisions) == (3, 3, (3, 3, 1))
    assert vault.blobs.read(NS, SECRET_KEY) == longer


def test_a_racing_rewrite_fails_at_commit(vault: Vault) -> None:
    """Two rewrites prepared from one manifest: the second to commit conflicts, writing nothing."""
    vault.blobs.write(NS, SECRET_KEY, b"first")
    one = vault.blobs.prepare(NS, SECRET_KEY, b"second", expected=Guard.ANY)
    two = vault.blobs.prepare(NS, SECRET_KEY, b"third", expected=Guard.ANY)
    vault.store.commit(one.unit())
    with pytest.raises(RevisionConflict):
        vault.store.commit(two.unit())
    assert vault.blobs.read(NS, SECRET_KEY) == b"second"


def test_deletes_remove_manifest_and_chunks(vault: Vault) -> None:
    """The deletes commit in the caller's unit and leave no row of the blob."""
    vault.blobs.write(NS, SECRET_KEY, _content(2 * CHUNK_BYTES + 1))
    vault.blobs.write(NS, OTHER_KEY, b"kept")
    deletes = vault.blobs.deletes(NS, SECRET_KEY)
    assert len(deletes) == 4
    vault.store.commit(UnitOfWork(deletes=deletes))
    assert vault.blobs.read(NS, SECRET_KEY) is None
    assert vault.rows() == {NS: 1, BLOB_CHUNKS: 1}
    assert vault.blobs.read(NS, OTHER_KEY) == b"kept"


def test_over_the_limit_is_refused_before_anything_is_sealed(vault: Vault) -> None:
    """One byte past 64 MiB is PAYLOAD_TOO_LARGE; nothing is written or sealed."""
    with pytest.raises(PayloadTooLarge) as caught:
        vault.blobs.write(NS, SECRET_KEY, bytes(MAX_BLOB_BYTES + 1))
    assert caught.value.details == {"size": MAX_BLOB_BYTES + 1, "limit": MAX_BLOB_BYTES}
    assert vault.rows() == {}
    assert not vault.repo.budget.counts()


def test_bad_arguments_are_refused(vault: Vault) -> None:
    """Only bytes are blobs, and the chunk namespace holds no blobs of its own."""
    with pytest.raises(InvalidInput):
        vault.blobs.prepare(NS, SECRET_KEY, bytearray(b"x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        vault.blobs.prepare(BLOB_CHUNKS, SECRET_KEY, b"x")
    with pytest.raises(InvalidInput):
        vault.blobs.prepare(NS, SECRET_KEY, b"x", expected=0)


# -- beside sealed documents -----------------------------------------------------------------


def test_a_document_at_a_blob_key_is_no_manifest(vault: Vault) -> None:
    """A plain document where a manifest should be is refused, not read as an empty blob."""
    vault.repo.write(NS, SECRET_KEY, {"size": 0}, expected=Guard.ABSENT)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "not a blob manifest")
    refused(lambda: vault.blobs.deletes(NS, SECRET_KEY), "not a blob manifest")


def test_key_rotation_reseals_chunks_and_an_audit_reads_them() -> None:
    """Re-sealing keeps every revision, so a blob reads after rotation; the audit opens chunks."""
    old = Vault()
    data = _content(CHUNK_BYTES + 9)
    old.blobs.write(NS, SECRET_KEY, data)
    ring = KeyRing(primary=KEY).promote(bytes(range(32, 64)), integrity=derive_integrity_key(KEY))
    repo = SealedRepository(old.store, AesGcmCipher.from_ring(ring), old.clock)
    report = KeyRotation(repo).run()
    assert report.resealed == 3
    assert BlobStore(repo).read(NS, SECRET_KEY) == data
    audit = LedgerAudit(old.store, repo).run()
    assert audit.records is not None
    assert audit.records[RecordReadability.READABLE] == 3
    assert audit.records[RecordReadability.UNREADABLE] == 0


# -- tampering -----------------------------------------------------------------------------


@pytest.fixture
def three(vault: Vault) -> bytes:
    """Write a three-chunk blob at ``SECRET_KEY`` and return its content."""
    data = _content(2 * CHUNK_BYTES + 100)
    vault.blobs.write(NS, SECRET_KEY, data)
    return data


def test_a_deleted_chunk_is_refused(vault: Vault, three: bytes) -> None:
    """A chunk row gone is named by its index."""
    key = vault.chunk_keys(SECRET_KEY)[1]
    vault.store.commit(UnitOfWork(deletes=[Delete(BLOB_CHUNKS, key, 1)]))
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "chunk 1 of 3 is missing")


def test_a_chunk_from_another_blob_is_refused(vault: Vault, three: bytes) -> None:
    """Another blob's chunk, header and ciphertext, at this blob's chunk row fails its seal."""
    vault.blobs.write(NS, OTHER_KEY, _content(2 * CHUNK_BYTES + 100))
    foreign = vault.chunk(OTHER_KEY, 1)
    target = vault.chunk_keys(SECRET_KEY)[1]
    vault.put(foreign.metadata.header.model_copy(update={"key_digest": target}), foreign.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "failed authentication")


def test_reordered_chunks_are_refused(vault: Vault, three: bytes) -> None:
    """Chunks 0 and 1 swapped, header and payload, each at the other's row: refused."""
    first, second = vault.chunk(SECRET_KEY, 0), vault.chunk(SECRET_KEY, 1)
    keys = vault.chunk_keys(SECRET_KEY)
    vault.put(first.metadata.header.model_copy(update={"key_digest": keys[1]}), first.payload)
    vault.put(second.metadata.header.model_copy(update={"key_digest": keys[0]}), second.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "failed authentication")


def test_an_older_chunk_put_back_is_refused(vault: Vault, three: bytes) -> None:
    """A chunk row from the blob's previous write, put back whole, names an older revision."""
    older = vault.chunk(SECRET_KEY, 2)
    vault.blobs.write(NS, SECRET_KEY, _content(3 * CHUNK_BYTES), expected=1)
    vault.put(older.metadata.header, older.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "chunk 2 of 3 is at revision 1")


def test_a_chunk_of_an_earlier_incarnation_is_refused(vault: Vault, three: bytes) -> None:
    """Deleted and written again, the blob's chunks are back at revision 1: the digest tells."""
    older = vault.chunk(SECRET_KEY, 0)
    vault.store.commit(UnitOfWork(deletes=vault.blobs.deletes(NS, SECRET_KEY)))
    vault.blobs.write(NS, SECRET_KEY, _content(2 * CHUNK_BYTES + 100))
    vault.put(older.metadata.header, older.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "content differs from the manifest")


def test_an_edited_manifest_is_refused(vault: Vault, three: bytes) -> None:
    """A flipped manifest byte fails its seal; an older manifest put back names older chunks."""
    older = vault.manifest(SECRET_KEY)
    vault.blobs.write(NS, SECRET_KEY, _content(2 * CHUNK_BYTES + 100), expected=1)
    current = vault.manifest(SECRET_KEY)
    flipped = bytearray(current.payload)
    flipped[-20] ^= 0x01
    vault.put(current.metadata.header, bytes(flipped))
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "failed authentication")
    refused(lambda: vault.blobs.info(NS, SECRET_KEY), "failed authentication")
    vault.put(older.metadata.header, older.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "chunk 0 of 3 is at revision 2")


def test_an_extra_chunk_is_refused(vault: Vault, three: bytes) -> None:
    """A chunk row past the manifest's last (left from a longer write) is refused."""
    last = vault.chunk(SECRET_KEY, 2)
    vault.blobs.write(NS, SECRET_KEY, _content(CHUNK_BYTES + 1), expected=1)
    vault.put(last.metadata.header, last.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "a chunk follows the manifest's last (2)")


def test_a_truncated_chunk_payload_is_refused(vault: Vault, three: bytes) -> None:
    """A sealed chunk cut short, its row's length and digest made to match, fails its seal."""
    chunk = vault.chunk(SECRET_KEY, 1)
    vault.put(chunk.metadata.header, chunk.payload[:-100])
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "failed authentication")


def test_a_chunk_resealed_short_or_with_other_content_is_refused(
    vault: Vault, three: bytes
) -> None:
    """Even sealed under the right key at the right row and revision, content must match."""
    key = vault.chunk_keys(SECRET_KEY)[1]

    def reseal(data: bytes) -> None:
        upsert = vault.repo.prepare_bytes_at(BLOB_CHUNKS, key, data, expected=Guard.ABSENT)
        vault.put(upsert.header, upsert.payload)

    reseal(three[CHUNK_BYTES : 2 * CHUNK_BYTES - 1])
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "chunk 1 of 3 holds 1044479 bytes")
    reseal(bytes(CHUNK_BYTES))
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "content differs from the manifest")


def test_a_chunk_naming_another_ledger_event_is_refused(vault: Vault) -> None:
    """Every chunk carries the manifest's ledger index; one resealed under another is refused."""
    data = _content(CHUNK_BYTES + 10)
    vault.blobs.write(NS, SECRET_KEY, data, ledger_index=5)
    info = vault.blobs.info(NS, SECRET_KEY)
    assert info is not None
    assert info.ledger_index == 5
    key = vault.chunk_keys(SECRET_KEY)[1]
    upsert = vault.repo.prepare_bytes_at(
        BLOB_CHUNKS, key, data[CHUNK_BYTES:], expected=Guard.ABSENT, ledger_index=6
    )
    vault.put(upsert.header, upsert.payload)
    refused(lambda: vault.blobs.read(NS, SECRET_KEY), "chunk 1 of 2 names another ledger event")
