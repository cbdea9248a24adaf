"""Checkpoints, approvals, request-bound idempotency and evidence, on memory and SQLite."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from listings import every_page

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    ApprovalService,
    CheckpointService,
    EvidenceService,
    Guard,
    IdempotencyService,
    SealedRepository,
    SecureObjectStore,
    UnitOfWork,
    UnreadableItem,
    Upsert,
)
from flowvault.application._freshness import WITNESS_KIND, record_stream
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    MAX_WITNESS_BYTES,
    REQUEST_IDEMPOTENCY,
    WITNESSES,
)
from flowvault.application._streams import read_stream, run_stream
from flowvault.application._tombstones import IDEMPOTENCY_STREAM, RETENTION_TOMBSTONE
from flowvault.application.testing import FrozenClock, SequentialIds, make_event
from flowvault.domain import (
    Approval,
    ApprovalAlreadyDecided,
    ApprovalDecisionNotAllowed,
    ApprovalExpired,
    ApprovalRequestConflict,
    ApprovalStatus,
    Checkpoint,
    CheckpointConsumed,
    CheckpointIntegrityFailure,
    CheckpointStatus,
    FlowvaultError,
    IdempotencyConflict,
    IntegrityFailure,
    IntegrityKeyRequired,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    StoreBusy,
    Witness,
    content_hash,
)
from flowvault.domain._approvals import MAX_WITNESS_LOCATORS
from flowvault.domain._canonical import canonical_json, digest_bytes
from flowvault.domain._ledger import verify_chain

MASTER_KEY = bytes(range(32))
RUN = "run-0001"
OTHER_RUN = "run-0002"
SECRET = "state-marker-iban-DE44-5001"
ACTOR = "actor-marker-mallory@example.org"
AUDIENCE = "audience-marker-finance-team"
PROMPT = "prompt-marker-pay-invoice-17"
PROMPT_DIGEST = content_hash(PROMPT)
DECISION = "approve-marker-7f3"
DECISIONS = (DECISION, "reject")
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


class World:
    """All four services over one store, with the clock and ids the test controls."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.store = store
        self.clock = FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(MASTER_KEY), self.clock)
        self.checkpoints = CheckpointService(self.repository, self.clock, integrity=self.repository)
        self.approvals = ApprovalService(
            self.repository,
            self.clock,
            SequentialIds("ap"),
            checkpoints=self.checkpoints,
            integrity=self.repository,
        )
        self.idempotency = IdempotencyService(self.repository, self.clock)
        self.evidence = EvidenceService(self.repository, self.clock, integrity=self.repository)

    def checkpoint(
        self, run_id: str = RUN, cursor: str = "node-b", **changes: object
    ) -> Checkpoint:
        fields: dict[str, object] = {
            "state": {"iban": SECRET, "step": 3},
            "budgets": {"tokens": 1000, "cost": 2.5},
            "counters": {"steps": 3, "retries": 0},
            "dependency_summary": {"tools": ["search", "fetch"]},
            "terminal_cursor": None,
            "event_cursor": 4,
        }
        return self.checkpoints.create_checkpoint(
            run_id,
            cursor,
            **{**fields, **changes},  # type: ignore[arg-type]
        )

    def request(self, checkpoint: Checkpoint, **changes: object) -> Approval:
        fields: dict[str, object] = {
            "expected_state_digest": checkpoint.state_digest,
            "expected_budgets": checkpoint.budgets,
            "expected_counters": checkpoint.counters,
            "expected_dependency_digest": checkpoint.dependency_digest,
            "audience": AUDIENCE,
            "prompt_digest": PROMPT_DIGEST,
            "allowed_decisions": DECISIONS,
            "expires_at": self.clock.now() + HOUR,
        }
        return self.approvals.request_approval(
            checkpoint.checkpoint_id,
            **{**fields, **changes},  # type: ignore[arg-type]
        )

    def plant(
        self, namespace: str, natural_key: str, change: Callable[[dict[str, JsonValue]], None]
    ) -> None:
        """Rewrite a sealed document through the port, as someone holding the cipher could.

        The row keeps the ledger event it was bound to, so what catches the
        forgery is the check of the content, not the record's freshness.
        """
        opened = self.repository.read(namespace, natural_key)
        assert opened is not None
        assert isinstance(opened.document, dict)
        document = dict(opened.document)
        change(document)
        self.repository.write(
            namespace,
            natural_key,
            document,
            expected=opened.revision,
            labels=dict(opened.metadata.labels),
            ledger_index=opened.metadata.header.ledger_index,
        )

    def stream(self, name: str) -> list[LedgerEvent]:
        """Return a stream's events after checking that its chain is intact."""
        events = list(read_stream(self.store, name))
        verify_chain(events).raise_for_defect()
        return events

    def visible(self) -> tuple[object, ...]:
        """Everything a refused call must leave exactly as it was."""
        spaces = (CHECKPOINTS, APPROVALS, APPROVAL_SLOTS, REQUEST_IDEMPOTENCY, WITNESSES)
        records = tuple(self.store.list(space, limit=200) for space in spaces)
        streams = (run_stream(RUN), run_stream(OTHER_RUN), IDEMPOTENCY_STREAM)
        return records + tuple(self.store.read_ledger(name, limit=200) for name in streams)


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def race(count: int, call: Callable[[], object]) -> list[object]:
    """Run ``call`` on ``count`` threads released together; return results and errors."""
    barrier = threading.Barrier(count)
    outcomes: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            outcome: object = call()
        except FlowvaultError as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outcomes) == count
    return outcomes


# -- checkpoints ------------------------------------------------------------------


def test_checkpoint_round_trips_with_its_digests(world: World) -> None:
    """A created checkpoint loads back verified, pending, with content hashes of its parts."""
    made = world.checkpoint()
    assert made.checkpoint_id.startswith("cp_")
    assert len(made.checkpoint_id) == 35
    assert made.status is CheckpointStatus.PENDING
    assert made.state_digest == content_hash(made.state)
    assert made.dependency_digest == content_hash({"tools": ["search", "fetch"]})
    assert made.integrity_digest.startswith("sha256:")
    assert world.checkpoints.load_checkpoint(made.checkpoint_id) == made
    assert SECRET not in repr(made)


def test_same_checkpoint_again_returns_the_first(world: World) -> None:
    """Re-creating identical content later returns the stored checkpoint and writes nothing."""
    first = world.checkpoint()
    world.clock.advance()
    before = world.visible()
    assert world.checkpoint() == first
    assert world.visible() == before


@pytest.mark.parametrize(
    "change",
    [
        {"state": {"iban": "other"}},
        {"budgets": {"tokens": 999}},
        {"counters": {"steps": 4}},
        {"event_cursor": 5},
    ],
)
def test_other_content_under_the_same_id_conflicts(world: World, change: dict[str, object]) -> None:
    """The same run and cursor with other content is IDEMPOTENCY_CONFLICT; nothing changes."""
    world.checkpoint()
    before = world.visible()
    with pytest.raises(IdempotencyConflict) as caught:
        world.checkpoint(**change)  # type: ignore[arg-type]
    assert caught.value.code == "IDEMPOTENCY_CONFLICT"
    assert world.visible() == before


def test_latest_checkpoint_is_the_newest_of_its_run(world: World) -> None:
    """The newest creation wins, consumed or not; ties go to the later event cursor."""
    assert world.checkpoints.latest_checkpoint(RUN) is None
    first = world.checkpoint(cursor="a", event_cursor=1)
    world.clock.advance()
    world.checkpoint(cursor="b", event_cursor=2)
    tied = world.checkpoint(cursor="c", event_cursor=3)
    world.checkpoint(run_id=OTHER_RUN, cursor="z", event_cursor=9)
    world.clock.advance()
    world.checkpoints.consume_checkpoint(first.checkpoint_id)
    latest = world.checkpoints.latest_checkpoint(RUN)
    assert latest is not None
    assert latest.checkpoint_id == tied.checkpoint_id
    newest = world.checkpoint(cursor="d", event_cursor=0)
    assert world.checkpoints.latest_checkpoint(RUN) == newest


def test_unknown_checkpoint_is_not_found(world: World) -> None:
    """Loading or consuming a checkpoint that does not exist raises NOT_FOUND."""
    for call in (world.checkpoints.load_checkpoint, world.checkpoints.consume_checkpoint):
        with pytest.raises(NotFound) as caught:
            call("cp_" + "0" * 32)
        assert caught.value.code == "NOT_FOUND"


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "x"},
        {"state": float("nan")},
        {"counters": {"steps": -1}},
        {"counters": {"steps": True}},
        {"event_cursor": -1},
        {"budgets": {f"b{n}": n for n in range(65)}},
    ],
)
def test_malformed_checkpoints_are_invalid_input(world: World, change: dict[str, object]) -> None:
    """A bad run id, non-JSON state or out-of-range counter is INVALID_INPUT; nothing is written."""
    before = world.visible()
    with pytest.raises(InvalidInput) as caught:
        world.checkpoint(**change)  # type: ignore[arg-type]
    assert caught.value.code == "INVALID_INPUT"
    assert world.visible() == before


def _forge_state(document: dict[str, JsonValue]) -> None:
    document["state"] = {"iban": "forged"}


def _forge_state_and_digest(document: dict[str, JsonValue]) -> None:
    document["state"] = {"iban": "forged"}
    document["state_digest"] = content_hash({"iban": "forged"})


def _forge_dependencies(document: dict[str, JsonValue]) -> None:
    document["dependency_summary"] = {"tools": []}


def _forge_budget(document: dict[str, JsonValue]) -> None:
    document["budgets"] = {"tokens": 10**6, "cost": 2.5}


def _forge_status(document: dict[str, JsonValue]) -> None:
    document["status"] = "consumed"
    document["consumed_at"] = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("forge", "field"),
    [
        (_forge_state, "state_digest"),
        (_forge_state_and_digest, "integrity_digest"),
        (_forge_dependencies, "dependency_digest"),
        (_forge_budget, "integrity_digest"),
        (_forge_status, "integrity_digest"),
    ],
)
def test_tampered_checkpoint_fails_verification(
    world: World, forge: Callable[[dict[str, JsonValue]], None], field: str
) -> None:
    """A checkpoint rewritten through the port fails the digest it no longer matches."""
    made = world.checkpoint()
    world.plant(CHECKPOINTS, made.checkpoint_id, forge)
    calls: list[Callable[[], object]] = [
        lambda: world.checkpoints.load_checkpoint(made.checkpoint_id),
        lambda: world.checkpoints.latest_checkpoint(RUN),
        lambda: world.checkpoints.consume_checkpoint(made.checkpoint_id),
        lambda: world.request(made),
    ]
    for call in calls:
        with pytest.raises(CheckpointIntegrityFailure) as caught:
            call()
        assert caught.value.code == "CHECKPOINT_INTEGRITY_FAILURE"
        assert field in str(caught.value.details["fields"])
        assert SECRET not in str(caught.value)


def test_broken_seal_is_a_checkpoint_integrity_failure(world: World) -> None:
    """A sealed payload moved to another revision fails as CHECKPOINT_INTEGRITY_FAILURE."""
    made = world.checkpoint()
    digest = world.repository.key_digest(CHECKPOINTS, made.checkpoint_id)
    record = world.store.load(CHECKPOINTS, digest)
    assert record is not None
    meta = record.metadata
    header = meta.header.model_copy(update={"revision": meta.revision + 1})
    moved = Upsert(
        header=header, payload=record.payload, expected=meta.revision, labels=meta.labels
    )
    world.store.commit(UnitOfWork(upserts=[moved]))
    with pytest.raises(CheckpointIntegrityFailure):
        world.checkpoints.load_checkpoint(made.checkpoint_id)


def test_checkpoint_is_consumed_exactly_once(world: World) -> None:
    """The first consume marks the checkpoint consumed; a second is CHECKPOINT_CONSUMED."""
    made = world.checkpoint()
    world.clock.advance()
    consumed = world.checkpoints.consume_checkpoint(made.checkpoint_id)
    assert consumed.status is CheckpointStatus.CONSUMED
    assert consumed.consumed_at == world.clock.now()
    assert consumed.content() == made.content()
    assert world.checkpoints.load_checkpoint(made.checkpoint_id) == consumed
    with pytest.raises(CheckpointConsumed) as caught:
        world.checkpoints.consume_checkpoint(made.checkpoint_id)
    assert caught.value.code == "CHECKPOINT_CONSUMED"


def test_racing_threads_consume_once(world: World) -> None:
    """Eight threads consuming one checkpoint: one wins, seven get CHECKPOINT_CONSUMED."""
    made = world.checkpoint()
    outcomes = race(8, lambda: world.checkpoints.consume_checkpoint(made.checkpoint_id))
    winners = [o for o in outcomes if isinstance(o, Checkpoint)]
    assert len(winners) == 1
    assert (
        sorted(type(o).__name__ for o in outcomes if o not in winners) == ["CheckpointConsumed"] * 7
    )


CONSUMER = """
import sys, time
from pathlib import Path
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import CheckpointService, SealedRepository
from flowvault.application.testing import FrozenClock
from flowvault.domain import CheckpointConsumed

path, go, checkpoint_id = sys.argv[1:4]
with SQLiteSecureObjectStore.open(Path(path)) as store:
    repository = SealedRepository(store, AesGcmCipher(bytes(range(32))), FrozenClock())
    service = CheckpointService(repository, repository.clock, integrity=repository)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the go file never appeared")
        time.sleep(0.005)
    try:
        service.consume_checkpoint(checkpoint_id)
    except CheckpointConsumed:
        print("consumed", flush=True)
    else:
        print("won", flush=True)
"""


DECIDER = """
import os, sys, time
from pathlib import Path
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import ApprovalService, CheckpointService, SealedRepository
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import ApprovalAlreadyDecided

path, go, approval_id = sys.argv[1:4]
with SQLiteSecureObjectStore.open(Path(path)) as store:
    repository = SealedRepository(store, AesGcmCipher(bytes(range(32))), FrozenClock())
    checkpoints = CheckpointService(repository, repository.clock, integrity=repository)
    service = ApprovalService(
        repository, repository.clock, SequentialIds("x"),
        checkpoints=checkpoints, integrity=repository,
    )
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the go file never appeared")
        time.sleep(0.005)
    try:
        service.decide(approval_id, sys.argv[4], f"process-actor-{os.getpid()}")
    except ApprovalAlreadyDecided:
        print("consumed", flush=True)
    else:
        print("won", flush=True)
"""


def _race_processes(script: str, path: Path, go: Path, *args: str) -> list[str]:
    """Start eight processes on ``script``, release them together, return their answers."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), str(go), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready", worker.communicate(timeout=60)[1]
        go.touch()
        results = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for worker, (_, err) in zip(workers, results, strict=True):
        assert worker.returncode == 0, err
    return sorted(out.strip() for out, _ in results)


def test_racing_processes_consume_once(tmp_path: Path) -> None:
    """Eight processes consuming one checkpoint in one SQLite file: exactly one wins."""
    path, go = tmp_path / "data" / "store.db", tmp_path / "go"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        made = World(store).checkpoint()
    answers = _race_processes(CONSUMER, path, go, made.checkpoint_id)
    assert answers == ["consumed"] * 7 + ["won"]
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        loaded = World(store).checkpoints.load_checkpoint(made.checkpoint_id)
    assert loaded.status is CheckpointStatus.CONSUMED


def test_racing_processes_decide_once(tmp_path: Path) -> None:
    """Eight processes, as eight deciders, deciding one approval: exactly one decision lands."""
    path, go = tmp_path / "data" / "store.db", tmp_path / "go"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        world = World(store)
        approval = world.request(world.checkpoint())
    answers = _race_processes(DECIDER, path, go, approval.approval_id, DECISION)
    assert answers == ["consumed"] * 7 + ["won"]
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        world = World(store)
        decided = world.approvals.get_approval(approval.approval_id)
        assert decided.status is ApprovalStatus.DECIDED
        events = list(read_stream(store, run_stream(RUN)))
    assert sum(e.type == "approval.decided" for e in events) == 1


def test_everything_durable_needs_the_integrity_key(world: World) -> None:
    """Without an integrity key, checkpoint and approval services are not built.

    They take the keyed digester at construction: built without one, they
    refuse with INTEGRITY_KEY_REQUIRED before any call can write.
    """
    made = world.checkpoint()
    world.request(made)
    builds: list[Callable[[], object]] = [
        lambda: CheckpointService(world.repository, world.clock, integrity=None),  # type: ignore[arg-type]
        lambda: ApprovalService(
            world.repository,
            world.clock,
            SequentialIds("x"),
            checkpoints=world.checkpoints,
            integrity=None,  # type: ignore[arg-type]
        ),
    ]
    before = world.visible()
    for call in builds:
        with pytest.raises(IntegrityKeyRequired) as caught:
            call()
        assert caught.value.code == "INTEGRITY_KEY_REQUIRED"
    assert world.visible() == before


def test_witnesses_verify_only_under_the_key_they_were_captured_with(world: World) -> None:
    """Evidence is signed by the keyed digester given at construction; another key refuses it."""
    now = world.clock.now()
    captured = world.evidence.capture_witness(
        "https://e.test/a", b"x", "text/plain", "primary", now
    )
    other = SealedRepository(world.store, AesGcmCipher(bytes(range(1, 33))), world.clock)
    elsewhere = EvidenceService(world.repository, world.clock, integrity=other)
    before = world.visible()
    with pytest.raises(IntegrityFailure) as caught:
        elsewhere.load_witness(captured.content_digest)
    assert caught.value.code == "INTEGRITY_FAILURE"
    with pytest.raises(IntegrityFailure):
        elsewhere.capture_witness("https://e.test/b", b"x", "text/plain", "primary", now)
    assert world.visible() == before
    assert world.evidence.load_witness(digest_bytes(b"x")) == captured


# -- approval requests --------------------------------------------------------------


def test_request_binds_to_the_checkpoint(world: World) -> None:
    """An approval names its checkpoint's integrity digest and keeps the request sealed."""
    made = world.checkpoint()
    approval = world.request(made, allowed_decisions=("reject", DECISION))
    assert approval.checkpoint_digest == made.integrity_digest
    assert approval.status is ApprovalStatus.PENDING
    assert approval.allowed_decisions == tuple(sorted(DECISIONS))
    assert world.approvals.get_approval(approval.approval_id) == approval
    assert AUDIENCE not in repr(approval)
    for space in (APPROVALS, APPROVAL_SLOTS):
        for meta in world.store.list(space).items:
            loaded = world.store.load(meta.namespace, meta.key_digest)
            assert loaded is not None
            assert AUDIENCE.encode() not in loaded.payload
            assert AUDIENCE not in repr(meta)


def test_identical_pending_request_is_returned(world: World) -> None:
    """The same request again returns the pending approval, even with reordered decisions."""
    made = world.checkpoint()
    expires = world.clock.now() + HOUR
    first = world.request(made, expires_at=expires)
    world.clock.advance()
    before = world.visible()
    again = world.request(made, expires_at=expires, allowed_decisions=tuple(reversed(DECISIONS)))
    assert again == first
    assert world.visible() == before


@pytest.mark.parametrize(
    "change",
    [
        {"prompt_digest": content_hash("another prompt")},
        {"allowed_decisions": ("approve",)},
        {"expires_at": "later"},
    ],
)
def test_different_pending_request_conflicts(world: World, change: dict[str, object]) -> None:
    """Another request for the same checkpoint and audience is APPROVAL_REQUEST_CONFLICT."""
    made = world.checkpoint()
    world.request(made)
    if change.get("expires_at") == "later":
        change = {"expires_at": world.clock.now() + 2 * HOUR}
    before = world.visible()
    with pytest.raises(ApprovalRequestConflict) as caught:
        world.request(made, **change)
    assert caught.value.code == "APPROVAL_REQUEST_CONFLICT"
    assert AUDIENCE not in str(caught.value)
    assert world.visible() == before


def test_each_audience_gets_its_own_request(world: World) -> None:
    """Another audience for the same checkpoint is a separate approval."""
    made = world.checkpoint()
    first = world.request(made)
    second = world.request(made, audience="legal-team")
    assert first.approval_id != second.approval_id


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"expected_state_digest": content_hash({"other": 1})}, "state_digest"),
        ({"expected_budgets": {"tokens": 1000}}, "budgets"),
        ({"expected_counters": {"steps": 2, "retries": 0}}, "counters"),
        ({"expected_dependency_digest": content_hash(None)}, "dependency_digest"),
    ],
)
def test_stale_expectations_are_a_revision_conflict(
    world: World, change: dict[str, object], field: str
) -> None:
    """A caller whose view of the checkpoint is stale gets REVISION_CONFLICT naming the field."""
    made = world.checkpoint()
    before = world.visible()
    with pytest.raises(RevisionConflict) as caught:
        world.request(made, **change)
    assert caught.value.code == "REVISION_CONFLICT"
    assert caught.value.details["fields"] == field
    assert world.visible() == before


def test_request_on_a_consumed_checkpoint_is_refused(world: World) -> None:
    """A consumed checkpoint cannot be put up for approval."""
    made = world.checkpoint()
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    with pytest.raises(CheckpointConsumed):
        world.request(made)


@pytest.mark.parametrize(
    "change",
    [
        {"expires_at": "now"},
        {"allowed_decisions": ()},
        {"allowed_decisions": ("approve", "approve")},
        {"allowed_decisions": ("Approve now",)},
        {"audience": ""},
        {"audience": "team\x00"},
        {"prompt_digest": PROMPT},
        {"expires_at": datetime(2030, 1, 1)},
    ],
)
def test_malformed_requests_are_invalid_input(world: World, change: dict[str, object]) -> None:
    """Bad decisions, audience, prompt digest or deadline are INVALID_INPUT; nothing is written."""
    made = world.checkpoint()
    if change.get("expires_at") == "now":
        change = {"expires_at": world.clock.now()}
    before = world.visible()
    with pytest.raises(InvalidInput):
        world.request(made, **change)
    assert world.visible() == before


def test_unknown_approval_and_checkpoint_are_not_found(world: World) -> None:
    """Requests on unknown checkpoints and verbs on unknown approvals raise NOT_FOUND."""
    made = world.checkpoint()
    ghost = made.model_copy(update={"checkpoint_id": "cp_" + "1" * 32})
    calls: list[Callable[[], object]] = [
        lambda: world.request(ghost),
        lambda: world.approvals.get_approval("ap-999999"),
        lambda: world.approvals.decide("ap-999999", DECISION, ACTOR),
    ]
    for call in calls:
        with pytest.raises(NotFound):
            call()


# -- decisions ----------------------------------------------------------------------


def test_decision_consumes_the_checkpoint(world: World) -> None:
    """A decision is recorded and the checkpoint consumed together; both are returned."""
    made = world.checkpoint()
    approval = world.request(made)
    world.clock.advance()
    decided, resume = world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    assert (decided.status, decided.decision, decided.actor) == (
        ApprovalStatus.DECIDED,
        DECISION,
        ACTOR,
    )
    assert decided.decided_at == world.clock.now()
    assert resume.status is CheckpointStatus.CONSUMED
    assert resume.state == made.state
    assert world.approvals.get_approval(approval.approval_id) == decided
    assert world.checkpoints.load_checkpoint(made.checkpoint_id) == resume
    assert ACTOR not in repr(decided)


def test_second_decision_is_already_decided(world: World) -> None:
    """Deciding a decided approval is APPROVAL_ALREADY_DECIDED and changes nothing."""
    approval = world.request(world.checkpoint())
    world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    before = world.visible()
    with pytest.raises(ApprovalAlreadyDecided) as caught:
        world.approvals.decide(approval.approval_id, "reject", "someone-else")
    assert caught.value.code == "APPROVAL_ALREADY_DECIDED"
    assert world.visible() == before


@pytest.mark.parametrize("decision", ["approve", "", "REJECT"])
def test_disallowed_decision_changes_nothing(world: World, decision: str) -> None:
    """A decision outside the allowed set is APPROVAL_DECISION_NOT_ALLOWED, even when late."""
    made = world.checkpoint()
    approval = world.request(made)
    before = world.visible()
    for moment in (world.clock.now(), world.clock.now() + 2 * HOUR):
        with pytest.raises(ApprovalDecisionNotAllowed) as caught:
            world.approvals.decide(approval.approval_id, decision, ACTOR, moment)
        assert caught.value.code == "APPROVAL_DECISION_NOT_ALLOWED"
    assert world.visible() == before


def test_malformed_actor_is_invalid_input(world: World) -> None:
    """An empty or overlong actor is refused before anything is read or written."""
    approval = world.request(world.checkpoint())
    before = world.visible()
    for actor in ("", "a" * 257):
        with pytest.raises(InvalidInput):
            world.approvals.decide(approval.approval_id, DECISION, actor)
    assert world.visible() == before


def test_late_decision_records_the_expiry_then_raises(world: World) -> None:
    """At the deadline the approval expires and the checkpoint is consumed before the error."""
    made = world.checkpoint()
    approval = world.request(made)
    with pytest.raises(ApprovalExpired) as caught:
        world.approvals.decide(approval.approval_id, DECISION, ACTOR, approval.expires_at)
    assert caught.value.code == "APPROVAL_EXPIRED"
    expired = world.approvals.get_approval(approval.approval_id)
    assert (expired.status, expired.decision, expired.actor) == (ApprovalStatus.EXPIRED, None, None)
    assert expired.decided_at == approval.expires_at
    consumed = world.checkpoints.load_checkpoint(made.checkpoint_id)
    assert consumed.status is CheckpointStatus.CONSUMED
    with pytest.raises(ApprovalAlreadyDecided):
        world.approvals.decide(approval.approval_id, DECISION, ACTOR)


def test_late_decision_after_the_clock_passes_the_deadline(world: World) -> None:
    """Without an explicit ``now`` the service clock decides lateness."""
    approval = world.request(world.checkpoint())
    world.clock.advance(2 * HOUR)
    with pytest.raises(ApprovalExpired):
        world.approvals.decide(approval.approval_id, DECISION, ACTOR)


def test_checkpoint_used_by_another_audience_is_consumed(world: World) -> None:
    """When another approval consumed the checkpoint, a decision is refused and nothing changes."""
    made = world.checkpoint()
    finance = world.request(made)
    legal = world.request(made, audience="legal-team")
    world.approvals.decide(finance.approval_id, DECISION, ACTOR)
    before = world.visible()
    with pytest.raises(CheckpointConsumed):
        world.approvals.decide(legal.approval_id, "reject", "legal-reviewer")
    assert world.visible() == before
    assert world.approvals.get_approval(legal.approval_id) == legal


def test_checkpoint_resumed_directly_is_consumed(world: World) -> None:
    """A checkpoint consumed by a resume cannot also be consumed by a decision."""
    made = world.checkpoint()
    approval = world.request(made)
    world.checkpoints.consume_checkpoint(made.checkpoint_id)
    with pytest.raises(CheckpointConsumed):
        world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    assert world.approvals.get_approval(approval.approval_id).status is ApprovalStatus.PENDING


def test_racing_deciders_decide_once(world: World) -> None:
    """Eight deciders on eight threads: one wins, seven get APPROVAL_ALREADY_DECIDED."""
    made = world.checkpoint()
    approval = world.request(made)
    outcomes = race(
        8,
        lambda: world.approvals.decide(
            approval.approval_id, DECISION, f"{ACTOR}-{threading.get_ident()}"
        ),
    )
    winners = [o for o in outcomes if isinstance(o, tuple)]
    assert len(winners) == 1
    losers = [type(o).__name__ for o in outcomes if not isinstance(o, tuple)]
    assert losers == ["ApprovalAlreadyDecided"] * 7
    assert world.checkpoints.load_checkpoint(made.checkpoint_id).status is CheckpointStatus.CONSUMED


class FailOnApprovalWrites:
    """A store that refuses, before anything is applied, every unit writing an approval."""

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def commit(self, unit: UnitOfWork) -> None:
        if any(upsert.header.namespace == APPROVALS for upsert in unit.upserts):
            raise StoreBusy("injected failure")
        self._inner.commit(unit)


def test_failed_expiry_unit_applies_nothing(world: World) -> None:
    """If the expiry's unit fails, neither the expiry nor the consumption happens."""
    made = world.checkpoint()
    approval = world.request(made)
    faulty = SealedRepository(
        FailOnApprovalWrites(world.store),  # type: ignore[arg-type]
        AesGcmCipher(MASTER_KEY),
        world.clock,
    )
    checkpoints = CheckpointService(faulty, world.clock, integrity=faulty)
    approvals = ApprovalService(
        faulty, world.clock, SequentialIds("f"), checkpoints=checkpoints, integrity=faulty
    )
    world.clock.advance(2 * HOUR)
    before = world.visible()
    with pytest.raises(StoreBusy):
        approvals.decide(approval.approval_id, DECISION, ACTOR)
    assert world.visible() == before
    assert world.approvals.get_approval(approval.approval_id).status is ApprovalStatus.PENDING
    assert world.checkpoints.load_checkpoint(made.checkpoint_id).status is CheckpointStatus.PENDING
    with pytest.raises(ApprovalExpired):
        world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    assert world.checkpoints.load_checkpoint(made.checkpoint_id).status is CheckpointStatus.CONSUMED


def _forge_audience(document: dict[str, JsonValue]) -> None:
    document["audience"] = "everyone"


def _forge_decisions(document: dict[str, JsonValue]) -> None:
    document["allowed_decisions"] = ["approve", DECISION, "reject"]


def _forge_deadline(document: dict[str, JsonValue]) -> None:
    document["expires_at"] = "2030-01-01T00:00:00Z"


def _forge_shape(document: dict[str, JsonValue]) -> None:
    document["extra"] = 1


@pytest.mark.parametrize(
    "forge", [_forge_audience, _forge_decisions, _forge_deadline, _forge_shape]
)
def test_tampered_approval_fails_every_read(
    world: World, forge: Callable[[dict[str, JsonValue]], None]
) -> None:
    """An approval rewritten through the port is INTEGRITY_FAILURE wherever it is read."""
    approval = world.request(world.checkpoint())
    world.plant(APPROVALS, approval.approval_id, forge)
    calls: list[Callable[[], object]] = [
        lambda: world.approvals.get_approval(approval.approval_id),
        lambda: world.approvals.decide(approval.approval_id, DECISION, ACTOR),
    ]
    for call in calls:
        with pytest.raises(IntegrityFailure) as caught:
            call()
        assert caught.value.code == "INTEGRITY_FAILURE"
    listed = world.approvals.list_approvals(RUN)
    assert listed.items == ()
    digest = world.repository.key_digest(APPROVALS, approval.approval_id)
    assert listed.unreadable == (UnreadableItem(digest, "INTEGRITY_FAILURE"),)


def test_tampered_settled_approval_stops_the_purge(world: World) -> None:
    """Purging never deletes an approval that does not verify; nothing is removed."""
    approval = world.request(world.checkpoint())
    world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    world.plant(APPROVALS, approval.approval_id, _forge_audience)
    world.clock.advance(2 * DAY)
    before = world.visible()
    with pytest.raises(IntegrityFailure):
        world.approvals.purge(world.clock.now(), DAY)
    assert world.visible() == before


def test_list_is_newest_written_first_filtered_and_bounded(world: World) -> None:
    """Listing returns a run's approvals most recently written first, by status, in pages."""
    made = world.checkpoint()
    requested = []
    for audience in ("a-team", "b-team", "c-team"):
        requested.append(world.request(made, audience=audience))
        world.clock.advance()
    other = world.request(world.checkpoint(run_id=OTHER_RUN), audience="a-team")
    decided, _ = world.approvals.decide(requested[0].approval_id, DECISION, ACTOR)
    ids = [a.approval_id for a in world.approvals.list_approvals(RUN).items]
    assert ids == [decided.approval_id, requested[2].approval_id, requested[1].approval_id]
    everywhere = [a.approval_id for a in world.approvals.list_approvals().items]
    assert everywhere == [decided.approval_id, other.approval_id, *ids[1:]]
    assert world.approvals.list_approvals(RUN, status=ApprovalStatus.DECIDED).items == (decided,)
    assert [a.approval_id for a in world.approvals.list_approvals(status="pending").items] == [
        other.approval_id,
        requested[2].approval_id,
        requested[1].approval_id,
    ]
    pending = world.approvals.list_approvals(RUN, ApprovalStatus.PENDING, limit=1)
    assert [a.approval_id for a in pending.items] == [requested[2].approval_id]
    rest = world.approvals.list_approvals(
        RUN, ApprovalStatus.PENDING, limit=1, cursor=pending.next_cursor
    )
    assert [a.approval_id for a in rest.items] == [requested[1].approval_id]
    assert rest.next_cursor is None
    assert len(world.approvals.list_approvals(RUN, limit=10_000).items) == 3
    with pytest.raises(InvalidInput):
        world.approvals.list_approvals(RUN, limit=0)
    with pytest.raises(InvalidInput):
        world.approvals.list_approvals(RUN, status="maybe")  # type: ignore[arg-type]


def test_a_cursor_only_continues_the_listing_it_came_from(world: World) -> None:
    """A cursor of another run, status or listing, or a made-up one, is INVALID_INPUT."""
    made = world.checkpoint()
    for audience in ("a-team", "b-team"):
        world.request(made, audience=audience)
        world.clock.advance()
    cursor = world.approvals.list_approvals(RUN, limit=1).next_cursor
    assert cursor is not None
    for call in (
        lambda: world.approvals.list_approvals(OTHER_RUN, cursor=cursor),
        lambda: world.approvals.list_approvals(RUN, ApprovalStatus.PENDING, cursor=cursor),
        lambda: world.approvals.list_approvals(cursor=cursor),
        lambda: world.approvals.list_approvals(RUN, cursor="not-a-cursor"),
        lambda: world.approvals.list_approvals(RUN, cursor=cursor[:-4]),
    ):
        with pytest.raises(InvalidInput) as caught:
            call()
        assert caught.value.code == "INVALID_INPUT"
    assert len(world.approvals.list_approvals(RUN, cursor=cursor).items) == 1


def test_all_approvals_are_reachable_past_200(world: World) -> None:
    """More than a page of approvals: one page holds 200, the cursor reaches every one once."""
    made = world.checkpoint()
    wanted = {world.request(made, audience=f"team-{n}").approval_id for n in range(230)}
    first = world.approvals.list_approvals(RUN, limit=500)
    assert len(first.items) == 200
    assert first.next_cursor is not None
    items, unreadable = every_page(
        lambda cursor: world.approvals.list_approvals(RUN, limit=200, cursor=cursor)
    )
    assert unreadable == []
    assert sorted(a.approval_id for a in items) == sorted(wanted)


# -- receipts -----------------------------------------------------------------------


def test_receipt_holds_digests_only(world: World) -> None:
    """A decided approval's receipt names no actor, prompt, audience or decision in clear."""
    approval = world.request(world.checkpoint())
    decided, _ = world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    receipt = world.approvals.approval_receipt(decided)
    body = canonical_json(receipt.body())
    for marker in (ACTOR, PROMPT, AUDIENCE, DECISION, "reject", RUN):
        assert marker not in body
    assert PROMPT_DIGEST not in body
    assert receipt.approval == decided.integrity_digest
    assert receipt.checkpoint == decided.checkpoint_digest
    assert receipt.actor is not None
    assert receipt.decision is not None
    assert receipt.decided_at == decided.decided_at
    assert receipt.status is ApprovalStatus.DECIDED
    assert receipt.digest.startswith("sha256:")
    assert world.approvals.approval_receipt(decided).actor == receipt.actor


def test_pending_receipt_has_no_decision(world: World) -> None:
    """A pending approval's receipt leaves decision, actor and time empty."""
    receipt = world.approvals.approval_receipt(world.request(world.checkpoint()))
    assert (receipt.decision, receipt.actor, receipt.decided_at) == (None, None, None)


def test_receipt_refuses_an_altered_approval(world: World) -> None:
    """An approval object changed in memory does not verify, so no receipt is issued."""
    approval = world.request(world.checkpoint())
    decided, _ = world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    forged = decided.model_copy(update={"actor": "somebody-else"})
    with pytest.raises(IntegrityFailure):
        world.approvals.approval_receipt(forged)


# -- request-bound idempotency --------------------------------------------------------


def test_recall_replays_only_the_same_request(world: World) -> None:
    """A remembered response replays for its own request and conflicts for any other."""
    request: JsonValue = {"pay": SECRET, "amount": 12}
    assert world.idempotency.recall("req-1", request) is None
    assert world.idempotency.remember("req-1", request, {"paid": True}) == {"paid": True}
    assert world.idempotency.recall("req-1", {"amount": 12, "pay": SECRET}) == {"paid": True}
    assert world.idempotency.remember("req-1", request, {"paid": False}) == {"paid": True}
    calls: list[Callable[[], object]] = [
        lambda: world.idempotency.recall("req-1", {"pay": SECRET, "amount": 13}),
        lambda: world.idempotency.remember("req-1", {"other": 1}, {"paid": True}),
    ]
    for call in calls:
        with pytest.raises(IdempotencyConflict):
            call()
    (meta,) = world.store.list(REQUEST_IDEMPOTENCY).items
    loaded = world.store.load(meta.namespace, meta.key_digest)
    assert loaded is not None
    assert SECRET.encode() not in loaded.payload


def test_record_without_a_request_digest_is_never_replayed(world: World) -> None:
    """A planted record with no request digest is IDEMPOTENCY_CONFLICT, never a replay."""
    world.repository.write(
        REQUEST_IDEMPOTENCY, "req-1", {"response": {"paid": True}}, expected=Guard.ABSENT
    )
    calls: list[Callable[[], object]] = [
        lambda: world.idempotency.recall("req-1", {"amount": 12}),
        lambda: world.idempotency.remember("req-1", {"amount": 12}, {"paid": True}),
    ]
    for call in calls:
        with pytest.raises(IdempotencyConflict) as caught:
            call()
        assert caught.value.code == "IDEMPOTENCY_CONFLICT"


@pytest.mark.parametrize(
    ("key", "request_", "response"),
    [("", {}, {"ok": 1}), ("k" * 257, {}, {"ok": 1}), ("k", {}, None), ("k", float("inf"), 1)],
)
def test_malformed_idempotency_input_is_refused(
    world: World, key: str, request_: JsonValue, response: JsonValue
) -> None:
    """Empty or overlong keys, null responses and non-JSON requests are INVALID_INPUT."""
    with pytest.raises(InvalidInput):
        world.idempotency.remember(key, request_, response)


# -- evidence witnesses -----------------------------------------------------------------


def _witness_events(world: World, content_digest: str) -> list[LedgerEvent]:
    return world.stream(
        record_stream(WITNESS_KIND, world.repository.key_digest(WITNESSES, content_digest))
    )


def test_witness_is_stored_once_per_content_and_keeps_every_locator(world: World) -> None:
    """The same bytes from a second locator add that locator; the first source is kept."""
    content = b"%PDF-1.7 \x00\xff" + SECRET.encode()
    first = world.evidence.capture_witness(
        "https://example.test/doc?token=abc",
        content,
        "application/pdf",
        "primary",
        world.clock.now(),
    )
    assert first.content_digest == digest_bytes(content)
    assert first.size_bytes == len(content)
    assert first.locators == ("https://example.test/doc?token=abc",)
    world.clock.advance()
    again = world.evidence.capture_witness(
        "https://mirror.test/doc", content, "text/plain", "secondary", world.clock.now()
    )
    assert again.locators == ("https://example.test/doc?token=abc", "https://mirror.test/doc")
    assert again.locator == first.locator
    assert again.model_dump(exclude={"later_locators", "integrity_digest"}) == first.model_dump(
        exclude={"later_locators", "integrity_digest"}
    )
    assert world.evidence.load_witness(first.content_digest) == again
    assert len(world.store.list(WITNESSES).items) == 1
    events = _witness_events(world, first.content_digest)
    assert [event.type for event in events] == ["witness.captured", "witness.located"]
    assert "mirror.test" not in canonical_json([event.payload for event in events])
    assert "token=abc" not in repr(again)
    assert "mirror.test" not in repr(again)


def test_a_recorded_locator_captured_again_changes_nothing(world: World) -> None:
    """Repeating a capture from the first or a later locator returns the witness as stored."""
    content = b"evidence body"
    world.evidence.capture_witness(
        "https://a.test/", content, "text/plain", "primary", world.clock.now()
    )
    both = world.evidence.capture_witness(
        "https://b.test/", content, "text/plain", "primary", world.clock.now()
    )
    assert both.locators == ("https://a.test/", "https://b.test/")
    before = world.visible(), _witness_events(world, both.content_digest)
    world.clock.advance()
    for locator in ("https://a.test/", "https://b.test/"):
        repeat = world.evidence.capture_witness(
            locator, content, "text/html", "secondary", world.clock.now()
        )
        assert repeat == both
    assert (world.visible(), _witness_events(world, both.content_digest)) == before


def test_a_witness_records_at_most_its_bound_of_locators(world: World) -> None:
    """Up to ``MAX_WITNESS_LOCATORS`` are kept; one more is INVALID_INPUT with nothing written."""
    content = b"widely mirrored"
    now = world.clock.now()
    for number in range(MAX_WITNESS_LOCATORS):
        kept = world.evidence.capture_witness(
            f"https://m{number}.test/", content, "text/plain", "primary", now
        )
    assert kept.locators == tuple(f"https://m{n}.test/" for n in range(MAX_WITNESS_LOCATORS))
    before = world.visible(), _witness_events(world, kept.content_digest)
    with pytest.raises(InvalidInput) as caught:
        world.evidence.capture_witness(
            "https://one-more.test/", content, "text/plain", "primary", now
        )
    assert caught.value.details["limit"] == MAX_WITNESS_LOCATORS
    assert "one-more" not in str(caught.value)
    assert (world.visible(), _witness_events(world, kept.content_digest)) == before
    assert (
        world.evidence.capture_witness("https://m3.test/", content, "text/plain", "primary", now)
        == kept
    )


def test_a_witness_stored_with_one_locator_still_reads(world: World) -> None:
    """A witness document written before later locators were kept has no such field; it verifies."""
    content = b"captured by an older release"
    made = world.evidence.capture_witness(
        "https://a.test/", content, "text/plain", "primary", world.clock.now()
    )

    def older_shape(document: dict[str, JsonValue]) -> None:
        assert document.pop("later_locators") == []

    world.plant(WITNESSES, made.content_digest, older_shape)
    assert world.evidence.load_witness(made.content_digest) == made
    grown = world.evidence.capture_witness(
        "https://b.test/", content, "text/plain", "primary", world.clock.now()
    )
    assert grown.locators == ("https://a.test/", "https://b.test/")
    assert world.evidence.load_witness(made.content_digest) == grown


def test_concurrent_captures_from_new_locators_keep_them_all(world: World) -> None:
    """Racing captures of one content from different locators lose none of them."""
    content = b"raced evidence"
    now = world.clock.now()
    locators = [f"https://r{number}.test/" for number in range(4)]
    calls = iter(locators)
    lock = threading.Lock()

    def capture() -> object:
        with lock:
            locator = next(calls)
        return world.evidence.capture_witness(locator, content, "text/plain", "primary", now)

    outcomes = race(len(locators), capture)
    assert all(isinstance(outcome, Witness) for outcome in outcomes), outcomes
    stored = world.evidence.load_witness(digest_bytes(content))
    assert sorted(stored.locators) == locators


@pytest.mark.parametrize(
    ("locator", "media_type", "authority"),
    [
        ("", "text/plain", "primary"),
        ("x" * 2049, "text/plain", "primary"),
        ("https://a.test/\n", "text/plain", "primary"),
        ("https://a.test/", "text", "primary"),
        ("https://a.test/", "text/plain; charset=utf-8", "primary"),
        ("https://a.test/", "text/plain", "Primary Source"),
        ("https://a.test/", "text/plain", "p" * 65),
    ],
)
def test_malformed_witness_fields_are_invalid_input(
    world: World, locator: str, media_type: str, authority: str
) -> None:
    """Locator, media type and authority class are checked before anything is stored."""
    with pytest.raises(InvalidInput):
        world.evidence.capture_witness(locator, b"x", media_type, authority, world.clock.now())
    assert world.store.list(WITNESSES).items == ()


def test_witness_content_has_a_size_limit(world: World) -> None:
    """Content up to the limit is kept; one byte more is PAYLOAD_TOO_LARGE."""
    now = world.clock.now()
    largest = bytes(MAX_WITNESS_BYTES)
    kept = world.evidence.capture_witness(
        "https://a.test/", largest, "application/octet-stream", "primary", now
    )
    assert world.evidence.load_witness(kept.content_digest).content == largest
    with pytest.raises(PayloadTooLarge) as caught:
        world.evidence.capture_witness(
            "https://a.test/", largest + b"x", "text/plain", "primary", now
        )
    assert caught.value.code == "PAYLOAD_TOO_LARGE"
    for bad in ("text", None):
        with pytest.raises(InvalidInput):
            world.evidence.capture_witness("https://a.test/", bad, "text/plain", "primary", now)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        world.evidence.capture_witness(
            "https://a.test/",
            b"x",
            "text/plain",
            "primary",
            datetime(2026, 1, 1),
        )


def _forge_locator(document: dict[str, JsonValue]) -> None:
    document["locator"] = "https://forged.test/"


def _forge_later_locators(document: dict[str, JsonValue]) -> None:
    document["later_locators"] = ["https://forged.test/"]


def _forge_content(document: dict[str, JsonValue]) -> None:
    document["content"] = "Zm9yZ2Vk"


def _forge_content_and_size(document: dict[str, JsonValue]) -> None:
    document["content"] = "Zm9yZ2Vk"
    document["size_bytes"] = 6
    document["content_digest"] = digest_bytes(b"forged")


def _forge_encoding(document: dict[str, JsonValue]) -> None:
    document["content"] = "not base64!"


@pytest.mark.parametrize(
    "forge",
    [
        _forge_locator,
        _forge_later_locators,
        _forge_content,
        _forge_content_and_size,
        _forge_encoding,
    ],
)
def test_tampered_witness_fails_on_read(
    world: World, forge: Callable[[dict[str, JsonValue]], None]
) -> None:
    """A witness rewritten through the port is INTEGRITY_FAILURE on load and on recapture."""
    content = b"evidence body"
    made = world.evidence.capture_witness(
        "https://a.test/", content, "text/plain", "primary", world.clock.now()
    )
    world.plant(WITNESSES, made.content_digest, forge)
    with pytest.raises(IntegrityFailure):
        world.evidence.load_witness(made.content_digest)
    with pytest.raises(IntegrityFailure):
        world.evidence.capture_witness(
            "https://a.test/", content, "text/plain", "primary", world.clock.now()
        )


def test_unknown_or_malformed_witness_digest(world: World) -> None:
    """An unknown digest is NOT_FOUND; a malformed one is INVALID_INPUT."""
    with pytest.raises(NotFound):
        world.evidence.load_witness(digest_bytes(b"never captured"))
    with pytest.raises(InvalidInput):
        world.evidence.load_witness("sha256:xyz")


# -- retention ----------------------------------------------------------------------------


def _tombstones(events: list[LedgerEvent], kind: str) -> list[LedgerEvent]:
    return [
        event
        for event in events
        if event.type == RETENTION_TOMBSTONE
        and isinstance(event.payload, dict)
        and event.payload.get("kind") == kind
    ]


def test_purge_consumed_checkpoints_leaves_tombstones(world: World) -> None:
    """Old consumed checkpoints go, pending and recent ones stay; each leaves a tombstone."""
    head = make_event(run_stream(RUN), 0)
    world.store.commit(UnitOfWork(appends=[head]))
    old = [world.checkpoint(cursor=f"old-{n}") for n in range(5)]
    other = world.checkpoint(run_id=OTHER_RUN, cursor="old")
    for checkpoint in [*old, other]:
        world.checkpoints.consume_checkpoint(checkpoint.checkpoint_id)
    pending = world.checkpoint(cursor="pending")
    world.clock.advance(2 * DAY)
    recent = world.checkpoints.consume_checkpoint(world.checkpoint(cursor="recent").checkpoint_id)
    purged = world.checkpoints.purge(world.clock.now(), DAY, batch_size=4)
    assert purged == 6
    assert world.checkpoints.purge(world.clock.now(), DAY) == 0
    for gone in [*old, other]:
        with pytest.raises(NotFound):
            world.checkpoints.load_checkpoint(gone.checkpoint_id)
    assert world.checkpoints.load_checkpoint(pending.checkpoint_id) == pending
    assert world.checkpoints.load_checkpoint(recent.checkpoint_id) == recent
    events = world.stream(run_stream(RUN))
    assert events[0] == head
    tombstones = _tombstones(events, "checkpoint")
    assert [event.index for event in tombstones] == [1, 2, 3, 4, 5]
    assert len(_tombstones(world.stream(run_stream(OTHER_RUN)), "checkpoint")) == 1
    text = canonical_json([event.payload for event in tombstones])
    assert SECRET not in text
    assert all(old_cp.checkpoint_id not in text for old_cp in old)
    payload = tombstones[0].payload
    assert isinstance(payload, dict)
    assert set(payload) == {"kind", "record", "created_at", "consumed_at", "purged_at"}
    assert str(payload["record"]).startswith("sha256:")


def test_purge_settled_approvals_leaves_tombstones(world: World) -> None:
    """Decided and expired approvals go with their slots; pending ones stay."""
    decided = world.request(world.checkpoint(cursor="a"))
    world.approvals.decide(decided.approval_id, DECISION, ACTOR)
    late = world.request(world.checkpoint(cursor="b"))
    with pytest.raises(ApprovalExpired):
        world.approvals.decide(late.approval_id, DECISION, ACTOR, late.expires_at)
    waiting = world.request(world.checkpoint(cursor="c"), expires_at=world.clock.now() + 9 * DAY)
    world.clock.advance(2 * DAY)
    assert world.approvals.purge(world.clock.now(), DAY, batch_size=1) == 2
    for gone in (decided, late):
        with pytest.raises(NotFound):
            world.approvals.get_approval(gone.approval_id)
    assert world.approvals.get_approval(waiting.approval_id) == waiting
    assert len(world.store.list(APPROVAL_SLOTS).items) == 1
    events = world.stream(run_stream(RUN))
    tombstones = _tombstones(events, "approval")
    assert len(tombstones) == 2
    text = canonical_json([event.payload for event in tombstones])
    for marker in (ACTOR, AUDIENCE, DECISION, decided.approval_id):
        assert marker not in text


def test_purge_old_idempotency_records(world: World) -> None:
    """Records older than the horizon go, with tombstones in the idempotency stream."""
    for n in range(3):
        world.idempotency.remember(f"old-{n}", {"n": n}, {"ok": n})
    world.clock.advance(2 * DAY)
    world.idempotency.remember("new", {"n": 9}, {"ok": 9})
    assert world.idempotency.purge(world.clock.now(), DAY, batch_size=2) == 3
    assert world.idempotency.recall("old-0", {"n": 0}) is None
    assert world.idempotency.recall("new", {"n": 9}) == {"ok": 9}
    tombstones = _tombstones(world.stream(IDEMPOTENCY_STREAM), "idempotency")
    assert [event.index for event in tombstones] == [0, 1, 2]
    assert "old-0" not in canonical_json([event.payload for event in tombstones])


def test_purge_arguments_are_checked(world: World) -> None:
    """A negative age, a naive time or a batch below one is INVALID_INPUT."""
    now = world.clock.now()
    calls: list[Callable[[], object]] = [
        lambda: world.checkpoints.purge(now, timedelta(seconds=-1)),
        lambda: world.approvals.purge(now, DAY, batch_size=0),
        lambda: world.idempotency.purge(datetime(2026, 1, 1), DAY),
    ]
    for call in calls:
        with pytest.raises(InvalidInput):
            call()


def test_decision_is_recorded_in_the_run_stream_as_digests(world: World) -> None:
    """Deciding appends an approval.decided event holding only the receipt's digests."""
    checkpoint = world.checkpoint()
    approval = world.request(checkpoint)
    decided, _ = world.approvals.decide(approval.approval_id, DECISION, ACTOR)
    events = list(read_stream(world.store, run_stream(RUN)))
    (event,) = [e for e in events if e.type == "approval.decided"]
    assert event.payload == world.approvals.approval_receipt(decided).body()
    text = canonical_json(event.payload)
    assert ACTOR not in text
    assert AUDIENCE not in text
    assert f'"{DECISION}"' not in text
    verify_chain(events).raise_for_defect()
