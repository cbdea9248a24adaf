"""Single-use resume checkpoints, sealed and verified under the integrity key.

Every write of a checkpoint appends an event to its record stream
(``checkpoint_stream``) and binds the row to it, so a consumed checkpoint
put back as its older pending row is refused, and a checkpoint row deleted
outside flowvault is told apart from one never created or purged.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial

from flowvault.application._freshness import (
    CHECKPOINT_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._instants import micros
from flowvault.application._keyed_digester import KeyedDigester, require_integrity
from flowvault.application._record_kind import (
    PURGE_BATCH,
    RETRIES,
    Doomed,
    int_label,
    list_all,
    open_listed,
    purge,
    purge_horizon,
)
from flowvault.application._record_kinds import CHECKPOINT_TAG, CHECKPOINTS, checkpoint_stream
from flowvault.application._records import (
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    LabelValue,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application._run_service import RunService
from flowvault.application._runs import RUNS, check_run_id
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._signing import integrity_digest, signed
from flowvault.application._streams import run_stream
from flowvault.application.ports import Clock
from flowvault.domain import (
    Checkpoint,
    CheckpointConsumed,
    CheckpointIntegrityFailure,
    CheckpointStatus,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    checkpoint_id_for,
    content_hash,
)
from flowvault.domain._envelope import format_instant


def _broken_checkpoint(what: str, metadata: RecordMetadata) -> CheckpointIntegrityFailure:
    return CheckpointIntegrityFailure(
        f"checkpoint failed verification: {what}", key_digest=metadata.key_digest
    )


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
        integrity: KeyedDigester | None,
        runs: RunService | None = None,
    ) -> None:
        if runs is not None and runs.repository.store is not repository.store:
            raise InvalidInput("checkpoints and their runs must share one store")
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._integrity = integrity
        self._runs = runs
        self._fresh = StreamPolicy[SealedDocument](
            "checkpoint", repository, leaves_record=leaves_unnamed
        )

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository checkpoints live in."""
        return self._repo

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
        content, ``IntegrityKeyRequired`` without an integrity key, and, with
        a run service wired, ``NotFound`` for a run never started and
        ``InvalidTransition`` for one that has ended.
        """
        key = require_integrity(self._integrity)
        check_run_id(run_id)
        self._require_live_run(run_id)
        draft = signed(
            Checkpoint,
            key,
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
        existing = self._find(draft.checkpoint_id)
        if existing is None:
            event = self._event(draft, "checkpoint.created")
            upsert = self._upsert(draft, Guard.ABSENT, event.index)
            try:
                self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
            except RevisionConflict:
                existing = self._find(draft.checkpoint_id)
                if existing is None:
                    raise
            else:
                return draft
        if existing[0].content() != draft.content():
            raise IdempotencyConflict(
                "checkpoint already exists with different content",
                checkpoint_id=draft.checkpoint_id,
            )
        return existing[0]

    def load_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """Return the verified checkpoint; ``NotFound`` if there is none.

        Raises:
            CheckpointIntegrityFailure: its seal, state digest, dependency
                digest or keyed integrity digest does not verify.
            IntegrityFailure: the row is older than its record stream says
                (``details["ledger_index"]``), or it is missing although the
                stream records it and no purge.

        """
        return self._require(checkpoint_id)[0]

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
        key = require_integrity(self._integrity)
        check_run_id(run_id)
        filters = [LabelFilter("run", self._repo.key_digest(RUNS, run_id))]
        candidates: list[SealedDocument] = []
        for metadata in list_all(self._store, CHECKPOINTS, filters):
            opened = self._guarded(partial(open_listed, self._repo, metadata))
            if opened is not None:
                opened = self._checked(opened)
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
        checkpoint = self._verified(key, newest)
        if checkpoint.run_id != run_id:
            raise _broken_checkpoint("it names another run", newest.metadata)
        return checkpoint

    def consume_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """Mark the checkpoint consumed and return it; this succeeds exactly once.

        A compare-and-swap on the record's revision decides between racing
        callers, across threads and processes alike.

        Raises:
            CheckpointConsumed: it was already consumed, or another caller won.
            NotFound: there is no such checkpoint.

        """
        for _ in range(RETRIES):
            checkpoint, revision = self._require(checkpoint_id)
            consumed = self._consumed(checkpoint, self._clock.now())
            event = self._event(consumed, "checkpoint.consumed")
            upsert = self._upsert(consumed, revision, event.index)
            try:
                self._store.commit(UnitOfWork(upserts=[upsert], appends=[event]))
            except RevisionConflict:
                continue
            return consumed
        raise RevisionConflict("checkpoint kept changing; retry", checkpoint_id=checkpoint_id)

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete checkpoints consumed before ``now - older_than``; return how many.

        Pending checkpoints are never purged. Each deletion leaves a
        ``retention.purged`` tombstone (kind, record digest, times) in its
        run's stream, in the same unit of work.
        """
        key = require_integrity(self._integrity)
        filters = [LabelFilter("consumed_at", purge_horizon(now, older_than), FilterOp.LT)]
        return purge(
            self._repo,
            self._clock,
            CHECKPOINTS,
            filters=filters,
            batch_size=batch_size,
            doom=lambda meta: self._doomed(key, meta),
        )

    def _doomed(self, key: KeyedDigester, metadata: RecordMetadata) -> Doomed | None:
        opened = self._guarded(lambda: open_listed(self._repo, metadata))
        if opened is not None:
            opened = self._checked(opened)
        if opened is None:
            return None
        checkpoint = self._verified(key, opened)
        if checkpoint.consumed_at is None:
            return None
        tombstone: dict[str, JsonValue] = {
            "kind": "checkpoint",
            "record": metadata.key_digest,
            "created_at": format_instant(checkpoint.created_at),
            "consumed_at": format_instant(checkpoint.consumed_at),
        }
        delete = Delete(metadata.namespace, metadata.key_digest, opened.revision)
        streams = (run_stream(checkpoint.run_id), self._stream(checkpoint.checkpoint_id))
        return Doomed((delete,), streams, tombstone)

    # -- shared with the approval service ---------------------------------------

    def _require_live_run(self, run_id: str) -> None:
        """Refuse a run id no started run holds, or a run that has ended.

        Checked before anything is written, so a refused call leaves no
        ``run/<id>`` stream behind for a run that is not there.
        """
        if self._runs is None:
            return
        try:
            run = self._runs.get_run(run_id)
        except NotFound:
            raise NotFound(
                "no such run: start it with graph_runs.start_run before checkpointing it, "
                "asking for an approval or deciding one",
                run_id=run_id,
            ) from None
        if run.finished:
            raise InvalidTransition(
                f"run is already {run.status}: a finished run takes no checkpoint, "
                "approval request or decision; start a new run instead",
                run_id=run_id,
                current=run.status,
            )

    def _require(self, checkpoint_id: str) -> tuple[Checkpoint, int]:
        found = self._find(checkpoint_id)
        if found is None:
            raise NotFound("no such checkpoint", checkpoint_id=checkpoint_id)
        return found

    def _find(self, checkpoint_id: str) -> tuple[Checkpoint, int] | None:
        """Return the verified checkpoint and its revision, or ``None`` when absent."""
        key = require_integrity(self._integrity)
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidInput("a checkpoint id must be a non-empty string")
        opened = self._fresh.read_vouched(
            self._store,
            self._stream(checkpoint_id),
            (CHECKPOINTS, self._repo.key_digest(CHECKPOINTS, checkpoint_id)),
            lambda: self._guarded(lambda: self._repo.read(CHECKPOINTS, checkpoint_id)),
        )
        if opened is None:
            return None
        checkpoint = self._verified(key, opened)
        if checkpoint.checkpoint_id != checkpoint_id:
            raise _broken_checkpoint("it names another checkpoint", opened.metadata)
        return checkpoint, opened.revision

    def _stream(self, checkpoint_id: str) -> str:
        """Name the record stream of a checkpoint, its approvals and their slots."""
        return checkpoint_stream(self._repo, checkpoint_id)

    def _checked(self, opened: SealedDocument) -> SealedDocument | None:
        """Check a listed row against its record stream; ``None`` if it vanished meanwhile."""
        metadata = opened.metadata
        stream = record_stream(CHECKPOINT_KIND, metadata.key_digest)
        return self._fresh.check_listed(
            self._store,
            stream,
            opened,
            lambda: self._guarded(lambda: open_listed(self._repo, metadata)),
        )

    def _event(self, checkpoint: Checkpoint, event_type: str) -> LedgerEvent:
        """Build the record-stream event a checkpoint write commits with and is bound to."""
        digest = self._repo.key_digest(CHECKPOINTS, checkpoint.checkpoint_id)
        return record_event(
            self._repo,
            self._stream(checkpoint.checkpoint_id),
            event_type,
            record_payload(digest),
            checkpoint.consumed_at or checkpoint.created_at,
        )

    @staticmethod
    def _guarded(read: Callable[[], SealedDocument | None]) -> SealedDocument | None:
        """Run a sealed read, reporting a broken seal as a checkpoint integrity failure."""
        try:
            return read()
        except CheckpointIntegrityFailure:
            raise
        except IntegrityFailure as exc:
            raise CheckpointIntegrityFailure(
                "sealed checkpoint failed verification", **exc.details
            ) from None

    def _verified(self, key: KeyedDigester, opened: SealedDocument) -> Checkpoint:
        try:
            checkpoint = Checkpoint.model_validate(opened.document)
        except InvalidInput:
            raise _broken_checkpoint("unexpected shape", opened.metadata) from None
        checks = {
            "key": self._repo.key_digest(CHECKPOINTS, checkpoint.checkpoint_id)
            == opened.metadata.key_digest,
            "checkpoint_id": checkpoint_id_for(checkpoint.run_id, checkpoint.next_cursor)
            == checkpoint.checkpoint_id,
            "state_digest": content_hash(checkpoint.state) == checkpoint.state_digest,
            "dependency_digest": content_hash(checkpoint.dependency_summary)
            == checkpoint.dependency_digest,
            "integrity_digest": hmac.compare_digest(
                integrity_digest(key, CHECKPOINT_TAG, checkpoint), checkpoint.integrity_digest
            ),
        }
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            raise CheckpointIntegrityFailure(
                "checkpoint failed verification: " + ", ".join(failed),
                key_digest=opened.metadata.key_digest,
                fields=",".join(failed),
            )
        return checkpoint

    def _consumed(self, checkpoint: Checkpoint, moment: datetime) -> Checkpoint:
        """Return the consumed successor of a pending checkpoint, re-signed."""
        if checkpoint.status is not CheckpointStatus.PENDING:
            raise CheckpointConsumed(
                "checkpoint was already consumed", checkpoint_id=checkpoint.checkpoint_id
            )
        fields = {
            **checkpoint.model_dump(),
            "status": CheckpointStatus.CONSUMED,
            "consumed_at": moment,
        }
        return signed(Checkpoint, require_integrity(self._integrity), CHECKPOINT_TAG, fields)

    def _upsert(self, checkpoint: Checkpoint, expected: int | Guard, ledger_index: int) -> Upsert:
        """Seal a checkpoint bound to the record-stream event committed with it."""
        labels: dict[str, LabelValue] = {
            "run": self._repo.key_digest(RUNS, checkpoint.run_id),
            "created_at": micros(checkpoint.created_at),
            "event_cursor": checkpoint.event_cursor,
            "status": checkpoint.status.value,
        }
        if checkpoint.consumed_at is not None:
            labels["consumed_at"] = micros(checkpoint.consumed_at)
        return self._repo.prepare(
            CHECKPOINTS,
            checkpoint.checkpoint_id,
            checkpoint.model_dump(mode="json"),
            expected=expected,
            labels=labels,
            ledger_index=ledger_index,
        )


# -- approvals -----------------------------------------------------------------
