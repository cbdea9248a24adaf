"""Plaintext-free summaries of stored records and the receipt base type."""

from __future__ import annotations

from datetime import datetime
from enum import Enum, StrEnum
from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from flowvault.domain._canonical import content_hash
from flowvault.domain._envelope import Digest, Namespace, UtcDatetime, format_instant
from flowvault.domain._errors import InvalidInput
from flowvault.domain._values import ValueModel


class Readability(StrEnum):
    """Whether a record could be opened with the keys at hand."""

    READABLE = "readable"
    UNREADABLE = "unreadable"
    ABSENT = "absent"


class Fingerprint(ValueModel):
    """What can be said about a record without revealing its payload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: Namespace
    key_digest: Digest
    readability: Readability
    schema_version: int | None = Field(default=None, ge=1)
    written_at: UtcDatetime | None = None
    byte_length: int | None = Field(default=None, ge=0)
    payload_digest: Digest | None = None


_RECEIPT_SAFE = (Enum, int, bool, datetime, type(None))


class Receipt(ValueModel):
    """A digest-only record that can be handed to an auditor as it is.

    Subclasses add fields; every string field must be a digest, a known
    enum value or the receipt kind, so no plaintext can ride along.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ClassVar[str] = "receipt"
    plain_fields: ClassVar[frozenset[str]] = frozenset()
    """Names of string fields that hold labels safe to show (e.g. a state)."""

    issued_at: UtcDatetime

    def model_post_init(self, context: object, /) -> None:
        """Refuse a receipt that carries a free-text string outside ``plain_fields``."""
        for name, value in self.__dict__.items():
            if isinstance(value, _RECEIPT_SAFE) or name in self.plain_fields:
                continue
            if isinstance(value, str) and value.startswith("sha256:"):
                continue
            raise InvalidInput(f"receipt field {name!r} is not digest-only")

    def body(self) -> dict[str, Any]:
        """Return the canonical body that the receipt digest covers."""
        body = self.model_dump(mode="json")
        body["issued_at"] = format_instant(self.issued_at)
        body["kind"] = self.kind
        return body

    @property
    def digest(self) -> str:
        """Content hash of the receipt, the handle an auditor quotes."""
        return content_hash(self.body())
