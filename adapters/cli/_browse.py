"""``flowvault workflows|runs|approvals``: list, show and decide.

Every verb prints identifiers, states, counts, times and digests only:
never work-order parameters, run inputs or states, audiences, actors or
decisions in clear. A service is ``None`` on a cold root, where lists are
empty and ``show``/``decide`` report ``NOT_FOUND``; nothing is created.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._ledger import terminal_receipt_document
from flowvault.application import (
    ApprovalService,
    Page,
    ReceiptVerifier,
    RunService,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.domain import (
    Approval,
    ApprovalReceipt,
    ApprovalStatus,
    GraphRun,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    TerminalReceipt,
    WorkflowRecord,
)
from flowvault.domain._envelope import format_instant

Fields = dict[str, JsonValue]
T = TypeVar("T")

COLD_ROOT = "cold root: no store exists yet"


@dataclass(frozen=True, slots=True)
class DecideRequest:
    """The arguments of ``approvals decide``, already parsed."""

    approval_id: str
    decision: str
    actor: str
    yes: bool
    signature: bytes | None = None


# -- shared formatting ---------------------------------------------------------


def _instant(moment: datetime | None) -> str | None:
    return None if moment is None else format_instant(moment)


def _text(value: JsonValue) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _detail_lines(title: str, fields: Mapping[str, JsonValue]) -> list[str]:
    return [title, *(f"  {name}: {_text(value)}" for name, value in fields.items())]


def _cold(what: str) -> NotFound:
    return NotFound(f"no such {what} ({COLD_ROOT})")


@dataclass(frozen=True, slots=True)
class PageRequest:
    """Which page a ``list`` verb prints: from ``cursor`` (or the start), or every page."""

    limit: int
    cursor: str | None = None
    all_pages: bool = False


def _read_pages(fetch: Callable[[str | None], Page[T]], request: PageRequest) -> Page[T]:
    """Read the requested page, or with ``all_pages`` every page from the cursor on."""
    page = fetch(request.cursor)
    if not request.all_pages:
        return page
    items, unreadable = list(page.items), list(page.unreadable)
    while page.next_cursor is not None:
        page = fetch(page.next_cursor)
        items += page.items
        unreadable += page.unreadable
    return Page(tuple(items), tuple(unreadable), None)


def _listing(
    io: CommandIO,
    noun: str,
    columns: Sequence[str],
    page: Page[Fields] | None,
) -> int:
    """Print rows, then the next cursor and the unreadable items; exit 1 if any was unreadable.

    ``page`` is ``None`` on a cold root. An empty result says so.
    """
    rows = [] if page is None else list(page.items)
    unreadable = () if page is None else page.unreadable
    next_cursor = None if page is None else page.next_cursor
    if io.json_output:
        document = {
            noun: rows,
            "count": len(rows),
            "cold_root": page is None,
            "next_cursor": next_cursor,
            "unreadable": [
                {"key_digest": item.key_digest, "code": item.code} for item in unreadable
            ],
        }
        io.emit(document, [])
    elif rows:
        io.table(noun, columns, [[_text(row[column]) for column in columns] for row in rows])
    else:
        io.say(f"no {noun}" + (f" ({COLD_ROOT})" if page is None else ""))
    if next_cursor is not None:
        io.say(f"next_cursor: {next_cursor}")
    for item in unreadable:
        io.say(f"unreadable: {item.key_digest} {item.code}")
    return 1 if unreadable else 0


def _rows(page: Page[T], row: Callable[[T], Fields]) -> Page[Fields]:
    return Page(tuple(map(row, page.items)), page.unreadable, page.next_cursor)


# -- workflows -----------------------------------------------------------------

WORKFLOW_COLUMNS = ("workflow_id", "kind", "state", "state_version", "updated_at")


def _workflow_row(record: WorkflowRecord) -> Fields:
    return {
        "workflow_id": record.workflow_id,
        "kind": record.work_order.kind,
        "state": record.state,
        "state_version": record.state_version,
        "updated_at": _instant(record.updated_at),
    }


def _workflow_detail(record: WorkflowRecord, events: Sequence[LedgerEvent]) -> Fields:
    return {
        **_workflow_row(record),
        "priority": record.work_order.priority,
        "parameter_count": len(record.work_order.parameters),
        "machine_version": record.machine_version,
        "created_at": _instant(record.created_at),
        "original_content_hash": record.original_content_hash,
        "output_content_hash": record.output_content_hash,
        "event_count": len(events),
        "head_event_hash": events[-1].event_hash if events else None,
    }


def workflows_list_command(
    workflows: WorkflowService | None, state: str | None, request: PageRequest, io: CommandIO
) -> int:
    """List workflows, newest written first; ``workflows`` is ``None`` on a cold root."""
    if workflows is None:
        return _listing(io, "workflows", WORKFLOW_COLUMNS, None)
    page = _read_pages(
        lambda cursor: workflows.list_workflows(state, request.limit, cursor=cursor), request
    )
    return _listing(io, "workflows", WORKFLOW_COLUMNS, _rows(page, _workflow_row))


def workflows_show_command(
    workflows: WorkflowService | None,
    events: WorkflowEventService | None,
    workflow_id: str,
    io: CommandIO,
) -> int:
    """Show one workflow's metadata, hashes and verified ledger length; never its parameters.

    Both services are ``None`` on a cold root.
    """
    if workflows is None or events is None:
        raise _cold("workflow")
    record = workflows.get(workflow_id)
    fields = _workflow_detail(record, events.events(workflow_id))
    io.emit({"workflow": fields}, _detail_lines(f"workflow {workflow_id}", fields))
    return 0


EVENT_COLUMNS = ("index", "type", "from_state", "to_state", "occurred_at", "event_hash")


def _event_row(event: LedgerEvent) -> Fields:
    """Return an event's position, type, states, time and hash: never its payload."""
    return {
        "index": event.index,
        "type": event.type,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "occurred_at": _instant(event.occurred_at),
        "event_hash": event.event_hash,
    }


def workflows_events_command(
    events: WorkflowEventService | None, workflow_id: str, request: PageRequest, io: CommandIO
) -> int:
    """List a workflow's verified events in index order; ``None`` is a cold root."""
    if events is None:
        raise _cold("workflow")
    page = _read_pages(
        lambda cursor: events.event_page(workflow_id, cursor, request.limit), request
    )
    return _listing(io, "events", EVENT_COLUMNS, _rows(page, _event_row))


# -- runs ----------------------------------------------------------------------

RUN_COLUMNS = ("run_id", "definition_id", "status", "started_at", "finished_at", "node_count")


def _run_row(run: GraphRun) -> Fields:
    return {
        "run_id": run.run_id,
        "definition_id": run.definition_id,
        "status": run.status,
        "started_at": _instant(run.started_at),
        "finished_at": _instant(run.finished_at),
        "node_count": run.node_count,
    }


def _event_count(runs: RunService, run_id: str) -> tuple[int, bool]:
    """Count the run's retained events page by page; also whether older ones were trimmed."""
    page = runs.read_run_events(run_id)
    count, trimmed = len(page.events), page.gap
    while page.next_cursor is not None:
        page = runs.read_run_events(run_id, page.next_cursor)
        count += len(page.events)
    return count, trimmed


def _terminal_receipt(runs: RunService, run: GraphRun) -> TerminalReceipt | None:
    if not run.finished:
        return None
    try:
        return runs.terminal_receipt(run.run_id)
    except NotFound:
        return None


def _receipt_fields(receipt: TerminalReceipt | None) -> Fields:
    if receipt is None:
        return {"terminal_receipt": None}
    return {
        "terminal_receipt": receipt.digest,
        "receipt_events_digest": receipt.events_digest,
        "receipt_final_state_digest": receipt.final_state_digest,
        "receipt_event_count": receipt.event_count,
    }


def runs_list_command(
    runs: RunService | None, status: str | None, request: PageRequest, io: CommandIO
) -> int:
    """List graph runs, newest written first; ``runs`` is ``None`` on a cold root."""
    if runs is None:
        return _listing(io, "runs", RUN_COLUMNS, None)
    page = _read_pages(
        lambda cursor: runs.list_runs(status, cursor=cursor, limit=request.limit), request
    )
    return _listing(io, "runs", RUN_COLUMNS, _rows(page, _run_row))


def runs_show_command(runs: RunService | None, run_id: str, io: CommandIO) -> int:
    """Show one run's metadata, counts and receipt digest; never its input or state."""
    if runs is None:
        raise _cold("run")
    run = runs.get_run(run_id)
    count, trimmed = _event_count(runs, run_id)
    fields: Fields = {
        **_run_row(run),
        "definition_version": run.definition_version,
        "revision": run.revision,
        "failed_attempts": run.failed_attempts,
        "budget_count": len(run.budgets),
        "event_count": count,
        "events_trimmed": trimmed,
        **_receipt_fields(_terminal_receipt(runs, run)),
    }
    io.emit({"run": fields}, _detail_lines(f"run {run_id}", fields))
    return 0


def runs_receipt_command(runs: RunService | None, run_id: str, io: CommandIO) -> int:
    """Print a finished run's terminal receipt, checked under the store key first, to keep."""
    if runs is None:
        raise _cold("run")
    receipt = runs.terminal_receipt(run_id)
    io.emit(terminal_receipt_document(receipt), [receipt.text().removesuffix("\n")])
    return 0


def _run_events(runs: RunService, run_id: str, cursor: str | None, limit: int) -> Page[Fields]:
    """One page of a run's events; its cursor is the index of the next event, as text."""
    if cursor is not None and not (cursor.isascii() and cursor.isdigit()):
        raise InvalidInput("a run events cursor is the index of the next event")
    page = runs.read_run_events(run_id, None if cursor is None else int(cursor), limit)
    following = None if page.next_cursor is None else str(page.next_cursor)
    return Page(tuple(map(_event_row, page.events)), (), following)


def runs_events_command(
    runs: RunService | None, run_id: str, request: PageRequest, io: CommandIO
) -> int:
    """List a run's verified events in index order; ``None`` is a cold root."""
    if runs is None:
        raise _cold("run")
    page = _read_pages(lambda cursor: _run_events(runs, run_id, cursor, request.limit), request)
    return _listing(io, "events", EVENT_COLUMNS, page)


# -- approvals -----------------------------------------------------------------

APPROVAL_COLUMNS = (
    "approval_id",
    "status",
    "requested_at",
    "expires_at",
    "decided_at",
    "allowed_decision_count",
    "run_id",
)


def _approval_row(approval: Approval, status: ApprovalStatus) -> Fields:
    return {
        "approval_id": approval.approval_id,
        "status": status.value,
        "requested_at": _instant(approval.requested_at),
        "expires_at": _instant(approval.expires_at),
        "decided_at": _instant(approval.decided_at),
        "allowed_decision_count": len(approval.allowed_decisions),
    }


def _approval_list_row(approval: Approval, status: ApprovalStatus) -> Fields:
    return {**_approval_row(approval, status), "run_id": approval.run_id}


def _approval_detail(
    approval: Approval, receipt: ApprovalReceipt, status: ApprovalStatus
) -> Fields:
    return {
        **_approval_row(approval, status),
        "required": approval.required,
        "vote_count": len(approval.votes),
        "signed_vote_count": sum(vote.signature is not None for vote in approval.votes),
        "run_id": approval.run_id,
        "checkpoint_id": approval.checkpoint_id,
        "integrity_digest": approval.integrity_digest,
        "checkpoint_digest": approval.checkpoint_digest,
        "prompt_digest": approval.prompt_digest,
        "audience_digest": receipt.audience,
        "allowed_decisions_digest": receipt.allowed_decisions,
        "decision_digest": receipt.decision,
        "actor_digest": receipt.actor,
        "receipt": receipt.digest,
    }


def _show_approval(approvals: ApprovalService, approval: Approval, io: CommandIO) -> None:
    fields = _approval_detail(
        approval, approvals.approval_receipt(approval), approvals.status_of(approval)
    )
    io.emit({"approval": fields}, _detail_lines(f"approval {approval.approval_id}", fields))


def approvals_list_command(
    approvals: ApprovalService | None,
    run_id: str | None,
    status: str | None,
    request: PageRequest,
    io: CommandIO,
) -> int:
    """List approvals, of one run or all, newest written first; ``None`` is a cold root."""
    if approvals is None:
        return _listing(io, "approvals", APPROVAL_COLUMNS, None)
    wanted = None if status is None else ApprovalStatus(status)
    page = _read_pages(
        lambda cursor: approvals.list_approvals(run_id, wanted, request.limit, cursor=cursor),
        request,
    )
    rows = _rows(page, lambda approval: _approval_list_row(approval, approvals.status_of(approval)))
    return _listing(io, "approvals", APPROVAL_COLUMNS, rows)


def approvals_show_command(
    approvals: ApprovalService | None, approval_id: str, io: CommandIO
) -> int:
    """Show one approval: status, times, counts and digests; no audience, actor or decision."""
    if approvals is None:
        raise _cold("approval")
    _show_approval(approvals, approvals.get_approval(approval_id), io)
    return 0


def approvals_decide_command(
    approvals: ApprovalService | None, request: DecideRequest, io: CommandIO
) -> int:
    """Record a decision after asking on a terminal (unless ``yes``); print the receipt digests."""
    if approvals is None:
        raise _cold("approval")
    if io.interactive and not request.yes:
        pending = approvals.get_approval(request.approval_id)
        question = (
            f"Record a decision on approval {pending.approval_id} "
            f"(status {pending.status.value}, expires {_instant(pending.expires_at)})?"
        )
        if not io.confirm(question):
            io.err.write("aborted: nothing was decided\n")
            return 1
    decided, checkpoint = approvals.decide(
        request.approval_id, request.decision, request.actor, signature=request.signature
    )
    settled = decided.status is not ApprovalStatus.PENDING
    fields = {
        **_approval_detail(decided, approvals.approval_receipt(decided), decided.status),
        "resume_checkpoint_id": checkpoint.checkpoint_id if settled else None,
    }
    title = "decided" if settled else "vote recorded, waiting for the quorum"
    io.emit({"approval": fields}, _detail_lines(f"{title}: approval {decided.approval_id}", fields))
    return 0


def approvals_expire_command(approvals: ApprovalService | None, io: CommandIO) -> int:
    """Record every overdue approval's expiry and fail the runs left waiting; print counts."""
    report = None if approvals is None else approvals.expire_overdue()
    fields: Fields = {
        "expired_approvals": 0 if report is None else report.expired_approvals,
        "failed_runs": 0 if report is None else report.failed_runs,
    }
    io.emit(fields, _detail_lines("expiry pass", fields))
    return 0


def approvals_statement_command(
    approvals: ApprovalService | None, approval_id: str, decision: str, io: CommandIO
) -> int:
    """Write the exact bytes a decider signs for ``decision``, no newline, to standard output."""
    if approvals is None:
        raise _cold("approval")
    io.out.write(approvals.decision_statement(approval_id, decision).decode("utf-8"))
    return 0


def approvals_signed_command(
    approvals: ApprovalService | None, approval_id: str, io: CommandIO
) -> int:
    """Print the approval's signed decisions, one statement document per line, for auditors."""
    if approvals is None:
        raise _cold("approval")
    signed = approvals.signed_decisions(approvals.get_approval(approval_id))
    if io.json_output:
        io.emit({"signed_decisions": [json.loads(item.to_json()) for item in signed]}, [])
    else:
        io.out.write("".join(item.to_json() + "\n" for item in signed))
    return 0


def approvals_register_key_command(
    approvals: ApprovalService | None, actor: str, public_key_pem: bytes, io: CommandIO
) -> int:
    """Register a decider's public key; their decisions must carry its signature from now on."""
    if approvals is None:
        raise _cold("store")
    approvals.register_decider_key(actor, public_key_pem)
    io.emit({"registered": True}, ["decider key registered: this actor must sign decisions now"])
    return 0


def verify_decision_command(document: str, verifier: ReceiptVerifier, io: CommandIO) -> int:
    """Check a signed decision with a public key alone; ``IntegrityFailure`` if it fails."""
    statement, signature, decider = _signed_decision(document)
    if not verifier.verify(statement.encode("utf-8"), signature):
        raise IntegrityFailure("the signature is not this public key's over the statement")
    fields: Fields = {"ok": True, "decider": decider}
    parsed = json.loads(statement)
    if isinstance(parsed, dict):
        fields |= {name: parsed.get(name) for name in STATEMENT_FIELDS}
    io.emit(fields, _detail_lines("signed decision: ok", fields))
    return 0


STATEMENT_FIELDS = ("statement", "approval_id", "checkpoint_digest", "prompt_digest", "decision")
SIGNED_FIELDS = ("statement", "signature", "decider")
SIGNATURE_HEX = 128


def _signed_decision(document: str) -> tuple[str, bytes, str]:
    """Parse a statement document as ``approvals signed`` prints it; ``InvalidInput`` if not."""
    try:
        parsed = json.loads(document)
    except ValueError:
        parsed = None
    fields = parsed if isinstance(parsed, dict) else {}
    statement, signature, decider = (fields.get(name) for name in SIGNED_FIELDS)
    raw = b""
    if isinstance(signature, str) and len(signature) == SIGNATURE_HEX:
        try:
            raw = bytes.fromhex(signature)
        except ValueError:
            raw = b""
    if not (isinstance(statement, str) and isinstance(decider, str) and raw):
        raise InvalidInput(
            "not a signed decision: expected one JSON line as 'approvals signed' prints it"
        )
    return statement, raw, decider
