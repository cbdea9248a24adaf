"""``flowvault migrate|export|import``: move a store or one scope, directly or through an archive.

Each reads the source as stored and writes no record or event to it (a
PostgreSQL source at an older schema version is migrated forward, as any
open does). A whole store
fills an empty target in one transaction, and success is reported only
after the target reads back as the source and passes a keyed audit
(``fill_verified``); one scope is added to any store that has never held it,
verified likewise (``add_scope_verified``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._keyed import existing_ring, keyed_audit
from flowvault.adapters.cli._verbs import file_path
from flowvault.adapters.crypto import AesGcmCipher, load_public_key
from flowvault.adapters.system import SystemClock
from flowvault.application import LedgerAudit, SealedRepository, SecureObjectStore, StoreContents
from flowvault.application._archive import decode_archive, encode_archive, verify_signature
from flowvault.application._keys import KEY_ENV, KeyRing
from flowvault.application._receipts import ReceiptSigner, ReceiptVerifier
from flowvault.application._scope_transfer import ScopeReport, add_scope_verified, read_scope
from flowvault.application._sealed import CipherDigester
from flowvault.application._state import check_scope
from flowvault.application._transfer import CopyReport, fill_verified, read_contents
from flowvault.domain import InvalidInput, KeyRequired

POSTGRES_SCHEMES = ("postgres://", "postgresql://")
"""How ``--to`` names a PostgreSQL target; anything else is the home of a SQLite store."""
MAX_ARCHIVE_BYTES = 4 * 1024**3
"""Largest archive ``import`` reads; the whole file is held in memory while it is verified."""


def _ring(context: CliContext) -> KeyRing:
    """Return the store's key ring; a move is verified under it, so it never runs without."""
    ring = existing_ring(context)
    if ring is None:
        raise KeyRequired(
            f"a move is verified under the store key: set {KEY_ENV} or FLOWVAULT_KEY_FILE "
            "to the source store's key"
        )
    return ring


def _phase(io: CommandIO, verb: str) -> Callable[[str], None]:
    """Return a reporter writing one line per phase on stderr, so a long move is never silent."""

    def say(line: str) -> None:
        io.err.write(f"{verb}: {line}\n")
        io.err.flush()

    return say


def _target_document(location: str, schema: str | None, context: CliContext) -> dict[str, str]:
    """Name the target without its DSN, which may carry a password."""
    if location.startswith(POSTGRES_SCHEMES):
        return {"backend": "postgres", "schema": schema or context.settings.postgres_schema}
    return {"backend": "sqlite", "home": location}


def _read_source(
    context: CliContext,
    io: CommandIO,
    say: Callable[[str], None],
    *,
    ring: KeyRing,
    scope: str | None = None,
) -> StoreContents:
    say("reading the source store (it is not written)")
    source = context.open_store(read_only=True)
    try:
        if scope is not None:
            return read_scope(_repository(source, ring), scope)
        return read_contents(source, progress=io.progress)
    finally:
        source.close()


def _repository(store: SecureObjectStore, ring: KeyRing) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher.from_ring(ring), SystemClock())


def _fill(
    context: CliContext,
    io: CommandIO,
    args: argparse.Namespace,
    contents: StoreContents,
    *,
    ring: KeyRing,
    say: Callable[[str], None],
) -> CopyReport:
    say("opening the target")
    target = context.open_target(args.to, schema=args.to_schema)

    def audit(store: SecureObjectStore) -> LedgerAudit:
        return keyed_audit(store, ring)

    try:
        return fill_verified(contents, target, audit, progress=io.progress, report=say)
    finally:
        target.close()


def _copied_lines(report: CopyReport, target: dict[str, str]) -> list[str]:
    summary = report.summary
    where = target.get("schema") or target.get("home")
    return [
        f"copied {summary.records.lines} records, {summary.events.lines} events in "
        f"{summary.streams} streams, commit count {summary.epoch} to {target['backend']} {where}",
        "verified: the target reads back byte for byte as the source, and its keyed audit is clean",
        "open it with the same key as the source (copy the key file, or set FLOWVAULT_KEY)",
    ]


def migrate_command(report: CopyReport, target: dict[str, str], io: CommandIO) -> int:
    """Report a verified move."""
    document = {"target": target, **report.summary.document(), "verified": True}
    io.emit(document, _copied_lines(report, target))
    return 0


def _migrate(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    say = _phase(io, "migrate")
    ring = _ring(context)
    target = _target_document(args.to, args.to_schema, context)
    contents = _read_source(context, io, say, ring=ring)
    return migrate_command(_fill(context, io, args, contents, ring=ring, say=say), target, io)


def _write_new_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a new 0600 file at ``path``: whole or not at all, never over a file."""
    temporary = path.with_name(f".{path.name}.partial-{os.getpid()}")
    descriptor = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _signer(context: CliContext) -> ReceiptSigner:
    signer = context.receipt_signer()
    if signer is None:
        raise KeyRequired(
            "--sign needs the signing key: set FLOWVAULT_SIGNING_KEY_FILE "
            "(create one with 'flowvault keys signing-key')"
        )
    return signer


def _export(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    say = _phase(io, "export")
    path: Path = args.to
    if path.exists():
        raise InvalidInput(f"{path} exists: export writes a new file, never over one")
    signer = _signer(context) if args.sign else None
    ring = _ring(context)
    digester = CipherDigester(AesGcmCipher.from_ring(ring))
    contents = _read_source(context, io, say, ring=ring, scope=args.scope)
    say("writing the archive")
    source: dict[str, str | int] = {"backend": context.settings.backend, "epoch": contents.epoch}
    data, body = encode_archive(contents, digester, source, scope=args.scope, signer=signer)
    try:
        _write_new_file(path, data)
    except FileExistsError:
        raise InvalidInput(f"{path} exists: export writes a new file, never over one") from None
    except OSError as error:
        raise InvalidInput(f"cannot write {path}: {error.strerror}") from None
    document = {
        "archive": str(path),
        "bytes": len(data),
        "signed": signer is not None,
        "manifest": body,
    }
    what = "the scope's" if args.scope is not None else ""
    io.emit(
        document,
        [
            f"exported {what or 'the store: '}{len(contents.records)} records and "
            f"{len(contents.events)} events to {path} ({len(data)} bytes)",
            "its manifest is MAC'd under the store key: import it with the same key",
            *(
                ["it is signed: check it with 'flowvault import FILE --check --public-key PEM'"]
                if signer is not None
                else []
            ),
        ],
    )
    return 0


def _read_archive(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_ARCHIVE_BYTES:
            raise InvalidInput(f"{path} is larger than {MAX_ARCHIVE_BYTES} bytes")
        return path.read_bytes()
    except OSError as error:
        raise InvalidInput(f"cannot read {path}: {error.strerror}") from None


def _check(
    path: Path,
    data: bytes,
    public_key: ReceiptVerifier | None,
    ring: KeyRing | None,
    io: CommandIO,
) -> int:
    """Verify the archive with what was given (store key, public key or both); write nothing."""
    records: int | None = None
    events: int | None = None
    if ring is None:
        if public_key is None:
            raise KeyRequired(
                f"--check verifies under the store key or a public key: set {KEY_ENV} or "
                "FLOWVAULT_KEY_FILE, or give --public-key"
            )
        body = verify_signature(data, public_key)
    else:
        digester = CipherDigester(AesGcmCipher.from_ring(ring))
        contents, body = decode_archive(data, digester, signed_by=public_key)
        records, events = len(contents.records), len(contents.events)
    document = {
        "archive": str(path),
        "mac_checked": ring is not None,
        "signature_checked": public_key is not None,
        "records": records,
        "events": events,
        "manifest": body,
    }
    checked = " and ".join(
        name
        for name, done in (("the store key's MAC", ring), ("the signature", public_key))
        if done is not None
    )
    io.emit(document, [f"{path} verified: {checked}, and every part against the manifest"])
    return 0


def _import(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    say = _phase(io, "import")
    path: Path = args.archive
    public_key = None if args.public_key is None else load_public_key(args.public_key)
    if args.check:
        if args.to is not None:
            raise InvalidInput("--check writes nothing: drop --to, or drop --check to import")
        return _check(path, _read_archive(path), public_key, existing_ring(context), io)
    if args.to is None:
        raise InvalidInput("import needs --to TARGET (or --check to verify the archive only)")
    ring = _ring(context)
    data = _read_archive(path)
    say("verifying the archive")
    digester = CipherDigester(AesGcmCipher.from_ring(ring))
    contents, body = decode_archive(data, digester, signed_by=public_key)
    target = _target_document(args.to, args.to_schema, context)
    scope = body.get("scope")
    head = {"archive": str(path), "source": body.get("source"), "target": target}
    if isinstance(scope, str):
        added = _add_scope(context, io, args, contents, scope, ring=ring, say=say)
        document = {
            **head,
            "scope": scope,
            "revision": added.revision,
            **added.summary.document(),
            "verified": True,
        }
        io.emit(document, _added_lines(added, scope, target))
        return 0
    report = _fill(context, io, args, contents, ring=ring, say=say)
    document = {**head, "scope": None, **report.summary.document(), "verified": True}
    io.emit(document, _copied_lines(report, target))
    return 0


def _add_scope(
    context: CliContext,
    io: CommandIO,
    args: argparse.Namespace,
    contents: StoreContents,
    scope: str,
    *,
    ring: KeyRing,
    say: Callable[[str], None],
) -> ScopeReport:
    say("opening the target")
    target = context.open_target(args.to, schema=args.to_schema)

    def audit(repository: SealedRepository) -> LedgerAudit:
        return keyed_audit(repository.store, ring)

    try:
        return add_scope_verified(
            contents, scope, _repository(target, ring), audit, progress=io.progress, report=say
        )
    finally:
        target.close()


def _added_lines(report: ScopeReport, scope: str, target: dict[str, str]) -> list[str]:
    summary = report.summary
    where = target.get("schema") or target.get("home")
    return [
        f"added scope {scope}: {summary.records.lines} records, {summary.events.lines} events "
        f"to {target['backend']} {where}",
        "verified: the scope reads back byte for byte, checks out against its history, "
        "and the target's keyed audit is clean",
    ]


def scope_name(text: str) -> str:
    """Parse ``--scope``: a workflow state scope name."""
    try:
        return check_scope(text)
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(error.message) from None


def target_location(text: str) -> str:
    """Parse ``--to``: a PostgreSQL DSN as given, else a SQLite home any file operation can take."""
    if text.startswith(POSTGRES_SCHEMES):
        return text
    return str(file_path(text))
