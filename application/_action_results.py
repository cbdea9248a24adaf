"""Action results: a workflow's sealed, expiring record of what an action returned.

Each write appends ``action_result.stored`` to the result's record stream
and binds the row to it, so an older row put back is refused, and a row
deleted outside flowvault is refused rather than written anew as if the
action had never run. An expired result leaves a tombstone in its
workflow's stream (digests and times, never the body) when it is replaced
or purged.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._compaction import compact_after_commit
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._instants import aware, micros
from flowvault.application._record_kind import PURGE_STALLS, list_all, open_listed
from flowvault.application._records import (
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    LabelValue,
    RecordMetadata,
    UnitOfWork,
)
from flowvault.application._sealed import SealedDocument
from flowvault.application._streams import keyed
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application._workflow_records import (
    WorkflowRecords,
    check_action_hash,
    mapping,
    natural_key,
    stream_of,
)
from flowvault.application.ports import Clock
from flowvault.domain import (
    ActionResult,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    RevisionConflict,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._envelope import format_instant

ACTION_RESULTS = "flowvault.action-results"

DEFAULT_RETENTION = timedelta(hours=24)
MIN_RETENTION = timedelta(seconds=1)
MAX_RETENTION = timedelta(days=30)
PURGE_BATCH = 100
RESULT_TAG = "flowvault.result/1"


class ActionResultService:
    """Keep each workflow action's result for a while, so a retried action finds it."""

    def __init__(self, records: WorkflowRecords, clock: Clock) -> None:
        self._records = records
        self._repo = records.repository
        self._store = records.store
        self._clock = clock
        self._fresh = StreamPolicy[SealedDocument](
            "action result", self._repo, leaves_record=leaves_unnamed
        )

    def put_action_result(
        self,
        workflow_id: str,
        action_hash: str,
        result: JsonValue,
        *,
        retention: timedelta = DEFAULT_RETENTION,
    ) -> ActionResult:
        """Seal ``result`` for ``retention``; the same content again returns the first.

        Each write appends ``action_result.stored`` to the result's record
        stream and binds the row to it, so an older row put back is refused,
        and a row deleted outside flowvault is refused rather than written
        anew as if the action had never run.

        Raises:
            InvalidInput: retention outside 1 s .. 30 days, or a non-JSON result.
            IdempotencyConflict: another result is stored under ``action_hash``.
            IntegrityFailure: the stored row is older than its record stream
                says, or is missing although the stream records it and no purge.
            NotFound: no such workflow.

        """
        check_action_hash(action_hash)
        if not isinstance(retention, timedelta) or not MIN_RETENTION <= retention <= MAX_RETENTION:
            raise InvalidInput("retention must be between 1 second and 30 days")
        self._records.load(workflow_id)
        raw = canonical_bytes(result)
        content = self._repo.keyed_digest(RESULT_TAG, raw)
        now = self._clock.now()
        made = ActionResult(
            workflow_id=workflow_id,
            action_hash=action_hash,
            content_hash=content,
            size_bytes=len(raw),
            created_at=now,
            expires_at=now + retention,
            result=result,
        )
        return settle(lambda: self._put(made, now), "action result", workflow_id=workflow_id)

    def _put(self, made: ActionResult, now: datetime) -> ActionResult | Literal[Lost.RACE]:
        """Commit ``made`` unless an unexpired result holds its place; ``LOST`` on a race."""
        natural = natural_key(made.workflow_id, made.action_hash)
        existing = self._read_result(natural)
        expected: int | Guard = Guard.ABSENT
        tombstones: list[LedgerEvent] = []
        if existing is not None:
            stored = _action_result(existing)
            if stored.expires_at > now:
                if stored.content_hash != made.content_hash:
                    raise IdempotencyConflict("action hash was already used for a different result")
                return stored
            expected = existing.revision
            position = self._records.next_position(made.workflow_id)
            tombstones.append(self._tombstone(stored, *position))
        digest = self._repo.key_digest(ACTION_RESULTS, natural)
        event = record_event(
            self._repo,
            record_stream(ACTION_RESULT_KIND, digest),
            "action_result.stored",
            record_payload(digest),
            now,
        )
        labels: dict[str, LabelValue] = {
            "workflow": self._records.digest(made.workflow_id),
            "expires_at": micros(made.expires_at),
        }
        upsert = self._repo.prepare(
            ACTION_RESULTS,
            natural,
            made.model_dump(mode="json"),
            expected=expected,
            labels=labels,
            ledger_index=event.index,
        )
        try:
            self._store.commit(UnitOfWork(upserts=[upsert], appends=[*tombstones, event]))
        except RevisionConflict:
            return LOST
        if tombstones:
            compact_after_commit(self._repo.capabilities.compactor)
        return made

    def get_action_result(self, workflow_id: str, action_hash: str) -> ActionResult | None:
        """Return the result with its body, or ``None`` if absent or expired.

        Raises:
            IntegrityFailure: the row is older than its record stream says, or
                is missing although the stream records it and no purge.

        """
        opened = self._read_result(natural_key(workflow_id, action_hash))
        if opened is None:
            return None
        stored = _action_result(opened)
        return stored if stored.expires_at > self._clock.now() else None

    def _read_result(self, natural: str) -> SealedDocument | None:
        """Read an action result's row; one its record stream vouches for must be there."""
        digest = self._repo.key_digest(ACTION_RESULTS, natural)
        return self._fresh.read_vouched(
            self._store,
            record_stream(ACTION_RESULT_KIND, digest),
            (ACTION_RESULTS, digest),
            lambda: self._repo.read(ACTION_RESULTS, natural),
        )

    def list_action_results(self, workflow_id: str) -> list[ActionResult]:
        """Return the unexpired results of a workflow, oldest first, without bodies.

        Each row is checked against its record stream; a row deleted while
        it is listed is skipped.

        Raises:
            IntegrityFailure: a row does not verify or is older than its stream says.

        """
        self._records.load(workflow_id)
        now = self._clock.now()
        filters = [
            LabelFilter("workflow", self._records.digest(workflow_id)),
            LabelFilter("expires_at", micros(now), FilterOp.GT),
        ]
        found = []
        for meta in list_all(self._store, ACTION_RESULTS, filters):
            opened = self._checked_result(meta)
            if opened is not None:
                found.append(_action_result(opened).model_copy(update={"result": None}))
        return sorted(found, key=lambda item: (item.created_at, item.action_hash))

    def _checked_result(self, metadata: RecordMetadata) -> SealedDocument | None:
        """Open a listed result and check it against its record stream; ``None`` if gone."""
        opened = open_listed(self._repo, metadata)
        if opened is None:
            return None
        return self._fresh.check_listed(
            self._store,
            record_stream(ACTION_RESULT_KIND, metadata.key_digest),
            opened,
            lambda: open_listed(self._repo, metadata),
        )

    def purge_expired(self, now: datetime | None = None, *, batch_size: int = PURGE_BATCH) -> int:
        """Delete expired action results in bounded batches, each leaving tombstone events.

        Every batch is one unit of work: the deletions; in each affected
        workflow's ledger, an ``action_result.purged`` event naming the action
        hash, content digest, size and expiry (never the body); and in each
        result's record stream a ``RETENTION_TOMBSTONE``, so the row is
        legitimately gone. Compacts the store afterwards so the purged bytes
        do not linger on disk.

        Raises:
            IntegrityFailure: an expired row is older than its record stream
                says; nothing of its batch is deleted.

        """
        cutoff = micros(self._clock.now() if now is None else aware(now, "now"))
        purged = stalled = 0
        while stalled < PURGE_STALLS:
            page = self._store.list(
                ACTION_RESULTS,
                filters=[LabelFilter("expires_at", cutoff, FilterOp.LE)],
                limit=batch_size,
            )
            if not page.items:
                break
            unit = self._purge_unit(page.items)
            if not unit.deletes:
                stalled += 1
                continue
            try:
                self._store.commit(unit)
            except RevisionConflict:
                stalled += 1
                continue
            purged += len(unit.deletes)
        if purged:
            compact_after_commit(self._repo.capabilities.compactor)
        return purged

    def _tombstone(self, stored: ActionResult, index: int, previous_hash: str) -> LedgerEvent:
        """Build the record that a result was removed: digests and times, never the body."""
        event = LedgerEvent.create(
            stream=stream_of(stored.workflow_id),
            index=index,
            type="action_result.purged",
            occurred_at=self._clock.now(),
            payload=stored.model_dump(mode="json", exclude={"result", "workflow_id"}),
            previous_hash=previous_hash,
        )
        return keyed(event, self._repo)

    def _purge_unit(self, expired: tuple[RecordMetadata, ...]) -> UnitOfWork:
        """Delete each expired row with its workflow-stream and record-stream tombstones."""
        deletes, appends = [], []
        heads: dict[str, tuple[int, str]] = {}
        for metadata in expired:
            opened = self._checked_result(metadata)
            if opened is None:
                continue
            stored = _action_result(opened)
            stream = stream_of(stored.workflow_id)
            if stream not in heads:
                heads[stream] = self._records.next_position(stored.workflow_id)
            event = self._tombstone(stored, *heads[stream])
            heads[stream] = (event.index + 1, event.event_hash)
            deletes.append(Delete(metadata.namespace, metadata.key_digest, opened.revision))
            appends += [event, self._retention_tombstone(metadata, stored, event.occurred_at)]
        return UnitOfWork(deletes=deletes, appends=appends)

    def _retention_tombstone(
        self, metadata: RecordMetadata, stored: ActionResult, moment: datetime
    ) -> LedgerEvent:
        """Build the record-stream event that says the row is legitimately gone."""
        tombstone: dict[str, JsonValue] = {
            "kind": "action_result",
            "record": metadata.key_digest,
            "expires_at": format_instant(stored.expires_at),
            "purged_at": format_instant(moment),
        }
        return record_event(
            self._repo,
            record_stream(ACTION_RESULT_KIND, metadata.key_digest),
            RETENTION_TOMBSTONE,
            tombstone,
            moment,
        )


def _action_result(opened: SealedDocument) -> ActionResult:
    try:
        return ActionResult.model_validate(mapping(opened.document, opened.metadata))
    except InvalidInput:
        raise IntegrityFailure("sealed action result has an unexpected shape") from None
