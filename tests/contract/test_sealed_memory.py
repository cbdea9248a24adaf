"""The security contract over the in-memory adapter with the AES-GCM cipher."""

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application.testing import SealedRepositoryContract

KEY = bytes(range(32))
OTHER_KEY = bytes(range(32, 64))


class TestSealedOverMemory(SealedRepositoryContract):
    """Forged records planted in the memory adapter fail closed."""

    def make_store(self) -> InMemorySecureObjectStore:
        return InMemorySecureObjectStore()

    def make_cipher(self) -> AesGcmCipher:
        return AesGcmCipher(KEY)

    def make_other_cipher(self) -> AesGcmCipher:
        return AesGcmCipher(OTHER_KEY)
