"""``flowvault workflows list|show|events``: a workflow's metadata, hashes and verified events."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from flowvault.adapters.cli._context import CliContext, Services
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._listing import (
    EVENT_COLUMNS,
    Fields,
    PageRequest,
    cold_not_found,
    detail_lines,
    event_row,
    instant,
    page_request,
    page_rows,
    print_listing,
    read_pages,
    with_service,
)
from flowvault.application import WorkflowEventService, WorkflowService
from flowvault.domain import LedgerEvent, WorkflowRecord

WORKFLOW_COLUMNS = ("workflow_id", "kind", "state", "state_version", "updated_at")


def _workflow_row(record: WorkflowRecord) -> Fields:
    return {
        "workflow_id": record.workflow_id,
        "kind": record.work_order.kind,
        "state": record.state,
        "state_version": record.state_version,
        "updated_at": instant(record.updated_at),
    }


def _workflow_detail(record: WorkflowRecord, events: Sequence[LedgerEvent]) -> Fields:
    return {
        **_workflow_row(record),
        "priority": record.work_order.priority,
        "parameter_count": len(record.work_order.parameters),
        "machine_version": record.machine_version,
        "created_at": instant(record.created_at),
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
        return print_listing(io, "workflows", WORKFLOW_COLUMNS, None)
    page = read_pages(
        lambda cursor: workflows.list_workflows(state, request.limit, cursor=cursor), request
    )
    return print_listing(io, "workflows", WORKFLOW_COLUMNS, page_rows(page, _workflow_row))


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
        raise cold_not_found("workflow")
    record = workflows.get(workflow_id)
    fields = _workflow_detail(record, events.events(workflow_id))
    io.emit({"workflow": fields}, detail_lines(f"workflow {workflow_id}", fields))
    return 0


def workflows_events_command(
    events: WorkflowEventService | None, workflow_id: str, request: PageRequest, io: CommandIO
) -> int:
    """List a workflow's verified events in index order; ``None`` is a cold root."""
    if events is None:
        raise cold_not_found("workflow")
    page = read_pages(lambda cursor: events.event_page(workflow_id, cursor, request.limit), request)
    return print_listing(io, "events", EVENT_COLUMNS, page_rows(page, event_row))


# -- gathering and arguments ----------------------------------------------------


def _workflows(services: Services) -> WorkflowService:
    return services.workflows


def _workflow_events(services: Services) -> WorkflowEventService:
    return services.workflow_events


def _workflow_readers(services: Services) -> tuple[WorkflowService, WorkflowEventService]:
    return services.workflows, services.workflow_events


def _workflows_list(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _workflows,
        lambda found: workflows_list_command(found, args.state, page_request(args), io),
    )


def _workflows_show(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    def show(found: tuple[WorkflowService, WorkflowEventService] | None) -> int:
        workflows, events = found or (None, None)
        return workflows_show_command(workflows, events, args.id, io)

    return with_service(context, _workflow_readers, show)


def _workflows_events(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        _workflow_events,
        lambda found: workflows_events_command(found, args.id, page_request(args), io),
    )
