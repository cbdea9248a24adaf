"""The ``flowvault`` verbs workflows, runs and approvals: list, show and decide."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from flowvault.adapters.cli import (
    CommandIO,
    DecideRequest,
    PageRequest,
    approvals_decide_command,
    approvals_expire_command,
    approvals_list_command,
    approvals_register_key_command,
    approvals_show_command,
    approvals_signed_command,
    approvals_statement_command,
    read_text_file,
    runs_events_command,
    runs_list_command,
    runs_receipt_command,
    runs_show_command,
    verify_decision_command,
    workflows_events_command,
    workflows_list_command,
    workflows_show_command,
)
from flowvault.adapters.crypto import load_public_key
from flowvault.application import (
    ApprovalService,
    RunService,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.composition._bootstrap import Runtime, open_existing
from flowvault.composition._cli_base import Verbs, add_verb, file_path
from flowvault.composition._settings import Settings
from flowvault.domain import ApprovalStatus, InvalidInput
from flowvault.domain._graph_runs import RUN_LIFECYCLE

S = TypeVar("S")

SIGNATURE_BYTES = 64
SIGNATURE_FILE_LIMIT = 256

DEFAULT_LIMIT = 50
EVENT_LIMIT = 200
COLD_NOTE = "On a cold root it creates nothing."


def _with(settings: Settings, pick: Callable[[Runtime], S], call: Callable[[S | None], int]) -> int:
    """Open the store if it exists and hand ``call`` one service, or ``None`` on a cold root."""
    runtime = open_existing(settings)
    if runtime is None:
        return call(None)
    with runtime:
        return call(pick(runtime))


def _workflows(runtime: Runtime) -> WorkflowService:
    return runtime.workflows


def _workflow_events(runtime: Runtime) -> WorkflowEventService:
    return runtime.workflow_events


def _workflow_readers(runtime: Runtime) -> tuple[WorkflowService, WorkflowEventService]:
    return runtime.workflows, runtime.workflow_events


def _runs(runtime: Runtime) -> RunService:
    return runtime.graph_runs


def _approvals(runtime: Runtime) -> ApprovalService:
    return runtime.approvals


# -- handlers ------------------------------------------------------------------


def _workflows_list(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _workflows,
        lambda found: workflows_list_command(found, args.state, _page_request(args), io),
    )


def _workflows_show(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    def show(found: tuple[WorkflowService, WorkflowEventService] | None) -> int:
        workflows, events = found or (None, None)
        return workflows_show_command(workflows, events, args.id, io)

    return _with(settings, _workflow_readers, show)


def _workflows_events(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _workflow_events,
        lambda found: workflows_events_command(found, args.id, _page_request(args), io),
    )


def _runs_list(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _runs,
        lambda found: runs_list_command(found, args.status, _page_request(args), io),
    )


def _runs_show(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(settings, _runs, lambda found: runs_show_command(found, args.run_id, io))


def _runs_receipt(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(settings, _runs, lambda found: runs_receipt_command(found, args.run_id, io))


def _runs_events(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _runs,
        lambda found: runs_events_command(found, args.run_id, _page_request(args), io),
    )


def _approvals_list(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _approvals,
        lambda found: approvals_list_command(found, args.run, args.status, _page_request(args), io),
    )


def _approvals_show(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings, _approvals, lambda found: approvals_show_command(found, args.approval_id, io)
    )


def _approvals_decide(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    request = DecideRequest(
        approval_id=args.approval_id,
        decision=args.decision,
        actor=args.actor,
        yes=args.yes,
        signature=None if args.signature_file is None else _signature(args.signature_file),
    )
    return _with(settings, _approvals, lambda found: approvals_decide_command(found, request, io))


def _signature(path: Path) -> bytes:
    """Read a signature file: 64 raw bytes (as ``openssl pkeyutl -sign`` writes) or hex text."""
    try:
        content = path.read_bytes()[: 2 * SIGNATURE_FILE_LIMIT]
    except OSError as error:
        raise InvalidInput(f"cannot read signature file {path}: {error.strerror}") from None
    if len(content) == SIGNATURE_BYTES:
        return content
    try:
        return bytes.fromhex(content.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput(
            f"signature file {path} holds neither 64 raw bytes nor hex text"
        ) from None


def _approvals_expire(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    del args
    return _with(settings, _approvals, lambda found: approvals_expire_command(found, io))


def _approvals_statement(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _approvals,
        lambda found: approvals_statement_command(found, args.approval_id, args.decision, io),
    )


def _approvals_signed(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings, _approvals, lambda found: approvals_signed_command(found, args.approval_id, io)
    )


def _approvals_register_key(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    pem = read_text_file(str(args.public_key), io.stdin, "public key").encode("utf-8")
    return _with(
        settings,
        _approvals,
        lambda found: approvals_register_key_command(found, args.actor, pem, io),
    )


def _approvals_verify_decision(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    del settings
    document = read_text_file(args.statement, io.stdin, "signed decision")
    return verify_decision_command(document, load_public_key(args.public_key), io)


# -- parsers -------------------------------------------------------------------


def _group(verbs: Verbs, name: str, help: str) -> Verbs:
    group = verbs.add_parser(name, help=help, description=help)
    return group.add_subparsers(dest=f"{name}_verb", required=True, metavar="VERB")


def _paging(parser: argparse.ArgumentParser, default: int = DEFAULT_LIMIT) -> None:
    parser.add_argument(
        "--limit",
        type=int,
        default=default,
        help=f"at most this many per page (default {default}, capped at 200)",
    )
    parser.add_argument(
        "--cursor", metavar="TOKEN", help="start at this page: the next_cursor a listing printed"
    )
    parser.add_argument(
        "--all", action="store_true", help="page through every page (from --cursor on, if given)"
    )


def _page_request(args: argparse.Namespace) -> PageRequest:
    return PageRequest(limit=args.limit, cursor=args.cursor, all_pages=args.all)


def _register_workflows(verbs: Verbs) -> None:
    group = _group(verbs, "workflows", "list and inspect workflows (metadata and hashes only)")
    listing = add_verb(
        group,
        "list",
        help="list workflows, newest written first",
        description="List workflows by id, kind, state and version, newest written first. "
        + COLD_NOTE,
        handler=_workflows_list,
    )
    listing.add_argument("--state", help="only workflows in this state, e.g. 'decision'")
    _paging(listing)
    show = add_verb(
        group,
        "show",
        help="show one workflow's metadata, hashes and ledger length",
        description="Show one workflow: state, version, times, hashes and the length of its "
        "verified ledger. Never prints the work order's parameters or requester.",
        handler=_workflows_show,
    )
    show.add_argument("id", help="the workflow id")
    events = add_verb(
        group,
        "events",
        help="list one workflow's verified events, oldest first",
        description="List one workflow's ledger events by index, type, states, time and hash, "
        "oldest first, each page verified against the event before it. Never prints an "
        "event's payload.",
        handler=_workflows_events,
    )
    events.add_argument("id", help="the workflow id")
    _paging(events, default=EVENT_LIMIT)


def _register_runs(verbs: Verbs) -> None:
    group = _group(verbs, "runs", "list and inspect graph runs (metadata and digests only)")
    listing = add_verb(
        group,
        "list",
        help="list graph runs, newest written first",
        description="List graph runs by id, definition, status and times, newest written "
        "first. " + COLD_NOTE,
        handler=_runs_list,
    )
    listing.add_argument("--status", choices=sorted(RUN_LIFECYCLE.states), help="only this status")
    _paging(listing)
    show = add_verb(
        group,
        "show",
        help="show one run's metadata, counts and terminal receipt digest",
        description="Show one graph run: status, times, counts, definition version, the "
        "number of its events and, once finished, its terminal receipt's digests. Never "
        "prints its input, budgets or state.",
        handler=_runs_show,
    )
    show.add_argument("run_id", help="the run id")
    receipt = add_verb(
        group,
        "receipt",
        help="print a finished run's terminal receipt, to keep outside the store",
        description="Print the terminal receipt of a finished run as one line of canonical "
        "JSON, after checking it under the store key: digests, status and counts only. "
        "When the run ended with FLOWVAULT_SIGNING_KEY_FILE set, it carries an Ed25519 "
        "signature that 'ledger check-receipt' checks with the public key alone.",
        handler=_runs_receipt,
    )
    receipt.add_argument("run_id", help="the run id")

    events = add_verb(
        group,
        "events",
        help="list one run's verified events, oldest first",
        description="List one run's events by index, type, states, time and hash, oldest "
        "first, each page verified against the event before it. The cursor is the index of "
        "the next event. Never prints an event's payload.",
        handler=_runs_events,
    )
    events.add_argument("run_id", help="the run id")
    _paging(events, default=EVENT_LIMIT)


def _register_approvals(verbs: Verbs) -> None:
    group = _group(verbs, "approvals", "list, inspect and decide approval requests")
    statuses = [status.value for status in ApprovalStatus]
    listing = add_verb(
        group,
        "list",
        help="list approvals, of one run or of all, most recently written first",
        description="List approvals by id, status, times and run, most recently written "
        "first (a request or a decision writes one). " + COLD_NOTE,
        handler=_approvals_list,
    )
    listing.add_argument("--run", metavar="RUN_ID", help="only this run's approvals")
    listing.add_argument("--status", choices=statuses, help="only this status")
    _paging(listing)
    show = add_verb(
        group,
        "show",
        help="show one approval's status, times and digests",
        description="Show one approval: status, times, the number of allowed decisions and "
        "keyed digests. Never prints its audience, actor or decision in clear.",
        handler=_approvals_show,
    )
    show.add_argument("approval_id", help="the approval id")
    decide = add_verb(
        group,
        "decide",
        help="record a decision and consume the approval's checkpoint",
        description="Record a decision on a pending approval and consume its checkpoint in "
        "one unit of work, then print the approval receipt's digests. On a terminal it asks "
        "first unless --yes is given. Fails with APPROVAL_EXPIRED, APPROVAL_ALREADY_DECIDED "
        "or APPROVAL_DECISION_NOT_ALLOWED.",
        handler=_approvals_decide,
    )
    decide.add_argument("approval_id", help="the approval id")
    decide.add_argument("--decision", required=True, help="one of the allowed decisions")
    decide.add_argument("--actor", required=True, help="who decides (stored sealed, shown keyed)")
    decide.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    decide.add_argument(
        "--signature-file",
        type=file_path,
        metavar="FILE",
        help="the actor's Ed25519 signature of the decision statement (raw or hex); "
        "required once the actor has a registered key",
    )
    _register_signing_verbs(group)
    add_verb(
        group,
        "expire",
        help="record every overdue approval's expiry and fail the runs left waiting",
        description="Record the expiry of every pending approval past its deadline (its "
        "checkpoint is consumed with it), then move each run still awaiting_approval whose "
        "newest approval expired, with none pending, to failed. Prints the counts; safe to "
        "repeat. On a cold root it creates nothing.",
        handler=_approvals_expire,
    )


def _register_signing_verbs(group: Verbs) -> None:
    statement = add_verb(
        group,
        "statement",
        help="print the exact bytes a decider signs for a decision",
        description="Print the decision statement (canonical JSON) a decider with a "
        "registered key signs, e.g. with 'openssl pkeyutl -sign -rawin'.",
        handler=_approvals_statement,
    )
    statement.add_argument("approval_id", help="the approval id")
    statement.add_argument("--decision", required=True, help="one of the allowed decisions")
    register = add_verb(
        group,
        "register-key",
        help="register a decider's Ed25519 public key; their decisions must then be signed",
        description="Register the Ed25519 public key (PEM) of a decider. From then on a "
        "decision by that actor counts only with --signature-file, and its signed statement "
        "can be checked by anyone holding the public key.",
        handler=_approvals_register_key,
    )
    register.add_argument("--actor", required=True, help="the decider (stored sealed)")
    register.add_argument(
        "public_key", type=file_path, metavar="PUBLIC_KEY", help="the public key file (PEM)"
    )
    signed = add_verb(
        group,
        "signed",
        help="print an approval's signed decisions, one JSON line each, for an auditor",
        description="Print each signed decision of an approval as one JSON line: the "
        "statement, the signature and the decider's keyed digest. Check a line with "
        "'approvals verify-decision' and the decider's public key alone.",
        handler=_approvals_signed,
    )
    signed.add_argument("approval_id", help="the approval id")
    verify = add_verb(
        group,
        "verify-decision",
        help="check a signed decision with the decider's public key alone",
        description="Check that a line printed by 'approvals signed' was signed by the "
        "holder of the given key: no store and no store key are needed. Exits 1 "
        "(INTEGRITY_FAILURE) when the signature is not that key's.",
        handler=_approvals_verify_decision,
    )
    verify.add_argument("statement", metavar="FILE", help="the signed decision ('-' for stdin)")
    verify.add_argument(
        "--public-key", type=file_path, metavar="FILE", required=True, help="the public key (PEM)"
    )


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    _register_workflows(verbs)
    _register_runs(verbs)
    _register_approvals(verbs)
