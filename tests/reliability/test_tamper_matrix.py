"""Tamper suite: byte flips in every stored cell, and structured attacks on rows and ledgers.

A real store (SQLite on disk, and PostgreSQL) holds every kind of record the
services write: workflows with action results, state, run results, graph
runs, checkpoints, approvals (pending, decided, and expired: pending past
their deadline), idempotency records and evidence, with their ledgers. Every
trial tampers with the stored bytes the way someone with write access to the
database could, then reads everything back through the public API, each
reader on its own so that one refusal hides no other reader's answer: every
service read, every audit read (``events``, ``history``, paged
``read_run_events``, the keyed ``ledger verify --all`` and ``ledger head``),
then every retry of an idempotent call. Each reader must end in a typed
flowvault error or return exactly what it returned before the tampering (a
retry: its first answer, without writing a duplicate); anything else is
counted, per reader and in total, as silently wrong.

Two outcomes are counted apart, not as anomalies, because they are the
design's stated limits (see ``KNOWN_LIMITS``), each for the readers it
concerns alone: an altered label index can drop a record from a filtered
listing, and on PostgreSQL a flip that cuts off a stream's newest event
changes its ``ledger head`` receipt. Every ledger attack runs on each kind of stream and
must be caught by the keyed verify, the service reads and a receipt kept
before; the negative controls run the judging against deliberately weakened
readers, which it must call silently wrong.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sqlite3
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import pytest
import reliability
from cli_helpers import json_document, run_cli
from listings import refused
from mark_lag import settle
from pydantic import BaseModel, SecretStr

from flowvault.application import (
    Guard,
    HistoryEvent,
    KeyedDigester,
    LedgerAudit,
    SecureObjectStore,
    TagFilter,
)
from flowvault.application._action_results import ACTION_RESULTS
from flowvault.application._audit import list_all_streams
from flowvault.application._graph_namespaces import (
    GRAPH_RUN_IDEMPOTENCY,
    GRAPH_RUN_RECEIPTS,
    GRAPH_RUNS,
)
from flowvault.application._keys import encode_master_key
from flowvault.application._receipts import issue_receipt
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    REQUEST_IDEMPOTENCY,
    WITNESSES,
)
from flowvault.application._state import STATE_NAMESPACE
from flowvault.application._streams import read_stream, run_stream
from flowvault.application._workflow_events import EVENT_KEYS
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application._workflows import IDEMPOTENCY
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.application.testing._fakes import EPOCH
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    ApprovalStatus,
    FlowvaultError,
    IntegrityFailure,
    LedgerEvent,
    Witness,
    WorkflowResult,
    WorkflowState,
    WorkOrder,
    content_hash,
)
from flowvault.domain._approvals import checkpoint_id_for
from flowvault.domain._canonical import canonical_json
from flowvault.domain._envelope import format_instant

KEY: Final = bytes(range(7, 39))
MarkSync = Literal["lagged", "strict"]
MARK_MODES: Final[tuple[MarkSync, ...]] = ("lagged", "strict")
BOTH_MARK_MODES: Final = pytest.mark.parametrize("world", MARK_MODES, indirect=True)
"""The deterministic attacks run with the mark written in the background and before each ack."""
INTEGRITY_CODES: Final = frozenset(
    {"INTEGRITY_FAILURE", "CHECKPOINT_INTEGRITY_FAILURE", "STORE_ROLLED_BACK"}
)
"""Codes a detected tamper may carry: a failed check, or a store below its high-water mark."""
ACTIONS: Final = tuple(content_hash(f"action-{n}") for n in range(3))
EVIDENCE: Final = b"evidence body: invoice INV-1 scanned"
REQUESTS: Final = (("req-1", {"op": "pay", "n": 1}), ("req-2", {"op": "pay", "n": 2}))
RESULTS: Final = ({"paid": True, "ref": "TX-1"}, {"paid": False}, [1, 2, 3])
"""The action results stored under ``ACTIONS``, in order."""
DEFINITION: Final = {"nodes": ["a", "b", "c"]}
EXPIRED_AFTER: Final = timedelta(minutes=30)
"""How long the expired approval was open; the populated store's clock ends past it."""


def _response(key: str) -> dict[str, int]:
    return {"status": 200 + len(key)}


INDEX_CELLS: Final = frozenset({"records.id"})
ADDRESS_CELLS: Final = frozenset({"records.namespace", "records.key_digest"})
"""A record's address: altered, the row is elsewhere, and its old address reads as empty."""
AUDIT_READER: Final = "ledger verify"
"""Besides every ``record_labels`` column: the key label rows join on."""
KNOWN_LIMITS: Final = {
    "index": (
        "label and tag indexes (record_labels, record_tags, and records.id they join on): "
        "not authenticated; a "
        "flip can drop a record from a filtered listing (so latest_checkpoint may name an "
        "older one); an extra row fails the listing, and no value or label ever changes"
    ),
    "receipt": (
        "PostgreSQL ledger head: a flipped stream name on a stream's newest event cuts it "
        "off; the chain alone cannot show that, a kept `ledger head` receipt does"
    ),
    "moved": (
        "record address (records.namespace, records.key_digest): a listing may omit the "
        "moved record, never change one; reads by id refuse it, and the full audit must "
        "refuse the store in the same trial, or the omission counts as silently wrong"
    ),
}
HARMLESS: Final = {
    "record_labels.*": "an index: read only to select rows for filters, never returned",
    "record_tags.*": "an index: read only to select rows for tag filters, never returned",
    "records.id": "an internal row id: read only to join the label index",
    "ledger_streams.first_index (PostgreSQL)": "read only by trims, which no service issues",
    "ledger_streams.head_index/head_hash (PostgreSQL)": (
        "read only by append guards: a wrong head refuses the next append, never accepts one"
    ),
    "store_epoch.epoch (SQLite)": (
        "a commit count no read returns, compared with the high-water mark only at open "
        "(a lowered one is then STORE_ROLLED_BACK, tested in test_anti_rollback)"
    ),
}
"""Where a flip may leave every read value unchanged, and why that is safe.

Also harmless: a flip that turns a stored instant into another spelling of
the same instant (``Z`` to ``z``), which reads back, and hashes, unchanged.
"""


# -- the world: every kind of record, written through the services ----------------


@dataclasses.dataclass(frozen=True)
class Catalog:
    """The ids the reference store holds, so every record can be asked for by name."""

    workflows: tuple[str, ...]
    workflow_states: tuple[str, ...]
    action_results: tuple[tuple[str, str], ...]
    scopes: tuple[str, ...]
    since: datetime
    results: tuple[str, ...]
    run_statuses: tuple[str, ...]
    definitions: tuple[str, ...]
    runs: tuple[str, ...]
    receipts: tuple[str, ...]
    checkpoints: tuple[str, ...]
    approvals: tuple[str, ...]
    witnesses: tuple[str, ...]


def _order(n: int, kind: str = "invoice.review") -> WorkOrder:
    return WorkOrder(
        kind=kind,
        parameters={"invoice": f"INV-{n}", "amount": 100 * n},
        requester=f"requester-{n}@example.org",
        idempotency_key=f"order-{n}",
    )


def _ask(
    runtime: Runtime, checkpoint_id: str, audience: str, lasts: timedelta = timedelta(hours=4)
) -> str:
    checkpoint = runtime.checkpoints.load_checkpoint(checkpoint_id)
    approval = runtime.approvals.request_approval(
        checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience=audience,
        prompt_digest=content_hash(f"prompt for {audience}"),
        allowed_decisions=["approve", "reject"],
        expires_at=runtime.clock.now() + lasts,
    )
    return approval.approval_id


def _checkpoint(runtime: Runtime, run_id: str, node: str, cursor: int) -> str:
    made = runtime.checkpoints.create_checkpoint(
        run_id,
        {"node": node},
        state={"node": node, "draft": "ok"},
        budgets={"tokens": 100 - cursor},
        counters={"nodes": cursor},
        dependency_summary={"tools": ["bank"]},
        terminal_cursor=None,
        event_cursor=cursor,
    )
    return made.checkpoint_id


def _orders() -> tuple[WorkOrder, ...]:
    """Return the work orders the workflows were created from, as a retry sends them again."""
    return (_order(1), _order(2), _order(3, "report"))


def _decision_receipt(runtime: Runtime, workflow_id: str) -> tuple[object, ...]:
    """Append the keyed decision receipt; a retry with the same event key returns the first."""
    return runtime.workflow_events.append_event(
        workflow_id,
        "decision.approved",
        expected_state="decision",
        expected_version=3,
        payload={"action_hash": ACTIONS[0], "approved": True, "decided_by": "dana@example.org"},
        event_key="decision-1",
    )


def _populate_workflows(runtime: Runtime, clock: FrozenClock) -> tuple[str, ...]:
    flows = runtime.workflows
    orders = _orders()
    first, _ = flows.create(orders[0])
    clock.advance()
    second, _ = flows.create(orders[1])
    third, _ = flows.create(orders[2])
    clock.advance()
    flows.transition(first.workflow_id, "planning", expected_state="intake", expected_version=1)
    flows.transition(first.workflow_id, "decision", expected_state="planning", expected_version=2)
    _decision_receipt(runtime, first.workflow_id)
    results = runtime.action_results
    results.put_action_result(first.workflow_id, ACTIONS[0], RESULTS[0])
    results.put_action_result(first.workflow_id, ACTIONS[1], RESULTS[1])
    results.put_action_result(second.workflow_id, ACTIONS[2], RESULTS[2])
    clock.advance()
    flows.transition(third.workflow_id, "cancelled", expected_state="intake", expected_version=1)
    return first.workflow_id, second.workflow_id, third.workflow_id


def _populate_state(runtime: Runtime, clock: FrozenClock) -> None:
    main = runtime.state("main")
    for step in (1, 2):
        main.update_with_events(
            lambda _, step=step: (
                WorkflowState(step=step, note=f"step {step}"),
                [HistoryEvent("state.step", {"step": step})],
            )
        )
        clock.advance()
    runtime.state("side").save(WorkflowState(flag=True))
    gone = runtime.state("gone")
    gone.save(WorkflowState(doomed=1))
    gone.reset(actor="ops", source="tamper-matrix")
    runtime.results.save(
        WorkflowResult(
            run_id="result-1",
            status="completed",
            started_at=clock.now(),
            finished_at=clock.now() + timedelta(seconds=5),
            output={"ok": 1},
        )
    )


def _populate_runs(runtime: Runtime, clock: FrozenClock) -> tuple[tuple[str, ...], list[str]]:
    runs = runtime.runs
    runtime.definitions.register_definition("flow.a", DEFINITION)
    clock.advance()
    done, _ = _start_first_run(runtime)
    runs.set_status(done.run_id, "running", expected_status="accepted")
    runs.append_run_events(done.run_id, [("node.done", {"node": "a"})])
    consumed = _checkpoint(runtime, done.run_id, "b", 2)
    runs.set_status(done.run_id, "awaiting_approval", expected_status="running")
    decided = _ask(runtime, consumed, "finance")
    clock.advance()
    runtime.approvals.decide(decided, "approve", "erin@example.org")
    runs.set_status(done.run_id, "running", expected_status="awaiting_approval")
    runs.finish_run(done.run_id, "completed", expected_status="running", final_state={"paid": 1})
    clock.advance()
    live, _ = runs.start_run("flow.a", {"invoice": "INV-10"})
    runs.set_status(live.run_id, "running", expected_status="accepted")
    older = _checkpoint(runtime, live.run_id, "b", 1)
    clock.advance()
    newer = _checkpoint(runtime, live.run_id, "c", 2)
    pending = _ask(runtime, newer, "legal")
    expired = _ask(runtime, older, "ops", EXPIRED_AFTER)
    return (done.run_id, live.run_id), [consumed, older, newer, decided, pending, expired]


def _start_first_run(runtime: Runtime) -> tuple[object, ...]:
    """Start the first run under its idempotency key; a retry returns the same run."""
    return runtime.runs.start_run(
        "flow.a", {"invoice": "INV-9"}, budgets={"tokens": 100}, idempotency_key="run-key-1"
    )


def _capture(runtime: Runtime) -> Witness:
    """Capture the witness; capturing the same bytes again returns the first witness."""
    return runtime.evidence.capture_witness(
        "https://example.org/inv-1", EVIDENCE, "text/plain", "primary", runtime.clock.now()
    )


TAGGED: Final = "host.tagged"
"""A host's namespace of sealed records carrying tags, listed by a tag filter."""


def _tag(runtime: Runtime, value: str) -> str:
    return runtime.repository.keyed_digest("tamper.tag", value)


def _populate_tagged(runtime: Runtime) -> None:
    """Write three tagged records: two share the tag ``red``, one carries ``blue`` alone."""
    for key, colours in (("t-1", ("red", "round")), ("t-2", ("red",)), ("t-3", ("blue",))):
        tags = frozenset(_tag(runtime, colour) for colour in colours)
        runtime.repository.write(TAGGED, key, {"key": key}, expected=Guard.ABSENT, tags=tags)


def _tagged_listing(runtime: Runtime, colour: str) -> list[object]:
    """Open every record a tag-filtered listing names, as a host filtering on a value does."""
    store, repository = runtime.store, runtime.repository
    page = store.list(TAGGED, filters=[TagFilter(_tag(runtime, colour))], limit=200)
    opened: list[object] = []
    for meta in page.items:
        record = store.load(meta.namespace, meta.key_digest)
        if record is None:
            raise AssertionError("a listed record vanished")
        sealed = repository.open(record, namespace=meta.namespace, key_digest=meta.key_digest)
        opened.append([meta, sealed.document])
    return opened


def populate(runtime: Runtime, clock: FrozenClock) -> Catalog:
    """Write one of everything through the services, in a fixed order under a frozen clock.

    The approvals are one decided, one pending and one expired (still stored
    as pending, its deadline passed: the clock ends past it).
    """
    workflows = _populate_workflows(runtime, clock)
    _populate_state(runtime, clock)
    runs, made = _populate_runs(runtime, clock)
    for key, request in REQUESTS:
        runtime.idempotency.remember(key, request, _response(key))
    _populate_tagged(runtime)
    witness = _capture(runtime)
    clock.advance(EXPIRED_AFTER * 2)
    return Catalog(
        workflows=workflows,
        workflow_states=("intake", "planning", "decision", "cancelled"),
        action_results=(
            (workflows[0], ACTIONS[0]),
            (workflows[0], ACTIONS[1]),
            (workflows[1], ACTIONS[2]),
        ),
        scopes=("main", "side", "gone"),
        since=clock.now() - timedelta(days=1),
        results=("result-1",),
        run_statuses=("accepted", "running", "completed"),
        definitions=("flow.a",),
        runs=runs,
        receipts=(runs[0],),
        checkpoints=tuple(made[:3]),
        approvals=tuple(made[3:]),
        witnesses=(witness.content_digest,),
    )


# -- reading everything back through the public API -------------------------------


@dataclasses.dataclass(frozen=True)
class Reader:
    """One public read (or retried call), its result as a list of items.

    ``universe`` pools the items of every reader that returns the same kind of
    value; a ``filtered`` reader selects through the label index, so under a
    flip in that index it may return another selection of that pool.
    ``family`` names the read without the record it reads, for the tallies.
    """

    name: str
    call: Callable[[], Sequence[object]]
    universe: str | None = None
    filtered: bool = False
    family: str = ""

    @property
    def kind(self) -> str:
        """The tally row: the family, or the name when none was given."""
        return self.family or self.name


def _default(value: object) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, frozenset):
        return sorted(value)
    raise TypeError(type(value).__name__)


def _receipt(store: SecureObjectStore, repository: KeyedDigester, stream: str) -> str:
    """Return a head receipt issued at a fixed instant, so equal heads give equal text."""
    return issue_receipt(store, repository, stream, issued_at=EPOCH).text()


def canonical(value: object) -> str:
    """Return ``value`` as canonical JSON text, so equal values compare byte for byte."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_default)


def ledger_verify(runtime: Runtime) -> list[object]:
    """Run what ``flowvault ledger verify --all`` runs with the store's key; fail as it does.

    With the key every event's ``chain_mac`` is checked too, every bound
    record is held to its stream and the store is compared with its
    high-water mark. It fails on ``ok`` false, as the CLI's exit status does.
    """
    report = runtime.audit().run()
    if not report.ok:
        found = [
            f"{failure.defect.value} in {failure.stream} at {failure.index}"
            for failure in report.failures[:3]
        ]
        found += [f"stale record in {stale.stream}" for stale in report.stale[:3]]
        if report.unreadable_count:
            found.append(f"{report.unreadable_count} unreadable record(s)")
        if report.rolled_back is not None:
            found.append("below the high-water mark")
        where = ", ".join(found)
        raise IntegrityFailure(f"ledger verify failed: {where}", failed=len(report.failures))
    return [report]


def _open_everything(runtime: Runtime) -> list[object]:
    """Open every record of every namespace the store reports, as ``ledger verify --all`` does."""
    store, repository = runtime.store, runtime.repository
    opened: list[object] = []
    for namespace in sorted(store.namespace_counts()):
        cursor: str | None = None
        while True:
            page = store.list(namespace, cursor=cursor, limit=200)
            for meta in page.items:
                record = store.load(meta.namespace, meta.key_digest)
                if record is None:
                    raise AssertionError("a listed record vanished")
                sealed = repository.open(
                    record, namespace=meta.namespace, key_digest=meta.key_digest
                )
                opened.append([meta, sealed.metadata, sealed.document])
            cursor = page.next_cursor
            if cursor is None:
                break
    return opened


def audited_receipt(runtime: Runtime, stream: str) -> str:
    """Return what ``ledger head`` issues (keyed verify first) at a fixed instant."""
    audit = LedgerAudit(runtime.store, runtime.repository)
    return audit.issue(stream, issued_at=EPOCH).text()


def _store_readers(runtime: Runtime, streams: Sequence[str]) -> Iterator[Reader]:
    yield Reader("records", lambda: _open_everything(runtime))
    for colour in ("red", "blue"):
        yield Reader(
            f"tagged {colour}",
            lambda colour=colour: _tagged_listing(runtime, colour),
            "tagged",
            filtered=True,
            family="tag filter",
        )
    yield Reader(AUDIT_READER, lambda: ledger_verify(runtime))
    for name in streams:
        yield Reader(
            f"head receipt {name}",
            lambda name=name: [audited_receipt(runtime, name)],
            family="ledger head receipt",
        )


def _workflow_readers(runtime: Runtime, catalog: Catalog) -> Iterator[Reader]:
    flows, events, results = runtime.workflows, runtime.workflow_events, runtime.action_results
    yield Reader("workflows", lambda: refused(flows.list_workflows(limit=200)), "workflows")
    for state in catalog.workflow_states:
        yield Reader(
            f"workflows in {state}",
            lambda state=state: refused(flows.list_workflows(state, limit=200)),
            "workflows",
            filtered=True,
            family="workflows in a state",
        )
    for workflow in catalog.workflows:
        yield Reader(
            f"workflow {workflow}",
            lambda w=workflow: [flows.get(w)],
            "workflows",
            family="workflow",
        )
        yield Reader(
            f"workflow events {workflow}",
            lambda w=workflow: events.events(w),
            family="audit: workflow events",
        )
        yield Reader(
            f"action results of {workflow}",
            lambda w=workflow: results.list_action_results(w),
            "listed results",
            filtered=True,
            family="action results of a workflow",
        )
    for workflow, action in catalog.action_results:
        yield Reader(
            f"action result {workflow} {action[7:19]}",
            lambda w=workflow, a=action: [results.get_action_result(w, a)],
            family="action result",
        )


def _state_readers(runtime: Runtime, catalog: Catalog) -> Iterator[Reader]:
    for scope in catalog.scopes:
        state = runtime.state(scope)
        yield Reader(f"state {scope}", lambda s=state: [s.load(), s.fingerprint()], family="state")
        yield Reader(f"history {scope}", lambda s=state: s.history(), family="audit: state history")
    yield Reader("run results", lambda: refused(runtime.results.list(limit=200)), "results")
    yield Reader(
        "run results since",
        lambda: refused(runtime.results.list(since=catalog.since, limit=200)),
        "results",
        filtered=True,
    )
    for result in catalog.results:
        yield Reader(
            f"run result {result}",
            lambda r=result: [runtime.results.load(r)],
            "results",
            family="run result",
        )


RUN_EVENT_PAGE: Final = 2
"""Page size of the paged run-event reads, so a run's events take several pages."""


def paged_run_events(runtime: Runtime, run_id: str) -> list[object]:
    """Read a run's events as a client does: small pages, following ``next_cursor``."""
    pages: list[object] = []
    cursor: int | None = None
    while True:
        page = runtime.runs.read_run_events(run_id, cursor, limit=RUN_EVENT_PAGE)
        pages.append(page)
        if page.next_cursor is None:
            return pages
        if len(pages) > 1000 or (cursor is not None and page.next_cursor <= cursor):
            raise AssertionError(f"run event cursors do not advance: {page.next_cursor}")
        cursor = page.next_cursor


def _graph_readers(runtime: Runtime, catalog: Catalog) -> Iterator[Reader]:
    runs = runtime.runs
    yield Reader("graph runs", lambda: refused(runs.list_runs(limit=200)), "graph runs")
    for status in catalog.run_statuses:
        yield Reader(
            f"graph runs {status}",
            lambda s=status: refused(runs.list_runs(s, limit=200)),
            "graph runs",
            filtered=True,
            family="graph runs in a status",
        )
    for definition in catalog.definitions:
        yield Reader(
            f"definition {definition}",
            lambda d=definition: list(runtime.definitions.get_definition(d)),
        )
        yield Reader(
            f"definition versions {definition}",
            lambda d=definition: runtime.definitions.definition_versions(d),
            "definition versions",
            filtered=True,
        )
    for run in catalog.runs:
        yield Reader(
            f"graph run {run}", lambda r=run: [runs.get_run(r)], "graph runs", family="graph run"
        )
        yield Reader(
            f"run events {run}",
            lambda r=run: paged_run_events(runtime, r),
            family="audit: run events (paged)",
        )
    for run in catalog.receipts:
        yield Reader(
            f"terminal receipt {run}",
            lambda r=run: [runtime.receipts.terminal_receipt(r)],
            family="terminal receipt",
        )


def _approval_readers(runtime: Runtime, catalog: Catalog) -> Iterator[Reader]:
    checkpoints, approvals = runtime.checkpoints, runtime.approvals
    for checkpoint in catalog.checkpoints:
        yield Reader(
            f"checkpoint {checkpoint}",
            lambda c=checkpoint: [checkpoints.load_checkpoint(c)],
            "checkpoints",
            family="checkpoint",
        )
    for run in catalog.runs:
        yield Reader(
            f"latest checkpoint {run}",
            lambda r=run: [c for c in [checkpoints.latest_checkpoint(r)] if c is not None],
            "checkpoints",
            filtered=True,
            family="latest checkpoint",
        )
        yield Reader(
            f"approvals of {run}",
            lambda r=run: refused(approvals.list_approvals(r, limit=200)),
            "approvals",
            filtered=True,
            family="approvals of a run",
        )
        for status in ApprovalStatus:
            yield Reader(
                f"approvals of {run} {status.value}",
                lambda r=run, s=status: refused(approvals.list_approvals(r, s, limit=200)),
                "approvals",
                filtered=True,
                family="approvals of a run in a status",
            )
    for approval in catalog.approvals:
        yield Reader(
            f"approval {approval}",
            lambda a=approval: [approvals.get_approval(a)],
            "approvals",
            family="approval",
        )
        yield Reader(
            f"approval receipt {approval}",
            lambda a=approval: [approvals.approval_receipt(approvals.get_approval(a))],
            family="approval receipt",
        )
    for key, request in REQUESTS:
        yield Reader(
            f"idempotency {key}",
            lambda k=key, r=request: [runtime.idempotency.recall(k, r)],
            family="idempotency recall",
        )
    for witness in catalog.witnesses:
        yield Reader(
            f"witness {witness[7:19]}",
            lambda w=witness: [runtime.evidence.load_witness(w)],
            family="witness",
        )


def readers(runtime: Runtime, catalog: Catalog, streams: Sequence[str]) -> list[Reader]:
    """Every public read of the reference store, cheapest checks first.

    The audit reads are the services' own (``events``, ``history``, paged
    ``read_run_events``) and the keyed ``ledger verify --all`` (failing as
    the CLI does, on ``ok`` false) and ``ledger head``. The store port's own
    reads (``read_stream``, the unverified pager the audit reads are built
    on, and the namespace, key id and stream catalogues, counts of
    unauthenticated columns) are read only by the negative control.
    """
    return [
        *_store_readers(runtime, streams),
        *_workflow_readers(runtime, catalog),
        *_state_readers(runtime, catalog),
        *_graph_readers(runtime, catalog),
        *_approval_readers(runtime, catalog),
    ]


@dataclasses.dataclass(frozen=True)
class Asked:
    """An approval request's arguments, taken from the pristine store, to send it again."""

    approval_id: str
    checkpoint_id: str
    arguments: dict[str, Any]


def asked(runtime: Runtime, catalog: Catalog) -> list[Asked]:
    """Return every approval's request as the caller sent it (read while the store is pristine)."""
    found = []
    for approval_id in catalog.approvals:
        approval = runtime.approvals.get_approval(approval_id)
        checkpoint = runtime.checkpoints.load_checkpoint(approval.checkpoint_id)
        arguments = {
            "expected_state_digest": checkpoint.state_digest,
            "expected_budgets": checkpoint.budgets,
            "expected_counters": checkpoint.counters,
            "expected_dependency_digest": checkpoint.dependency_digest,
            "audience": approval.audience,
            "prompt_digest": approval.prompt_digest,
            "allowed_decisions": list(approval.allowed_decisions),
            "expires_at": approval.expires_at,
        }
        found.append(Asked(approval_id, approval.checkpoint_id, arguments))
    return found


def retries(runtime: Runtime, catalog: Catalog, requests: Sequence[Asked]) -> list[Reader]:
    """Every idempotent call the services offer, sent again exactly as first sent.

    Each must return what it returned the first time on the pristine store
    (a value, or the typed refusal a repeat gets: an approval decided or a
    checkpoint consumed already) or raise a typed error, and never write a
    second record or event. They write when wrong, so they run after the
    pure reads, on the tampered copy.
    """
    flows, approvals = runtime.workflows, runtime.approvals
    calls: list[Reader] = [
        Reader(
            f"retry create {order.idempotency_key}",
            lambda o=order: list(flows.create(o)),
            family="retry: workflows.create",
        )
        for order in _orders()
    ]
    calls.append(
        Reader(
            "retry append_event decision-1",
            lambda: list(_decision_receipt(runtime, catalog.workflows[0])),
            family="retry: workflow_events.append_event (event key)",
        )
    )
    for (workflow, action), result in zip(catalog.action_results, RESULTS, strict=True):
        calls.append(
            Reader(
                f"retry put_action_result {workflow} {action[7:19]}",
                lambda w=workflow, a=action, r=result: [
                    runtime.action_results.put_action_result(w, a, r)
                ],
                family="retry: action_results.put_action_result",
            )
        )
    calls += [
        Reader(
            "retry start_run run-key-1",
            lambda: list(_start_first_run(runtime)),
            family="retry: graph_runs.start_run (idempotency key)",
        ),
        Reader(
            "retry register_definition flow.a",
            lambda: [runtime.definitions.register_definition("flow.a", DEFINITION)],
            family="retry: definitions.register_definition",
        ),
    ]
    for request in requests:
        calls.append(
            Reader(
                f"retry request_approval {request.approval_id}",
                lambda q=request: [approvals.request_approval(q.checkpoint_id, **q.arguments)],
                family="retry: approvals.request_approval",
            )
        )
    calls += [
        Reader(
            f"retry decide {catalog.approvals[0]}",
            lambda: list(approvals.decide(catalog.approvals[0], "approve", "erin@example.org")),
            family="retry: approvals.decide (decided)",
        ),
        Reader(
            f"retry consume {catalog.checkpoints[0]}",
            lambda: [runtime.checkpoints.consume_checkpoint(catalog.checkpoints[0])],
            family="retry: checkpoints.consume_checkpoint (consumed)",
        ),
    ]
    for key, request in REQUESTS:
        calls.append(
            Reader(
                f"retry remember {key}",
                lambda k=key, r=request: [runtime.idempotency.remember(k, r, _response(k))],
                family="retry: idempotency.remember",
            )
        )
    calls.append(
        Reader("retry capture_witness", lambda: [_capture(runtime)], family="retry: evidence")
    )
    return calls


def raw_readers(store: SecureObjectStore, streams: Sequence[str]) -> list[Reader]:
    """Return the negative control's reads: rows as stored, no seal opened, no chain verified."""

    def rows() -> list[object]:
        found: list[object] = []
        for namespace in sorted(store.namespace_counts()):
            for meta in store.list(namespace, limit=200).items:
                record = store.load(meta.namespace, meta.key_digest)
                found.append([meta, None if record is None else record.payload])
        return found

    ledgers = [
        Reader(f"raw events {name}", lambda name=name: list(read_stream(store, name)))
        for name in streams
    ]
    catalog = Reader(
        "raw catalog",
        lambda: [store.namespace_counts(), store.key_id_counts(), list_all_streams(store)],
    )
    return [Reader("raw records", rows), catalog, *ledgers]


Snapshot = dict[str, tuple[str, ...]]


def read_all(chosen: Sequence[Reader]) -> Snapshot:
    """Run every reader; the first error propagates, tagged with the reader's name."""
    snapshot: Snapshot = {}
    for reader in chosen:
        try:
            snapshot[reader.name] = tuple(canonical(item) for item in reader.call())
        except Exception as exc:
            exc.add_note(f"reader: {reader.name}")
            raise
    return snapshot


def universes(chosen: Sequence[Reader], reference: Snapshot) -> dict[str, frozenset[str]]:
    """Pool the reference items of the readers that share a universe."""
    pools: dict[str, set[str]] = defaultdict(set)
    for reader in chosen:
        if reader.universe is not None:
            pools[reader.universe].update(reference[reader.name])
    return {name: frozenset(items) for name, items in pools.items()}


# -- classifying one trial ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one trial did: ``detected``, ``harmless``, a known limit, or an ``anomaly``."""

    kind: str
    label: str
    where: str = ""
    message: str = ""

    @property
    def key(self) -> str:
        """The tally key: the outcome and, for detections, the code."""
        return self.kind if self.kind in {"harmless", "index", "receipt"} else self.label


def _reader_of(exc: BaseException) -> str:
    notes = [note for note in getattr(exc, "__notes__", []) if note.startswith("reader: ")]
    return notes[-1].removeprefix("reader: ") if notes else "?"


def classify(
    chosen: Sequence[Reader],
    reference: Snapshot,
    pools: Mapping[str, frozenset[str]],
    *,
    flip: Flip | None = None,
    tolerated: frozenset[str] = frozenset(),
) -> Outcome:
    """Read everything back and say how the store answered the tampering.

    A known limit in ``tolerated`` applies only to the cells it concerns: the
    label index (``index``), or ledger event rows whose change shows in a
    head receipt (``receipt``).
    """
    try:
        got = read_all(chosen)
    except FlowvaultError as exc:
        kind = "detected" if exc.code in INTEGRITY_CODES else "anomaly"
        return Outcome(kind, exc.code, _reader_of(exc), exc.message)
    except Exception as exc:
        return Outcome("anomaly", f"foreign {type(exc).__name__}", _reader_of(exc))
    changed = [name for name in reference if got[name] != reference[name]]
    if not changed:
        return Outcome("harmless", "harmless")
    by_name = {reader.name: reader for reader in chosen}
    selection_only = all(
        by_name[name].filtered and set(got[name]) <= pools[by_name[name].universe or ""]
        for name in changed
    )
    if "index" in tolerated and flip is not None and flip.in_index and selection_only:
        return Outcome("index", "index", ", ".join(changed))
    in_ledger = flip is not None and flip.table == "ledger_events"
    if "receipt" in tolerated and in_ledger and any(n.startswith("head receipt ") for n in changed):
        return Outcome("receipt", "receipt", ", ".join(changed))
    return Outcome("anomaly", "silently wrong", ", ".join(changed))


# -- flipping one byte of one stored cell ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Flip:
    """One tampered cell: where it is now, what it held, what it holds."""

    table: str
    column: str
    key: tuple[object, ...]
    original: object
    tampered: object
    written_as: str
    """How the tampered value is written back: a SQL placeholder (SQLite) or a type (PostgreSQL)."""

    @property
    def cell(self) -> str:
        """``table.column``, the tally's row."""
        return f"{self.table}.{self.column}"

    @property
    def in_index(self) -> bool:
        """Whether the cell belongs to the label index or the id it joins on."""
        return self.table in {"record_labels", "record_tags"} or self.cell in INDEX_CELLS

    def describe(self) -> str:
        """Name the cell and the change, for a failure message."""
        return f"{self.cell} at {self.key!r}: {self.original!r} -> {self.tampered!r}"


PRIMARY_KEYS: Final = {
    "records": ("id",),
    "record_labels": ("record_id", "name"),
    "record_tags": ("record_id", "tag"),
    "ledger_events": ("stream", "idx"),
    "ledger_streams": ("stream",),
}
"""Every table an adapter stores, and how to address one of its rows."""
SQLITE_PRIMARY_KEYS: Final = {**PRIMARY_KEYS, "store_epoch": ("id",)}
"""SQLite's tables: its epoch is a one-row table (PostgreSQL's a sequence, no table)."""


def _moved(
    keys: Sequence[str], key: tuple[object, ...], column: str, value: object
) -> tuple[object, ...]:
    """Return the row's primary key after ``column`` took ``value``."""
    return tuple(value if name == column else part for name, part in zip(keys, key, strict=True))


def flip_integer(value: int, rng: random.Random) -> int:
    """XOR one byte of the value's shortest two's-complement form, kept within 64 bits."""
    width = max(1, (value.bit_length() + 8) // 8)
    mask = rng.randrange(1, 256) << (8 * rng.randrange(width))
    flipped = (value & (2**64 - 1)) ^ mask
    return flipped - 2**64 if flipped >= 2**63 else flipped


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    """XOR one random byte with a random non-zero mask."""
    changed = bytearray(data)
    changed[rng.randrange(len(changed))] ^= rng.randrange(1, 256)
    return bytes(changed)


class SQLiteCells:
    """Raw access to the database file, as an attacker with write access has it."""

    REFUSED_COLUMNS: Final = frozenset({("store_epoch", "id")})
    """``CHECK (id = 1)``: SQLite refuses every flip of the epoch row's id."""

    def __init__(self, path: Path) -> None:
        self.raw = sqlite3.connect(path, isolation_level=None)
        self._cells: dict[tuple[str, str], list[Any]] = {}

    def _rows(self, table: str, column: str) -> list[Any]:
        """Return the column's non-null cells with their keys, read once.

        Valid for as long as every flip is restored before the next one.
        """
        if (table, column) not in self._cells:
            listed = ", ".join(SQLITE_PRIMARY_KEYS[table])
            self._cells[(table, column)] = self.raw.execute(
                f"SELECT {listed}, {column}, typeof({column}), CAST({column} AS BLOB) "  # noqa: S608
                f"FROM {table} WHERE {column} IS NOT NULL ORDER BY {listed}"
            ).fetchall()
        return self._cells[(table, column)]

    def close(self) -> None:
        """Close the raw connection."""
        self.raw.close()

    def columns(self) -> list[tuple[str, str]]:
        """Every ``(table, column)`` the adapter stores."""
        return [
            (table, row[1])
            for table in SQLITE_PRIMARY_KEYS
            for row in self.raw.execute(f"PRAGMA table_info({table})")
            if (table, row[1]) not in self.REFUSED_COLUMNS
        ]

    def flip(self, table: str, column: str, rng: random.Random) -> Flip | None:
        """Flip one byte of one non-null cell; ``None`` when the schema refuses the value.

        Text is flipped in its stored UTF-8 bytes and written back as text, so
        it may no longer be valid UTF-8; integers in their two's complement.
        """
        keys = SQLITE_PRIMARY_KEYS[table]
        rows = self._rows(table, column)
        if not rows:
            return None
        row = rng.choice(rows)
        key, (value, kind, stored) = tuple(row[: len(keys)]), row[len(keys) :]
        written_as = "CAST(? AS TEXT)" if kind == "text" else "?"
        tampered: object = (
            flip_integer(value, rng) if kind == "integer" else flip_bytes(stored, rng)
        )
        where = " AND ".join(f"{name} = ?" for name in keys)
        try:
            self.raw.execute(
                f"UPDATE {table} SET {column} = {written_as} WHERE {where}",  # noqa: S608
                (tampered, *key),
            )
        except sqlite3.IntegrityError:
            return None
        return Flip(table, column, _moved(keys, key, column, tampered), value, tampered, written_as)

    def restore(self, flip: Flip) -> None:
        """Put the original value back, addressing the row where the flip left it."""
        keys = SQLITE_PRIMARY_KEYS[flip.table]
        where = " AND ".join(
            f"{name} = {flip.written_as if name == flip.column else '?'}" for name in keys
        )
        cursor = self.raw.execute(
            f"UPDATE {flip.table} SET {flip.column} = ? WHERE {where}",  # noqa: S608
            (flip.original, *flip.key),
        )
        assert cursor.rowcount == 1, f"could not restore {flip.describe()}"

    def dump(self) -> list[list[tuple[object, ...]]]:
        """Every row of every table, to prove restores leave the file as it was.

        Text that a flip left undecodable is kept with its bad bytes escaped,
        so a dump taken under a flip compares; only a pristine dump is put back.
        """
        self.raw.text_factory = lambda data: data.decode("utf-8", "surrogateescape")
        try:
            return [
                self.raw.execute(f"SELECT * FROM {table} ORDER BY {', '.join(keys)}").fetchall()  # noqa: S608
                for table, keys in SQLITE_PRIMARY_KEYS.items()
            ]
        finally:
            self.raw.text_factory = str

    def put_back(self, dump: Sequence[Sequence[tuple[object, ...]]]) -> None:
        """Put every table back as ``dump`` holds it (after a retry wrote)."""
        restore_tables(self.raw, dump)

    def row_counts(self) -> tuple[int, ...]:
        """How many records and ledger events the file holds, to see a retry add one."""
        row = self.raw.execute(
            "SELECT (SELECT count(*) FROM records), (SELECT count(*) FROM ledger_events)"
        ).fetchone()
        return tuple(row)


# -- judging every reader on its own ------------------------------------------------------

RIGHT: Final = "right"
DETECTED: Final = "detected"
TYPED: Final = "other typed error"
INDEX: Final = "index"
MOVED: Final = "moved"
RECEIPT: Final = "receipt"
WRONG: Final = "silently wrong"
FOREIGN: Final = "foreign error"
DUPLICATE: Final = "duplicate written"
READER_OUTCOMES: Final = (
    RIGHT,
    DETECTED,
    TYPED,
    INDEX,
    MOVED,
    RECEIPT,
    WRONG,
    FOREIGN,
    DUPLICATE,
)
"""What one reader did in one trial, in the order the tallies show them."""
ANOMALOUS: Final = frozenset({WRONG, FOREIGN, DUPLICATE})


@dataclasses.dataclass(frozen=True)
class Answer:
    """What one reader returned: its items, a typed error's code, or a foreign exception."""

    kind: str
    """``value``, ``error`` (a flowvault error) or ``foreign`` (any other exception)."""
    items: tuple[str, ...] = ()
    code: str = ""
    message: str = ""


def answer(reader: Reader) -> Answer:
    """Run one reader on its own; whatever it raises is its answer, not the trial's end."""
    try:
        return Answer("value", tuple(canonical(item) for item in reader.call()))
    except FlowvaultError as exc:
        return Answer("error", code=exc.code, message=exc.message)
    except Exception as exc:
        return Answer("foreign", code=type(exc).__name__, message=str(exc)[:300])


Answers = dict[str, Answer]


def answer_all(chosen: Sequence[Reader]) -> Answers:
    """Run every reader independently."""
    return {reader.name: answer(reader) for reader in chosen}


def judge_reader(
    reader: Reader,
    got: Answer,
    expected: Answer,
    pools: Mapping[str, frozenset[str]],
    *,
    flip: Flip | None,
    tolerated: frozenset[str],
) -> str:
    """Say what one reader did: the reference answer, a typed error, or something wrong.

    A typed error is an integrity code (``detected``) or another flowvault
    error; the reference may itself be a typed refusal (a retried decision
    gets ``APPROVAL_ALREADY_DECIDED``), and then the same code is right.
    Known limits in ``tolerated`` apply only to the cells and readers they
    concern: a filtered listing under a flipped label index (``index``), a
    head receipt under a flipped ledger row (``receipt``, PostgreSQL).
    """
    if got.kind != "value":
        if got.kind == "foreign":
            return FOREIGN
        if expected.kind == "error" and got.code == expected.code:
            return RIGHT
        return DETECTED if got.code in INTEGRITY_CODES else TYPED
    if expected.kind == "value" and got.items == expected.items:
        return RIGHT
    pool = pools.get(reader.universe or "", frozenset())
    in_pool = expected.kind == "value" and set(got.items) <= pool
    genuine = expected.kind == "value" and set(got.items) <= pool | set(expected.items)
    limits = {
        INDEX: flip is not None and flip.in_index and reader.filtered and in_pool,
        MOVED: flip is not None
        and flip.cell in ADDRESS_CELLS
        and reader.universe is not None
        and genuine,
        RECEIPT: flip is not None
        and flip.table == "ledger_events"
        and reader.name.startswith("head receipt "),
    }
    return next((limit for limit, holds in limits.items() if holds and limit in tolerated), WRONG)


@dataclasses.dataclass(frozen=True)
class Trial:
    """Every reader's outcome in one trial, with the codes of the errors they raised."""

    outcomes: dict[str, str]
    codes: dict[str, str]

    @property
    def kind(self) -> str:
        """The trial's outcome: ``anomaly`` if any reader was wrong, else the strongest answer."""
        seen = set(self.outcomes.values())
        if seen & ANOMALOUS:
            return "anomaly"
        for kind in (DETECTED, TYPED, INDEX, MOVED, RECEIPT):
            if kind in seen:
                return kind
        return "harmless"


@dataclasses.dataclass
class Bench:
    """A populated store under test: its readers, retries, reference answers and raw cells."""

    cells: Any
    """``SQLiteCells`` or ``PostgresCells``: flip, restore, dump, put_back, row_counts."""
    readers: list[Reader]
    retries: list[Reader]
    reference: Answers
    pools: dict[str, frozenset[str]]
    tolerated: frozenset[str]

    def judge(self, flip: Flip | None, chosen: Sequence[Reader] | None = None) -> Trial:
        """Run every pure reader on its own and judge each against the reference."""
        outcomes: dict[str, str] = {}
        codes: dict[str, str] = {}
        for reader in self.readers if chosen is None else chosen:
            got = answer(reader)
            outcomes[reader.name] = judge_reader(
                reader,
                got,
                self.reference[reader.name],
                self.pools,
                flip=flip,
                tolerated=self.tolerated,
            )
            if got.kind != "value":
                codes[reader.name] = got.code
        if outcomes.get(AUDIT_READER, DETECTED) != DETECTED:
            outcomes = {name: WRONG if o == MOVED else o for name, o in outcomes.items()}
        return Trial(outcomes, codes)

    def retry(self, flip: Flip | None, trial: Trial) -> bool:
        """Send every idempotent call again, each on its own; return whether any wrote.

        A retry that adds a record or an event is ``duplicate written``
        whatever it returned.
        """
        before = self.cells.dump()
        for reader in self.retries:
            counts = self.cells.row_counts()
            got = answer(reader)
            outcome = judge_reader(
                reader,
                got,
                self.reference[reader.name],
                self.pools,
                flip=flip,
                tolerated=self.tolerated,
            )
            if self.cells.row_counts() != counts:
                outcome = DUPLICATE
            trial.outcomes[reader.name] = outcome
            if got.kind != "value":
                trial.codes[reader.name] = got.code
        return bool(self.cells.dump() != before)


def take_reference(
    cells: Any, chosen: Sequence[Reader], again: Sequence[Reader]
) -> tuple[Answers, dict[str, frozenset[str]]]:
    """Answer every reader and retry on the pristine store; no retry may write there."""
    reference = answer_all(chosen)
    failed = {name: got for name, got in reference.items() if got.kind != "value"}
    assert not failed, f"the pristine store fails its own reads: {failed}"
    before = cells.dump()
    retried = answer_all(again)
    assert cells.dump() == before, "a retry wrote on the pristine store"
    assert all(got.kind != "foreign" for got in retried.values()), retried
    snapshot = {name: got.items for name, got in reference.items()}
    return {**reference, **retried}, universes(chosen, snapshot)


# -- the matrix driver ----------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    """Trials per cell by outcome, every reader's outcomes, and the anomalies' replay data."""

    cells: dict[str, Counter[str]] = dataclasses.field(default_factory=lambda: defaultdict(Counter))
    readers: dict[str, Counter[str]] = dataclasses.field(
        default_factory=lambda: defaultdict(Counter)
    )
    """Per reader family, how often each outcome occurred."""
    codes: dict[str, Counter[str]] = dataclasses.field(default_factory=lambda: defaultdict(Counter))
    """Per reader family, the codes of the errors it raised."""
    wrong_cells: dict[str, Counter[str]] = dataclasses.field(
        default_factory=lambda: defaultdict(Counter)
    )
    """Per reader family, the cells whose flips it read wrong."""
    anomalies: list[str] = dataclasses.field(default_factory=list)
    refused: int = 0
    trials: int = 0
    wrote: int = 0
    """Trials in which a retry wrote (the whole pristine store was then put back)."""

    def add(self, flip: Flip, trial: Trial, kinds: Mapping[str, str], context: str) -> None:
        """Count one trial; keep the anomalies' details."""
        self.trials += 1
        self.cells[flip.cell][trial.kind] += 1
        for name, outcome in trial.outcomes.items():
            family = kinds[name]
            self.readers[family][outcome] += 1
            if name in trial.codes:
                self.codes[family][trial.codes[name]] += 1
            if outcome in ANOMALOUS:
                self.wrong_cells[family][flip.cell] += 1
                self.anomalies.append(f"{context}: {flip.describe()} -> {name}: {outcome}")

    def totals(self) -> Counter[str]:
        """Trial outcome counts over every cell."""
        total: Counter[str] = Counter()
        for counts in self.cells.values():
            total.update(counts)
        return total

    def reader_totals(self) -> Counter[str]:
        """Reader outcome counts over every reader and trial."""
        total: Counter[str] = Counter()
        for counts in self.readers.values():
            total.update(counts)
        return total

    def failing(self) -> list[str]:
        """One line per reader family that read wrong: how often, and under which cells."""
        lines = []
        for family in sorted(self.wrong_cells):
            counts = self.readers[family]
            wrong = {kind: counts[kind] for kind in READER_OUTCOMES if kind in ANOMALOUS}
            cells = ", ".join(f"{cell} {n}" for cell, n in self.wrong_cells[family].most_common())
            shown = ", ".join(f"{kind} {n}" for kind, n in wrong.items() if n)
            lines.append(f"{family}: {shown} (cells: {cells})")
        return lines

    def table(self) -> str:
        """Return the per-column and per-reader tallies as text, for the test log."""
        lines = [f"{'table.column':32} trials  outcomes"]
        for cell in sorted(self.cells):
            counts = self.cells[cell]
            shown = ", ".join(f"{key} {n}" for key, n in sorted(counts.items()))
            lines.append(f"{cell:32} {sum(counts.values()):6}  {shown}")
        lines.append(f"\n{'reader':48} " + " | ".join(READER_OUTCOMES))
        for family in sorted(self.readers):
            counts = self.readers[family]
            lines.append(f"{family:48} " + " | ".join(str(counts[k]) for k in READER_OUTCOMES))
        lines.append("\nerror codes per reader:")
        for family in sorted(self.codes):
            shown = ", ".join(f"{code} {n}" for code, n in self.codes[family].most_common())
            lines.append(f"{family:48} {shown}")
        return "\n".join(lines)

    def summary(self) -> str:
        """One line for the figure's detail column."""
        totals, reads = self.totals(), self.reader_totals()
        per_reader = ", ".join(f"{kind} {reads[kind]}" for kind in READER_OUTCOMES if reads[kind])
        return (
            f"{len(self.cells)} columns, {len(self.readers)} reader kinds; trials: detected "
            f"{totals[DETECTED]}, other typed error only {totals[TYPED]}, harmless "
            f"{totals['harmless']}, label index only {totals[INDEX]}, head receipt only "
            f"{totals[RECEIPT]}, anomalous {totals['anomaly']}; reads: {per_reader}; "
            f"retries wrote in {self.wrote}; refused by the schema {self.refused}"
        )


def explain(tally: Tally) -> str:
    """Return the tally with the known limits and harmless columns spelt out, for the log."""
    notes = [f"known limit {name}: {text}" for name, text in KNOWN_LIMITS.items()]
    notes += [f"harmless {cell}: {why}" for cell, why in HARMLESS.items()]
    failing = ["readers that read wrong:", *tally.failing()] if tally.anomalies else []
    return "\n".join([tally.table(), *failing, *notes])


CrossCheck = Callable[[Flip, Trial], None]


def run_flips(
    bench: Bench,
    columns: Sequence[tuple[str, str]],
    *,
    trials: int,
    seed: int,
    cross_check: CrossCheck | None = None,
    cross_every: int = 0,
) -> Tally:
    """Flip ``trials`` cells, each column in turn (shuffled per seed), and read everything back.

    Per trial: every pure reader runs on its own; every ``cross_every``-th
    trial a fresh runtime must judge each reader the same; then every retry
    runs on the tampered copy. The flip is undone, or the whole pristine
    store put back when a retry wrote.
    """
    rng = random.Random(seed)
    order = list(columns)
    rng.shuffle(order)
    tally = Tally()
    kinds = {reader.name: reader.kind for reader in [*bench.readers, *bench.retries]}
    pristine = bench.cells.dump()
    attempts = 0
    while tally.trials < trials:
        table, column = order[tally.trials % len(order)]
        attempts += 1
        assert attempts < 50 * trials, f"seed {seed}: the schema refuses too many flips"
        flip = bench.cells.flip(table, column, rng)
        if flip is None:
            tally.refused += 1
            continue
        wrote = False
        try:
            trial = bench.judge(flip)
            due = cross_every and tally.trials % cross_every == 0 and not tally.wrote
            if cross_check is not None and due:
                cross_check(flip, trial)
            wrote = bench.retry(flip, trial)
            tally.add(flip, trial, kinds, f"seed {seed} trial {tally.trials}")
        finally:
            if wrote:
                tally.wrote += 1
                bench.cells.put_back(pristine)
            else:
                bench.cells.restore(flip)
    return tally


def settle_flips(
    backend: str,
    *,
    seed: int,
    tally: Tally,
    control: Tally,
    columns: Sequence[tuple[str, str]],
    seconds: float,
    control_note: str,
) -> None:
    """Record a byte-flip run's figures; then every column hit, control caught, 0 anomalies."""
    print(f"\nseed {seed}\n{explain(tally)}\ncontrol: {control.reader_totals()}")
    reliability.record(
        reliability.Figure(
            family=f"Tamper matrix, random byte flips ({backend})",
            trials=tally.trials,
            anomalies=tally.totals()["anomaly"],
            control_caught=control.reader_totals()[WRONG] > 0,
            detail=f"{tally.summary()}; {control_note} silently wrong in "
            f"{control.totals()['anomaly']} of {control.trials}",
            seconds=seconds,
        )
    )
    assert set(tally.cells) == {f"{table}.{column}" for table, column in columns}
    assert control.reader_totals()[WRONG], "the negative control saw no silently changed data"
    assert not tally.anomalies, "\n".join(
        [f"{len(tally.anomalies)} wrong reads:", *tally.failing(), *tally.anomalies[:10]]
    )


def control_flips(
    cells: Any,
    store: SecureObjectStore,
    streams: Sequence[str],
    columns: Sequence[tuple[str, str]],
    *,
    seed: int,
    trials: int,
) -> Tally:
    """Replay the first flips of the same seed against reads that open no seal, verify no chain."""
    raw = raw_readers(store, streams)
    reference, _ = take_reference(cells, raw, [])
    bench = Bench(cells, raw, [], reference, {}, frozenset())
    return run_flips(bench, columns, trials=trials, seed=seed)


# -- the SQLite world -------------------------------------------------------------------


@dataclasses.dataclass
class World:
    """A populated SQLite home, its runtime, the reference snapshot and raw access."""

    home: Path
    clock: FrozenClock
    runtime: Runtime
    catalog: Catalog
    streams: list[str]
    readers: list[Reader]
    reference: Snapshot
    pools: dict[str, frozenset[str]]
    cells: SQLiteCells
    bench: Bench
    backend: Settings | None = None
    """The settings the world was opened with (PostgreSQL's: ``cells`` a ``PostgresCells``)."""

    def open_runtime(self) -> Runtime:
        """Bootstrap another runtime over the same file: nothing it reads was read before."""
        return bootstrap(
            self.settings(), key=KEY, clock=self.clock, ids=SequentialIds("x"), create=True
        )

    def settings(self) -> Settings:
        """Return the home's settings."""
        return self.backend or Settings(backend="sqlite", home=self.home)

    def backend_name(self) -> str:
        """Name the backend and how the mark is written, as the figures show them."""
        settings = self.settings()
        backend = "PostgreSQL" if settings.backend == "postgres" else "SQLite"
        return f"{backend}, mark {settings.mark_sync}"

    def close(self) -> None:
        """Close the raw connection and the runtime."""
        self.cells.close()
        self.runtime.close()


def build_world(home: Path, mark_sync: MarkSync = "lagged") -> World:
    """Populate a fresh SQLite home and take the reference answers (retries included).

    Its high-water mark is written the way ``mark_sync`` says and has
    caught up when the world is handed over: what it detects is what lies
    beyond the lag window.
    """
    clock = FrozenClock()
    settings = Settings(backend="sqlite", home=home, mark_sync=mark_sync)
    runtime = bootstrap(settings, key=KEY, clock=clock, ids=SequentialIds("id"), create=True)
    catalog = populate(runtime, clock)
    streams = list_all_streams(runtime.store)
    chosen = readers(runtime, catalog, streams)
    again = retries(runtime, catalog, asked(runtime, catalog))
    cells = SQLiteCells(settings.database_path)
    answers, pools = take_reference(cells, chosen, again)
    reference = read_all(chosen)
    bench = Bench(cells, chosen, again, answers, pools, frozenset({INDEX, MOVED}))
    settle(runtime)
    return World(
        home, clock, runtime, catalog, streams, chosen, reference, pools, cells, bench, settings
    )


@pytest.fixture
def world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    """Provide a populated SQLite world, closed afterwards; parametrize it with a ``mark_sync``."""
    built = build_world(tmp_path / "home", getattr(request, "param", "lagged"))
    try:
        yield built
    finally:
        built.close()


def _kept_receipts(world: World) -> dict[str, str]:
    return {name: world.reference[f"head receipt {name}"][0] for name in world.streams}


# -- random byte flips: SQLite --------------------------------------------------------------


def test_random_byte_flips_sqlite(world: World) -> None:
    """A flipped byte in any stored cell: every reader ends in a typed error or reads it right.

    Every column of every table (records, the label index, ledger events and
    stream head rows) is flipped in turn. Each trial runs every reader on its
    own (an error in one does not end the trial): every service read, every
    audit read (workflow events, state history, run events paged two at a
    time, the keyed ``ledger verify --all`` and ``ledger head``), then every
    retry of an idempotent call on the tampered copy, which must return its
    first answer or a typed error and never write a duplicate. The runtime
    stays open across trials: nothing above the connection caches rows, and
    SQLite revalidates its page cache at every read transaction; to prove
    it, every 100th trial a freshly bootstrapped runtime must judge every
    reader the same. An altered label index may drop a record from a filtered
    listing (a stated limit); nothing else may read wrong. The negative
    control replays the same flips against readers that neither open seals
    nor verify chains: it must see silently changed data.
    """
    watch = reliability.Stopwatch()
    trials = reliability.size(2000, 100_000)
    seed = reliability.seed_base() + 101
    columns = world.cells.columns()
    pristine = world.cells.dump()

    def fresh(flip: Flip, trial: Trial) -> None:
        if flip.table == "store_epoch":
            return  # opening records the count it finds: a flipped one would stay in the mark
        try:
            other = world.open_runtime()
        except FlowvaultError as exc:
            # Opening reads stored columns too (the key ids it checks the key against).
            refused = exc.code
        else:
            refused = None
        if refused is not None:
            assert refused in INTEGRITY_CODES, f"seed {seed}: {flip.describe()}: {refused}"
            assert trial.kind in {DETECTED, "anomaly"}, f"seed {seed}: {flip.describe()}: {trial}"
            return
        with other:
            again = world.bench.judge(flip, readers(other, world.catalog, world.streams))
        assert again.outcomes == {n: trial.outcomes[n] for n in again.outcomes}, (
            f"seed {seed}: {flip.describe()}: a fresh runtime judged otherwise"
        )

    tally = run_flips(
        world.bench, columns, trials=trials, seed=seed, cross_check=fresh, cross_every=100
    )
    assert world.cells.dump() == pristine, "restoring the flipped cells changed the file"
    assert read_all(world.readers) == world.reference
    control = control_flips(
        world.cells,
        world.runtime.store,
        world.streams,
        columns,
        seed=seed,
        trials=max(100, trials // 20),
    )
    settle_flips(
        "SQLite",
        seed=seed,
        tally=tally,
        control=control,
        columns=columns,
        seconds=watch.seconds,
        control_note="control (unverified reads)",
    )


# -- random byte flips: PostgreSQL ------------------------------------------------------------


class QmarkConnection:
    """A psycopg connection that takes ``?`` placeholders, so SQLite's attack SQL runs on it."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def execute(self, query: str, parameters: Sequence[object] = ()) -> Any:
        """Run ``query`` with its ``?`` placeholders turned into psycopg's."""
        return self._connection.execute(query.replace("?", "%s"), tuple(parameters))


class PostgresCells:
    """Raw access to a schema's tables over an admin connection, as its owner has it."""

    REFUSED_COLUMNS: Final = frozenset({("records", "id")})
    """``GENERATED ALWAYS AS IDENTITY``: PostgreSQL refuses every update of it."""

    def __init__(self, server: Any, schema: str) -> None:
        self.connection = server.admin()
        self.connection.execute(f"SET search_path TO {schema}")
        self.raw = QmarkConnection(self.connection)
        """The connection with SQLite's ``?`` placeholders, for the structured attacks."""
        self._cells: dict[tuple[str, str], list[Any]] = {}
        """Each column's cells, read once: every flip is restored before the next."""
        self.types = {
            (table, column): kind
            for table, column, kind in self.connection.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = %s",
                (schema,),
            ).fetchall()
        }

    def close(self) -> None:
        """Close the admin connection."""
        self.connection.close()

    def columns(self) -> list[tuple[str, str]]:
        """Every ``(table, column)`` the adapter stores that an update can reach."""
        return sorted(
            cell
            for cell in self.types
            if cell[0] in PRIMARY_KEYS and cell not in self.REFUSED_COLUMNS
        )

    def _tampered(self, kind: str, value: object, rng: random.Random) -> object:
        from psycopg.types.json import Jsonb  # noqa: PLC0415 - the postgres extra

        if kind in {"bigint", "integer"}:
            assert isinstance(value, int)
            return flip_integer(value, rng)
        if kind == "bytea":
            assert isinstance(value, bytes)
            return flip_bytes(value, rng)
        text = canonical(value) if kind == "jsonb" else str(value)
        flipped = flip_bytes(text.encode("utf-8"), rng).decode("utf-8")
        return Jsonb(json.loads(flipped)) if kind == "jsonb" else flipped

    def flip(self, table: str, column: str, rng: random.Random) -> Flip | None:
        """Flip one byte of one non-null cell; ``None`` when PostgreSQL or JSON refuses it.

        Text must stay valid UTF-8 without NUL and ``jsonb`` valid JSON, so
        flips that break either are refused here, as the server would.
        """
        import psycopg  # noqa: PLC0415

        keys = PRIMARY_KEYS[table]
        if (table, column) not in self._cells:
            listed = ", ".join(keys)
            self._cells[(table, column)] = self.connection.execute(
                f"SELECT {listed}, {column} FROM {table} "  # noqa: S608
                f"WHERE {column} IS NOT NULL ORDER BY {listed}"
            ).fetchall()
        rows = self._cells[(table, column)]
        if not rows:
            return None
        row = rng.choice(rows)
        key, value = tuple(row[: len(keys)]), row[len(keys)]
        kind = self.types[(table, column)]
        try:
            tampered = self._tampered(kind, value, rng)
            if isinstance(tampered, str) and "\x00" in tampered:
                return None
            if kind == "integer" and isinstance(tampered, int) and abs(tampered) >= 2**31:
                return None
            where = " AND ".join(f"{name} = %s" for name in keys)
            self.connection.execute(
                f"UPDATE {table} SET {column} = %s WHERE {where}",  # noqa: S608
                (tampered, *key),
            )
        except (UnicodeDecodeError, ValueError, psycopg.Error):
            return None
        stored = getattr(tampered, "obj", tampered)
        return Flip(table, column, _moved(keys, key, column, stored), value, stored, kind)

    def restore(self, flip: Flip) -> None:
        """Put the original value back where the flip left the row."""
        from psycopg.types.json import Jsonb  # noqa: PLC0415

        original = Jsonb(flip.original) if flip.written_as == "jsonb" else flip.original
        where = " AND ".join(f"{name} = %s" for name in PRIMARY_KEYS[flip.table])
        cursor = self.connection.execute(
            f"UPDATE {flip.table} SET {flip.column} = %s WHERE {where}",  # noqa: S608
            (original, *flip.key),
        )
        assert cursor.rowcount == 1, f"could not restore {flip.describe()}"

    def dump(self) -> list[list[tuple[object, ...]]]:
        """Every row of every table, to prove restores leave the schema as it was."""
        return [
            self.connection.execute(f"SELECT * FROM {table} ORDER BY {', '.join(keys)}").fetchall()  # noqa: S608
            for table, keys in PRIMARY_KEYS.items()
        ]

    def put_back(self, dump: Sequence[Sequence[tuple[object, ...]]]) -> None:
        """Put every table back as ``dump`` holds it (after a retry wrote), ids included."""
        from psycopg.types.json import Jsonb  # noqa: PLC0415

        with self.connection.transaction():
            for table in reversed(PRIMARY_KEYS):
                self.connection.execute(f"DELETE FROM {table}")  # noqa: S608
            for table, rows in zip(PRIMARY_KEYS, dump, strict=True):
                names = [
                    column.name
                    for column in self.connection.execute(
                        f"SELECT * FROM {table} LIMIT 0"  # noqa: S608
                    ).description
                    or ()
                ]
                kinds = [self.types[(table, name)] for name in names]
                listed, marks = ", ".join(names), ", ".join(["%s"] * len(names))
                override = " OVERRIDING SYSTEM VALUE" if table == "records" else ""
                for row in rows:
                    values = [
                        Jsonb(value) if kind == "jsonb" else value
                        for value, kind in zip(row, kinds, strict=True)
                    ]
                    self.connection.execute(
                        f"INSERT INTO {table} ({listed}){override} VALUES ({marks})",  # noqa: S608
                        values,
                    )

    def row_counts(self) -> tuple[int, ...]:
        """How many records and ledger events the schema holds, to see a retry add one."""
        row = self.connection.execute(
            "SELECT (SELECT count(*) FROM records), (SELECT count(*) FROM ledger_events)"
        ).fetchone()
        assert row is not None
        return tuple(row)


@pytest.mark.postgres
def test_random_byte_flips_postgres(tmp_path: Path, postgres_server: Any, pg_schema: str) -> None:
    """The same trials on PostgreSQL: every reader ends in a typed error or reads it right.

    PostgreSQL refuses some flips itself (invalid UTF-8, NUL, broken JSON,
    out-of-range integers, the identity column); they are counted as refused.
    As on SQLite, every reader runs on its own and every retry runs after the
    pure reads. Its adapter does not cross-check ledger head rows on read, so
    a flip that cuts off a stream's newest event may change a head receipt:
    counted apart for that reader only (the audit reads of the stream must
    still refuse or read it right). The negative control replays the first
    flips against unverified reads.
    """
    watch = reliability.Stopwatch()
    trials = reliability.size(200, 10_000)
    seed = reliability.seed_base() + 102
    clock = FrozenClock()
    settings = Settings(
        backend="postgres",
        home=tmp_path / "unused",
        postgres_dsn=SecretStr(postgres_server.dsn),
        postgres_schema=pg_schema,
        postgres_pool_size=2,
    )
    runtime = bootstrap(settings, key=KEY, clock=clock, ids=SequentialIds("id"), create=True)
    cells = PostgresCells(postgres_server, pg_schema)
    try:
        catalog = populate(runtime, clock)
        streams = list_all_streams(runtime.store)
        chosen = readers(runtime, catalog, streams)
        again = retries(runtime, catalog, asked(runtime, catalog))
        reference, pools = take_reference(cells, chosen, again)
        bench = Bench(cells, chosen, again, reference, pools, frozenset({INDEX, MOVED, RECEIPT}))

        def fresh(flip: Flip, trial: Trial) -> None:
            with bootstrap(
                settings, key=KEY, clock=clock, ids=SequentialIds("x"), create=True
            ) as other:
                judged = bench.judge(flip, readers(other, catalog, streams))
            assert judged.outcomes == {n: trial.outcomes[n] for n in judged.outcomes}, (
                f"seed {seed}: {flip.describe()}: a fresh runtime judged otherwise"
            )

        pristine = cells.dump()
        columns = cells.columns()
        tally = run_flips(
            bench, columns, trials=trials, seed=seed, cross_check=fresh, cross_every=100
        )
        assert cells.dump() == pristine, "restoring the flipped cells changed the schema"
        control = control_flips(
            cells, runtime.store, streams, columns, seed=seed, trials=max(40, trials // 5)
        )
    finally:
        cells.close()
        runtime.close()
    settle_flips(
        "PostgreSQL",
        seed=seed,
        tally=tally,
        control=control,
        columns=columns,
        seconds=watch.seconds,
        control_note="records.id not updatable (identity); control",
    )


# -- structured attacks: raw SQL on the SQLite file -------------------------------------------


def restore_tables(raw: sqlite3.Connection, dump: Sequence[Sequence[tuple[object, ...]]]) -> None:
    """Put every table back exactly as dumped, in one transaction."""
    raw.execute("BEGIN IMMEDIATE")
    for table, rows in zip(SQLITE_PRIMARY_KEYS, dump, strict=True):
        raw.execute(f"DELETE FROM {table}")  # noqa: S608
        if rows:
            marks = ", ".join("?" * len(rows[0]))
            raw.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)  # noqa: S608
    raw.execute("COMMIT")


RECORD_COLUMNS: Final = (
    "revision", "sensitivity", "schema_version", "key_id", "written_at", "ledger_index",
    "labels", "byte_length", "payload_digest", "payload",
)  # fmt: skip
"""A record row's stored fields besides its id and identity (namespace, key digest)."""
CIPHERTEXT: Final = ("payload", "payload_digest", "byte_length")
"""The sealed bytes and the two columns that must agree with them."""


def record_id(world: World, namespace: str, natural_key: str) -> int:
    """Return a record's row id, found by its keyed digest as the store addresses it."""
    digest = world.runtime.repository.key_digest(namespace, natural_key)
    row = world.cells.raw.execute(
        "SELECT id FROM records WHERE namespace = ? AND key_digest = ?", (namespace, digest)
    ).fetchone()
    assert row is not None, f"no row for {namespace}"
    return int(row[0])


def read_row(world: World, row: int, columns: Sequence[str]) -> tuple[object, ...]:
    """Return the stored values of ``columns`` in one record row."""
    listed = ", ".join(columns)
    found = world.cells.raw.execute(
        f"SELECT {listed} FROM records WHERE id = ?",  # noqa: S608 - fixed column names
        (row,),
    ).fetchone()
    return tuple(found)


def write_row(world: World, row: int, columns: Sequence[str], values: Sequence[object]) -> None:
    """Overwrite ``columns`` of one record row."""
    assignments = ", ".join(f"{column} = ?" for column in columns)
    world.cells.raw.execute(
        f"UPDATE records SET {assignments} WHERE id = ?",  # noqa: S608 - fixed column names
        (*values, row),
    )


def swap_rows(world: World, first: int, second: int, columns: Sequence[str]) -> None:
    """Exchange ``columns`` between two record rows."""
    a, b = read_row(world, first, columns), read_row(world, second, columns)
    if "key_digest" in columns:
        write_row(world, first, ("key_digest",), ("swap in progress",))
    write_row(world, second, columns, a)
    write_row(world, first, columns, b)


def stored_events(world: World, stream: str) -> list[LedgerEvent]:
    """Return the stream's events as stored, read through the store (no chain check)."""
    return list(read_stream(world.runtime.store, stream))


def rehashed(event: LedgerEvent, **changes: object) -> LedgerEvent:
    """``event`` with ``changes``, its hash recomputed in plain SHA-256 (no key needed)."""
    fields: dict[str, Any] = {
        name: getattr(event, name)
        for name in (
            "stream", "index", "type", "occurred_at", "payload", "previous_hash",
            "from_state", "to_state", "event_key",
        )
    }  # fmt: skip
    fields.update(changes)
    return LedgerEvent.create(**fields)


def write_event(world: World, event: LedgerEvent) -> None:
    """Store ``event`` as its row, replacing any row at its stream and index."""
    values = (
        event.stream, event.index, event.type, event.from_state, event.to_state,
        format_instant(event.occurred_at), canonical_json(event.payload),
        event.previous_hash, event.event_hash, event.event_key, event.chain_mac,
    )  # fmt: skip
    raw = world.cells.raw
    raw.execute(
        "DELETE FROM ledger_events WHERE stream = ? AND idx = ?", (event.stream, event.index)
    )
    raw.execute(
        "INSERT INTO ledger_events (stream, idx, type, from_state, to_state, occurred_at, "
        "payload, previous_hash, event_hash, event_key, chain_mac) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        values,
    )


def set_head(world: World, stream: str, event: LedgerEvent) -> None:
    """Point the stream's head row at ``event``, as a careful attacker would."""
    world.cells.raw.execute(
        "UPDATE ledger_streams SET head_index = ?, head_hash = ? WHERE stream = ?",
        (event.index, event.event_hash, stream),
    )


def rewrite_chain(world: World, stream: str, position: int, payload: object) -> None:
    """Change one event's payload and recompute every later hash and the head row."""
    events = stored_events(world, stream)
    previous = events[position].previous_hash
    for event in events[position:]:
        changes: dict[str, object] = {"previous_hash": previous}
        if event.index == events[position].index:
            changes["payload"] = payload
        forged = rehashed(event, **changes)
        write_event(world, forged)
        previous = forged.event_hash
    set_head(world, stream, forged)


@dataclasses.dataclass(frozen=True)
class Attack:
    """One structured attack and what the design says should answer it.

    ``expected`` is an integrity code, or ``None`` for an attack the store
    cannot detect (a known limit); ``receipt`` says whether a ``ledger head``
    receipt kept from before the attack differs afterwards.
    """

    name: str
    apply: Callable[[World], None]
    expected: str | None
    receipt: bool = False
    probe: Callable[[World], None] | None = None
    """Asserts what the services then do, while the attack is in place."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one attack did against the verified reads, the receipts and the control."""

    attack: Attack
    outcome: Outcome
    receipt_differs: bool
    control: Outcome

    @property
    def as_expected(self) -> bool:
        """Whether the store answered as the design says it does."""
        if self.attack.expected is not None:
            return (self.outcome.kind, self.outcome.label) == ("detected", self.attack.expected)
        silent = self.outcome.label == "silently wrong"
        return silent and self.receipt_differs == self.attack.receipt

    @property
    def by_what(self) -> str:
        """How the attack was (or was not) noticed, for the report table."""
        if self.outcome.kind == "detected":
            found = f"{self.outcome.label} from `{self.outcome.where}`: {self.outcome.message}"
            if self.control.kind == "detected":
                found += f" (the adapter itself refuses the rows: {self.control.message})"
            return found
        kept = "; a `ledger head` receipt kept from before differs" if self.receipt_differs else ""
        return f"not detected by the store; reads changed silently: {self.outcome.where}{kept}"

    @property
    def detected(self) -> str:
        """The report table's second column."""
        if self.outcome.kind == "detected":
            return "yes"
        return "only against a kept receipt" if self.receipt_differs else "no"


def _receipts_differ(world: World, kept: Mapping[str, str]) -> bool:
    for stream, receipt in kept.items():
        try:
            now = canonical(_receipt(world.runtime.store, world.runtime.repository, stream))
        except FlowvaultError:
            return True
        if now != receipt:
            return True
    return False


def run_attacks(world: World, attacks: Sequence[Attack]) -> list[Verdict]:
    """Apply each attack to the pristine store, judge it three ways, then undo it."""
    pristine = world.cells.dump()
    kept = _kept_receipts(world)
    raw = raw_readers(world.runtime.store, world.streams)
    raw_reference = read_all(raw)
    verdicts = []
    for attack in attacks:
        attack.apply(world)
        try:
            outcome = classify(world.readers, world.reference, world.pools)
            control = classify(raw, raw_reference, {})
            verdicts.append(Verdict(attack, outcome, _receipts_differ(world, kept), control))
            if attack.probe is not None:
                attack.probe(world)
        finally:
            restore_tables(world.cells.raw, pristine)
        assert read_all(world.readers) == world.reference, f"{attack.name} was not undone"
    return verdicts


def report(family: str, verdicts: Sequence[Verdict], seconds: float) -> None:
    """Print the attack table, record the family's figure, and assert every verdict."""
    rows = [f"| {v.attack.name} | {v.detected} | {v.by_what} |" for v in verdicts]
    print("\n| attack | detected? | by what |\n|---|---|---|\n" + "\n".join(rows))
    wrong = [v for v in verdicts if not v.as_expected]
    blind = [v for v in verdicts if v.control.kind == "harmless"]
    undetected = sum(1 for v in verdicts if v.attack.expected is None)
    reliability.record(
        reliability.Figure(
            family=family,
            trials=len(verdicts),
            anomalies=len(wrong),
            control_caught=not blind,
            detail=f"{len(verdicts) - undetected} detected as designed, {undetected} not "
            f"detectable by a single-node store (known limits), of which "
            f"{sum(1 for v in verdicts if v.attack.receipt)} show against a kept ledger-head "
            f"receipt; control: {len(verdicts) - len(blind)} of {len(verdicts)} attacks change "
            "what unverified reads return",
            seconds=seconds,
        )
    )
    assert not blind, f"attacks that changed nothing visible: {[v.attack.name for v in blind]}"
    assert not wrong, "\n".join(f"{v.attack.name}: {v.by_what}" for v in wrong)


def _workflow_row(index: int) -> Callable[[World], int]:
    return lambda w: record_id(w, WORKFLOWS, w.catalog.workflows[index])


def _approval_row(index: int) -> Callable[[World], int]:
    return lambda w: record_id(w, APPROVALS, w.catalog.approvals[index])


def _checkpoint_row(index: int) -> Callable[[World], int]:
    return lambda w: record_id(w, CHECKPOINTS, w.catalog.checkpoints[index])


def _state_row(scope: str) -> Callable[[World], int]:
    return lambda w: record_id(w, STATE_NAMESPACE, scope)


def _swap(
    first: Callable[[World], int], second: Callable[[World], int], columns: Sequence[str]
) -> Callable[[World], None]:
    return lambda w: swap_rows(w, first(w), second(w), columns)


def _copy(
    source: Callable[[World], int], target: Callable[[World], int], columns: Sequence[str]
) -> Callable[[World], None]:
    return lambda w: write_row(w, target(w), columns, read_row(w, source(w), columns))


@BOTH_MARK_MODES
def test_swapped_ciphertexts(world: World) -> None:
    """A ciphertext moved to another row never opens there: the header is its associated data.

    Swapped between two rows of one namespace or of two namespaces, with or
    without the columns that describe it, or with the rows' identities
    exchanged instead, each read is ``INTEGRITY_FAILURE``.
    """
    watch = reliability.Stopwatch()
    attacks = [
        Attack(
            "swap ciphertexts of two workflows",
            _swap(_workflow_row(0), _workflow_row(1), CIPHERTEXT),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "swap ciphertexts of two approvals",
            _swap(_approval_row(0), _approval_row(1), CIPHERTEXT),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "swap ciphertexts of a checkpoint and an approval",
            _swap(_checkpoint_row(2), _approval_row(1), CIPHERTEXT),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "swap ciphertexts of two state scopes",
            _swap(_state_row("main"), _state_row("side"), CIPHERTEXT),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "swap whole rows (header and ciphertext) of two workflows",
            _swap(_workflow_row(0), _workflow_row(1), RECORD_COLUMNS),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "swap the key digests (identities) of two checkpoints",
            _swap(_checkpoint_row(1), _checkpoint_row(2), ("key_digest",)),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "copy one approval's ciphertext over another's",
            _copy(_approval_row(0), _approval_row(1), CIPHERTEXT),
            "INTEGRITY_FAILURE",
        ),
    ]
    family = f"Tamper: swapped ciphertexts ({world.backend_name()})"
    report(family, run_attacks(world, attacks), watch.seconds)


def _run(world: World) -> str:
    return run_stream(world.catalog.runs[0])


def _edit_payload(world: World) -> None:
    world.cells.raw.execute(
        "UPDATE ledger_events SET payload = ? WHERE stream = ? AND idx = 3",
        ('{"forged":true}', _run(world)),
    )


def _rehash_at(position: int, *, move_head: bool) -> Callable[[World], None]:
    def apply(world: World) -> None:
        event = stored_events(world, _run(world))[position]
        forged = rehashed(event, payload={"forged": True})
        write_event(world, forged)
        if move_head:
            set_head(world, _run(world), forged)

    return apply


def _delete(position: int, *, move_head: bool = False) -> Callable[[World], None]:
    def apply(world: World) -> None:
        events = stored_events(world, _run(world))
        world.cells.raw.execute(
            "DELETE FROM ledger_events WHERE stream = ? AND idx = ?",
            (_run(world), events[position].index),
        )
        if move_head:
            set_head(world, _run(world), events[position - 1])

    return apply


def _forged_trim(
    stream_of_world: Callable[[World], str], keep_from: int
) -> Callable[[World], None]:
    def apply(world: World) -> None:
        stream = stream_of_world(world)
        world.cells.raw.execute(
            "DELETE FROM ledger_events WHERE stream = ? AND idx < ?", (stream, keep_from)
        )
        world.cells.raw.execute(
            "UPDATE ledger_streams SET first_index = ? WHERE stream = ?", (keep_from, stream)
        )

    return apply


def _append(*, move_head: bool) -> Callable[[World], None]:
    def apply(world: World) -> None:
        head = stored_events(world, _run(world))[-1]
        forged = LedgerEvent.create(
            stream=head.stream,
            index=head.index + 1,
            type="node.done",
            occurred_at=head.occurred_at,
            payload={"node": "forged"},
            previous_hash=head.event_hash,
        )
        write_event(world, forged)
        if move_head:
            set_head(world, head.stream, forged)

    return apply


def _reorder(world: World) -> None:
    raw, stream = world.cells.raw, _run(world)
    raw.execute("UPDATE ledger_events SET idx = 1000000 WHERE stream = ? AND idx = 2", (stream,))
    raw.execute("UPDATE ledger_events SET idx = 2 WHERE stream = ? AND idx = 3", (stream,))
    raw.execute("UPDATE ledger_events SET idx = 3 WHERE stream = ? AND idx = 1000000", (stream,))


def _move_to_other_stream(world: World) -> None:
    world.cells.raw.execute(
        "UPDATE ledger_events SET stream = ? WHERE stream = ? AND idx = 2",
        (run_stream(world.catalog.runs[1]) + "-x", _run(world)),
    )


@BOTH_MARK_MODES
def test_ledger_row_edits(world: World) -> None:
    """Edited, deleted, inserted and reordered ledger rows: which the store sees, and which not.

    The hash chain shows any change inside it; the stream's head row (first
    and head index, head hash) shows a cut-off or extended head or a missing
    front, on SQLite, as long as it was not edited too. An edited or forged
    event lacks a valid ``chain_mac``, which needs the integrity key, so a
    keyed ``ledger verify`` shows it even with the head row rewritten. A
    forged retention trim (first events deleted, ``first_index`` raised)
    lacks the keyed ``ledger.trimmed`` event a real trim appends, so the
    stream is ``truncated`` for every verifier. A newest event deleted with
    the head row moved back is refused when a bound record names it (a run's
    own ``run.*`` event); the other streams are covered in
    ``test_every_ledger_attack_on_every_stream_kind``.
    """
    watch = reliability.Stopwatch()
    attacks = [
        Attack("edit one event's payload, hash left", _edit_payload, "INTEGRITY_FAILURE"),
        Attack(
            "edit a middle event and recompute its hash",
            _rehash_at(3, move_head=False),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "edit the newest event and recompute its hash",
            _rehash_at(-1, move_head=False),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "edit the newest event, recompute its hash and the head row",
            _rehash_at(-1, move_head=True),
            "INTEGRITY_FAILURE",
        ),
        Attack("delete a middle event", _delete(3), "INTEGRITY_FAILURE"),
        Attack("delete the newest event", _delete(-1), "INTEGRITY_FAILURE"),
        Attack(
            "delete the newest event and move the head row back",
            _delete(-1, move_head=True),
            "INTEGRITY_FAILURE",
        ),
        Attack("delete the first event", _delete(0), "INTEGRITY_FAILURE"),
        Attack(
            "delete a run's first events and forge a retention trim",
            _forged_trim(_run, 2),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "delete a workflow's first events and forge a retention trim",
            _forged_trim(lambda w: stream_of(w.catalog.workflows[0]), 2),
            "INTEGRITY_FAILURE",
        ),
        Attack("append a forged event", _append(move_head=False), "INTEGRITY_FAILURE"),
        Attack(
            "append a forged event and advance the head row",
            _append(move_head=True),
            "INTEGRITY_FAILURE",
        ),
        Attack("swap the indexes of two events", _reorder, "INTEGRITY_FAILURE"),
        Attack("move a middle event to another stream", _move_to_other_stream, "INTEGRITY_FAILURE"),
    ]
    family = f"Tamper: ledger row edits ({world.backend_name()})"
    report(family, run_attacks(world, attacks), watch.seconds)


def rebased(world: World) -> World:
    """Retake the reference of the same store after the services wrote more (the mark caught up)."""
    settle(world.runtime)
    streams = list_all_streams(world.runtime.store)
    chosen = readers(world.runtime, world.catalog, streams)
    reference = read_all(chosen)
    return dataclasses.replace(
        world,
        streams=streams,
        readers=chosen,
        reference=reference,
        pools=universes(chosen, reference),
    )


@dataclasses.dataclass(frozen=True)
class OldRow:
    """A record row as it was, with its label index rows, for replaying."""

    values: tuple[object, ...]
    labels: list[tuple[object, ...]]


@dataclasses.dataclass(frozen=True)
class OldRows:
    """Rows as they were before the services moved on."""

    state: OldRow
    history: list[LedgerEvent]
    workflow: OldRow
    checkpoint: OldRow
    approval: OldRow
    slot: OldRow
    run: OldRow


def _old(world: World, row: int) -> OldRow:
    labels = world.cells.raw.execute(
        "SELECT * FROM record_labels WHERE record_id = ?", (row,)
    ).fetchall()
    return OldRow(read_row(world, row, RECORD_COLUMNS), labels)


def _slot_row(world: World) -> int:
    """Find the slot of the approval ``_advance`` decides: checkpoint ``newer``, audience legal."""
    return record_id(world, APPROVAL_SLOTS, f"{world.catalog.checkpoints[2]}\x1flegal")


PENDING_CURSOR: Final = 3
"""Cursor of the checkpoint ``_advance`` adds, whose approval (audience ops) stays pending."""


def _advance(world: World) -> OldRows:
    """Capture rows, then move each on through its service (new revisions, new events).

    Also checkpoints the live run once more and asks audience ops to decide,
    so a pending request exists whose retry the deleted-slot attack makes.
    """
    old = OldRows(
        state=_old(world, _state_row("main")(world)),
        history=stored_events(world, "scope/main"),
        workflow=_old(world, _workflow_row(1)(world)),
        checkpoint=_old(world, _checkpoint_row(2)(world)),
        approval=_old(world, _approval_row(1)(world)),
        slot=_old(world, _slot_row(world)),
        run=_old(world, record_id(world, GRAPH_RUNS, world.catalog.runs[1])),
    )
    runtime, catalog = world.runtime, world.catalog
    world.clock.advance()
    runtime.state("main").update_with_events(
        lambda _: (WorkflowState(step=3, note="step 3"), [HistoryEvent("state.step", {"step": 3})])
    )
    runtime.workflows.transition(
        catalog.workflows[1], "planning", expected_state="intake", expected_version=1
    )
    runtime.approvals.decide(catalog.approvals[1], "approve", "frank@example.org")
    runtime.runs.set_status(catalog.runs[1], "awaiting_approval", expected_status="running")
    _ask(runtime, _checkpoint(runtime, catalog.runs[1], "d", PENDING_CURSOR), "ops")
    return old


def _retries(world: World) -> list[Reader]:
    """Make the original calls again, each answered from its marker while nothing is tampered with.

    They write nothing then, so they are reads; with a marker deleted they
    must refuse rather than create a second workflow, run, approval request,
    event, response or witness.
    """
    runtime, catalog = world.runtime, world.catalog
    first = catalog.workflows[0]
    pending = _pending_checkpoint(world)
    decision = {"action_hash": ACTIONS[0], "approved": True, "decided_by": "dana@example.org"}
    key, request = REQUESTS[1]
    return [
        Reader("retry create order-2", lambda: list(runtime.workflows.create(_order(2)))),
        Reader(
            "retry keyed decision receipt",
            lambda: list(
                runtime.workflow_events.append_event(
                    first,
                    "decision.approved",
                    expected_state="decision",
                    expected_version=3,
                    payload=decision,
                    event_key="decision-1",
                )
            ),
        ),
        Reader("retry approval request", lambda: [_ask(runtime, pending, "ops")]),
        Reader(
            "retry remember",
            lambda: [runtime.idempotency.remember(key, request, {"status": 200 + len(key)})],
        ),
        Reader(
            "retry start run",
            lambda: list(
                runtime.runs.start_run(
                    "flow.a",
                    {"invoice": "INV-9"},
                    budgets={"tokens": 100},
                    idempotency_key="run-key-1",
                )
            ),
        ),
        Reader(
            "retry capture witness",
            lambda: [
                runtime.evidence.capture_witness(
                    "https://example.org/inv-1", EVIDENCE, "text/plain", "primary", EPOCH
                )
            ],
        ),
    ]


def _pending_checkpoint(world: World) -> str:
    return checkpoint_id_for(world.catalog.runs[1], {"node": "d"})


def _with_retries(world: World) -> World:
    """Read everything, then retry every original call, as the reference and after each attack."""
    chosen = [*world.readers, *_retries(world)]
    reference = read_all(chosen)
    return dataclasses.replace(
        world, readers=chosen, reference=reference, pools=universes(chosen, reference)
    )


def _replay(
    row: Callable[[World], int], old: OldRow, *, with_index: bool = True
) -> Callable[[World], None]:
    """Write the old row back; with its label index rows too, as a careful attacker would."""

    def apply(world: World) -> None:
        found = row(world)
        write_row(world, found, RECORD_COLUMNS, old.values)
        if with_index:
            world.cells.raw.execute("DELETE FROM record_labels WHERE record_id = ?", (found,))
            world.cells.raw.executemany(
                "INSERT INTO record_labels VALUES (?, ?, ?, ?, ?)", old.labels
            )

    return apply


def _all(*steps: Callable[[World], None]) -> Callable[[World], None]:
    def apply(world: World) -> None:
        for step in steps:
            step(world)

    return apply


def _delete_record(row: Callable[[World], int]) -> Callable[[World], None]:
    def apply(world: World) -> None:
        found = row(world)
        world.cells.raw.execute("DELETE FROM record_labels WHERE record_id = ?", (found,))
        world.cells.raw.execute("DELETE FROM records WHERE id = ?", (found,))

    return apply


def _row_of(namespace: str, natural_key: Callable[[World], str]) -> Callable[[World], int]:
    return lambda w: record_id(w, namespace, natural_key(w))


def _first_action_result(world: World) -> str:
    workflow, action = world.catalog.action_results[0]
    return f"{workflow}\x1f{action}"


def _roll_back_scope(old: OldRows) -> Callable[[World], None]:
    def apply(world: World) -> None:
        _replay(_state_row("main"), old.state)(world)
        world.cells.raw.execute(
            "DELETE FROM ledger_events WHERE stream = 'scope/main' AND idx > ?",
            (old.history[-1].index,),
        )
        set_head(world, "scope/main", old.history[-1])

    return apply


def _refused(call: Callable[[], object]) -> None:
    with pytest.raises(FlowvaultError) as refused:
        call()
    assert refused.value.code == "INTEGRITY_FAILURE", refused.value


def _never_consumed_again(world: World) -> None:
    checkpoints = world.runtime.checkpoints
    _refused(lambda: checkpoints.consume_checkpoint(world.catalog.checkpoints[2]))


def _never_decided_again(world: World) -> None:
    approvals = world.runtime.approvals
    _refused(lambda: approvals.decide(world.catalog.approvals[1], "reject", "mallory"))
    events = stored_events(world, run_stream(world.catalog.runs[1]))
    assert sum(event.type == "approval.decided" for event in events) == 1


def _no_second(namespace: str, count: int) -> Callable[[World], None]:
    """Probe: the retries refused, so the namespace holds no more rows than before the attack."""

    def probe(world: World) -> None:
        held = world.runtime.store.namespace_counts().get(namespace, 0)
        assert held == count, f"{namespace}: {held} rows, expected {count}"

    return probe


def _no_more_events(world: World, stream: str, count: int) -> None:
    assert len(stored_events(world, stream)) == count


@BOTH_MARK_MODES
def test_replayed_rows(world: World) -> None:
    """An older row replayed whole (ciphertext with its own revision), or a row deleted whole.

    The older row is authentic, so it opens. Every record kind names the
    ledger event that last wrote it: state rows, workflow records and graph
    runs in their own streams; checkpoints, approvals and approval slots in
    the checkpoint's record stream. That stream holds a later writer, so
    reading them fails, and a consumed checkpoint or decided approval is
    never used again, whichever of the three rows come back. A deleted
    marker (a workflow's or run's idempotency marker, an event key, an
    approval slot, a remembered request) or witness is still recorded by
    its stream, so the original call retried is refused instead of repeated.
    Idempotency markers and slots are written once, and the witness here is
    captured from one locator, so an older copy of one is the same row;
    their attack is deletion (a witness put back without a later locator
    is covered in ``tests/unit/test_record_freshness.py``). Still not
    caught: a deleted state row reads as a scope never written, and a state
    row rolled back together with its stream is a truncation, shown only by
    a kept ``ledger head`` receipt. The ciphertext of an older revision
    under the newer header fails on open.
    """
    watch = reliability.Stopwatch()
    old = _advance(world)
    world = _with_retries(rebased(world))
    counts = dict(world.runtime.store.namespace_counts())
    slot = _slot_row
    pending_slot = _row_of(APPROVAL_SLOTS, lambda w: f"{_pending_checkpoint(w)}\x1fops")
    keyed_stream = stream_of(world.catalog.workflows[0])
    keyed_events = len(stored_events(world, keyed_stream))
    attacks = [
        Attack(
            "replay an older state row (ciphertext and revision together)",
            _replay(_state_row("main"), old.state),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "replay an older state row and roll its history ledger and head row back",
            _roll_back_scope(old),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "replay an older workflow record (an earlier state and version)",
            _replay(_workflow_row(1), old.workflow),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "replay an older workflow record but leave its label index rows newer",
            _replay(_workflow_row(1), old.workflow, with_index=False),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "replay a graph run at an earlier status",
            _replay(lambda w: record_id(w, GRAPH_RUNS, w.catalog.runs[1]), old.run),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "replay a consumed checkpoint as pending (never consumed again)",
            _replay(_checkpoint_row(2), old.checkpoint),
            "INTEGRITY_FAILURE",
            probe=_never_consumed_again,
        ),
        Attack(
            "replay a decided approval as pending (never decided again)",
            _replay(_approval_row(1), old.approval),
            "INTEGRITY_FAILURE",
            probe=_never_decided_again,
        ),
        Attack(
            "replay a decided approval and its checkpoint (never decided again)",
            _all(
                _replay(_approval_row(1), old.approval),
                _replay(_checkpoint_row(2), old.checkpoint),
            ),
            "INTEGRITY_FAILURE",
            probe=_never_decided_again,
        ),
        Attack(
            "replay a decided approval, its slot and its checkpoint (never decided again)",
            _all(
                _replay(_approval_row(1), old.approval),
                _replay(slot, old.slot),
                _replay(_checkpoint_row(2), old.checkpoint),
            ),
            "INTEGRITY_FAILURE",
            probe=_never_decided_again,
        ),
        Attack(
            "delete a consumed checkpoint (its stream still records it)",
            _delete_record(_checkpoint_row(0)),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "delete a state row (its history says it was written: not read as empty)",
            _delete_record(_state_row("side")),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "delete an action result (its stream still records the put)",
            _delete_record(_row_of(ACTION_RESULTS, _first_action_result)),
            "INTEGRITY_FAILURE",
            probe=_no_second(ACTION_RESULTS, counts[ACTION_RESULTS] - 1),
        ),
        Attack(
            "delete a terminal receipt (its run.<status> event names it)",
            _delete_record(_row_of(GRAPH_RUN_RECEIPTS, lambda w: w.catalog.receipts[0])),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "delete a remembered idempotency record (recall and remember refuse)",
            _delete_record(_row_of(REQUEST_IDEMPOTENCY, lambda _: REQUESTS[1][0])),
            "INTEGRITY_FAILURE",
            probe=_no_second(REQUEST_IDEMPOTENCY, counts[REQUEST_IDEMPOTENCY] - 1),
        ),
        Attack(
            "delete a workflow's idempotency marker, retry the create (no second workflow)",
            _delete_record(_row_of(IDEMPOTENCY, lambda _: "order-2")),
            "INTEGRITY_FAILURE",
            probe=_no_second(WORKFLOWS, counts[WORKFLOWS]),
        ),
        Attack(
            "delete an event-key marker, retry the keyed receipt (no second event)",
            _delete_record(
                _row_of(EVENT_KEYS, lambda w: f"{w.catalog.workflows[0]}\x1fdecision-1")
            ),
            "INTEGRITY_FAILURE",
            probe=lambda w: _no_more_events(w, keyed_stream, keyed_events),
        ),
        Attack(
            "delete a pending approval's slot, retry the request (no second approval)",
            _delete_record(pending_slot),
            "INTEGRITY_FAILURE",
            probe=_no_second(APPROVALS, counts[APPROVALS]),
        ),
        Attack(
            "delete a run's idempotency marker, retry the start (no second run)",
            _delete_record(_row_of(GRAPH_RUN_IDEMPOTENCY, lambda _: "run-key-1")),
            "INTEGRITY_FAILURE",
            probe=_no_second(GRAPH_RUNS, counts[GRAPH_RUNS]),
        ),
        Attack(
            "delete a witness (its stream still records the capture)",
            _delete_record(_row_of(WITNESSES, lambda w: w.catalog.witnesses[0])),
            "INTEGRITY_FAILURE",
            probe=_no_second(WITNESSES, counts[WITNESSES] - 1),
        ),
        Attack(
            "replay only the older ciphertext under the newer revision",
            lambda w: write_row(
                w,
                _state_row("main")(w),
                CIPHERTEXT,
                tuple(old.state.values[RECORD_COLUMNS.index(column)] for column in CIPHERTEXT),
            ),
            "INTEGRITY_FAILURE",
        ),
    ]
    family = f"Tamper: replayed rows, rollback ({world.backend_name()})"
    report(family, run_attacks(world, attacks), watch.seconds)


@BOTH_MARK_MODES
def test_recomputed_ledger_chain(world: World, tmp_path: Path) -> None:
    """A ledger rewritten with recomputed plain hashes and head row: what still sees it.

    The chain is plain SHA-256, so anyone who can write the file can rebuild
    it, and a keyless ``ledger verify`` accepts it. The rebuilt events lack
    a valid ``chain_mac``, which needs the integrity key, so a keyed verify
    fails at the first of them after a keyed event. A stream rewritten from
    its first event with every MAC dropped fails too: no keyed event follows
    its unkeyed ones to vouch for them.
    """
    watch = reliability.Stopwatch()
    key = encode_master_key(KEY)
    run = run_stream(world.catalog.runs[0])
    kept = json_document(
        run_cli(
            tmp_path,
            "ledger",
            "head",
            "--stream",
            run,
            "--json",
            home=world.home,
            FLOWVAULT_KEY=key,
        )
    )

    def cli_needs_the_key(w: World) -> None:
        keyless = run_cli(tmp_path, "ledger", "verify", "--all", "--json", home=w.home)
        assert keyless.returncode == 0, keyless.stdout + keyless.stderr
        assert json_document(keyless)["ok"] is True
        keyed = run_cli(
            tmp_path, "ledger", "verify", "--all", "--json", home=w.home, FLOWVAULT_KEY=key
        )
        assert keyed.returncode == 1, keyed.stdout + keyed.stderr
        failures = json_document(keyed)["failures"]
        assert isinstance(failures, list)
        assert [(f["stream"], f["defect"], f["index"]) for f in failures] == [(run, "unkeyed", 1)]
        refused = run_cli(
            tmp_path, "ledger", "head", "--stream", run, "--json", home=w.home, FLOWVAULT_KEY=key
        )
        assert refused.returncode == 1, "no receipt vouches for a forged chain"
        error = json_document(refused)["error"]
        assert isinstance(error, dict)
        assert error["code"] == "INTEGRITY_FAILURE"
        receipt = tmp_path / "kept-receipt"
        receipt.write_text(str(kept["receipt"]))
        against = run_cli(
            tmp_path,
            "ledger",
            "verify",
            "--against",
            str(receipt),
            "--json",
            home=w.home,
            FLOWVAULT_KEY=key,
        )
        assert against.returncode == 1, against.stdout + against.stderr

    def insert_forged(w: World) -> None:
        events = stored_events(w, run)
        w.cells.raw.execute("DELETE FROM ledger_events WHERE stream = ? AND idx >= 3", (run,))
        previous = events[2].event_hash
        forged = LedgerEvent.create(
            stream=run,
            index=3,
            type="node.done",
            occurred_at=events[2].occurred_at,
            payload={"node": "inserted"},
            previous_hash=previous,
        )
        write_event(w, forged)
        previous = forged.event_hash
        for event in events[3:]:
            moved = rehashed(event, index=event.index + 1, previous_hash=previous)
            write_event(w, moved)
            previous = moved.event_hash
        set_head(w, run, moved)

    attacks = [
        Attack(
            "rewrite a run's chain from one event on, hashes and head row recomputed",
            lambda w: rewrite_chain(w, run, 1, {"definition_version": "forged"}),
            "INTEGRITY_FAILURE",
            probe=cli_needs_the_key,
        ),
        Attack(
            "rewrite a workflow's chain, hashes and head row recomputed",
            lambda w: rewrite_chain(w, stream_of(w.catalog.workflows[0]), 1, {"forged": True}),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "rewrite a scope history chain from its first event, MACs dropped, hashes and "
            "head row recomputed",
            lambda w: rewrite_chain(w, "scope/main", 0, {"step": 99}),
            "INTEGRITY_FAILURE",
        ),
        Attack(
            "insert a forged event mid-chain, renumber and rehash the rest and the head row",
            insert_forged,
            "INTEGRITY_FAILURE",
        ),
    ]
    family = f"Tamper: recomputed ledger chain ({world.backend_name()})"
    report(family, run_attacks(world, attacks), watch.seconds)


# -- every ledger attack on every kind of stream ----------------------------------------------


def _delete_events(world: World, stream: str, where: str, *values: object) -> None:
    world.cells.raw.execute(
        f"DELETE FROM ledger_events WHERE stream = ? AND {where}",  # noqa: S608 - fixed text
        (stream, *values),
    )


def _delete_head(*, move_head: bool) -> Callable[[World, str], None]:
    def apply(world: World, stream: str) -> None:
        events = stored_events(world, stream)
        _delete_events(world, stream, "idx = ?", events[-1].index)
        if move_head:
            set_head(world, stream, events[-2])

    return apply


def _delete_middle(world: World, stream: str) -> None:
    events = stored_events(world, stream)
    _delete_events(world, stream, "idx = ?", events[len(events) // 2].index)


def _delete_prefix(*, raise_first: bool) -> Callable[[World, str], None]:
    def apply(world: World, stream: str) -> None:
        _delete_events(world, stream, "idx < 2")
        if raise_first:
            world.cells.raw.execute(
                "UPDATE ledger_streams SET first_index = 2 WHERE stream = ?", (stream,)
            )

    return apply


def _swap_events(world: World, stream: str) -> None:
    raw = world.cells.raw
    raw.execute("UPDATE ledger_events SET idx = 1000000 WHERE stream = ? AND idx = 1", (stream,))
    raw.execute("UPDATE ledger_events SET idx = 1 WHERE stream = ? AND idx = 2", (stream,))
    raw.execute("UPDATE ledger_events SET idx = 2 WHERE stream = ? AND idx = 1000000", (stream,))


def _edit_event(world: World, stream: str) -> None:
    world.cells.raw.execute(
        "UPDATE ledger_events SET payload = ? WHERE stream = ? AND idx = 1",
        ('{"forged":true}', stream),
    )


def _recompute(*, start: int, keep_macs: bool) -> Callable[[World, str], None]:
    """Edit the event at ``start`` and recompute every plain hash from it on, and the head row.

    With ``keep_macs`` each event keeps the MAC it had (now wrong); without,
    the rebuilt events carry none, as events appended without ``keyed`` do.
    """

    def apply(world: World, stream: str) -> None:
        events = stored_events(world, stream)
        previous = events[start].previous_hash
        for event in events[start:]:
            changes: dict[str, object] = {"previous_hash": previous}
            if event.index == events[start].index:
                changes["payload"] = {"forged": True}
            forged = rehashed(event, **changes)
            if keep_macs:
                forged = forged.model_copy(update={"chain_mac": event.chain_mac})
            write_event(world, forged)
            previous = forged.event_hash
        set_head(world, stream, forged)

    return apply


def _strip_macs(world: World, stream: str) -> None:
    world.cells.raw.execute("UPDATE ledger_events SET chain_mac = NULL WHERE stream = ?", (stream,))


LEDGER_ATTACKS: Final[tuple[tuple[str, Callable[[World, str], None]], ...]] = (
    ("delete the head event", _delete_head(move_head=False)),
    ("delete the head event and move the head row back", _delete_head(move_head=True)),
    ("delete a middle event", _delete_middle),
    ("delete a prefix, first_index left", _delete_prefix(raise_first=False)),
    (
        "delete a prefix and raise first_index (a trim without its event)",
        _delete_prefix(raise_first=True),
    ),
    ("reorder two events", _swap_events),
    ("edit an event, its hash left", _edit_event),
    (
        "edit an event, recompute the plain chain on, MACs dropped",
        _recompute(start=1, keep_macs=False),
    ),
    (
        "edit an event, recompute the plain chain on, MACs kept",
        _recompute(start=1, keep_macs=True),
    ),
    (
        "rewrite the whole plain chain from index 0, MACs dropped",
        _recompute(start=0, keep_macs=False),
    ),
    ("strip every MAC", _strip_macs),
)
"""Every ledger attack of the issue, applied to one stream of the pristine store."""


def attacked_streams(world: World) -> dict[str, tuple[str, str]]:
    """Each kind of stream: the stream attacked, and the service's audit read of it."""
    workflow, run = world.catalog.workflows[0], world.catalog.runs[0]
    return {
        "workflow": (stream_of(workflow), f"workflow events {workflow}"),
        "run": (run_stream(run), f"run events {run}"),
        "scope": ("scope/main", "history main"),
    }


@dataclasses.dataclass(frozen=True)
class Caught:
    """How the three checks answered one attack on one stream; ``""`` means caught."""

    kind: str
    attack: str
    verify: str
    service: str
    against: str

    @property
    def missed(self) -> list[str]:
        """The checks that did not catch the attack, each with what it saw."""
        checks = {"verify --all": self.verify, "service reads": self.service}
        checks["--against"] = self.against
        return [f"{name}: {seen}" for name, seen in checks.items() if seen]


def _verify_all(world: World) -> str:
    try:
        ledger_verify(world.runtime)
    except FlowvaultError as exc:
        return "" if exc.code in INTEGRITY_CODES else f"typed {exc.code}, not an integrity error"
    return "ok=true"


def _against(world: World, kept: object) -> str:
    audit = LedgerAudit(world.runtime.store, world.runtime.repository)
    try:
        report = audit.against([kept])  # type: ignore[list-item]
    except FlowvaultError as exc:
        return "" if exc.code in INTEGRITY_CODES else f"typed {exc.code}"
    return "" if not report.ok else "ok=true"


def _service_reads(world: World, audit_read: str) -> str:
    """Judge every service read on a freshly opened runtime, as the next process sees the file.

    Caught when opening is refused with a typed error, or the stream's own
    audit read raises an integrity error and no reader reads wrong.
    """
    try:
        other = world.open_runtime()
    except FlowvaultError:
        return ""
    with other:
        trial = world.bench.judge(None, readers(other, world.catalog, world.streams))
    wrong = sorted(name for name, outcome in trial.outcomes.items() if outcome in ANOMALOUS)
    own = trial.outcomes[audit_read]
    if own == DETECTED and not wrong:
        return ""
    return f"{audit_read} {own}" + (f"; read wrong: {', '.join(wrong)}" if wrong else "")


def run_ledger_attacks(world: World) -> list[Caught]:
    """Apply every ledger attack to every kind of stream in turn, judge it three ways, undo it."""
    pristine = world.cells.dump()
    mark = world.settings().high_water_path
    assert mark is not None
    kept_mark = mark.read_bytes()
    audit = LedgerAudit(world.runtime.store, world.runtime.repository)
    found = []
    for kind, (stream, audit_read) in attacked_streams(world).items():
        kept = audit.issue(stream, issued_at=EPOCH)
        for name, attack in LEDGER_ATTACKS:
            attack(world, stream)
            try:
                found.append(
                    Caught(
                        kind,
                        name,
                        _verify_all(world),
                        _service_reads(world, audit_read),
                        _against(world, kept),
                    )
                )
            finally:
                world.cells.put_back(pristine)
                mark.write_bytes(kept_mark)
    assert world.bench.judge(None).kind == "harmless", "an attack was not undone"
    return found


def settle_ledger_attacks(backend: str, found: Sequence[Caught], seconds: float) -> None:
    """Print the attack table, record the figure, and assert every attack was caught."""
    rows = [
        f"| {c.kind} | {c.attack} | {c.verify or 'caught'} | {c.service or 'caught'} | "
        f"{c.against or 'caught'} |"
        for c in found
    ]
    print(
        "\n| stream | attack | verify --all | service reads | --against |\n|---|---|---|---|---|\n"
        + "\n".join(rows)
    )
    missed = [c for c in found if c.missed]
    reliability.record(
        reliability.Figure(
            family=f"Tamper: every ledger attack on every stream kind ({backend})",
            trials=len(found),
            anomalies=len(missed),
            control_caught=None,
            detail=f"{len(found) - len(missed)} of {len(found)} caught by all three checks; "
            f"verify --all missed {sum(1 for c in found if c.verify)}, service reads "
            f"{sum(1 for c in found if c.service)}, --against {sum(1 for c in found if c.against)}",
            seconds=seconds,
        )
    )
    assert not missed, "\n".join(f"{c.kind}: {c.attack}: {'; '.join(c.missed)}" for c in missed)


@BOTH_MARK_MODES
def test_every_ledger_attack_on_every_stream_kind(world: World) -> None:
    """Every ledger attack on a workflow, a run and a scope stream is caught three ways.

    Deleting the head, a middle event or a prefix (with and without raising
    ``first_index``, which is a trim without its ``ledger.trimmed`` event),
    reordering, editing, recomputing the plain chain with and without the old
    MACs, and stripping every MAC: each must fail the keyed ``ledger verify
    --all``, the service reads (the stream's own audit read raises, nothing
    reads wrong, or opening the store is refused), and ``ledger verify
    --against`` a receipt kept before the attack.
    """
    watch = reliability.Stopwatch()
    settle_ledger_attacks(world.backend_name(), run_ledger_attacks(world), watch.seconds)


@pytest.fixture
def pg_world(
    tmp_path: Path, postgres_server: Any, pg_schema: str, request: pytest.FixtureRequest
) -> Iterator[World]:
    """Provide a populated PostgreSQL world (raw access over an admin connection), closed after.

    It keeps a high-water mark, the configuration under which PostgreSQL
    detects a stream cut at its head (without one, only a kept receipt does).
    """
    clock = FrozenClock()
    settings = Settings(
        backend="postgres",
        home=tmp_path / "unused",
        postgres_dsn=SecretStr(postgres_server.dsn),
        postgres_schema=pg_schema,
        postgres_pool_size=2,
        high_water_file=tmp_path / "mark" / "store.high-water",
        mark_sync=getattr(request, "param", "lagged"),
    )
    runtime = bootstrap(settings, key=KEY, clock=clock, ids=SequentialIds("id"), create=True)
    cells = PostgresCells(postgres_server, pg_schema)
    try:
        catalog = populate(runtime, clock)
        streams = list_all_streams(runtime.store)
        chosen = readers(runtime, catalog, streams)
        again = retries(runtime, catalog, asked(runtime, catalog))
        answers, pools = take_reference(cells, chosen, again)
        bench = Bench(cells, chosen, again, answers, pools, frozenset({INDEX, MOVED, RECEIPT}))
        reference = read_all(chosen)
        home = tmp_path / "unused"
        yield World(
            home, clock, runtime, catalog, streams, chosen, reference, pools, cells, bench, settings
        )
    finally:
        cells.close()
        runtime.close()


@pytest.mark.parametrize("pg_world", MARK_MODES, indirect=True)
@pytest.mark.postgres
def test_every_ledger_attack_on_every_stream_kind_postgres(pg_world: World) -> None:
    """The same ledger attacks on PostgreSQL, each caught by verify, service reads and a receipt.

    The attacks are the same SQL, run as the schema's owner; the checks are
    the same three.
    """
    watch = reliability.Stopwatch()
    settle_ledger_attacks(pg_world.backend_name(), run_ledger_attacks(pg_world), watch.seconds)


# -- negative controls: the suite against deliberately weakened readers ---------------------


def _accept_any_mac(monkeypatch: pytest.MonkeyPatch) -> int:
    """Weaken every MAC check: each module's ``mac_matches`` accepts, ``chain_mac`` echoes.

    Returns how many places were patched.
    """
    patched = 0
    for module in [m for name, m in sys.modules.items() if name.startswith("flowvault.")]:
        if hasattr(module, "mac_matches"):
            monkeypatch.setattr(module, "mac_matches", lambda *_: True)
            patched += 1
        if hasattr(module, "chain_mac"):
            monkeypatch.setattr(module, "chain_mac", lambda event, *_: event.chain_mac)
            patched += 1
    return patched


TRIM_RULES: Final[Mapping[str, Callable[..., object]]] = {
    "_proves_trim": lambda *_: True,
}
"""Where verifiers ask whether an event proves a trim; turned off, any event does."""


def _accept_any_trim(monkeypatch: pytest.MonkeyPatch) -> int:
    """Turn the rule off that a raised ``first_index`` needs its ``ledger.trimmed`` event.

    Returns how many places were patched.
    """
    patched = 0
    for module in [m for name, m in sys.modules.items() if name.startswith("flowvault.")]:
        for rule, weakened in TRIM_RULES.items():
            if callable(getattr(module, rule, None)):
                monkeypatch.setattr(module, rule, weakened)
                patched += 1
    return patched


def _older_workflow_put_back(world: World) -> World:
    """Move the second workflow on, rebase the reference, then put its older row back."""
    row = _workflow_row(1)(world)
    older = read_row(world, row, RECORD_COLUMNS)
    world.runtime.workflows.transition(
        world.catalog.workflows[1], "planning", expected_state="intake", expected_version=1
    )
    moved = rebased(world)
    answers, pools = take_reference(moved.cells, moved.readers, [])
    moved = dataclasses.replace(
        moved, bench=dataclasses.replace(world.bench, readers=moved.readers, reference=answers)
    )
    moved.bench.pools = pools
    write_row(world, row, RECORD_COLUMNS, older)
    return moved


def test_weakened_readers_report_silently_wrong_data(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's judging reports silently wrong data when a reader's check is turned off.

    Three weakened readers, each faced with the attack its check exists for:
    no MAC check (a workflow chain edited and rehashed, its old MACs kept),
    no freshness check (an older workflow row put back whole), and a trim
    accepted without its ``ledger.trimmed`` event (a run's first events
    deleted and ``first_index`` raised). Each must leave some reader
    returning wrong data that the suite calls ``silently wrong``; if one did
    not, the suite could not tell a weakened reader from a sound one.
    """
    watch = reliability.Stopwatch()
    stream = stream_of(world.catalog.workflows[0])
    pristine = world.cells.dump()
    wrong: dict[str, list[str]] = {}

    def judge(bench: Bench) -> list[str]:
        trial = bench.judge(None)
        return sorted(name for name, outcome in trial.outcomes.items() if outcome == WRONG)

    with monkeypatch.context() as weakened:
        assert _accept_any_mac(weakened), "no MAC check found to weaken"
        _recompute(start=1, keep_macs=True)(world, stream)
        wrong["no MAC check"] = judge(world.bench)
        restore_tables(world.cells.raw, pristine)
    with monkeypatch.context() as weakened:
        assert _accept_any_trim(weakened), "no trim rule found to weaken"
        _delete_prefix(raise_first=True)(world, run_stream(world.catalog.runs[0]))
        wrong["trim accepted without its event"] = judge(world.bench)
        restore_tables(world.cells.raw, pristine)
    with monkeypatch.context() as weakened:
        weakened.setattr(
            "flowvault.application._freshness.StreamPolicy._is_stale", lambda *_: False
        )
        moved = _older_workflow_put_back(world)
        wrong["no freshness check"] = judge(moved.bench)
    print("\n" + "\n".join(f"{control}: read wrong by {names}" for control, names in wrong.items()))
    reliability.record(
        reliability.Figure(
            family="Tamper: weakened readers (negative controls, SQLite)",
            trials=len(wrong),
            anomalies=0,
            control_caught=all(wrong.values()),
            detail="; ".join(f"{c}: {len(n)} readers read wrong" for c, n in wrong.items()),
            seconds=watch.seconds,
        )
    )
    assert all(wrong.values()), f"a weakened reader went unnoticed: {wrong}"


# -- regressions the matrix found ------------------------------------------------------------


@BOTH_MARK_MODES
def test_undecodable_text_is_an_integrity_failure(world: World) -> None:
    """A stored text value that is no longer UTF-8 reads as ``INTEGRITY_FAILURE``.

    The driver reports such a value as a code-less ``OperationalError`` that
    quotes the damaged text; it used to surface as ``STORE_UNAVAILABLE``,
    which sends an operator looking for an outage instead of a restore.
    """
    raw = world.cells.raw
    stream = stream_of(world.catalog.workflows[0])
    raw.execute(
        "UPDATE ledger_events SET type = CAST(? AS TEXT) WHERE stream = ? AND idx = 1",
        (b"workflow.transitioned\xff", stream),
    )
    with pytest.raises(IntegrityFailure) as caught:
        world.runtime.workflow_events.events(world.catalog.workflows[0])
    assert caught.value.code == "INTEGRITY_FAILURE"
    assert "workflow.transitioned" not in str(caught.value)
    row = record_id(world, STATE_NAMESPACE, "side")
    raw.execute("UPDATE records SET key_id = CAST(? AS TEXT) WHERE id = ?", (b"k\xc3(", row))
    with pytest.raises(IntegrityFailure):
        world.runtime.state("side").load()


@pytest.mark.postgres
def test_listed_stream_without_events_fails_the_audit(
    tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """A stream the catalog lists but that holds no events fails ``ledger verify --all``.

    Retention never removes a head event, so such a listing means the catalog
    row was altered (here, renamed); the audit used to stop with ``NOT_FOUND``.
    The adapter now refuses the page itself (it disagrees with the stream
    row), which the audit reports as an edited stream.
    """
    settings = Settings(
        backend="postgres",
        home=tmp_path / "unused",
        postgres_dsn=SecretStr(postgres_server.dsn),
        postgres_schema=pg_schema,
        postgres_pool_size=1,
    )
    with bootstrap(
        settings, key=KEY, clock=FrozenClock(), ids=SequentialIds("id"), create=True
    ) as runtime:
        record, _ = runtime.workflows.create(_order(1))
        with postgres_server.admin() as admin:
            admin.execute(f"SET search_path TO {pg_schema}")
            admin.execute(
                "UPDATE ledger_streams SET stream = 'workflow/renamed' WHERE stream = %s",
                (stream_of(record.workflow_id),),
            )
        report = LedgerAudit(runtime.store, None).run()
    assert not report.ok
    assert [(f.stream, f.defect.value) for f in report.failures] == [("workflow/renamed", "edited")]


@BOTH_MARK_MODES
def test_altered_label_index_cannot_steer_a_purge(world: World) -> None:
    """An index row edited to look expired makes the purge fail closed, deleting nothing.

    Retention selects through the label index; it used to delete an action
    result whose own (sealed) expiry was a day away, leaving a tombstone as
    if it had expired. Listings now check each row's labels against the filters.
    """
    raw = world.cells.raw
    workflow, action = world.catalog.action_results[0]
    row = record_id(world, ACTION_RESULTS, "\x1f".join((workflow, action)))
    raw.execute(
        "UPDATE record_labels SET int_value = 1 WHERE record_id = ? AND name = 'expires_at'",
        (row,),
    )
    before = world.runtime.store.namespace_counts()
    with pytest.raises(IntegrityFailure) as caught:
        world.runtime.action_results.purge_expired()
    assert caught.value.code == "INTEGRITY_FAILURE"
    assert world.runtime.store.namespace_counts() == before
    assert world.runtime.action_results.get_action_result(workflow, action) is not None
