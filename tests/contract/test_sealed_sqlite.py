"""The security contract over the SQLite adapter, on a real file."""

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application.testing import SealedRepositoryContract

KEY = bytes(range(32))
OTHER_KEY = bytes(range(32, 64))


class TestSealedOverSQLite(SealedRepositoryContract):
    """Forged records planted in a SQLite file fail closed."""

    def make_store(self) -> SQLiteSecureObjectStore:
        return SQLiteSecureObjectStore.open(self.tmp_path / "data" / "store.db", create=True)

    def make_cipher(self) -> AesGcmCipher:
        return AesGcmCipher(KEY)

    def make_other_cipher(self) -> AesGcmCipher:
        return AesGcmCipher(OTHER_KEY)
