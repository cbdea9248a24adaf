"""The ``flowvault`` verbs ledger verify, head, vouch and check-receipt, fingerprint and purge.

``ledger verify`` and ``ledger head`` open the store for reading only (on
SQLite with ``mode=ro``: nothing is created, chmod-ed or migrated), so they
can audit a copy of a database file without changing it. They need the key
only to open records and to MAC receipts; they never create one.
``ledger check-receipt`` opens no store at all: a public key is enough.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from flowvault.adapters.cli import (
    CommandIO,
    check_receipt_command,
    compact_command,
    fingerprint_command,
    ledger_head_command,
    ledger_verify_command,
    ledger_vouch_command,
    purge_command,
    read_any_receipt_file,
    read_receipt_file,
)
from flowvault.adapters.crypto import (
    AesGcmCipher,
    Ed25519ReceiptSigner,
    load_public_key,
)
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import RandomIdFactory, SystemClock
from flowvault.application import (
    KEY_ENV,
    BoundRecords,
    KeyRing,
    LedgerAudit,
    ReceiptMac,
    ReceiptVerifier,
    RetentionPolicy,
    RunService,
    SealedRepository,
    SecureObjectStore,
    WorkflowRecords,
    WorkflowService,
    authenticate,
    compact_fully,
    inspect_unvouched,
    parse_master_key,
    vouch_unit,
)
from flowvault.composition._bootstrap import open_existing
from flowvault.composition._cli_base import Verbs, add_verb, file_path
from flowvault.composition._container import (
    anti_rollback,
    key_file_store,
    open_postgres,
    receipt_signer,
)
from flowvault.composition._settings import Settings
from flowvault.domain import InvalidInput, KeyRequired, NotFound

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


def keyed_audit(
    store: SecureObjectStore, ring: KeyRing | None, settings: Settings | None = None
) -> LedgerAudit:
    """Return the audit ``ledger verify`` and ``doctor`` run: keyed, with bound records, if it can.

    The key is not checked against the store's records, as opening does:
    under a wrong key the audit reports the records unreadable. With the
    key, the audit also reads back each stream's bound record through the
    services' freshness checks, which only read, and, given ``settings``,
    compares the store with its high-water mark without writing it.
    """
    if ring is None:
        return LedgerAudit(store, None)
    clock = SystemClock()
    cipher = AesGcmCipher.from_ring(ring)
    repository = SealedRepository(store, cipher, clock)
    ids = RandomIdFactory()
    bound = BoundRecords(
        repository,
        WorkflowService(WorkflowRecords(repository), clock, ids),
        RunService(repository, clock, ids, integrity=repository),
    )
    mark = (
        None
        if settings is None
        else anti_rollback(settings, store, cipher, repository.capabilities)
    )
    return LedgerAudit(store, repository, bound, mark)


@contextmanager
def _audited(settings: Settings) -> Iterator[LedgerAudit]:
    """Yield the audit of the read-only store, keyed when a key exists."""
    store = _open_read_only(settings)
    try:
        yield keyed_audit(store, existing_ring(settings), settings)
    finally:
        store.close()


def _ledger_verify(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    receipts = [read_receipt_file(path, io.stdin) for path in args.against or ()]
    if args.public_key is not None and not receipts:
        raise InvalidInput("--public-key checks receipts: give them with --against")
    with _audited(settings) as audit:
        repository = audit.repository
        if receipts:
            if repository is None and args.public_key is None:
                raise KeyRequired(
                    "a receipt is trusted only once authenticated: set the store key (its "
                    "MAC line) or give --public-key (its signature line)"
                )
            verifiers: list[ReceiptVerifier] = []
            if repository is not None:
                verifiers.append(ReceiptMac(repository))
            if args.public_key is not None:
                verifiers.append(load_public_key(args.public_key))
            for receipt in receipts:
                for verifier in verifiers:
                    authenticate(receipt, verifier)
        streams = None if args.all else [args.stream]
        return ledger_verify_command(audit, streams, io, receipts=receipts)


def receipt_signers(settings: Settings) -> tuple[Ed25519ReceiptSigner, ...]:
    """Return the configured Ed25519 signer, if ``FLOWVAULT_SIGNING_KEY_FILE`` names one."""
    signer = receipt_signer(settings)
    return () if signer is None else (signer,)


def _ledger_head(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    signers = receipt_signers(settings)
    with _audited(settings) as audit:
        if audit.repository is None:
            raise KeyRequired(
                f"ledger head MACs its receipt with the store key: set {KEY_ENV} "
                "or restore the key file"
            )
        now = SystemClock().now()
        return ledger_head_command(audit, args.stream, io, issued_at=now, signers=signers)


def _check_receipt(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    del settings
    receipt = read_any_receipt_file(args.receipt, io.stdin)
    return check_receipt_command(receipt, load_public_key(args.public_key), io)


def _ledger_vouch(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    """Show what would be vouched for (read-only), or, given the compared head, vouch."""
    if args.head_hash is None:
        with _audited(settings) as audit:
            if audit.repository is None:
                raise KeyRequired(
                    f"vouching is checked under the store key: set {KEY_ENV} or restore the "
                    "key file"
                )
            seen = inspect_unvouched(audit.repository.store, args.stream, audit.repository)
        return ledger_vouch_command(seen, io, vouched=False)
    runtime = open_existing(settings)
    if runtime is None:
        raise NotFound("no store exists here: there is nothing to vouch for")
    with runtime:
        repository = runtime.repository
        seen = inspect_unvouched(runtime.store, args.stream, repository)
        unit = vouch_unit(
            repository, seen, head_hash=args.head_hash, occurred_at=runtime.clock.now()
        )
        runtime.store.commit(unit)
    return ledger_vouch_command(seen, io, vouched=True)


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
        return purge_command(runtime.retention(policy), runtime.capabilities, io)


def _receipt_path(text: str) -> str:
    return text if text == "-" else str(file_path(text))


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _compact(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    if settings.backend == "postgres":
        raise InvalidInput(
            "compact rewrites SQLite files; on PostgreSQL the server reclaims deleted rows "
            "with (auto)vacuum (see docs/postgres.md)"
        )
    files = [settings.database_path, *settings.database_sidecars]
    runtime = open_existing(settings)
    if runtime is None:
        return compact_command(None, [], io)
    before = [_file_size(path) for path in files] if settings.backend == "sqlite" else []
    with runtime:
        complete = compact_fully(runtime.capabilities)
    sizes = [(str(path), size, _file_size(path)) for path, size in zip(files, before, strict=False)]
    return compact_command(complete, sizes, io)


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
        help="verify ledger chains, print stream heads, vouch for legacy streams",
        description=(
            "Audit the tamper-evident ledger. Every verb but 'vouch --head-hash' only reads."
        ),
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
            "With --against, each receipt is authenticated (its MAC under the store key, "
            "and its signature when --public-key is given), its stream verified, and the "
            "stream must still hold the receipt's head at the receipt's index: deleted "
            "events, a restored older copy and rewritten history all fail. "
            "The store is opened read-only: on SQLite nothing is created, migrated or "
            "written, so a copy of a database file can be audited unchanged. Exits 1 "
            "(INTEGRITY_FAILURE) when any stream fails."
        ),
        handler=_ledger_verify,
    )
    target = verify.add_mutually_exclusive_group(required=True)
    target.add_argument("--stream", metavar="NAME", help="verify this stream only")
    target.add_argument("--all", action="store_true", help="verify every stream and record")
    target.add_argument(
        "--against",
        metavar="RECEIPT",
        type=_receipt_path,
        action="append",
        help="a receipt file from 'ledger head' ('-' for stdin); repeat for several",
    )
    verify.add_argument(
        "--public-key",
        type=file_path,
        metavar="FILE",
        help="also check each receipt's Ed25519 signature with this public key",
    )
    head = add_verb(
        leaves,
        "head",
        help="print a stream's head receipt, MAC'd and optionally signed",
        description=(
            "Print a head receipt of a stream: its origin line, size, base64 head hash, "
            "first retained index and time, then a MAC line under the store key and, when "
            "FLOWVAULT_SIGNING_KEY_FILE is set, an Ed25519 signature line. Keep it outside "
            "the store and check the store against it later with 'ledger verify --against'. "
            "Read-only; needs the store key."
        ),
        handler=_ledger_head,
    )
    head.add_argument("--stream", metavar="NAME", required=True, help="the stream")
    vouch = add_verb(
        leaves,
        "vouch",
        help="vouch, under the key, for a stream written before MACs or cut before trims",
        description=(
            "A stream written before schema 3 carries no chain MAC, and one whose oldest "
            "events were dropped before trims were put on record has no ledger.trimmed "
            "event: both fail every keyed verifier (unkeyed, truncated), exactly as a "
            "stream an editor stripped or cut would. Without --head-hash, check the "
            "stream's plain chain and print its size and head hash, writing nothing; "
            "compare them with a copy you trust. With --head-hash, append one keyed "
            "ledger.vouched event after that head (refused if the head is another), and "
            "the stream verifies from then on. A stream that verifies, or fails in any "
            "other way (edited, forged, a MAC missing after a keyed event), is refused."
        ),
        handler=_ledger_vouch,
    )
    vouch.add_argument("--stream", metavar="NAME", required=True, help="the stream")
    vouch.add_argument(
        "--head-hash",
        metavar="HASH",
        help="the head hash you compared with a trusted copy; without it nothing is written",
    )
    check = add_verb(
        leaves,
        "check-receipt",
        help="check a head or terminal receipt's Ed25519 signature with a public key alone",
        description=(
            "Check that a receipt (a head receipt from 'ledger head' or a terminal receipt "
            "from 'runs receipt') was signed by the holder of the signing key, using only "
            "its public key: no store and no store key are needed. Exits 1 "
            "(INTEGRITY_FAILURE) when no valid signature by that key is on it."
        ),
        handler=_check_receipt,
    )
    check.add_argument(
        "receipt", type=_receipt_path, metavar="RECEIPT", help="the receipt file ('-' for stdin)"
    )
    check.add_argument(
        "--public-key", type=file_path, metavar="FILE", required=True, help="the public key (PEM)"
    )


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


def _register_compact(verbs: Verbs) -> None:
    add_verb(
        verbs,
        "compact",
        help="rebuild the SQLite file so no free page or stale log remains",
        description=(
            "Rebuild the database file with VACUUM, which rewrites every page and gives "
            "free pages back to the file system, then checkpoint and truncate the "
            "write-ahead log. Deletions already zero what they free and truncate the log; "
            "this also shrinks the file. It rewrites the whole file and blocks writers "
            "meanwhile: run it when the store is quiet. SQLite only. Prints each file's "
            "size before and after. On a cold root it creates nothing."
        ),
        handler=_compact,
    )


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    _register_ledger(verbs)
    _register_fingerprint(verbs)
    _register_purge(verbs)
    _register_compact(verbs)
