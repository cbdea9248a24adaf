"""The security contract over the PostgreSQL adapter, one fresh schema per test."""

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.application import SecureObjectStore
from flowvault.application.testing import SealedRepositoryContract

pytestmark = pytest.mark.postgres

KEY = bytes(range(32))
OTHER_KEY = bytes(range(32, 64))


class TestSealedOverPostgres(SealedRepositoryContract):
    """Forged records planted through PostgreSQL fail closed."""

    @pytest.fixture(autouse=True)
    def _server(self, postgres_server) -> None:
        self.server = postgres_server

    def make_store(self) -> PostgresSecureObjectStore:
        self.schema = self.server.new_schema()
        return PostgresSecureObjectStore.open(
            self.server.dsn, schema=self.schema, pool_size=2, create=True
        )

    def close_store(self, store: SecureObjectStore) -> None:
        store.close()
        self.server.drop_schema(self.schema)

    def make_cipher(self) -> AesGcmCipher:
        return AesGcmCipher(KEY)

    def make_other_cipher(self) -> AesGcmCipher:
        return AesGcmCipher(OTHER_KEY)
