"""Key rotation: re-seal every record still under an older key onto the primary key.

Rotation keeps no state of its own: a record still under an older key id
is by definition not yet done, so a rotation stopped by a crash resumes by
running again. Each batch is one unit of work whose upserts are guarded by
the revision and the exact seal they read; a record changed meanwhile fails
its guard and is re-read, never overwritten. Writers seal under the primary key already, so
a record they changed is usually done by the time it is re-read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from flowvault.application._records import (
    MAX_LIST_LIMIT,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application._sealed import SealedRepository
from flowvault.application.ports import StoreStats
from flowvault.domain import InvalidInput, RevisionConflict

DEFAULT_BATCH = 200
MAX_BATCH = 1000
MAX_BATCH_BYTES = 32 * 1024 * 1024
"""Sealed payload (32 MiB) one batch re-seals at most, so a batch of blob chunks stays small."""
RETRIES = 5
"""Times one record is re-read after a conflict before rotation gives up on it for this run."""

Progress = Callable[[int, int], None]
"""Called after each batch with (records re-sealed so far, records under older keys at start)."""


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What a rotation did, and the records per key id it left behind."""

    primary_key_id: str
    resealed: int
    changed_meanwhile: int
    by_key: Mapping[str, int]
    compacted: bool | None = None
    """Whether the old seals were also dropped from disk; ``None`` if the store cannot."""

    @property
    def remaining(self) -> int:
        """Records still sealed under a key other than the primary."""
        return _under_older_keys(self.by_key, self.primary_key_id)


def _under_older_keys(by_key: Mapping[str, int], primary_key_id: str) -> int:
    return sum(count for key_id, count in by_key.items() if key_id != primary_key_id)


class KeyRotation:
    """Re-seals records under older keys in bounded batches; safe to run beside writers.

    A re-seal overwrites the old seal in place, but a store's files may keep
    copies (a write-ahead log, free pages) until compacted, and those are
    what retiring a key is meant to make useless; so a rotation that
    re-sealed anything ends by compacting a store that can.
    """

    def __init__(self, repository: SealedRepository, *, batch_size: int = DEFAULT_BATCH) -> None:
        if type(batch_size) is not int or not 1 <= batch_size <= MAX_BATCH:
            raise InvalidInput(f"the batch size must be between 1 and {MAX_BATCH}")
        stats = repository.capabilities.stats
        if stats is None:
            raise InvalidInput("key rotation needs a store that counts records by key id")
        self._repo = repository
        self._stats: StoreStats = stats
        self._batch = batch_size

    def pending(self) -> int:
        """Return the number of records sealed under a key other than the primary."""
        return _under_older_keys(self._stats.key_id_counts(), self._repo.cipher.primary_key_id)

    def run(self, progress: Progress | None = None) -> RotationReport:
        """Re-seal every record under an older key; return the counts per key id after."""
        if progress is not None and not callable(progress):
            raise InvalidInput("progress must be a callable or None")
        total = self.pending()
        resealed = changed = 0
        for namespace in sorted(self._stats.namespace_counts()):
            for batch in self._stale_batches(namespace):
                done, skipped = self._rotate(batch)
                resealed += done
                changed += skipped
                if progress is not None:
                    progress(resealed, total)
        compactor = self._repo.capabilities.compactor
        compacted = compactor.compact() if resealed and compactor is not None else None
        return RotationReport(
            primary_key_id=self._repo.cipher.primary_key_id,
            resealed=resealed,
            changed_meanwhile=changed,
            by_key=dict(self._stats.key_id_counts()),
            compacted=compacted,
        )

    def _stale_batches(self, namespace: str) -> Iterator[list[RecordMetadata]]:
        """Page through ``namespace`` by key digest, yielding batches of rows under older keys.

        Metadata only, and a page at a time: memory stays bounded by the
        batch (``batch_size`` records, ``MAX_BATCH_BYTES`` of payload), not
        the namespace. Re-sealing changes no key digest, so the
        cursor stays valid while the batches commit.
        """
        primary = self._repo.cipher.primary_key_id
        store = self._repo.store
        batch: list[RecordMetadata] = []
        size = 0
        cursor: str | None = None
        while True:
            page = store.list(namespace, cursor=cursor, limit=MAX_LIST_LIMIT)
            for metadata in page.items:
                if metadata.header.key_id == primary:
                    continue
                if batch and size + metadata.byte_length > MAX_BATCH_BYTES:
                    yield batch
                    batch, size = [], 0
                batch.append(metadata)
                size += metadata.byte_length
                if len(batch) == self._batch:
                    yield batch
                    batch, size = [], 0
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        if batch:
            yield batch

    def _rotate(self, batch: list[RecordMetadata]) -> tuple[int, int]:
        """Commit one batch as one unit; on a conflict, fall back to one record at a time."""
        upserts = [upsert for metadata in batch if (upsert := self._reseal(metadata))]
        if not upserts:
            return 0, len(batch)
        try:
            self._repo.store.commit(UnitOfWork(upserts=upserts))
        except RevisionConflict:
            results = [self._rotate_one(upsert.metadata) for upsert in upserts]
            return sum(results), len(batch) - sum(results)
        return len(upserts), len(batch) - len(upserts)

    def _rotate_one(self, metadata: RecordMetadata) -> int:
        for _ in range(RETRIES):
            upsert = self._reseal(metadata)
            if upsert is None:
                return 0
            try:
                self._repo.store.commit(UnitOfWork(upserts=[upsert]))
            except RevisionConflict:
                continue
            return 1
        return 0

    def _reseal(self, metadata: RecordMetadata) -> Upsert | None:
        """Load the record as stored now and build its re-seal; ``None`` if nothing to do."""
        record = self._repo.store.load(metadata.namespace, metadata.key_digest)
        return None if record is None else self._repo.reseal(record)

    def __repr__(self) -> str:
        return f"KeyRotation(batch_size={self._batch})"
