"""Every appended event carries a chain MAC under the integrity key, and a keyed audit checks it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from checkpoint_setup import checkpointed_run, request_approval
from hypothesis import given
from hypothesis import strategies as st

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import HistoryEvent, LedgerAudit, RetentionPolicy, UnitOfWork
from flowvault.application._audit import list_all_streams, verify_stream
from flowvault.application._streams import LEDGER_MAC_TAG, chain_mac, keyed, read_stream
from flowvault.application.testing import FrozenClock, make_event
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import InvalidInput, LedgerEvent, WorkflowState, WorkOrder, content_hash
from flowvault.domain._canonical import MAX_SAFE_INTEGER, canonical_bytes
from flowvault.domain._ledger import ChainDefect

KEY = bytes(range(32))


@pytest.fixture
def runtime() -> Runtime:
    """Provide a memory runtime that has written every kind of event there is."""
    clock = FrozenClock()
    built = bootstrap(Settings(backend="memory"), key=KEY, clock=clock, create=True)
    workflows = built.workflows
    record, _ = workflows.create(WorkOrder(kind="demo", requester="a", idempotency_key="k"))
    built.workflow_events.append_event(
        record.workflow_id,
        "workflow.noted",
        expected_state=record.state,
        expected_version=record.state_version,
        payload={"note": 1},
    )
    built.action_results.put_action_result(
        record.workflow_id, content_hash("x"), {"r": 1}, retention=timedelta(minutes=1)
    )
    built.state("main").update_with_events(
        lambda _: (WorkflowState(step=1), [HistoryEvent("state.stepped")])
    )
    run, checkpoint = checkpointed_run(built, "graph.demo")
    expires_at = clock.now() + timedelta(hours=1)
    approval = request_approval(built.approvals, checkpoint, "ops", expires_at, ["approve"])
    built.approvals.decide(approval.approval_id, "approve", "someone")
    built.runs.finish_run(run.run_id, "completed", expected_status="running", final_state={"ok": 1})
    built.idempotency.remember("req", {"op": 1}, {"ok": 1})
    clock.advance(timedelta(days=400))
    built.retention(RetentionPolicy()).run()
    return built


def _events(runtime: Runtime) -> list[LedgerEvent]:
    store = runtime.store
    return [event for name in list_all_streams(store) for event in read_stream(store, name)]


def test_every_event_the_services_append_carries_its_mac(runtime: Runtime) -> None:
    """Workflow, state, run, approval and retention events alike: none is left unkeyed."""
    events = _events(runtime)
    types = {event.type for event in events}
    assert {
        "workflow.created",
        "workflow.noted",
        "state.stepped",
        "run.completed",
        "approval.decided",
        "action_result.purged",
        "retention.purged",
    } <= types
    for event in events:
        assert event.chain_mac == chain_mac(event, runtime.repository), event.type
    report = LedgerAudit(runtime.store, runtime.repository).run()
    assert report.ok
    assert report.unkeyed == 0
    assert report.events == len(events)


def test_the_mac_depends_on_the_key_and_on_the_event() -> None:
    """Another key or another event gives another MAC; the MAC is not part of the hash."""
    first = make_event("s", 0)
    second = make_event("s", 1, first)
    with (
        bootstrap(Settings(backend="memory"), key=KEY, create=True) as one,
        bootstrap(Settings(backend="memory"), key=bytes(range(64, 96)), create=True) as other,
    ):
        macs = {
            chain_mac(first, one.repository),
            chain_mac(second, one.repository),
            chain_mac(first, other.repository),
        }
        assert len(macs) == 3
        marked = keyed(first, one.repository)
        assert marked.event_hash == first.event_hash == marked.computed_hash()


class _Message:
    """Hands back the message a MAC would be taken of, instead of a MAC."""

    def keyed_digest(self, tag: str, data: bytes | str) -> str:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        return (tag.encode("utf-8") + b"\x00" + raw).hex()


@given(
    st.text(min_size=1, max_size=40),
    st.integers(min_value=0, max_value=MAX_SAFE_INTEGER),
    st.text(alphabet='sha256:0123456789abcdef"\\\n', max_size=71),
)
def test_the_mac_message_is_the_canonical_json_of_stream_index_and_hash(
    stream: str, index: int, event_hash: str
) -> None:
    """However the message is put together, it is the general encoder's text byte for byte."""
    event = LedgerEvent.model_construct(stream=stream, index=index, event_hash=event_hash)
    try:
        expected = canonical_bytes([stream, index, event_hash])
    except InvalidInput:
        with pytest.raises(InvalidInput):
            chain_mac(event, _Message())
        return
    message = bytes.fromhex(chain_mac(event, _Message()))
    assert message == LEDGER_MAC_TAG.encode("utf-8") + b"\x00" + expected


def _store_with(*events: LedgerEvent) -> InMemorySecureObjectStore:
    store = InMemorySecureObjectStore()
    store.commit(UnitOfWork(appends=events))
    return store


def test_a_forged_or_stripped_mac_fails_a_keyed_audit_only() -> None:
    """An event appended without the key fails with the key and passes the plain chain."""
    with bootstrap(Settings(backend="memory"), key=KEY, create=True) as runtime:
        repo = runtime.repository
        first = keyed(make_event("s", 0), repo)
        second = make_event("s", 1, first)
        forged = second.model_copy(update={"chain_mac": "sha256:" + "ab" * 32})
        cases = {
            ChainDefect.UNKEYED: second,
            ChainDefect.FORGED: forged,
        }
        for defect, appended in cases.items():
            store = _store_with(first, appended)
            assert verify_stream(store, "s").ok, "the plain chain alone sees nothing"
            audit = verify_stream(store, "s", repo)
            assert audit.failure is not None
            assert (audit.failure.defect, audit.failure.index, audit.events) == (defect, 1, 1)
        wrong_key = bootstrap(Settings(backend="memory"), key=bytes(range(64, 96)), create=True)
        with wrong_key:
            audit = verify_stream(_store_with(first), "s", wrong_key.repository)
            assert audit.failure is not None
            assert audit.failure.defect is ChainDefect.FORGED
            assert "key is not this store's" in audit.failure.reason


def test_unkeyed_events_before_the_first_keyed_one_are_counted_not_failed() -> None:
    """Events appended without a MAC before a keyed one verify on the plain chain, counted."""
    with bootstrap(Settings(backend="memory"), key=KEY, create=True) as runtime:
        repo = runtime.repository
        old = make_event("s", 0)
        older = make_event("s", 1, old)
        new = keyed(make_event("s", 2, older), repo)
        store = _store_with(old, older, new)
        audit = verify_stream(store, "s", repo)
        assert audit.ok
        assert (audit.events, audit.unkeyed) == (3, 2)
        report = LedgerAudit(store, repo).run(["s"])
        assert report.unkeyed == 2
