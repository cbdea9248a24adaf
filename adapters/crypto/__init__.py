"""The cryptography adapter: AES-256-GCM sealing, the key file holding the ring, receipt signing."""

from flowvault.adapters.crypto._cipher import AesGcmCipher
from flowvault.adapters.crypto._key_file import FileKeyStore
from flowvault.adapters.crypto._signing import (
    Ed25519DecisionSignatures,
    Ed25519ReceiptSigner,
    Ed25519ReceiptVerifier,
    create_signing_key,
    load_public_key,
)

__all__ = [
    "AesGcmCipher",
    "Ed25519DecisionSignatures",
    "Ed25519ReceiptSigner",
    "Ed25519ReceiptVerifier",
    "FileKeyStore",
    "create_signing_key",
    "load_public_key",
]
