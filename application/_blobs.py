"""Blobs: byte values up to 64 MiB, sealed in chunks that one manifest binds.

A record holds at most 1 MiB of sealed payload, and a document holds no
bytes, so a large byte value (a serialised graph checkpoint) is split. The
manifest is a small sealed document at the blob's own key: its size, its
chunk size, the revision of every chunk and a keyed digest of the whole
content. Each chunk is sealed raw (``SealedRepository.prepare_bytes_at``)
in ``BLOB_CHUNKS``, at a key digest derived under the integrity key from the
blob's namespace, key digest and the chunk's index, so the header a chunk
is sealed under names its blob and index: moved to another blob or index it
does not open. A read checks every chunk's revision against the manifest,
that no chunk stands at the index after the last, and the content digest,
so a chunk dropped, added after the last, put back from an older write or
taken from another write fails closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from flowvault.application._records import (
    Delete,
    ExpectedRevision,
    Guard,
    LabelValue,
    StoredRecord,
    UnitOfWork,
    Upsert,
    check_expected_revision,
)
from flowvault.application._sealed import SealedRepository
from flowvault.domain import IntegrityFailure, InvalidInput, PayloadTooLarge, RevisionConflict
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._envelope import DIGEST_PATTERN

BLOB_CHUNKS: Final = "flowvault.blob-chunks"
"""The namespace every blob's chunks live in; their key digests name blob and index."""
MAX_BLOB_BYTES: Final = 64 * 1024 * 1024
"""Largest blob (64 MiB); it commits as one unit of up to 65 chunk rows and its manifest."""
CHUNK_BYTES: Final = 1020 * 1024
"""Bytes per chunk (1,044,480): 4 KiB under a record's 1 MiB, for the body prefix and the seal."""
BLOB_FORMAT: Final = "flowvault.blob/1"

_CHUNK_KEY_TAG = "flowvault.blob-chunk/1"
_CONTENT_TAG = "flowvault.blob-content/1"
_MANIFEST_FIELDS = frozenset({"format", "size", "chunk_bytes", "digest", "revisions"})


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """What a blob's verified manifest says, without its content."""

    key_digest: str
    """Keyed digest of the blob's natural key: the manifest's row."""
    revision: int
    """Revision of the manifest, the guard for rewriting or deleting the blob."""
    size: int
    digest: str
    """Keyed digest of the content; ``BlobStore.content_digest`` of equal bytes matches it."""
    chunks: int
    ledger_index: int | None
    """The ledger event the blob was written with, when the caller bound one."""
    chunk_revisions: tuple[int, ...] = field(repr=False)


@dataclass(frozen=True, slots=True)
class BlobWrite:
    """The writes that store one blob, for the caller's unit of work; nothing is written yet.

    ``deletes`` removes the chunks a shorter rewrite no longer uses.
    """

    upserts: tuple[Upsert, ...]
    deletes: tuple[Delete, ...]
    info: BlobInfo
    """The manifest as it will read once the unit commits."""

    @property
    def digest(self) -> str:
        """Keyed digest of the content written."""
        return self.info.digest

    def unit(self) -> UnitOfWork:
        """Return a unit of work holding these writes alone."""
        return UnitOfWork(upserts=self.upserts, deletes=self.deletes)

    def __repr__(self) -> str:
        return f"BlobWrite(upserts={len(self.upserts)}, deletes={len(self.deletes)}, {self.info!r})"


def _broken(what: str, namespace: str, key_digest: str, **details: int) -> IntegrityFailure:
    return IntegrityFailure(
        f"blob failed verification: {what}", namespace=namespace, key_digest=key_digest, **details
    )


def _chunk_count(size: int, chunk_bytes: int) -> int:
    return -(-size // chunk_bytes)


class BlobStore:
    """Seals byte values of any size up to ``MAX_BLOB_BYTES`` as a manifest and its chunks."""

    def __init__(self, repository: SealedRepository) -> None:
        self._repo = repository
        self._store = repository.store

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository blobs are written through."""
        return self._repo

    def content_digest(self, data: bytes) -> str:
        """Return the keyed digest a blob holding ``data`` carries, to compare with ``info``."""
        if not isinstance(data, bytes):
            raise InvalidInput("blob content must be bytes")
        return self._repo.keyed_digest(_CONTENT_TAG, data)

    def prepare(
        self,
        namespace: str,
        natural_key: str,
        data: bytes,
        *,
        expected: ExpectedRevision = Guard.ABSENT,
        labels: Mapping[str, LabelValue] | None = None,
        ledger_index: int | None = None,
    ) -> BlobWrite:
        """Seal ``data`` into the manifest and chunk writes for one unit of work.

        ``expected`` guards the manifest. A rewrite reads the manifest now,
        to guard each chunk it overwrites or drops by its revision; with
        ``Guard.ANY`` the manifest is then guarded by the revision read, so a
        rewrite racing this one fails at commit with ``RevisionConflict``.
        ``labels`` and ``ledger_index`` go on the manifest, and the ledger
        index on every chunk as well.

        Raises:
            PayloadTooLarge: ``data`` is longer than ``MAX_BLOB_BYTES``.
            RevisionConflict: the manifest is not at ``expected`` now.
            IntegrityFailure: the manifest a rewrite reads does not verify.

        """
        if not isinstance(data, bytes):
            raise InvalidInput("blob content must be bytes")
        if len(data) > MAX_BLOB_BYTES:
            raise PayloadTooLarge(
                f"blob of {len(data)} bytes exceeds {MAX_BLOB_BYTES}",
                size=len(data),
                limit=MAX_BLOB_BYTES,
            )
        check_expected_revision(expected)
        if namespace == BLOB_CHUNKS:
            raise InvalidInput("blobs cannot be stored in the namespace of blob chunks")
        key_digest = self._repo.key_digest(namespace, natural_key)
        previous = self._previous(namespace, key_digest, expected)
        old = previous.chunk_revisions if previous is not None else ()
        upserts: list[Upsert] = []
        for index, start in enumerate(range(0, len(data), CHUNK_BYTES)):
            chunk_key = self._chunk_key(namespace, key_digest, index)
            upserts.append(
                self._repo.prepare_bytes_at(
                    BLOB_CHUNKS,
                    chunk_key,
                    data[start : start + CHUNK_BYTES],
                    expected=old[index] if index < len(old) else Guard.ABSENT,
                    ledger_index=ledger_index,
                )
            )
        deletes = tuple(
            Delete(BLOB_CHUNKS, self._chunk_key(namespace, key_digest, index), old[index])
            for index in range(len(upserts), len(old))
        )
        digest = self.content_digest(data)
        revisions = [upsert.header.revision for upsert in upserts]
        manifest = {
            "format": BLOB_FORMAT,
            "size": len(data),
            "chunk_bytes": CHUNK_BYTES,
            "digest": digest,
            "revisions": revisions,
        }
        guard = Guard.ABSENT if previous is None else previous.revision
        head = self._repo.prepare(
            namespace,
            natural_key,
            manifest,
            expected=guard,
            labels=labels,
            ledger_index=ledger_index,
        )
        info = BlobInfo(
            key_digest=key_digest,
            revision=head.header.revision,
            size=len(data),
            digest=digest,
            chunks=len(upserts),
            ledger_index=ledger_index,
            chunk_revisions=tuple(revisions),
        )
        return BlobWrite(upserts=(head, *upserts), deletes=deletes, info=info)

    def write(
        self,
        namespace: str,
        natural_key: str,
        data: bytes,
        *,
        expected: ExpectedRevision = Guard.ABSENT,
        labels: Mapping[str, LabelValue] | None = None,
        ledger_index: int | None = None,
    ) -> BlobInfo:
        """Prepare and commit one blob on its own; return its manifest as written."""
        prepared = self.prepare(
            namespace,
            natural_key,
            data,
            expected=expected,
            labels=labels,
            ledger_index=ledger_index,
        )
        self._store.commit(prepared.unit())
        return prepared.info

    def info(self, namespace: str, natural_key: str) -> BlobInfo | None:
        """Return the blob's verified manifest, or ``None`` when there is none; no chunk is read."""
        return self._manifest(namespace, self._repo.key_digest(namespace, natural_key))

    def exists(self, namespace: str, natural_key: str) -> bool:
        """Whether a blob is stored at the key (its manifest verifies); no chunk is read."""
        return self.info(namespace, natural_key) is not None

    def read(self, namespace: str, natural_key: str) -> bytes | None:
        """Return the blob's content, every chunk verified, or ``None`` when there is no blob.

        Raises:
            IntegrityFailure: the manifest or a chunk does not verify, a chunk
                is missing, at another revision or ledger index than the
                manifest names, or of the wrong length, a chunk stands at the
                index after the last, or the content's digest differs from
                the manifest's.

        """
        key_digest = self._repo.key_digest(namespace, natural_key)
        manifest = self._manifest(namespace, key_digest)
        if manifest is None:
            return None
        keys = [self._chunk_key(namespace, key_digest, i) for i in range(manifest.chunks + 1)]
        if self._store.peek_metadata(BLOB_CHUNKS, keys.pop()) is not None:
            raise _broken(
                f"a chunk follows the manifest's last ({manifest.chunks})", namespace, key_digest
            )
        parts = [
            self._chunk(manifest, namespace, index, keys[index], record)
            for index, record in enumerate(_load_chunks(self._repo, keys))
        ]
        data = b"".join(parts)
        if self.content_digest(data) != manifest.digest:
            raise _broken("content differs from the manifest's digest", namespace, key_digest)
        return data

    def _chunk(
        self,
        manifest: BlobInfo,
        namespace: str,
        index: int,
        chunk_key: str,
        record: StoredRecord | None,
    ) -> bytes:
        """Open chunk ``index`` and hold it to the manifest: revision, ledger index and length."""

        def broken(what: str) -> IntegrityFailure:
            return _broken(
                f"chunk {index} of {manifest.chunks} {what}",
                namespace,
                manifest.key_digest,
                chunk=index,
            )

        if record is None:
            raise broken("is missing")
        opened = self._repo.open_bytes(record, namespace=BLOB_CHUNKS, key_digest=chunk_key)
        wanted = manifest.chunk_revisions[index]
        if opened.revision != wanted:
            raise broken(f"is at revision {opened.revision}, the manifest names {wanted}")
        if opened.metadata.header.ledger_index != manifest.ledger_index:
            raise broken("names another ledger event than the manifest")
        length = min(CHUNK_BYTES, manifest.size - index * CHUNK_BYTES)
        if len(opened.data) != length:
            raise broken(f"holds {len(opened.data)} bytes, the manifest implies {length}")
        return opened.data

    def deletes(self, namespace: str, natural_key: str) -> tuple[Delete, ...]:
        """Return the deletes of the blob's manifest and chunks, each guarded by its revision.

        Empty when there is no blob. The manifest is verified first, so a
        forged one cannot direct the deletion of other rows.
        """
        return self.deletes_at(namespace, self._repo.key_digest(namespace, natural_key))

    def deletes_at(self, namespace: str, key_digest: str) -> tuple[Delete, ...]:
        """Return ``deletes`` for a blob known by its key digest (found by a listing)."""
        manifest = self._manifest(namespace, key_digest)
        if manifest is None:
            return ()
        chunks = (
            Delete(BLOB_CHUNKS, self._chunk_key(namespace, key_digest, index), revision)
            for index, revision in enumerate(manifest.chunk_revisions)
        )
        return (Delete(namespace, key_digest, manifest.revision), *chunks)

    def _chunk_key(self, namespace: str, key_digest: str, index: int) -> str:
        return self._repo.keyed_digest(
            _CHUNK_KEY_TAG, canonical_bytes([namespace, key_digest, index])
        )

    def _previous(
        self, namespace: str, key_digest: str, expected: ExpectedRevision
    ) -> BlobInfo | None:
        """Return the manifest a rewrite replaces; ``None`` for a create."""
        if expected is Guard.ABSENT:
            return None
        previous = self._manifest(namespace, key_digest)
        found = None if previous is None else previous.revision
        if isinstance(expected, int) and found != expected:
            raise RevisionConflict(
                "blob manifest revision does not match the write's guard",
                guard="upsert",
                namespace=namespace,
                key_digest=key_digest,
                expected=expected,
                actual=found,
            )
        return previous

    def _manifest(self, namespace: str, key_digest: str) -> BlobInfo | None:
        record = self._store.load(namespace, key_digest)
        if record is None:
            return None
        opened = self._repo.open(record, namespace=namespace, key_digest=key_digest)
        document = opened.document
        if not isinstance(document, dict) or document.keys() != _MANIFEST_FIELDS:
            raise _broken("the record at this key is not a blob manifest", namespace, key_digest)
        size, digest, revisions = document["size"], document["digest"], document["revisions"]
        if (
            document["format"] != BLOB_FORMAT
            or document["chunk_bytes"] != CHUNK_BYTES
            or type(size) is not int
            or not 0 <= size <= MAX_BLOB_BYTES
            or not isinstance(digest, str)
            or not DIGEST_PATTERN.fullmatch(digest)
            or not isinstance(revisions, list)
            or len(revisions) != _chunk_count(size, CHUNK_BYTES)
        ):
            raise _broken("the blob manifest is malformed", namespace, key_digest)
        chunk_revisions = tuple(r for r in revisions if type(r) is int and r >= 1)
        if len(chunk_revisions) != len(revisions):
            raise _broken("the blob manifest is malformed", namespace, key_digest)
        return BlobInfo(
            key_digest=key_digest,
            revision=opened.revision,
            size=size,
            digest=digest,
            chunks=len(chunk_revisions),
            ledger_index=opened.metadata.header.ledger_index,
            chunk_revisions=chunk_revisions,
        )

    def __repr__(self) -> str:
        return "BlobStore()"


def _load_chunks(repository: SealedRepository, keys: Sequence[str]) -> list[StoredRecord | None]:
    """Load the chunk rows ``keys`` name, in order (``None`` for a missing one): one load each."""
    store = repository.store
    return [store.load(BLOB_CHUNKS, key) for key in keys]
