"""Finding replayed records in an audit: each bound record is read back as its service would.

Opening a record proves its seal, not that it is current: an older row put
back whole opens as well as the live one. The services refuse such a row
because it names an older event of its stream than the stream's head allows;
an audit that only opened records would call it readable. So for every
stream it verifies, the audit reads the record that stream binds (the
workflow, the graph run, the scope's state) through the same freshness
check the services apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application._run_service import RunService
from flowvault.application._sealed import SealedRepository
from flowvault.application._state import StateRepository
from flowvault.application._workflows import WorkflowService
from flowvault.domain import IntegrityFailure, InvalidInput, NotFound


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

    def check(self, stream: str) -> StaleRecord | None:
        """Return what is wrong with the record ``stream`` binds, or ``None`` if it is current.

        Streams of other shapes (a host's own) bind no record. A record that
        is absent is not judged here: deleted records are the retention
        tombstones' and the audit's record count's business.
        """
        kind, _, name = stream.partition("/")
        try:
            if kind == "workflow":
                self._workflows.get(name)
            elif kind == "run":
                self._runs.get_run(name)
            elif kind == "scope":
                StateRepository(self._repository, name).check_current()
        except (NotFound, InvalidInput):
            return None
        except IntegrityFailure as error:
            if "ledger_index" not in error.details:
                return None
            namespace = error.details.get("namespace")
            key_digest = error.details.get("key_digest")
            return StaleRecord(
                stream,
                namespace if isinstance(namespace, str) else None,
                key_digest if isinstance(key_digest, str) else None,
                error.message,
            )
        return None
