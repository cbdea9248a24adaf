"""Ledger head receipts: a plain, signed text note of a stream's size and head hash.

The format follows transparency-log checkpoints: a body of origin, size and
base64 head hash, then extension lines, a blank line, and one signature line
per signer (``— <name> <base64(4-byte key hint || signature)>``). Text makes a
receipt easy to keep anywhere (a ticket, a git repository, an email) and to
check with nothing but a public key. Everything here is pure: it formats and
parses, and leaves computing and checking MACs and signatures to callers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from urllib.parse import quote, unquote

from flowvault.domain._canonical import MAX_SAFE_INTEGER
from flowvault.domain._envelope import DIGEST_PATTERN, format_instant
from flowvault.domain._errors import InvalidInput
from flowvault.domain._ledger import MAX_NAME_LENGTH

RECEIPT_ORIGIN_PREFIX: Final = "flowvault.ledger/"
"""The origin line is this prefix and the percent-encoded stream name."""

MAX_RECEIPT_BYTES: Final = 8192
"""Longest receipt text accepted; a genuine one is well under 1 KiB."""

MAX_RECEIPT_SIGNATURES: Final = 16
"""Most signature lines a receipt may carry."""

SIGNATURE_DASH: Final = "\u2014"
"""Signature lines start with an em dash and a space, as in signed notes."""

KEY_HINT_BYTES: Final = 4

ED25519_ALGORITHM: Final = 0x01
"""The signed-note algorithm byte for Ed25519, bound into its key hint."""

_NAME = re.compile(r"[!-*,-~]{1,64}")
"""Signer names: printable ASCII without space or ``+``, as signed notes require."""
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,15}")
_INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def _stream_of_origin(line: str) -> str:
    if not line.startswith(RECEIPT_ORIGIN_PREFIX):
        raise InvalidInput(f"a receipt's first line must start with {RECEIPT_ORIGIN_PREFIX!r}")
    encoded = line[len(RECEIPT_ORIGIN_PREFIX) :]
    try:
        stream = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        raise InvalidInput("a receipt's origin line does not encode valid UTF-8") from None
    if not 1 <= len(stream) <= MAX_NAME_LENGTH or _origin(stream) != line:
        raise InvalidInput("a receipt's origin line does not name a stream canonically")
    return stream


def _origin(stream: str) -> str:
    return RECEIPT_ORIGIN_PREFIX + quote(stream, safe="/", errors="strict")


def _decimal(text: str, what: str) -> int:
    if not _DECIMAL.fullmatch(text) or int(text) > MAX_SAFE_INTEGER + 1:
        raise InvalidInput(f"a receipt's {what} must be a decimal number without leading zeros")
    return int(text)


def _b64decode(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"a receipt's {what} is not base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise InvalidInput(f"a receipt's {what} is not canonical base64")
    return raw


def _instant(text: str) -> datetime:
    if not _INSTANT.fullmatch(text):
        raise InvalidInput("a receipt's time must be YYYY-MM-DDTHH:MM:SS.ffffffZ")
    try:
        return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)
    except ValueError:
        raise InvalidInput("a receipt's time is not a real instant") from None


def key_hint(name: str, algorithm: int, public_key: bytes) -> bytes:
    """Return the 4-byte hint naming a verifier key, as signed notes compute it.

    The hint lets a checker pick its signature line without trying each one;
    it identifies, never authenticates.
    """
    material = name.encode("ascii") + b"\n" + bytes([algorithm]) + public_key
    return hashlib.sha256(material).digest()[:KEY_HINT_BYTES]


@dataclass(frozen=True, slots=True)
class ReceiptSignature:
    """One signature line: who signed (name and key hint) and the signature bytes."""

    name: str
    hint: bytes
    value: bytes

    def line(self) -> str:
        """Render the line, newline included."""
        encoded = base64.b64encode(self.hint + self.value).decode("ascii")
        return f"{SIGNATURE_DASH} {self.name} {encoded}\n"


@dataclass(frozen=True, slots=True)
class HeadNote:
    """What a receipt asserts: this stream had ``size`` events, ending in ``head_hash``.

    ``first_index`` is the first event still retained when the note was
    made (retention trims streams from the front), ``issued_at`` when.
    """

    stream: str
    size: int
    head_hash: str
    first_index: int
    issued_at: datetime

    def __post_init__(self) -> None:
        """Refuse a note no genuine stream could have; the text must round-trip."""
        if not isinstance(self.stream, str) or not 1 <= len(self.stream) <= MAX_NAME_LENGTH:
            raise InvalidInput(f"a receipt's stream must be 1..{MAX_NAME_LENGTH} characters")
        try:
            _origin(self.stream)
        except UnicodeEncodeError:
            raise InvalidInput("a receipt's stream must be valid Unicode") from None
        if type(self.size) is not int or not 1 <= self.size <= MAX_SAFE_INTEGER + 1:
            raise InvalidInput("a receipt's size must be a positive event count")
        if type(self.first_index) is not int or not 0 <= self.first_index < self.size:
            raise InvalidInput("a receipt's first index must lie within its size")
        if not isinstance(self.head_hash, str) or not DIGEST_PATTERN.fullmatch(self.head_hash):
            raise InvalidInput("a receipt's head hash must be sha256:<64 lowercase hex>")
        format_instant(self.issued_at)

    @property
    def head_index(self) -> int:
        """The index of the head event."""
        return self.size - 1

    def body(self) -> str:
        """Return the signed text: origin, size, base64 head, then the extension lines."""
        head = base64.b64encode(bytes.fromhex(self.head_hash.removeprefix("sha256:")))
        return (
            f"{_origin(self.stream)}\n{self.size}\n{head.decode('ascii')}\n"
            f"first {self.first_index}\n"
            f"time {format_instant(self.issued_at)}\n"
        )


@dataclass(frozen=True, slots=True)
class HeadReceipt:
    """A head note and its signature lines: the MAC line and any public-key signatures."""

    note: HeadNote
    signatures: tuple[ReceiptSignature, ...]

    def text(self) -> str:
        """Render the receipt exactly as ``parse_receipt`` reads it."""
        return self.note.body() + "\n" + "".join(s.line() for s in self.signatures)

    def signed_by(self, name: str, hint: bytes) -> list[ReceiptSignature]:
        """Return the signature lines naming this signer and key hint."""
        return [s for s in self.signatures if s.name == name and s.hint == hint]


def _signature(line: str) -> ReceiptSignature:
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] != SIGNATURE_DASH or not _NAME.fullmatch(parts[1]):
        raise InvalidInput("a receipt signature line must be '\u2014 <name> <base64>'")
    raw = _b64decode(parts[2], "signature")
    if len(raw) <= KEY_HINT_BYTES:
        raise InvalidInput("a receipt signature is too short to hold a key hint")
    return ReceiptSignature(parts[1], raw[:KEY_HINT_BYTES], raw[KEY_HINT_BYTES:])


def _extension(line: str, keyword: str) -> str:
    if not line.startswith(keyword + " "):
        raise InvalidInput(f"a receipt needs a '{keyword}' line after the head hash")
    return line[len(keyword) + 1 :]


def _note(lines: list[str]) -> HeadNote:
    if len(lines) != 5:
        raise InvalidInput("a receipt body has exactly five lines before the blank line")
    origin, size, head, first, time = lines
    raw_head = _b64decode(head, "head hash")
    if len(raw_head) != hashlib.sha256().digest_size:
        raise InvalidInput("a receipt's head hash must be 32 bytes")
    return HeadNote(
        stream=_stream_of_origin(origin),
        size=_decimal(size, "size"),
        head_hash="sha256:" + raw_head.hex(),
        first_index=_decimal(_extension(first, "first"), "first index"),
        issued_at=_instant(_extension(time, "time")),
    )


def parse_receipt(text: object) -> HeadReceipt:
    """Parse a receipt strictly; anything but the exact format is ``InvalidInput``.

    Only the canonical rendering is accepted, so a receipt that parses is
    byte-for-byte what was signed. Signatures are parsed, not checked.
    """
    if not isinstance(text, str):
        raise InvalidInput("a receipt must be text")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("a receipt must be valid Unicode") from None
    if size > MAX_RECEIPT_BYTES:
        raise InvalidInput(f"a receipt must be at most {MAX_RECEIPT_BYTES} bytes")
    if not text.endswith("\n") or "\r" in text:
        raise InvalidInput("a receipt's lines must each end with a newline, without CR")
    body, separator, tail = text.partition("\n\n")
    if not separator:
        raise InvalidInput("a receipt needs a blank line before its signatures")
    lines = tail.splitlines()
    if not lines or len(lines) > MAX_RECEIPT_SIGNATURES or "" in lines:
        raise InvalidInput(
            f"a receipt needs 1..{MAX_RECEIPT_SIGNATURES} signature lines after the blank line"
        )
    receipt = HeadReceipt(_note(body.split("\n")), tuple(_signature(line) for line in lines))
    if receipt.text() != text:
        raise InvalidInput("a receipt is not in its canonical form")
    return receipt


__all__ = [
    "ED25519_ALGORITHM",
    "KEY_HINT_BYTES",
    "MAX_RECEIPT_BYTES",
    "MAX_RECEIPT_SIGNATURES",
    "RECEIPT_ORIGIN_PREFIX",
    "SIGNATURE_DASH",
    "HeadNote",
    "HeadReceipt",
    "ReceiptSignature",
    "key_hint",
    "parse_receipt",
]
