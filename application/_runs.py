"""The run repository: terminal workflow results, sealed under their run id.

Each save appends ``result.saved`` to the result's record stream
(``result/<digest>``) and binds the row to it, so an older save put back
whole is refused, and a result deleted outside flowvault is refused rather
than read as never saved.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from functools import partial

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._freshness import (
    RESULT_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._instants import micros
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._records import (
    FilterOp,
    Guard,
    LabelFilter,
    RecordMetadata,
    UnitOfWork,
)
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    NotFound,
    RevisionConflict,
    WorkflowResult,
)
from flowvault.domain._state import RUN_ID_PATTERN

RUNS = "flowvault.runs"



def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it follows the run id grammar, else raise ``InvalidInput``."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id:
        raise InvalidInput(
            "a run id is 3-128 of [A-Za-z0-9._-], starts alphanumeric and has no '..'",
            fix="pass a run id as 'flowvault runs list' prints it",
        )
    return run_id


def _instant(since: date | datetime) -> datetime:
    if not isinstance(since, date):
        raise InvalidInput("since must be a date or a timezone-aware datetime")
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise InvalidInput("since must be a date or a timezone-aware datetime")
        return since
    return datetime(since.year, since.month, since.day, tzinfo=UTC)


class ResultRepository:
    """Sealed terminal run results; a run only ever comes back under its own id."""

    def __init__(self, repository: SealedRepository) -> None:
        self._repo = repository
        self._store = repository.store
        self._fresh = StreamPolicy[SealedDocument](
            "run result", repository, leaves_record=leaves_unnamed
        )

    def save(self, result: WorkflowResult) -> RecordMetadata:
        """Store ``result`` under its run id, replacing an earlier save of the same run.

        Raises:
            RevisionConflict: other saves of the same run kept winning the race.

        """
        check_run_id(result.run_id)
        return settle(partial(self._save, result), "run result")

    def _save(self, result: WorkflowResult) -> RecordMetadata | Lost:
        """Write ``result`` bound to a new ``result.saved`` event; ``LOST`` if another save won."""
        digest = self._repo.key_digest(RUNS, result.run_id)
        event = record_event(
            self._repo,
            record_stream(RESULT_KIND, digest),
            "result.saved",
            record_payload(digest),
            self._repo.clock.now(),
        )
        upsert = self._repo.prepare(
            RUNS,
            result.run_id,
            result.model_dump(mode="json"),
            expected=Guard.ANY,
            labels={"finished_at": micros(result.finished_at)},
            ledger_index=event.index,
        )
        try:
            self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
        except RevisionConflict:
            return LOST
        return upsert.metadata

    def load(self, run_id: str) -> WorkflowResult:
        """Return the run stored under ``run_id``.

        Raises:
            NotFound: no run is stored under ``run_id``.
            IntegrityFailure: the row does not verify, names another run, is
                older than its record stream says, or is missing although the
                stream records a save.

        """
        check_run_id(run_id)
        digest = self._repo.key_digest(RUNS, run_id)
        opened = self._fresh.read_vouched(
            self._store,
            record_stream(RESULT_KIND, digest),
            (RUNS, digest),
            lambda: self._repo.read(RUNS, run_id),
        )
        if opened is None:
            raise NotFound("no such run")
        return self._verified(opened.document, run_id)

    @staticmethod
    def _verified(document: object, run_id: str) -> WorkflowResult:
        try:
            result = WorkflowResult.model_validate(document)
        except InvalidInput:
            raise IntegrityFailure("stored run has an unexpected shape") from None
        if result.run_id != run_id:
            raise IntegrityFailure("stored run names another run than its key")
        return result

    def list(
        self,
        *,
        since: date | datetime | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page[WorkflowResult]:
        """Return one page of runs, optionally only those finished at or after ``since``.

        Most recently saved first (ties by key digest), at most ``limit``
        (capped at 200); pass ``next_cursor`` back for the next page. A row
        deleted while it is listed is skipped; one that does not verify, names
        another run or is older than its record stream says is reported in
        ``unreadable`` by key digest, and the rest are listed.

        Raises:
            InvalidInput: a malformed ``since`` or ``limit``, or a cursor that
                is malformed or was issued for another listing or ``since``.

        """
        filters = []
        if since is not None:
            filters.append(LabelFilter("finished_at", micros(_instant(since)), FilterOp.GE))
        scope = PageScope(RUNS, tuple(label.value for label in filters))
        return read_page(
            self._store, scope, RUNS, filters, self._listed, cursor=cursor, limit=limit
        )

    def _listed(self, metadata: RecordMetadata) -> WorkflowResult | None:
        """Open and check one listed run; ``None`` if it vanished since the listing."""
        listed = self._open_row(metadata)
        opened = (
            None
            if listed is None
            else self._fresh.check_listed(
                self._store,
                record_stream(RESULT_KIND, metadata.key_digest),
                listed,
                partial(self._open_row, metadata),
            )
        )
        if opened is None:
            return None
        document = opened.document
        claimed = document.get("run_id") if isinstance(document, dict) else None
        if not isinstance(claimed, str) or self._repo.key_digest(RUNS, claimed) != (
            metadata.key_digest
        ):
            raise IntegrityFailure("stored run names another run than its key")
        return self._verified(document, claimed)

    def _open_row(self, metadata: RecordMetadata) -> SealedDocument | None:
        """Open a listed row, or ``None`` if it vanished since the listing."""
        record = self._store.load(metadata.namespace, metadata.key_digest)
        if record is None:
            return None
        return self._repo.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)
