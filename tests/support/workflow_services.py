"""The workflow services over one repository, sharing one record book as bootstrap wires them."""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application import (
    ActionResultService,
    Clock,
    IdFactory,
    SealedRepository,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.application._workflow_records import WorkflowRecords
from flowvault.domain import StateMachine
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE


@dataclass(frozen=True)
class WorkflowServices:
    """The lifecycle, the event stream and the action results of workflows in one repository."""

    workflows: WorkflowService
    events: WorkflowEventService
    results: ActionResultService


def workflow_services(
    repository: SealedRepository,
    clock: Clock,
    ids: IdFactory,
    *,
    machine: StateMachine = DEFAULT_LIFECYCLE,
) -> WorkflowServices:
    """Wire the three workflow services over one shared ``WorkflowRecords``."""
    records = WorkflowRecords(repository, machine=machine)
    return WorkflowServices(
        WorkflowService(records, clock, ids),
        WorkflowEventService(records, clock),
        ActionResultService(records, clock),
    )
