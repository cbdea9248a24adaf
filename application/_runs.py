"""The run repository: terminal workflow results, sealed under their run id."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pydantic import ValidationError

from flowvault.application._records import FilterOp, Guard, LabelFilter, Order, RecordMetadata
from flowvault.application._sealed import SealedRepository
from flowvault.domain import (
    RUN_ID_PATTERN,
    IntegrityFailure,
    InvalidInput,
    NotFound,
    WorkflowResult,
)

RUNS = "flowvault.runs"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it follows the run id grammar, else raise ``InvalidInput``."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id:
        raise InvalidInput(
            "a run id is 3-128 of [A-Za-z0-9._-], starts alphanumeric and has no '..'"
        )
    return run_id


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def _instant(since: date | datetime) -> datetime:
    if not isinstance(since, date):
        raise InvalidInput("since must be a date or a timezone-aware datetime")
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise InvalidInput("since must be a date or a timezone-aware datetime")
        return since
    return datetime(since.year, since.month, since.day, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs, newest first, and the cursor for the next page."""

    runs: tuple[WorkflowResult, ...]
    next_cursor: str | None


class RunRepository:
    """Sealed terminal run results; a run only ever comes back under its own id."""

    def __init__(self, repository: SealedRepository) -> None:
        self._repo = repository
        self._store = repository.store

    def save(self, result: WorkflowResult) -> RecordMetadata:
        """Store ``result`` under its run id, replacing an earlier save of the same run."""
        check_run_id(result.run_id)
        return self._repo.write(
            RUNS,
            result.run_id,
            result.model_dump(mode="json"),
            expected=Guard.ANY,
            labels={"finished_at": _micros(result.finished_at)},
        )

    def load(self, run_id: str) -> WorkflowResult:
        """Return the run stored under ``run_id``.

        Raises:
            NotFound: no run is stored under ``run_id``.
            IntegrityFailure: the row does not verify, or names another run.

        """
        opened = self._repo.read(RUNS, check_run_id(run_id))
        if opened is None:
            raise NotFound("no such run")
        return self._verified(opened.document, run_id)

    @staticmethod
    def _verified(document: object, run_id: str) -> WorkflowResult:
        try:
            result = WorkflowResult.model_validate(document)
        except ValidationError:
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
    ) -> RunPage:
        """Return runs newest-saved first, optionally only those finished at or after ``since``."""
        filters = []
        if since is not None:
            filters.append(LabelFilter("finished_at", _micros(_instant(since)), FilterOp.GE))
        page = self._store.list(
            RUNS, filters=filters, order=Order.WRITTEN_AT_DESC, cursor=cursor, limit=limit
        )
        runs = []
        for metadata in page.items:
            record = self._store.load(metadata.namespace, metadata.key_digest)
            if record is None:
                continue
            opened = self._repo.open(
                record, namespace=metadata.namespace, key_digest=metadata.key_digest
            )
            document = opened.document
            claimed = document.get("run_id") if isinstance(document, dict) else None
            if not isinstance(claimed, str) or self._repo.key_digest(RUNS, claimed) != (
                metadata.key_digest
            ):
                raise IntegrityFailure("stored run names another run than its key")
            runs.append(self._verified(document, claimed))
        return RunPage(runs=tuple(runs), next_cursor=page.next_cursor)
