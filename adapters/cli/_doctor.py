"""``flowvault doctor``: check permissions, SQLite settings and the key, with a fix for each.

The checks open the store alone, despite loose file modes (the permission
checks report them), and never resolve, so never create, a key. Only a
failed check of severity ``error`` fails the run; a passing check's
severity reads ``ok``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from flowvault.adapters.cli._context import CliContext, CliSettings
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._keyed import keyed_audit
from flowvault.adapters.cli._status import opened_store, store_location, store_stats
from flowvault.adapters.cli._verbs import for_backend
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.crypto._signing import load_signing_key
from flowvault.adapters.sqlite._connect import ConnectOptions
from flowvault.adapters.sqlite._doctor import file_mode_check, probe_database
from flowvault.application import SecureObjectStore, StoreCapabilities
from flowvault.application._checks import Check
from flowvault.application._keys import KEY_ENV, KeyRing, parse_master_key
from flowvault.domain import FlowvaultError, IntegrityFailure, StoreRolledBack


def _check_lines(check: Check) -> list[str]:
    verdict = "ok" if check.ok else check.severity
    lines = [f"{verdict:7} {check.name}: {check.finding}"]
    if check.fix and not check.ok:
        lines.append(f"        fix: {check.fix}")
    return lines


def doctor_command(checks: Sequence[Check], io: CommandIO) -> int:
    """Print every check; return 1 when any failed check is an error, else 0."""
    errors = sum(check.is_error for check in checks)
    document = {
        "ok": errors == 0,
        "checks": [
            {
                "name": check.name,
                "ok": check.ok,
                "severity": "ok" if check.ok else check.severity,
                "finding": check.finding,
                "fix": check.fix,
            }
            for check in checks
        ],
    }
    lines = [line for check in checks for line in _check_lines(check)]
    lines.append("healthy" if errors == 0 else f"{errors} error(s) found")
    io.emit(document, lines)
    return 0 if errors == 0 else 1


# -- gathering and arguments ----------------------------------------------------


def _permission_checks(settings: CliSettings) -> list[Check]:
    wal, shm = settings.database_sidecars
    strict = not settings.allow_insecure_permissions
    files = [
        ("permissions.data_dir", settings.data_dir, True),
        ("permissions.database", settings.database_path, False),
        ("permissions.wal", wal, False),
        ("permissions.shm", shm, False),
        ("permissions.keys_dir", settings.keys_dir, True),
        ("permissions.key_file", settings.key_path, False),
    ]
    if settings.high_water_path is not None:
        files.append(("permissions.high_water", settings.high_water_path, False))
    return [
        file_mode_check(name, path, directory=directory, strict=strict)
        for name, path, directory in files
    ]


def _signing_checks(settings: CliSettings) -> list[Check]:
    """Check the receipt signing key, when one is configured, as strictly as the store key."""
    path = settings.signing_key_file
    if path is None:
        return []
    strict = not settings.allow_insecure_permissions
    mode = file_mode_check("permissions.signing_key", path, directory=False, strict=strict)
    try:
        signer = load_signing_key(path, allow_insecure_permissions=True)
    except FlowvaultError as error:
        fix = "point FLOWVAULT_SIGNING_KEY_FILE at a key 'flowvault keys signing-key' made"
        return [mode, Check("signing_key.loads", False, error.message, fix)]
    hint = signer.hint.hex()
    return [mode, Check("signing_key.loads", True, f"receipts are signed by key hint {hint}")]


def _configured_key(context: CliContext) -> tuple[KeyRing | None, Check]:
    """Find the keys the way opening would, without ever creating one."""
    settings = context.settings
    if settings.key is not None:
        try:
            key = parse_master_key(settings.key.get_secret_value(), KEY_ENV)
        except FlowvaultError as error:
            return None, Check("key.found", False, error.message, f"set {KEY_ENV} to the key")
        return KeyRing(primary=key), Check("key.found", True, f"the key comes from {KEY_ENV}")
    if settings.backend == "postgres" and settings.key_file is None:
        fix = f"set {KEY_ENV} (or FLOWVAULT_KEY_FILE) to the key every host of this store uses"
        return None, Check("key.found", False, f"{KEY_ENV} is not set", fix)
    key_file = settings.key_path
    try:
        stored = context.key_file().read_ring()
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


def _apart_check(settings: CliSettings) -> Check:
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


def _no_store(settings: CliSettings) -> list[Check]:
    return [
        Check(
            "store",
            False,
            f"no store at {store_location(settings)}; nothing was created",
            "run 'flowvault init' (with the sqlite or postgres backend)",
        )
    ]


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


def _rollback_check(context: CliContext, store: SecureObjectStore, ring: KeyRing | None) -> Check:
    """Compare the store with its high-water mark as opening would, writing nothing."""
    name = "store.rollback"
    if ring is None:
        return Check(name, False, "not checked: no usable key", "see key.found", "warning")
    guard = context.anti_rollback(store, AesGcmCipher.from_ring(ring), None)
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


def _sqlite_checks(context: CliContext) -> list[Check]:
    settings = context.settings
    checks = _permission_checks(settings)
    key, found = _configured_key(context)
    options = ConnectOptions(settings.database_path, settings.synchronous, settings.busy_timeout)
    with (
        opened_store(context, lenient=True) as store,
        probe_database(settings.database_path, settings.busy_timeout) as probe,
    ):
        checks += probe.pragma_checks(options)
        counts = store_stats(StoreCapabilities.of(store)).key_id_counts()
        matches = _ring_check(key, counts)
        usable = key if matches.ok else None
        rollback = _rollback_check(context, store, usable)
        integrity = _integrity_check(store, usable)
    checks += [found, matches, _apart_check(settings), rollback, integrity]
    return [*checks, *_signing_checks(settings)]


def _postgres_checks(context: CliContext) -> list[Check]:
    key, found = _configured_key(context)
    with opened_store(context) as store:
        counts = store_stats(StoreCapabilities.of(store)).key_id_counts()
        matches = _ring_check(key, counts)
        usable = key if matches.ok else None
        rollback = _rollback_check(context, store, usable)
        integrity = _integrity_check(store, usable)
    return [found, matches, rollback, integrity, *_signing_checks(context.settings)]


def _doctor(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del args
    if context.is_cold_root():
        return doctor_command(_no_store(context.settings), io)
    return doctor_command(
        for_backend(context, postgres=_postgres_checks, sqlite=_sqlite_checks), io
    )
