"""The ``flowvault`` verbs workflows, runs and approvals: list, show and decide."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from flowvault.adapters.cli import (
    CommandIO,
    DecideRequest,
    PageRequest,
    approvals_decide_command,
    approvals_list_command,
    approvals_show_command,
    runs_events_command,
    runs_list_command,
    runs_show_command,
    workflows_events_command,
    workflows_list_command,
    workflows_show_command,
)
from flowvault.application import ApprovalService, RunService, WorkflowService
from flowvault.composition._bootstrap import Runtime, open_existing
from flowvault.composition._cli_base import Verbs, add_verb
from flowvault.composition._settings import Settings
from flowvault.domain import RUN_LIFECYCLE, ApprovalStatus

S = TypeVar("S")

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
    return _with(settings, _workflows, lambda found: workflows_show_command(found, args.id, io))


def _workflows_events(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings,
        _workflows,
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
        lambda found: approvals_list_command(
            found, args.run, args.status, _page_request(args), io
        ),
    )


def _approvals_show(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    return _with(
        settings, _approvals, lambda found: approvals_show_command(found, args.approval_id, io)
    )


def _approvals_decide(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    request = DecideRequest(
        approval_id=args.approval_id, decision=args.decision, actor=args.actor, yes=args.yes
    )
    return _with(settings, _approvals, lambda found: approvals_decide_command(found, request, io))


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


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    _register_workflows(verbs)
    _register_runs(verbs)
    _register_approvals(verbs)
