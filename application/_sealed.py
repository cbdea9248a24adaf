"""Sealed records: JSON documents or raw bytes encrypted above the port, bound to their row.

The envelope header is the AEAD associated data, and on read the header the
payload was sealed under must be the header of the row it came from, so a
ciphertext moved to another row, revision, schema version, class or key
fails closed. Labels and tags are sealed alongside the document and compared
on read, so the plaintext labels and tags of a row cannot be altered
unnoticed either. A document body and a byte body differ in their first
byte, so neither opens as the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Final, TypedDict, Unpack

from flowvault.application import _observability as observe
from flowvault.application._capabilities import StoreCapabilities
from flowvault.application._records import (
    MAX_PAYLOAD_BYTES,
    ExpectedRevision,
    Guard,
    LabelValue,
    RecordMetadata,
    StoredRecord,
    UnitOfWork,
    Upsert,
    check_expected_revision,
    check_tags,
)
from flowvault.application._seal_budget import SealBudget
from flowvault.application.ports import Cipher, Clock, SecureObjectStore
from flowvault.domain import (
    EnvelopeHeader,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    PayloadTooLarge,
    SchemaTooNew,
)
from flowvault.domain._canonical import canonical_bytes, digest_bytes
from flowvault.domain._envelope import Sensitivity

NATURAL_KEY_TAG = "flowvault.key/1"
SEALED_BODY_VERSION = 1
"""Version of the plaintext layout inside a seal: ``{"v", "labels", "document"}``.

A record with tags adds ``"tags"``, its sorted tag list; a body without the
field (every body sealed before tags existed) has none, so the version
stays and older rows open as they did.
"""
BYTES_BODY_PREFIX: Final = b"\x00flowvault.bytes/1\x00"
"""Start of a sealed byte body: prefix, labels length (4 bytes), canonical labels, the bytes.

Canonical JSON never starts with a NUL byte, so a document body and a byte
body cannot be taken for one another; the prefix is inside the AEAD
plaintext, so it is authenticated with the rest.
"""
TAGGED_BYTES_PREFIX: Final = b"\x00flowvault.bytes/2\x00"
"""Start of a sealed byte body with tags: as ``BYTES_BODY_PREFIX``, but the length-prefixed
part is canonical ``{"labels", "tags"}``. Bytes without tags keep the first layout."""
_BYTES_FAMILY: Final = b"\x00flowvault.bytes/"
_LABELS_LENGTH = 4


class SealOptions(TypedDict, total=False):
    """How a document is sealed, beyond its identity and guard."""

    sensitivity: Sensitivity
    schema_version: int
    labels: Mapping[str, LabelValue] | None
    ledger_index: int | None
    tags: AbstractSet[str] | None
    """Keyed digests the record carries (``Upsert.tags``), sealed with it and checked on open."""


@dataclass(frozen=True, slots=True)
class SealedDocument:
    """A document opened and verified, with the metadata of the row it came from."""

    document: JsonValue
    metadata: RecordMetadata

    @property
    def revision(self) -> int:
        """Revision of the row the document was read from."""
        return self.metadata.revision

    def __repr__(self) -> str:
        return f"SealedDocument(revision={self.revision}, key_digest={self.metadata.key_digest!r})"


@dataclass(frozen=True, slots=True)
class SealedBytes:
    """Bytes opened and verified, with the metadata of the row they came from."""

    data: bytes = field(repr=False)
    metadata: RecordMetadata

    @property
    def revision(self) -> int:
        """Revision of the row the bytes were read from."""
        return self.metadata.revision

    def __repr__(self) -> str:
        return (
            f"SealedBytes(size={len(self.data)}, revision={self.revision}, "
            f"key_digest={self.metadata.key_digest!r})"
        )


def _tampered(what: str, metadata: RecordMetadata) -> IntegrityFailure:
    return IntegrityFailure(
        f"sealed record failed verification: {what}",
        namespace=metadata.namespace,
        key_digest=metadata.key_digest,
        revision=metadata.revision,
    )


def tagged_digest(cipher: Cipher, tag: str, data: bytes | str) -> str:
    """Return the cipher's keyed digest of ``data`` under a purpose ``tag``."""
    if not isinstance(tag, str) or not isinstance(data, str | bytes):
        raise InvalidInput("a keyed digest takes a text tag and text or bytes data")
    try:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        return cipher.keyed_digest(tag.encode("utf-8") + b"\x00" + raw)
    except UnicodeEncodeError:
        raise InvalidInput("text to digest contains a lone surrogate") from None


class CipherDigester:
    """A ``KeyedDigester`` over a cipher alone, for checks that run before any repository."""

    def __init__(self, cipher: Cipher) -> None:
        self._cipher = cipher

    def keyed_digest(self, tag: str, data: bytes | str) -> str:
        """Return the keyed digest of ``data`` under ``tag``, as ``SealedRepository`` does."""
        return tagged_digest(self._cipher, tag, data)


KEY_DIGEST_MEMO: Final = 4096
"""Natural keys whose digest a repository remembers; every write and read of a record needs one."""


class SealedRepository:
    """Seals documents on write and opens and verifies them on read, over any store.

    ``capabilities`` are what the store offers beyond the port, found once
    (by the composition root, which looks them up on the store beneath any
    decorator); without them they are looked up on ``store`` here.
    """

    def __init__(
        self,
        store: SecureObjectStore,
        cipher: Cipher,
        clock: Clock,
        *,
        budget: SealBudget | None = None,
        capabilities: StoreCapabilities | None = None,
    ) -> None:
        self._store = store
        self._cipher = cipher
        self._clock = clock
        self._capabilities = StoreCapabilities.of(store) if capabilities is None else capabilities
        self._budget = budget or SealBudget(self._capabilities.seals)
        self._digests: dict[tuple[str, str], str] = {}

    @property
    def cipher(self) -> Cipher:
        """The cipher that seals and opens, whose primary key seals every write."""
        return self._cipher

    @property
    def budget(self) -> SealBudget:
        """The nonce budget every seal is charged against."""
        return self._budget

    @property
    def clock(self) -> Clock:
        """The clock that stamps every write."""
        return self._clock

    @property
    def store(self) -> SecureObjectStore:
        """The store this repository reads and writes."""
        return self._store

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the store offers beyond the port, as every service over this repository uses it."""
        return self._capabilities

    def key_digest(self, namespace: str, natural_key: str) -> str:
        """Return the keyed digest that addresses ``natural_key`` in ``namespace``.

        Keyed (HMAC), so a thief of the store cannot confirm a guessed key.
        """
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInput("a namespace must be a non-empty string")
        if not isinstance(natural_key, str) or not natural_key:
            raise InvalidInput("a natural key must be a non-empty string")
        known = self._digests.get((namespace, natural_key))
        if known is not None:
            return known
        digest = self._cipher.keyed_digest(
            canonical_bytes(["flowvault.key/1", namespace, natural_key])
        )
        if len(self._digests) >= KEY_DIGEST_MEMO:
            self._digests.clear()
        self._digests[namespace, natural_key] = digest
        return digest

    def keyed_digest(self, tag: str, data: bytes | str) -> str:
        """Return a keyed digest of ``data`` under a purpose ``tag``.

        For values that must be comparable but not guessable from the store
        or the ledger (result contents, who decided); the tag keeps digests
        made for one purpose from matching those made for another.
        """
        return tagged_digest(self._cipher, tag, data)

    def prepare(
        self,
        namespace: str,
        natural_key: str,
        document: object,
        *,
        expected: ExpectedRevision,
        **options: Unpack[SealOptions],
    ) -> Upsert:
        """Seal ``document`` into an upsert for a unit of work; nothing is written yet."""
        check_expected_revision(expected)
        key_digest = self.key_digest(namespace, natural_key)
        labels = options.get("labels") or {}
        tags = check_tags(options.get("tags") or ())
        body: dict[str, object] = {
            "v": SEALED_BODY_VERSION,
            "labels": dict(labels),
            "document": document,
        }
        if tags:
            body["tags"] = sorted(tags)
        return self._sealed(namespace, key_digest, expected, options, lambda: canonical_bytes(body))

    def prepare_bytes(
        self,
        namespace: str,
        natural_key: str,
        data: bytes,
        *,
        expected: ExpectedRevision,
        **options: Unpack[SealOptions],
    ) -> Upsert:
        """Seal raw ``data`` into an upsert, without the JSON wrapping (or base64) of a document.

        The body is a byte body (``BYTES_BODY_PREFIX``, or
        ``TAGGED_BYTES_PREFIX`` with tags), which ``open`` refuses, as
        ``open_bytes`` refuses a document. Labels and tags are sealed with it
        and checked on open, as for documents.
        """
        return self.prepare_bytes_at(
            namespace, self.key_digest(namespace, natural_key), data, expected=expected, **options
        )

    def prepare_bytes_at(
        self,
        namespace: str,
        key_digest: str,
        data: bytes,
        *,
        expected: ExpectedRevision,
        **options: Unpack[SealOptions],
    ) -> Upsert:
        """Seal raw ``data`` at a row named by its key digest, for rows no natural key names.

        The digest must come from this repository's key (``key_digest`` or
        ``keyed_digest``); the header binds it, so the sealed bytes open
        only at that row.
        """
        check_expected_revision(expected)
        if not isinstance(data, bytes):
            raise InvalidInput("sealed bytes must be bytes")
        if len(data) > MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(
                f"{len(data)} bytes exceed a record's {MAX_PAYLOAD_BYTES}",
                size=len(data),
                limit=MAX_PAYLOAD_BYTES,
            )
        labels = options.get("labels") or {}
        tags = check_tags(options.get("tags") or ())

        def body() -> bytes:
            if tags:
                prefix = TAGGED_BYTES_PREFIX
                encoded = canonical_bytes({"labels": dict(labels), "tags": sorted(tags)})
            else:
                prefix, encoded = BYTES_BODY_PREFIX, canonical_bytes(dict(labels))
            size = len(encoded).to_bytes(_LABELS_LENGTH, "big")
            return b"".join((prefix, size, encoded, data))

        return self._sealed(namespace, key_digest, expected, options, body)

    def _sealed(
        self,
        namespace: str,
        key_digest: str,
        expected: ExpectedRevision,
        options: SealOptions,
        plaintext: Callable[[], bytes],
    ) -> Upsert:
        """Seal the body ``plaintext`` builds under a new header for the row; charge the budget.

        The body is built after the header is checked, so a bad namespace
        is refused before a large body is encoded.
        """
        labels = options.get("labels") or {}
        tags = check_tags(options.get("tags") or ())
        header = EnvelopeHeader(
            namespace=namespace,
            key_digest=key_digest,
            sensitivity=options.get("sensitivity", Sensitivity.CONFIDENTIAL),
            schema_version=options.get("schema_version", 1),
            key_id=self._cipher.primary_key_id,
            revision=self._next_revision(namespace, key_digest, expected),
            written_at=self._clock.now(),
            ledger_index=options.get("ledger_index"),
        )
        body = plaintext()
        self._budget.charge(header.key_id)
        sealed = self._cipher.seal(header.key_id, body, header.aad())
        observe.key_used("seal", header.key_id)
        return Upsert(header=header, payload=sealed, expected=expected, labels=labels, tags=tags)

    def reseal(self, record: StoredRecord) -> Upsert | None:
        """Return an upsert re-sealing ``record`` under the primary key, or ``None`` if it is.

        The record is verified and opened first, so a damaged row fails
        closed instead of being laundered under a new key. The sealed body,
        the revision and the write time stay as they were; only the key id
        in the header, and so the associated data, changes.
        """
        if not isinstance(record, StoredRecord):
            raise InvalidInput("a reseal takes a StoredRecord as loaded from the store")
        metadata = record.metadata
        primary = self._cipher.primary_key_id
        if metadata.header.key_id == primary:
            return None
        plaintext = self._verified_plaintext(
            record, namespace=metadata.namespace, key_digest=metadata.key_digest
        )
        _check_body(plaintext, metadata)
        header = metadata.header.model_copy(update={"key_id": primary})
        self._budget.charge(primary)
        sealed = self._cipher.seal(primary, plaintext, header.aad())
        observe.key_used("seal", primary)
        return Upsert(
            header=header,
            payload=sealed,
            expected=metadata.revision,
            labels=metadata.labels,
            replaces=metadata.payload_digest,
            tags=metadata.tags,
        )

    def _next_revision(self, namespace: str, key_digest: str, expected: ExpectedRevision) -> int:
        if expected is Guard.ABSENT:
            return 1
        if expected is Guard.ANY:
            current = self._store.peek_metadata(namespace, key_digest)
            return 1 if current is None else current.revision + 1
        return expected + 1

    def write(
        self,
        namespace: str,
        natural_key: str,
        document: object,
        *,
        expected: ExpectedRevision,
        **options: Unpack[SealOptions],
    ) -> RecordMetadata:
        """Seal and commit one document on its own; return the metadata written."""
        upsert = self.prepare(namespace, natural_key, document, expected=expected, **options)
        self._store.commit(UnitOfWork(upserts=[upsert]))
        return upsert.metadata

    def read(
        self,
        namespace: str,
        natural_key: str,
        *,
        sensitivity: Sensitivity | None = None,
        max_schema_version: int | None = None,
    ) -> SealedDocument | None:
        """Load, verify and open a document, or return ``None`` when absent.

        Raises:
            IntegrityFailure: the row or its seal does not verify, or it was
                written under another sensitivity class than ``sensitivity``.
            SchemaTooNew: it was written under a schema above ``max_schema_version``.

        """
        if sensitivity is not None and not isinstance(sensitivity, Sensitivity):
            raise InvalidInput("sensitivity must be a Sensitivity or None")
        if max_schema_version is not None and type(max_schema_version) is not int:
            raise InvalidInput("max_schema_version must be an integer or None")
        key_digest = self.key_digest(namespace, natural_key)
        record = self._store.load(namespace, key_digest)
        if record is None:
            return None
        opened = self.open(record, namespace=namespace, key_digest=key_digest)
        header = record.metadata.header
        if sensitivity is not None and header.sensitivity is not sensitivity:
            raise _tampered("written under another sensitivity class", record.metadata)
        if max_schema_version is not None and header.schema_version > max_schema_version:
            raise SchemaTooNew(
                f"record schema {header.schema_version} is newer than {max_schema_version}",
                schema_version=header.schema_version,
                supported=max_schema_version,
            )
        return opened

    def open(self, record: StoredRecord, *, namespace: str, key_digest: str) -> SealedDocument:
        """Verify a loaded record against the row it was asked for, then decrypt it.

        Raises ``IntegrityFailure`` for a byte body (``prepare_bytes``) too.
        """
        plaintext = self._verified_plaintext(record, namespace=namespace, key_digest=key_digest)
        metadata = record.metadata
        return SealedDocument(document=self._unwrap(plaintext, metadata), metadata=metadata)

    def open_bytes(self, record: StoredRecord, *, namespace: str, key_digest: str) -> SealedBytes:
        """Verify a loaded record against the row it was asked for, then decrypt its bytes.

        Raises ``IntegrityFailure`` for a document body (``prepare``) too.
        """
        plaintext = self._verified_plaintext(record, namespace=namespace, key_digest=key_digest)
        metadata = record.metadata
        return SealedBytes(data=_unwrap_bytes(plaintext, metadata), metadata=metadata)

    def read_bytes(self, namespace: str, natural_key: str) -> SealedBytes | None:
        """Load, verify and open bytes sealed by ``prepare_bytes``; ``None`` when absent."""
        key_digest = self.key_digest(namespace, natural_key)
        record = self._store.load(namespace, key_digest)
        if record is None:
            return None
        return self.open_bytes(record, namespace=namespace, key_digest=key_digest)

    def verify(self, record: StoredRecord, *, namespace: str, key_digest: str) -> None:
        """Check a loaded record's seal, row binding, body layout, labels and tags, of any body.

        For readers that check every row without knowing its kind (an audit).
        """
        plaintext = self._verified_plaintext(record, namespace=namespace, key_digest=key_digest)
        _check_body(plaintext, record.metadata)

    def _verified_plaintext(
        self, record: StoredRecord, *, namespace: str, key_digest: str
    ) -> bytes:
        metadata = record.metadata
        header = metadata.header
        if (header.namespace, header.key_digest) != (namespace, key_digest):
            raise _tampered("the store returned another row", metadata)
        payload = record.payload
        if len(payload) != metadata.byte_length or digest_bytes(payload) != metadata.payload_digest:
            raise _tampered("payload length or digest differs from the row", metadata)
        if self._cipher.sealed_key_id(payload) != header.key_id:
            raise _tampered("sealed under another key than the row names", metadata)
        plaintext = self._cipher.open(payload, header.aad())
        observe.key_used("open", header.key_id)
        return plaintext

    @staticmethod
    def _unwrap(plaintext: bytes, metadata: RecordMetadata) -> JsonValue:
        """Parse an authenticated body.

        The AEAD tag has just proved these bytes are what ``prepare`` sealed:
        canonical JSON of a checked document. So the plain parser suffices;
        the strict one (a Python hook per object and number) only guards
        text nobody has vouched for.
        """
        if plaintext.startswith(_BYTES_FAMILY):
            raise _tampered("sealed body holds bytes, not a document", metadata)
        try:
            body = json.loads(plaintext)
        except (ValueError, RecursionError):
            raise _tampered("sealed body is not canonical JSON", metadata) from None
        if not isinstance(body, dict) or body.get("v") != SEALED_BODY_VERSION:
            raise _tampered("sealed body has an unknown layout", metadata)
        if body.get("labels") != dict(metadata.labels):
            raise _tampered("labels differ from the sealed copy", metadata)
        _check_tags(body.get("tags", []), metadata)
        return body.get("document")


def _check_tags(sealed: object, metadata: RecordMetadata) -> None:
    """Refuse a row whose tags are not the sorted list sealed with it (none when absent)."""
    if sealed != sorted(metadata.tags):
        raise _tampered("tags differ from the sealed copy", metadata)


def _unwrap_bytes(plaintext: bytes, metadata: RecordMetadata) -> bytes:
    """Split an authenticated byte body into labels and tags, checked against the row, and bytes."""
    tagged = plaintext.startswith(TAGGED_BYTES_PREFIX)
    if not tagged and not plaintext.startswith(BYTES_BODY_PREFIX):
        raise _tampered("sealed body holds a document, not bytes", metadata)
    start = len(BYTES_BODY_PREFIX) + _LABELS_LENGTH
    size = int.from_bytes(plaintext[len(BYTES_BODY_PREFIX) : start], "big")
    if len(plaintext) < start + size:
        raise _tampered("sealed byte body is cut short", metadata)
    try:
        head = json.loads(plaintext[start : start + size])
    except (ValueError, RecursionError):
        raise _tampered("sealed byte body has unreadable labels", metadata) from None
    labels, tags = (head.get("labels"), head.get("tags")) if tagged else (head, [])
    if labels != dict(metadata.labels):
        raise _tampered("labels differ from the sealed copy", metadata)
    _check_tags(tags, metadata)
    return plaintext[start + size :]


def _check_body(plaintext: bytes, metadata: RecordMetadata) -> None:
    """Check an authenticated body of either layout: its labels and tags must be the row's."""
    if plaintext.startswith(_BYTES_FAMILY):
        _unwrap_bytes(plaintext, metadata)
    else:
        SealedRepository._unwrap(plaintext, metadata)
