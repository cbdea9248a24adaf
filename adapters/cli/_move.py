"""``flowvault migrate|export|import``: move a whole store, directly or through one archive file.

Each reads the source as stored and writes nothing to it; each fills an
empty target in one transaction and reports success only after the target
reads back as the source and passes a keyed audit (``fill_verified``).
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
from flowvault.adapters.cli._verbs import Verbs, add_verb, file_path
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.application import LedgerAudit, SecureObjectStore, StoreContents
from flowvault.application._archive import decode_archive, encode_archive
from flowvault.application._keys import KEY_ENV, KeyRing
from flowvault.application._sealed import CipherDigester
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


def _read_source(context: CliContext, io: CommandIO, say: Callable[[str], None]) -> StoreContents:
    say("reading the source store (it is not written)")
    source = context.open_store(read_only=True)
    try:
        return read_contents(source, progress=io.progress)
    finally:
        source.close()


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
    contents = _read_source(context, io, say)
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


def _export(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    say = _phase(io, "export")
    path: Path = args.to
    if path.exists():
        raise InvalidInput(f"{path} exists: export writes a new file, never over one")
    digester = CipherDigester(AesGcmCipher.from_ring(_ring(context)))
    contents = _read_source(context, io, say)
    say("writing the archive")
    source: dict[str, str | int] = {"backend": context.settings.backend, "epoch": contents.epoch}
    data, body = encode_archive(contents, digester, source)
    try:
        _write_new_file(path, data)
    except FileExistsError:
        raise InvalidInput(f"{path} exists: export writes a new file, never over one") from None
    except OSError as error:
        raise InvalidInput(f"cannot write {path}: {error.strerror}") from None
    document = {"archive": str(path), "bytes": len(data), "manifest": body}
    io.emit(
        document,
        [
            f"exported {len(contents.records)} records and {len(contents.events)} events "
            f"to {path} ({len(data)} bytes)",
            "its manifest is MAC'd under the store key: import it with the same key",
        ],
    )
    return 0


def _import(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    say = _phase(io, "import")
    ring = _ring(context)
    path: Path = args.archive
    try:
        if path.stat().st_size > MAX_ARCHIVE_BYTES:
            raise InvalidInput(f"{path} is larger than {MAX_ARCHIVE_BYTES} bytes")
        data = path.read_bytes()
    except OSError as error:
        raise InvalidInput(f"cannot read {path}: {error.strerror}") from None
    say("verifying the archive")
    contents, body = decode_archive(data, CipherDigester(AesGcmCipher.from_ring(ring)))
    target = _target_document(args.to, args.to_schema, context)
    report = _fill(context, io, args, contents, ring=ring, say=say)
    document = {
        "archive": str(path),
        "source": body.get("source"),
        "target": target,
        **report.summary.document(),
        "verified": True,
    }
    io.emit(document, _copied_lines(report, target))
    return 0


def target_location(text: str) -> str:
    """Parse ``--to``: a PostgreSQL DSN as given, else a SQLite home any file operation can take."""
    if text.startswith(POSTGRES_SCHEMES):
        return text
    return str(file_path(text))


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--to",
        required=True,
        type=target_location,
        metavar="TARGET",
        help="a PostgreSQL DSN (postgres://...) or the home directory of a new SQLite store",
    )
    parser.add_argument(
        "--to-schema",
        metavar="NAME",
        help="the PostgreSQL schema to fill (default: FLOWVAULT_POSTGRES_SCHEMA)",
    )


def register(verbs: Verbs) -> None:
    """Add ``migrate``, ``export`` and ``import`` to the parser."""
    migrate = add_verb(
        verbs,
        "migrate",
        help="copy the whole store into an empty SQLite home or PostgreSQL schema, verified",
        description=(
            "Copy every record (its sealed bytes and header as they are), every ledger event, "
            "the seal counts and the commit count into an empty target, in one transaction, "
            "then verify it: it must read back byte for byte as the source, and pass a keyed "
            "audit (every stream verified, every record opened). The source is only read. "
            "An interrupted migrate leaves the target empty; run it again. The target opens "
            "with the source's key (copy the key file, or set FLOWVAULT_KEY)."
        ),
        handler=_migrate,
    )
    _target_options(migrate)
    export = add_verb(
        verbs,
        "export",
        help="write the whole store to one archive file with a MAC'd manifest",
        description=(
            "Write every record, ledger event, seal count and the commit count to a new zip "
            "archive whose manifest (counts and SHA-256 of each part) is MAC'd under the store "
            "key. The store is only read. Import it with 'flowvault import'."
        ),
        handler=_export,
    )
    export.add_argument("--to", required=True, type=file_path, metavar="FILE", help="new file")
    imported = add_verb(
        verbs,
        "import",
        help="fill an empty store from an archive, after verifying all of it",
        description=(
            "Verify the archive's manifest under the store key and every part against it, "
            "then fill an empty target with it in one transaction and verify the target as "
            "'migrate' does. An archive that fails any check is refused before the target "
            "is opened."
        ),
        handler=_import,
    )
    imported.add_argument("archive", type=file_path, metavar="FILE", help="the archive to import")
    _target_options(imported)
