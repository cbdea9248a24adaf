"""Retention of finished runs: the retention job deletes them once they are old enough."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial

from flowvault.application._freshness import IDEMPOTENCY_KIND, record_stream
from flowvault.application._graph_namespaces import GRAPH_RUN_IDEMPOTENCY, GRAPH_RUNS
from flowvault.application._record_kind import PURGE_BATCH, Doomed, RecordPurge
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    Delete,
    Guard,
    RecordMetadata,
)
from flowvault.application._run_records import open_listed_run
from flowvault.application._sealed import SealedRepository
from flowvault.application._streams import run_stream
from flowvault.application.ports import Clock
from flowvault.domain import InvalidInput, JsonValue
from flowvault.domain._envelope import format_instant


def purge_finished_runs(
    repository: SealedRepository,
    clock: Clock,
    now: datetime,
    older_than: timedelta,
    batch_size: int = PURGE_BATCH,
) -> int:
    """Delete runs that finished before ``now - older_than``, in bounded batches.

    Each batch is one unit: the run records, their idempotency markers
    and, in each run's own stream (and each marker's record stream), a
    digest-only ``RETENTION_TOMBSTONE``. The streams stay, so they still
    verify; receipts stay as proof.
    """
    if type(batch_size) is not int or not 1 <= batch_size <= MAX_LIST_LIMIT:
        raise InvalidInput(f"batch_size must be between 1 and {MAX_LIST_LIMIT}")
    doom = partial(_doomed_run, repository)
    return RecordPurge(repository, clock, GRAPH_RUNS, "finished_at", doom)(
        now, older_than, batch_size
    )


def _doomed_run(repository: SealedRepository, metadata: RecordMetadata) -> Doomed | None:
    """Doom a listed finished run with its idempotency marker, or ``None`` if it is not one."""
    loaded = open_listed_run(repository, metadata)
    run = None if loaded is None else loaded.run
    if run is None or run.finished_at is None:
        return None
    tombstone: dict[str, JsonValue] = {
        "kind": "run",
        "run": metadata.key_digest,
        "payload_digest": metadata.payload_digest,
        "finished_at": format_instant(run.finished_at),
    }
    deletes = [Delete(GRAPH_RUNS, metadata.key_digest, metadata.revision)]
    streams = [run_stream(run.run_id)]
    marker = run.idempotency_key_digest
    if marker is not None:
        tombstone["idempotency_marker"] = marker
        deletes.append(Delete(GRAPH_RUN_IDEMPOTENCY, marker, Guard.ANY))
        streams.append(record_stream(IDEMPOTENCY_KIND, marker))
    return Doomed(tuple(deletes), tuple(streams), tombstone)
