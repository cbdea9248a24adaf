"""Graph run service scenarios, run on the memory adapter and on a real SQLite file."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from graph_services import graph_runs

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    DefinitionRegistry,
    Guard,
    LedgerTrim,
    RunService,
    SealedRepository,
    SecureObjectStore,
    TerminalReceipts,
    UnitOfWork,
    UnreadableItem,
    trim_unit,
)
from flowvault.application._graph_namespaces import (
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_DEFINITIONS,
    GRAPH_RUN_IDEMPOTENCY,
    GRAPH_RUN_RECEIPTS,
    GRAPH_RUNS,
)
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._streams import TRIM_EVENT, read_stream, run_stream
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.application.testing._fakes import EPOCH
from flowvault.domain import (
    DefinitionReferenced,
    IdempotencyConflict,
    IntegrityFailure,
    InvalidInput,
    InvalidTransition,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    TerminalReceipt,
    content_hash,
)
from flowvault.domain._canonical import canonical_json
from flowvault.domain._graph_runs import RUN_LIFECYCLE
from flowvault.domain._ledger import verify_chain

KEY = bytes(range(32))
SPEC_MARKER = "spec-marker-4be1-do-not-leak"
INPUT_MARKER = "input-marker-91c3-do-not-leak"
FINAL_MARKER = "final-marker-07aa-do-not-leak"
SPEC: JsonValue = {"nodes": ["plan", "act"], "note": SPEC_MARKER}
OTHER_SPEC: JsonValue = {"nodes": ["plan", "act", "review"]}
NAMESPACES = (
    GRAPH_DEFINITIONS,
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_RUNS,
    GRAPH_RUN_IDEMPOTENCY,
    GRAPH_RUN_RECEIPTS,
)


class World:
    """A run service over one store, with the clock and ids the test controls."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.store = store
        self.clock = FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)
        self.service = self.service_over(self.repository)
        self.definitions = DefinitionRegistry(self.repository, self.clock)
        self.receipts = TerminalReceipts(self.repository, self.repository)

    def service_over(self, repository: SealedRepository) -> RunService:
        return graph_runs(repository, self.clock, SequentialIds("run"))

    def purge(self, older_than: timedelta, batch_size: int = 200) -> int:
        """Purge runs finished before ``older_than`` ago, as the retention job does."""
        return purge_finished_runs(
            self.repository, self.clock, self.clock.now(), older_than, batch_size
        )

    def crashing(self, when: Callable[[UnitOfWork], bool]) -> RunService:
        """Return a service whose store raises, before writing, on units matching ``when``."""
        store = CrashingStore(self.store, when)
        return self.service_over(SealedRepository(store, AesGcmCipher(KEY), self.clock))  # type: ignore[arg-type]

    def start(self, definition: str = "triage", **options: object) -> str:
        run, _ = self.service.start_run(definition, {"ask": INPUT_MARKER}, **options)  # type: ignore[arg-type]
        return run.run_id

    def running(self, definition: str = "triage") -> str:
        run_id = self.start(definition)
        self.service.set_status(run_id, "running", expected_status="accepted")
        return run_id

    def finish(self, run_id: str, status: str = "completed") -> TerminalReceipt:
        return self.service.finish_run(
            run_id, status, expected_status="running", final_state={"answer": FINAL_MARKER}
        )

    def events(self, run_id: str) -> list[LedgerEvent]:
        return list(read_stream(self.store, run_stream(run_id)))

    def visible(self, *run_ids: str) -> tuple[object, ...]:
        """Everything a failed call must leave exactly as it was."""
        records = tuple(self.store.list(space, limit=200) for space in NAMESPACES)
        return records + tuple(tuple(self.events(run_id)) for run_id in run_ids)


class CrashingStore:
    """A store that raises on a chosen unit of work before delegating: an injected fault."""

    def __init__(self, inner: SecureObjectStore, when: Callable[[UnitOfWork], bool]) -> None:
        self._inner = inner
        self._when = when

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def commit(self, unit: UnitOfWork) -> None:
        if self._when(unit):
            raise RuntimeError("injected fault")
        self._inner.commit(unit)


def _holds_deletes(unit: UnitOfWork) -> bool:
    return bool(unit.deletes)


def _holds_receipt(unit: UnitOfWork) -> bool:
    return any(upsert.header.namespace == GRAPH_RUN_RECEIPTS for upsert in unit.upserts)


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world with one registered definition on each backend."""
    made = World(backend_store)
    made.definitions.register_definition("triage", SPEC)
    return made


# -- lifecycle --------------------------------------------------------------------


def test_run_lifecycle_shape() -> None:
    """The lifecycle starts accepted and ends in exactly four terminal states."""
    assert RUN_LIFECYCLE.name == "run_lifecycle"
    assert RUN_LIFECYCLE.initial == "accepted"
    assert RUN_LIFECYCLE.terminal == {
        "completed",
        "failed",
        "cancelled",
        "interrupted_non_resumable",
    }
    assert RUN_LIFECYCLE.targets("checkpointed") == {
        "running",
        "awaiting_approval",
        "failed",
        "cancelled",
        "interrupted_non_resumable",
    }
    assert not RUN_LIFECYCLE.can_transition("accepted", "completed")
    assert not RUN_LIFECYCLE.can_transition("awaiting_approval", "completed")


# -- definitions ------------------------------------------------------------------


def test_versions_are_named_by_content_and_identical_content_is_a_no_op(world: World) -> None:
    """Each distinct content is a version named by its hash; the same content changes nothing."""
    first, spec = world.definitions.get_definition("triage")
    assert first.version == content_hash(SPEC)
    assert spec == SPEC
    before = world.visible()
    world.clock.advance()
    again = world.definitions.register_definition("triage", SPEC)
    assert again == first
    assert world.visible() == before
    world.clock.advance()
    second = world.definitions.register_definition("triage", OTHER_SPEC)
    assert second.version == content_hash(OTHER_SPEC)
    assert world.definitions.get_definition("triage")[0] == second
    assert world.definitions.get_definition("triage", first.version) == (first, SPEC)
    assert world.definitions.definition_versions("triage") == [first, second]


def test_reregistering_an_old_content_makes_it_current_again(world: World) -> None:
    """Going back to an earlier content reuses its version record and its creation time."""
    first = world.definitions.get_definition("triage")[0]
    world.clock.advance()
    world.definitions.register_definition("triage", OTHER_SPEC)
    world.clock.advance()
    back = world.definitions.register_definition("triage", SPEC)
    assert back == first
    assert world.definitions.get_definition("triage")[0] == first
    assert len(world.definitions.definition_versions("triage")) == 2


def test_replacing_a_referenced_version_needs_overwrite(world: World) -> None:
    """A current version that a run references is replaced only with overwrite=True."""
    run_id = world.start()
    before = world.visible(run_id)
    with pytest.raises(DefinitionReferenced) as caught:
        world.definitions.register_definition("triage", OTHER_SPEC)
    assert caught.value.code == "DEFINITION_REFERENCED"
    assert world.visible(run_id) == before
    replaced = world.definitions.register_definition("triage", OTHER_SPEC, overwrite=True)
    assert world.definitions.get_definition("triage")[0] == replaced
    pinned = world.service.get_run(run_id).definition_version
    assert pinned == content_hash(SPEC)
    assert world.definitions.get_definition("triage", pinned)[1] == SPEC
    assert world.definitions.register_definition("triage", {"n": 3}).version == content_hash(
        {"n": 3}
    )


@pytest.mark.parametrize("definition_id", ["", "Triage", "9lives", "a" * 65, "has space", "a\x1fb"])
def test_malformed_definition_ids_are_invalid(world: World, definition_id: str) -> None:
    """Definition ids follow a short lowercase grammar."""
    with pytest.raises(InvalidInput):
        world.definitions.register_definition(definition_id, SPEC)
    with pytest.raises(InvalidInput):
        world.definitions.get_definition(definition_id)


def test_unknown_definitions_and_versions_are_not_found(world: World) -> None:
    """Reading, listing, deleting or starting an unknown definition or version is NOT_FOUND."""
    calls: list[Callable[[], object]] = [
        lambda: world.definitions.get_definition("nope"),
        lambda: world.definitions.get_definition("triage", content_hash("nope")),
        lambda: world.definitions.definition_versions("nope"),
        lambda: world.definitions.delete_definition("nope"),
        lambda: world.service.start_run("nope", {}),
        lambda: world.service.start_run("triage", {}, version=content_hash("nope")),
    ]
    for call in calls:
        with pytest.raises(NotFound) as caught:
            call()
        assert caught.value.code == "NOT_FOUND"
    with pytest.raises(InvalidInput):
        world.service.start_run("triage", {}, version="v1")


def test_delete_is_refused_while_any_run_references_any_version(world: World) -> None:
    """A run pinned to an old version still blocks deletion of the whole definition."""
    run_id = world.start()
    world.definitions.register_definition("triage", OTHER_SPEC, overwrite=True)
    before = world.visible(run_id)
    with pytest.raises(DefinitionReferenced) as caught:
        world.definitions.delete_definition("triage")
    assert caught.value.code == "DEFINITION_REFERENCED"
    assert world.visible(run_id) == before


def test_delete_removes_the_head_and_every_version(world: World) -> None:
    """Deleting an unreferenced definition removes all of its records and no others."""
    world.definitions.register_definition("triage", OTHER_SPEC)
    world.definitions.register_definition("triage", {"n": 3})
    world.definitions.register_definition("other", SPEC)
    assert world.definitions.delete_definition("triage") == 3
    with pytest.raises(NotFound):
        world.definitions.get_definition("triage")
    with pytest.raises(NotFound):
        world.definitions.get_definition("triage", content_hash(SPEC))
    assert len(world.store.list(GRAPH_DEFINITIONS).items) == 1
    assert len(world.store.list(GRAPH_DEFINITION_VERSIONS).items) == 1
    assert world.definitions.get_definition("other")[1] == SPEC
    again = world.definitions.register_definition("triage", SPEC)
    assert world.definitions.definition_versions("triage") == [again]


def test_delete_is_one_unit_of_work(world: World) -> None:
    """A fault on the unit holding the deletes deletes nothing at all."""
    world.definitions.register_definition("triage", OTHER_SPEC)
    before = world.visible()
    crashing = CrashingStore(world.store, _holds_deletes)
    repository = SealedRepository(crashing, AesGcmCipher(KEY), world.clock)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="injected fault"):
        DefinitionRegistry(repository, world.clock).delete_definition("triage")
    assert world.visible() == before
    assert len(world.definitions.definition_versions("triage")) == 2
    assert world.definitions.delete_definition("triage") == 2
    assert world.store.list(GRAPH_DEFINITION_VERSIONS).items == ()


# -- runs ---------------------------------------------------------------------------


def test_start_pins_the_current_version_and_records_acceptance(world: World) -> None:
    """A new run is accepted at revision 1, pinned, with one run.accepted event."""
    run, created = world.service.start_run(
        "triage", {"ask": INPUT_MARKER}, budgets={"max_nodes": 20}
    )
    assert created
    assert (run.status, run.revision, run.node_count, run.failed_attempts) == ("accepted", 1, 0, 0)
    assert run.definition_version == content_hash(SPEC)
    assert run.budgets == {"max_nodes": 20}
    assert run.started_at == world.clock.now()
    assert run.finished_at is None
    assert world.service.get_run(run.run_id) == run
    (event,) = world.events(run.run_id)
    assert (event.type, event.from_state, event.to_state) == ("run.accepted", None, "accepted")
    assert INPUT_MARKER not in canonical_json(event.payload)
    assert INPUT_MARKER not in repr(run)


def test_start_with_an_explicit_version(world: World) -> None:
    """A run may pin an older version than the current one."""
    old = content_hash(SPEC)
    world.definitions.register_definition("triage", OTHER_SPEC)
    current, _ = world.service.start_run("triage", {})
    pinned, _ = world.service.start_run("triage", {}, version=old)
    assert current.definition_version == content_hash(OTHER_SPEC)
    assert pinned.definition_version == old


def test_same_idempotency_key_same_request_returns_the_first(world: World) -> None:
    """A retried start returns the first run, created=False, and writes nothing."""
    first, _ = world.service.start_run("triage", {"n": 1}, idempotency_key="client-4471-req-9")
    before = world.visible(first.run_id)
    world.clock.advance()
    again, created = world.service.start_run(
        "triage", {"n": 1}, idempotency_key="client-4471-req-9"
    )
    assert not created
    assert again == first
    assert world.visible(first.run_id) == before
    assert first.idempotency_key_digest is not None
    assert "client-4471" not in first.idempotency_key_digest
    for meta in world.store.list(GRAPH_RUN_IDEMPOTENCY).items + world.store.list(GRAPH_RUNS).items:
        assert "client-4471" not in repr(meta)


@pytest.mark.parametrize(
    "changes",
    [{"input": {"n": 2}}, {"budgets": {"max_nodes": 1}}, {"version": content_hash(SPEC)}],
)
def test_same_idempotency_key_other_request_conflicts(
    world: World, changes: dict[str, object]
) -> None:
    """Reusing a key for different request content fails closed and changes nothing."""
    first, _ = world.service.start_run("triage", {"n": 1}, idempotency_key="req-1")
    before = world.visible(first.run_id)
    request: dict[str, object] = {"input": {"n": 1}, **changes}
    with pytest.raises(IdempotencyConflict) as caught:
        world.service.start_run("triage", idempotency_key="req-1", **request)  # type: ignore[arg-type]
    assert caught.value.code == "IDEMPOTENCY_CONFLICT"
    assert "req-1" not in str(caught.value)
    assert world.visible(first.run_id) == before


def test_set_status_moves_with_cas_and_records_an_event(world: World) -> None:
    """A legal move bumps the revision and appends run.<target> with sanitised detail."""
    run_id = world.start()
    world.clock.advance()
    moved = world.service.set_status(
        run_id,
        "running",
        expected_status="accepted",
        node_count=3,
        failed_attempts=1,
        payload={"worker": "w-1", "api_token": "hunter2"},
    )
    assert (moved.status, moved.revision, moved.node_count, moved.failed_attempts) == (
        "running",
        2,
        3,
        1,
    )
    assert world.service.get_run(run_id) == moved
    event = world.events(run_id)[-1]
    assert (event.type, event.from_state, event.to_state) == ("run.running", "accepted", "running")
    assert event.payload == {
        "node_count": 3,
        "failed_attempts": 1,
        "detail": {"worker": "w-1", "api_token": "[REDACTED]"},
    }
    paused = world.service.set_status(run_id, "checkpointed", expected_status="running")
    assert paused.node_count == 3


def test_stale_expected_status_names_both(world: World) -> None:
    """A stale expected status is REVISION_CONFLICT naming expected and actual."""
    run_id = world.start()
    before = world.visible(run_id)
    with pytest.raises(RevisionConflict) as caught:
        world.service.set_status(run_id, "checkpointed", expected_status="running")
    assert caught.value.code == "REVISION_CONFLICT"
    details = caught.value.details
    assert (details["expected_status"], details["actual_status"]) == ("running", "accepted")
    assert world.visible(run_id) == before


def test_forbidden_moves_are_invalid_transitions(world: World) -> None:
    """The lifecycle refuses accepted -> completed and any move out of a terminal state."""
    run_id = world.start()
    before = world.visible(run_id)
    with pytest.raises(InvalidTransition) as caught:
        world.service.set_status(run_id, "completed", expected_status="accepted")
    assert caught.value.code == "INVALID_TRANSITION"
    assert world.visible(run_id) == before
    cancelled = world.service.set_status(run_id, "cancelled", expected_status="accepted")
    assert cancelled.finished_at == world.clock.now()
    with pytest.raises(InvalidTransition):
        world.service.set_status(run_id, "running", expected_status="cancelled")


def test_bad_counters_and_statuses_are_invalid_input(world: World) -> None:
    """Negative counters and unknown expected statuses are refused as INVALID_INPUT."""
    run_id = world.start()
    with pytest.raises(InvalidInput):
        world.service.set_status(run_id, "running", expected_status="accepted", node_count=-1)
    with pytest.raises(InvalidInput):
        world.service.set_status(run_id, "running", expected_status="queued")
    with pytest.raises(InvalidInput):
        world.service.list_runs("queued")


def test_unknown_run_is_not_found(world: World) -> None:
    """Every verb on an unknown run raises NOT_FOUND."""
    calls: list[Callable[[], object]] = [
        lambda: world.service.get_run("run-999999"),
        lambda: world.service.set_status("run-999999", "running", expected_status="accepted"),
        lambda: world.service.append_run_events("run-999999", [("node.started", {})]),
        lambda: world.service.read_run_events("run-999999"),
        lambda: world.service.finish_run(
            "run-999999", "completed", expected_status="running", final_state=None
        ),
        lambda: world.receipts.terminal_receipt("run-999999"),
    ]
    for call in calls:
        with pytest.raises(NotFound) as caught:
            call()
        assert caught.value.code == "NOT_FOUND"


def test_list_runs_by_status_in_pages(world: World) -> None:
    """Runs list newest first, filtered by status, across pages."""
    accepted = [world.start() for _ in range(3)]
    running = world.running()
    page = world.service.list_runs("accepted", limit=2)
    assert len(page.items) == 2
    assert page.next_cursor is not None
    rest = world.service.list_runs("accepted", cursor=page.next_cursor, limit=2)
    assert sorted(run.run_id for run in page.items + rest.items) == accepted
    assert rest.next_cursor is None
    assert [run.run_id for run in world.service.list_runs("running").items] == [running]
    assert len(world.service.list_runs().items) == 4


def test_a_misfiled_run_row_is_reported_and_the_rest_listed(world: World) -> None:
    """A row holding another run is reported by key digest; list_runs lists the others."""
    first, second, third = world.start(), world.start(), world.start()
    copied = world.store.load(GRAPH_RUNS, world.repository.key_digest(GRAPH_RUNS, second))
    assert copied is not None
    document = world.repository.open(
        copied, namespace=GRAPH_RUNS, key_digest=copied.metadata.key_digest
    ).document
    misfiled = world.repository.prepare(
        GRAPH_RUNS, first, document, expected=Guard.ANY, labels={"status": "accepted"}
    )
    world.store.commit(UnitOfWork(upserts=[misfiled]))
    for status in (None, "accepted"):
        page = world.service.list_runs(status)
        assert sorted(run.run_id for run in page.items) == sorted([second, third])
        assert page.unreadable == (
            UnreadableItem(misfiled.metadata.key_digest, "INTEGRITY_FAILURE"),
        )
    with pytest.raises(IntegrityFailure):
        world.service.get_run(first)


def test_a_runs_cursor_keeps_its_status(world: World) -> None:
    """A cursor issued for one status does not continue another status or a made-up listing."""
    for _ in range(3):
        world.start()
    cursor = world.service.list_runs("accepted", limit=1).next_cursor
    assert cursor is not None
    for call in (
        lambda: world.service.list_runs(cursor=cursor),
        lambda: world.service.list_runs("running", cursor=cursor),
        lambda: world.service.list_runs("accepted", cursor="%%%"),
    ):
        with pytest.raises(InvalidInput):
            call()
    assert len(world.service.list_runs("accepted", cursor=cursor).items) == 2


def test_recover_interrupts_accepted_and_running_runs_only(world: World) -> None:
    """Recovery marks accepted and running runs interrupted, each with its event."""
    accepted, running = world.start(), world.running()
    paused = world.running()
    world.service.set_status(paused, "checkpointed", expected_status="running")
    waiting = world.running()
    world.service.set_status(waiting, "awaiting_approval", expected_status="running")
    done = world.running()
    world.finish(done)
    assert world.service.recover_incomplete_runs() == 2
    assert world.service.recover_incomplete_runs() == 0
    for run_id in (accepted, running):
        run = world.service.get_run(run_id)
        assert run.status == "interrupted_non_resumable"
        assert run.finished_at is not None
        event = world.events(run_id)[-1]
        assert event.type == "run.interrupted_non_resumable"
        assert event.to_state == "interrupted_non_resumable"
    statuses = [world.service.get_run(r).status for r in (paused, waiting, done)]
    assert statuses == ["checkpointed", "awaiting_approval", "completed"]


def test_recover_works_through_more_than_one_batch(world: World) -> None:
    """More incomplete runs than a recovery batch are all interrupted."""
    for _ in range(105):
        world.start()
    assert world.service.recover_incomplete_runs() == 105
    assert world.service.list_runs("accepted").items == ()


# -- run events ---------------------------------------------------------------------


def test_append_and_read_run_events(world: World) -> None:
    """Caller events chain after the run's own, with sanitised payloads and the run's status."""
    run_id = world.running()
    appended = world.service.append_run_events(
        run_id, [("node.started", {"node": "plan"}), ("node.done", {"password": "pw"})]
    )
    assert [e.index for e in appended] == [2, 3]
    page = world.service.read_run_events(run_id)
    assert [e.type for e in page.events] == [
        "run.accepted",
        "run.running",
        "node.started",
        "node.done",
    ]
    assert page.events[-1].payload == {"password": "[REDACTED]"}
    assert page.events[-1].to_state == "running"
    assert (page.next_cursor, page.gap) == (None, False)
    assert world.service.read_run_events(run_id, cursor=3).events == (appended[1],)
    assert world.service.append_run_events(run_id, []) == []


@pytest.mark.parametrize("event_type", ["run.completed", RETENTION_TOMBSTONE, "Bad Type"])
def test_reserved_or_malformed_event_types_are_refused(world: World, event_type: str) -> None:
    """Callers cannot write run.* or retention.* events, nor malformed types."""
    run_id = world.running()
    before = world.visible(run_id)
    with pytest.raises(InvalidInput):
        world.service.append_run_events(run_id, [("node.ok", {}), (event_type, {})])
    assert world.visible(run_id) == before


def test_finished_run_takes_no_more_events(world: World) -> None:
    """Appending to a finished run is INVALID_TRANSITION."""
    run_id = world.running()
    world.finish(run_id)
    with pytest.raises(InvalidTransition):
        world.service.append_run_events(run_id, [("node.late", {})])


def test_event_pages_are_capped_at_200(world: World) -> None:
    """A page never holds more than 200 events, whatever limit is asked for."""
    run_id = world.start()
    world.service.append_run_events(run_id, [("node.tick", {"n": n}) for n in range(200)])
    world.service.append_run_events(run_id, [("node.tick", {"n": n}) for n in range(200, 250)])
    first = world.service.read_run_events(run_id, limit=1000)
    assert len(first.events) == 200
    assert first.next_cursor == 200
    second = world.service.read_run_events(run_id, cursor=first.next_cursor, limit=1000)
    assert [e.index for e in second.events] == list(range(200, 251))
    assert (second.next_cursor, second.gap) == (None, False)
    assert len(world.service.read_run_events(run_id, limit=5).events) == 5
    with pytest.raises(InvalidInput):
        world.service.append_run_events(run_id, [("node.tick", {})] * 201)
    for bad in ({"cursor": -1}, {"limit": 0}):
        with pytest.raises(InvalidInput):
            world.service.read_run_events(run_id, **bad)


def test_a_cursor_before_the_trimmed_events_reports_a_gap(world: World) -> None:
    """After an authenticated trim, an older cursor starts at the first retained event."""
    run_id = world.start()
    world.service.append_run_events(run_id, [("node.tick", {"n": n}) for n in range(30)])
    stream = run_stream(run_id)
    unit = trim_unit(world.store, world.repository, stream, before_index=10, occurred_at=EPOCH)
    world.store.commit(unit)
    page = world.service.read_run_events(run_id, cursor=0)
    assert page.gap
    assert page.events[0].index == 10
    assert not world.service.read_run_events(run_id, cursor=10).gap
    later = world.service.read_run_events(run_id, cursor=12)
    assert not later.gap
    assert later.events[0].index == 12
    assert [event.type for event in read_stream(world.store, stream)][-1] == TRIM_EVENT


def test_a_trim_without_its_event_is_refused_by_the_first_page(world: World) -> None:
    """Events cut from the front of a run with no ``ledger.trimmed`` event read as truncated.

    The negative control: a page well inside the retained events still reads,
    since it is checked against the event before it, not against the start.
    """
    run_id = world.start()
    world.service.append_run_events(run_id, [("node.tick", {"n": n}) for n in range(30)])
    world.store.commit(UnitOfWork(trims=[LedgerTrim(run_stream(run_id), before_index=10)]))
    for cursor in (None, 5, 10):
        with pytest.raises(IntegrityFailure) as caught:
            world.service.read_run_events(run_id, cursor)
        assert caught.value.details["defect"] == "truncated"
        assert caught.value.details["index"] == 10
    assert world.service.read_run_events(run_id, cursor=12).events[0].index == 12


def test_pages_refuse_a_forged_or_unkeyed_event(world: World) -> None:
    """A page whose event was rewritten without the key (MAC dropped or kept) is refused."""
    run_id = world.start()
    world.service.append_run_events(run_id, [("node.tick", {"n": n}) for n in range(5)])
    stream = run_stream(run_id)
    events = list(read_stream(world.store, stream))
    forged = LedgerEvent.create(
        stream=stream,
        index=len(events),
        type="node.tick",
        occurred_at=EPOCH,
        payload={"n": 99},
        previous_hash=events[-1].event_hash,
    )
    world.store.commit(UnitOfWork(appends=[forged]))
    with pytest.raises(IntegrityFailure) as caught:
        world.service.read_run_events(run_id, cursor=len(events) - 1)
    assert caught.value.details["defect"] == "unkeyed"
    world.store.commit(UnitOfWork(appends=[make_forged_successor(forged)]))
    with pytest.raises(IntegrityFailure) as caught:
        world.service.read_run_events(run_id, cursor=len(events) + 1)
    assert caught.value.details["defect"] == "forged"


def make_forged_successor(event: LedgerEvent) -> LedgerEvent:
    """Return the next event of ``event``'s stream carrying a MAC made without the key."""
    successor = LedgerEvent.create(
        stream=event.stream,
        index=event.index + 1,
        type="node.tick",
        occurred_at=EPOCH,
        payload={"n": 100},
        previous_hash=event.event_hash,
    )
    return successor.model_copy(update={"chain_mac": "sha256:" + "ab" * 32})


# -- terminal receipts --------------------------------------------------------------


def test_finish_writes_status_state_events_and_a_signed_receipt(world: World) -> None:
    """Finishing stores the final state, appends the final events and signs a receipt."""
    run_id = world.running()
    world.clock.advance()
    receipt = world.service.finish_run(
        run_id,
        "completed",
        expected_status="running",
        final_state={"answer": FINAL_MARKER},
        events=[("node.done", {"node": "act"})],
    )
    run = world.service.get_run(run_id)
    assert (run.status, run.final_state, run.finished_at) == (
        "completed",
        {"answer": FINAL_MARKER},
        world.clock.now(),
    )
    events = world.events(run_id)
    assert [e.type for e in events[-2:]] == ["node.done", "run.completed"]
    assert verify_chain(events).ok
    assert receipt.status == "completed"
    assert receipt.definition_version == run.definition_version
    assert receipt.event_count == 2
    assert receipt.events_digest == content_hash([e.event_hash for e in events[-2:]])
    assert receipt.issued_at == run.finished_at
    assert world.receipts.terminal_receipt(run_id) == receipt
    ended = events[-1].payload
    assert isinstance(ended, dict)
    assert str(ended["final_state_digest"]).startswith("sha256:")


def test_receipt_body_carries_no_plaintext(world: World) -> None:
    """The receipt names no run id, spec, input or final state; the ledger holds neither."""
    run_id = world.running()
    receipt = world.finish(run_id)
    body = canonical_json(receipt.body())
    for secret in (run_id, SPEC_MARKER, INPUT_MARKER, FINAL_MARKER, "triage"):
        assert secret not in body
    ledger = canonical_json([e.payload for e in world.events(run_id)])
    for secret in (SPEC_MARKER, INPUT_MARKER, FINAL_MARKER):
        assert secret not in ledger
    assert receipt.kind == "terminal"
    assert receipt.digest.startswith("sha256:")


def test_a_forged_receipt_fails_verification(world: World) -> None:
    """A receipt record planted with a changed field does not verify: INTEGRITY_FAILURE."""
    run_id = world.running()
    world.finish(run_id)
    stored = world.repository.read(GRAPH_RUN_RECEIPTS, run_id)
    assert stored is not None
    forged = {**stored.document, "status": "failed"}  # type: ignore[dict-item]
    world.repository.write(GRAPH_RUN_RECEIPTS, run_id, forged, expected=stored.revision)
    with pytest.raises(IntegrityFailure) as caught:
        world.receipts.terminal_receipt(run_id)
    assert caught.value.code == "INTEGRITY_FAILURE"


def test_a_receipt_moved_to_another_run_fails_verification(world: World) -> None:
    """A genuine receipt copied under another run's key names the wrong run."""
    first, second = world.running(), world.running()
    world.finish(first)
    copied = world.repository.read(GRAPH_RUN_RECEIPTS, first)
    assert copied is not None
    world.repository.write(GRAPH_RUN_RECEIPTS, second, copied.document, expected=Guard.ABSENT)
    with pytest.raises(IntegrityFailure):
        world.receipts.terminal_receipt(second)


def test_finish_is_one_unit_of_work(world: World) -> None:
    """A fault on the unit holding the receipt leaves status, events and receipt untouched."""
    run_id = world.running()
    before = world.visible(run_id)
    with pytest.raises(RuntimeError, match="injected fault"):
        world.crashing(_holds_receipt).finish_run(
            run_id,
            "completed",
            expected_status="running",
            final_state={"answer": FINAL_MARKER},
            events=[("node.done", {})],
        )
    assert world.visible(run_id) == before
    assert world.service.get_run(run_id).status == "running"
    assert world.store.list(GRAPH_RUN_RECEIPTS).items == ()
    with pytest.raises(NotFound):
        world.receipts.terminal_receipt(run_id)
    assert world.finish(run_id).status == "completed"


def test_finish_checks_status_expectation_and_lifecycle(world: World) -> None:
    """Finishing needs a terminal status, the expected status and a legal move."""
    run_id = world.start()
    before = world.visible(run_id)
    with pytest.raises(InvalidInput):
        world.service.finish_run(run_id, "running", expected_status="accepted", final_state=None)
    with pytest.raises(RevisionConflict):
        world.finish(run_id)
    with pytest.raises(InvalidTransition):
        world.service.finish_run(run_id, "completed", expected_status="accepted", final_state=None)
    assert world.visible(run_id) == before
    receipt = world.service.finish_run(
        run_id, "failed", expected_status="accepted", final_state=None
    )
    assert receipt.status == "failed"


def test_receipts_verify_only_under_the_digester_they_were_built_with(world: World) -> None:
    """Receipts are MAC'd by the keyed digester given at construction; another key refuses them."""
    run_id = world.running()
    world.finish(run_id)
    other = AesGcmCipher(bytes(range(1, 33)))
    elsewhere = TerminalReceipts(
        world.repository, SealedRepository(world.store, other, world.clock)
    )
    with pytest.raises(IntegrityFailure) as caught:
        elsewhere.terminal_receipt(run_id)
    assert caught.value.code == "INTEGRITY_FAILURE"
    assert world.receipts.terminal_receipt(run_id).status == "completed"


def test_receipt_model_is_terminal_and_digest_only(world: World) -> None:
    """A receipt cannot claim a live status or carry a plaintext field."""
    receipt = world.finish(world.running())
    for change in ({"status": "running"}, {"run": "run-000001"}):
        with pytest.raises(InvalidInput):
            TerminalReceipt.model_validate({**receipt.model_dump(), **change})


# -- retention ----------------------------------------------------------------------


def test_purge_deletes_old_finished_runs_and_leaves_tombstones(world: World) -> None:
    """Old finished runs go in batches; each stream keeps a digest-only tombstone and verifies."""
    old = [world.running() for _ in range(3)]
    receipts = [world.finish(run_id) for run_id in old]
    world.clock.advance(timedelta(days=2))
    recent = world.running()
    world.finish(recent)
    live = world.running()
    purged = world.purge(timedelta(days=1), 2)
    assert purged == 3
    assert world.purge(timedelta(days=1)) == 0
    for run_id, receipt in zip(old, receipts, strict=True):
        with pytest.raises(NotFound):
            world.service.get_run(run_id)
        events = world.events(run_id)
        assert verify_chain(events).ok
        tombstone = events[-1]
        assert tombstone.type == RETENTION_TOMBSTONE
        payload = tombstone.payload
        assert isinstance(payload, dict)
        assert payload["kind"] == "run"
        assert payload["run"] == receipt.run
        assert str(payload["payload_digest"]).startswith("sha256:")
        assert payload["finished_at"] == receipt.body()["issued_at"]
        text = canonical_json(payload)
        for secret in (run_id, INPUT_MARKER, FINAL_MARKER, SPEC_MARKER):
            assert secret not in text
        assert world.service.read_run_events(run_id).events[-1] == tombstone
        assert world.receipts.terminal_receipt(run_id) == receipt
    assert world.service.get_run(recent).status == "completed"
    assert world.service.get_run(live).status == "running"


def test_purge_frees_idempotency_keys_and_definitions(world: World) -> None:
    """A purged run's idempotency marker goes with it, and its definition becomes deletable."""
    first, _ = world.service.start_run("triage", {}, idempotency_key="req-1")
    world.service.set_status(first.run_id, "cancelled", expected_status="accepted")
    world.clock.advance(timedelta(days=2))
    assert world.purge(timedelta(days=1)) == 1
    assert world.store.list(GRAPH_RUN_IDEMPOTENCY).items == ()
    tombstone = world.events(first.run_id)[-1].payload
    assert isinstance(tombstone, dict)
    assert tombstone["idempotency_marker"] == first.idempotency_key_digest
    assert world.definitions.delete_definition("triage") == 1
    world.definitions.register_definition("triage", SPEC)
    again, created = world.service.start_run("triage", {}, idempotency_key="req-1")
    assert created
    assert again.run_id != first.run_id


def test_purge_arguments_are_checked(world: World) -> None:
    """Negative ages and batch sizes outside 1..200 are refused."""
    now = world.clock.now()
    for older_than, batch in ((timedelta(seconds=-1), 10), (timedelta(0), 0), (timedelta(0), 201)):
        with pytest.raises(InvalidInput):
            purge_finished_runs(world.repository, world.clock, now, older_than, batch)


# -- concurrency --------------------------------------------------------------------


def test_exactly_one_of_eight_racing_moves_wins(tmp_path: Path) -> None:
    """Eight threads moving one run accepted -> running on SQLite: one wins, seven conflict."""
    with SQLiteSecureObjectStore.open(tmp_path / "data" / "store.db", create=True) as store:
        world = World(store)
        world.definitions.register_definition("triage", SPEC)
        _race(world)


def _race(world: World) -> None:
    run_id = world.start()
    barrier = threading.Barrier(8)
    won: list[str] = []
    lost: list[BaseException] = []

    def move() -> None:
        barrier.wait()
        try:
            world.service.set_status(run_id, "running", expected_status="accepted")
        except BaseException as exc:  # surfaced in the main thread
            lost.append(exc)
        else:
            won.append(run_id)

    threads = [threading.Thread(target=move) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert len(lost) == 7
    assert all(isinstance(exc, RevisionConflict) for exc in lost)
    assert world.service.get_run(run_id).revision == 2
    assert [e.type for e in world.events(run_id)] == ["run.accepted", "run.running"]
