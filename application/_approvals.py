"""Human approvals bound to a checkpoint: request, decide exactly once, receipts.

An approval and its slot live on their checkpoint's record stream: a
request appends ``approval.requested`` and binds both rows to it; a
decision or expiry appends ``approval.<status>`` there, binding the approval
and the consumed checkpoint, besides the receipt event in the run's stream.
So no older row of the three put back can be decided or consumed again,
and a slot deleted outside flowvault cannot let a request be repeated.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import ValidationError

from flowvault.application._approval_support import (
    APPROVAL_SLOTS,
    APPROVAL_TAG,
    APPROVALS,
    CHECKPOINTS,
    DECIDER_TAG,
    MAX_ACTOR,
    PURGE_BATCH,
    RETRIES,
    _aware,
    _digest,
    _Doomed,
    _horizon,
    _joined,
    _micros,
    _open_listed,
    _purge,
    _signed,
    checkpoint_stream,
)
from flowvault.application._checkpoints import CheckpointService
from flowvault.application._freshness import (
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
)
from flowvault.application._graph import (
    KeyedDigester,
    require_integrity,
    run_stream,
)
from flowvault.application._paging import Page, PageScope, read_page
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
from flowvault.application._runs import RUNS, check_run_id
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import keyed, next_position
from flowvault.application.ports import Clock, IdFactory
from flowvault.domain import (
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
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    canonical_bytes,
    format_instant,
)


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
        self._fresh = StreamPolicy[SealedDocument](
            "approval", repository, leaves_record=leaves_unnamed
        )
        self._fresh_slot = StreamPolicy[SealedDocument](
            "approval slot", repository, leaves_record=leaves_unnamed
        )

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
            NotFound / InvalidTransition: the checkpoint's run was never
                started, or has ended (with a run service wired).
            ApprovalRequestConflict: another request is pending for the same
                checkpoint and audience.
            InvalidInput: malformed fields, or ``expires_at`` not in the future.

        """
        key = require_integrity(self._integrity)
        if isinstance(allowed_decisions, str) or not isinstance(allowed_decisions, Sequence):
            raise InvalidInput("allowed_decisions must be a sequence of decision names")
        checkpoint, _ = self._checkpoints._require(checkpoint_id)
        self._checkpoints._require_live_run(checkpoint.run_id)
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
            slot_key = _joined(checkpoint_id, made.audience)
            event = record_event(
                self._repo,
                checkpoint_stream(self._repo, checkpoint_id),
                "approval.requested",
                record_payload(
                    self._repo.key_digest(APPROVALS, made.approval_id),
                    self._repo.key_digest(APPROVAL_SLOTS, slot_key),
                ),
                made.requested_at,
            )
            slot = self._repo.prepare(
                APPROVAL_SLOTS,
                slot_key,
                {"approval_id": made.approval_id},
                expected=Guard.ABSENT,
                ledger_index=event.index,
            )
            upserts = [self._upsert(made, Guard.ABSENT, event.index), slot]
            try:
                self._store.commit(UnitOfWork(upserts=upserts, appends=[event]))
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
        """Return the approval the slot names; a slot its stream vouches for must be there."""
        natural = _joined(checkpoint_id, audience)
        marker = self._fresh_slot.read_vouched(
            self._store,
            checkpoint_stream(self._repo, checkpoint_id),
            (APPROVAL_SLOTS, self._repo.key_digest(APPROVAL_SLOTS, natural)),
            lambda: self._repo.read(APPROVAL_SLOTS, natural),
        )
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
        from. The same ``actor`` sending the same ``decision`` again (a retry
        after a lost reply) gets that first result back and writes nothing.
        Checks run in this order, and nothing changes unless stated:

        Raises:
            ApprovalAlreadyDecided: it expired, or was decided by another
                actor or with another decision; racing deciders all get this
                except the one that won (and its own retries).
            ApprovalDecisionNotAllowed: ``decision`` is not an allowed one.
            NotFound / InvalidTransition: the approval's run was never
                started, or has ended (with a run service wired).
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
                replayed = self._replayed(approval, decision, actor)
                if replayed is not None:
                    return replayed
                raise ApprovalAlreadyDecided(
                    f"approval is already {approval.status.value}", approval_id=approval_id
                )
            if decision not in approval.allowed_decisions:
                raise ApprovalDecisionNotAllowed(
                    "decision is not one of the approval's allowed decisions",
                    approval_id=approval_id,
                )
            position = next_position(self._store, run_stream(approval.run_id))
            self._checkpoints._require_live_run(approval.run_id)
            target = self._pending_checkpoint(approval)
            if moment >= approval.expires_at:
                if self._expire(key, approval, revision, target, moment, position=position):
                    raise ApprovalExpired(
                        "approval expired before it was decided", approval_id=approval_id
                    )
                continue
            if target is None:
                refused = self._consumed_elsewhere(key, approval)
                if refused is None:
                    continue
                raise refused
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
            bound = self._bound_event(decided, moment, consumes=True)
            unit = UnitOfWork(
                upserts=[
                    self._upsert(decided, revision, bound.index),
                    self._checkpoints._upsert(consumed, target[1], bound.index),
                ],
                appends=[bound, self._outcome_event(decided, moment, position)],
            )
            try:
                self._store.commit(unit)
            except RevisionConflict:
                continue
            return decided, consumed
        raise RevisionConflict("approval kept changing; retry", approval_id=approval_id)

    def _bound_event(self, approval: Approval, moment: datetime, *, consumes: bool) -> LedgerEvent:
        """Build the checkpoint-stream event a decision or expiry binds its rows to."""
        written = [self._repo.key_digest(APPROVALS, approval.approval_id)]
        if consumes:
            written.append(self._repo.key_digest(CHECKPOINTS, approval.checkpoint_id))
        return record_event(
            self._repo,
            checkpoint_stream(self._repo, approval.checkpoint_id),
            f"checkpoint.approval_{approval.status.value}",
            record_payload(*written),
            moment,
        )

    def _replayed(
        self, approval: Approval, decision: str, actor: str
    ) -> tuple[Approval, Checkpoint] | None:
        """Return a decision's first result when the same actor sends it again; else ``None``.

        The checkpoint that decision consumed must still be the one it
        wrote (consumed at the decision's instant), or nothing is replayed.
        """
        if approval.status is not ApprovalStatus.DECIDED:
            return None
        if (approval.actor, approval.decision) != (actor, decision):
            return None
        found = self._checkpoints._find(approval.checkpoint_id)
        if found is None:
            return None
        checkpoint = found[0]
        if checkpoint.run_id != approval.run_id or checkpoint.consumed_at != approval.decided_at:
            return None
        return approval, checkpoint

    def _outcome_event(
        self, approval: Approval, moment: datetime, position: tuple[int, str]
    ) -> LedgerEvent:
        """Build the run's ledger entry for a decision or expiry: the receipt's digests only.

        Committed with the decision, so the run's own stream shows who
        decided what (as keyed digests) even after retention removes the
        approval record. ``position`` is the run stream's head as read
        before the run was checked, so a run that ends in between makes
        this append conflict rather than land after the run's end.
        """
        stream = run_stream(approval.run_id)
        index, previous = position
        event = LedgerEvent.create(
            stream=stream,
            index=index,
            type=f"approval.{approval.status.value}",
            occurred_at=moment,
            payload=self.approval_receipt(approval).body(),
            previous_hash=previous,
        )
        return keyed(event, self._repo)

    def _pending_checkpoint(self, approval: Approval) -> tuple[Checkpoint, int] | None:
        """Return the approval's checkpoint while it is pending; ``None`` once used or purged."""
        found = self._checkpoints._find(approval.checkpoint_id)
        if found is None or found[0].status is not CheckpointStatus.PENDING:
            return None
        if not hmac.compare_digest(found[0].integrity_digest, approval.checkpoint_digest):
            raise CheckpointIntegrityFailure(
                "checkpoint differs from the one the approval was requested for",
                checkpoint_id=approval.checkpoint_id,
            )
        return found

    def _consumed_elsewhere(self, key: KeyedDigester, approval: Approval) -> Exception | None:
        """Say why a decision cannot consume; ``None`` when a racing decision settled the approval.

        The caller then reads the approval again, so a decider racing its
        own retry gets the first result rather than a refusal.
        """
        current, _ = self._require(key, approval.approval_id)
        if current.status is not ApprovalStatus.PENDING:
            return None
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
        *,
        position: tuple[int, str],
    ) -> bool:
        """Commit the expiry and the checkpoint's consumption; ``False`` when raced."""
        expired = _signed(
            Approval,
            key,
            APPROVAL_TAG,
            {**approval.model_dump(), "status": ApprovalStatus.EXPIRED, "decided_at": moment},
        )
        bound = self._bound_event(expired, moment, consumes=target is not None)
        upserts = [self._upsert(expired, revision, bound.index)]
        if target is not None:
            consumed = self._checkpoints._consumed(target[0], moment)
            upserts.append(self._checkpoints._upsert(consumed, target[1], bound.index))
        appends = [bound, self._outcome_event(expired, moment, position)]
        try:
            self._store.commit(UnitOfWork(upserts=upserts, appends=appends))
        except RevisionConflict:
            return False
        return True

    def list_approvals(
        self,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int = 50,
        *,
        cursor: str | None = None,
    ) -> Page[Approval]:
        """Return one page of approvals: of one run or of all runs, optionally of one status.

        Most recently written first (a request or a decision writes an
        approval; ties by key digest), at most ``limit`` (capped at 200);
        pass ``next_cursor`` back for the next page. Each approval is verified
        under the integrity key and against its checkpoint's stream; one that
        fails, or names another run than the one asked for, is reported in
        ``unreadable`` by key digest, and the rest are listed.

        Raises:
            InvalidInput: a malformed run id, status or limit, or a cursor
                that is malformed or was issued for another listing or filter.
            IntegrityKeyRequired: the service has no integrity key.

        """
        key = require_integrity(self._integrity)
        filters = []
        if run_id is not None:
            check_run_id(run_id)
            filters.append(LabelFilter("run", self._repo.key_digest(RUNS, run_id)))
        if status is not None:
            if not isinstance(status, str) or status not in set(ApprovalStatus):
                raise InvalidInput("status must be pending, decided or expired")
            filters.append(LabelFilter("status", ApprovalStatus(status).value))
        scope = PageScope(APPROVALS, tuple(label.value for label in filters))

        def listed(metadata: RecordMetadata) -> Approval | None:
            opened = _open_listed(self._repo, metadata)
            checked = None if opened is None else self._checked(key, opened)
            if checked is None:
                return None
            if run_id is not None and checked[0].run_id != run_id:
                raise IntegrityFailure("approval names another run than its label")
            return checked[0]

        return read_page(self._store, scope, APPROVALS, filters, listed, cursor=cursor, limit=limit)

    def approval_receipt(self, approval: Approval) -> ApprovalReceipt:
        """Build the auditor's receipt: keyed digests and times only, never the plaintext.

        Raises ``IntegrityFailure`` when ``approval`` does not verify under the
        integrity key, so no receipt is issued for an altered approval.
        """
        key = require_integrity(self._integrity)
        if not hmac.compare_digest(_digest(key, APPROVAL_TAG, approval), approval.integrity_digest):
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
            self._repo,
            self._clock,
            APPROVALS,
            filters=filters,
            batch_size=batch_size,
            doom=lambda meta: self._doomed(key, meta),
        )

    def _doomed(self, key: KeyedDigester, metadata: RecordMetadata) -> _Doomed | None:
        opened = _open_listed(self._repo, metadata)
        checked = None if opened is None else self._checked(key, opened)
        if checked is None:
            return None
        approval, revision = checked
        if approval.decided_at is None:
            return None
        slot = self._repo.key_digest(
            APPROVAL_SLOTS, _joined(approval.checkpoint_id, approval.audience)
        )
        tombstone: dict[str, JsonValue] = {
            "kind": "approval",
            "record": metadata.key_digest,
            "slot": slot,
            "requested_at": format_instant(approval.requested_at),
            "settled_at": format_instant(approval.decided_at),
        }
        deletes = (
            Delete(metadata.namespace, metadata.key_digest, revision),
            Delete(APPROVAL_SLOTS, slot, Guard.ANY),
        )
        streams = (
            run_stream(approval.run_id),
            checkpoint_stream(self._repo, approval.checkpoint_id),
        )
        return _Doomed(deletes, streams, tombstone)

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
        return self._checked(key, opened, approval_id)

    def _checked(
        self, key: KeyedDigester, opened: SealedDocument, approval_id: str | None = None
    ) -> tuple[Approval, int] | None:
        """Verify a row, then check it against its checkpoint's stream, re-reading if stale.

        The stream is named by the checkpoint the verified approval names,
        so only an authentic approval chooses where it is checked.
        """
        approval = self._verified(key, opened)
        wanted = approval.approval_id if approval_id is None else approval_id
        if approval.approval_id != wanted:
            raise IntegrityFailure("approval names another approval than its key")
        current = self._fresh.check_listed(
            self._store,
            checkpoint_stream(self._repo, approval.checkpoint_id),
            opened,
            lambda: self._repo.read(APPROVALS, wanted),
        )
        if current is None:
            return None
        if current is not opened:
            approval = self._verified(key, current)
            if approval.approval_id != wanted:
                raise IntegrityFailure("approval names another approval than its key")
        return approval, current.revision

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
        if not hmac.compare_digest(_digest(key, APPROVAL_TAG, approval), approval.integrity_digest):
            raise IntegrityFailure(
                "approval failed its keyed integrity check",
                key_digest=opened.metadata.key_digest,
            )
        return approval

    def _upsert(self, approval: Approval, expected: int | Guard, ledger_index: int) -> Upsert:
        """Seal an approval bound to the checkpoint-stream event committed with it."""
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
            ledger_index=ledger_index,
        )


# -- request-bound idempotency -------------------------------------------------
