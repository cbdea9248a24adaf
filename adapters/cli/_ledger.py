"""``flowvault ledger verify``/``head``/``check-receipt``, ``fingerprint``, ``purge``: audit output.

The use cases live in the application layer; these functions only run them
and format what they return, as text, tables or one JSON document.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TextIO

from flowvault.adapters.cli._io import FIXES, CommandIO
from flowvault.application import (
    AuditReport,
    LedgerAudit,
    PurgeOutcome,
    ReceiptSigner,
    ReceiptVerifier,
    RecordReadability,
    RetentionJob,
    RetentionReport,
    StaleRecord,
    StateRepository,
    StoreCapabilities,
    StreamFailure,
    Unvouched,
    authenticate,
    authenticate_terminal,
    cold_fingerprint,
    purge,
)
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    ResetFingerprint,
    StoreBusy,
    TerminalReceipt,
    WorkflowState,
    parse_receipt,
    parse_terminal_receipt,
)
from flowvault.domain._envelope import format_instant
from flowvault.domain._receipt import MAX_RECEIPT_BYTES, HeadReceipt

_KINDS = (
    "action_results",
    "consumed_checkpoints",
    "decided_approvals",
    "idempotency_records",
    "finished_runs",
)
"""Retention report fields, in the order the job deletes them."""


# -- ledger verify ------------------------------------------------------------


def _failure(failure: StreamFailure) -> dict[str, object]:
    return {
        "stream": failure.stream,
        "index": failure.index,
        "defect": failure.defect.value,
        "reason": failure.reason,
    }


def _integrity_error(report: AuditReport) -> IntegrityFailure:
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


def _stale(record: StaleRecord) -> dict[str, object]:
    return {
        "stream": record.stream,
        "namespace": record.namespace,
        "key_digest": record.key_digest,
        "reason": record.reason,
    }


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
        "stale_records": [_stale(record) for record in report.stale],
        "rolled_back": report.rolled_back,
        "key_available": keyed,
    }
    if not report.ok:
        error = _integrity_error(report)
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
    return 0 if report.ok else io.fail(_integrity_error(report))


# -- ledger head --------------------------------------------------------------


def _read_stdin(stdin: TextIO) -> bytes:
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read(MAX_RECEIPT_BYTES + 1)
        return data
    return stdin.read(MAX_RECEIPT_BYTES + 1).encode("utf-8", "surrogateescape")


def read_text_file(path: str, stdin: TextIO, what: str = "receipt") -> str:
    """Read a small UTF-8 file, or ``stdin`` for ``-``; ``InvalidInput`` naming ``what``."""
    try:
        if path == "-":
            content = _read_stdin(stdin)
        else:
            with Path(path).open("rb") as file:
                content = file.read(MAX_RECEIPT_BYTES + 1)
    except OSError as error:
        raise InvalidInput(f"cannot read {what} {path}: {error.strerror}", path=path) from None
    except ValueError:
        raise InvalidInput(f"a {what} path must not contain a NUL byte") from None
    if len(content) > MAX_RECEIPT_BYTES:
        raise InvalidInput(f"{what} {path} is larger than {MAX_RECEIPT_BYTES} bytes", path=path)
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} {path} is not UTF-8 text", path=path) from None


def read_receipt_file(path: str, stdin: TextIO) -> HeadReceipt:
    """Read and parse a receipt file, or ``stdin`` for ``-``; ``InvalidInput`` otherwise."""
    return parse_receipt(read_text_file(path, stdin))


def read_any_receipt_file(path: str, stdin: TextIO) -> HeadReceipt | TerminalReceipt:
    """Read a head receipt or a terminal receipt, told apart by their first character.

    A head receipt opens with its origin line, a terminal receipt with the
    ``{`` of its JSON object.
    """
    text = read_text_file(path, stdin)
    return parse_terminal_receipt(text) if text.startswith("{") else parse_receipt(text)


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


def terminal_receipt_document(receipt: TerminalReceipt) -> dict[str, object]:
    """Return a terminal receipt's fields as shown, its kind first and its text last."""
    body = receipt.body()
    return {"kind": body.pop("kind"), **body, "receipt": receipt.text()}


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


# -- ledger vouch -------------------------------------------------------------


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


# -- fingerprint --------------------------------------------------------------


def _fingerprint_lines(fingerprint: ResetFingerprint, cold_root: bool) -> list[str]:
    heading = f"fingerprint of scope {fingerprint.scope!r}"
    if cold_root:
        heading += " (cold root: no store exists)"
    shown = fingerprint.model_dump(mode="json", exclude_none=True)
    return [heading, *(f"  {name}: {value}" for name, value in shown.items())]


def fingerprint_command(
    state: StateRepository[WorkflowState] | None,
    scope: str,
    reason: str | None,
    io: CommandIO,
) -> int:
    """Print the plaintext-free fingerprint of a scope's state; ``state`` is ``None`` when cold."""
    cold_root = state is None
    fingerprint = cold_fingerprint(scope, reason) if state is None else state.fingerprint(reason)
    document = {"cold_root": cold_root, "fingerprint": fingerprint.model_dump(mode="json")}
    io.emit(document, _fingerprint_lines(fingerprint, cold_root))
    return 0


# -- compact ------------------------------------------------------------------


def compact_command(
    complete: bool | None, sizes: Sequence[tuple[str, int | None, int | None]], io: CommandIO
) -> int:
    """Report an explicit compaction: each file's size around it; 1 if it did not finish.

    ``complete`` is ``None`` on a cold root, where nothing was opened.
    """
    if complete is False:
        return io.fail(
            StoreBusy(
                "other connections kept the write-ahead log from being truncated; "
                "run compact again when they are idle"
            )
        )
    document = {
        "cold_root": complete is None,
        "files": [{"path": p, "before": b, "after": a} for p, b, a in sizes],
    }
    if io.json_output:
        io.emit(document, [])
    elif complete is None:
        io.say("cold root: no store exists, nothing to compact")
    else:
        io.say("compact: complete")
        rows = [(p, _bytes(b), _bytes(a)) for p, b, a in sizes]
        io.table("files", ("file", "before", "after"), rows)
    return 0


def _bytes(size: int | None) -> str:
    return "absent" if size is None else f"{size} bytes"


# -- purge --------------------------------------------------------------------


def _purge_document(outcome: PurgeOutcome, cold_root: bool) -> dict[str, object]:
    report = outcome.report
    return {
        "cold_root": cold_root,
        "deleted": {kind: getattr(report, kind) for kind in _KINDS},
        "total": report.total,
        "expired_approvals": report.expired_approvals,
        "failed_runs": report.failed_runs,
        "compacted": outcome.compacted,
    }


def purge_command(
    job: RetentionJob | None, capabilities: StoreCapabilities | None, io: CommandIO
) -> int:
    """Run the retention job and compaction, then print counts per kind; ``None`` when cold."""
    cold_root = job is None or capabilities is None
    if job is None or capabilities is None:
        outcome = PurgeOutcome(RetentionReport(), compacted=True)
    else:
        outcome = purge(job, capabilities, progress=io.progress)
    document = _purge_document(outcome, cold_root)
    if io.json_output:
        io.emit(document, [])
        return 0
    if cold_root:
        io.say("cold root: no store exists, nothing to purge")
    report = outcome.report
    rows = [(kind, getattr(report, kind)) for kind in _KINDS]
    io.table("purged", ("kind", "deleted"), [*rows, ("total", report.total)])
    io.say(
        f"expired approvals recorded: {report.expired_approvals}; "
        f"runs failed for an expired approval: {report.failed_runs}"
    )
    io.say("compaction: " + ("complete" if outcome.compacted else "incomplete, run purge again"))
    return 0
