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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._checkpoint_records import keyed_digester
from flowvault.application._checkpoints import CheckpointService
from flowvault.application._decider_keys import DeciderKeys
from flowvault.application._freshness import (
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
)
from flowvault.application._instants import aware, micros
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._natural_keys import joined
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._record_kind import (
    PURGE_BATCH,
    Doomed,
    list_all,
    open_listed,
    purge,
    purge_horizon,
)
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVAL_TAG,
    APPROVALS,
    CHECKPOINTS,
    DECIDER_TAG,
    MAX_ACTOR,
    checkpoint_stream,
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
from flowvault.application._run_service import RunService
from flowvault.application._runs import RUNS, check_run_id
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._signing import integrity_digest, signed
from flowvault.application._streams import keyed, next_position, run_stream
from flowvault.application.ports import Clock, DecisionSignatures, IdFactory
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
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    decision_statement,
)
from flowvault.domain._approvals import RejectionRule, Vote
from flowvault.domain._canonical import canonical_bytes, canonical_json
from flowvault.domain._envelope import format_instant


def _stale(checkpoint: Checkpoint, fields: list[str]) -> RevisionConflict:
    return RevisionConflict(
        "checkpoint does not match the caller's view: " + ", ".join(fields),
        checkpoint_id=checkpoint.checkpoint_id,
        fields=",".join(fields),
    )


def _outcome(approval: Approval) -> str:
    """Name what a decision's unit did: ``voted`` while a quorum still waits, else the status."""
    return "voted" if approval.status is ApprovalStatus.PENDING else approval.status.value


def _check_actor(actor: object) -> str:
    """Refuse what cannot name a decider; deciders are keyed as UTF-8, so text must encode."""
    if (
        not isinstance(actor, str)
        or not actor
        or len(actor) > MAX_ACTOR
        or not actor.isprintable()
        or not _encodes(actor)
    ):
        raise InvalidInput(
            f"actor must be printable text of 1..{MAX_ACTOR} characters (a decider's name)"
        )
    return actor


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_approval(approval: object) -> Approval:
    if not isinstance(approval, Approval):
        raise InvalidInput("expected an Approval as the service returned it")
    return approval


AWAITING_APPROVAL = "awaiting_approval"


@dataclass(frozen=True, slots=True)
class _Vote:
    """One decider's decision as ``decide`` received and checked it."""

    decision: str
    actor: str
    voter: str
    """The decider's keyed digest."""
    signature: str | None


@dataclass(frozen=True, slots=True)
class ExpiryReport:
    """What one expiry pass did."""

    expired_approvals: int
    failed_runs: int


@dataclass(frozen=True, slots=True)
class SignedDecision:
    """A decider's signed decision: the statement (canonical JSON text), the signature, the decider.

    ``decider`` is the keyed digest the approval's receipt uses; the
    signature is checked with the decider's public key alone.
    """

    statement: str
    signature: str
    decider: str

    def to_json(self) -> str:
        """Return the statement file an auditor checks with ``approvals verify-decision``."""
        return canonical_json(
            {"statement": self.statement, "signature": self.signature, "decider": self.decider}
        )


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
        integrity: KeyedDigester,
        signatures: DecisionSignatures | None = None,
    ) -> None:
        if checkpoints.repository.store is not repository.store:
            raise InvalidInput("approvals and their checkpoints must share one store")
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._ids = ids
        self._checkpoints = checkpoints
        self._key = keyed_digester(integrity, "approvals")
        self._checkpoint_records = checkpoints.records
        self._keys = DeciderKeys(repository, signatures)
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
        required: int = 1,
        deciders: Sequence[str] | None = None,
        rejection: RejectionRule | str = RejectionRule.ANY,
    ) -> Approval:
        """Ask ``audience`` to decide on a pending checkpoint, bound to its integrity digest.

        An identical pending request for the same checkpoint and audience is
        returned as it is. ``required`` above one, or named ``deciders``,
        makes a quorum approval: ``required`` distinct deciders (of
        ``deciders`` when named, kept only as keyed digests) must approve,
        ``allowed_decisions`` must be exactly ``approve`` and ``reject``, and
        ``rejection`` says when rejections settle it (``any``: one does;
        ``quorum``: ``required`` do).

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
        key = self._key
        if isinstance(allowed_decisions, str) or not isinstance(allowed_decisions, Sequence):
            raise InvalidInput("allowed_decisions must be a sequence of decision names")
        checkpoint, _ = self._checkpoint_records.require(checkpoint_id)
        self._checkpoint_records.require_live_run(checkpoint.run_id)
        if checkpoint.status is not CheckpointStatus.PENDING:
            raise CheckpointConsumed("checkpoint was already consumed", checkpoint_id=checkpoint_id)
        self._check_expectations(
            checkpoint,
            expected_state_digest,
            expected_budgets,
            expected_counters,
            expected_dependency_digest,
        )
        if deciders is not None and (
            isinstance(deciders, str)
            or not isinstance(deciders, Sequence)
            or not all(isinstance(name, str) and name for name in deciders)
        ):
            raise InvalidInput("deciders must be a sequence of non-empty decider names")
        if rejection not in set(RejectionRule):
            raise InvalidInput("rejection must be 'any' or 'quorum'")
        fields: dict[str, object] = {
            "checkpoint_id": checkpoint_id,
            "run_id": checkpoint.run_id,
            "checkpoint_digest": checkpoint.integrity_digest,
            "audience": audience,
            "prompt_digest": prompt_digest,
            "allowed_decisions": tuple(allowed_decisions),
            "requested_at": self._clock.now(),
            "expires_at": aware(expires_at, "expires_at"),
            "required": required,
            "deciders": tuple(
                key.keyed_digest(DECIDER_TAG, _check_actor(name)) for name in deciders or ()
            ),
            "rejection": RejectionRule(rejection),
        }
        draft = signed(Approval, key, APPROVAL_TAG, {**fields, "approval_id": "draft"})
        return settle(
            lambda: self._request_once(key, draft, fields),
            "approval requests",
            checkpoint_id=checkpoint_id,
        )

    def _request_once(
        self, key: KeyedDigester, draft: Approval, fields: Mapping[str, object]
    ) -> Approval | Literal[Lost.RACE]:
        """Commit a new request unless its slot holds one; ``LOST`` when a racer moved first."""
        checkpoint_id = draft.checkpoint_id
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
        made = signed(Approval, key, APPROVAL_TAG, {**fields, "approval_id": self._ids.new_id()})
        slot_key = joined(checkpoint_id, made.audience)
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
            return LOST
        return made

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
        natural = joined(checkpoint_id, audience)
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

    def status_of(self, approval: Approval) -> ApprovalStatus:
        """Return ``approval``'s status now: pending past its deadline reads as expired."""
        return _check_approval(approval).status_at(self._clock.now())

    def get_approval(self, approval_id: str) -> Approval:
        """Return the verified approval; ``NotFound`` if there is none."""
        return self._require(self._key, approval_id)[0]

    def decide(
        self,
        approval_id: str,
        decision: str,
        actor: str,
        now: datetime | None = None,
        *,
        signature: bytes | None = None,
    ) -> tuple[Approval, Checkpoint]:
        """Record ``actor``'s decision; consume the checkpoint once the approval is settled.

        Returns the approval and its checkpoint: consumed (the point to
        resume from) once the approval is decided, still pending while a
        quorum approval waits for more votes. The same ``actor`` sending
        the same ``decision`` again (a retry after a lost reply) gets the
        current result back and writes nothing. A decider with a registered
        key must pass ``signature``, their Ed25519 signature of
        ``decision_statement(approval, decision)``. Checks run in this
        order, and nothing changes unless stated:

        Raises:
            ApprovalAlreadyDecided: it expired, or was decided by another
                actor or with another decision, or this decider already voted
                otherwise; racing deciders all get this except the ones whose
                decisions counted (and their own retries).
            ApprovalDecisionNotAllowed: ``decision`` is not an allowed one, or
                ``actor`` is not one of a quorum approval's named deciders.
            DecisionSignatureInvalid: the decider has a registered key and the
                signature is missing or not theirs over this decision.
            NotFound / InvalidTransition: the approval's run was never
                started, or has ended (with a run service wired).
            ApprovalExpired: ``now`` is at or past ``expires_at``. The approval
                is first marked expired and its checkpoint consumed, together,
                and the run moved to ``failed`` (see ``expire_overdue``), before
                this is raised.
            CheckpointConsumed: the checkpoint was consumed by something else
                (a resume, or an approval for another audience).

        """
        key = self._key
        _check_actor(actor)
        voter = key.keyed_digest(DECIDER_TAG, actor)
        moment = self._clock.now() if now is None else aware(now, "now")
        checked = False  # a decider's signature is checked on the first attempt only
        signed_as: str | None = None

        def attempt() -> tuple[Approval, Checkpoint] | Literal[Lost.RACE]:
            nonlocal checked, signed_as
            approval, revision = self._require(key, approval_id)
            replayed = self._replayed(approval, decision, actor, voter, moment)
            if replayed is not None:
                return replayed
            if approval.status is not ApprovalStatus.PENDING:
                raise ApprovalAlreadyDecided(
                    f"approval is already {approval.status.value}", approval_id=approval_id
                )
            self._check_decider(approval, decision, voter)
            if not checked:
                statement = decision_statement(approval, decision)
                signed_as = self._keys.checked_signature(actor, statement, signature)
                checked = True
            vote = _Vote(decision=decision, actor=actor, voter=voter, signature=signed_as)
            return self._decide_once(approval, revision, vote, moment)

        return settle(attempt, "approval", approval_id=approval_id)

    def _decide_once(
        self, approval: Approval, revision: int, vote: _Vote, moment: datetime
    ) -> tuple[Approval, Checkpoint] | Literal[Lost.RACE]:
        """Commit one decision on a pending approval; ``LOST`` when a racer moved first."""
        key = self._key
        position = next_position(self._store, run_stream(approval.run_id))
        self._checkpoint_records.require_live_run(approval.run_id)
        target = self._pending_checkpoint(approval)
        if moment >= approval.expires_at:
            if self._expire(key, approval, revision, target, moment, position=position):
                self._fail_if_stranded(approval.run_id)
                raise ApprovalExpired(
                    "approval expired before it was decided", approval_id=approval.approval_id
                )
            return LOST
        if target is None:
            refused = self._consumed_elsewhere(key, approval)
            if refused is None:
                return LOST
            raise refused
        outcome = self._with_decision(
            key,
            approval,
            decision=vote.decision,
            actor=vote.actor,
            voter=vote.voter,
            signature=vote.signature,
            moment=moment,
        )
        settled = outcome.status is ApprovalStatus.DECIDED
        bound = self._bound_event(outcome, moment, consumes=settled)
        upserts = [self._upsert(outcome, revision, bound.index)]
        checkpoint = target[0]
        if settled:
            checkpoint = self._checkpoint_records.consumed(target[0], moment)
            upserts.append(self._checkpoint_records.upsert(checkpoint, target[1], bound.index))
        unit = UnitOfWork(
            upserts=upserts, appends=[bound, self._outcome_event(outcome, moment, position)]
        )
        try:
            self._store.commit(unit)
        except RevisionConflict:
            return LOST
        return outcome, checkpoint

    @staticmethod
    def _check_decider(approval: Approval, decision: str, voter: str) -> None:
        if decision not in approval.allowed_decisions:
            raise ApprovalDecisionNotAllowed(
                "decision is not one of the approval's allowed decisions",
                approval_id=approval.approval_id,
            )
        if approval.deciders and voter not in approval.deciders:
            raise ApprovalDecisionNotAllowed(
                "actor is not one of the approval's deciders", approval_id=approval.approval_id
            )
        if any(vote.decider == voter and vote.decision != decision for vote in approval.votes):
            raise ApprovalAlreadyDecided(
                "this decider already voted otherwise", approval_id=approval.approval_id
            )

    @staticmethod
    def _with_decision(
        key: KeyedDigester,
        approval: Approval,
        *,
        decision: str,
        actor: str,
        voter: str,
        signature: str | None,
        moment: datetime,
    ) -> Approval:
        """Return the approval with this decision counted, decided once it settles it."""
        fields = approval.model_dump()
        if approval.quorum or signature is not None:
            vote = Vote(decider=voter, decision=decision, decided_at=moment, signature=signature)
            fields["votes"] = (*approval.votes, vote)
        settled = (
            approval.model_copy(update={"votes": fields["votes"]}).tally()
            if approval.quorum
            else decision
        )
        if settled is not None:
            fields |= {
                "status": ApprovalStatus.DECIDED,
                "decision": settled,
                "actor": actor,
                "decided_at": moment,
            }
        return signed(Approval, key, APPROVAL_TAG, fields)

    def _bound_event(self, approval: Approval, moment: datetime, *, consumes: bool) -> LedgerEvent:
        """Build the checkpoint-stream event a decision or expiry binds its rows to."""
        written = [self._repo.key_digest(APPROVALS, approval.approval_id)]
        if consumes:
            written.append(self._repo.key_digest(CHECKPOINTS, approval.checkpoint_id))
        return record_event(
            self._repo,
            checkpoint_stream(self._repo, approval.checkpoint_id),
            f"checkpoint.approval_{_outcome(approval)}",
            record_payload(*written),
            moment,
        )

    def _replayed(
        self, approval: Approval, decision: str, actor: str, voter: str, moment: datetime
    ) -> tuple[Approval, Checkpoint] | None:
        """Return the current result when a decider sends the same decision again; else ``None``.

        A decided approval replays only for its deciding actor and decision,
        or a quorum vote cast the same way, and only while the checkpoint is
        the one the decision consumed; a pending quorum approval replays for
        a decider who voted the same way, before the deadline, while its
        checkpoint is pending.
        """
        if approval.quorum:
            cast = any(v.decider == voter and v.decision == decision for v in approval.votes)
        else:
            cast = approval.status is ApprovalStatus.DECIDED and (
                (approval.actor, approval.decision) == (actor, decision)
            )
        found = self._checkpoint_records.find(approval.checkpoint_id) if cast else None
        if found is None or found[0].run_id != approval.run_id:
            return None
        checkpoint = found[0]
        if approval.status is ApprovalStatus.PENDING:
            current = moment < approval.expires_at and checkpoint.status is CheckpointStatus.PENDING
        else:
            current = approval.status is ApprovalStatus.DECIDED and (
                checkpoint.consumed_at == approval.decided_at
            )
        return (approval, checkpoint) if current else None

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
            type=f"approval.{_outcome(approval)}",
            occurred_at=moment,
            payload=self.approval_receipt(approval).body(),
            previous_hash=previous,
        )
        return keyed(event, self._repo)

    def _pending_checkpoint(self, approval: Approval) -> tuple[Checkpoint, int] | None:
        """Return the approval's checkpoint while it is pending; ``None`` once used or purged."""
        found = self._checkpoint_records.find(approval.checkpoint_id)
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
        expired = signed(
            Approval,
            key,
            APPROVAL_TAG,
            {**approval.model_dump(), "status": ApprovalStatus.EXPIRED, "decided_at": moment},
        )
        bound = self._bound_event(expired, moment, consumes=target is not None)
        upserts = [self._upsert(expired, revision, bound.index)]
        if target is not None:
            consumed = self._checkpoint_records.consumed(target[0], moment)
            upserts.append(self._checkpoint_records.upsert(consumed, target[1], bound.index))
        appends = [bound, self._outcome_event(expired, moment, position)]
        try:
            self._store.commit(UnitOfWork(upserts=upserts, appends=appends))
        except RevisionConflict:
            return False
        return True

    def expire_overdue(self, now: datetime | None = None) -> ExpiryReport:
        """Record every overdue pending approval's expiry; fail the runs left waiting.

        Each expiry is the same unit of work a late ``decide`` commits (the
        approval expired, its checkpoint consumed, events in both streams).
        Then every run still ``awaiting_approval`` whose newest approval has
        expired and which has no pending one moves to ``failed`` (its event's
        detail says ``approval_expired``), so no run waits forever. An
        approval whose run has already ended is left as it is (it lists as
        expired). Safe to repeat: a pass after a crash finishes what the last
        one began.
        """
        key = self._key
        moment = self._clock.now() if now is None else aware(now, "now")
        expired = 0
        pending = [LabelFilter("status", ApprovalStatus.PENDING.value)]
        for approval in list(self._listed(key, pending)):
            if approval.status_at(moment) is ApprovalStatus.EXPIRED:
                expired += self._expire_overdue(key, approval.approval_id, moment)
        failed = 0
        runs = self._checkpoint_records.runs
        if runs is not None:
            cursor: str | None = None
            waiting: list[str] = []
            while True:
                page = runs.list_runs(AWAITING_APPROVAL, cursor=cursor, limit=MAX_LIST_LIMIT)
                waiting += [run.run_id for run in page.items]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            failed = sum(self._fail_if_stranded(run_id) for run_id in waiting)
        return ExpiryReport(expired_approvals=expired, failed_runs=failed)

    def _expire_overdue(self, key: KeyedDigester, approval_id: str, moment: datetime) -> bool:
        """Commit one overdue approval's expiry; ``False`` if it settled or its run ended."""

        def attempt() -> bool | Literal[Lost.RACE]:
            found = self._find(key, approval_id)
            if found is None:
                return False
            approval, revision = found
            if approval.status_at(moment) is not ApprovalStatus.EXPIRED or (
                approval.status is not ApprovalStatus.PENDING
            ):
                return False
            position = next_position(self._store, run_stream(approval.run_id))
            try:
                self._checkpoint_records.require_live_run(approval.run_id)
            except (NotFound, InvalidTransition):
                return False
            target = self._pending_checkpoint(approval)
            if self._expire(key, approval, revision, target, moment, position=position):
                return True
            return LOST

        return settle(attempt, "approval", approval_id=approval_id)

    def _fail_if_stranded(self, run_id: str) -> bool:
        """Fail a run awaiting approval whose newest approval expired and none is pending."""
        runs = self._checkpoint_records.runs
        if runs is None or not self._stranded(runs, run_id):
            return False
        try:
            runs.set_status(
                run_id,
                "failed",
                expected_status=AWAITING_APPROVAL,
                payload={"reason": "approval_expired"},
            )
        except RevisionConflict:
            return False
        return True

    def _stranded(self, runs: RunService, run_id: str) -> bool:
        try:
            if runs.get_run(run_id).status != AWAITING_APPROVAL:
                return False
        except NotFound:
            return False
        approvals = self._approvals_of(self._key, run_id)
        if not approvals or any(a.status is ApprovalStatus.PENDING for a in approvals):
            return False
        newest = max(approvals, key=lambda approval: approval.requested_at)
        return newest.status is ApprovalStatus.EXPIRED

    def _approvals_of(self, key: KeyedDigester, run_id: str) -> list[Approval]:
        filters = [LabelFilter("run", self._repo.key_digest(RUNS, run_id))]
        return [a for a in self._listed(key, filters) if a.run_id == run_id]

    def _listed(self, key: KeyedDigester, filters: Sequence[LabelFilter]) -> Iterator[Approval]:
        """Yield every verified approval matching ``filters``, skipping rows deleted meanwhile."""
        for metadata in list_all(self._store, APPROVALS, filters):
            opened = open_listed(self._repo, metadata)
            checked = None if opened is None else self._checked(key, opened)
            if checked is not None:
                yield checked[0]

    def register_decider_key(self, decider: str, public_key_pem: bytes) -> None:
        """Register ``decider``'s Ed25519 public key (PEM); their decisions must be signed from now.

        Registering the same key again changes nothing; another key
        replaces it for later decisions.

        Raises:
            InvalidInput: not a PEM Ed25519 public key, or no signature
                checker is wired (``bootstrap()`` wires one).

        """
        self._keys.register(_check_actor(decider), public_key_pem, self._clock.now())

    def decision_statement(self, approval_id: str, decision: str) -> bytes:
        """Return the bytes a decider signs to make ``decision`` on the approval."""
        approval = self.get_approval(approval_id)
        if decision not in approval.allowed_decisions:
            raise ApprovalDecisionNotAllowed(
                "decision is not one of the approval's allowed decisions", approval_id=approval_id
            )
        return decision_statement(approval, decision)

    def signed_decisions(self, approval: Approval) -> list[SignedDecision]:
        """Return the approval's signed decisions, each checkable with a public key alone."""
        _check_approval(approval)
        return [
            SignedDecision(
                statement=decision_statement(approval, vote.decision).decode("utf-8"),
                signature=vote.signature,
                decider=vote.decider,
            )
            for vote in approval.votes
            if vote.signature is not None
        ]

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
        pass ``next_cursor`` back for the next page. ``status`` filters on the
        status as of now (``Approval.status_at``): a pending approval past its
        deadline lists as expired, not pending, before any pass has recorded
        its expiry, so a page may hold fewer than ``limit`` approvals while
        more follow. Each approval is verified under the integrity key and
        against its checkpoint's stream; one that fails, or names another run
        than the one asked for, is reported in ``unreadable`` by key digest,
        and the rest are listed.

        Raises:
            InvalidInput: a malformed run id, status or limit, or a cursor
                that is malformed or was issued for another listing or filter.

        """
        key = self._key
        filters = []
        if run_id is not None:
            check_run_id(run_id)
            filters.append(LabelFilter("run", self._repo.key_digest(RUNS, run_id)))
        wanted: ApprovalStatus | None = None
        if status is not None:
            if not isinstance(status, str) or status not in set(ApprovalStatus):
                raise InvalidInput("status must be pending, decided or expired")
            wanted = ApprovalStatus(status)
            if wanted is not ApprovalStatus.EXPIRED:
                filters.append(LabelFilter("status", wanted.value))
        asked = None if wanted is None else wanted.value
        scope = PageScope(APPROVALS, (*(label.value for label in filters), asked))
        now = self._clock.now()

        def listed(metadata: RecordMetadata) -> Approval | None:
            opened = open_listed(self._repo, metadata)
            checked = None if opened is None else self._checked(key, opened)
            if checked is None:
                return None
            if run_id is not None and checked[0].run_id != run_id:
                raise IntegrityFailure("approval names another run than its label")
            if wanted is not None and checked[0].status_at(now) is not wanted:
                return None
            return checked[0]

        return read_page(self._store, scope, APPROVALS, filters, listed, cursor=cursor, limit=limit)

    def approval_receipt(self, approval: Approval) -> ApprovalReceipt:
        """Build the auditor's receipt: keyed digests and times only, never the plaintext.

        Raises ``IntegrityFailure`` when ``approval`` does not verify under the
        integrity key, so no receipt is issued for an altered approval.
        """
        key = self._key
        if not hmac.compare_digest(
            integrity_digest(key, APPROVAL_TAG, approval), approval.integrity_digest
        ):
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
            required=approval.required if approval.quorum else None,
            votes=key.keyed_digest(
                "flowvault.approval-votes/1",
                canonical_bytes([vote.model_dump(mode="json") for vote in approval.votes]),
            )
            if approval.votes
            else None,
        )

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete approvals decided or expired before ``now - older_than``; return how many.

        Pending approvals are never purged. Each deletion also drops the
        request's slot and leaves a ``retention.purged`` tombstone in the
        run's stream, in the same unit of work.
        """
        key = self._key
        filters = [LabelFilter("settled_at", purge_horizon(now, older_than), FilterOp.LT)]
        return purge(
            self._repo,
            self._clock,
            APPROVALS,
            filters=filters,
            batch_size=batch_size,
            doom=lambda meta: self._doomed(key, meta),
        )

    def _doomed(self, key: KeyedDigester, metadata: RecordMetadata) -> Doomed | None:
        opened = open_listed(self._repo, metadata)
        checked = None if opened is None else self._checked(key, opened)
        if checked is None:
            return None
        approval, revision = checked
        if approval.decided_at is None:
            return None
        slot = self._repo.key_digest(
            APPROVAL_SLOTS, joined(approval.checkpoint_id, approval.audience)
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
        return Doomed(deletes, streams, tombstone)

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
        except InvalidInput:
            raise IntegrityFailure(
                "approval has an unexpected shape", key_digest=opened.metadata.key_digest
            ) from None
        if self._repo.key_digest(APPROVALS, approval.approval_id) != opened.metadata.key_digest:
            raise IntegrityFailure(
                "approval is stored under another key", key_digest=opened.metadata.key_digest
            )
        if not hmac.compare_digest(
            integrity_digest(key, APPROVAL_TAG, approval), approval.integrity_digest
        ):
            raise IntegrityFailure(
                "approval failed its keyed integrity check",
                key_digest=opened.metadata.key_digest,
            )
        return approval

    def _upsert(self, approval: Approval, expected: int | Guard, ledger_index: int) -> Upsert:
        """Seal an approval bound to the checkpoint-stream event committed with it."""
        labels: dict[str, LabelValue] = {
            "run": self._repo.key_digest(RUNS, approval.run_id),
            "requested_at": micros(approval.requested_at),
            "status": approval.status.value,
        }
        if approval.decided_at is not None:
            labels["settled_at"] = micros(approval.decided_at)
        return self._repo.prepare(
            APPROVALS,
            approval.approval_id,
            approval.model_dump(mode="json"),
            expected=expected,
            labels=labels,
            ledger_index=ledger_index,
        )


# -- request-bound idempotency -------------------------------------------------
