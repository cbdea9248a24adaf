"""``flowvault approvals``: list, show, decide, expire, and the signed decisions of deciders."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from flowvault.adapters.cli._context import CliContext, Services
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._listing import (
    Fields,
    PageRequest,
    cold_not_found,
    detail_lines,
    instant,
    page_request,
    page_rows,
    print_listing,
    read_pages,
    with_service,
)
from flowvault.adapters.cli._receipts import read_text_file
from flowvault.adapters.crypto import load_public_key
from flowvault.application import ApprovalService, ReceiptVerifier
from flowvault.domain import (
    Approval,
    ApprovalDecisionNotAllowed,
    ApprovalReceipt,
    ApprovalStatus,
    IntegrityFailure,
    InvalidInput,
)


@dataclass(frozen=True, slots=True)
class DecideRequest:
    """The arguments of ``approvals decide``, already parsed."""

    approval_id: str
    decision: str
    actor: str
    yes: bool
    signature: bytes | None = None
    reveal: bool = False


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
        "requested_at": instant(approval.requested_at),
        "expires_at": instant(approval.expires_at),
        "decided_at": instant(approval.decided_at),
        "allowed_decision_count": len(approval.allowed_decisions),
    }


def _approval_list_row(approval: Approval, status: ApprovalStatus) -> Fields:
    return {**_approval_row(approval, status), "run_id": approval.run_id}


def _approval_detail(
    approval: Approval, receipt: ApprovalReceipt, status: ApprovalStatus, *, reveal: bool
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
        "audience": approval.audience if reveal else None,
        "allowed_decisions": list(approval.allowed_decisions) if reveal else None,
        "prompt_text": None,
        "quorum": approval.quorum,
        "rejection": approval.rejection.value if approval.quorum else None,
        "decider_digests": list(approval.deciders),
        "voter_digests": [vote.decider for vote in approval.votes],
    }


PROMPT_NOT_STORED = "not stored (flowvault keeps only prompt_digest)"
SEALED = "sealed (--reveal prints it)"
REVEALED = ("audience", "allowed_decisions")
"""Fields printed in clear only on ``--reveal``: the store keeps them sealed."""


def approval_lines(title: str, fields: Fields) -> list[str]:
    """Lines for a person: lists joined by commas, and why a field shows no text."""
    shown: Fields = {}
    for name, value in fields.items():
        if name in REVEALED and value is None:
            shown[name] = SEALED
        elif name == "prompt_text" and value is None:
            shown[name] = PROMPT_NOT_STORED
        elif isinstance(value, list):
            shown[name] = ", ".join(str(item) for item in value) if value else None
        else:
            shown[name] = value
    return detail_lines(title, shown)


def _show_approval(
    approvals: ApprovalService, approval: Approval, io: CommandIO, *, reveal: bool
) -> None:
    fields = _approval_detail(
        approval, approvals.approval_receipt(approval), approvals.status_of(approval), reveal=reveal
    )
    io.emit({"approval": fields}, approval_lines(f"approval {approval.approval_id}", fields))


def _naming_allowed(
    approvals: ApprovalService,
    approval_id: str,
    decision: str,
    refused: ApprovalDecisionNotAllowed,
    *,
    reveal: bool,
) -> ApprovalDecisionNotAllowed:
    """Return the refusal with a fix about the allowed decisions, when the decision was at fault.

    The decisions are sealed, so the fix names them only on ``--reveal``
    (and only in the fix, never in the message a host might log); else it
    says how many there are and how to see them.
    """
    allowed = approvals.get_approval(approval_id).allowed_decisions
    if decision in allowed:
        return refused
    fix = (
        "pass --decision as one of: " + ", ".join(allowed)
        if reveal
        else f"pass --decision as one of the {len(allowed)} allowed decisions; add --reveal "
        "to have them named here"
    )
    return ApprovalDecisionNotAllowed(refused.message, approval_id=approval_id, fix=fix)


def approvals_list_command(
    approvals: ApprovalService | None,
    run_id: str | None,
    status: str | None,
    request: PageRequest,
    io: CommandIO,
) -> int:
    """List approvals, of one run or all, newest written first; ``None`` is a cold root."""
    if approvals is None:
        return print_listing(io, "approvals", APPROVAL_COLUMNS, None)
    wanted = None if status is None else ApprovalStatus(status)
    page = read_pages(
        lambda cursor: approvals.list_approvals(run_id, wanted, request.limit, cursor=cursor),
        request,
    )
    rows = page_rows(
        page, lambda approval: _approval_list_row(approval, approvals.status_of(approval))
    )
    return print_listing(io, "approvals", APPROVAL_COLUMNS, rows)


def approvals_show_command(
    approvals: ApprovalService | None, approval_id: str, io: CommandIO, *, reveal: bool = False
) -> int:
    """Show one approval: what it asks of whom, its deadline and quorum; deciders as digests."""
    if approvals is None:
        raise cold_not_found("approval")
    _show_approval(approvals, approvals.get_approval(approval_id), io, reveal=reveal)
    return 0


def approvals_decide_command(
    approvals: ApprovalService | None, request: DecideRequest, io: CommandIO
) -> int:
    """Record a decision after asking on a terminal (unless ``yes``); print the receipt digests."""
    if approvals is None:
        raise cold_not_found("approval")
    if io.interactive and not request.yes:
        pending = approvals.get_approval(request.approval_id)
        question = (
            f"Record a decision on approval {pending.approval_id} "
            f"(status {pending.status.value}, expires {instant(pending.expires_at)})?"
        )
        if not io.confirm(question):
            io.err.write("aborted: nothing was decided\n")
            return 1
    try:
        decided, checkpoint = approvals.decide(
            request.approval_id, request.decision, request.actor, signature=request.signature
        )
    except ApprovalDecisionNotAllowed as refused:
        raise _naming_allowed(
            approvals, request.approval_id, request.decision, refused, reveal=request.reveal
        ) from None
    settled = decided.status is not ApprovalStatus.PENDING
    fields = {
        **_approval_detail(
            decided, approvals.approval_receipt(decided), decided.status, reveal=request.reveal
        ),
        "resume_checkpoint_id": checkpoint.checkpoint_id if settled else None,
    }
    title = "decided" if settled else "vote recorded, waiting for the quorum"
    io.emit(
        {"approval": fields}, approval_lines(f"{title}: approval {decided.approval_id}", fields)
    )
    return 0


def approvals_expire_command(approvals: ApprovalService | None, io: CommandIO) -> int:
    """Record every overdue approval's expiry and fail the runs left waiting; print counts."""
    report = None if approvals is None else approvals.expire_overdue()
    fields: Fields = {
        "expired_approvals": 0 if report is None else report.expired_approvals,
        "failed_runs": 0 if report is None else report.failed_runs,
    }
    io.emit(fields, detail_lines("expiry pass", fields))
    return 0


def approvals_statement_command(
    approvals: ApprovalService | None, approval_id: str, decision: str, io: CommandIO
) -> int:
    """Write the exact bytes a decider signs for ``decision``, no newline, to standard output."""
    if approvals is None:
        raise cold_not_found("approval")
    try:
        statement = approvals.decision_statement(approval_id, decision).decode("utf-8")
    except ApprovalDecisionNotAllowed as refused:
        raise _naming_allowed(approvals, approval_id, decision, refused, reveal=False) from None
    if io.json_output:
        io.emit({"statement": statement}, [])
    else:
        io.out.write(statement)
    return 0


def approvals_signed_command(
    approvals: ApprovalService | None, approval_id: str, io: CommandIO
) -> int:
    """Print the approval's signed decisions, one statement document per line, for auditors."""
    if approvals is None:
        raise cold_not_found("approval")
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
        raise cold_not_found("store")
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
    io.emit(fields, detail_lines("signed decision: ok", fields))
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
            "not a signed decision: expected one JSON line as 'approvals signed' prints it",
            fix="pass one line of 'flowvault approvals signed APPROVAL_ID' output unchanged",
        )
    return statement, raw, decider


# -- gathering and arguments ----------------------------------------------------


SIGNATURE_BYTES = 64
SIGNATURE_FILE_LIMIT = 256


def _approvals(services: Services) -> ApprovalService:
    return services.approvals


def _approvals_list(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _approvals,
        lambda found: approvals_list_command(found, args.run, args.status, page_request(args), io),
    )


def _approvals_show(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _approvals,
        lambda found: approvals_show_command(found, args.approval_id, io, reveal=args.reveal),
    )


def _approvals_decide(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    request = DecideRequest(
        approval_id=args.approval_id,
        decision=args.decision,
        actor=args.actor,
        yes=args.yes,
        signature=None if args.signature_file is None else _signature(args.signature_file),
        reveal=args.reveal,
    )
    return with_service(
        context, _approvals, lambda found: approvals_decide_command(found, request, io)
    )


def _signature(path: Path) -> bytes:
    """Read a signature file: 64 raw bytes (as ``openssl pkeyutl -sign`` writes) or hex text."""
    try:
        content = path.read_bytes()[: 2 * SIGNATURE_FILE_LIMIT]
    except OSError as error:
        raise InvalidInput(
            f"cannot read signature file {path}: {error.strerror}",
            fix="check the --signature-file path and that this user can read it",
        ) from None
    if len(content) == SIGNATURE_BYTES:
        return content
    try:
        return bytes.fromhex(content.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput(
            f"signature file {path} holds neither 64 raw bytes nor hex text",
            fix="pass the file 'openssl pkeyutl -sign -rawin' wrote over the output of "
            "'flowvault approvals statement', or its hex",
        ) from None


def _approvals_expire(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del args
    return with_service(context, _approvals, lambda found: approvals_expire_command(found, io))


def _approvals_statement(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _approvals,
        lambda found: approvals_statement_command(found, args.approval_id, args.decision, io),
    )


def _approvals_signed(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context, _approvals, lambda found: approvals_signed_command(found, args.approval_id, io)
    )


def _approvals_register_key(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    pem = read_text_file(str(args.public_key), io.stdin, "public key").encode("utf-8")
    return with_service(
        context,
        _approvals,
        lambda found: approvals_register_key_command(found, args.actor, pem, io),
    )


def _approvals_verify_decision(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del context
    document = read_text_file(args.statement, io.stdin, "signed decision")
    return verify_decision_command(document, load_public_key(args.public_key), io)
