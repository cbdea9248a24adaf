"""A checkpoint's sealed row and its record stream, read and written as one.

Every write of a checkpoint appends an event to its record stream
(``checkpoint_stream``) and binds the row to it, so a consumed checkpoint
put back as its older pending row is refused, and a checkpoint row deleted
outside flowvault is told apart from one never created or purged. The
checkpoint service and the approval service, whose decisions consume
checkpoints, both read and write checkpoints through this one class.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from datetime import datetime

from flowvault.application._freshness import (
    CHECKPOINT_KIND,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._instants import micros
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._record_kind import open_listed
from flowvault.application._record_kinds import CHECKPOINT_TAG, CHECKPOINTS, checkpoint_stream
from flowvault.application._records import Guard, LabelValue, RecordMetadata, Upsert
from flowvault.application._run_service import RunService
from flowvault.application._runs import RUNS
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._signing import integrity_digest, signed
from flowvault.domain import (
    Checkpoint,
    CheckpointConsumed,
    CheckpointIntegrityFailure,
    CheckpointStatus,
    IntegrityFailure,
    IntegrityKeyRequired,
    InvalidInput,
    InvalidTransition,
    LedgerEvent,
    NotFound,
    content_hash,
)
from flowvault.domain._approvals import checkpoint_id_for


def keyed_digester(integrity: object, what: str) -> KeyedDigester:
    """Return ``integrity`` if it computes keyed digests; a service is refused without one."""
    if not isinstance(integrity, KeyedDigester):
        raise IntegrityKeyRequired(
            f"{what} need an integrity key; "
            "build the service with the sealed repository (or another keyed digester)"
        )
    return integrity


def broken_checkpoint(what: str, metadata: RecordMetadata) -> CheckpointIntegrityFailure:
    """Return the failure of a checkpoint row that does not verify, naming its key digest."""
    return CheckpointIntegrityFailure(
        f"checkpoint failed verification: {what}", key_digest=metadata.key_digest
    )


class CheckpointRecords:
    """Find, verify, consume and seal checkpoints, each write bound to its stream's event.

    With ``runs``, a checkpoint, an approval request or a decision needs a
    started run that has not ended.
    """

    def __init__(
        self,
        repository: SealedRepository,
        *,
        integrity: KeyedDigester,
        runs: RunService | None = None,
    ) -> None:
        if runs is not None and runs.repository.store is not repository.store:
            raise InvalidInput("checkpoints and their runs must share one store")
        self._repo = repository
        self._store = repository.store
        self._key = keyed_digester(integrity, "checkpoints and approvals")
        self._runs = runs
        self._fresh = StreamPolicy[SealedDocument](
            "checkpoint", repository, leaves_record=leaves_unnamed
        )

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository checkpoints live in."""
        return self._repo

    @property
    def key(self) -> KeyedDigester:
        """The keyed digester checkpoints are signed and verified under."""
        return self._key

    @property
    def runs(self) -> RunService | None:
        """The run service that says which runs are live, if one is wired."""
        return self._runs

    def require_live_run(self, run_id: str) -> None:
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
                "no such run: start it with runs.start_run before checkpointing it, "
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

    def require(self, checkpoint_id: str) -> tuple[Checkpoint, int]:
        """Return the verified checkpoint and its revision; ``NotFound`` when absent."""
        found = self.find(checkpoint_id)
        if found is None:
            raise NotFound("no such checkpoint", checkpoint_id=checkpoint_id)
        return found

    def find(self, checkpoint_id: str) -> tuple[Checkpoint, int] | None:
        """Return the verified checkpoint and its revision, or ``None`` when absent."""
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidInput("a checkpoint id must be a non-empty string")
        opened = self._fresh.read_vouched(
            self._store,
            checkpoint_stream(self._repo, checkpoint_id),
            (CHECKPOINTS, self._repo.key_digest(CHECKPOINTS, checkpoint_id)),
            lambda: _guarded(lambda: self._repo.read(CHECKPOINTS, checkpoint_id)),
        )
        if opened is None:
            return None
        checkpoint = self.verified(opened)
        if checkpoint.checkpoint_id != checkpoint_id:
            raise broken_checkpoint("it names another checkpoint", opened.metadata)
        return checkpoint, opened.revision

    def open_checked(self, metadata: RecordMetadata) -> SealedDocument | None:
        """Open a listed row and check it against its record stream; ``None`` if it vanished."""
        opened = _guarded(lambda: open_listed(self._repo, metadata))
        if opened is None:
            return None
        stream = record_stream(CHECKPOINT_KIND, metadata.key_digest)
        return self._fresh.check_listed(
            self._store,
            stream,
            opened,
            lambda: _guarded(lambda: open_listed(self._repo, metadata)),
        )

    def verified(self, opened: SealedDocument) -> Checkpoint:
        """Parse an opened row and check its address, id, digests and keyed integrity digest."""
        try:
            checkpoint = Checkpoint.model_validate(opened.document)
        except InvalidInput:
            raise broken_checkpoint("unexpected shape", opened.metadata) from None
        checks = {
            "key": self._repo.key_digest(CHECKPOINTS, checkpoint.checkpoint_id)
            == opened.metadata.key_digest,
            "checkpoint_id": checkpoint_id_for(checkpoint.run_id, checkpoint.next_cursor)
            == checkpoint.checkpoint_id,
            "state_digest": content_hash(checkpoint.state) == checkpoint.state_digest,
            "dependency_digest": content_hash(checkpoint.dependency_summary)
            == checkpoint.dependency_digest,
            "integrity_digest": hmac.compare_digest(
                integrity_digest(self._key, CHECKPOINT_TAG, checkpoint),
                checkpoint.integrity_digest,
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

    def consumed(self, checkpoint: Checkpoint, moment: datetime) -> Checkpoint:
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
        return signed(Checkpoint, self._key, CHECKPOINT_TAG, fields)

    def event(self, checkpoint: Checkpoint, event_type: str) -> LedgerEvent:
        """Build the record-stream event a checkpoint write commits with and is bound to."""
        digest = self._repo.key_digest(CHECKPOINTS, checkpoint.checkpoint_id)
        return record_event(
            self._repo,
            checkpoint_stream(self._repo, checkpoint.checkpoint_id),
            event_type,
            record_payload(digest),
            checkpoint.consumed_at or checkpoint.created_at,
        )

    def upsert(self, checkpoint: Checkpoint, expected: int | Guard, ledger_index: int) -> Upsert:
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
