"""Deciders' registered Ed25519 public keys, and the check of their signed decisions.

A key is stored sealed under the decider's keyed digest with its own record
stream, so a key row deleted or put back outside flowvault is refused
rather than read as "no key" (which would let an unsigned decision pass as
that decider's).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._freshness import (
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._records import Guard, UnitOfWork
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application.ports import DecisionSignatures
from flowvault.domain import (
    DecisionSignatureInvalid,
    IntegrityFailure,
    InvalidInput,
    RevisionConflict,
)

DECIDER_KEYS: Final = "flowvault.decider-keys"
DECIDER_KEY_KIND: Final = "decider-key"
"""Record streams ``decider-key/<digest>``: one decider's public key each."""
_SIGNATURE_BYTES: Final = 64
_PUBLIC_KEY_BYTES: Final = 32


class DeciderKeys:
    """Register a decider's public key; check that their decisions carry its signature."""

    def __init__(self, repository: SealedRepository, signatures: DecisionSignatures | None) -> None:
        self._repo = repository
        self._signatures = signatures
        self._fresh = StreamPolicy[SealedDocument](
            "decider key", repository, leaves_record=leaves_unnamed
        )

    def register(self, decider: str, public_key_pem: bytes, now: datetime) -> None:
        """Keep ``public_key_pem`` as ``decider``'s key; the same key again changes nothing.

        A different key replaces the old one for decisions made from now
        on; statements signed before stay checkable with the old public key.
        """
        signatures = self._require_signatures()
        raw = signatures.public_key(public_key_pem)
        settle(lambda: self._register_once(decider, raw, now), "decider key")

    def _register_once(self, decider: str, raw: bytes, now: datetime) -> bool | Literal[Lost.RACE]:
        """Commit ``raw`` as the decider's key unless it is already; ``LOST`` on a race."""
        current = self._read(decider)
        if current is not None and _raw_key(current) == raw:
            return False
        key_digest = self._repo.key_digest(DECIDER_KEYS, decider)
        event = record_event(
            self._repo,
            record_stream(DECIDER_KEY_KIND, key_digest),
            "decider_key.registered",
            record_payload(key_digest),
            now,
        )
        upsert = self._repo.prepare(
            DECIDER_KEYS,
            decider,
            {"public_key": raw.hex()},
            expected=Guard.ABSENT if current is None else current.revision,
            ledger_index=event.index,
        )
        try:
            self._repo.store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
        except RevisionConflict:
            return LOST
        return True

    def checked_signature(
        self, decider: str, statement: bytes, signature: bytes | None
    ) -> str | None:
        """Return the signature (hex) to record, or ``None`` for a decider without a key.

        Raises:
            DecisionSignatureInvalid: the decider has a key and the signature
                is missing or is not that key's over ``statement``.
            InvalidInput: a signature for a decider with no registered key.

        """
        if signature is not None and (
            not isinstance(signature, bytes) or len(signature) != _SIGNATURE_BYTES
        ):
            raise InvalidInput("a decision signature is 64 bytes of Ed25519 signature")
        opened = self._read(decider)
        if opened is None:
            if signature is not None:
                raise InvalidInput("this decider has no registered key; register it before signing")
            return None
        if signature is None:
            raise DecisionSignatureInvalid(
                "this decider has a registered key: sign the decision statement with it"
            )
        if not self._require_signatures().verify(_raw_key(opened), statement, signature):
            raise DecisionSignatureInvalid(
                "the signature is not the decider's over this decision statement"
            )
        return signature.hex()

    def _read(self, decider: str) -> SealedDocument | None:
        key_digest = self._repo.key_digest(DECIDER_KEYS, decider)
        return self._fresh.read_vouched(
            self._repo.store,
            record_stream(DECIDER_KEY_KIND, key_digest),
            (DECIDER_KEYS, key_digest),
            lambda: self._repo.read(DECIDER_KEYS, decider),
        )

    def _require_signatures(self) -> DecisionSignatures:
        if self._signatures is None:
            raise InvalidInput("decider keys need a signature checker; bootstrap() wires one")
        return self._signatures


def _raw_key(opened: SealedDocument) -> bytes:
    document = opened.document
    value = document.get("public_key") if isinstance(document, dict) else None
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != _PUBLIC_KEY_BYTES:
        raise IntegrityFailure("decider key record has an unexpected shape")
    return raw
