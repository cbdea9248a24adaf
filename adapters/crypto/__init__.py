"""The cryptography adapter: AES-256-GCM sealing and the master key file."""

from flowvault.adapters.crypto._cipher import WIRE_VERSION, AesGcmCipher, generate_master_key
from flowvault.adapters.crypto._key_file import FileKeyStore

__all__ = ["WIRE_VERSION", "AesGcmCipher", "FileKeyStore", "generate_master_key"]
