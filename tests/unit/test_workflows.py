"""Workflow service scenarios, run on the memory adapter, a real SQLite file and PostgreSQL."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from listings import every_page
from row_edits import PassThroughStore
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    Guard,
    SealedRepository,
    SecureObjectStore,
    UnitOfWork,
    UnreadableItem,
)
from flowvault.application._action_results import ACTION_RESULTS
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application._workflows import IDEMPOTENCY
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import (
    IdempotencyConflict,
    IntegrityFailure,
    InvalidDefinition,
    InvalidInput,
    InvalidTransition,
    NotFound,
    RevisionConflict,
    StateMachine,
    StoreUnavailable,
    WorkOrder,
    content_hash,
)
from flowvault.domain._canonical import canonical_json
from flowvault.domain._state_machine import DEFAULT_LIFECYCLE

SECRET = "iban-DE44-5001-0517-5407-3249-31"
REQUESTER = "alice.requester@example.org"
ACTION = content_hash({"action": "pay invoice 17"})


class World:
    """A service over one store, with the clock and ids the test controls."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.store = store
        self.clock = FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(bytes(range(32))), self.clock)
        services = workflow_services(self.repository, self.clock, SequentialIds("wf"))
        self.service = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results

    def order(self, key: str = "req-1", **changes: object) -> WorkOrder:
        fields: dict[str, object] = {
            "kind": "invoice.review",
            "parameters": {"iban": SECRET, "amount": 1200},
            "requester": REQUESTER,
            "idempotency_key": key,
        }
        return WorkOrder.model_validate({**fields, **changes})

    def to_decision(self, workflow_id: str) -> int:
        version = 1
        for state, target in (
            ("intake", "planning"),
            ("planning", "executing"),
            ("executing", "decision"),
        ):
            self.service.transition(
                workflow_id, target, expected_state=state, expected_version=version
            )
            version += 1
        return version

    def visible(self) -> tuple[object, ...]:
        """Everything a failed call must leave exactly as it was."""
        spaces = (WORKFLOWS, IDEMPOTENCY, ACTION_RESULTS)
        ledgers = tuple(
            self.store.read_ledger(stream_of(f"wf-{n:06d}"), limit=200) for n in range(1, 4)
        )
        return tuple(self.store.list(space, limit=200) for space in spaces) + ledgers


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


# -- create ---------------------------------------------------------------------


def test_create_starts_in_intake_with_a_created_event(world: World) -> None:
    """A new workflow starts at version 1 in the initial state, with one ledger event."""
    record, created = world.service.create(world.order(), original_content_hash=ACTION)
    assert created
    assert (record.state, record.state_version) == ("intake", 1)
    assert record.machine_version == DEFAULT_LIFECYCLE.version
    assert record.original_content_hash == ACTION
    assert record.created_at == record.updated_at == world.clock.now()
    (event,) = world.workflow_events.events(record.workflow_id)
    assert (event.type, event.from_state, event.to_state) == ("workflow.created", None, "intake")


def test_ledger_summary_holds_no_parameters_or_requester(world: World) -> None:
    """The created event describes the order without its parameters or requester."""
    record, _ = world.service.create(world.order())
    text = canonical_json([e.payload for e in world.workflow_events.events(record.workflow_id)])
    assert SECRET not in text
    assert REQUESTER not in text
    assert "1200" not in text


def test_same_key_same_content_returns_the_first(world: World) -> None:
    """Retrying a create returns the existing workflow, created=False, with no new event."""
    first, _ = world.service.create(world.order())
    world.clock.advance()
    again, created = world.service.create(world.order())
    assert not created
    assert again == first
    assert len(world.workflow_events.events(first.workflow_id)) == 1


def test_same_key_other_content_conflicts_and_writes_nothing(world: World) -> None:
    """Reusing an idempotency key for another order fails closed and changes nothing."""
    world.service.create(world.order())
    before = world.visible()
    with pytest.raises(IdempotencyConflict) as caught:
        world.service.create(world.order(parameters={"iban": "other"}))
    assert caught.value.code == "IDEMPOTENCY_CONFLICT"
    assert "req-1" not in str(caught.value)
    assert world.visible() == before


def test_idempotency_key_is_stored_only_as_a_digest(world: World) -> None:
    """No record of the store names the idempotency key or the workflow's natural key."""
    record, _ = world.service.create(world.order(key="customer-4471-order-9"))
    listed = world.store.list(IDEMPOTENCY).items + world.store.list(WORKFLOWS).items
    for meta in listed:
        loaded = world.store.load(meta.namespace, meta.key_digest)
        assert loaded is not None
        assert b"customer-4471" not in loaded.payload
        assert "customer-4471" not in repr(meta)
        assert meta.key_digest.startswith("sha256:")
    assert record.workflow_id not in repr(listed)


# -- transitions ----------------------------------------------------------------


def test_transition_advances_version_and_records_the_move(world: World) -> None:
    """A legal move bumps the version and appends a from/to event in the same unit."""
    record, _ = world.service.create(world.order())
    world.clock.advance()
    moved = world.service.transition(
        record.workflow_id,
        "planning",
        expected_state="intake",
        expected_version=1,
        payload={"note": "plan", "api_token": "hunter2"},
    )
    assert (moved.state, moved.state_version) == ("planning", 2)
    assert moved.updated_at > record.updated_at
    event = world.workflow_events.events(record.workflow_id)[-1]
    assert (event.index, event.from_state, event.to_state) == (1, "intake", "planning")
    assert event.payload == {"note": "plan", "api_token": "[REDACTED]"}
    assert world.service.get(record.workflow_id) == moved


@pytest.mark.parametrize(("state", "version"), [("intake", 2), ("planning", 1), ("planning", 2)])
def test_stale_expectation_names_expected_and_actual(
    world: World, state: str, version: int
) -> None:
    """A stale state or version is REVISION_CONFLICT naming both sides; nothing changes."""
    record, _ = world.service.create(world.order())
    before = world.visible()
    with pytest.raises(RevisionConflict) as caught:
        world.service.transition(
            record.workflow_id, "planning", expected_state=state, expected_version=version
        )
    details = caught.value.details
    assert (details["expected_state"], details["expected_version"]) == (state, version)
    assert (details["actual_state"], details["actual_version"]) == ("intake", 1)
    assert world.visible() == before


def test_illegal_transition_names_both_states(world: World) -> None:
    """The state machine refuses intake -> completed, naming both states."""
    record, _ = world.service.create(world.order())
    before = world.visible()
    with pytest.raises(InvalidTransition) as caught:
        world.service.transition(
            record.workflow_id, "completed", expected_state="intake", expected_version=1
        )
    assert "intake" in str(caught.value)
    assert "completed" in str(caught.value)
    assert world.visible() == before


def test_terminal_transition_scrubs_parameters(world: World) -> None:
    """Entering a terminal state keeps the order but removes its parameters."""
    record, _ = world.service.create(world.order())
    version = world.to_decision(record.workflow_id)
    done = world.service.transition(
        record.workflow_id,
        "completed",
        expected_state="decision",
        expected_version=version,
        output_content_hash=ACTION,
        stop_reason="paid",
    )
    assert done.work_order.parameters == {}
    assert done.work_order.kind == "invoice.review"
    assert (done.output_content_hash, done.stop_reason) == (ACTION, "paid")
    assert world.service.get(record.workflow_id).work_order.parameters == {}
    with pytest.raises(InvalidTransition):
        world.service.transition(
            record.workflow_id, "executing", expected_state="completed", expected_version=5
        )


def test_transition_cannot_write_decision_receipts(world: World) -> None:
    """Decision event types are refused by transition."""
    record, _ = world.service.create(world.order())
    with pytest.raises(InvalidInput):
        world.service.transition(
            record.workflow_id,
            "planning",
            expected_state="intake",
            expected_version=1,
            event_type="decision.approved",
        )


def test_invalid_changes_are_typed_errors(world: World) -> None:
    """A malformed output hash or an overlong stop reason is INVALID_INPUT, not a crash."""
    record, _ = world.service.create(world.order())
    for change in ({"output_content_hash": "not-a-digest"}, {"stop_reason": "x" * 500}):
        with pytest.raises(InvalidInput):
            world.service.transition(
                record.workflow_id,
                "planning",
                expected_state="intake",
                expected_version=1,
                **change,  # type: ignore[arg-type]
            )


def test_unknown_workflow_is_not_found(world: World) -> None:
    """Every verb on an unknown workflow raises NOT_FOUND."""
    calls = [
        lambda: world.service.get("nope"),
        lambda: world.workflow_events.events("nope"),
        lambda: world.service.transition(
            "nope", "planning", expected_state="intake", expected_version=1
        ),
        lambda: world.action_results.put_action_result("nope", ACTION, {"x": 1}),
        lambda: world.action_results.list_action_results("nope"),
    ]
    for call in calls:
        with pytest.raises(NotFound):
            call()


def test_workflow_remembers_its_machine(world: World) -> None:
    """A service with another machine refuses to move workflows made under the default."""
    record, _ = world.service.create(world.order())
    other = StateMachine.define(
        name="short", initial="intake", transitions={"intake": {"done"}}, terminal={"done"}
    )
    service = workflow_services(
        world.repository, world.clock, SequentialIds("x"), machine=other
    ).workflows
    with pytest.raises(InvalidDefinition):
        service.transition(record.workflow_id, "done", expected_state="intake", expected_version=1)
    made, _ = service.create(world.order(key="req-2"))
    assert made.machine_version == other.version
    assert (
        service.transition(
            made.workflow_id, "done", expected_state="intake", expected_version=1
        ).state
        == "done"
    )


# -- same-state events and decisions --------------------------------------------


def test_append_event_keeps_state_and_advances_version(world: World) -> None:
    """A receipt keeps the state, bumps the version and chains a same-state event."""
    record, _ = world.service.create(world.order())
    updated, event, created = world.workflow_events.append_event(
        record.workflow_id, "note.added", expected_state="intake", expected_version=1
    )
    assert created
    assert (updated.state, updated.state_version) == ("intake", 2)
    assert (event.from_state, event.to_state, event.index) == ("intake", "intake", 1)


def test_event_key_retry_returns_the_original(world: World) -> None:
    """Retrying with the same event key returns the first event and writes nothing."""
    record, _ = world.service.create(world.order())
    first = world.workflow_events.append_event(
        record.workflow_id,
        "note.added",
        expected_state="intake",
        expected_version=1,
        payload={"n": 1},
        event_key="note-1",
    )
    before = world.visible()
    again = world.workflow_events.append_event(
        record.workflow_id,
        "note.added",
        expected_state="intake",
        expected_version=1,
        payload={"n": 1},
        event_key="note-1",
    )
    assert again[1] == first[1]
    assert again[2] is False
    assert world.visible() == before
    assert first[1].event_key is not None
    assert "note-1" not in first[1].event_key


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [("note.edited", {"n": 1}), ("note.added", {"n": 2})],
)
def test_event_key_reused_for_other_content_conflicts(
    world: World, event_type: str, payload: dict[str, int]
) -> None:
    """The same event key with another type or payload is IDEMPOTENCY_CONFLICT."""
    record, _ = world.service.create(world.order())
    world.workflow_events.append_event(
        record.workflow_id,
        "note.added",
        expected_state="intake",
        expected_version=1,
        payload={"n": 1},
        event_key="note-1",
    )
    before = world.visible()
    with pytest.raises(IdempotencyConflict):
        world.workflow_events.append_event(
            record.workflow_id,
            event_type,
            expected_state="intake",
            expected_version=2,
            payload=payload,
            event_key="note-1",
        )
    assert world.visible() == before


def test_decision_receipt_proves_who_without_revealing(world: World) -> None:
    """An approval in the decision state yields a digest-only receipt that names no one."""
    record, _ = world.service.create(world.order())
    version = world.to_decision(record.workflow_id)
    _, event, _ = world.workflow_events.append_event(
        record.workflow_id,
        "decision.approved",
        expected_state="decision",
        expected_version=version,
        payload={"action_hash": ACTION, "approved": True, "decided_by": "bob@example.org"},
    )
    receipt = world.workflow_events.decision_receipt(record.workflow_id, event)
    body = canonical_json(receipt.body())
    assert "bob@example.org" not in body + canonical_json(event.payload)
    assert record.workflow_id not in body
    assert receipt.approved
    assert receipt.action_hash == ACTION
    assert receipt.event_hash == event.event_hash
    assert receipt.decider is not None
    assert receipt.digest.startswith("sha256:")


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        ("decision.approved", {"approved": True}),
        ("decision.approved", {"action_hash": "plain", "approved": True}),
        ("decision.approved", {"action_hash": ACTION, "approved": False}),
        ("decision.rejected", {"action_hash": ACTION, "approved": True}),
        ("decision.rejected", {"action_hash": ACTION}),
    ],
)
def test_malformed_decisions_are_refused(
    world: World, event_type: str, payload: dict[str, object]
) -> None:
    """A decision without a digest action hash or with a disagreeing flag is refused."""
    record, _ = world.service.create(world.order())
    version = world.to_decision(record.workflow_id)
    with pytest.raises(InvalidInput):
        world.workflow_events.append_event(
            record.workflow_id,
            event_type,
            expected_state="decision",
            expected_version=version,
            payload=payload,
        )


def test_decision_outside_the_decision_state_is_refused(world: World) -> None:
    """A well-formed decision receipt in another state is INVALID_TRANSITION."""
    record, _ = world.service.create(world.order())
    with pytest.raises(InvalidTransition):
        world.workflow_events.append_event(
            record.workflow_id,
            "decision.rejected",
            expected_state="intake",
            expected_version=1,
            payload={"action_hash": ACTION, "approved": False},
        )


# -- action results -------------------------------------------------------------


def test_action_result_round_trip_and_idempotency(world: World) -> None:
    """A result reads back; the same content again returns the first; other content conflicts."""
    record, _ = world.service.create(world.order())
    stored = world.action_results.put_action_result(record.workflow_id, ACTION, {"paid": SECRET})
    world.clock.advance()
    again = world.action_results.put_action_result(record.workflow_id, ACTION, {"paid": SECRET})
    assert again == stored
    fetched = world.action_results.get_action_result(record.workflow_id, ACTION)
    assert fetched is not None
    assert fetched.result == {"paid": SECRET}
    assert stored.expires_at - stored.created_at == timedelta(hours=24)
    with pytest.raises(IdempotencyConflict):
        world.action_results.put_action_result(record.workflow_id, ACTION, {"paid": "other"})


@pytest.mark.parametrize(
    "retention", [timedelta(0), timedelta(milliseconds=999), timedelta(days=30, seconds=1)]
)
def test_retention_outside_bounds_is_invalid(world: World, retention: timedelta) -> None:
    """Retention must lie between one second and thirty days."""
    record, _ = world.service.create(world.order())
    with pytest.raises(InvalidInput):
        world.action_results.put_action_result(record.workflow_id, ACTION, {}, retention=retention)


def test_action_hash_must_be_a_digest(world: World) -> None:
    """A free-text action hash is refused before anything is stored."""
    record, _ = world.service.create(world.order())
    with pytest.raises(InvalidInput):
        world.action_results.put_action_result(record.workflow_id, "pay-invoice", {})


def test_expired_results_vanish_and_purge_leaves_tombstones(world: World) -> None:
    """Expired results are not returned; purging deletes them and logs a body-free tombstone."""
    record, _ = world.service.create(world.order())
    short, long_ = content_hash("short"), content_hash("long")
    world.action_results.put_action_result(
        record.workflow_id, short, {"v": SECRET}, retention=timedelta(seconds=1)
    )
    world.action_results.put_action_result(
        record.workflow_id, long_, {"v": 2}, retention=timedelta(days=1)
    )
    listed = world.action_results.list_action_results(record.workflow_id)
    assert [item.action_hash for item in listed] == sorted([short, long_])
    assert all(item.result is None for item in listed)
    world.clock.advance(timedelta(seconds=1))
    assert world.action_results.get_action_result(record.workflow_id, short) is None
    assert [
        r.action_hash for r in world.action_results.list_action_results(record.workflow_id)
    ] == [long_]
    assert world.action_results.purge_expired() == 1
    assert world.action_results.purge_expired() == 0
    tombstone = world.workflow_events.events(record.workflow_id)[-1]
    assert tombstone.type == "action_result.purged"
    assert isinstance(tombstone.payload, dict)
    assert tombstone.payload["action_hash"] == short
    assert SECRET not in canonical_json(tombstone.payload)
    assert "result" not in tombstone.payload


def test_expired_result_can_be_stored_again(world: World) -> None:
    """After expiry the action hash takes a new result, and the old one leaves a tombstone."""
    record, _ = world.service.create(world.order())
    world.action_results.put_action_result(
        record.workflow_id, ACTION, {"v": 1}, retention=timedelta(seconds=1)
    )
    world.clock.advance(timedelta(seconds=2))
    fresh = world.action_results.put_action_result(record.workflow_id, ACTION, {"v": 2})
    fetched = world.action_results.get_action_result(record.workflow_id, ACTION)
    assert fetched is not None
    assert fetched.result == {"v": 2} == fresh.result
    (tombstone,) = [
        e
        for e in world.workflow_events.events(record.workflow_id)
        if e.type == "action_result.purged"
    ]
    assert tombstone.payload["action_hash"] == ACTION  # type: ignore[index,call-overload]


def test_purge_works_in_bounded_batches(world: World) -> None:
    """Purging more results than one batch holds removes all of them, each with a tombstone."""
    record, _ = world.service.create(world.order())
    for n in range(7):
        world.action_results.put_action_result(
            record.workflow_id, content_hash(n), {"n": n}, retention=timedelta(seconds=1)
        )
    world.clock.advance(timedelta(seconds=5))
    assert world.action_results.purge_expired(batch_size=3) == 7
    events = world.workflow_events.events(record.workflow_id)
    assert sum(e.type == "action_result.purged" for e in events) == 7


def test_purge_does_not_block_a_later_transition(world: World) -> None:
    """A transition after tombstones were appended still chains onto the new head."""
    record, _ = world.service.create(world.order())
    world.action_results.put_action_result(
        record.workflow_id, ACTION, {"n": 1}, retention=timedelta(seconds=1)
    )
    world.clock.advance(timedelta(seconds=5))
    world.action_results.purge_expired()
    moved = world.service.transition(
        record.workflow_id, "planning", expected_state="intake", expected_version=1
    )
    assert moved.state_version == 2
    assert [e.index for e in world.workflow_events.events(record.workflow_id)] == [0, 1, 2]


# -- ledger verification ----------------------------------------------------------


def test_tampered_ledger_is_reported_with_its_first_bad_index(tmp_path: Path) -> None:
    """An event edited in the SQLite file makes events() fail with the edited index."""
    path = tmp_path / "data" / "store.db"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        world = World(store)
        record, _ = world.service.create(world.order())
        world.to_decision(record.workflow_id)
        with sqlite3.connect(path) as raw:
            raw.execute(
                "UPDATE ledger_events SET payload = ? WHERE stream = ? AND idx = 2",
                ('{"forged":true}', stream_of(record.workflow_id)),
            )
        with pytest.raises(IntegrityFailure) as caught:
            world.workflow_events.events(record.workflow_id)
        assert caught.value.details["index"] == 2
        assert len(world.workflow_events.events(record.workflow_id, verify=False)) == 4


# -- listings -------------------------------------------------------------------


def test_every_workflow_is_reachable_by_paging(world: World) -> None:
    """230 workflows: a page holds at most 200, and the cursor reaches each one once."""
    made = [world.service.create(world.order(f"req-{n}"))[0].workflow_id for n in range(230)]
    first = world.service.list_workflows(limit=500)
    assert len(first.items) == 200
    assert first.next_cursor is not None
    items, unreadable = every_page(
        lambda cursor: world.service.list_workflows(limit=200, cursor=cursor)
    )
    assert unreadable == []
    assert sorted(record.workflow_id for record in items) == sorted(made)


def test_workflows_in_a_state_page_and_a_cursor_keeps_its_filter(world: World) -> None:
    """By state, newest written first across pages; a cursor of another listing is refused."""
    made = [world.service.create(world.order(f"req-{n}"))[0].workflow_id for n in range(4)]
    for workflow_id in made[:3]:
        world.clock.advance(timedelta(seconds=1))
        world.service.transition(
            workflow_id, "planning", expected_state="intake", expected_version=1
        )
    page = world.service.list_workflows("planning", limit=2)
    assert [record.workflow_id for record in page.items] == [made[2], made[1]]
    rest = world.service.list_workflows("planning", limit=2, cursor=page.next_cursor)
    assert [record.workflow_id for record in rest.items] == [made[0]]
    assert rest.next_cursor is None
    assert page.next_cursor is not None
    for call in (
        lambda: world.service.list_workflows(cursor=page.next_cursor),
        lambda: world.service.list_workflows("intake", cursor=page.next_cursor),
        lambda: world.workflow_events.event_page(made[0], cursor=page.next_cursor),
        lambda: world.service.list_workflows(cursor="bm90IGEgY3Vyc29y"),
    ):
        with pytest.raises(InvalidInput) as caught:
            call()
        assert caught.value.code == "INVALID_INPUT"


def test_a_misfiled_or_damaged_workflow_row_is_reported_and_the_rest_listed(
    world: World,
) -> None:
    """One row holding another workflow, one of the wrong shape: both reported, the rest listed."""
    made = [world.service.create(world.order(f"req-{n}"))[0] for n in range(3)]
    misfiled = world.repository.prepare(
        WORKFLOWS,
        made[0].workflow_id,
        {"record": made[1].model_dump(mode="json")},
        expected=Guard.ANY,
        labels={"state": "intake"},
    )
    damaged = world.repository.prepare(
        WORKFLOWS, made[2].workflow_id, {"record": "junk"}, expected=Guard.ANY
    )
    world.store.commit(UnitOfWork(upserts=[misfiled, damaged]))
    page = world.service.list_workflows()
    assert [record.workflow_id for record in page.items] == [made[1].workflow_id]
    assert sorted(page.unreadable, key=lambda item: item.key_digest) == sorted(
        [
            UnreadableItem(misfiled.metadata.key_digest, "INTEGRITY_FAILURE"),
            UnreadableItem(damaged.metadata.key_digest, "INTEGRITY_FAILURE"),
        ],
        key=lambda item: item.key_digest,
    )
    assert SECRET not in repr(page.unreadable)
    assert made[0].workflow_id not in repr(page.unreadable)


class _Unavailable(PassThroughStore):
    """A store that lists, then loses its connection when a row is loaded."""

    def load(self, namespace: str, key_digest: str) -> object:
        raise StoreUnavailable("connection lost")


def test_a_store_wide_error_still_fails_the_listing(world: World) -> None:
    """Only a row's own integrity error is reported per item; a lost store raises."""
    world.service.create(world.order())
    broken = SealedRepository(
        _Unavailable(world.store),  # type: ignore[arg-type]
        AesGcmCipher(bytes(range(32))),
        world.clock,
    )
    with pytest.raises(StoreUnavailable):
        workflow_services(broken, world.clock, SequentialIds("wf")).workflows.list_workflows()


def test_a_workflows_events_page_in_index_order(world: World) -> None:
    """event_page walks the verified ledger a page at a time, as events() returns it whole."""
    record, _ = world.service.create(world.order())
    world.to_decision(record.workflow_id)
    whole = world.workflow_events.events(record.workflow_id)
    assert len(whole) == 4
    pages = []
    cursor: str | None = None
    while True:
        page = world.workflow_events.event_page(record.workflow_id, cursor, limit=3)
        pages.append([event.index for event in page.items])
        assert page.unreadable == ()
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == [[0, 1, 2], [3]]
    other, _ = world.service.create(world.order("req-2"))
    first = world.workflow_events.event_page(record.workflow_id, limit=1)
    with pytest.raises(InvalidInput):
        world.workflow_events.event_page(other.workflow_id, first.next_cursor)
    with pytest.raises(NotFound):
        world.workflow_events.event_page("nope")
