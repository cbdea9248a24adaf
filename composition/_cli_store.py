"""The ``flowvault`` verbs init, status and doctor: create a store and check its health.

The handlers gather facts from the settings, the files and the store's
``StoreStats`` and hand them to the command functions, which format them.
Only ``init`` creates anything; ``status`` and ``doctor`` report a cold root
and leave it cold, and they never resolve (so never create) a key.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from flowvault.adapters.cli import (
    Check,
    CommandIO,
    InitReport,
    Severity,
    StoreStatus,
    accept_restore_command,
    doctor_command,
    init_command,
    status_command,
)
from flowvault.adapters.crypto import AesGcmCipher, load_signing_key
from flowvault.adapters.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from flowvault.adapters.sqlite import ConnectOptions
from flowvault.adapters.system import MarkFileStore
from flowvault.application import (
    KEY_ENV,
    AntiRollback,
    CipherDigester,
    KeyRing,
    SecureObjectStore,
    StoreCapabilities,
    StoreStats,
    parse_master_key,
)
from flowvault.composition._bootstrap import bootstrap, is_cold_root
from flowvault.composition._cli_base import Verbs, add_verb
from flowvault.composition._cli_ledger import keyed_audit
from flowvault.composition._container import anti_rollback, build_container, key_file_store
from flowvault.composition._settings import Settings
from flowvault.domain import (
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    KeyRequired,
    StoreRolledBack,
    StoreUnavailable,
)

_PRIVATE_DIR = 0o700
_PRIVATE_FILE = 0o600
_EXPOSED = 0o077
_REFUSED_DIRECTORY = 0o022
"""What the stores refuse on a directory: others able to add, remove or swap its files."""
"""Any group or other bit: the documented layout is 0700 directories and 0600 files."""


# -- shared facts ----------------------------------------------------------------


def _location(settings: Settings) -> str:
    if settings.backend == "postgres":
        return f"postgres schema {settings.postgres_schema}"
    if settings.backend == "memory":
        return "memory (nothing durable)"
    return str(settings.database_path)


def _key_file(settings: Settings) -> Path:
    return settings.key_path


@contextlib.contextmanager
def _open_store(settings: Settings) -> Iterator[SecureObjectStore]:
    """Open the store alone: no cipher, so no key is read, resolved or created."""
    store = build_container(settings).store()
    try:
        yield store
    finally:
        store.close()


def _stats(capabilities: StoreCapabilities) -> StoreStats:
    if capabilities.stats is None:
        raise StoreUnavailable("this store cannot report its counts (no StoreStats)")
    return capabilities.stats


@contextlib.contextmanager
def _read_only(settings: Settings) -> Iterator[sqlite3.Connection]:
    """Open the database read-only, to read pragmas back.

    Open it only while the store is open: the store has then created the
    ``-wal`` and ``-shm`` files with private modes, and its close removes
    them; a lone read-only connection would leave them behind.
    """
    uri = settings.database_path.resolve().as_uri() + "?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=settings.busy_timeout)
    except sqlite3.Error as error:
        raise StoreUnavailable(f"cannot read {settings.database_path}: {error}") from None
    try:
        yield connection
    finally:
        connection.close()


def _pragma(connection: sqlite3.Connection, name: str) -> object:
    rows = connection.execute(f"PRAGMA {name}").fetchall()
    return rows[0][0] if rows else None


# -- init -------------------------------------------------------------------------


def _make_private_home(home: Path) -> None:
    """Create a missing home at 0700 (``mkdir`` alone would leave it to the umask)."""
    if home.exists():
        return
    home.parent.mkdir(parents=True, exist_ok=True)
    home.mkdir(mode=_PRIVATE_DIR)
    home.chmod(_PRIVATE_DIR)


def _init_sqlite(settings: Settings) -> InitReport:
    if os.path.lexists(settings.database_path):
        raise InvalidInput(
            f"a store already exists at {settings.database_path}: init never overwrites one; "
            "inspect it with 'flowvault status' or choose another --home"
        )
    key_file = _key_file(settings)
    key_existed = os.path.lexists(key_file)
    _make_private_home(settings.home)
    with bootstrap(settings) as runtime:
        key_id = runtime.cipher.primary_key_id
    from_env = settings.key is not None
    return InitReport(
        backend="sqlite",
        home=str(settings.home),
        location=str(settings.database_path),
        key_file=None if from_env else str(key_file),
        key_created=not from_env and not key_existed,
        key_id=key_id,
    )


def _init_postgres(settings: Settings) -> InitReport:
    if settings.key is None:
        raise KeyRequired(
            f"a PostgreSQL store takes its key from {KEY_ENV}, the same on every host: "
            "generate one once, keep it in your secrets manager and set it before init"
        )
    with bootstrap(settings) as runtime:
        if _stats(runtime.capabilities).has_records():
            raise InvalidInput(
                f"PostgreSQL schema {settings.postgres_schema} already holds a store with data: "
                "init never overwrites one"
            )
        key_id = runtime.cipher.primary_key_id
    return InitReport(
        backend="postgres",
        home=str(settings.home),
        location=_location(settings),
        key_file=None,
        key_created=False,
        key_id=key_id,
    )


def _init(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    del args
    if settings.backend == "memory":
        raise InvalidInput(
            "the memory backend keeps nothing, so there is nothing to init: "
            "choose FLOWVAULT_BACKEND=sqlite or postgres"
        )
    if settings.backend == "postgres":
        return init_command(_init_postgres(settings), io)
    return init_command(_init_sqlite(settings), io)


# -- status -----------------------------------------------------------------------


def _file_sizes(settings: Settings) -> dict[str, int | None]:
    paths = [settings.database_path, *settings.database_sidecars, _key_file(settings)]
    sizes: dict[str, int | None] = {}
    for path in paths:
        try:
            sizes[str(path)] = path.stat().st_size
        except FileNotFoundError:
            sizes[str(path)] = None
    return sizes


def _sqlite_status(settings: Settings) -> StoreStatus:
    """Sizes are taken before the store opens, so they show the files at rest."""
    files = _file_sizes(settings)
    with _open_store(settings) as store, _read_only(settings) as connection:
        stats = _stats(StoreCapabilities.of(store))
        key_ids, namespaces = stats.key_id_counts(), stats.namespace_counts()
        version = _pragma(connection, "user_version")
    return StoreStatus(
        backend="sqlite",
        home=str(settings.home),
        location=_location(settings),
        schema_version=version if isinstance(version, int) else None,
        supported_schema_version=SQLITE_SCHEMA_VERSION,
        key_ids=key_ids,
        namespaces=namespaces,
        files=files,
        durability={
            "synchronous": settings.synchronous,
            "busy timeout": f"{settings.busy_timeout:g} s",
        },
    )


def _postgres_status(settings: Settings) -> StoreStatus:
    """Report this build's schema version: opening migrated to it or refused a newer one."""
    from flowvault.adapters.postgres import (  # noqa: PLC0415 - an optional extra
        SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION,
    )

    with _open_store(settings) as store:
        stats = _stats(StoreCapabilities.of(store))
        key_ids, namespaces = stats.key_id_counts(), stats.namespace_counts()
    return StoreStatus(
        backend="postgres",
        home=str(settings.home),
        location=_location(settings),
        schema_version=POSTGRES_SCHEMA_VERSION,
        supported_schema_version=POSTGRES_SCHEMA_VERSION,
        key_ids=key_ids,
        namespaces=namespaces,
        durability={
            "statement timeout": f"{settings.postgres_statement_timeout:g} s",
            "lock timeout": f"{settings.postgres_lock_timeout:g} s",
        },
    )


def _status(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    del args
    if is_cold_root(settings):
        cold = StoreStatus(
            backend=settings.backend,
            home=str(settings.home),
            location=_location(settings),
            cold_root=True,
        )
        return status_command(cold, io)
    if settings.backend == "postgres":
        return status_command(_postgres_status(settings), io)
    return status_command(_sqlite_status(settings), io)


# -- doctor: permissions ----------------------------------------------------------


def _mode_check(name: str, path: Path, *, directory: bool, settings: Settings) -> Check:
    """Check type, owner and mode; a loose mode is only a warning when the settings allow it."""
    kind = "directory" if directory else "regular file"
    wanted = _PRIVATE_DIR if directory else _PRIVATE_FILE
    try:
        info = path.lstat()
    except FileNotFoundError:
        return Check(name, True, f"{path} is absent")
    is_kind = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not is_kind:
        fix = f"replace {path} with a real {kind} (a symlink lets its target's owner swap it)"
        return Check(name, False, f"{path} is not a {kind}", fix)
    severity: Severity = "warning" if settings.allow_insecure_permissions else "error"
    if info.st_uid != os.geteuid():
        finding = f"{path} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
        return Check(name, False, finding, f"chown {os.geteuid()} {shlex.quote(str(path))}")
    mode = stat.S_IMODE(info.st_mode)
    fix = f"chmod {wanted:o} {shlex.quote(str(path))}"
    if mode & (_REFUSED_DIRECTORY if directory else _EXPOSED):
        finding = f"{path} has mode {mode:04o}: group or others can reach it"
        return Check(name, False, finding, fix, severity)
    if mode & _EXPOSED:
        finding = (
            f"{path} has mode {mode:04o}: group or others can list it; the store accepts "
            f"this, {wanted:04o} also hides its file names"
        )
        return Check(name, False, finding, fix, "warning")
    return Check(name, True, f"{path} has mode {mode:04o}")


def _permission_checks(settings: Settings) -> list[Check]:
    wal, shm = settings.database_sidecars
    files = [
        ("permissions.data_dir", settings.data_dir, True),
        ("permissions.database", settings.database_path, False),
        ("permissions.wal", wal, False),
        ("permissions.shm", shm, False),
        ("permissions.keys_dir", settings.keys_dir, True),
        ("permissions.key_file", _key_file(settings), False),
    ]
    if settings.high_water_path is not None:
        files.append(("permissions.high_water", settings.high_water_path, False))
    return [
        _mode_check(name, path, directory=directory, settings=settings)
        for name, path, directory in files
    ]


def _signing_checks(settings: Settings) -> list[Check]:
    """Check the receipt signing key, when one is configured, as strictly as the store key."""
    path = settings.signing_key_file
    if path is None:
        return []
    mode = _mode_check("permissions.signing_key", path, directory=False, settings=settings)
    try:
        signer = load_signing_key(path, allow_insecure_permissions=True)
    except FlowvaultError as error:
        fix = "point FLOWVAULT_SIGNING_KEY_FILE at a key 'flowvault keys signing-key' made"
        return [mode, Check("signing_key.loads", False, error.message, fix)]
    hint = signer.hint.hex()
    return [mode, Check("signing_key.loads", True, f"receipts are signed by key hint {hint}")]


# -- doctor: pragmas --------------------------------------------------------------


def _pragma_check(connection: sqlite3.Connection, name: str, value: str, wanted: object) -> Check:
    """Set a per-connection pragma as the store does and read it back."""
    connection.execute(f"PRAGMA {name} = {value}").fetchall()
    found = _pragma(connection, name)
    if found == wanted:
        return Check(f"pragma.{name}", True, f"{name} = {found!r} as required")
    return Check(
        f"pragma.{name}",
        False,
        f"SQLite keeps {name} = {found!r}, not {wanted!r}",
        "use an SQLite build that honours it (the store refuses to open otherwise)",
    )


def _journal_check(connection: sqlite3.Connection) -> Check:
    """Read the journal mode, which the file stores; setting it is the store's job."""
    found = _pragma(connection, "journal_mode")
    if found == "wal":
        return Check("pragma.journal_mode", True, "journal_mode = 'wal' as required")
    return Check(
        "pragma.journal_mode",
        False,
        f"the database uses journal_mode {found!r}, not 'wal'",
        "keep the database on a local disk (WAL needs shared memory), then open it again",
    )


def _pragma_checks(settings: Settings, connection: sqlite3.Connection) -> list[Check]:
    options = ConnectOptions(settings.database_path, settings.synchronous, settings.busy_timeout)
    checks = [_journal_check(connection)]
    for name, value, wanted in options.pragmas():
        if name not in {"journal_mode", "busy_timeout"}:
            checks.append(_pragma_check(connection, name, value, wanted))
    return checks


# -- doctor: key ------------------------------------------------------------------


def _configured_key(settings: Settings) -> tuple[KeyRing | None, Check]:
    """Find the keys the way opening would, without ever creating one."""
    if settings.key is not None:
        try:
            key = parse_master_key(settings.key.get_secret_value(), KEY_ENV)
        except FlowvaultError as error:
            return None, Check("key.found", False, error.message, f"set {KEY_ENV} to the key")
        return KeyRing(primary=key), Check("key.found", True, f"the key comes from {KEY_ENV}")
    if settings.backend == "postgres" and settings.key_file is None:
        fix = f"set {KEY_ENV} (or FLOWVAULT_KEY_FILE) to the key every host of this store uses"
        return None, Check("key.found", False, f"{KEY_ENV} is not set", fix)
    key_file = _key_file(settings)
    try:
        stored = key_file_store(settings).read_ring()
    except FlowvaultError as error:
        return None, Check(
            "key.found", False, error.message, "fix the key file as the finding says"
        )
    if stored is None:
        finding = f"no key: {KEY_ENV} is unset and there is no key file at {key_file}"
        fix = f"restore the key file from its backup (mode 0600), or set {KEY_ENV}"
        return None, Check("key.found", False, finding, fix)
    return stored, Check("key.found", True, f"the key comes from the key file {key_file}")


def _ring_check(ring: KeyRing | None, key_id_counts: Mapping[str, int]) -> Check:
    """Every record must be sealed under a key of the ring, or it cannot be read."""
    in_use = {key_id for key_id, count in key_id_counts.items() if count > 0}
    if ring is None:
        return Check("key.matches", False, "not checked: no usable key", "see key.found", "warning")
    ids = AesGcmCipher.from_ring(ring).key_ids()
    missing = sorted(in_use - ids)
    shown = ", ".join(sorted(ids))
    noun = "key id" if len(ids) == 1 else "a key of the ring, ids"
    if not in_use:
        return Check("key.matches", True, f"no records yet; the key has id {shown}")
    if not missing:
        return Check("key.matches", True, f"every record is sealed under {noun} {shown}")
    return Check(
        "key.matches",
        False,
        "records are sealed under key id(s) the key does not provide: " + ", ".join(missing),
        "give the store its original key (key file or FLOWVAULT_KEY)",
    )


def _apart_check(settings: Settings) -> Check:
    """Refuse a key inside the data directory: it would travel with every copy of the data."""
    if settings.key is not None:
        return Check("key.apart", True, f"the key comes from {KEY_ENV}: no key file is used")
    keys_dir = settings.keys_dir.resolve()
    if keys_dir.is_relative_to(settings.data_dir.resolve()):
        return Check(
            "key.apart",
            False,
            f"the keys directory {keys_dir} is inside the data directory",
            "move the key file out of the data directory, to <home>/keys",
        )
    return Check("key.apart", True, "the key file is kept apart from the data directory")


# -- doctor -----------------------------------------------------------------------


def _no_store(settings: Settings) -> list[Check]:
    return [
        Check(
            "store",
            False,
            f"no store at {_location(settings)}; nothing was created",
            "run 'flowvault init' (with the sqlite or postgres backend)",
        )
    ]


def _diagnosed(settings: Settings) -> Settings:
    """Open despite loose modes: the permission checks report them, the rest still runs."""
    return settings.model_copy(update={"allow_insecure_permissions": True})


def _integrity_check(store: SecureObjectStore, ring: KeyRing | None) -> Check:
    """Run the full keyed audit ``ledger verify --all`` runs; any finding is an error."""
    name = "store.integrity"
    if ring is None:
        return Check(name, False, "not checked: no usable key", "see key.found", "warning")
    report = keyed_audit(store, ring).run()
    if report.ok:
        finding = (
            f"{len(report.streams)} stream(s) and {report.events} event(s) verify under the "
            "key; every record opens and is current"
        )
        return Check(name, True, finding)
    parts = [
        f"{len(report.failures)} stream(s) fail verification",
        f"{report.unreadable_count} record(s) do not open",
        f"{len(report.stale)} record(s) are older than their stream",
    ]
    return Check(
        name,
        False,
        "tampering or damage found: " + ", ".join(parts),
        "run 'flowvault ledger verify --all' for each finding; restore a trusted backup",
    )


def _rollback_check(settings: Settings, store: SecureObjectStore, ring: KeyRing | None) -> Check:
    """Compare the store with its high-water mark as opening would, writing nothing."""
    name = "store.rollback"
    if ring is None:
        return Check(name, False, "not checked: no usable key", "see key.found", "warning")
    guard = anti_rollback(settings, store, AesGcmCipher.from_ring(ring))
    if guard is None:
        return Check(
            name,
            False,
            "no high-water mark is kept: an older copy of the store put back would open",
            "set FLOWVAULT_HIGH_WATER_FILE to a file outside the database's reach",
            "warning",
        )
    try:
        seen = guard.inspect()
    except (StoreRolledBack, IntegrityFailure) as error:
        fix = (
            "put the newest copy of the database (and its mark) back; if this copy is the "
            "one to keep, run 'flowvault accept-restore'"
        )
        return Check(name, False, error.message, fix)
    if seen is None:
        return Check(
            name,
            False,
            f"no high-water mark at {guard.location}: the next open starts one from the store "
            "as it is, so an older copy put back before then goes unseen",
            "open the store once (any verb that writes), or restore the mark from its backup",
            "warning",
        )
    return Check(name, True, f"the store is at or past its high-water mark (commit {seen})")


def _sqlite_checks(settings: Settings) -> list[Check]:
    checks = _permission_checks(settings)
    key, found = _configured_key(settings)
    with _open_store(_diagnosed(settings)) as store, _read_only(settings) as connection:
        checks += _pragma_checks(settings, connection)
        counts = _stats(StoreCapabilities.of(store)).key_id_counts()
        matches = _ring_check(key, counts)
        usable = key if matches.ok else None
        rollback = _rollback_check(settings, store, usable)
        integrity = _integrity_check(store, usable)
    checks += [found, matches, _apart_check(settings), rollback, integrity]
    return [*checks, *_signing_checks(settings)]


def _postgres_checks(settings: Settings) -> list[Check]:
    key, found = _configured_key(settings)
    with _open_store(settings) as store:
        counts = _stats(StoreCapabilities.of(store)).key_id_counts()
        matches = _ring_check(key, counts)
        usable = key if matches.ok else None
        rollback = _rollback_check(settings, store, usable)
        integrity = _integrity_check(store, usable)
    return [found, matches, rollback, integrity, *_signing_checks(settings)]


def _doctor(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    del args
    if is_cold_root(settings):
        return doctor_command(_no_store(settings), io)
    if settings.backend == "postgres":
        return doctor_command(_postgres_checks(settings), io)
    return doctor_command(_sqlite_checks(settings), io)


# -- accept-restore ---------------------------------------------------------------


def _accept_restore(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    if is_cold_root(settings):
        return accept_restore_command(None, io)
    path = settings.high_water_path
    if path is None:
        raise InvalidInput(
            f"no high-water mark is kept for the {settings.backend} backend: set "
            "FLOWVAULT_HIGH_WATER_FILE to keep one"
        )
    if not args.yes:
        question = (
            "Accept this store as it is? Commits made after the restored copy was taken "
            "stay lost, and the store will no longer be refused as older"
        )
        if not io.interactive:
            raise InvalidInput("accepting a restore needs --yes off a terminal")
        if not io.confirm(question):
            io.err.write("aborted: the high-water mark is unchanged\n")
            return 1
    container = build_container(settings)
    opened = container.store()
    try:
        capabilities = container.capabilities()
        if capabilities.epoch is None:
            raise InvalidInput("this store keeps no commit count (no StoreEpoch)")
        digester = CipherDigester(container.cipher())
        guard = AntiRollback(opened, MarkFileStore(path), digester, capabilities=capabilities)
        previous, current = guard.accept()
    finally:
        opened.close()
    return accept_restore_command((previous, current, str(path)), io)


# -- registration -----------------------------------------------------------------


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    add_verb(
        verbs,
        "init",
        help="create a new store and its key",
        description=(
            "Create a new store and its key with private permissions (0700 directories, "
            "0600 files) at the configured home, and print where they are and the key id "
            "(never the key). Refuses, with exit status 1, when a store already exists. "
            f"With postgres, the key must come from {KEY_ENV}; memory has nothing to init."
        ),
        handler=_init,
    )
    add_verb(
        verbs,
        "status",
        help="show the store's schema version, keys, counts, files and durability",
        description=(
            "Show the backend, home, schema version, key ids in use, records per namespace, "
            "file sizes and durability settings. Reads no sealed payload and needs no key. "
            "On a cold root it says so, creates nothing and exits 0."
        ),
        handler=_status,
    )
    add_verb(
        verbs,
        "doctor",
        help="check permissions, SQLite settings and the key, with a fix for each finding",
        description=(
            "Check directory and file permissions, read the SQLite pragmas back, and check "
            "that the key is found, opens every record's key id and is kept apart from the "
            "data. Exits 0 when no check fails with severity error, 1 otherwise (also on a "
            "cold root, where it reports 'no store' and creates nothing)."
        ),
        handler=_doctor,
    )
    accept = add_verb(
        verbs,
        "accept-restore",
        help="accept a deliberately restored older copy of the store",
        description=(
            "A store opened below its high-water mark (the highest commit count and the "
            "size of every ledger stream this host saw, kept beside the key file or at "
            "FLOWVAULT_HIGH_WATER_FILE) is refused with STORE_ROLLED_BACK, because an older "
            "copy of the database was put back over it or a stream's newest events were "
            "deleted. When that restore was deliberate, this restarts the mark from the "
            "store as it is so it opens again. The commits made since stay lost. "
            "Asks for confirmation on a terminal; elsewhere needs --yes."
        ),
        handler=_accept_restore,
    )
    accept.add_argument("--yes", action="store_true", help="do not ask for confirmation")
