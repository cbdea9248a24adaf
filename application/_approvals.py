"""Checkpoints, approvals, request-bound idempotency and evidence witnesses.

Built only on the sealed repository and the store port. Every record is
addressed by a keyed digest of its natural key and carries a keyed integrity
digest that is checked on every read, so a record rebuilt without the
integrity key never verifies. Each change is one unit of work: an approval's
decision or expiry and its checkpoint's consumption commit together or not
at all, and retention deletions commit with their digest-only tombstones.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from flowvault.application._graph import (
    IDEMPOTENCY_STREAM,
    RETENTION_TOMBSTONE,
    KeyedDigester,
    require_integrity,
    run_stream,
)
from flowvault.application._records import (
    MAX_LIST_LIMIT,
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    LabelValue,
    RecordMetadata,
    UnitOfWork,
    Upsert,
)
from flowvault.application._runs import RUNS, check_run_id
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import next_position
from flowvault.application.ports import Clock, Compactor, IdFactory, SecureObjectStore
from flowvault.domain import (
    DIGEST_PATTERN,
    GENESIS_HASH,
    Approval,
    ApprovalAlreadyDecided,
    ApprovalDecisionNotAllowed,
    ApprovalExpired,
    ApprovalReceipt,
    ApprovalRequestConflict,
    ApprovalStatus,
    Checkpoint,
    CheckpointConsumed,
    CheckpointIntegrityFailure,
    CheckpointStatus,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    Witness,
    canonical_bytes,
    checkpoint_id_for,
    content_hash,
    digest_bytes,
    format_instant,
    sanitise_payload,
    validate_json,
)

CHECKPOINTS = "flowvault.checkpoints"
APPROVALS = "flowvault.approvals"
APPROVAL_SLOTS = "flowvault.approval-slots"
"""One marker per (checkpoint, audience) naming the approval requested for it."""
REQUEST_IDEMPOTENCY = "flowvault.request-idempotency"
WITNESSES = "flowvault.witnesses"

CHECKPOINT_TAG = "flowvault.checkpoint/1"
APPROVAL_TAG = "flowvault.approval/1"
WITNESS_TAG = "flowvault.witness/1"
REQUEST_TAG = "flowvault.idempotency-request/1"
DECIDER_TAG = "flowvault.decider/1"
"""The workflow service's tag too, so one person has one digest in every receipt."""

MAX_WITNESS_BYTES: Final = 512 * 1024
"""Largest evidence body; base64 inside the sealed record stays under its 1 MiB limit."""
MAX_IDEMPOTENCY_KEY: Final = 256
MAX_ACTOR: Final = 256
PURGE_BATCH: Final = 200
RETRIES: Final = 8
"""How often a write is rebuilt when a concurrent writer moved what it was guarded on."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_Signed = TypeVar("_Signed", Checkpoint, Approval, Witness)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def _joined(*parts: str) -> str:
    return "\x1f".join(parts)


def _aware(moment: object, what: str) -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidInput(f"{what} must be a timezone-aware datetime")
    return moment


def _validated(model: type[_Signed], fields: Mapping[str, object]) -> _Signed:
    """Build a model from caller input, as ``InvalidInput`` naming only the bad fields."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise _invalid(model.__name__.lower(), exc) from None


def _invalid(what: str, error: ValidationError) -> InvalidInput:
    """Name the failing fields and our own cross-field rules; pydantic's text may echo input."""
    issues = error.errors()
    names = sorted({str(issue["loc"][0]) for issue in issues if issue["loc"]})
    rules = sorted(
        str(issue["msg"]).removeprefix("Value error, ") for issue in issues if not issue["loc"]
    )
    return InvalidInput(f"invalid {what}: " + "; ".join([*names, *rules]), fields=",".join(names))


def _signed(
    model: type[_Signed], key: KeyedDigester, tag: str, fields: Mapping[str, Any]
) -> _Signed:
    """Validate ``fields`` and stamp the keyed digest of everything the model's body covers."""
    draft = _validated(model, {**fields, "integrity_digest": GENESIS_HASH})
    return draft.model_copy(update={"integrity_digest": _digest(key, tag, draft)})


def _digest(key: KeyedDigester, tag: str, value: Checkpoint | Approval | Witness) -> str:
    return key.keyed_digest(tag, canonical_bytes(value.integrity_body()))


def _horizon(now: datetime, older_than: timedelta) -> int:
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidInput("older_than must be a non-negative timedelta")
    return _micros(_aware(now, "now") - older_than)


def _batch(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput("batch_size must be a positive integer")
    return min(batch_size, MAX_LIST_LIMIT)


def _list_all(
    store: SecureObjectStore, namespace: str, filters: Sequence[LabelFilter]
) -> Iterator[RecordMetadata]:
    cursor: str | None = None
    while True:
        page = store.list(namespace, filters=filters, cursor=cursor, limit=MAX_LIST_LIMIT)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def _open_listed(repository: SealedRepository, metadata: RecordMetadata) -> SealedDocument | None:
    """Open a listed record, or ``None`` when it was deleted after it was listed."""
    record = repository.store.load(metadata.namespace, metadata.key_digest)
    if record is None:
        return None
    return repository.open(record, namespace=metadata.namespace, key_digest=metadata.key_digest)


def _int_label(metadata: RecordMetadata, name: str) -> int:
    value = metadata.labels.get(name)
    return value if isinstance(value, int) else -1


def _compact(store: SecureObjectStore) -> None:
    if isinstance(store, Compactor):
        store.compact()


# -- retention -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Doomed:
    """One record to purge: its deletions and the tombstone its stream receives."""

    deletes: tuple[Delete, ...]
    stream: str
    tombstone: dict[str, JsonValue]


def _purge(
    store: SecureObjectStore,
    clock: Clock,
    namespace: str,
    *,
    filters: Sequence[LabelFilter],
    batch_size: int,
    doom: Callable[[RecordMetadata], _Doomed | None],
) -> int:
    """Delete matching records a bounded batch per unit, each unit with its tombstones."""
    limit = _batch(batch_size)
    purged = stalled = 0
    while stalled < RETRIES:
        page = store.list(namespace, filters=filters, limit=limit)
        doomed = [item for item in map(doom, page.items) if item is not None]
        if not doomed:
            break
        try:
            store.commit(_purge_unit(store, clock.now(), doomed))
        except RevisionConflict:
            stalled += 1
            continue
        purged += len(doomed)
    if purged:
        _compact(store)
    return purged


def _purge_unit(store: SecureObjectStore, now: datetime, doomed: Sequence[_Doomed]) -> UnitOfWork:
    """Chain each stream's tombstones consecutively onto its head, deletions alongside."""
    heads: dict[str, tuple[int, str]] = {}
    deletes: list[Delete] = []
    appends: list[LedgerEvent] = []
    for item in doomed:
        if item.stream not in heads:
            heads[item.stream] = next_position(store, item.stream)
        index, previous = heads[item.stream]
        event = LedgerEvent.create(
            stream=item.stream,
            index=index,
            type=RETENTION_TOMBSTONE,
            occurred_at=now,
            payload=sanitise_payload({**item.tombstone, "purged_at": format_instant(now)}),
            previous_hash=previous,
        )
        heads[item.stream] = (event.index + 1, event.event_hash)
        deletes.extend(item.deletes)
        appends.append(event)
    return UnitOfWork(deletes=deletes, appends=appends)


# -- checkpoints ---------------------------------------------------------------


def _broken_checkpoint(what: str, metadata: RecordMetadata) -> CheckpointIntegrityFailure:
    return CheckpointIntegrityFailure(
        f"checkpoint failed verification: {what}", key_digest=metadata.key_digest
    )


class CheckpointService:
    """Create, verify and consume the single-use resume points of runs."""

    def __init__(
        self, repository: SealedRepository, clock: Clock, *, integrity: KeyedDigester | None
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._integrity = integrity

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
        content, and ``IntegrityKeyRequired`` without an integrity key.
        """
        key = require_integrity(self._integrity)
        check_run_id(run_id)
        draft = _signed(
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
            try:
                self._store.commit(UnitOfWork(upserts=[self._upsert(draft, Guard.ABSENT)]))
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

        """
        return self._require(checkpoint_id)[0]

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        """Return the run's most recently created checkpoint, verified, or ``None``.

        Ties on the creation instant go to the later event cursor.
        """
        key = require_integrity(self._integrity)
        check_run_id(run_id)
        filters = [LabelFilter("run", self._repo.key_digest(RUNS, run_id))]
        for _ in range(RETRIES):
            newest = max(
                _list_all(self._store, CHECKPOINTS, filters),
                key=lambda meta: (
                    _int_label(meta, "created_at"),
                    _int_label(meta, "event_cursor"),
                    meta.key_digest,
                ),
                default=None,
            )
            if newest is None:
                return None
            opened = self._guarded(partial(_open_listed, self._repo, newest))
            if opened is None:
                continue
            checkpoint = self._verified(key, opened)
            if checkpoint.run_id != run_id:
                raise _broken_checkpoint("it names another run", opened.metadata)
            return checkpoint
        raise RevisionConflict("checkpoints of the run kept changing; retry")

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
            try:
                self._store.commit(UnitOfWork(upserts=[self._upsert(consumed, revision)]))
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
        filters = [LabelFilter("consumed_at", _horizon(now, older_than), FilterOp.LT)]
        return _purge(
            self._store,
            self._clock,
            CHECKPOINTS,
            filters=filters,
            batch_size=batch_size,
            doom=lambda meta: self._doomed(key, meta),
        )

    def _doomed(self, key: KeyedDigester, metadata: RecordMetadata) -> _Doomed | None:
        opened = self._guarded(lambda: _open_listed(self._repo, metadata))
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
        delete = Delete(metadata.namespace, metadata.key_digest, metadata.revision)
        return _Doomed((delete,), run_stream(checkpoint.run_id), tombstone)

    # -- shared with the approval service ---------------------------------------

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
        opened = self._guarded(lambda: self._repo.read(CHECKPOINTS, checkpoint_id))
        if opened is None:
            return None
        checkpoint = self._verified(key, opened)
        if checkpoint.checkpoint_id != checkpoint_id:
            raise _broken_checkpoint("it names another checkpoint", opened.metadata)
        return checkpoint, opened.revision

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
        except ValidationError:
            raise _broken_checkpoint("unexpected shape", opened.metadata) from None
        checks = {
            "key": self._repo.key_digest(CHECKPOINTS, checkpoint.checkpoint_id)
            == opened.metadata.key_digest,
            "checkpoint_id": checkpoint_id_for(checkpoint.run_id, checkpoint.next_cursor)
            == checkpoint.checkpoint_id,
            "state_digest": content_hash(checkpoint.state) == checkpoint.state_digest,
            "dependency_digest": content_hash(checkpoint.dependency_summary)
            == checkpoint.dependency_digest,
            "integrity_digest": _digest(key, CHECKPOINT_TAG, checkpoint)
            == checkpoint.integrity_digest,
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
        return _signed(Checkpoint, require_integrity(self._integrity), CHECKPOINT_TAG, fields)

    def _upsert(self, checkpoint: Checkpoint, expected: int | Guard) -> Upsert:
        labels: dict[str, LabelValue] = {
            "run": self._repo.key_digest(RUNS, checkpoint.run_id),
            "created_at": _micros(checkpoint.created_at),
            "event_cursor": checkpoint.event_cursor,
            "status": checkpoint.status.value,
        }
        if checkpoint.consumed_at is not None:
            labels["consumed_at"] = _micros(checkpoint.consumed_at)
        return self._repo.prepare(
            CHECKPOINTS,
            checkpoint.checkpoint_id,
            checkpoint.model_dump(mode="json"),
            expected=expected,
            labels=labels,
        )


# -- approvals -----------------------------------------------------------------


def _stale(checkpoint: Checkpoint, fields: list[str]) -> RevisionConflict:
    return RevisionConflict(
        "checkpoint does not match the caller's view: " + ", ".join(fields),
        checkpoint_id=checkpoint.checkpoint_id,
        fields=",".join(fields),
    )


def _check_actor(actor: object) -> str:
    if not isinstance(actor, str) or not actor or len(actor) > MAX_ACTOR:
        raise InvalidInput(f"actor must be a string of 1..{MAX_ACTOR} characters")
    return actor


class ApprovalService:
    """Ask for human decisions on checkpoints and record them with the checkpoint's use.

    A decision and the consumption of its checkpoint are one unit of work,
    so a checkpoint resumes at most once however many approvals name it.
    """

    def __init__(
        self,
        repository: SealedRepository,
        clock: Clock,
        ids: IdFactory,
        *,
        checkpoints: CheckpointService,
        integrity: KeyedDigester | None,
    ) -> None:
        if checkpoints.repository.store is not repository.store:
            raise InvalidInput("approvals and their checkpoints must share one store")
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._ids = ids
        self._checkpoints = checkpoints
        self._integrity = integrity

    def request_approval(
        self,
        checkpoint_id: str,
        *,
        expected_state_digest: str,
        expected_budgets: Mapping[str, JsonValue],
        expected_counters: Mapping[str, int],
        expected_dependency_digest: str,
        audience: str,
        prompt_digest: str,
        allowed_decisions: Sequence[str],
        expires_at: datetime,
    ) -> Approval:
        """Ask ``audience`` to decide on a pending checkpoint, bound to its integrity digest.

        An identical pending request for the same checkpoint and audience is
        returned as it is.

        Raises:
            RevisionConflict: the verified checkpoint no longer matches the
                caller's expected state, budgets, counters or dependencies
                (a stale view, not tampering); ``details["fields"]`` names them.
            CheckpointIntegrityFailure: the checkpoint does not verify.
            CheckpointConsumed: the checkpoint was already consumed.
            ApprovalRequestConflict: another request is pending for the same
                checkpoint and audience.
            InvalidInput: malformed fields, or ``expires_at`` not in the future.

        """
        key = require_integrity(self._integrity)
        checkpoint, _ = self._checkpoints._require(checkpoint_id)
        if checkpoint.status is not CheckpointStatus.PENDING:
            raise CheckpointConsumed("checkpoint was already consumed", checkpoint_id=checkpoint_id)
        self._check_expectations(
            checkpoint,
            expected_state_digest,
            expected_budgets,
            expected_counters,
            expected_dependency_digest,
        )
        fields: dict[str, object] = {
            "checkpoint_id": checkpoint_id,
            "run_id": checkpoint.run_id,
            "checkpoint_digest": checkpoint.integrity_digest,
            "audience": audience,
            "prompt_digest": prompt_digest,
            "allowed_decisions": tuple(allowed_decisions),
            "requested_at": self._clock.now(),
            "expires_at": _aware(expires_at, "expires_at"),
        }
        draft = _signed(Approval, key, APPROVAL_TAG, {**fields, "approval_id": "draft"})
        for _ in range(RETRIES):
            existing = self._slot(key, checkpoint_id, draft.audience)
            if existing is not None:
                if existing.status is ApprovalStatus.PENDING and (
                    existing.request() == draft.request()
                ):
                    return existing
                raise ApprovalRequestConflict(
                    "another approval is already requested for this checkpoint and audience",
                    checkpoint_id=checkpoint_id,
                )
            made = _signed(
                Approval, key, APPROVAL_TAG, {**fields, "approval_id": self._ids.new_id()}
            )
            slot = self._repo.prepare(
                APPROVAL_SLOTS,
                _joined(checkpoint_id, made.audience),
                {"approval_id": made.approval_id},
                expected=Guard.ABSENT,
            )
            try:
                self._store.commit(UnitOfWork(upserts=[self._upsert(made, Guard.ABSENT), slot]))
            except RevisionConflict:
                continue
            return made
        raise RevisionConflict(
            "approval requests kept changing; retry", checkpoint_id=checkpoint_id
        )

    @staticmethod
    def _check_expectations(
        checkpoint: Checkpoint,
        state_digest: str,
        budgets: Mapping[str, JsonValue],
        counters: Mapping[str, int],
        dependency_digest: str,
    ) -> None:
        checks = {
            "state_digest": checkpoint.state_digest == state_digest,
            "budgets": canonical_bytes(checkpoint.budgets) == canonical_bytes(dict(budgets)),
            "counters": canonical_bytes(checkpoint.counters) == canonical_bytes(dict(counters)),
            "dependency_digest": checkpoint.dependency_digest == dependency_digest,
        }
        stale = [name for name, ok in checks.items() if not ok]
        if stale:
            raise _stale(checkpoint, stale)

    def _slot(self, key: KeyedDigester, checkpoint_id: str, audience: str) -> Approval | None:
        marker = self._repo.read(APPROVAL_SLOTS, _joined(checkpoint_id, audience))
        if marker is None:
            return None
        document = marker.document
        approval_id = document.get("approval_id") if isinstance(document, dict) else None
        if not isinstance(approval_id, str):
            raise IntegrityFailure("approval slot has an unexpected shape")
        found = self._find(key, approval_id)
        if found is None:
            raise IntegrityFailure("approval slot names a missing approval")
        return found[0]

    def get_approval(self, approval_id: str) -> Approval:
        """Return the verified approval; ``NotFound`` if there is none."""
        return self._require(require_integrity(self._integrity), approval_id)[0]

    def decide(
        self, approval_id: str, decision: str, actor: str, now: datetime | None = None
    ) -> tuple[Approval, Checkpoint]:
        """Record ``actor``'s decision and consume the checkpoint, in one unit of work.

        Returns the decided approval and the consumed checkpoint to resume
        from. Checks run in this order, and nothing changes unless stated:

        Raises:
            ApprovalAlreadyDecided: it was decided or expired already; racing
                deciders all get this except the one that won.
            ApprovalDecisionNotAllowed: ``decision`` is not an allowed one.
            ApprovalExpired: ``now`` is at or past ``expires_at``. The approval
                is first marked expired and its checkpoint consumed, together,
                and that is committed before this is raised.
            CheckpointConsumed: the checkpoint was consumed by something else
                (a resume, or an approval for another audience).

        """
        key = require_integrity(self._integrity)
        _check_actor(actor)
        moment = self._clock.now() if now is None else _aware(now, "now")
        for _ in range(RETRIES):
            approval, revision = self._require(key, approval_id)
            if approval.status is not ApprovalStatus.PENDING:
                raise ApprovalAlreadyDecided(
                    f"approval is already {approval.status.value}", approval_id=approval_id
                )
            if decision not in approval.allowed_decisions:
                raise ApprovalDecisionNotAllowed(
                    "decision is not one of the approval's allowed decisions",
                    approval_id=approval_id,
                )
            target = self._pending_checkpoint(approval)
            if moment >= approval.expires_at:
                if self._expire(key, approval, revision, target, moment):
                    raise ApprovalExpired(
                        "approval expired before it was decided", approval_id=approval_id
                    )
                continue
            if target is None:
                raise self._consumed_elsewhere(key, approval)
            decided = _signed(
                Approval,
                key,
                APPROVAL_TAG,
                {
                    **approval.model_dump(),
                    "status": ApprovalStatus.DECIDED,
                    "decision": decision,
                    "actor": actor,
                    "decided_at": moment,
                },
            )
            consumed = self._checkpoints._consumed(target[0], moment)
            unit = UnitOfWork(
                upserts=[
                    self._upsert(decided, revision),
                    self._checkpoints._upsert(consumed, target[1]),
                ],
                appends=[self._outcome_event(decided, moment)],
            )
            try:
                self._store.commit(unit)
            except RevisionConflict:
                continue
            return decided, consumed
        raise RevisionConflict("approval kept changing; retry", approval_id=approval_id)

    def _outcome_event(self, approval: Approval, moment: datetime) -> LedgerEvent:
        """Build the run's ledger entry for a decision or expiry: the receipt's digests only.

        Committed with the decision, so the run's own stream shows who
        decided what (as keyed digests) even after retention removes the
        approval record.
        """
        stream = run_stream(approval.run_id)
        index, previous = next_position(self._store, stream)
        return LedgerEvent.create(
            stream=stream,
            index=index,
            type=f"approval.{approval.status.value}",
            occurred_at=moment,
            payload=self.approval_receipt(approval).body(),
            previous_hash=previous,
        )

    def _pending_checkpoint(self, approval: Approval) -> tuple[Checkpoint, int] | None:
        """Return the approval's checkpoint while it is pending; ``None`` once used or purged."""
        found = self._checkpoints._find(approval.checkpoint_id)
        if found is None or found[0].status is not CheckpointStatus.PENDING:
            return None
        if found[0].integrity_digest != approval.checkpoint_digest:
            raise CheckpointIntegrityFailure(
                "checkpoint differs from the one the approval was requested for",
                checkpoint_id=approval.checkpoint_id,
            )
        return found

    def _consumed_elsewhere(self, key: KeyedDigester, approval: Approval) -> Exception:
        """Say why a decision cannot consume: a racing decider won, or something else did."""
        current, _ = self._require(key, approval.approval_id)
        if current.status is not ApprovalStatus.PENDING:
            return ApprovalAlreadyDecided(
                f"approval is already {current.status.value}", approval_id=approval.approval_id
            )
        return CheckpointConsumed(
            "the approval's checkpoint was already consumed",
            checkpoint_id=approval.checkpoint_id,
        )

    def _expire(
        self,
        key: KeyedDigester,
        approval: Approval,
        revision: int,
        target: tuple[Checkpoint, int] | None,
        moment: datetime,
    ) -> bool:
        """Commit the expiry and the checkpoint's consumption; ``False`` when raced."""
        expired = _signed(
            Approval,
            key,
            APPROVAL_TAG,
            {**approval.model_dump(), "status": ApprovalStatus.EXPIRED, "decided_at": moment},
        )
        upserts = [self._upsert(expired, revision)]
        if target is not None:
            consumed = self._checkpoints._consumed(target[0], moment)
            upserts.append(self._checkpoints._upsert(consumed, target[1]))
        appends = [self._outcome_event(expired, moment)]
        try:
            self._store.commit(UnitOfWork(upserts=upserts, appends=appends))
        except RevisionConflict:
            return False
        return True

    def list_approvals(
        self, run_id: str, status: ApprovalStatus | None = None, limit: int = 50
    ) -> list[Approval]:
        """Return the run's approvals, newest request first, at most ``limit`` (capped at 200)."""
        key = require_integrity(self._integrity)
        check_run_id(run_id)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be a positive integer")
        filters = [LabelFilter("run", self._repo.key_digest(RUNS, run_id))]
        if status is not None:
            if status not in set(ApprovalStatus):
                raise InvalidInput("status must be pending, decided or expired")
            filters.append(LabelFilter("status", ApprovalStatus(status).value))
        listed = sorted(
            _list_all(self._store, APPROVALS, filters),
            key=lambda meta: (_int_label(meta, "requested_at"), meta.key_digest),
            reverse=True,
        )
        approvals = []
        for metadata in listed[: min(limit, MAX_LIST_LIMIT)]:
            opened = _open_listed(self._repo, metadata)
            if opened is None:
                continue
            approval = self._verified(key, opened)
            if approval.run_id != run_id:
                raise IntegrityFailure("approval names another run than its label")
            approvals.append(approval)
        return approvals

    def approval_receipt(self, approval: Approval) -> ApprovalReceipt:
        """Build the auditor's receipt: keyed digests and times only, never the plaintext.

        Raises ``IntegrityFailure`` when ``approval`` does not verify under the
        integrity key, so no receipt is issued for an altered approval.
        """
        key = require_integrity(self._integrity)
        if _digest(key, APPROVAL_TAG, approval) != approval.integrity_digest:
            raise IntegrityFailure("approval does not verify under the integrity key")

        def keyed(tag: str, value: str | None) -> str | None:
            return None if value is None else key.keyed_digest(tag, value)

        return ApprovalReceipt(
            issued_at=self._clock.now(),
            approval=approval.integrity_digest,
            checkpoint=approval.checkpoint_digest,
            run=self._repo.key_digest(RUNS, approval.run_id),
            audience=key.keyed_digest("flowvault.approval-audience/1", approval.audience),
            prompt=key.keyed_digest("flowvault.approval-prompt/1", approval.prompt_digest),
            allowed_decisions=key.keyed_digest(
                "flowvault.approval-decisions/1",
                canonical_bytes(list(approval.allowed_decisions)),
            ),
            status=approval.status,
            decision=keyed("flowvault.approval-decision/1", approval.decision),
            actor=keyed(DECIDER_TAG, approval.actor),
            decided_at=approval.decided_at,
        )

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete approvals decided or expired before ``now - older_than``; return how many.

        Pending approvals are never purged. Each deletion also drops the
        request's slot and leaves a ``retention.purged`` tombstone in the
        run's stream, in the same unit of work.
        """
        key = require_integrity(self._integrity)
        filters = [LabelFilter("settled_at", _horizon(now, older_than), FilterOp.LT)]
        return _purge(
            self._store,
            self._clock,
            APPROVALS,
            filters=filters,
            batch_size=batch_size,
            doom=lambda meta: self._doomed(key, meta),
        )

    def _doomed(self, key: KeyedDigester, metadata: RecordMetadata) -> _Doomed | None:
        opened = _open_listed(self._repo, metadata)
        if opened is None:
            return None
        approval = self._verified(key, opened)
        if approval.decided_at is None:
            return None
        slot = self._repo.key_digest(
            APPROVAL_SLOTS, _joined(approval.checkpoint_id, approval.audience)
        )
        tombstone: dict[str, JsonValue] = {
            "kind": "approval",
            "record": metadata.key_digest,
            "requested_at": format_instant(approval.requested_at),
            "settled_at": format_instant(approval.decided_at),
        }
        deletes = (
            Delete(metadata.namespace, metadata.key_digest, metadata.revision),
            Delete(APPROVAL_SLOTS, slot, Guard.ANY),
        )
        return _Doomed(deletes, run_stream(approval.run_id), tombstone)

    def _require(self, key: KeyedDigester, approval_id: str) -> tuple[Approval, int]:
        found = self._find(key, approval_id)
        if found is None:
            raise NotFound("no such approval", approval_id=approval_id)
        return found

    def _find(self, key: KeyedDigester, approval_id: str) -> tuple[Approval, int] | None:
        if not isinstance(approval_id, str) or not approval_id:
            raise InvalidInput("an approval id must be a non-empty string")
        opened = self._repo.read(APPROVALS, approval_id)
        if opened is None:
            return None
        approval = self._verified(key, opened)
        if approval.approval_id != approval_id:
            raise IntegrityFailure("approval names another approval than its key")
        return approval, opened.revision

    def _verified(self, key: KeyedDigester, opened: SealedDocument) -> Approval:
        try:
            approval = Approval.model_validate(opened.document)
        except ValidationError:
            raise IntegrityFailure(
                "approval has an unexpected shape", key_digest=opened.metadata.key_digest
            ) from None
        if self._repo.key_digest(APPROVALS, approval.approval_id) != opened.metadata.key_digest:
            raise IntegrityFailure(
                "approval is stored under another key", key_digest=opened.metadata.key_digest
            )
        if _digest(key, APPROVAL_TAG, approval) != approval.integrity_digest:
            raise IntegrityFailure(
                "approval failed its keyed integrity check",
                key_digest=opened.metadata.key_digest,
            )
        return approval

    def _upsert(self, approval: Approval, expected: int | Guard) -> Upsert:
        labels: dict[str, LabelValue] = {
            "run": self._repo.key_digest(RUNS, approval.run_id),
            "requested_at": _micros(approval.requested_at),
            "status": approval.status.value,
        }
        if approval.decided_at is not None:
            labels["settled_at"] = _micros(approval.decided_at)
        return self._repo.prepare(
            APPROVALS,
            approval.approval_id,
            approval.model_dump(mode="json"),
            expected=expected,
            labels=labels,
        )


# -- request-bound idempotency -------------------------------------------------


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidInput(f"an idempotency key must be 1..{MAX_IDEMPOTENCY_KEY} characters")
    return key


class IdempotencyService:
    """Remember responses bound to the request that produced them, and replay only for it.

    The request is kept only as a keyed digest of its canonical JSON, so a
    replay proves the same request without the store holding it.
    """

    def __init__(self, repository: SealedRepository, clock: Clock) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock

    def remember(self, key: str, request: JsonValue, response: JsonValue) -> JsonValue:
        """Store ``response`` for ``key`` bound to ``request``; return the response kept.

        The first response wins: remembering again for the same request
        returns the stored response. ``response`` must not be ``null``, so
        ``recall`` can tell a remembered response from none.

        Raises:
            IdempotencyConflict: ``key`` is bound to another request, or to none.

        """
        if response is None:
            raise InvalidInput("a remembered response must not be null")
        _check_key(key)
        digest = self._request_digest(request)
        validate_json(response)
        existing = self._repo.read(REQUEST_IDEMPOTENCY, key)
        if existing is not None:
            return self._replayed(existing, digest)
        now = self._clock.now()
        document = {
            "request_digest": digest,
            "response": response,
            "created_at": format_instant(now),
        }
        try:
            self._repo.write(
                REQUEST_IDEMPOTENCY,
                key,
                document,
                expected=Guard.ABSENT,
                labels={"created_at": _micros(now)},
            )
        except RevisionConflict:
            raced = self._repo.read(REQUEST_IDEMPOTENCY, key)
            if raced is None:
                raise
            return self._replayed(raced, digest)
        return response

    def recall(self, key: str, request: JsonValue) -> JsonValue | None:
        """Return the response remembered for ``key`` and this request, or ``None``.

        Raises:
            IdempotencyConflict: ``key`` was remembered for a different
                request, or its record carries no request digest. Such a record
                is never replayed: without a digest nothing proves it answers
                this request, and returning ``None`` would invite a repeat.

        """
        _check_key(key)
        digest = self._request_digest(request)
        existing = self._repo.read(REQUEST_IDEMPOTENCY, key)
        return None if existing is None else self._replayed(existing, digest)

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete records written before ``now - older_than``; return how many.

        Idempotency records belong to no run, so their tombstones go to
        ``IDEMPOTENCY_STREAM``, in the same unit of work as the deletions.
        """
        filters = [LabelFilter("created_at", _horizon(now, older_than), FilterOp.LT)]
        return _purge(
            self._store,
            self._clock,
            REQUEST_IDEMPOTENCY,
            filters=filters,
            batch_size=batch_size,
            doom=_doomed_request,
        )

    def _request_digest(self, request: JsonValue) -> str:
        return self._repo.keyed_digest(REQUEST_TAG, canonical_bytes(request))

    @staticmethod
    def _replayed(opened: SealedDocument, digest: str) -> JsonValue:
        document = opened.document
        if not isinstance(document, dict):
            raise IntegrityFailure(
                "idempotency record has an unexpected shape", key_digest=opened.metadata.key_digest
            )
        stored = document.get("request_digest")
        if not isinstance(stored, str) or not DIGEST_PATTERN.match(stored):
            raise IdempotencyConflict("remembered response is bound to no request; not replayed")
        if stored != digest:
            raise IdempotencyConflict("idempotency key was already used for a different request")
        return document.get("response")


def _doomed_request(metadata: RecordMetadata) -> _Doomed:
    created = _EPOCH + _int_label(metadata, "created_at") * _MICROSECOND
    tombstone: dict[str, JsonValue] = {
        "kind": "idempotency",
        "record": metadata.key_digest,
        "created_at": format_instant(created),
    }
    delete = Delete(metadata.namespace, metadata.key_digest, metadata.revision)
    return _Doomed((delete,), IDEMPOTENCY_STREAM, tombstone)


# -- evidence witnesses --------------------------------------------------------


class EvidenceService:
    """Keep retrieved evidence once per content digest, verified on every read."""

    def __init__(
        self, repository: SealedRepository, clock: Clock, *, integrity: KeyedDigester | None
    ) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._integrity = integrity

    def capture_witness(
        self,
        locator: str,
        content: bytes,
        media_type: str,
        authority_class: str,
        retrieved_at: datetime,
    ) -> Witness:
        """Store ``content`` as evidence retrieved from ``locator``, once per content digest.

        Capturing the same bytes again returns the first witness unchanged,
        whatever locator or time the repeat names.

        Raises:
            PayloadTooLarge: ``content`` exceeds ``MAX_WITNESS_BYTES``.
            InvalidInput: a locator over 2048 characters or with control
                characters, a media type that is not ``type/subtype``, an
                authority class that is not a short lowercase name, or a naive time.

        """
        key = require_integrity(self._integrity)
        if not isinstance(content, bytes):
            raise InvalidInput("content must be bytes")
        if len(content) > MAX_WITNESS_BYTES:
            raise PayloadTooLarge(
                f"evidence of {len(content)} bytes exceeds {MAX_WITNESS_BYTES}",
                size=len(content),
                limit=MAX_WITNESS_BYTES,
            )
        witness = _signed(
            Witness,
            key,
            WITNESS_TAG,
            {
                "content_digest": digest_bytes(content),
                "locator": locator,
                "media_type": media_type,
                "authority_class": authority_class,
                "size_bytes": len(content),
                "retrieved_at": _aware(retrieved_at, "retrieved_at"),
                "captured_at": self._clock.now(),
                "content": content,
            },
        )
        existing = self._find(key, witness.content_digest)
        if existing is not None:
            return existing
        document = {
            **witness.model_dump(mode="json", exclude={"content"}),
            "content": base64.b64encode(content).decode("ascii"),
        }
        try:
            self._repo.write(
                WITNESSES,
                witness.content_digest,
                document,
                expected=Guard.ABSENT,
                labels={"captured_at": _micros(witness.captured_at)},
            )
        except RevisionConflict:
            raced = self._find(key, witness.content_digest)
            if raced is None:
                raise
            return raced
        return witness

    def load_witness(self, content_digest: str) -> Witness:
        """Return the verified witness for ``content_digest``; ``NotFound`` if none.

        Raises ``IntegrityFailure`` when the record, its bytes or its keyed
        integrity digest do not verify.
        """
        key = require_integrity(self._integrity)
        if not isinstance(content_digest, str) or not DIGEST_PATTERN.match(content_digest):
            raise InvalidInput("content_digest must be a sha256:<64 hex> digest")
        found = self._find(key, content_digest)
        if found is None:
            raise NotFound("no such witness")
        return found

    def _find(self, key: KeyedDigester, content_digest: str) -> Witness | None:
        opened = self._repo.read(WITNESSES, content_digest)
        if opened is None:
            return None
        witness = self._decoded(opened)
        if witness.content_digest != content_digest:
            raise IntegrityFailure("witness is stored under another digest")
        if _digest(key, WITNESS_TAG, witness) != witness.integrity_digest:
            raise IntegrityFailure("witness failed its keyed integrity check")
        return witness

    @staticmethod
    def _decoded(opened: SealedDocument) -> Witness:
        document = opened.document
        try:
            if not isinstance(document, dict) or not isinstance(document.get("content"), str):
                raise ValueError("no content")
            raw = base64.b64decode(str(document["content"]), validate=True)
            return Witness.model_validate({**document, "content": raw})
        except (ValueError, binascii.Error, ValidationError):
            raise IntegrityFailure(
                "witness has an unexpected shape", key_digest=opened.metadata.key_digest
            ) from None
