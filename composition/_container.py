"""The dependency-injector container: settings in, adapters and services out."""

from __future__ import annotations

from dependency_injector import containers, providers
from pydantic import SecretStr

from flowvault.adapters.crypto import (
    AesGcmCipher,
    Ed25519DecisionSignatures,
    Ed25519ReceiptSigner,
    FileKeyStore,
)
from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.adapters.crypto._signing import load_signing_key
from flowvault.adapters.memory import InMemoryKeyStore, InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import MarkFileStore, RandomIdFactory, SystemClock
from flowvault.application import (
    ActionResultService,
    Cipher,
    KeyStore,
    SealedRepository,
    SecureObjectStore,
    StoreCapabilities,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._high_water_store import HighWaterStore
from flowvault.application._keys import KEY_ENV, KeyRing, check_key_matches, resolve_key_ring
from flowvault.application._mark_flusher import MarkFlusher
from flowvault.application._observability import EventLog
from flowvault.application._seal_budget import SealBudget
from flowvault.application._sealed import CipherDigester
from flowvault.application._workflow_records import WorkflowRecords
from flowvault.composition._settings import Settings
from flowvault.domain import InvalidInput, KeyRequired, NotFound, StoreUnavailable

_log = EventLog("flowvault.high_water")
_store_log = EventLog("flowvault.store")


def _backend(settings: Settings) -> str:
    return settings.backend


SETUP_FIX = (
    "create it once with 'flowvault init' (a library host: bootstrap(settings, create=True)); "
    "if it should exist, check FLOWVAULT_HOME, FLOWVAULT_BACKEND and FLOWVAULT_POSTGRES_SCHEMA"
)


def no_store(location: str) -> NotFound:
    """Return the refusal to open a store that does not exist, with the fix that creates one."""
    return NotFound(
        f"no flowvault store at {location}, and nothing was created: {SETUP_FIX}",
        location=location,
        fix=SETUP_FIX,
    )


def open_sqlite(settings: Settings, create: bool = False) -> SQLiteSecureObjectStore:
    """Open the SQLite store the settings name, creating it only with ``create``."""
    try:
        return SQLiteSecureObjectStore.open(
            settings.database_path,
            synchronous=settings.synchronous,
            busy_timeout=settings.busy_timeout,
            allow_insecure_permissions=settings.allow_insecure_permissions,
            create=create,
        )
    except NotFound:
        raise no_store(str(settings.database_path)) from None


def _postgres_dsn(dsn: SecretStr | None) -> str:
    if dsn is None or not dsn.get_secret_value().strip():
        raise InvalidInput("FLOWVAULT_POSTGRES_DSN must be set for the postgres backend")
    return dsn.get_secret_value()


def open_postgres(settings: Settings, create: bool = False) -> SecureObjectStore:
    """Open the PostgreSQL store, creating its schema only with ``create``.

    psycopg is imported only when this backend is chosen.
    """
    dsn = _postgres_dsn(settings.postgres_dsn)
    try:
        from flowvault.adapters.postgres import (  # noqa: PLC0415 - an optional extra
            PostgresSecureObjectStore,
        )
    except ImportError:
        raise StoreUnavailable(
            "the postgres backend needs the postgres extra (psycopg is not installed)",
            fix="pip install 'flowvault[postgres]'",
        ) from None
    try:
        return PostgresSecureObjectStore.open(
            dsn,
            schema=settings.postgres_schema,
            pool_size=settings.postgres_pool_size,
            statement_timeout=settings.postgres_statement_timeout,
            lock_timeout=settings.postgres_lock_timeout,
            connect_timeout=settings.postgres_connect_timeout,
            create=create,
        )
    except NotFound:
        raise no_store(f"PostgreSQL schema {settings.postgres_schema}") from None


NO_SHARED_KEY_FILE = (
    "key rotation keeps the ring in a key file: set FLOWVAULT_KEY_FILE on every host to a "
    f"copy of the same file (move the key from {KEY_ENV} into it and unset {KEY_ENV})"
)


class SharedStoreKeys:
    """``KeyStore`` for a store several hosts share: it never creates a key.

    A key made up on one host would be unknown to the others, so the key
    comes from the host (explicit), ``FLOWVAULT_KEY``, or a key file named
    by ``FLOWVAULT_KEY_FILE`` of which every host keeps the same copy; only
    such a file can hold a ring for key rotation.
    """

    def __init__(self, key_file: FileKeyStore | None = None) -> None:
        self._file = key_file

    @property
    def location(self) -> str:
        """Where the key must come from."""
        if self._file is not None:
            return self._file.location
        return f"{KEY_ENV} (a PostgreSQL store keeps no key file; every host sets the same key)"

    def read(self) -> bytes | None:
        """Return the primary key of the shared key file, if one is configured."""
        return None if self._file is None else self._file.read()

    def read_ring(self) -> KeyRing | None:
        """Return the ring of the shared key file, if one is configured."""
        return None if self._file is None else self._file.read_ring()

    def replace_ring(self, ring: KeyRing, *, expected: KeyRing) -> None:
        """Rewrite the shared key file; copy it to every other host before they seal."""
        if self._file is None:
            raise KeyRequired(NO_SHARED_KEY_FILE)
        self._file.replace_ring(ring, expected=expected)

    def create(self, key: bytes) -> bytes:
        """Refuse: a new key is never invented for a shared store, even an empty one."""
        raise KeyRequired(
            f"a PostgreSQL store needs its key from {KEY_ENV}, FLOWVAULT_KEY_FILE or the host, "
            "the same on every host; generate one once and give it to all of them"
        )


def key_file_store(settings: Settings) -> FileKeyStore:
    """Return the key file of ``settings``: ``FLOWVAULT_KEY_FILE`` or ``<home>/keys/store.key``."""
    return FileKeyStore(
        settings.keys_dir,
        file_name=settings.key_path.name,
        allow_insecure_permissions=settings.allow_insecure_permissions,
    )


def _shared_keys(settings: Settings) -> SharedStoreKeys:
    return SharedStoreKeys(None if settings.key_file is None else key_file_store(settings))


def store_capabilities(store: SecureObjectStore) -> StoreCapabilities:
    """Look up what the opened store offers beyond the port, and say once what it lacks.

    Every service is handed this one value, so the store is not asked
    again; the warning names each guarantee flowvault cannot give without
    a capability, by tier (``docs/adapters.md``).
    """
    capabilities = StoreCapabilities.of(store)
    lost = capabilities.lost()
    if lost:
        _store_log.warning("store_guarantees_missing", store=type(store).__name__, lost=lost)
    return capabilities


def build_cipher(
    settings: Settings,
    capabilities: StoreCapabilities,
    key_store: KeyStore,
    explicit_key: bytes | None,
) -> AesGcmCipher:
    """Resolve the key ring under the never-over-data rule and build the cipher.

    A store that cannot say whether it holds records is treated as holding
    some, so a key is never invented for it.
    """
    stats = capabilities.stats
    environ = {KEY_ENV: settings.key.get_secret_value()} if settings.key is not None else {}
    ring = resolve_key_ring(
        explicit=explicit_key,
        environ=environ,
        key_store=key_store,
        store_has_data=stats.has_records() if stats is not None else True,
        new_key=generate_master_key,
    )
    cipher = AesGcmCipher.from_ring(ring)
    if stats is not None:
        check_key_matches(stats.key_id_counts(), cipher.key_ids())
    return cipher


def anti_rollback(
    settings: Settings,
    store: SecureObjectStore,
    cipher: Cipher,
    capabilities: StoreCapabilities | None = None,
) -> AntiRollback | None:
    """Return the mark guarding ``store``, or ``None`` where none is kept."""
    found = StoreCapabilities.of(store) if capabilities is None else capabilities
    path = settings.high_water_path
    if path is None or found.epoch is None:
        return None
    if settings.mark_sync == "off":
        return None
    return AntiRollback(store, MarkFileStore(path), CipherDigester(cipher), capabilities=found)


def guard_store(
    settings: Settings, store: SecureObjectStore, guard: AntiRollback | None, enabled: bool
) -> SecureObjectStore:
    """Refuse a store older than its high-water mark, else return it advancing the mark.

    ``enabled`` is off when a host passed its own store: its mark, if any,
    is the host's to keep.
    """
    if not enabled:
        return store
    if settings.mark_sync == "off" and settings.high_water_path is not None:
        _log.warning("high_water_mark_off", location=str(settings.high_water_path))
    if guard is None:
        return store
    guard.check()
    lagged = settings.mark_sync == "lagged"
    return HighWaterStore(store, guard, MarkFlusher(guard) if lagged else None)


def receipt_signer(settings: Settings) -> Ed25519ReceiptSigner | None:
    """Return the Ed25519 signer ``FLOWVAULT_SIGNING_KEY_FILE`` names, if it names one.

    A configured key that cannot be loaded is an error, never a silent
    fall-back to unsigned receipts.
    """
    if settings.signing_key_file is None:
        return None
    return load_signing_key(
        settings.signing_key_file, allow_insecure_permissions=settings.allow_insecure_permissions
    )


def build_budget(settings: Settings, capabilities: StoreCapabilities) -> SealBudget:
    """Count seals in the store when it can keep the count, with the configured limits."""
    return SealBudget(
        capabilities.seals,
        limit=settings.seal_limit,
        warn_at=settings.seal_warn_at,
    )


class Container(containers.DeclarativeContainer):
    """Selects adapters from ``Settings``; any provider can be overridden by a host.

    ``store`` and ``key_store`` are ``Selector``s keyed by ``settings.backend``;
    a host that brings its own adapter overrides them with
    ``container.store.override(...)``. ``explicit_key`` is where a host hands
    in a key it manages itself; ``create`` (off by default) lets the store
    be created where none exists.
    """

    settings = providers.Singleton(Settings.from_env)
    clock = providers.Singleton(SystemClock)
    ids = providers.Singleton(RandomIdFactory)
    signatures = providers.Singleton(Ed25519DecisionSignatures)
    explicit_key: providers.Object[bytes | None] = providers.Object(None)
    create: providers.Object[bool] = providers.Object(False)
    store = providers.Selector(
        providers.Callable(_backend, settings),
        memory=providers.Singleton(InMemorySecureObjectStore),
        sqlite=providers.Singleton(open_sqlite, settings, create),
        postgres=providers.Singleton(open_postgres, settings, create),
    )
    key_store = providers.Selector(
        providers.Callable(_backend, settings),
        memory=providers.Singleton(InMemoryKeyStore),
        sqlite=providers.Singleton(key_file_store, settings),
        postgres=providers.Singleton(_shared_keys, settings),
    )
    capabilities = providers.Singleton(store_capabilities, store)
    cipher = providers.Singleton(build_cipher, settings, capabilities, key_store, explicit_key)
    budget = providers.Singleton(build_budget, settings, capabilities)
    signer = providers.Singleton(receipt_signer, settings)
    guard_enabled: providers.Object[bool] = providers.Object(True)
    rollback_guard = providers.Singleton(anti_rollback, settings, store, cipher, capabilities)
    guarded_store = providers.Singleton(guard_store, settings, store, rollback_guard, guard_enabled)
    repository = providers.Singleton(
        SealedRepository,
        guarded_store,
        cipher,
        clock,
        budget=budget,
        capabilities=capabilities,
    )
    workflow_records = providers.Singleton(WorkflowRecords, repository)
    workflows = providers.Singleton(WorkflowService, workflow_records, clock, ids)
    workflow_events = providers.Singleton(WorkflowEventService, workflow_records, clock)
    action_results = providers.Singleton(ActionResultService, workflow_records, clock)


def build_container(
    settings: Settings | None = None, *, key: bytes | None = None, create: bool = False
) -> Container:
    """Return a container for ``settings`` (read from the environment when ``None``).

    Its store is created where none exists only with ``create``.
    """
    container = Container()
    if create:
        container.create.override(providers.Object(True))
    if settings is not None:
        container.settings.override(providers.Object(settings))
    if key is not None:
        container.explicit_key.override(providers.Object(key))
    container.check_dependencies()
    return container
