"""Issuing, authenticating and checking ledger head receipts.

A receipt kept outside the store is the anchor a single-node store lacks:
the chain alone cannot show that its last events were deleted, that an older
copy of the database was restored, or that its whole history was rewritten
with recomputed hashes. Each receipt carries a MAC under the integrity key
(checkable by whoever holds the store key) and, when a signing key is
configured, Ed25519 signatures that anyone can check with the public key.
Terminal receipts of runs are signed by the same key, over a message with
its own tag, and checked here with the public key alone.
"""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final, Protocol

from pydantic import ValidationError

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import IntegrityFailure, InvalidInput, NotFound, TerminalReceipt
from flowvault.domain._receipt import HeadNote, HeadReceipt, ReceiptSignature

RECEIPT_MAC_TAG: Final = "flowvault.ledger-receipt/1"
"""Purpose tag of the MAC over a receipt's body."""

RECEIPT_MAC_NAME: Final = "flowvault-mac"
"""The signer name of a receipt's MAC line."""

_MAC_HINT_TAG: Final = "flowvault.ledger-receipt-hint/1"


class ReceiptSigner(Protocol):
    """Signs a receipt body; its ``name`` and ``hint`` head the signature line."""

    @property
    def name(self) -> str:
        """The signer name written on the signature line."""
        ...

    @property
    def hint(self) -> bytes:
        """The 4-byte key hint written before the signature."""
        ...

    def sign(self, message: bytes) -> bytes:
        """Return the signature of ``message``."""
        ...


class ReceiptVerifier(Protocol):
    """Checks the signature lines one key made (a public key, or the store's MAC key)."""

    @property
    def name(self) -> str:
        """The signer name this key's lines carry."""
        ...

    @property
    def hint(self) -> bytes:
        """The 4-byte key hint this key's lines carry."""
        ...

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Return whether ``signature`` is this key's over ``message``."""
        ...


class ReceiptMac:
    """Signs and verifies a receipt's MAC line: HMAC-SHA-256 under the integrity key."""

    def __init__(self, digester: KeyedDigester) -> None:
        self._digester = digester
        self._hint = bytes.fromhex(_raw_hex(digester.keyed_digest(_MAC_HINT_TAG, b""))[:8])

    @property
    def name(self) -> str:
        """Always ``flowvault-mac``."""
        return RECEIPT_MAC_NAME

    @property
    def hint(self) -> bytes:
        """A keyed 4-byte hint, so receipts of stores under other keys are told apart."""
        return self._hint

    def sign(self, message: bytes) -> bytes:
        """Return the MAC of ``message``."""
        return bytes.fromhex(_raw_hex(self._digester.keyed_digest(RECEIPT_MAC_TAG, message)))

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Compare in constant time."""
        return hmac.compare_digest(self.sign(message), signature)


def _raw_hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def head_note(store: SecureObjectStore, stream: str, *, issued_at: datetime) -> HeadNote:
    """Read what a receipt of ``stream`` asserts now.

    Raises:
        NotFound: the stream holds no events.

    """
    head = store.ledger_head(stream)
    first_page = store.read_ledger(stream, from_index=0, limit=1)
    if head is None or not first_page.events:
        raise NotFound(f"no ledger stream named {stream!r}", stream=stream)
    return HeadNote(
        stream=stream,
        size=head.index + 1,
        head_hash=head.event_hash,
        first_index=first_page.events[0].index,
        issued_at=issued_at,
    )


def issue_receipt(
    store: SecureObjectStore,
    digester: KeyedDigester,
    stream: str,
    *,
    issued_at: datetime,
    signers: tuple[ReceiptSigner, ...] = (),
) -> HeadReceipt:
    """Return a receipt of ``stream``'s head: the MAC line first, then each signer's line."""
    note = head_note(store, stream, issued_at=issued_at)
    body = note.body().encode("utf-8")
    lines = [_sign(ReceiptMac(digester), body)]
    lines += [_sign(signer, body) for signer in signers]
    return HeadReceipt(note, tuple(lines))


def _sign(signer: ReceiptSigner, body: bytes) -> ReceiptSignature:
    return ReceiptSignature(signer.name, signer.hint, signer.sign(body))


UNSIGNED_FIX = (
    "check it without --public-key (its MAC line, with the store key), or issue a signed "
    "receipt with FLOWVAULT_SIGNING_KEY_FILE set"
)
"""The remedy for an unsigned receipt checked with a public key: nothing was tampered with."""


FORGED_FIX = "get the receipt again from whoever issued it: this copy changed after signing"
"""The remedy for a receipt whose signature fails: the copy, not the store, is at fault."""


def authenticate(receipt: HeadReceipt, verifier: ReceiptVerifier) -> None:
    """Return if one of ``verifier``'s lines signs the receipt; else ``IntegrityFailure``.

    Lines by other keys are ignored, so a receipt signed by several parties
    can be checked by any one of them.
    """
    if not any(line.name == verifier.name for line in receipt.signatures):
        raise IntegrityFailure(
            f"the receipt carries no {verifier.name} signature: it was issued without a "
            "signing key",
            signer=verifier.name,
            fix=UNSIGNED_FIX,
        )
    lines = receipt.signed_by(verifier.name, verifier.hint)
    if not lines:
        raise IntegrityFailure(
            f"the receipt carries no {verifier.name} line for this key: it was not issued under it",
            signer=verifier.name,
            fix="check it with the public key of the signing key that issued it, or without "
            "--public-key (its MAC, with the store key)",
        )
    body = receipt.note.body().encode("utf-8")
    if not any(verifier.verify(body, line.value) for line in lines):
        raise IntegrityFailure(
            f"the receipt's {verifier.name} line does not verify: the receipt was altered "
            "or forged",
            signer=verifier.name,
            fix=FORGED_FIX,
        )


def sign_terminal_receipt(receipt: TerminalReceipt, signer: ReceiptSigner) -> TerminalReceipt:
    """Return ``receipt`` naming ``signer``'s key and carrying its Ed25519 signature.

    Raises:
        InvalidInput: ``signer`` does not make Ed25519 signatures.

    """
    hinted = receipt.model_copy(update={"signer_hint": signer.hint.hex()})
    signature = base64.b64encode(signer.sign(hinted.signed_message())).decode("ascii")
    try:
        return TerminalReceipt.model_validate(
            {**hinted.model_dump(), "ed25519_signature": signature}
        )
    except ValidationError:
        raise InvalidInput("terminal receipts are signed with an Ed25519 key only") from None


def authenticate_terminal(receipt: TerminalReceipt, verifier: ReceiptVerifier) -> None:
    """Return if ``verifier``'s public key signed ``receipt``; else ``IntegrityFailure``.

    Needs neither the store nor its key: the receipt carries everything
    its signature covers.
    """
    if receipt.signer_hint is None or receipt.ed25519_signature is None:
        raise IntegrityFailure(
            "the terminal receipt carries no Ed25519 signature: it was issued without a "
            "signing key",
            signer=verifier.name,
            fix=UNSIGNED_FIX,
        )
    if receipt.signer_hint != verifier.hint.hex():
        raise IntegrityFailure(
            f"the terminal receipt carries no {verifier.name} signature for this key: it "
            "was not issued under it",
            signer=verifier.name,
            fix="check it with the public key of the signing key that issued it",
        )
    raw = base64.b64decode(receipt.ed25519_signature)
    canonical = base64.b64encode(raw).decode("ascii") == receipt.ed25519_signature
    if not canonical or not verifier.verify(receipt.signed_message(), raw):
        raise IntegrityFailure(
            f"the terminal receipt's {verifier.name} signature does not verify: the receipt "
            "was altered or forged",
            signer=verifier.name,
            fix=FORGED_FIX,
        )


class ReceiptDefect(StrEnum):
    """How a stream departs from a receipt kept earlier."""

    TRUNCATED = "truncated"
    """The stream is shorter than the receipt saw: events deleted or an older copy restored."""
    REWRITTEN = "rewritten"
    """Another event sits at the receipt's head index: history rewritten, forked or rolled back."""
    UNANCHORED = "unanchored"
    """Retention trimmed the stream past the receipt's head, so it can no longer be compared."""


@dataclass(frozen=True, slots=True)
class ReceiptMismatch:
    """Where and why a stream no longer holds the head a receipt names."""

    defect: ReceiptDefect
    index: int
    reason: str


def compare_with_receipt(store: SecureObjectStore, note: HeadNote) -> ReceiptMismatch | None:
    """Return how ``note``'s stream departs from it, or ``None`` if the chain still holds it.

    Checks only the receipt's position; verify the stream's chain too, or
    an edited event between the receipt's head and the current one would pass.
    """
    if not isinstance(note, HeadNote):
        raise InvalidInput("compare a stream with a HeadNote")
    at = note.head_index
    head = store.ledger_head(note.stream)
    if head is None or head.index < at:
        ends = "holds no events" if head is None else f"ends at index {head.index}"
        return ReceiptMismatch(
            ReceiptDefect.TRUNCATED,
            at,
            f"the stream {ends} but the receipt saw index {at}: events were deleted "
            "or an older copy of the store restored",
        )
    page = store.read_ledger(note.stream, from_index=at, limit=1)
    event = page.events[0] if page.events else None
    if event is None or event.index != at:
        first = store.read_ledger(note.stream, from_index=0, limit=1).events
        if first and first[0].index > at:
            return ReceiptMismatch(
                ReceiptDefect.UNANCHORED,
                at,
                f"retention trimmed the stream to index {first[0].index}, past the "
                f"receipt's head at {at}: keep a newer receipt",
            )
        return ReceiptMismatch(ReceiptDefect.TRUNCATED, at, f"index {at} is missing")
    if event.event_hash != note.head_hash:
        return ReceiptMismatch(
            ReceiptDefect.REWRITTEN,
            at,
            f"the event at index {at} is not the one the receipt names: history was "
            "rewritten, forked, or rolled back and extended again",
        )
    return None


__all__ = [
    "RECEIPT_MAC_NAME",
    "RECEIPT_MAC_TAG",
    "ReceiptDefect",
    "ReceiptMac",
    "ReceiptMismatch",
    "ReceiptSigner",
    "ReceiptVerifier",
    "authenticate",
    "authenticate_terminal",
    "compare_with_receipt",
    "head_note",
    "issue_receipt",
    "sign_terminal_receipt",
]
