"""``flowvault workflows|runs|approvals``: list, show and decide.

Every verb prints identifiers, states, counts, times and digests only:
never work-order parameters, run inputs or states, audiences, actors or
decisions in clear. A service is ``None`` on a cold root, where lists are
empty and ``show``/``decide`` report ``NOT_FOUND``; nothing is created.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._ledger import terminal_receipt_document
from flowvault.application import ApprovalService, ReceiptVerifier, RunService, WorkflowService
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
    format_instant,
)

Fields = dict[str, JsonValue]

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


def _listing(
    io: CommandIO,
    noun: str,
    columns: Sequence[str],
    rows: Sequence[Fields],
    *,
    cold_root: bool,
) -> int:
    """Print rows as one JSON document or a table; an empty result says so."""
    if io.json_output:
        io.emit({noun: list(rows), "count": len(rows), "cold_root": cold_root}, [])
    elif rows:
        io.table(noun, columns, [[_text(row[column]) for column in columns] for row in rows])
    else:
        io.say(f"no {noun}" + (f" ({COLD_ROOT})" if cold_root else ""))
    return 0


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
    workflows: WorkflowService | None, state: str | None, limit: int, io: CommandIO
) -> int:
    """List workflows, newest written first; ``workflows`` is ``None`` on a cold root."""
    records = [] if workflows is None else workflows.list_workflows(state, limit)
    rows = [_workflow_row(record) for record in records]
    return _listing(io, "workflows", WORKFLOW_COLUMNS, rows, cold_root=workflows is None)


def workflows_show_command(
    workflows: WorkflowService | None, workflow_id: str, io: CommandIO
) -> int:
    """Show one workflow's metadata, hashes and verified ledger length; never its parameters."""
    if workflows is None:
        raise _cold("workflow")
    record = workflows.get(workflow_id)
    fields = _workflow_detail(record, workflows.events(workflow_id))
    io.emit({"workflow": fields}, _detail_lines(f"workflow {workflow_id}", fields))
    return 0


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
    runs: RunService | None, status: str | None, limit: int, io: CommandIO
) -> int:
    """List graph runs, newest written first; ``runs`` is ``None`` on a cold root."""
    found = () if runs is None else runs.list_runs(status, limit=limit).runs
    rows = [_run_row(run) for run in found]
    return _listing(io, "runs", RUN_COLUMNS, rows, cold_root=runs is None)


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


# -- approvals -----------------------------------------------------------------

APPROVAL_COLUMNS = (
    "approval_id",
    "status",
    "requested_at",
    "expires_at",
    "decided_at",
    "allowed_decision_count",
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
    run_id: str,
    status: str | None,
    limit: int,
    io: CommandIO,
) -> int:
    """List a run's approvals, newest request first; ``approvals`` is ``None`` on a cold root."""
    wanted = None if status is None else ApprovalStatus(status)
    rows = (
        []
        if approvals is None
        else [
            _approval_row(approval, approvals.status_of(approval))
            for approval in approvals.list_approvals(run_id, wanted, limit)
        ]
    )
    return _listing(io, "approvals", APPROVAL_COLUMNS, rows, cold_root=approvals is None)


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
    """Write the exact bytes a decider signs for ``decision`` to standard output."""
    if approvals is None:
        raise _cold("approval")
    io.out.write(approvals.decision_statement(approval_id, decision).decode("utf-8") + "\n")
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
