"""``flowvault report --html OUT``: one self-contained HTML page of a store's audit trail.

The page is for a person who was not at the terminal: an auditor, a
reviewer. It shows the verdict ``ledger verify`` gives (the same audit,
run the same read-only way), each finding, the timeline of the ledger and
the terminal receipts of finished runs. It is built from what the ledger
and the receipts already hold: stream names, indexes, event types,
lifecycle states, times and digests. No event payload is copied whole
(a caller's event may carry its own words), only values shaped as
digests, so no plaintext reaches the page. It loads nothing: inline CSS,
no script, no link, no font, no address.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import FIXES, CommandIO
from flowvault.adapters.cli._keyed import existing_ring, keyed_audit
from flowvault.adapters.cli._ledger import integrity_error
from flowvault.adapters.cli._verbs import file_path
from flowvault.adapters.system import SystemClock
from flowvault.application import AuditReport, LedgerAudit, StoreCapabilities, TerminalReceipts
from flowvault.application._state import history_stream
from flowvault.application._streams import run_stream
from flowvault.application._workflow_records import stream_of
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import FlowvaultError, IntegrityFailure, InvalidInput, LedgerEvent, NotFound
from flowvault.domain._envelope import format_instant

_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
_ACTOR_FIELDS: Final = ("actor", "decider")
_PAGE: Final = 200
_RUN_PREFIX: Final = "run/"

_STYLE: Final = """
body{font-family:sans-serif;margin:2em;color:#222}
h1{margin-bottom:.2em}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dl.meta dt{font-weight:bold}
.verdict{padding:1em;margin:1em 0;font-size:1.4em;font-weight:bold;border-radius:4px}
.verdict.ok{background:#e3f6e3;border:2px solid #2a7d2a;color:#1d5a1d}
.verdict.findings{background:#fde2e2;border:2px solid #b00020;color:#7a0016}
.finding{background:#fde2e2;border-left:6px solid #b00020;padding:.4em .8em;margin:.3em 0}
.finding .code{font-weight:bold;color:#b00020}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #bbb;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#eee}
td.digest{font-family:monospace;font-size:.85em;word-break:break-all}
td.stream{word-break:break-all}
tr.broken{background:#fde2e2}
"""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the audit found: its code, where, and why, as the verifier said it."""

    code: str
    stream: str | None
    sequence: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """A finished run's terminal receipt by its digests, or why none could be shown."""

    run_id: str
    digest: str | None
    events_digest: str | None
    final_state_digest: str | None
    event_count: int | None
    status: str


def findings_of(report: AuditReport) -> list[Finding]:
    """Return every finding of ``report``, as ``ledger verify`` lists them."""
    found = [Finding(f.defect.value, f.stream, f.index, f.reason) for f in report.failures]
    found += [
        Finding("unreadable", None, None, f"record {r.namespace} {r.key_digest} did not open")
        for r in report.unreadable
    ]
    found += [Finding("stale", s.stream, None, s.reason) for s in report.stale]
    if report.rolled_back is not None:
        found.append(Finding("rolled_back", None, None, report.rolled_back))
    return found


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A ledger row that no longer decodes: only where it is."""

    stream: str
    index: int


def _events(store: SecureObjectStore, stream: str) -> Iterator[LedgerEvent | Unreadable]:
    """Yield the events of ``stream``, and each row up to its head that no longer decodes.

    A page that fails is read again one row at a time, so one damaged row
    hides none of the events after it.
    """
    next_index: int | None = 0
    while next_index is not None:
        try:
            page = store.read_ledger(stream, from_index=next_index, limit=_PAGE)
        except IntegrityFailure:
            try:
                page = store.read_ledger(stream, from_index=next_index, limit=1)
            except IntegrityFailure:
                head = _head_index(store, stream)
                if head is not None and next_index > head:
                    return
                yield Unreadable(stream, next_index)
                if head is None:
                    return
                next_index += 1
                continue
        yield from page.events
        next_index = page.next_index


def _head_index(store: SecureObjectStore, stream: str) -> int | None:
    """Return the head index of ``stream`` (-1 when empty); ``None`` if it does not decode."""
    try:
        head = store.ledger_head(stream)
    except IntegrityFailure:
        return None
    return -1 if head is None else head.index


def _timeline(store: SecureObjectStore, streams: list[str]) -> list[LedgerEvent | Unreadable]:
    """Return every row of ``streams`` by time; an unreadable row follows the event before it."""
    keyed: list[tuple[tuple[datetime, str, int], LedgerEvent | Unreadable]] = []
    for stream in streams:
        last = datetime.min.replace(tzinfo=UTC)
        for row in _events(store, stream):
            if isinstance(row, LedgerEvent):
                last = row.occurred_at
            keyed.append(((last, row.stream, row.index), row))
    keyed.sort(key=lambda pair: pair[0])
    return [row for _, row in keyed]


def _digest_field(event: LedgerEvent, names: tuple[str, ...]) -> str | None:
    """Return the first of ``names`` in the payload whose value is a digest, and only then."""
    payload = event.payload
    if not isinstance(payload, dict):
        return None
    for name in names:
        value = payload.get(name)
        if isinstance(value, str) and _DIGEST.fullmatch(value):
            return value
    return None


def decision_of(event: LedgerEvent) -> str | None:
    """Return what an approval event decided: ``approved``/``rejected`` or the decision digest."""
    payload = event.payload
    if isinstance(payload, dict) and event.type.startswith("decision."):
        approved = payload.get("approved")
        if isinstance(approved, bool):
            return "approved" if approved else "rejected"
    return _digest_field(event, ("decision",))


def _receipts(receipts: TerminalReceipts | None, streams: list[str]) -> list[ReceiptRow]:
    rows: list[ReceiptRow] = []
    for stream in streams:
        if not stream.startswith(_RUN_PREFIX):
            continue
        run_id = stream.removeprefix(_RUN_PREFIX)
        if receipts is None:
            rows.append(ReceiptRow(run_id, None, None, None, None, "not checked: no key"))
            continue
        try:
            receipt = receipts.terminal_receipt(run_id)
        except NotFound:
            continue
        except FlowvaultError as error:
            rows.append(ReceiptRow(run_id, None, None, None, None, error.code))
            continue
        rows.append(
            ReceiptRow(
                run_id,
                receipt.digest,
                receipt.events_digest,
                receipt.final_state_digest,
                receipt.event_count,
                "verified",
            )
        )
    return rows


def _cell(value: object, css: str | None = None) -> str:
    shown = "-" if value is None else str(value)
    attribute = f' class="{css}"' if css else ""
    return f"<td{attribute}>{html.escape(shown)}</td>"


def render_page(
    *,
    covers: str,
    generated_at: datetime,
    report: AuditReport,
    keyed: bool,
    events: list[LedgerEvent | Unreadable],
    receipts: list[ReceiptRow],
) -> str:
    """Return the page: every value escaped, nothing loaded from anywhere."""
    esc = html.escape
    findings = findings_of(report)
    verdict = "ok" if report.ok else "findings"
    broken = {(f.stream, f.sequence) for f in findings}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>flowvault report: {esc(covers)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>flowvault report</h1>",
        '<dl class="meta">',
        f'<dt>covers</dt><dd id="covers">{esc(covers)}</dd>',
        f'<dt>generated at</dt><dd id="generated-at">{esc(format_instant(generated_at))}</dd>',
        f"<dt>streams verified</dt><dd>{len(report.streams)}</dd>",
        f"<dt>events verified</dt><dd>{report.events}</dd>",
        "<dt>chain MACs</dt><dd>"
        + ("checked under the store key" if keyed else "not checked: no key available")
        + "</dd>",
        "</dl>",
        f'<section id="verdict" class="verdict {verdict}">verdict: '
        + ("ok" if report.ok else f"findings ({len(findings)}): INTEGRITY_FAILURE")
        + "</section>",
    ]
    if findings:
        parts.append('<section id="findings"><h2>findings</h2>')
        for finding in findings:
            sequence = "-" if finding.sequence is None else str(finding.sequence)
            parts.append(
                '<div class="finding">'
                f'<span class="code">{esc(finding.code)}</span>'
                f' stream <span class="stream">{esc(finding.stream or "-")}</span>'
                f' sequence <span class="sequence">{esc(sequence)}</span>'
                f': <span class="reason">{esc(finding.reason)}</span></div>'
            )
        parts.append("</section>")
    parts += [
        f'<section id="timeline"><h2>timeline ({len(events)} events)</h2>',
        "<table><thead><tr><th>time</th><th>stream</th><th>sequence</th><th>event</th>"
        "<th>from</th><th>to</th><th>actor digest</th><th>decision</th></tr></thead><tbody>",
    ]
    for event in events:
        if isinstance(event, Unreadable):
            parts.append(
                '<tr class="event broken">'
                + _cell(None)
                + _cell(event.stream, "stream")
                + _cell(event.index)
                + _cell("(row does not decode)")
                + _cell(None) * 4
                + "</tr>"
            )
            continue
        css = "event broken" if (event.stream, event.index) in broken else "event"
        parts.append(
            f'<tr class="{css}">'
            + _cell(format_instant(event.occurred_at))
            + _cell(event.stream, "stream")
            + _cell(event.index)
            + _cell(event.type)
            + _cell(event.from_state)
            + _cell(event.to_state)
            + _cell(_digest_field(event, _ACTOR_FIELDS), "digest")
            + _cell(decision_of(event), "digest")
            + "</tr>"
        )
    parts += [
        "</tbody></table></section>",
        f'<section id="receipts"><h2>terminal receipts ({len(receipts)})</h2>',
        "<table><thead><tr><th>run</th><th>receipt digest</th><th>events digest</th>"
        "<th>final state digest</th><th>events</th><th>status</th></tr></thead><tbody>",
    ]
    for row in receipts:
        parts.append(
            '<tr class="receipt">'
            + _cell(row.run_id)
            + _cell(row.digest, "digest")
            + _cell(row.events_digest, "digest")
            + _cell(row.final_state_digest, "digest")
            + _cell(row.event_count)
            + _cell(row.status)
            + "</tr>"
        )
    parts += ["</tbody></table></section>", "</body></html>", ""]
    return "\n".join(parts)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``.

    A reader sees the old file or the whole new one, never half a page.
    """
    parent = path.parent
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as error:
        raise InvalidInput(f"cannot write {path}: {error.strerror}", path=str(path)) from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except OSError as error:
        Path(temp).unlink(missing_ok=True)
        raise InvalidInput(f"cannot write {path}: {error.strerror}", path=str(path)) from None


def _subject(args: argparse.Namespace) -> tuple[str, str | None]:
    """Return what the page covers and the one stream it reads, ``None`` for every stream."""
    if args.workflow is not None:
        return f"workflow {args.workflow}", stream_of(args.workflow)
    if args.run is not None:
        return f"run {args.run}", run_stream(args.run)
    if args.scope is not None:
        return f"scope {args.scope}", history_stream(args.scope)
    return "the whole store", None


def report_command(
    audit: LedgerAudit,
    store: SecureObjectStore,
    *,
    covers: str,
    stream: str | None,
    out: Path,
    generated_at: datetime,
    io: CommandIO,
) -> int:
    """Audit what the page covers, write the page, then exit 0 if it verified, 1 if not.

    The page is written in both cases: a report of findings is the one
    most worth keeping.
    """
    streams = None if stream is None else [stream]
    report = audit.run(streams, progress=io.progress)
    names = [s.stream for s in report.streams]
    events = _timeline(store, names)
    repository = audit.repository
    receipts = _receipts(
        None if repository is None else TerminalReceipts(repository, repository), names
    )
    page = render_page(
        covers=covers,
        generated_at=generated_at,
        report=report,
        keyed=audit.keyed,
        events=events,
        receipts=receipts,
    )
    write_atomically(out, page)
    findings = len(findings_of(report))
    verdict = "ok" if report.ok else "findings"
    document: dict[str, object] = {
        "schema_version": 1,
        "path": str(out),
        "verdict": verdict,
        "findings": findings,
        "events": len(events),
    }
    if io.json_output:
        if not report.ok:
            error = integrity_error(report)
            fix = FIXES.get(error.code)
            document["error"] = {"code": error.code, "message": error.message, "fix": fix}
        io.emit(document, [])
        return 0 if report.ok else 1
    io.say(f"report: {out}")
    io.say(f"covers: {covers}")
    io.say(f"verdict: {verdict} ({findings} finding(s), {len(events)} event(s))")
    return 0 if report.ok else io.fail(integrity_error(report))


def _outside_the_store(out: Path, context: CliContext) -> None:
    """Refuse a page path inside the store's data or key directory: it could replace the key."""
    settings = context.settings
    try:
        target = out.resolve()
        inside = [
            target.is_relative_to(d.resolve()) for d in (settings.data_dir, settings.keys_dir)
        ]
    except (OSError, RuntimeError, ValueError):
        raise InvalidInput("--html names a path that cannot be resolved") from None
    if any(inside):
        raise InvalidInput(
            "--html names a file inside the store's own directories; write the page elsewhere",
            fix="give --html a path outside FLOWVAULT_HOME's data and keys directories",
        )


def _page_path(text: str) -> Path:
    if text == "-":
        raise argparse.ArgumentTypeError("the page is written to a file, not to stdout")
    return file_path(text)


def _report(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    covers, stream = _subject(args)
    _outside_the_store(args.html, context)
    store = context.open_store(read_only=True)
    try:
        audit = keyed_audit(store, existing_ring(context), context)
        clock = StoreCapabilities.of(store).clock
        now = SystemClock().now() if clock is None else clock.store_now()
        return report_command(
            audit, store, covers=covers, stream=stream, out=args.html, generated_at=now, io=io
        )
    finally:
        store.close()
