"""``flowvault demo``: the main job, an approval workflow narrated end to end.

The scenario is a script of small steps, each a call on the services that
bootstrap wires, checked against what it must show, and narrated a few
readable lines per step (or as one JSON document with ``--json``). The
tamper step is the one place that touches a file directly: it flips a byte
in a *copy* of the database.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from flowvault.adapters._paths import check_os_path
from flowvault.adapters.cli._context import CliContext, Services
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._verbs import expanded
from flowvault.application._state import RESET_EVENT, STATE_WRITTEN_EVENT, reset_progress
from flowvault.domain import (
    ApprovalAlreadyDecided,
    ApprovalStatus,
    CheckpointConsumed,
    CheckpointStatus,
    FlowvaultError,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    ResetFingerprint,
    RevisionConflict,
    WorkflowState,
    WorkOrder,
    content_hash,
)
from flowvault.domain._canonical import canonical_json
from flowvault.domain._ledger import verify_chain

SOURCE = "flowvault demo"
DEMO_SCOPE = "demo"
DEFINITION = "invoice.pay"
AUDIENCE = "finance"
DECIDER = "bob@example.org"
TAMPER_MARKER = "route-via-sepa-batch"
"""Plaintext of one ledger event payload; the tamper step finds it in the database file."""
TAMPERED_COPY = "tampered-copy"
ORDER = WorkOrder(
    kind="invoice.payment",
    parameters={"invoice": "INV-DEMO-0042", "amount_eur": 1200, "payee": "Acme Supplies 7731"},
    requester="alice@example.org",
    idempotency_key="demo-payment-INV-DEMO-0042",
)


# -- narration -------------------------------------------------------------------


INDENT = "      "


class StepFailed(Exception):
    """A demo step did not behave as expected; the message says what was seen."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def expect(condition: bool, message: str) -> None:
    """Raise ``StepFailed`` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise StepFailed(message)


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step showed: lines for a person and a digest-only detail for ``--json``."""

    lines: tuple[str, ...]
    detail: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DemoStep:
    """A step's stable name (used by ``--json`` and in failures) and its title."""

    name: str
    title: str


def short(identifier: str, keep: int = 12) -> str:
    """Return an id or digest shortened for a narration line."""
    head, _, tail = identifier.partition(":")
    if tail:
        return f"{head}:{tail[:keep]}..." if len(tail) > keep else identifier
    return f"{identifier[:keep]}..." if len(identifier) > keep else identifier


def fingerprint_lines(fingerprint: ResetFingerprint) -> list[str]:
    """Return the plaintext-free fingerprint as ``name: value`` lines."""
    shown = fingerprint.model_dump(mode="json", exclude_none=True)
    return [f"{name}: {value}" for name, value in shown.items()]


@dataclass(slots=True)
class DemoNarrator:
    """Prints the demo as it runs; with ``--json`` prints one document at the end."""

    io: CommandIO
    steps: tuple[DemoStep, ...]
    home: Path
    done: list[dict[str, JsonValue]] = field(default_factory=list)

    def start(self) -> None:
        """Say what runs and where, before the first step."""
        self.io.say(
            "flowvault demo: an approval workflow, end to end, on the embedded SQLite store"
        )
        self.io.say(f"home: {self.home}")
        self.io.say(
            f"      (a fresh directory for this demo; delete it when done: rm -r {self.home})"
        )

    def passed(self, step: DemoStep, report: StepReport) -> None:
        """Narrate a step that behaved as expected."""
        number = len(self.done) + 1
        self.io.say(f"[{number}/{len(self.steps)}] {step.title}")
        for line in report.lines:
            self.io.say(INDENT + line)
        self.done.append({"name": step.name, "ok": True, "detail": dict(report.detail)})

    def failed(self, step: DemoStep, message: str) -> int:
        """Report the step that did not behave as expected; return exit status 1."""
        number = len(self.done) + 1
        if self.io.json_output:
            failure: dict[str, JsonValue] = {"name": step.name, "ok": False, "error": message}
            self.io.emit(self._document(ok=False, steps=[*self.done, failure]), [])
        else:
            self.io.err.write(
                f"demo failed at step {number}/{len(self.steps)} ({step.name}: {step.title}): "
                f"{message}\n"
            )
            self.io.err.write(f"  the store is left in {self.home} for inspection\n")
        return 1

    def finished(self, fingerprint: ResetFingerprint) -> int:
        """Close the demo with its fingerprint; return exit status 0."""
        document = self._document(ok=True, steps=self.done)
        document["fingerprint"] = fingerprint.model_dump(mode="json")
        lines = [
            f"demo passed: all {len(self.done)} steps behaved as expected",
            f"fingerprint of the demo scope: {fingerprint.payload_digest or 'absent'}",
        ]
        self.io.emit(document, lines)
        return 0

    def _document(self, *, ok: bool, steps: list[dict[str, JsonValue]]) -> dict[str, JsonValue]:
        listed: list[JsonValue] = list(steps)
        return {"home": str(self.home), "ok": ok, "steps": listed}


# -- the scenario ----------------------------------------------------------------


@dataclass(slots=True)
class _Scenario:
    """What the steps share: the open runtime and the ids they made."""

    context: CliContext
    runtime: Services
    workflow_id: str = ""
    version: int = 0
    action_hash: str = ""
    run_id: str = ""
    checkpoint_id: str = ""
    approval_id: str = ""
    resume_id: str = ""
    fingerprint: ResetFingerprint | None = None

    def moved(
        self, target: str, expected: str, payload: dict[str, JsonValue] | None = None
    ) -> None:
        record = self.runtime.workflows.transition(
            self.workflow_id,
            target,
            expected_state=expected,
            expected_version=self.version,
            payload=payload,
        )
        self.version = record.state_version


Step = Callable[[_Scenario], StepReport]


def _refused(call: Callable[[], object], error: type[FlowvaultError]) -> FlowvaultError:
    """Run ``call`` and return the error it must raise; ``StepFailed`` if it does not."""
    try:
        call()
    except error as raised:
        return raised
    raise StepFailed(f"expected {error.code}, but the call succeeded")


def _create_work_order(s: _Scenario) -> StepReport:
    workflows = s.runtime.workflows
    record, created = workflows.create(ORDER)
    expect(created and record.state == "intake", "the work order did not create a new workflow")
    s.workflow_id, s.version = record.workflow_id, record.state_version
    again, created_again = workflows.create(ORDER)
    expect(
        not created_again and again.workflow_id == s.workflow_id,
        "the retry with the same idempotency key created a second workflow",
    )
    other = ORDER.model_copy(update={"parameters": {**ORDER.parameters, "amount_eur": 9999}})
    conflict = _refused(lambda: workflows.create(other), IdempotencyConflict)
    return StepReport(
        (
            f"workflow {s.workflow_id} created for the work order {ORDER.kind!r}: intake@1",
            "its parameters and requester are sealed; the ledger names only the kind",
            "retry with the same idempotency key: the same workflow, created=false",
            f"same key, different amount: refused with {conflict.code}, nothing written",
        ),
        {"workflow_id": s.workflow_id, "retry_created": created_again},
    )


def _lifecycle(s: _Scenario) -> StepReport:
    s.moved("planning", "intake", {"plan": TAMPER_MARKER})
    s.moved("executing", "planning")
    stale = _refused(
        lambda: s.runtime.workflows.transition(
            s.workflow_id, "completed", expected_state="intake", expected_version=1
        ),
        RevisionConflict,
    )
    revision = s.runtime.state(DEMO_SCOPE).save(
        WorkflowState(workflow_id=s.workflow_id, stage="executing")
    )
    expect(revision == 1, f"the progress saved at revision {revision}, not 1")
    return StepReport(
        (
            f"intake -> planning -> executing@{s.version}: compare-and-swap moves, one event each",
            f"a stale writer still expecting intake@1 is refused: {stale.code}",
            f"progress saved in scope {DEMO_SCOPE!r} (sealed), revision {revision}",
        ),
        {"state": "executing", "version": s.version},
    )


def _action_result(s: _Scenario) -> StepReport:
    results = s.runtime.action_results
    s.action_hash = content_hash({"action": "prepare-transfer", "workflow": s.workflow_id})
    result: JsonValue = {"transfer_draft": "ready", "lines": 1}
    stored = results.put_action_result(
        s.workflow_id, s.action_hash, result, retention=timedelta(days=7)
    )
    again = results.put_action_result(
        s.workflow_id, s.action_hash, result, retention=timedelta(days=7)
    )
    expect(again == stored, "storing the same result again made a second one")
    read = results.get_action_result(s.workflow_id, s.action_hash)
    expect(read is not None and read.result == result, "the stored result did not read back")
    return StepReport(
        (
            f"result of action {short(s.action_hash)} sealed for 7 days "
            f"({stored.size_bytes} bytes)",
            "stored again with the same content: the first result is returned, no duplicate",
            "read back and opened: identical",
        ),
        {"action_hash": s.action_hash, "content_hash": stored.content_hash},
    )


def _checkpoint(s: _Scenario) -> StepReport:
    runs, checkpoints = s.runtime.runs, s.runtime.checkpoints
    definition = s.runtime.definitions.register_definition(
        DEFINITION, {"nodes": ["plan", "prepare", "approve", "pay"]}
    )
    run, created = runs.start_run(
        DEFINITION,
        {"workflow": s.workflow_id},
        budgets={"tokens": 5000},
        idempotency_key=f"run-{s.workflow_id}",
    )
    expect(created and run.status == "accepted", "the run was not accepted")
    s.run_id = run.run_id
    runs.set_status(s.run_id, "running", expected_status="accepted")
    checkpoint = checkpoints.create_checkpoint(
        s.run_id, {"node": "approve"}, state={"prepared": True}, budgets={"tokens": 4200},
        counters={"nodes": 2}, dependency_summary={"tools": ["bank"]},
        terminal_cursor=None, event_cursor=2,
    )  # fmt: skip
    expect(checkpoint.status == CheckpointStatus.PENDING, "the checkpoint is not pending")
    s.checkpoint_id = checkpoint.checkpoint_id
    runs.set_status(s.run_id, "awaiting_approval", expected_status="running")
    s.moved("decision", "executing")
    return StepReport(
        (
            f"run {s.run_id} of {DEFINITION} (version {short(definition.version)}) "
            "accepted -> running",
            f"checkpoint {s.checkpoint_id} at node 'approve': sealed, keyed integrity digest",
            f"run awaiting_approval; workflow in decision@{s.version}",
        ),
        {"run_id": s.run_id, "checkpoint_id": s.checkpoint_id},
    )


def _request_approval(s: _Scenario) -> StepReport:
    approvals = s.runtime.approvals
    checkpoint = s.runtime.checkpoints.load_checkpoint(s.checkpoint_id)
    expires_at = s.runtime.clock.now() + timedelta(hours=4)

    def ask() -> str:
        approval = approvals.request_approval(
            checkpoint.checkpoint_id,
            expected_state_digest=checkpoint.state_digest,
            expected_budgets=checkpoint.budgets,
            expected_counters=checkpoint.counters,
            expected_dependency_digest=checkpoint.dependency_digest,
            audience=AUDIENCE,
            prompt_digest=content_hash("Pay invoice INV-DEMO-0042?"),
            allowed_decisions=["approve", "reject"],
            expires_at=expires_at,
        )
        return approval.approval_id

    s.approval_id = ask()
    expect(ask() == s.approval_id, "asking again opened a second approval request")
    return StepReport(
        (
            f"approval {s.approval_id} requested from {AUDIENCE!r}: approve or reject, within 4 h",
            "bound to the checkpoint's integrity digest; asking again returns the same request",
        ),
        {"approval_id": s.approval_id},
    )


def _decide(s: _Scenario) -> StepReport:
    approvals = s.runtime.approvals
    decided, resume_from = approvals.decide(s.approval_id, "approve", DECIDER)
    expect(decided.status == ApprovalStatus.DECIDED, "the approval is not decided")
    expect(resume_from.status == CheckpointStatus.CONSUMED, "the checkpoint was not consumed")
    s.resume_id = resume_from.checkpoint_id
    late = _refused(
        lambda: approvals.decide(s.approval_id, "reject", "mallory@example.org"),
        ApprovalAlreadyDecided,
    )
    _, event, _ = s.runtime.workflow_events.append_event(
        s.workflow_id,
        "decision.approved",
        expected_state="decision",
        expected_version=s.version,
        payload={"action_hash": s.action_hash, "approved": True, "decided_by": DECIDER},
        event_key=f"approval-{s.approval_id}",
    )
    s.version += 1
    receipt = approvals.approval_receipt(decided)
    expect(DECIDER not in receipt.model_dump_json(), "the approval receipt names the decider")
    expect(DECIDER not in event.model_dump_json(), "the ledger names the decider")
    return StepReport(
        (
            "approved; the checkpoint was consumed in the same unit of work",
            f"a second, later decision is refused: {late.code}",
            f"approval receipt {short(receipt.digest)}: keyed digests only, no name in it",
            f"decision receipt recorded in the workflow's ledger (event {event.index})",
        ),
        {"approval_receipt": receipt.digest, "decision_event": event.index},
    )


def _resume(s: _Scenario) -> StepReport:
    checkpoints = s.runtime.checkpoints
    resume_from = checkpoints.load_checkpoint(s.resume_id)
    expect(resume_from.status == CheckpointStatus.CONSUMED, "the resume point is not consumed")
    again = _refused(lambda: checkpoints.consume_checkpoint(s.resume_id), CheckpointConsumed)
    s.runtime.runs.set_status(s.run_id, "running", expected_status="awaiting_approval")
    s.moved("executing", "decision")
    return StepReport(
        (
            f"resumed from checkpoint {s.resume_id} at {canonical_json(resume_from.next_cursor)}, "
            "its digests verified",
            f"resuming from it a second time is refused: {again.code}",
            f"run running again; workflow executing@{s.version}",
        ),
        {"resumed_from": s.resume_id},
    )


def _finish(s: _Scenario) -> StepReport:
    runs = s.runtime.runs
    receipt = runs.finish_run(
        s.run_id, "completed", expected_status="running", final_state={"paid": True}
    )
    stored = s.runtime.receipts.terminal_receipt(s.run_id)
    expect(stored == receipt, "the terminal receipt does not read back")
    s.moved("completed", "executing")
    record = s.runtime.workflows.get(s.workflow_id)
    expect(record.work_order.parameters == {}, "the finished work order kept its parameters")
    _, revision = s.runtime.state(DEMO_SCOPE).update(
        lambda state: WorkflowState(**{**state.model_dump(), "stage": "completed"})
    )
    return StepReport(
        (
            f"run completed: terminal receipt {short(receipt.digest)}",
            "signed with a keyed digest over the run's final chain; verified on every read",
            f"workflow completed@{record.state_version}; its parameters are scrubbed",
            f"progress in scope {DEMO_SCOPE!r} updated to revision {revision}",
        ),
        {"terminal_receipt": receipt.digest, "status": receipt.status},
    )


def _run_events(s: _Scenario) -> Iterator[LedgerEvent]:
    cursor: int | None = 0
    while cursor is not None:
        page = s.runtime.runs.read_run_events(s.run_id, cursor)
        yield from page.events
        cursor = page.next_cursor


def _verify(s: _Scenario) -> StepReport:
    workflow = s.runtime.workflow_events.events(s.workflow_id)
    run = list(_run_events(s))
    history = s.runtime.state(DEMO_SCOPE).history()
    counts: dict[str, JsonValue] = {}
    for name, events in (("workflow", workflow), ("run", run), ("scope", history)):
        verdict = verify_chain(events)
        expect(verdict.ok, f"the {name} ledger does not verify: {verdict.reason}")
        counts[name] = verdict.checked
    decided = [event.type for event in run if event.type.startswith("approval.")]
    expect(decided == ["approval.decided"], "the run's ledger does not show the decision")
    return StepReport(
        (
            f"workflow ledger: {counts['workflow']} events, hash chain intact",
            f"run ledger: {counts['run']} events (the approval decision among them), intact",
            f"scope {DEMO_SCOPE!r} history: {counts['scope']} events so far "
            "(one per state write), intact",
        ),
        {"events": counts},
    )


def _flip_marker(database: Path) -> int:
    """Change one byte of ``TAMPER_MARKER`` in every copy of it in ``database``; return one offset.

    Raw file I/O on a copy of the store: the only direct file access of the demo.
    """
    data = bytearray(database.read_bytes())
    marker = TAMPER_MARKER.encode("ascii")
    offsets = []
    start = data.find(marker)
    while start != -1:
        offsets.append(start)
        data[start] ^= 0x01  # 'r' -> 's': still valid UTF-8 and JSON
        start = data.find(marker, start + 1)
    expect(bool(offsets), "the ledger event to tamper with is not in the database file")
    database.write_bytes(bytes(data))
    return offsets[0]


def _tamper(s: _Scenario) -> StepReport:
    s.runtime.close()
    settings = s.context.settings
    copy_home = settings.home / TAMPERED_COPY
    copy = s.context.demo(copy_home)
    copy_home.mkdir(mode=0o700)
    for part in (settings.data_dir, settings.keys_dir):
        shutil.copytree(part, copy_home / part.name)
    offset = _flip_marker(copy.settings.database_path)
    with copy.bootstrap() as tampered:
        caught = _refused(
            lambda: tampered.workflow_events.events(s.workflow_id), IntegrityFailure
        )
    s.runtime = s.context.bootstrap()
    intact = verify_chain(s.runtime.workflow_events.events(s.workflow_id))
    expect(intact.ok, "the original store no longer verifies")
    return StepReport(
        (
            f"copied the store to {copy_home} and changed one byte of its database file",
            f"  (offset {offset}, inside the 'planning' event of the workflow's ledger)",
            f"reading that ledger from the copy: {caught.code}: {caught.message}",
            "the original store still verifies",
        ),
        {"offset": offset, "detected": caught.code},
    )


def _fingerprint(s: _Scenario) -> StepReport:
    outcome = reset_progress(
        s.runtime.state(DEMO_SCOPE), DEMO_SCOPE, actor="demo", source=SOURCE, dry_run=True
    )
    fingerprint = outcome.fingerprint
    expect(not outcome.applied, "the dry run changed something")
    expect(
        fingerprint.readability == "readable" and fingerprint.revision == 2,
        "the fingerprint does not show the readable state at revision 2",
    )
    s.fingerprint = fingerprint
    return StepReport(
        (
            f"scope {DEMO_SCOPE!r}, without its plaintext:",
            *("  " + line for line in fingerprint_lines(fingerprint)),
        ),
        {"fingerprint": fingerprint.model_dump(mode="json")},
    )


def _recovery(s: _Scenario) -> StepReport:
    state = s.runtime.state(DEMO_SCOPE)
    outcome = reset_progress(state, DEMO_SCOPE, actor="demo", source=SOURCE)
    expect(outcome.applied, "the reset was not applied")
    expect(outcome.fingerprint == s.fingerprint, "the reset fingerprinted another state")
    expect(state.load().revision is None, "the state is still there after the reset")
    history = state.history()
    revision = s.fingerprint.revision if s.fingerprint is not None else None
    writes = [STATE_WRITTEN_EVENT] * (revision or 0)
    expect(
        [event.type for event in history] == [*writes, RESET_EVENT] and verify_chain(history).ok,
        "the scope's history does not show each state write, then the reset, verified",
    )
    intact = verify_chain(s.runtime.workflow_events.events(s.workflow_id)).ok
    expect(intact, "the workflow ledger no longer verifies after the reset")
    return StepReport(
        (
            f"flowvault --home {s.context.settings.home} reset-progress --scope {DEMO_SCOPE} --yes",
            "recorded a workflow_state.reset event carrying the fingerprint, then deleted",
            f"only the state row: scope {DEMO_SCOPE!r} is absent, its history verifies",
            "the workflow, the run and their ledgers are untouched and still verify",
        ),
        {"applied": outcome.applied, "history_events": len(history)},
    )


STEPS: tuple[tuple[DemoStep, Step], ...] = (
    (DemoStep("create-work-order", "create a work order, then retry it"), _create_work_order),
    (DemoStep("lifecycle", "move it through its lifecycle"), _lifecycle),
    (DemoStep("action-result", "store an action result"), _action_result),
    (DemoStep("checkpoint", "start a run and checkpoint it"), _checkpoint),
    (DemoStep("request-approval", "request a human approval"), _request_approval),
    (DemoStep("decide", "decide it, exactly once"), _decide),
    (DemoStep("resume", "resume from the consumed checkpoint"), _resume),
    (DemoStep("finish", "finish with a terminal receipt"), _finish),
    (DemoStep("verify-ledgers", "verify every ledger"), _verify),
    (DemoStep("tamper", "flip a byte in a copy of the database"), _tamper),
    (DemoStep("fingerprint", "fingerprint the saved progress"), _fingerprint),
    (DemoStep("recovery", "run the recovery verb, reset-progress"), _recovery),
)
"""The scenario, in order; each step checks its own expectation."""


def _demo_home(chosen: str | None) -> Path:
    """Return a fresh home: a new temporary directory, or ``chosen`` if absent or empty."""
    if chosen is None:
        return Path(tempfile.mkdtemp(prefix="flowvault-demo-"))
    try:
        home = check_os_path(Path(expanded(chosen, "--home")).absolute())
    except ValueError as error:
        raise InvalidInput(f"--home {error}") from None
    if home.exists() and (not home.is_dir() or any(home.iterdir())):
        raise InvalidInput(
            f"the demo needs a fresh home and {home} is not an empty directory; "
            "pass --home with a directory that does not exist or is empty, or omit it",
            home=str(home),
        )
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def _run_steps(scenario: _Scenario, narrator: DemoNarrator, *, debug: bool) -> int:
    for step, run in STEPS:
        try:
            report = run(scenario)
        except StepFailed as failure:
            return narrator.failed(step, failure.message)
        except FlowvaultError as error:
            return narrator.failed(step, f"unexpected {error.code}: {error.message}")
        except Exception as error:
            if debug:
                raise
            return narrator.failed(step, f"unexpected {type(error).__name__}; rerun with --debug")
        narrator.passed(step, report)
    if scenario.fingerprint is None:
        return narrator.failed(STEPS[-1][0], "no fingerprint was taken")
    return narrator.finished(scenario.fingerprint)


def _demo(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    home = _demo_home(args.demo_home or args.home)
    demo = context.demo(home)
    narrator = DemoNarrator(io, tuple(step for step, _ in STEPS), home)
    narrator.start()
    scenario = _Scenario(demo, demo.bootstrap())
    try:
        return _run_steps(scenario, narrator, debug=args.debug)
    finally:
        scenario.runtime.close()
