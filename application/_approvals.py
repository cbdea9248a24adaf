"""Human approvals bound to a checkpoint: request one, decide it exactly once.

An approval and its slot live on their checkpoint's record stream: a
request appends ``approval.requested`` and binds both rows to it; a
decision or expiry appends ``approval.<status>`` there, binding the approval
and the consumed checkpoint, besides the receipt event in the run's stream.
So no older row of the three put back can be decided or consumed again,
and a slot deleted outside flowvault cannot let a request be repeated.
The rows themselves, the expiry pass and the receipts live in their own
modules (``_approval_records``, ``_approval_expiry``, ``_approval_receipts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from flowvault.application._approval_expiry import ApprovalExpiry, ExpiryReport
from flowvault.application._approval_receipts import (
    SignedDecision,
    approval_receipt,
    check_approval,
    signed_decisions,
)
from flowvault.application._approval_records import ApprovalRecords
from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._checkpoint_records import keyed_digester
from flowvault.application._checkpoints import CheckpointService
from flowvault.application._decider_keys import DeciderKeys
from flowvault.application._instants import aware
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._paging import Page, PageScope, read_page
from flowvault.application._record_kind import PURGE_BATCH, RecordPurge
from flowvault.application._record_kinds import APPROVAL_TAG, APPROVALS, DECIDER_TAG, MAX_ACTOR
from flowvault.application._records import LabelFilter, RecordMetadata
from flowvault.application._runs import RUNS, check_run_id
from flowvault.application._sealed import SealedRepository
from flowvault.application._signing import signed
from flowvault.application._streams import next_position, run_stream
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
    CheckpointStatus,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    RevisionConflict,
)
from flowvault.domain._approvals import RejectionRule, Vote, decision_statement
from flowvault.domain._canonical import canonical_bytes


def _stale(checkpoint: Checkpoint, fields: list[str]) -> RevisionConflict:
    return RevisionConflict(
        "checkpoint does not match the caller's view: " + ", ".join(fields),
        checkpoint_id=checkpoint.checkpoint_id,
        fields=",".join(fields),
    )


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
            f"actor must be printable text of 1..{MAX_ACTOR} characters (a decider's name)",
            fix=f"pass --actor as the decider's name, 1 to {MAX_ACTOR} printable characters",
        )
    return actor


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Vote:
    """One decider's decision as ``decide`` received and checked it."""

    decision: str
    actor: str
    voter: str
    """The decider's keyed digest."""
    signature: str | None


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
        self._key = keyed_digester(integrity, "approvals")
        self._checkpoint_records = checkpoints.records
        self._records = ApprovalRecords(checkpoints.records, clock, self._key)
        self._expiry = ApprovalExpiry(self._records, self._key)
        self._keys = DeciderKeys(repository, signatures)
        self._purge = RecordPurge(repository, clock, APPROVALS, "settled_at", self._records.doomed)

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
        existing = self._records.in_slot(checkpoint_id, draft.audience)
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
        try:
            self._store.commit(self._records.request_unit(made))
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

    def status_of(self, approval: Approval) -> ApprovalStatus:
        """Return ``approval``'s status now: pending past its deadline reads as expired."""
        return check_approval(approval).status_at(self._clock.now())

    def get_approval(self, approval_id: str) -> Approval:
        """Return the verified approval; ``NotFound`` if there is none."""
        return self._records.require(approval_id)[0]

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
            approval, revision = self._records.require(approval_id)
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
        target = self._records.pending_checkpoint(approval)
        if moment >= approval.expires_at:
            if self._expiry.expire(approval, revision, target, moment, position):
                self._expiry.fail_if_stranded(approval.run_id)
                raise ApprovalExpired(
                    "approval expired before it was decided", approval_id=approval.approval_id
                )
            return LOST
        if target is None:
            refused = self._consumed_elsewhere(approval)
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
        checkpoint, checkpoint_revision = target
        consumed = None
        if outcome.status is ApprovalStatus.DECIDED:
            checkpoint = self._checkpoint_records.consumed(checkpoint, moment)
            consumed = (checkpoint, checkpoint_revision)
        unit = self._records.outcome_unit(outcome, revision, consumed, moment, position)
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

    def _consumed_elsewhere(self, approval: Approval) -> Exception | None:
        """Say why a decision cannot consume; ``None`` when a racing decision settled the approval.

        The caller then reads the approval again, so a decider racing its
        own retry gets the first result rather than a refusal.
        """
        current, _ = self._records.require(approval.approval_id)
        if current.status is not ApprovalStatus.PENDING:
            return None
        return CheckpointConsumed(
            "the approval's checkpoint was already consumed",
            checkpoint_id=approval.checkpoint_id,
        )

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
        moment = self._clock.now() if now is None else aware(now, "now")
        return self._expiry.expire_overdue(moment)

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
        return signed_decisions(approval)

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
            checked = self._records.open_listed(metadata)
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
        return approval_receipt(self._key, self._repo, approval, self._clock.now())

    def purge(self, now: datetime, older_than: timedelta, batch_size: int = PURGE_BATCH) -> int:
        """Delete approvals decided or expired before ``now - older_than``; return how many.

        Pending approvals are never purged. Each deletion also drops the
        request's slot and leaves a ``retention.purged`` tombstone in the
        run's stream, in the same unit of work.
        """
        return self._purge(now, older_than, batch_size)
