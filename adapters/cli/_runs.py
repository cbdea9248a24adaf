"""``flowvault runs list|show|receipt|events|recover``: graph runs' metadata, receipts, recovery."""

from __future__ import annotations

import argparse

from flowvault.adapters.cli._context import CliContext, Services
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._listing import (
    EVENT_COLUMNS,
    Fields,
    PageRequest,
    attribute_row,
    cold_not_found,
    detail_lines,
    event_row,
    page_request,
    page_rows,
    print_listing,
    read_pages,
    with_service,
)
from flowvault.adapters.cli._receipts import terminal_receipt_document
from flowvault.application import Page, RunService, TerminalReceipts
from flowvault.domain import GraphRun, InvalidInput, NotFound, TerminalReceipt

RUN_COLUMNS = ("run_id", "definition_id", "status", "started_at", "finished_at", "node_count")


def _run_row(run: GraphRun) -> Fields:
    return attribute_row(run, RUN_COLUMNS)


def _event_count(runs: RunService, run_id: str) -> tuple[int, bool]:
    """Count the run's retained events page by page; also whether older ones were trimmed."""
    page = runs.read_run_events(run_id)
    count, trimmed = len(page.events), page.gap
    while page.next_cursor is not None:
        page = runs.read_run_events(run_id, page.next_cursor)
        count += len(page.events)
    return count, trimmed


def _terminal_receipt(receipts: TerminalReceipts, run: GraphRun) -> TerminalReceipt | None:
    if not run.finished:
        return None
    try:
        return receipts.terminal_receipt(run.run_id)
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
        return print_listing(io, "runs", RUN_COLUMNS, None)
    page = read_pages(
        lambda cursor: runs.list_runs(status, cursor=cursor, limit=request.limit), request
    )
    return print_listing(io, "runs", RUN_COLUMNS, page_rows(page, _run_row))


def runs_show_command(
    found: tuple[RunService, TerminalReceipts] | None, run_id: str, io: CommandIO
) -> int:
    """Show one run's metadata, counts and receipt digest; never its input or state."""
    if found is None:
        raise cold_not_found("run")
    runs, receipts = found
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
        **_receipt_fields(_terminal_receipt(receipts, run)),
    }
    io.emit({"run": fields}, detail_lines(f"run {run_id}", fields))
    return 0


def runs_receipt_command(receipts: TerminalReceipts | None, run_id: str, io: CommandIO) -> int:
    """Print a finished run's terminal receipt, checked under the store key first, to keep."""
    if receipts is None:
        raise cold_not_found("run")
    receipt = receipts.terminal_receipt(run_id)
    io.emit(terminal_receipt_document(receipt), [receipt.text().removesuffix("\n")])
    return 0


def _run_events(runs: RunService, run_id: str, cursor: str | None, limit: int) -> Page[Fields]:
    """One page of a run's events; its cursor is the index of the next event, as text."""
    if cursor is not None and not (cursor.isascii() and cursor.isdigit()):
        raise InvalidInput("a run events cursor is the index of the next event")
    page = runs.read_run_events(run_id, None if cursor is None else int(cursor), limit)
    following = None if page.next_cursor is None else str(page.next_cursor)
    return Page(tuple(map(event_row, page.events)), (), following)


def runs_events_command(
    runs: RunService | None, run_id: str, request: PageRequest, io: CommandIO
) -> int:
    """List a run's verified events in index order; ``None`` is a cold root."""
    if runs is None:
        raise cold_not_found("run")
    page = read_pages(lambda cursor: _run_events(runs, run_id, cursor, request.limit), request)
    return print_listing(io, "events", EVENT_COLUMNS, page)


def runs_recover_command(runs: RunService | None, io: CommandIO) -> int:
    """Take over the runs whose host's lease expired, as this host; print how many."""
    fields: Fields = {
        "recovered": 0 if runs is None else runs.recover_incomplete_runs(),
        "host_id": None if runs is None else runs.host_id,
    }
    io.emit(fields, detail_lines("run recovery", fields))
    return 0


# -- gathering and arguments ----------------------------------------------------


def _runs(services: Services) -> RunService:
    return services.runs


def _run_readers(services: Services) -> tuple[RunService, TerminalReceipts]:
    return services.runs, services.receipts


def _receipts(services: Services) -> TerminalReceipts:
    return services.receipts


def _runs_list(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _runs,
        lambda found: runs_list_command(found, args.status, page_request(args), io),
    )


def _runs_show(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context, _run_readers, lambda found: runs_show_command(found, args.run_id, io)
    )


def _runs_receipt(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context, _receipts, lambda found: runs_receipt_command(found, args.run_id, io)
    )


def _runs_events(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _runs,
        lambda found: runs_events_command(found, args.run_id, page_request(args), io),
    )


def _runs_recover(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del args
    return with_service(context, _runs, lambda found: runs_recover_command(found, io))
