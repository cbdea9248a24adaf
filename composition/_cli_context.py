"""The ``CliContext`` the console entry point hands each verb: settings and what they open.

Each callable is a thin use of the container or bootstrap, so the verbs in
``flowvault.adapters.cli`` reach every store through the same wiring a
host gets, and never import the composition root or a store class.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from flowvault.adapters.cli._move import POSTGRES_SCHEMES
from flowvault.adapters.crypto import FileKeyStore
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import MarkFileStore
from flowvault.application import Cipher, ReceiptSigner, SecureObjectStore, StoreCapabilities
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._sealed import CipherDigester
from flowvault.composition._bootstrap import Runtime, bootstrap, is_cold_root, open_existing
from flowvault.composition._container import (
    NO_SHARED_KEY_FILE,
    anti_rollback,
    build_container,
    key_file_store,
    no_store,
    open_postgres,
    open_sqlite,
    receipt_signer,
)
from flowvault.composition._settings import Settings
from flowvault.domain import InvalidInput, KeyRequired


@dataclass(frozen=True, slots=True)
class CommandContext:
    """``CliContext`` over one ``Settings``: the global options applied to ``FLOWVAULT_*``."""

    settings: Settings

    def is_cold_root(self) -> bool:
        """Whether nothing exists yet: opening would have to create a store."""
        return is_cold_root(self.settings)

    def open_existing(self) -> Runtime | None:
        """Open the store and its services if it exists; ``None`` on a cold root."""
        return open_existing(self.settings)

    def bootstrap(self) -> Runtime:
        """Open the store and its services, creating them (and a key) when absent."""
        return bootstrap(self.settings, create=True)

    def open_store(self, *, read_only: bool = False, lenient: bool = False) -> SecureObjectStore:
        """Open the existing store alone, as the container does or read-only; create nothing."""
        settings = self.settings
        if lenient:
            settings = settings.model_copy(update={"allow_insecure_permissions": True})
        if not read_only:
            store: SecureObjectStore = build_container(settings).store()
            return store
        if settings.backend == "sqlite":
            if not settings.database_path.exists():
                raise no_store(str(settings.database_path))
            return SQLiteSecureObjectStore.open(
                settings.database_path, busy_timeout=settings.busy_timeout, read_only=True
            )
        if settings.backend == "postgres":
            return open_postgres(settings)
        return InMemorySecureObjectStore()

    def open_target(self, location: str, *, schema: str | None = None) -> SecureObjectStore:
        """Open (creating it) the store a move writes to: a PostgreSQL DSN or a SQLite home.

        The adapter is opened directly, with creation on: a move's target is
        created on purpose, and gets no key of its own.
        """
        if location.startswith(POSTGRES_SCHEMES):
            update: dict[str, object] = {
                "backend": "postgres",
                "postgres_dsn": SecretStr(location),
                "postgres_schema": schema or self.settings.postgres_schema,
            }
            return open_postgres(self.settings.model_copy(update=update), create=True)
        if schema is not None:
            raise InvalidInput("--to-schema names a PostgreSQL schema: give --to a DSN with it")
        target = self.settings.model_copy(update={"backend": "sqlite", "home": Path(location)})
        return open_sqlite(target, create=True)

    def key_file(self) -> FileKeyStore:
        """Return the key file; a PostgreSQL store without ``FLOWVAULT_KEY_FILE`` has none."""
        if self.settings.backend == "postgres" and self.settings.key_file is None:
            raise KeyRequired(NO_SHARED_KEY_FILE)
        return key_file_store(self.settings)

    def anti_rollback(
        self, store: SecureObjectStore, cipher: Cipher, capabilities: StoreCapabilities | None
    ) -> AntiRollback | None:
        """Return the high-water mark guarding ``store``, or ``None`` where none is kept."""
        return anti_rollback(self.settings, store, cipher, capabilities)

    @contextmanager
    def restore_guard(self, mark: Path) -> Iterator[AntiRollback | None]:
        """Open the store unguarded and yield the high-water mark at ``mark`` over it."""
        container = build_container(self.settings)
        opened = container.store()
        try:
            capabilities = container.capabilities()
            if capabilities.epoch is None:
                yield None
                return
            digester = CipherDigester(container.cipher())
            yield AntiRollback(opened, MarkFileStore(mark), digester, capabilities=capabilities)
        finally:
            opened.close()

    def receipt_signer(self) -> ReceiptSigner | None:
        """Return the configured receipt signer, if ``FLOWVAULT_SIGNING_KEY_FILE`` names one."""
        return receipt_signer(self.settings)

    def demo(self, home: Path) -> CommandContext:
        """Return the context of a fresh SQLite store at ``home``, keyed by its own key file."""
        update = {
            "backend": "sqlite",
            "home": home,
            "key": None,
            "postgres_dsn": None,
            "recover_runs_on_open": False,
        }
        return CommandContext(self.settings.model_copy(update=update))
