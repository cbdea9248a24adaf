"""AES-256-GCM sealing under a key ring whose keys are named in every sealed value.

Wire format, version 1::

    0x01 | id length (1 byte) | key id (ASCII) | nonce (12 bytes) | ciphertext | tag (16 bytes)

The header (version, id length, key id) is authenticated as a prefix of the
associated data, so a value cannot be relabelled under another key or
version without failing its tag. Each master key yields, through HKDF-SHA256,
an encryption key, an integrity key and a key id, so the raw master key never
touches data and a digest can never be confused with a ciphertext key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flowvault.application._keys import MASTER_KEY_BYTES, KeyRing
from flowvault.domain import IntegrityFailure, InvalidInput

WIRE_VERSION = 0x01
_NONCE_BYTES = 12
_TAG_BYTES = 16
_ENCRYPTION_INFO = b"flowvault/v1/encryption"
_INTEGRITY_INFO = b"flowvault/v1/integrity"
_KEY_ID_INFO = b"flowvault/v1/key-id"
_KEY_ID_BYTES = 6
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def generate_master_key() -> bytes:
    """Return a fresh random master key from the operating system's CSPRNG."""
    return os.urandom(MASTER_KEY_BYTES)


def _derive(master_key: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(master_key)


def derive_integrity_key(master_key: bytes) -> bytes:
    """Return the integrity key a single master key implies.

    Written out into a ring when a second key joins, so the first key can
    later be retired while every keyed digest stays the same.
    """
    return _RingKey(master_key).integrity


def key_id_of(master_key: bytes) -> str:
    """Return the key id of ``master_key``, as sealed values name it."""
    return _RingKey(master_key).key_id


class _RingKey:
    """One master key's derived material; its repr names only the key id."""

    __slots__ = ("_aead", "integrity", "key_id")

    def __init__(self, master_key: bytes) -> None:
        if not isinstance(master_key, bytes) or len(master_key) != MASTER_KEY_BYTES:
            raise InvalidInput(f"a master key must be exactly {MASTER_KEY_BYTES} bytes")
        self.key_id = "k" + _derive(master_key, _KEY_ID_INFO, _KEY_ID_BYTES).hex()
        self._aead = AESGCM(_derive(master_key, _ENCRYPTION_INFO, MASTER_KEY_BYTES))
        self.integrity = _derive(master_key, _INTEGRITY_INFO, MASTER_KEY_BYTES)

    def encrypt(self, nonce: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
        return self._aead.encrypt(nonce, plaintext, associated_data)

    def decrypt(self, nonce: bytes, ciphertext: bytes, associated_data: bytes) -> bytes:
        return self._aead.decrypt(nonce, ciphertext, associated_data)

    def __repr__(self) -> str:
        return f"_RingKey(key_id={self.key_id!r})"


def _header(key_id: str) -> bytes:
    encoded = key_id.encode("ascii")
    return bytes((WIRE_VERSION, len(encoded))) + encoded


def _split(sealed: bytes) -> tuple[str, bytes, bytes, bytes]:
    """Parse ``sealed`` into key id, header, nonce and ciphertext-with-tag."""
    if len(sealed) < 2:
        raise IntegrityFailure("sealed value is too short to hold a header")
    if sealed[0] != WIRE_VERSION:
        raise IntegrityFailure("sealed value has an unknown wire version")
    id_end = 2 + sealed[1]
    if len(sealed) < id_end + _NONCE_BYTES + _TAG_BYTES:
        raise IntegrityFailure("sealed value is truncated")
    try:
        key_id = sealed[2:id_end].decode("ascii")
    except UnicodeDecodeError:
        raise IntegrityFailure("sealed value has a malformed key id") from None
    if not _KEY_ID.fullmatch(key_id):
        raise IntegrityFailure("sealed value has a malformed key id")
    nonce_end = id_end + _NONCE_BYTES
    return key_id, sealed[:id_end], sealed[id_end:nonce_end], sealed[nonce_end:]


class AesGcmCipher:
    """``Cipher`` sealing with AES-256-GCM under a primary key, opening under any ring key.

    Previous keys stay in the ring so values sealed before a rotation still
    open, but only the primary key seals, so nothing new lands under a key
    that is being retired. Keyed digests use the ring's integrity key, which
    no rotation changes; without one it is derived from the primary key.
    """

    def __init__(
        self,
        master_key: bytes,
        *,
        previous_keys: Sequence[bytes] = (),
        integrity_key: bytes | None = None,
    ) -> None:
        primary = _RingKey(master_key)
        self._primary = primary
        self._ring: dict[str, _RingKey] = {primary.key_id: primary}
        for key in previous_keys:
            previous = _RingKey(key)
            self._ring.setdefault(previous.key_id, previous)
        if integrity_key is not None and (
            not isinstance(integrity_key, bytes) or len(integrity_key) != MASTER_KEY_BYTES
        ):
            raise InvalidInput(f"an integrity key must be exactly {MASTER_KEY_BYTES} bytes")
        self._integrity = primary.integrity if integrity_key is None else integrity_key
        self._mac = hmac.new(self._integrity, digestmod=hashlib.sha256)

    @classmethod
    def from_ring(cls, ring: KeyRing) -> AesGcmCipher:
        """Build the cipher for a store's key ring."""
        return cls(ring.primary, previous_keys=ring.previous, integrity_key=ring.integrity)

    @property
    def primary_key_id(self) -> str:
        """Id of the key new seals use."""
        return self._primary.key_id

    def key_ids(self) -> frozenset[str]:
        """Ids of every key this cipher can open with."""
        return frozenset(self._ring)

    def seal(self, key_id: str, plaintext: bytes, associated_data: bytes) -> bytes:
        """Encrypt ``plaintext`` bound to ``associated_data`` and the header under the primary.

        Raises:
            InvalidInput: ``key_id`` is not the primary key's id (unknown or
                retired to open-only).

        """
        if key_id != self._primary.key_id:
            known = "an open-only previous key" if key_id in self._ring else "not in the ring"
            raise InvalidInput(f"cannot seal under key {key_id!r}: it is {known}")
        header = _header(key_id)
        nonce = os.urandom(_NONCE_BYTES)
        return header + nonce + self._primary.encrypt(nonce, plaintext, header + associated_data)

    def sealed_key_id(self, sealed: bytes) -> str:
        """Return the key id named in a sealed value's wire header, without decrypting.

        Raises:
            IntegrityFailure: the value is not in a known wire format.

        """
        return _split(sealed)[0]

    def open(self, sealed: bytes, associated_data: bytes) -> bytes:
        """Decrypt and authenticate a sealed value with the one key its header names.

        Raises:
            IntegrityFailure: unknown format or key id, or any changed byte
                of header, nonce, ciphertext, tag or associated data.

        """
        key_id, header, nonce, ciphertext = _split(sealed)
        key = self._ring.get(key_id)
        if key is None:
            raise IntegrityFailure(
                f"sealed value names key {key_id}, which is not in the ring",
                key_id=key_id,
                fix="use the key ring this record was sealed with: check FLOWVAULT_KEY or the "
                "key file; if the key is right, treat it as tampering and restore from a backup",
            )
        try:
            return key.decrypt(nonce, ciphertext, header + associated_data)
        except InvalidTag:
            raise IntegrityFailure(
                f"sealed value failed authentication under key {key_id}", key_id=key_id
            ) from None

    def keyed_digest(self, data: bytes) -> str:
        """Return ``sha256:<hex>`` HMAC-SHA-256 of ``data`` under the ring's integrity key.

        Copies an HMAC keyed once rather than keying a new one per call; a
        ledger check takes one digest per event.
        """
        mac = self._mac.copy()
        mac.update(data)
        return "sha256:" + mac.hexdigest()

    def __repr__(self) -> str:
        previous = sorted(self._ring.keys() - {self._primary.key_id})
        return (
            f"AesGcmCipher(primary_key_id={self._primary.key_id!r}, previous_key_ids={previous!r})"
        )
