"""Finding replayed and deleted records in an audit, stream by stream.

Opening a record proves its seal, not that it is current: an older row put
back whole opens as well as the live one. The services refuse such a row
because it names an older event of its stream than the stream's head allows;
an audit that only opened records would call it readable. So for every
stream it verifies, the audit checks the records that stream binds:

- a workflow, a graph run or a scope's state is read through the same
  freshness check its service applies;
- a record stream (a checkpoint with its approvals and slots, an
  idempotency marker, a witness, an action result, a graph definition with
  its versions, a run result) names in its events every row it wrote:
  the newest event naming a row must be the one that row names, and a row
  it names must exist unless that event deleted it (a retention tombstone,
  or a service's ``deleted`` list), in which case it must be absent;
- a run's stream is held the same way for the terminal receipt its
  ``run.<status>`` event names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from flowvault.application._action_results import ACTION_RESULTS
from flowvault.application._decider_keys import DECIDER_KEY_KIND, DECIDER_KEYS
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    CHECKPOINT_KIND,
    DEFINITION_KIND,
    IDEMPOTENCY_KIND,
    RESULT_KIND,
    WITNESS_KIND,
    deleted_by,
    written_by,
)
from flowvault.application._graph_namespaces import (
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_DEFINITIONS,
    GRAPH_RUN_IDEMPOTENCY,
    GRAPH_RUN_RECEIPTS,
)
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    REQUEST_IDEMPOTENCY,
    WITNESSES,
)
from flowvault.application._records import RecordMetadata
from flowvault.application._run_service import RunService
from flowvault.application._runs import RUNS
from flowvault.application._sealed import SealedRepository
from flowvault.application._state import StateRepository
from flowvault.application._verified import verified_events
from flowvault.application._workflows import IDEMPOTENCY, WorkflowService
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import IntegrityFailure, InvalidInput, LedgerEvent, NotFound

RECORD_STREAM_NAMESPACES: Final[Mapping[str, tuple[str, ...]]] = {
    CHECKPOINT_KIND: (CHECKPOINTS, APPROVALS, APPROVAL_SLOTS),
    IDEMPOTENCY_KIND: (IDEMPOTENCY, REQUEST_IDEMPOTENCY, GRAPH_RUN_IDEMPOTENCY),
    WITNESS_KIND: (WITNESSES,),
    ACTION_RESULT_KIND: (ACTION_RESULTS,),
    DEFINITION_KIND: (GRAPH_DEFINITIONS, GRAPH_DEFINITION_VERSIONS),
    RESULT_KIND: (RUNS,),
    DECIDER_KEY_KIND: (DECIDER_KEYS,),
}
"""Where the rows a record stream names may live, by the stream's kind."""


def _by_service(event: LedgerEvent) -> bool:
    """Whether a run-stream event is the service's own: callers cannot write ``run.*`` events."""
    return event.type.startswith("run.")


def _locate(
    store: SecureObjectStore, namespaces: tuple[str, ...], key_digest: str
) -> tuple[str, RecordMetadata] | None:
    """Find the row ``key_digest`` in the first of ``namespaces`` holding it (one lookup each)."""
    for namespace in namespaces:
        metadata = store.peek_metadata(namespace, key_digest)
        if metadata is not None:
            return namespace, metadata
    return None


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

    @property
    def repository(self) -> SealedRepository:
        """The repository whose key the records, and the events they are held to, verify under."""
        return self._repository

    @staticmethod
    def reads_events(stream: str) -> bool:
        """Whether ``check`` reads the events of ``stream`` (a record stream's, or a run's)."""
        kind = stream.partition("/")[0]
        return kind in RECORD_STREAM_NAMESPACES or kind == "run"

    def check(
        self, stream: str, *, events: Sequence[LedgerEvent] | None = None
    ) -> list[StaleRecord]:
        """Return what is wrong with the records ``stream`` binds; empty when all are current.

        Streams of other shapes (a host's own) bind no record. A workflow,
        run or state that is absent is not judged here (they are deleted
        only with a tombstone in their stream); a record stream's rows are.
        A stream that fails verification is left to the stream audit.
        ``events``, when given, are every retained event of ``stream`` as a
        verification under this repository's key has just passed them; the
        stream is then not read again.
        """
        kind, _, name = stream.partition("/")
        if kind in RECORD_STREAM_NAMESPACES:
            return self._record_stream(stream, RECORD_STREAM_NAMESPACES[kind], events=events)
        found = self._bound(stream, kind, name)
        if kind == "run":
            found += self._record_stream(
                stream, (GRAPH_RUN_RECEIPTS,), only=_by_service, events=events
            )
        return found

    def _bound(self, stream: str, kind: str, name: str) -> list[StaleRecord]:
        """Read the one record a workflow, run or scope stream binds through its service."""
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

    def _record_stream(
        self,
        stream: str,
        namespaces: tuple[str, ...],
        *,
        only: Callable[[LedgerEvent], bool] | None = None,
        events: Sequence[LedgerEvent] | None = None,
    ) -> list[StaleRecord]:
        """Hold every row the events of ``stream`` (those ``only`` admits) name to the newest."""
        store = self._repository.store
        if events is None:
            try:
                events = verified_events(store, stream, self._repository)
            except IntegrityFailure:
                return []
        newest: dict[str, LedgerEvent] = {}
        for event in events:
            if only is not None and not only(event):
                continue
            for key_digest in written_by(event):
                newest[key_digest] = event
        found: list[StaleRecord] = []
        for key_digest, event in sorted(newest.items()):
            located = _locate(store, namespaces, key_digest)
            if key_digest in deleted_by(event):
                if located is not None:
                    reason = (
                        f"event {event.index} of the record's stream deleted it, but it is "
                        "there: a purged or deleted row put back"
                    )
                    found.append(StaleRecord(stream, located[0], key_digest, reason))
                continue
            if located is None:
                reason = (
                    f"the record's stream says event {event.index} wrote it and no purge "
                    "since, but it is missing: deleted outside flowvault"
                )
                found.append(StaleRecord(stream, None, key_digest, reason))
                continue
            namespace, metadata = located
            if metadata.header.ledger_index != event.index:
                reason = (
                    f"the record names event {metadata.header.ledger_index} but event "
                    f"{event.index} of its stream wrote it last: a replayed or rolled-back row"
                )
                found.append(StaleRecord(stream, namespace, key_digest, reason))
        return found
