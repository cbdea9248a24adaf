"""The envelope header that travels with every sealed payload.

Its canonical bytes are the AEAD associated data, so a ciphertext opens only
under the exact row identity, revision, schema and key it was sealed for.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field

from flowvault.domain._canonical import content_hash
from flowvault.domain._errors import InvalidInput
from flowvault.domain._values import ValueModel

AAD_FORMAT = "flowvault.envelope/1"
"""Version tag bound into the associated data; bump it when the layout changes."""
_text = json.encoder.encode_basestring
"""How canonical JSON writes a string (``ensure_ascii=False``): quoted, escaped only as needed."""
_AAD_FORMAT_TEXT = _text(AAD_FORMAT)

MAX_NAMESPACE_LENGTH = 128

DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Sensitivity(StrEnum):
    """How much harm disclosure of a payload would do, lowest first."""

    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    RESTRICTED = "restricted"


def _check_digest(value: str) -> str:
    if not DIGEST_PATTERN.fullmatch(value):
        raise ValueError("must be sha256:<64 lowercase hex>")
    return value


_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Control, format, surrogate and line/paragraph separators: none occurs in printable ASCII."""


def _check_namespace(value: str) -> str:
    if not value or len(value) > MAX_NAMESPACE_LENGTH:
        raise ValueError(f"must be 1..{MAX_NAMESPACE_LENGTH} characters")
    if value.isascii() and value.isprintable():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode") from None
    if any(unicodedata.category(char) in _REFUSED_CATEGORIES for char in value):
        raise ValueError("must not contain control or format characters")
    return value


def _check_key_id(value: str) -> str:
    if not _KEY_ID.fullmatch(value):
        raise ValueError("must be 1..64 of [A-Za-z0-9_.-], starting alphanumeric")
    return value


def _check_aware(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be timezone-aware")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("lies outside the representable UTC range") from None


Digest = Annotated[str, AfterValidator(_check_digest)]
"""A ``sha256:<hex>`` digest string."""
Namespace = Annotated[str, AfterValidator(_check_namespace)]
"""A record namespace: short printable Unicode, no control characters."""
KeyId = Annotated[str, AfterValidator(_check_key_id)]
"""The identifier of an encryption key in a key ring."""
UtcDatetime = Annotated[datetime, AfterValidator(_check_aware)]
"""A timezone-aware instant, normalised to UTC."""


def format_instant(value: object) -> str:
    """Render an aware instant as fixed-width ISO-8601 UTC, sortable as text.

    Raises ``InvalidInput`` for anything else, since a naive time would be
    read in the local zone and hash differently on another machine.
    """
    if not isinstance(value, datetime):
        raise InvalidInput("expected a timezone-aware datetime")
    try:
        utc = _check_aware(value)
    except ValueError as exc:
        raise InvalidInput(f"instant {exc}") from None
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


class EnvelopeHeader(ValueModel):
    """Identity and provenance of one sealed payload; all of it is authenticated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: Namespace
    key_digest: Digest
    sensitivity: Sensitivity
    schema_version: int = Field(ge=1, le=2**31 - 1)
    key_id: KeyId
    revision: int = Field(ge=1, le=2**53 - 1)
    written_at: UtcDatetime
    ledger_index: int | None = Field(default=None, ge=0, le=2**53 - 1, strict=True)
    """Index of the ledger event committed with this write, when the record has a stream.

    Bound into the associated data, so a row replayed from an older revision
    names an older event, and a reader that finds a newer writing event in
    the record's stream knows the row is stale.
    """

    def aad(self) -> bytes:
        """Return the canonical, versioned associated data for this header.

        ``ledger_index`` joins only when set, so headers written before it
        existed keep their exact associated data.
        """
        return aad_text(self).encode("utf-8")


def aad_fields(header: EnvelopeHeader) -> dict[str, str | int]:
    """Return the fields of ``header``'s associated data, as canonical JSON would hold them."""
    fields: dict[str, str | int] = {
        "format": AAD_FORMAT,
        "namespace": header.namespace,
        "key_digest": header.key_digest,
        "sensitivity": header.sensitivity.value,
        "schema_version": header.schema_version,
        "key_id": header.key_id,
        "revision": header.revision,
        "written_at": format_instant(header.written_at),
    }
    if header.ledger_index is not None:
        fields["ledger_index"] = header.ledger_index
    return fields


def aad_text(header: EnvelopeHeader) -> str:
    """Return ``canonical_json(aad_fields(header))``, written out in its fixed key order.

    Every read and write computes it, and a validated header needs none of
    the general encoder's checks: its texts are validated (no lone
    surrogate), its numbers are bounded integers. The keys appear sorted,
    as canonical JSON sorts them; a test holds the two equal.
    """
    ledger = "" if header.ledger_index is None else f'"ledger_index":{header.ledger_index:d},'
    return (
        f'{{"format":{_AAD_FORMAT_TEXT},"key_digest":{_text(header.key_digest)},'
        f'"key_id":{_text(header.key_id)},{ledger}"namespace":{_text(header.namespace)},'
        f'"revision":{header.revision:d},"schema_version":{header.schema_version:d},'
        f'"sensitivity":{_text(header.sensitivity.value)},'
        f'"written_at":{_text(format_instant(header.written_at))}}}'
    )


def natural_key_digest(namespace: str, natural_key: str) -> str:
    """Digest a natural key so that stores and logs never hold it in clear.

    The namespace is bound in, so equal keys in two namespaces differ.
    """
    return content_hash(["flowvault.key/1", namespace, natural_key])
