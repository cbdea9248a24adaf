"""The dependency-injector container: settings in, adapters and services out."""

from __future__ import annotations

from dependency_injector import containers, providers

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


def _backend(settings: Settings) -> str:
    return settings.backend


def _open_sqlite(settings: Settings) -> SQLiteSecureObjectStore:
    return SQLiteSecureObjectStore.open(
        settings.database_path,
        synchronous=settings.synchronous,
        busy_timeout=settings.busy_timeout,
        allow_insecure_permissions=settings.allow_insecure_permissions,
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
    )
    key_store = providers.Selector(
        providers.Callable(_backend, settings),
        memory=providers.Singleton(InMemoryKeyStore),
        sqlite=providers.Singleton(_file_key_store, settings),
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
