"""``flowvault ledger verify|head|streams|vouch|check-receipt``: audit the tamper-evident ledger.

``ledger verify`` and ``ledger head`` open the store for reading only (on
SQLite with ``mode=ro``: nothing is created, chmod-ed or migrated), so they
can audit a copy of a database file without changing it. They need the key
only to open records and to MAC receipts; they never create one.
``ledger check-receipt`` opens no store at all: a public key is enough.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import FIXES, CommandIO, fields_document
from flowvault.adapters.cli._keyed import existing_ring, keyed_audit
from flowvault.adapters.cli._listing import Fields, page_request, print_listing
from flowvault.adapters.cli._receipts import (
    read_any_receipt_file,
    read_text_file,
    terminal_receipt_document,
)
from flowvault.adapters.cli._streams import StreamSize, stream_page
from flowvault.adapters.cli._verbs import file_path
from flowvault.adapters.crypto import load_public_key
from flowvault.adapters.system import SystemClock
from flowvault.application import (
    AuditReport,
    LedgerAudit,
    Page,
    ReceiptSigner,
    ReceiptVerifier,
    SecureObjectStore,
    authenticate_terminal,
)
from flowvault.application._audit import RecordReadability, StreamFailure
from flowvault.application._keys import KEY_ENV
from flowvault.application._receipts import ReceiptMac, authenticate
from flowvault.application._vouch import Unvouched, inspect_unvouched, vouch_unit
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    KeyRequired,
    NotFound,
    TerminalReceipt,
)
from flowvault.domain._envelope import format_instant
from flowvault.domain._receipt import HeadReceipt, parse_receipt

STREAMS_FIX = "list the streams with 'flowvault ledger streams'"


def _failure(failure: StreamFailure) -> dict[str, object]:
    return {
        "stream": failure.stream,
        "index": failure.index,
        "defect": failure.defect.value,
        "reason": failure.reason,
    }


def integrity_error(report: AuditReport) -> IntegrityFailure:
    """Return the one error a failed audit reports, its findings counted in the message."""
    broken = len(report.failures)
    findings = [f"{broken} of {len(report.streams)} ledger stream(s) failed verification"]
    if report.unreadable_count:
        findings.append(f"{report.unreadable_count} record(s) did not open")
    if report.stale:
        findings.append(f"{len(report.stale)} record(s) are older than their stream")
    if report.rolled_back is not None:
        findings.append("the store is below its high-water mark")
    return IntegrityFailure(
        "; ".join(findings),
        failed=broken,
        unreadable=report.unreadable_count,
        stale=len(report.stale),
    )


def _verify_document(report: AuditReport, *, keyed: bool) -> dict[str, object]:
    records = None if report.records is None else {k.value: n for k, n in report.records.items()}
    document: dict[str, object] = {
        "ok": report.ok,
        "streams_checked": len(report.streams),
        "events": report.events,
        "unkeyed_events": report.unkeyed if keyed else None,
        "failures": [_failure(failure) for failure in report.failures],
        "records": records,
        "unreadable_records": [
            {"namespace": r.namespace, "key_digest": r.key_digest} for r in report.unreadable
        ],
        "stale_records": [fields_document(record) for record in report.stale],
        "rolled_back": report.rolled_back,
        "key_available": keyed,
    }
    if not report.ok:
        error = integrity_error(report)
        document["error"] = {
            "code": error.code,
            "message": error.message,
            "fix": FIXES.get(error.code),
        }
    return document


def _summary_rows(report: AuditReport, *, keyed: bool) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = [
        ("streams checked", len(report.streams)),
        ("events verified", report.events),
        ("streams failed", len(report.failures)),
    ]
    if keyed:
        rows.append(("events without a chain MAC", report.unkeyed))
    if report.records is not None:
        rows += [(f"records {kind.value}", report.records[kind]) for kind in RecordReadability]
        if keyed:
            rows.append(("records older than their stream", len(report.stale)))
    return rows


def ledger_verify_command(
    audit: LedgerAudit,
    streams: Sequence[str] | None,
    io: CommandIO,
    *,
    receipts: Sequence[HeadReceipt] = (),
) -> int:
    """Verify ``streams`` (every stream and record when ``None``); 1 on any finding.

    A finding is a stream that fails verification, a record that does not
    open, or a record older than its stream.

    With ``receipts`` (already authenticated), verify each receipt's stream
    instead and check it still holds the receipt's head at its index.
    """
    if receipts:
        report = audit.against(receipts, progress=io.progress)
    else:
        report = audit.run(streams, progress=io.progress)
    if io.json_output:
        io.emit(_verify_document(report, keyed=audit.keyed), [])
        return 0 if report.ok else 1
    io.say("ledger verify: " + ("ok" if report.ok else "INTEGRITY_FAILURE"))
    io.table("ledger verify", ("check", "count"), _summary_rows(report, keyed=audit.keyed))
    if report.failures:
        rows = [(f.stream, f.index, f.defect.value, f.reason) for f in report.failures]
        io.table("broken streams", ("stream", "index", "defect", "reason"), rows)
    for record in report.unreadable:
        io.say(f"unreadable record: {record.namespace} {record.key_digest}")
    for stale in report.stale:
        io.say(f"stale record: {stale.stream} {stale.namespace} {stale.key_digest}")
    if report.rolled_back is not None:
        io.say(f"high-water mark: {report.rolled_back}")
    if report.records is not None and not audit.keyed:
        io.say("no key available: records were counted as unverified, not opened")
    if not audit.keyed:
        io.say("no key available: chain MACs were not checked, only the plain hash chains")
    return 0 if report.ok else io.fail(integrity_error(report))


def _receipt_document(receipt: HeadReceipt) -> dict[str, object]:
    note = receipt.note
    return {
        "stream": note.stream,
        "size": note.size,
        "head_index": note.head_index,
        "head_hash": note.head_hash,
        "first_index": note.first_index,
        "issued_at": format_instant(note.issued_at),
        "signers": [signature.name for signature in receipt.signatures],
        "receipt": receipt.text(),
    }


def ledger_head_command(
    audit: LedgerAudit,
    stream: str,
    io: CommandIO,
    *,
    issued_at: datetime,
    signers: tuple[ReceiptSigner, ...] = (),
) -> int:
    """Verify ``stream``, then print a head receipt: the note, its MAC and signature lines."""
    receipt = audit.issue(stream, issued_at=issued_at, signers=signers)
    io.emit(_receipt_document(receipt), receipt.text().split("\n")[:-1])
    return 0


def check_receipt_command(
    receipt: HeadReceipt | TerminalReceipt, verifier: ReceiptVerifier, io: CommandIO
) -> int:
    """Check a receipt's signature with a public key alone; ``IntegrityFailure`` if it fails."""
    if isinstance(receipt, TerminalReceipt):
        authenticate_terminal(receipt, verifier)
        fields = terminal_receipt_document(receipt)
        io.emit(
            {"ok": True, "signer": verifier.name, **fields},
            [
                f"receipt: ok, signed by {verifier.name} key {verifier.hint.hex()}",
                *(f"{name}: {value}" for name, value in fields.items() if name != "receipt"),
            ],
        )
        return 0
    authenticate(receipt, verifier)
    document = {"ok": True, "signer": verifier.name, **_receipt_document(receipt)}
    note = receipt.note
    io.emit(
        document,
        [
            f"receipt: ok, signed by {verifier.name} key {verifier.hint.hex()}",
            f"stream: {note.stream}",
            f"size: {note.size}",
            f"head_hash: {note.head_hash}",
            f"first_index: {note.first_index}",
            f"issued_at: {format_instant(note.issued_at)}",
        ],
    )
    return 0


def ledger_vouch_command(seen: Unvouched, io: CommandIO, *, vouched: bool) -> int:
    """Print what was (or, before ``--head-hash`` is given, would be) vouched for."""
    document = {
        "stream": seen.stream,
        "events": seen.events,
        "first_index": seen.first_index,
        "head_index": seen.head_index,
        "head_hash": seen.head_hash,
        "without_mac": seen.without_mac,
        "cut_prefix": seen.cut_prefix,
        "vouched": vouched,
    }
    lines = [
        f"stream: {seen.stream}",
        f"events: {seen.events} (index {seen.first_index} to {seen.head_index})",
        f"head_hash: {seen.head_hash}",
        f"without a chain MAC: {'yes' if seen.without_mac else 'no'}",
        f"events before index {seen.first_index} cut without a trim event: "
        + ("yes" if seen.cut_prefix else "no"),
    ]
    if vouched:
        lines.append("vouched: a keyed ledger.vouched event now follows the head")
    else:
        lines.append(
            "nothing written: compare this head hash (and the stream) with a copy you trust, "
            "then run again with --head-hash to vouch for it"
        )
    io.emit(document, lines)
    return 0


STREAM_COLUMNS = ("stream", "kind", "size", "head_index")


def stream_row(stream: StreamSize) -> Fields:
    """Return a stream's name, kind, size and head index: what the store keeps in the clear."""
    return {
        "stream": stream.stream,
        "kind": stream.kind,
        "size": stream.size,
        "head_index": stream.head_index,
    }


def stream_listing(
    store: SecureObjectStore, *, cursor: str | None, limit: int, all_pages: bool, prefix: str = ""
) -> Page[Fields]:
    """Read one page of streams (or every page from ``cursor`` on) as listing rows."""
    rows: list[Fields] = []
    after = cursor
    while True:
        sizes, after = stream_page(store, after=after, limit=limit, prefix=prefix)
        rows += [stream_row(size) for size in sizes]
        if after is None or not all_pages:
            return Page(tuple(rows), (), after)


# -- gathering and arguments ----------------------------------------------------


@contextmanager
def _audited(context: CliContext) -> Iterator[LedgerAudit]:
    """Yield the audit of the read-only store, keyed when a key exists."""
    store = context.open_store(read_only=True)
    try:
        yield keyed_audit(store, existing_ring(context), context)
    finally:
        store.close()


def _against_receipt(path: str, io: CommandIO) -> HeadReceipt:
    """Read a kept receipt; an empty one (a redirect that failed) is named as such."""
    text = read_text_file(path, io.stdin)
    if not text:
        shown = "stdin" if path == "-" else path
        raise InvalidInput(
            f"{shown} is empty: it holds no receipt (a 'ledger head' redirected into it "
            "failed, or wrote elsewhere)",
            path=path,
            fix=(
                "run 'flowvault ledger head --stream NAME > FILE' again, check it exits 0 "
                "and that FILE is not empty, then keep FILE outside the store"
            ),
        )
    return parse_receipt(text)


@contextmanager
def _stream_named() -> Iterator[None]:
    """Add where to find stream names to a stream that does not exist."""
    try:
        yield
    except NotFound as error:
        raise NotFound(error.message, **{**error.details, "fix": STREAMS_FIX}) from None


def _ledger_verify(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    receipts = [_against_receipt(path, io) for path in args.against or ()]
    if args.public_key is not None and not receipts:
        raise InvalidInput("--public-key checks receipts: give them with --against")
    with _audited(context) as audit:
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
        with _stream_named():
            return ledger_verify_command(audit, streams, io, receipts=receipts)


def _receipt_signers(context: CliContext) -> tuple[ReceiptSigner, ...]:
    """Return the configured Ed25519 signer, if ``FLOWVAULT_SIGNING_KEY_FILE`` names one."""
    signer = context.receipt_signer()
    return () if signer is None else (signer,)


def _ledger_head(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    signers = _receipt_signers(context)
    with _audited(context) as audit:
        if audit.repository is None:
            raise KeyRequired(
                f"ledger head MACs its receipt with the store key: set {KEY_ENV} "
                "or restore the key file"
            )
        now = SystemClock().now()
        with _stream_named():
            return ledger_head_command(audit, args.stream, io, issued_at=now, signers=signers)


def _ledger_streams(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    request = page_request(args)
    if context.is_cold_root():
        return print_listing(io, "streams", STREAM_COLUMNS, None)
    store = context.open_store(read_only=True)
    try:
        page = stream_listing(
            store, cursor=request.cursor, limit=request.limit, all_pages=request.all_pages
        )
    finally:
        store.close()
    return print_listing(io, "streams", STREAM_COLUMNS, page)


def _check_receipt(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del context
    receipt = read_any_receipt_file(args.receipt, io.stdin)
    return check_receipt_command(receipt, load_public_key(args.public_key), io)


def _ledger_vouch(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    """Show what would be vouched for (read-only), or, given the compared head, vouch."""
    if args.head_hash is None:
        with _audited(context) as audit:
            if audit.repository is None:
                raise KeyRequired(
                    f"vouching is checked under the store key: set {KEY_ENV} or restore the "
                    "key file"
                )
            seen = inspect_unvouched(audit.repository.store, args.stream, audit.repository)
        return ledger_vouch_command(seen, io, vouched=False)
    services = context.open_existing()
    if services is None:
        raise NotFound("no store exists here: there is nothing to vouch for")
    with services:
        repository = services.repository
        seen = inspect_unvouched(services.store, args.stream, repository)
        unit = vouch_unit(
            repository, seen, head_hash=args.head_hash, occurred_at=services.clock.now()
        )
        services.store.commit(unit)
    return ledger_vouch_command(seen, io, vouched=True)


def _receipt_path(text: str) -> str:
    return text if text == "-" else str(file_path(text))
