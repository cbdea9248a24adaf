"""``flowvault fingerprint``: what can be said of a scope's state without its content."""

from __future__ import annotations

import argparse

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._listing import with_service
from flowvault.application import StateRepository
from flowvault.application._state import cold_fingerprint
from flowvault.domain import ResetFingerprint, WorkflowState


def _fingerprint_lines(fingerprint: ResetFingerprint, cold_root: bool) -> list[str]:
    heading = f"fingerprint of scope {fingerprint.scope!r}"
    if cold_root:
        heading += " (cold root: no store exists)"
    shown = fingerprint.model_dump(mode="json", exclude_none=True)
    return [heading, *(f"  {name}: {value}" for name, value in shown.items())]


def fingerprint_command(
    state: StateRepository[WorkflowState] | None,
    scope: str,
    reason: str | None,
    io: CommandIO,
) -> int:
    """Print the plaintext-free fingerprint of a scope's state; ``state`` is ``None`` when cold."""
    cold_root = state is None
    fingerprint = cold_fingerprint(scope, reason) if state is None else state.fingerprint(reason)
    document = {"cold_root": cold_root, "fingerprint": fingerprint.model_dump(mode="json")}
    io.emit(document, _fingerprint_lines(fingerprint, cold_root))
    return 0


# -- gathering and arguments ----------------------------------------------------


def _fingerprint(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    return with_service(
        context,
        lambda services: services.state(args.scope),
        lambda state: fingerprint_command(state, args.scope, args.reason, io),
    )
