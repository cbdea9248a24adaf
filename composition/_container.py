"""The dependency-injector container: settings in, adapters and services out."""

from __future__ import annotations

from dependency_injector import containers, providers
from pydantic import SecretStr

from flowvault.adapters.crypto import AesGcmCipher, FileKeyStore, generate_master_key
from flowvault.adapters.memory import InMemoryKeyStore, InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import RandomIdFactory, SystemClock
from flowvault.application import (
    KEY_ENV,
    KeyStore,
    SealedRepository,
    SecureObjectStore,
    StoreStats,
    WorkflowService,
    check_key_matches,
    resolve_master_key,
)
from flowvault.composition._settings import Settings
from flowvault.domain import InvalidInput, KeyRequired, StoreUnavailable


def _backend(settings: Settings) -> str:
    return settings.backend


def _open_sqlite(settings: Settings) -> SQLiteSecureObjectStore:
    return SQLiteSecureObjectStore.open(
        settings.database_path,
        synchronous=settings.synchronous,
        busy_timeout=settings.busy_timeout,
        allow_insecure_permissions=settings.allow_insecure_permissions,
    )


def _postgres_dsn(dsn: SecretStr | None) -> str:
    if dsn is None or not dsn.get_secret_value().strip():
        raise InvalidInput("FLOWVAULT_POSTGRES_DSN must be set for the postgres backend")
    return dsn.get_secret_value()


def open_postgres(settings: Settings) -> SecureObjectStore:
    """Open the PostgreSQL store; psycopg is imported only when this backend is chosen."""
    dsn = _postgres_dsn(settings.postgres_dsn)
    try:
        from flowvault.adapters.postgres import (  # noqa: PLC0415 - an optional extra
            PostgresSecureObjectStore,
        )
    except ImportError:
        raise StoreUnavailable(
            "the postgres backend needs the postgres extra: pip install 'flowvault[postgres]'"
        ) from None
    return PostgresSecureObjectStore.open(
        dsn,
        schema=settings.postgres_schema,
        pool_size=settings.postgres_pool_size,
        statement_timeout=settings.postgres_statement_timeout,
        lock_timeout=settings.postgres_lock_timeout,
    )


class SharedStoreKeys:
    """``KeyStore`` for a store several hosts share: it keeps no key and never creates one.

    A key made up on one host would be unknown to the others, and a key
    file on one host is no place for the key of a shared database; the key
    comes from the host (explicit) or ``FLOWVAULT_KEY``, the same everywhere.
    """

    @property
    def location(self) -> str:
        """Where the key must come from."""
        return f"{KEY_ENV} (a PostgreSQL store keeps no key file; every host sets the same key)"

    def read(self) -> bytes | None:
        """Return ``None``: there is nothing stored to read."""
        return None

    def create(self, key: bytes) -> bytes:
        """Refuse: a new key is never invented for a shared store, even an empty one."""
        raise KeyRequired(
            f"a PostgreSQL store needs its key from {KEY_ENV} (or passed explicitly), "
            "the same on every host; generate one once and give it to all of them"
        )


def _file_key_store(settings: Settings) -> FileKeyStore:
    return FileKeyStore(
        settings.keys_dir, allow_insecure_permissions=settings.allow_insecure_permissions
    )


def build_cipher(
    settings: Settings, store: SecureObjectStore, key_store: KeyStore, explicit_key: bytes | None
) -> AesGcmCipher:
    """Resolve the master key under the never-over-data rule and build the cipher.

    A store that cannot say whether it holds records is treated as holding
    some, so a key is never invented for it.
    """
    stats = store if isinstance(store, StoreStats) else None
    environ = {KEY_ENV: settings.key.get_secret_value()} if settings.key is not None else {}
    master = resolve_master_key(
        explicit=explicit_key,
        environ=environ,
        key_store=key_store,
        store_has_data=stats.has_records() if stats is not None else True,
        new_key=generate_master_key,
    )
    cipher = AesGcmCipher(master)
    if stats is not None:
        check_key_matches(stats.key_id_counts(), cipher.key_ids())
    return cipher


class Container(containers.DeclarativeContainer):
    """Selects adapters from ``Settings``; any provider can be overridden by a host.

    ``store`` and ``key_store`` are ``Selector``s keyed by ``settings.backend``;
    a host that brings its own adapter overrides them with
    ``container.store.override(...)``. ``explicit_key`` is where a host hands
    in a key it manages itself.
    """

    settings = providers.Singleton(Settings.from_env)
    clock = providers.Singleton(SystemClock)
    ids = providers.Singleton(RandomIdFactory)
    explicit_key: providers.Object[bytes | None] = providers.Object(None)
    store = providers.Selector(
        providers.Callable(_backend, settings),
        memory=providers.Singleton(InMemorySecureObjectStore),
        sqlite=providers.Singleton(_open_sqlite, settings),
        postgres=providers.Singleton(open_postgres, settings),
    )
    key_store = providers.Selector(
        providers.Callable(_backend, settings),
        memory=providers.Singleton(InMemoryKeyStore),
        sqlite=providers.Singleton(_file_key_store, settings),
        postgres=providers.Singleton(SharedStoreKeys),
    )
    cipher = providers.Singleton(build_cipher, settings, store, key_store, explicit_key)
    repository = providers.Singleton(SealedRepository, store, cipher, clock)
    workflows = providers.Singleton(WorkflowService, repository, clock, ids)


def build_container(settings: Settings | None = None, *, key: bytes | None = None) -> Container:
    """Return a container for ``settings`` (read from the environment when ``None``)."""
    container = Container()
    if settings is not None:
        container.settings.override(providers.Object(settings))
    if key is not None:
        container.explicit_key.override(providers.Object(key))
    container.check_dependencies()
    return container
