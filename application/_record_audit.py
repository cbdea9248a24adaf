"""Finding replayed and deleted records in an audit, stream by stream.

Opening a record proves its seal, not that it is current: an older row put
back whole opens as well as the live one. The services refuse such a row
because it names an older event of its stream than the stream's head allows;
an audit that only opened records would call it readable. So for every
stream it verifies, the audit checks the records that stream binds:

- a workflow, a graph run or a scope's state is read through the same
  freshness check its service applies;
- a record stream (a checkpoint with its approvals and slots, an
  idempotency marker, a witness) names in its events every row it wrote:
  the newest event naming a row must be the one that row names, and a row
  it names must exist unless that event is a retention tombstone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from flowvault.application._approval_support import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    REQUEST_IDEMPOTENCY,
    WITNESSES,
)
from flowvault.application._freshness import (
    CHECKPOINT_KIND,
    IDEMPOTENCY_KIND,
    WITNESS_KIND,
    written_by,
)
from flowvault.application._graph import RETENTION_TOMBSTONE
from flowvault.application._run_service import GRAPH_RUN_IDEMPOTENCY, RunService
from flowvault.application._sealed import SealedRepository
from flowvault.application._state import StateRepository
from flowvault.application._verified import verified_events
from flowvault.application._workflows import IDEMPOTENCY, WorkflowService
from flowvault.domain import IntegrityFailure, InvalidInput, LedgerEvent, NotFound

RECORD_STREAM_NAMESPACES: Final[Mapping[str, tuple[str, ...]]] = {
    CHECKPOINT_KIND: (CHECKPOINTS, APPROVALS, APPROVAL_SLOTS),
    IDEMPOTENCY_KIND: (IDEMPOTENCY, REQUEST_IDEMPOTENCY, GRAPH_RUN_IDEMPOTENCY),
    WITNESS_KIND: (WITNESSES,),
}
"""Where the rows a record stream names may live, by the stream's kind."""


@dataclass(frozen=True, slots=True)
class StaleRecord:
    """A record older than its stream says: replayed, or its newer history cut off."""

    stream: str
    namespace: str | None
    key_digest: str | None
    reason: str


class BoundRecords:
    """Reads the record a stream binds through its service's freshness check."""

    def __init__(
        self, repository: SealedRepository, workflows: WorkflowService, runs: RunService
    ) -> None:
        self._repository = repository
        self._workflows = workflows
        self._runs = runs

    def check(self, stream: str) -> list[StaleRecord]:
        """Return what is wrong with the records ``stream`` binds; empty when all are current.

        Streams of other shapes (a host's own) bind no record. A workflow,
        run or state that is absent is not judged here (they are deleted
        only with a tombstone in their stream); a record stream's rows are.
        A stream that fails verification is left to the stream audit.
        """
        kind, _, name = stream.partition("/")
        if kind in RECORD_STREAM_NAMESPACES:
            return self._record_stream(stream, RECORD_STREAM_NAMESPACES[kind])
        try:
            if kind == "workflow":
                self._workflows.get(name)
            elif kind == "run":
                self._runs.get_run(name)
            elif kind == "scope":
                StateRepository(self._repository, name).check_current()
        except (NotFound, InvalidInput):
            return []
        except IntegrityFailure as error:
            if "ledger_index" not in error.details and not error.details.get("missing"):
                return []
            namespace = error.details.get("namespace")
            key_digest = error.details.get("key_digest")
            return [
                StaleRecord(
                    stream,
                    namespace if isinstance(namespace, str) else None,
                    key_digest if isinstance(key_digest, str) else None,
                    error.message,
                )
            ]
        return []

    def _record_stream(self, stream: str, namespaces: tuple[str, ...]) -> list[StaleRecord]:
        store = self._repository.store
        try:
            events = verified_events(store, stream, self._repository)
        except IntegrityFailure:
            return []
        newest: dict[str, LedgerEvent] = {}
        for event in events:
            for key_digest in written_by(event):
                newest[key_digest] = event
        found: list[StaleRecord] = []
        for key_digest, event in sorted(newest.items()):
            if event.type == RETENTION_TOMBSTONE:
                continue
            located = [
                (namespace, metadata)
                for namespace in namespaces
                if (metadata := store.peek_metadata(namespace, key_digest)) is not None
            ]
            if not located:
                reason = (
                    f"the record's stream says event {event.index} wrote it and no purge "
                    "since, but it is missing: deleted outside flowvault"
                )
                found.append(StaleRecord(stream, None, key_digest, reason))
                continue
            namespace, metadata = located[0]
            if metadata.header.ledger_index != event.index:
                reason = (
                    f"the record names event {metadata.header.ledger_index} but event "
                    f"{event.index} of its stream wrote it last: a replayed or rolled-back row"
                )
                found.append(StaleRecord(stream, namespace, key_digest, reason))
        return found
