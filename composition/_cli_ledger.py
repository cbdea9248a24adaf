"""The ``flowvault`` verbs ledger verify and head, fingerprint and purge: audit and retention.

``ledger verify`` and ``ledger head`` open the store for reading only (on
SQLite with ``mode=ro``: nothing is created, chmod-ed or migrated), so they
can audit a copy of a database file without changing it. They need the key
only to open records and to key the head digest; they never create one.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from flowvault.adapters.cli import (
    CommandIO,
    fingerprint_command,
    ledger_head_command,
    ledger_verify_command,
    purge_command,
)
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import SystemClock
from flowvault.application import (
    KEY_ENV,
    KeyRing,
    LedgerAudit,
    RetentionPolicy,
    SealedRepository,
    SecureObjectStore,
    parse_master_key,
)
from flowvault.composition._bootstrap import open_existing
from flowvault.composition._cli_base import Verbs, add_verb
from flowvault.composition._container import key_file_store, open_postgres
from flowvault.composition._settings import Settings
from flowvault.domain import KeyRequired

MAX_DAYS = 36500


def _open_read_only(settings: Settings) -> SecureObjectStore:
    """Open the configured store for reading; a missing SQLite file is ``StoreUnavailable``."""
    if settings.backend == "sqlite":
        return SQLiteSecureObjectStore.open(
            settings.database_path, busy_timeout=settings.busy_timeout, read_only=True
        )
    if settings.backend == "postgres":
        return open_postgres(settings)
    return InMemorySecureObjectStore()


def existing_ring(settings: Settings) -> KeyRing | None:
    """Return the keys from ``FLOWVAULT_KEY`` or the key file, never creating one."""
    if settings.key is not None:
        return KeyRing(primary=parse_master_key(settings.key.get_secret_value(), KEY_ENV))
    if settings.backend != "sqlite" and settings.key_file is None:
        return None
    return key_file_store(settings).read_ring()


@contextmanager
def _audited(settings: Settings) -> Iterator[tuple[SecureObjectStore, SealedRepository | None]]:
    """Yield the read-only store and, if a key exists, a sealed repository over it.

    The key is not checked against the store's records, as opening does:
    under a wrong key the audit reports the records unreadable.
    """
    store = _open_read_only(settings)
    try:
        ring = existing_ring(settings)
        repository = (
            None
            if ring is None
            else SealedRepository(store, AesGcmCipher.from_ring(ring), SystemClock())
        )
        yield store, repository
    finally:
        store.close()


def _ledger_verify(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    with _audited(settings) as (store, repository):
        streams = None if args.all else [args.stream]
        return ledger_verify_command(LedgerAudit(store, repository), streams, io)


def _ledger_head(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    with _audited(settings) as (store, repository):
        if repository is None:
            raise KeyRequired(
                f"ledger head keys its digest with the store key: set {KEY_ENV} "
                "or restore the key file"
            )
        return ledger_head_command(store, repository, args.stream, io)


def _fingerprint(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    runtime = open_existing(settings)
    if runtime is None:
        return fingerprint_command(None, args.scope, args.reason, io)
    with runtime:
        return fingerprint_command(runtime.state(args.scope), args.scope, args.reason, io)


def _policy(args: argparse.Namespace) -> RetentionPolicy:
    defaults = RetentionPolicy()
    days, runs = args.older_than_days, args.finished_runs_older_than_days
    age = None if days is None else timedelta(days=days)
    return RetentionPolicy(
        consumed_checkpoints=defaults.consumed_checkpoints if age is None else age,
        decided_approvals=defaults.decided_approvals if age is None else age,
        idempotency_records=defaults.idempotency_records if age is None else age,
        finished_runs=defaults.finished_runs if runs is None else timedelta(days=runs),
    )


def _purge(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    policy = _policy(args)
    runtime = open_existing(settings)
    if runtime is None:
        return purge_command(None, None, io)
    with runtime:
        return purge_command(runtime.retention(policy), runtime.store, io)


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {text!r}") from None
    if not 0 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"days must be within 0..{MAX_DAYS}")
    return days


def _register_ledger(verbs: Verbs) -> None:
    group = verbs.add_parser(
        "ledger",
        help="verify ledger chains and print stream heads (read-only)",
        description="Audit the tamper-evident ledger without changing the store.",
    )
    leaves = group.add_subparsers(dest="ledger_verb", required=True, metavar="VERB")
    verify = add_verb(
        leaves,
        "verify",
        help="verify the hash chain of one stream or of every stream",
        description=(
            "Verify ledger hash chains from each stream's first retained event to its head. "
            "With --all, every stream is verified and every record is opened with the key "
            "and counted readable or unreadable (unverified when no key is available). "
            "The store is opened read-only: on SQLite nothing is created, migrated or "
            "written, so a copy of a database file can be audited unchanged. Exits 1 "
            "(INTEGRITY_FAILURE) when any stream fails."
        ),
        handler=_ledger_verify,
    )
    target = verify.add_mutually_exclusive_group(required=True)
    target.add_argument("--stream", metavar="NAME", help="verify this stream only")
    target.add_argument("--all", action="store_true", help="verify every stream and record")
    head = add_verb(
        leaves,
        "head",
        help="print a stream's head receipt with a keyed digest",
        description=(
            "Print a stream's head index and hash, the number of retained events, the "
            "first retained index, and a keyed digest over these (tag "
            "flowvault.ledger-head/1). Read-only; needs the store key."
        ),
        handler=_ledger_head,
    )
    head.add_argument("--stream", metavar="NAME", required=True, help="the stream")


def _register_fingerprint(verbs: Verbs) -> None:
    fingerprint = add_verb(
        verbs,
        "fingerprint",
        help="print the plaintext-free fingerprint of a scope's state",
        description=(
            "Print what can be said of a scope's workflow state without its content: "
            "readability, revision, sizes and digests. On a cold root it reports the "
            "state absent and creates nothing."
        ),
        handler=_fingerprint,
    )
    fingerprint.add_argument("--scope", required=True, help="the scope (bucket or profile)")
    fingerprint.add_argument("--reason", help="a reason class such as 'corrupt' (default: derived)")


def _register_purge(verbs: Verbs) -> None:
    purge = add_verb(
        verbs,
        "purge",
        help="run the retention job, then compact the store",
        description=(
            "Delete what retention allows, each deletion leaving a digest-only tombstone "
            "in the ledger: expired action results first, then decided approvals, consumed "
            "checkpoints, idempotency records and (only if asked) finished runs; then "
            "compact the store. Prints the count per kind. On a cold root it creates nothing."
        ),
        handler=_purge,
    )
    purge.add_argument(
        "--older-than-days",
        type=_days,
        metavar="DAYS",
        help=(
            "age past which decided approvals, consumed checkpoints and idempotency "
            "records go (default: 90, 30 and 7 days)"
        ),
    )
    purge.add_argument(
        "--finished-runs-older-than-days",
        type=_days,
        metavar="DAYS",
        help="also delete runs finished this long ago (default: keep finished runs)",
    )


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    _register_ledger(verbs)
    _register_fingerprint(verbs)
    _register_purge(verbs)
