"""Evidence witnesses, stored once per content digest and verified on every read.

Each witness is bound to the newest event of its own record stream that
wrote it (``witness.captured``, then ``witness.located`` for each locator
added), so a witness deleted outside flowvault is refused rather than read
as never captured (and captured again under another locator or time), and
an older copy put back, short of a locator, is refused as stale.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from flowvault.application._freshness import (
    FRESH_READ_TRIES,
    WITNESS_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._graph import (
    KeyedDigester,
    require_integrity,
)
from flowvault.application._instants import aware, micros
from flowvault.application._record_kinds import MAX_WITNESS_BYTES, WITNESS_TAG, WITNESSES
from flowvault.application._records import (
    ExpectedRevision,
    Guard,
    UnitOfWork,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._signing import integrity_digest, signed
from flowvault.application.ports import Clock
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    Witness,
)
from flowvault.domain._approvals import MAX_WITNESS_LOCATORS
from flowvault.domain._canonical import digest_bytes
from flowvault.domain._envelope import DIGEST_PATTERN


class EvidenceService:
    """Keep retrieved evidence once per content digest, verified on every read."""

    def __init__(
        self, repository: SealedRepository, clock: Clock, *, integrity: KeyedDigester | None
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._integrity = integrity
        self._fresh = StreamPolicy[SealedDocument](
            "witness", repository, leaves_record=leaves_unnamed
        )

    def capture_witness(
        self,
        locator: str,
        content: bytes,
        media_type: str,
        authority_class: str,
        retrieved_at: datetime,
    ) -> Witness:
        """Store ``content`` as evidence retrieved from ``locator``, once per content digest.

        The first capture fixes the witness's media type, authority class and
        times. Capturing the same bytes from another locator adds that
        locator to the witness (``witness.located``), up to
        ``MAX_WITNESS_LOCATORS``; from a locator it already records, it
        returns the witness unchanged.

        Raises:
            PayloadTooLarge: ``content`` exceeds ``MAX_WITNESS_BYTES``.
            InvalidInput: a locator over 2048 characters or with control
                characters, a media type that is not ``type/subtype``, an
                authority class that is not a short lowercase name, a naive
                time, or a new locator for a witness that already records
                ``MAX_WITNESS_LOCATORS``.
            RevisionConflict: the witness kept changing under every attempt.

        """
        key = require_integrity(self._integrity)
        if not isinstance(content, bytes):
            raise InvalidInput("content must be bytes")
        if len(content) > MAX_WITNESS_BYTES:
            raise PayloadTooLarge(
                f"evidence of {len(content)} bytes exceeds {MAX_WITNESS_BYTES}",
                size=len(content),
                limit=MAX_WITNESS_BYTES,
            )
        first = signed(
            Witness,
            key,
            WITNESS_TAG,
            {
                "content_digest": digest_bytes(content),
                "locator": locator,
                "media_type": media_type,
                "authority_class": authority_class,
                "size_bytes": len(content),
                "retrieved_at": aware(retrieved_at, "retrieved_at"),
                "captured_at": self._clock.now(),
                "content": content,
            },
        )
        expected: ExpectedRevision
        for _ in range(FRESH_READ_TRIES):
            found = self._find(key, first.content_digest)
            if found is None:
                written, expected, event_type = first, Guard.ABSENT, "witness.captured"
            else:
                stored, revision = found
                if locator in stored.locators:
                    return stored
                written = self._located(key, stored, locator)
                expected, event_type = revision, "witness.located"
            try:
                self._write(written, expected, event_type)
            except RevisionConflict:
                continue
            return written
        raise RevisionConflict("witness kept changing while it was captured; retry")

    def _located(self, key: KeyedDigester, witness: Witness, locator: str) -> Witness:
        """Return ``witness`` also recording ``locator``, signed again."""
        if len(witness.locators) >= MAX_WITNESS_LOCATORS:
            raise InvalidInput(
                f"witness already records {MAX_WITNESS_LOCATORS} locators",
                limit=MAX_WITNESS_LOCATORS,
            )
        fields = witness.model_dump(exclude={"integrity_digest"})
        later = (*witness.later_locators, locator)
        return signed(Witness, key, WITNESS_TAG, {**fields, "later_locators": later})

    def _write(self, witness: Witness, expected: ExpectedRevision, event_type: str) -> None:
        """Commit ``witness`` bound to a new event of its stream; ``RevisionConflict`` if raced."""
        document = {
            **witness.model_dump(mode="json", exclude={"content"}),
            "content": base64.b64encode(witness.content).decode("ascii"),
        }
        record = self._repo.key_digest(WITNESSES, witness.content_digest)
        event = record_event(
            self._repo,
            record_stream(WITNESS_KIND, record),
            event_type,
            record_payload(record),
            self._clock.now(),
        )
        upsert = self._repo.prepare(
            WITNESSES,
            witness.content_digest,
            document,
            expected=expected,
            labels={"captured_at": micros(witness.captured_at)},
            ledger_index=event.index,
        )
        self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))

    def load_witness(self, content_digest: str) -> Witness:
        """Return the verified witness for ``content_digest``; ``NotFound`` if none.

        Raises ``IntegrityFailure`` when the record, its bytes or its keyed
        integrity digest do not verify, or when it is missing although its
        record stream says it was captured.
        """
        key = require_integrity(self._integrity)
        if not isinstance(content_digest, str) or not DIGEST_PATTERN.fullmatch(content_digest):
            raise InvalidInput("content_digest must be a sha256:<64 hex> digest")
        found = self._find(key, content_digest)
        if found is None:
            raise NotFound("no such witness")
        return found[0]

    def _find(self, key: KeyedDigester, content_digest: str) -> tuple[Witness, int] | None:
        """Return the verified witness and its row's revision, or ``None`` if never captured."""
        record = self._repo.key_digest(WITNESSES, content_digest)
        opened = self._fresh.read_vouched(
            self._store,
            record_stream(WITNESS_KIND, record),
            (WITNESSES, record),
            lambda: self._repo.read(WITNESSES, content_digest),
        )
        if opened is None:
            return None
        witness = self._decoded(opened)
        if witness.content_digest != content_digest:
            raise IntegrityFailure("witness is stored under another digest")
        if integrity_digest(key, WITNESS_TAG, witness) != witness.integrity_digest:
            raise IntegrityFailure("witness failed its keyed integrity check")
        return witness, opened.revision

    @staticmethod
    def _decoded(opened: SealedDocument) -> Witness:
        document = opened.document
        try:
            if not isinstance(document, dict) or not isinstance(document.get("content"), str):
                raise ValueError("no content")
            raw = base64.b64decode(str(document["content"]), validate=True)
            return Witness.model_validate({**document, "content": raw})
        except (ValueError, binascii.Error, InvalidInput):
            raise IntegrityFailure(
                "witness has an unexpected shape", key_digest=opened.metadata.key_digest
            ) from None
