"""Ed25519 receipt signatures: a private signing key file and its public key.

The signing key lives in a file with the same protections as the store's
key file (0600, its owner's, never a symlink); the public key is an ordinary
PEM file to hand to whoever checks receipts. Both are standard PEM
(PKCS#8 and SubjectPublicKeyInfo), readable by common tools.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from flowvault.adapters.crypto._key_file import FileKeyStore
from flowvault.domain import InvalidInput, KeyRequired
from flowvault.domain._receipt import ED25519_ALGORITHM, key_hint

SIGNER_NAME: Final = "flowvault-ed25519"
"""The signer name on Ed25519 signature lines."""

MAX_PUBLIC_KEY_FILE_BYTES: Final = 4096

_PUBLIC_FILE_MODE = 0o644


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class _Named:
    """The signer name and signed-note key hint both ends of a key pair show."""

    __slots__ = ("_hint",)

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self._hint = key_hint(SIGNER_NAME, ED25519_ALGORITHM, _raw_public(public_key))

    @property
    def name(self) -> str:
        """Always ``flowvault-ed25519``."""
        return SIGNER_NAME

    @property
    def hint(self) -> bytes:
        """The signed-note key hint of the public key."""
        return self._hint

    def __repr__(self) -> str:
        return f"{type(self).__name__}(hint={self._hint.hex()})"


class Ed25519ReceiptSigner(_Named):
    """Signs receipt bodies with an Ed25519 private key (a ``ReceiptSigner``)."""

    __slots__ = ("_key",)

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise InvalidInput("a receipt signer needs an Ed25519 private key")
        super().__init__(private_key.public_key())
        self._key = private_key

    def sign(self, message: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of ``message``."""
        return self._key.sign(message)

    def verifier(self) -> Ed25519ReceiptVerifier:
        """Return the matching public-key verifier."""
        return Ed25519ReceiptVerifier(self._key.public_key())

    def public_pem(self) -> bytes:
        """Return the public key as PEM (SubjectPublicKeyInfo), to hand to checkers."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


class Ed25519ReceiptVerifier(_Named):
    """Checks Ed25519 signature lines with a public key alone (a ``ReceiptVerifier``)."""

    __slots__ = ("_key",)

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        if not isinstance(public_key, Ed25519PublicKey):
            raise InvalidInput("a receipt verifier needs an Ed25519 public key")
        super().__init__(public_key)
        self._key = public_key

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Return whether ``signature`` is this key's signature of ``message``."""
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


class Ed25519DecisionSignatures:
    """Checks deciders' Ed25519 signatures by raw public keys (a ``DecisionSignatures``)."""

    def public_key(self, pem: bytes) -> bytes:
        """Return the raw key of a PEM Ed25519 public key, as ``keys signing-key`` writes one."""
        key: object = None
        if isinstance(pem, bytes) and len(pem) <= MAX_PUBLIC_KEY_FILE_BYTES:
            try:
                key = serialization.load_pem_public_key(pem)
            except (ValueError, TypeError, UnsupportedAlgorithm):
                key = None
        if not isinstance(key, Ed25519PublicKey):
            raise InvalidInput(
                "a decider's key must be a PEM Ed25519 public key",
                fix="register the decider's public key file (PEM Ed25519), such as the .pub "
                "file 'flowvault keys signing-key' writes",
            )
        return _raw_public(key)

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        """Return whether ``signature`` is ``public_key``'s signature of ``message``."""
        try:
            Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


def _file_store(path: Path, allow_insecure_permissions: bool) -> FileKeyStore:
    return FileKeyStore(
        path.parent, file_name=path.name, allow_insecure_permissions=allow_insecure_permissions
    )


def load_signing_key(
    path: Path, *, allow_insecure_permissions: bool = False
) -> Ed25519ReceiptSigner:
    """Read the signing key file (unencrypted PKCS#8 PEM) under the key file's checks.

    Raises:
        KeyRequired: no file exists at ``path``.
        InsecurePermissions: the file is exposed, a symlink, or not a regular file.
        InvalidInput: the file does not hold an Ed25519 private key.

    """
    content = _file_store(path, allow_insecure_permissions).read_bytes()
    if content is None:
        raise KeyRequired(f"no signing key file at {path}", path=str(path))
    try:
        key = serialization.load_pem_private_key(content, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(
            f"signing key file {path} does not hold an unencrypted PEM Ed25519 private key",
            path=str(path),
        )
    return Ed25519ReceiptSigner(key)


def create_signing_key(
    path: Path, *, allow_insecure_permissions: bool = False
) -> Ed25519ReceiptSigner:
    """Create a new signing key file at ``path`` (0600) and ``path.pub`` beside it.

    Refuses to replace either file: a lost signing key only means new
    receipts need a new public key, but an overwritten one silently
    invalidates every receipt its public key was meant to check.

    Raises:
        InvalidInput: a file already exists at ``path`` or ``path.pub``.

    """
    public_path = path.with_name(path.name + ".pub")
    if public_path.exists() or public_path.is_symlink():
        raise InvalidInput(f"{public_path} already exists; move it away first")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    if not _file_store(path, allow_insecure_permissions).create_bytes(private_pem):
        raise InvalidInput(f"signing key file {path} already exists; it is never overwritten")
    signer = Ed25519ReceiptSigner(key)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(public_path, flags, _PUBLIC_FILE_MODE), "wb") as public_file:
        public_file.write(signer.public_pem())
        public_file.flush()
        os.fsync(public_file.fileno())
    directory = os.open(public_path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return signer


def load_public_key(path: Path) -> Ed25519ReceiptVerifier:
    """Read an Ed25519 public key (PEM SubjectPublicKeyInfo), as ``signing-key`` writes it.

    Raises:
        InvalidInput: the file cannot be read or holds no Ed25519 public key.

    """
    try:
        with open(path, "rb") as file:
            content = file.read(MAX_PUBLIC_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise InvalidInput(
            f"cannot read public key file {path}: {error.strerror}", path=str(path)
        ) from None
    except ValueError:
        raise InvalidInput("a public key path must not contain a NUL byte") from None
    key: object = None
    if len(content) <= MAX_PUBLIC_KEY_FILE_BYTES:
        try:
            key = serialization.load_pem_public_key(content)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            key = None
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidInput(
            f"public key file {path} does not hold a PEM Ed25519 public key",
            path=str(path),
            fix="pass the .pub file written beside the signing key, not the private key or "
            "another file",
        )
    return Ed25519ReceiptVerifier(key)


__all__ = [
    "SIGNER_NAME",
    "Ed25519DecisionSignatures",
    "Ed25519ReceiptSigner",
    "Ed25519ReceiptVerifier",
    "create_signing_key",
    "load_public_key",
    "load_signing_key",
]
