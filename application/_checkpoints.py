"""Single-use resume checkpoints, sealed and verified under the integrity key.

Every write of a checkpoint appends an event to its record stream
(``checkpoint_stream``) and binds the row to it, so a consumed checkpoint
put back as its older pending row is refused, and a checkpoint row deleted
outside flowvault is told apart from one never created or purged.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Literal

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._checkpoint_records import CheckpointRecords, broken_checkpoint
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._record_kind import (
    PURGE_BATCH,
    Doomed,
    RecordPurge,
    int_label,
    list_all,
)
from flowvault.application._record_kinds import CHECKPOINT_TAG, CHECKPOINTS, checkpoint_stream
from flowvault.application._records import (
    Delete,
    Guard,
    LabelFilter,
    RecordMetadata,
    UnitOfWork,
)
from flowvault.application._run_service import RunService
from flowvault.application._runs import RUNS, check_run_id
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._signing import signed
from flowvault.application._streams import run_stream
from flowvault.application.ports import Clock
from flowvault.domain import (
    Checkpoint,
    IdempotencyConflict,
    JsonValue,
    RevisionConflict,
    content_hash,
)
from flowvault.domain._approvals import checkpoint_id_for
from flowvault.domain._envelope import format_instant


class CheckpointService:
    """Create, verify and consume the single-use resume points of runs.

    With ``runs`` (``bootstrap()`` always passes its run service), a
    checkpoint, an approval request or a decision needs a started run that
    has not ended, so nothing is recorded for a run id no run holds.
    """

    def __init__(
        self,
        repository: SealedRepository,
        clock: Clock,
        *,
        integrity: KeyedDigester,
        runs: RunService | None = None,
    ) -> None:
        self._records = CheckpointRecords(repository, integrity=integrity, runs=runs)
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._purge = RecordPurge(repository, clock, CHECKPOINTS, "consumed_at", self._doomed)

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository checkpoints live in."""
        return self._repo

    @property
    def records(self) -> CheckpointRecords:
        """How checkpoints are read and written; approvals consume them through it."""
        return self._records

    def create_checkpoint(
        self,
        run_id: str,
        next_cursor: JsonValue,
        *,
        state: JsonValue,
        budgets: Mapping[str, JsonValue],
        counters: Mapping[str, int],
        dependency_summary: JsonValue,
        terminal_cursor: JsonValue,
        event_cursor: int,
    ) -> Checkpoint:
        """Seal the run's resume point at ``next_cursor``; the same content again returns it.

        The id follows from run and cursor, so a retried create finds the
        first. Raises ``IdempotencyConflict`` when that id already holds other
        content, and, with a run service wired, ``NotFound`` for a run never
        started and ``InvalidTransition`` for one that has ended.
        """
        check_run_id(run_id)
        self._records.require_live_run(run_id)
        draft = signed(
            Checkpoint,
            self._records.key,
            CHECKPOINT_TAG,
            {
                "checkpoint_id": checkpoint_id_for(run_id, next_cursor),
                "run_id": run_id,
                "next_cursor": next_cursor,
                "terminal_cursor": terminal_cursor,
                "event_cursor": event_cursor,
                "state": state,
                "state_digest": content_hash(state),
                "budgets": dict(budgets),
                "counters": dict(counters),
                "dependency_summary": dependency_summary,
                "dependency_digest": content_hash(dependency_summary),
                "created_at": self._clock.now(),
            },
        )
        existing = self._records.find(draft.checkpoint_id) or self._create(draft)
        if existing is None:
            return draft
        if existing[0].content() != draft.content():
            raise IdempotencyConflict(
                "checkpoint already exists with different content",
                checkpoint_id=draft.checkpoint_id,
            )
        return existing[0]

    def _create(self, draft: Checkpoint) -> tuple[Checkpoint, int] | None:
        """Commit a new checkpoint; ``None`` once it is written, else the one a racer wrote."""
        event = self._records.event(draft, "checkpoint.created")
        upsert = self._records.upsert(draft, Guard.ABSENT, event.index)
        try:
            self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
        except RevisionConflict:
            existing = self._records.find(draft.checkpoint_id)
            if existing is None:
                raise
            return existing
        return None

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """Return the verified checkpoint; ``NotFound`` if there is none.

        Raises:
            CheckpointIntegrityFailure: its seal, state digest, dependency
                digest or keyed integrity digest does not verify.
            IntegrityFailure: the row is older than its record stream says
                (``details["ledger_index"]``), or it is missing although the
                stream records it and no purge.

        """
        return self._records.require(checkpoint_id)[0]

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        """Return the run's most recently created checkpoint, verified, or ``None``.

        Ties on the creation instant go to the later event cursor. Every
        checkpoint of the run is opened before one is chosen: the labels a
        listing returns are in the clear, and one lowered by an editor would
        otherwise pass the newest over for an older one unseen. Opening
        checks each row's labels against its sealed copy, so the choice is
        made on authentic values; the cost is one open per checkpoint the
        run holds (retention keeps that number down).
        """
        check_run_id(run_id)
        filters = [LabelFilter("run", self._repo.key_digest(RUNS, run_id))]
        candidates: list[SealedDocument] = []
        for metadata in list_all(self._store, CHECKPOINTS, filters):
            opened = self._records.open_checked(metadata)
            if opened is not None:
                candidates.append(opened)
        newest = max(
            candidates,
            key=lambda opened: (
                int_label(opened.metadata, "created_at"),
                int_label(opened.metadata, "event_cursor"),
                opened.metadata.key_digest,
            ),
            default=None,
        )
        if newest is None:
            return None
        checkpoint = self._records.verified(newest)
        if checkpoint.run_id != run_id:
            raise broken_checkpoint("it names another run", newest.metadata)
        return checkpoint

    def consume_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """Mark the checkpoint consumed and return it; this succeeds exactly once.

        A compare-and-swap on the record's revision decides between racing
        callers, across threads and processes alike.

        Raises:
            CheckpointConsumed: it was already consumed, or another caller won.
            NotFound: there is no such checkpoint.

        """

        def attempt() -> Checkpoint | Literal[Lost.RACE]:
            checkpoint, revision = self._records.require(checkpoint_id)
            consumed = self._records.consumed(checkpoint, self._clock.now())
            event = self._records.event(consumed, "checkpoint.consumed")
            upsert = self._records.upsert(consumed, revision, event.index)
            try:
                self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
            except RevisionConflict:
                return LOST
            return consumed

        return settle(attempt, "checkpoint", checkpoint_id=checkpoint_id)

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete checkpoints consumed before ``now - older_than``; return how many.

        Pending checkpoints are never purged. Each deletion leaves a
        ``retention.purged`` tombstone (kind, record digest, times) in its
        run's stream, in the same unit of work.
        """
        return self._purge(now, older_than, batch_size)

    def _doomed(self, metadata: RecordMetadata) -> Doomed | None:
        opened = self._records.open_checked(metadata)
        if opened is None:
            return None
        checkpoint = self._records.verified(opened)
        if checkpoint.consumed_at is None:
            return None
        tombstone: dict[str, JsonValue] = {
            "kind": "checkpoint",
            "record": metadata.key_digest,
            "created_at": format_instant(checkpoint.created_at),
            "consumed_at": format_instant(checkpoint.consumed_at),
        }
        delete = Delete(metadata.namespace, metadata.key_digest, opened.revision)
        streams = (
            run_stream(checkpoint.run_id),
            checkpoint_stream(self._repo, checkpoint.checkpoint_id),
        )
        return Doomed((delete,), streams, tombstone)
