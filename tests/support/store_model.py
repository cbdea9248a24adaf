"""A pure-Python model of what a flowvault runtime must answer, for the stateful check.

The model knows nothing of sealing, SQL or hashing chains beyond what a host
can see: which records exist, with which content and revision, how long each
ledger stream is, and which error code each call must raise. It follows
the documentation (``docs/workflows.md``, ``docs/approvals.md``,
``docs/state.md``, the guard table in ``docs/architecture.md``) and, where
that leaves the order of two checks open, the services' docstrings; a
disagreement is a divergence to explain, never a quirk to copy.

Every operation returns an ``Outcome``: the error code the call must raise,
or ``None`` and the value it must return. The model changes only when the
call must change the store (including the documented side effect of an
expired decision, which commits before it raises).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Generic, TypeVar

GENESIS = "sha256:" + "0" * 64
"""``previous_hash`` of the first event of every stream."""

LIFECYCLE: dict[str, frozenset[str]] = {
    "intake": frozenset({"planning", "cancelled", "failed", "stopped"}),
    "planning": frozenset({"executing", "decision", "cancelled", "failed", "stopped"}),
    "executing": frozenset({"decision", "completed", "failed", "cancelled", "stopped"}),
    "decision": frozenset({"executing", "completed", "failed", "cancelled", "stopped"}),
}
"""The default lifecycle as ``docs/workflows.md`` draws it; terminal states have no exit."""

TERMINAL = frozenset({"completed", "failed", "cancelled", "stopped"})
INITIAL = "intake"
ALLOWED_DECISIONS = ("approve", "reject")

REVISION_CONFLICT = "REVISION_CONFLICT"
NOT_FOUND = "NOT_FOUND"
IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
INVALID_TRANSITION = "INVALID_TRANSITION"
INVALID_INPUT = "INVALID_INPUT"
CHECKPOINT_CONSUMED = "CHECKPOINT_CONSUMED"
APPROVAL_REQUEST_CONFLICT = "APPROVAL_REQUEST_CONFLICT"
APPROVAL_ALREADY_DECIDED = "APPROVAL_ALREADY_DECIDED"
APPROVAL_DECISION_NOT_ALLOWED = "APPROVAL_DECISION_NOT_ALLOWED"
APPROVAL_EXPIRED = "APPROVAL_EXPIRED"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a call must do: raise ``code``, or return ``value`` when ``code`` is ``None``."""

    code: str | None = None
    value: T | None = None


def refused(code: str) -> Outcome[T]:
    """Predict that the call raises the flowvault error with ``code``."""
    return Outcome(code=code)


def checkpoint_id(run_id: str, cursor: str) -> str:
    """Return the deterministic id of a run's checkpoint at a cursor: both, hashed canonically."""
    text = json.dumps([run_id, {"node": cursor}], sort_keys=True, separators=(",", ":"))
    return "cp_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def joined(*parts: str) -> str:
    """Natural key of a record that belongs to a pair (event keys, approval slots)."""
    return "\x1f".join(parts)


@dataclass(frozen=True, slots=True)
class Workflow:
    """A workflow as its host sees it."""

    workflow_id: str
    idempotency_key: str
    variant: int
    state: str = INITIAL
    version: int = 1
    scrubbed: bool = False
    events: int = 1
    event_keys: tuple[tuple[str, int, int], ...] = ()
    """``(event key, body variant, ledger index)`` of every keyed event."""

    def keyed(self, event_key: str) -> tuple[int, int] | None:
        """Return ``(variant, index)`` of the event recorded under ``event_key``."""
        for key, variant, index in self.event_keys:
            if key == event_key:
                return variant, index
        return None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A resume point: its content variant and whether it was consumed."""

    checkpoint_id: str
    run_id: str
    cursor: str
    variant: int
    created_at: datetime
    consumed_at: datetime | None = None
    revision: int = 1


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval request and its outcome."""

    approval_id: str
    checkpoint_id: str
    run_id: str
    audience: str
    prompt: int
    expires_at: datetime
    requested_at: datetime
    status: str = "pending"
    decision: str | None = None
    actor: str | None = None
    decided_at: datetime | None = None
    revision: int = 1


@dataclass(frozen=True, slots=True)
class Reset:
    """What a state reset must report of the row it removed."""

    readability: str
    revision: int | None


@dataclass
class StoreModel:
    """Everything a runtime must hold, in plain dictionaries."""

    now: datetime
    id_prefix: str = "id"
    issued_ids: int = 0
    records: dict[str, tuple[dict[str, int], int]] = field(default_factory=dict)
    workflows: dict[str, Workflow] = field(default_factory=dict)
    orders: dict[str, str] = field(default_factory=dict)
    """Idempotency key to workflow id."""
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    approvals: dict[str, Approval] = field(default_factory=dict)
    slots: dict[tuple[str, str], str] = field(default_factory=dict)
    """``(checkpoint id, audience)`` to approval id."""
    remembered: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Idempotency key to ``(request variant, response variant)``."""
    states: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Scope to ``(step, revision)``."""
    raw_streams: dict[str, list[str]] = field(default_factory=dict)
    """Stream to the hashes of the events appended to it directly."""
    run_events: dict[str, int] = field(default_factory=dict)
    scope_events: dict[str, int] = field(default_factory=dict)

    def _new_id(self) -> str:
        self.issued_ids += 1
        return f"{self.id_prefix}-{self.issued_ids:06d}"

    # -- sealed records (guards of docs/architecture.md) ------------------------

    def create_record(self, key: str, document: dict[str, int]) -> Outcome[int]:
        """``Guard.ABSENT``: revision 1 when absent, else a conflict."""
        if key in self.records:
            return refused(REVISION_CONFLICT)
        self.records[key] = (document, 1)
        return Outcome(value=1)

    def update_record(self, key: str, document: dict[str, int], expected: int) -> Outcome[int]:
        """Exact guard: succeeds only on the stored revision, and writes the next one."""
        current = self.records.get(key)
        if current is None or current[1] != expected:
            return refused(REVISION_CONFLICT)
        self.records[key] = (document, expected + 1)
        return Outcome(value=expected + 1)

    # -- raw ledger appends -----------------------------------------------------

    def head(self, stream: str) -> tuple[int, str]:
        """Index and previous hash the next event of a directly written stream must carry."""
        hashes = self.raw_streams.get(stream, [])
        return len(hashes), hashes[-1] if hashes else GENESIS

    def append(self, stream: str, index: int, previous: str, event_hash: str) -> Outcome[int]:
        """Land an append only on the exact head: its index and its hash."""
        if (index, previous) != self.head(stream):
            return refused(REVISION_CONFLICT)
        self.raw_streams.setdefault(stream, []).append(event_hash)
        return Outcome(value=index)

    # -- workflows ---------------------------------------------------------------

    def create_workflow(self, key: str, variant: int) -> Outcome[tuple[Workflow, bool]]:
        """Make a workflow for a new key; replay the same order; refuse another order."""
        existing = self.orders.get(key)
        if existing is not None:
            workflow = self.workflows[existing]
            if workflow.variant != variant:
                return refused(IDEMPOTENCY_CONFLICT)
            return Outcome(value=(workflow, False))
        workflow = Workflow(self._new_id(), key, variant)
        self.workflows[workflow.workflow_id] = workflow
        self.orders[key] = workflow.workflow_id
        return Outcome(value=(workflow, True))

    def transition(
        self, workflow_id: str, target: str, expected_state: str, expected_version: int
    ) -> Outcome[Workflow]:
        """CAS on state and version first, then the lifecycle; a terminal state scrubs."""
        workflow = self.workflows.get(workflow_id)
        if workflow is None:
            return refused(NOT_FOUND)
        if (workflow.state, workflow.version) != (expected_state, expected_version):
            return refused(REVISION_CONFLICT)
        if target not in LIFECYCLE.get(workflow.state, frozenset()):
            return refused(INVALID_TRANSITION)
        moved = replace(
            workflow,
            state=target,
            version=workflow.version + 1,
            scrubbed=workflow.scrubbed or target in TERMINAL,
            events=workflow.events + 1,
        )
        self.workflows[workflow_id] = moved
        return Outcome(value=moved)

    def append_event(
        self,
        workflow_id: str,
        event_key: str | None,
        variant: int,
        expected_state: str,
        expected_version: int,
    ) -> Outcome[tuple[Workflow, int, bool]]:
        """Replay a keyed retry before any CAS check; otherwise CAS, then a new event."""
        workflow = self.workflows.get(workflow_id)
        if event_key is not None and workflow is not None:
            earlier = workflow.keyed(event_key)
            if earlier is not None:
                if earlier[0] != variant:
                    return refused(IDEMPOTENCY_CONFLICT)
                return Outcome(value=(workflow, earlier[1], False))
        if workflow is None:
            return refused(NOT_FOUND)
        if (workflow.state, workflow.version) != (expected_state, expected_version):
            return refused(REVISION_CONFLICT)
        index = workflow.events
        keys = workflow.event_keys
        if event_key is not None:
            keys = (*keys, (event_key, variant, index))
        moved = replace(workflow, version=workflow.version + 1, events=index + 1, event_keys=keys)
        self.workflows[workflow_id] = moved
        return Outcome(value=(moved, index, True))

    # -- checkpoints and approvals (docs/approvals.md) ---------------------------

    def create_checkpoint(self, run_id: str, cursor: str, variant: int) -> Outcome[Checkpoint]:
        """Return the first for the same content (even consumed); refuse other content."""
        cid = checkpoint_id(run_id, cursor)
        existing = self.checkpoints.get(cid)
        if existing is not None:
            if existing.variant != variant:
                return refused(IDEMPOTENCY_CONFLICT)
            return Outcome(value=existing)
        made = Checkpoint(cid, run_id, cursor, variant, created_at=self.now)
        self.checkpoints[cid] = made
        return Outcome(value=made)

    def consume(self, cid: str) -> Outcome[Checkpoint]:
        """Consume a checkpoint exactly once."""
        checkpoint = self.checkpoints.get(cid)
        if checkpoint is None:
            return refused(NOT_FOUND)
        if checkpoint.consumed_at is not None:
            return refused(CHECKPOINT_CONSUMED)
        return Outcome(value=self._consumed(checkpoint, self.now))

    def _consumed(self, checkpoint: Checkpoint, moment: datetime) -> Checkpoint:
        used = replace(checkpoint, consumed_at=moment, revision=checkpoint.revision + 1)
        self.checkpoints[checkpoint.checkpoint_id] = used
        return used

    def request_approval(
        self, cid: str, audience: str, prompt: int, expires_at: datetime, *, fresh_view: bool
    ) -> Outcome[Approval]:
        """Check the checkpoint, its freshness and the expiry, then the audience's slot."""
        checkpoint = self.checkpoints.get(cid)
        if checkpoint is None:
            return refused(NOT_FOUND)
        if checkpoint.consumed_at is not None:
            return refused(CHECKPOINT_CONSUMED)
        if not fresh_view:
            return refused(REVISION_CONFLICT)
        if expires_at <= self.now:
            return refused(INVALID_INPUT)
        return self._slot(checkpoint, audience, prompt, expires_at)

    def _slot(
        self, checkpoint: Checkpoint, audience: str, prompt: int, expires_at: datetime
    ) -> Outcome[Approval]:
        """Return the identical pending request, refuse another, or make a new one."""
        slot = self.slots.get((checkpoint.checkpoint_id, audience))
        if slot is not None:
            pending = self.approvals[slot]
            same = (pending.prompt, pending.expires_at) == (prompt, expires_at)
            if pending.status == "pending" and same:
                return Outcome(value=pending)
            return refused(APPROVAL_REQUEST_CONFLICT)
        made = Approval(
            approval_id=self._new_id(),
            checkpoint_id=checkpoint.checkpoint_id,
            run_id=checkpoint.run_id,
            audience=audience,
            prompt=prompt,
            expires_at=expires_at,
            requested_at=self.now,
        )
        self.approvals[made.approval_id] = made
        self.slots[(checkpoint.checkpoint_id, audience)] = made.approval_id
        return Outcome(value=made)

    def decide(
        self, approval_id: str, decision: str, actor: str, at: datetime | None = None
    ) -> Outcome[tuple[Approval, Checkpoint]]:
        """Decide once; a second decide is ``APPROVAL_ALREADY_DECIDED`` (docs/approvals.md).

        The same actor with the same decision again gets the first result back.

        ``at`` is the instant the caller decides at (the clock's when omitted);
        at or past the deadline the approval expires and its checkpoint is
        consumed, committed before ``APPROVAL_EXPIRED`` is raised.
        """
        moment = self.now if at is None else at
        approval = self.approvals.get(approval_id)
        if approval is None:
            return refused(NOT_FOUND)
        if approval.status != "pending":
            return self._replayed(approval, decision, actor)
        if decision not in ALLOWED_DECISIONS:
            return refused(APPROVAL_DECISION_NOT_ALLOWED)
        checkpoint = self.checkpoints[approval.checkpoint_id]
        if moment >= approval.expires_at:
            if checkpoint.consumed_at is None:
                self._consumed(checkpoint, moment)
            self._settle(approval, moment, status="expired")
            return refused(APPROVAL_EXPIRED)
        if checkpoint.consumed_at is not None:
            return refused(CHECKPOINT_CONSUMED)
        used = self._consumed(checkpoint, moment)
        decided = self._settle(approval, moment, status="decided", decision=decision, actor=actor)
        return Outcome(value=(decided, used))

    def _replayed(
        self, approval: Approval, decision: str, actor: str
    ) -> Outcome[tuple[Approval, Checkpoint]]:
        """Return the first result to the same actor and decision; else refuse it as decided."""
        used = self.checkpoints.get(approval.checkpoint_id)
        first = (approval.status, approval.decision, approval.actor)
        if used is not None and first == ("decided", decision, actor):
            return Outcome(value=(approval, used))
        return refused(APPROVAL_ALREADY_DECIDED)

    def _settle(
        self,
        approval: Approval,
        moment: datetime,
        status: str,
        decision: str | None = None,
        actor: str | None = None,
    ) -> Approval:
        settled = replace(
            approval,
            status=status,
            decision=decision,
            actor=actor,
            decided_at=moment,
            revision=approval.revision + 1,
        )
        self.approvals[approval.approval_id] = settled
        self.run_events[approval.run_id] = self.run_events.get(approval.run_id, 0) + 1
        return settled

    # -- request-bound idempotency -------------------------------------------------

    def remember(self, key: str, request: int, response: int) -> Outcome[int]:
        """Keep the first response for its request; refuse another request."""
        stored = self.remembered.get(key)
        if stored is not None:
            if stored[0] != request:
                return refused(IDEMPOTENCY_CONFLICT)
            return Outcome(value=stored[1])
        self.remembered[key] = (request, response)
        return Outcome(value=response)

    def recall(self, key: str, request: int) -> Outcome[int | None]:
        """Nothing for an unknown key; the response for its request; a conflict otherwise."""
        stored = self.remembered.get(key)
        if stored is None:
            return Outcome(value=None)
        if stored[0] != request:
            return refused(IDEMPOTENCY_CONFLICT)
        return Outcome(value=stored[1])

    # -- workflow state per scope (docs/state.md) ----------------------------------

    def save_state(self, scope: str, step: int) -> Outcome[int]:
        """``save`` writes whatever is stored; the revision advances by one."""
        current = self.states.get(scope)
        revision = 1 if current is None else current[1] + 1
        return self._written(scope, step, revision)

    def _written(self, scope: str, step: int, revision: int) -> Outcome[int]:
        """Every state write appends its ``workflow_state.written`` event to the scope."""
        self.states[scope] = (step, revision)
        self.scope_events[scope] = self.scope_events.get(scope, 0) + 1
        return Outcome(value=revision)

    def write_state(self, scope: str, step: int, expected: int | None) -> Outcome[int]:
        """Commit a prepared state write only on the revision it was guarded by."""
        current = self.states.get(scope)
        if (None if current is None else current[1]) != expected:
            return refused(REVISION_CONFLICT)
        return self._written(scope, step, 1 if expected is None else expected + 1)

    def reset_state(self, scope: str) -> Outcome[Reset]:
        """Record the reset event in every case; delete the row, if there is one."""
        current = self.states.pop(scope, None)
        self.scope_events[scope] = self.scope_events.get(scope, 0) + 1
        if current is None:
            return Outcome(value=Reset("absent", None))
        return Outcome(value=Reset("readable", current[1]))

    # -- what the store must hold ------------------------------------------------

    def stream_lengths(self) -> dict[str, int]:
        """Every non-empty ledger stream and its length."""
        lengths = {stream: len(hashes) for stream, hashes in self.raw_streams.items() if hashes}
        lengths.update({f"workflow/{w.workflow_id}": w.events for w in self.workflows.values()})
        lengths.update({f"run/{run}": n for run, n in self.run_events.items() if n})
        lengths.update({f"scope/{scope}": n for scope, n in self.scope_events.items() if n})
        return lengths

    def natural_keys(self) -> dict[str, set[str]]:
        """Natural keys of every record the store must hold, by kind of record."""
        return {
            "records": set(self.records),
            "workflows": set(self.workflows),
            "workflow_orders": set(self.orders),
            "event_keys": {
                joined(w.workflow_id, key)
                for w in self.workflows.values()
                for key, _, _ in w.event_keys
            },
            "checkpoints": set(self.checkpoints),
            "approvals": set(self.approvals),
            "approval_slots": {joined(cid, audience) for cid, audience in self.slots},
            "request_idempotency": set(self.remembered),
            "states": set(self.states),
        }
