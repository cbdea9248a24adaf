"""The cryptography adapter: AES-256-GCM sealing and the key file that holds the ring."""

from flowvault.adapters.crypto._cipher import (
    WIRE_VERSION,
    AesGcmCipher,
    derive_integrity_key,
    generate_master_key,
    key_id_of,
)
from flowvault.adapters.crypto._key_file import FileKeyStore

__all__ = [
    "WIRE_VERSION",
    "AesGcmCipher",
    "FileKeyStore",
    "derive_integrity_key",
    "generate_master_key",
    "key_id_of",
]
