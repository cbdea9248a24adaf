"""Request-bound idempotency: a response replays only for the request that made it.

Each record is bound to the ``idempotency.recorded`` event of its own record
stream, named by the key's keyed digest. So a purged record put back is
refused, and a record deleted outside flowvault is refused rather than read
as never remembered (which would invite the request to be repeated).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from flowvault.application._freshness import (
    IDEMPOTENCY_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._instants import from_micros, micros
from flowvault.application._record_kind import (
    PURGE_BATCH,
    Doomed,
    RecordPurge,
    int_label,
    open_listed,
)
from flowvault.application._record_kinds import (
    MAX_IDEMPOTENCY_KEY,
    REQUEST_IDEMPOTENCY,
    REQUEST_TAG,
)
from flowvault.application._records import (
    Delete,
    Guard,
    RecordMetadata,
    UnitOfWork,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._tombstones import IDEMPOTENCY_STREAM
from flowvault.application.ports import Clock
from flowvault.domain import (
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    RevisionConflict,
)
from flowvault.domain._canonical import canonical_bytes, validate_json
from flowvault.domain._envelope import DIGEST_PATTERN, format_instant


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidInput(f"an idempotency key must be 1..{MAX_IDEMPOTENCY_KEY} characters")
    return key


class IdempotencyService:
    """Remember responses bound to the request that produced them, and replay only for it.

    The request is kept only as a keyed digest of its canonical JSON, so a
    replay proves the same request without the store holding it.
    """

    def __init__(self, repository: SealedRepository, clock: Clock) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._purge = RecordPurge(
            repository, clock, REQUEST_IDEMPOTENCY, "created_at", self._doomed
        )
        self._fresh = StreamPolicy[SealedDocument](
            "idempotency record", repository, leaves_record=leaves_unnamed
        )

    def remember(self, key: str, request: JsonValue, response: JsonValue) -> JsonValue:
        """Store ``response`` for ``key`` bound to ``request``; return the response kept.

        The first response wins: remembering again for the same request
        returns the stored response. ``response`` must not be ``null``, so
        ``recall`` can tell a remembered response from none.

        Raises:
            IdempotencyConflict: ``key`` is bound to another request, or to none.

        """
        if response is None:
            raise InvalidInput("a remembered response must not be null")
        _check_key(key)
        digest = self._request_digest(request)
        validate_json(response)
        existing = self._read(key)
        if existing is not None:
            return self._replayed(existing, digest)
        now = self._clock.now()
        document = {
            "request_digest": digest,
            "response": response,
            "created_at": format_instant(now),
        }
        record = self._repo.key_digest(REQUEST_IDEMPOTENCY, key)
        event = record_event(
            self._repo,
            record_stream(IDEMPOTENCY_KIND, record),
            "idempotency.recorded",
            record_payload(record),
            now,
        )
        upsert = self._repo.prepare(
            REQUEST_IDEMPOTENCY,
            key,
            document,
            expected=Guard.ABSENT,
            labels={"created_at": micros(now)},
            ledger_index=event.index,
        )
        try:
            self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
        except RevisionConflict:
            raced = self._read(key)
            if raced is None:
                raise
            return self._replayed(raced, digest)
        return response

    def recall(self, key: str, request: JsonValue) -> JsonValue | None:
        """Return the response remembered for ``key`` and this request, or ``None``.

        Raises:
            IdempotencyConflict: ``key`` was remembered for a different
                request, or its record carries no request digest. Such a record
                is never replayed: without a digest nothing proves it answers
                this request, and returning ``None`` would invite a repeat.
            IntegrityFailure: the record is older than its stream says, or
                was deleted outside flowvault (its stream records it, no purge).

        """
        _check_key(key)
        digest = self._request_digest(request)
        existing = self._read(key)
        return None if existing is None else self._replayed(existing, digest)

    def _read(self, key: str) -> SealedDocument | None:
        record = self._repo.key_digest(REQUEST_IDEMPOTENCY, key)
        return self._fresh.read_vouched(
            self._store,
            record_stream(IDEMPOTENCY_KIND, record),
            (REQUEST_IDEMPOTENCY, record),
            lambda: self._repo.read(REQUEST_IDEMPOTENCY, key),
        )

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete records written before ``now - older_than``; return how many.

        Idempotency records belong to no run, so their tombstones go to
        ``IDEMPOTENCY_STREAM``, in the same unit of work as the deletions.
        """
        return self._purge(now, older_than, batch_size)

    def _doomed(self, metadata: RecordMetadata) -> Doomed | None:
        """Doom a listed record by its sealed labels, or ``None`` if it vanished meanwhile.

        The listing's labels are in the clear: one an editor backdated would
        otherwise be purged early, under a keyed tombstone that makes the
        deletion look like retention's.
        """
        opened = open_listed(self._repo, metadata)
        return None if opened is None else _doomed_request(opened.metadata)

    def _request_digest(self, request: JsonValue) -> str:
        return self._repo.keyed_digest(REQUEST_TAG, canonical_bytes(request))

    @staticmethod
    def _replayed(opened: SealedDocument, digest: str) -> JsonValue:
        document = opened.document
        if not isinstance(document, dict):
            raise IntegrityFailure(
                "idempotency record has an unexpected shape", key_digest=opened.metadata.key_digest
            )
        stored = document.get("request_digest")
        if not isinstance(stored, str) or not DIGEST_PATTERN.fullmatch(stored):
            raise IdempotencyConflict("remembered response is bound to no request; not replayed")
        if stored != digest:
            raise IdempotencyConflict("idempotency key was already used for a different request")
        return document.get("response")


def _doomed_request(metadata: RecordMetadata) -> Doomed:
    created = from_micros(int_label(metadata, "created_at"))
    tombstone: dict[str, JsonValue] = {
        "kind": "idempotency",
        "record": metadata.key_digest,
        "created_at": format_instant(created),
    }
    delete = Delete(metadata.namespace, metadata.key_digest, metadata.revision)
    streams = (IDEMPOTENCY_STREAM, record_stream(IDEMPOTENCY_KIND, metadata.key_digest))
    return Doomed((delete,), streams, tombstone)


# -- evidence witnesses --------------------------------------------------------
