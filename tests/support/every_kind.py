"""A store holding every kind of record, and what its services read back, for the move tests.

``populate`` writes through the public services: workflows (states,
events, action results), workflow state with history, a graph run with a
checkpoint, an approval decided with a signed decision and a terminal
receipt, request idempotency,
evidence, a custom stream with a trimmed start, and an action result purged
by retention (its tombstone left in the ledger). ``service_reads`` reads it
all back through the services, so two stores can be compared as a host
sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from flowvault.application._streams import trim_unit
from flowvault.composition import Runtime
from flowvault.domain import WorkflowState, WorkOrder, content_hash

SCOPE = "moved"
DEFINITION = "move.review"
STREAM = "host.audit"


@dataclass(frozen=True)
class Written:
    """The ids ``populate`` made, to read the same things back from another store."""

    workflows: tuple[str, ...]
    run_id: str
    checkpoint_id: str
    approval_id: str
    action_hash: str
    witness_digest: str


def _order(name: str) -> WorkOrder:
    return WorkOrder(
        kind="move.test", parameters={"name": name}, requester="tester", idempotency_key=name
    )


def populate(runtime: Runtime, *, workflows: int = 3) -> Written:
    """Write one of every record kind (and ``workflows`` workflows) through the services."""
    ids: list[str] = []
    for number in range(workflows):
        record, _ = runtime.workflows.create(_order(f"wf-{number}"))
        if number % 2:
            record = runtime.workflows.transition(
                record.workflow_id, "planning", expected_state="intake", expected_version=1
            )
        ids.append(record.workflow_id)
    first = ids[0]
    runtime.workflow_events.append_event(
        first, "note.added", expected_state="intake", expected_version=1, payload={"n": 1}
    )
    action_hash = content_hash({"action": "kept", "workflow": first})
    runtime.action_results.put_action_result(first, action_hash, {"kept": True})
    purged = content_hash({"action": "purged", "workflow": first})
    runtime.action_results.put_action_result(
        first, purged, {"gone": True}, retention=timedelta(seconds=1)
    )
    assert runtime.action_results.purge_expired(runtime.clock.now() + timedelta(hours=1)) == 1
    state = runtime.state(SCOPE)
    state.save(WorkflowState(workflow_id=first, stage="intake"))
    state.update(lambda s: WorkflowState(**{**s.model_dump(), "stage": "planning"}))

    runtime.definitions.register_definition(DEFINITION, {"nodes": ["a", "b"]})
    run, _ = runtime.runs.start_run(DEFINITION, {"w": first}, idempotency_key=f"run-{first}")
    runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
    checkpoint = runtime.checkpoints.create_checkpoint(
        run.run_id, {"node": "b"}, state={"ready": True}, budgets={"tokens": 10},
        counters={"nodes": 1}, dependency_summary={"tools": []},
        terminal_cursor=None, event_cursor=1,
    )  # fmt: skip
    runtime.runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
    approval = runtime.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="ops",
        prompt_digest=content_hash("go?"),
        allowed_decisions=["approve", "reject"],
        expires_at=runtime.clock.now() + timedelta(days=1),
    )
    signer = Ed25519PrivateKey.generate()
    public = signer.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    runtime.approvals.register_decider_key("ops-lead", public)
    statement = runtime.approvals.decision_statement(approval.approval_id, "approve")
    runtime.approvals.decide(
        approval.approval_id, "approve", "ops-lead", signature=signer.sign(statement)
    )
    runtime.runs.set_status(run.run_id, "running", expected_status="awaiting_approval")
    runtime.runs.finish_run(run.run_id, "completed", expected_status="running", final_state={})

    runtime.idempotency.remember("request-1", {"q": 1}, {"a": 2})
    witness = runtime.evidence.capture_witness(
        "https://example.org/doc", b"evidence bytes", "text/plain", "primary", runtime.clock.now()
    )
    writer = runtime.stream(STREAM)
    for number in range(6):
        writer.append("host.noted", {"n": number})
    runtime.store.commit(
        trim_unit(
            runtime.store,
            runtime.repository,
            STREAM,
            before_index=4,
            occurred_at=runtime.clock.now(),
        )
    )
    return Written(
        workflows=tuple(ids),
        run_id=run.run_id,
        checkpoint_id=checkpoint.checkpoint_id,
        approval_id=approval.approval_id,
        action_hash=action_hash,
        witness_digest=witness.content_digest,
    )


def service_reads(runtime: Runtime, written: Written) -> dict[str, object]:
    """Read everything ``populate`` wrote back through the services, as comparable values."""
    first = written.workflows[0]
    return {
        "workflows": [runtime.workflows.get(w).model_dump() for w in written.workflows],
        "events": [e.model_dump() for e in runtime.workflow_events.events(first)],
        "result": runtime.action_results.get_action_result(first, written.action_hash),
        "results": runtime.action_results.list_action_results(first),
        "state": runtime.state(SCOPE).load(),
        "history": runtime.state(SCOPE).history(),
        "run": runtime.runs.get_run(written.run_id),
        "receipt": runtime.receipts.terminal_receipt(written.run_id),
        "checkpoint": runtime.checkpoints.load_checkpoint(written.checkpoint_id),
        "approval": runtime.approvals.get_approval(written.approval_id),
        "signed": runtime.approvals.signed_decisions(
            runtime.approvals.get_approval(written.approval_id)
        ),
        "recall": runtime.idempotency.recall("request-1", {"q": 1}),
        "witness": runtime.evidence.load_witness(written.witness_digest),
        "stream": runtime.store.read_ledger(STREAM).events,
    }
