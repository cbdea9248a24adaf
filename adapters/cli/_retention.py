"""``flowvault purge`` and ``compact``: delete what retention allows, give space back."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.application import RetentionJob, RetentionPolicy, RetentionReport, StoreCapabilities
from flowvault.application._audit import PurgeOutcome, purge
from flowvault.application._compaction import compact_fully
from flowvault.domain import InvalidInput, StoreBusy

_KINDS = (
    "action_results",
    "consumed_checkpoints",
    "decided_approvals",
    "idempotency_records",
    "finished_runs",
)
"""Retention report fields, in the order the job deletes them."""


def compact_command(
    complete: bool | None, sizes: Sequence[tuple[str, int | None, int | None]], io: CommandIO
) -> int:
    """Report an explicit compaction: each file's size around it; 1 if it did not finish.

    ``complete`` is ``None`` on a cold root, where nothing was opened.
    """
    if complete is False:
        return io.fail(
            StoreBusy(
                "other connections kept the write-ahead log from being truncated; "
                "run compact again when they are idle"
            )
        )
    document = {
        "cold_root": complete is None,
        "files": [{"path": p, "before_bytes": b, "after_bytes": a} for p, b, a in sizes],
    }
    if io.json_output:
        io.emit(document, [])
    elif complete is None:
        io.say("cold root: no store exists, nothing to compact")
    else:
        io.say("compact: complete")
        rows = [(p, _bytes(b), _bytes(a)) for p, b, a in sizes]
        io.table("files", ("file", "before", "after"), rows)
    return 0


def _bytes(size: int | None) -> str:
    return "absent" if size is None else f"{size} bytes"


def _purge_document(outcome: PurgeOutcome, cold_root: bool) -> dict[str, object]:
    report = outcome.report
    return {
        "cold_root": cold_root,
        "deleted": {kind: getattr(report, kind) for kind in _KINDS},
        "total": report.total,
        "expired_approvals": report.expired_approvals,
        "failed_runs": report.failed_runs,
        "compacted": outcome.compacted,
    }


def purge_command(
    job: RetentionJob | None, capabilities: StoreCapabilities | None, io: CommandIO
) -> int:
    """Run the retention job and compaction, then print counts per kind; ``None`` when cold."""
    cold_root = job is None or capabilities is None
    if job is None or capabilities is None:
        outcome = PurgeOutcome(RetentionReport(), compacted=True)
    else:
        outcome = purge(job, capabilities, progress=io.progress)
    document = _purge_document(outcome, cold_root)
    if io.json_output:
        io.emit(document, [])
        return 0
    if cold_root:
        io.say("cold root: no store exists, nothing to purge")
    report = outcome.report
    rows = [(kind, getattr(report, kind)) for kind in _KINDS]
    io.table("purged", ("kind", "deleted"), [*rows, ("total", report.total)])
    io.say(
        f"expired approvals recorded: {report.expired_approvals}; "
        f"runs failed for an expired approval: {report.failed_runs}"
    )
    io.say("compaction: " + ("complete" if outcome.compacted else "incomplete, run purge again"))
    return 0


# -- gathering and arguments ----------------------------------------------------


MAX_DAYS = 36500


def _policy(args: argparse.Namespace) -> RetentionPolicy:
    defaults = RetentionPolicy()
    days, runs = args.older_than_days, args.finished_runs_older_than_days
    age = None if days is None else timedelta(days=days)
    return RetentionPolicy(
        consumed_checkpoints=defaults.consumed_checkpoints if age is None else age,
        decided_approvals=defaults.decided_approvals if age is None else age,
        idempotency_records=defaults.idempotency_records if age is None else age,
        finished_runs=defaults.finished_runs if runs is None else timedelta(days=runs),
    )


def _purge(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    policy = _policy(args)
    services = context.open_existing()
    if services is None:
        return purge_command(None, None, io)
    with services:
        return purge_command(services.retention(policy), services.capabilities, io)


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _compact(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    settings = context.settings
    if settings.backend == "postgres":
        raise InvalidInput(
            "compact rewrites SQLite files; on PostgreSQL the server reclaims deleted rows "
            "with (auto)vacuum (see docs/postgres.md)"
        )
    files = [settings.database_path, *settings.database_sidecars]
    services = context.open_existing()
    if services is None:
        return compact_command(None, [], io)
    before = [_file_size(path) for path in files] if settings.backend == "sqlite" else []
    with services:
        complete = compact_fully(services.capabilities)
    sizes = [(str(path), size, _file_size(path)) for path, size in zip(files, before, strict=False)]
    return compact_command(complete, sizes, io)


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {text!r}") from None
    if not 0 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"days must be within 0..{MAX_DAYS}")
    return days
