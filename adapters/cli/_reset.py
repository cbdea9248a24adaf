"""``flowvault reset-progress``: fingerprint a scope's state and reset it after asking."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._listing import with_service
from flowvault.application import StateRepository
from flowvault.application._state import ResetOutcome, reset_progress
from flowvault.domain import WorkflowState
from flowvault.domain._fingerprint import Readability

SOURCE = "flowvault reset-progress"


@dataclass(frozen=True, slots=True)
class ResetRequest:
    """The verb's arguments, already parsed."""

    scope: str
    actor: str
    reason: str | None
    dry_run: bool
    yes: bool


def _verdict(outcome: ResetOutcome, *, preview: bool) -> str:
    absent = outcome.fingerprint.readability == Readability.ABSENT
    if outcome.cold_root:
        return "cold root: no store exists, nothing to reset"
    if preview:
        return "no state in this scope: nothing to delete" if absent else "would delete:"
    if outcome.applied and absent:
        return "nothing to delete: the scope had no state (a workflow_state.reset event records it)"
    if outcome.applied:
        return "reset: state deleted after recording a workflow_state.reset event"
    return "dry run: nothing deleted"


def _lines(outcome: ResetOutcome, *, preview: bool = False) -> list[str]:
    shown = outcome.fingerprint.model_dump(mode="json", exclude_none=True)
    verdict = _verdict(outcome, preview=preview)
    return [verdict, *(f"  {name}: {value}" for name, value in shown.items())]


def _document(outcome: ResetOutcome) -> dict[str, object]:
    return {
        "applied": outcome.applied,
        "cold_root": outcome.cold_root,
        "fingerprint": outcome.fingerprint.model_dump(mode="json"),
    }


def reset_progress_command(
    state: StateRepository[WorkflowState] | None, request: ResetRequest, io: CommandIO
) -> int:
    """Run the verb; ``state`` is ``None`` on a cold root. Returns the exit status."""
    apply = not request.dry_run
    if apply and state is not None and io.interactive and not request.yes:
        preview = reset_progress(
            state, request.scope, actor=request.actor, source=SOURCE,
            reason_class=request.reason, dry_run=True,
        )  # fmt: skip
        io.err.write("\n".join(_lines(preview, preview=True)) + "\n")
        if not io.confirm(f"Reset the workflow state of scope {request.scope!r}?"):
            io.err.write("aborted: nothing was reset\n")
            return 1
    outcome = reset_progress(
        state,
        request.scope,
        actor=request.actor,
        source=SOURCE,
        reason_class=request.reason,
        dry_run=request.dry_run,
    )
    io.emit(_document(outcome), _lines(outcome))
    return 0


# -- gathering and arguments ----------------------------------------------------


def _reset_progress(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    request = ResetRequest(
        scope=args.scope, actor=args.actor, reason=args.reason, dry_run=args.dry_run, yes=args.yes
    )
    return with_service(
        context,
        lambda services: services.state(args.scope),
        lambda state: reset_progress_command(state, request, io),
    )
