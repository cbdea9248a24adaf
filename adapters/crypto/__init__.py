"""The cryptography adapter: AES-256-GCM sealing, the key file holding the ring, receipt signing."""

from flowvault.adapters.crypto._cipher import (
    WIRE_VERSION,
    AesGcmCipher,
    derive_integrity_key,
    generate_master_key,
    key_id_of,
)
from flowvault.adapters.crypto._key_file import FileKeyStore
from flowvault.adapters.crypto._signing import (
    SIGNER_NAME,
    Ed25519DecisionSignatures,
    Ed25519ReceiptSigner,
    Ed25519ReceiptVerifier,
    create_signing_key,
    load_public_key,
    load_signing_key,
)

__all__ = [
    "SIGNER_NAME",
    "WIRE_VERSION",
    "AesGcmCipher",
    "Ed25519DecisionSignatures",
    "Ed25519ReceiptSigner",
    "Ed25519ReceiptVerifier",
    "FileKeyStore",
    "create_signing_key",
    "derive_integrity_key",
    "generate_master_key",
    "key_id_of",
    "load_public_key",
    "load_signing_key",
]
