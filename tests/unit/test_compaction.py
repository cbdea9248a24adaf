"""A compaction that fails after a durable commit does not turn the call into an error."""

from __future__ import annotations

import pytest
from log_capture import capture_logs

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application._compaction import compact_after_commit
from flowvault.composition import Settings, bootstrap
from flowvault.domain import StoreUnavailable, WorkOrder


class _FailingCompaction(InMemorySecureObjectStore):
    """A store whose compaction always fails, as a full or failing disk would make it."""

    def __init__(self) -> None:
        super().__init__()
        self.compactions = 0

    def compact(self) -> bool:
        self.compactions += 1
        raise StoreUnavailable("database operation failed (SQLITE_IOERR_WRITE)")


def test_a_failed_compaction_is_reported_as_false_and_logged() -> None:
    """The log names the error code only, so an operator can see why bytes linger."""
    store = _FailingCompaction()
    with capture_logs() as logs:
        assert compact_after_commit(store) is False
    assert logs == [
        {"event": "compaction_deferred", "code": "STORE_UNAVAILABLE", "log_level": "warning"}
    ]


def test_a_terminal_transition_succeeds_when_its_compaction_fails() -> None:
    """The transition is durable; raising would make the caller's retry conflict."""
    store = _FailingCompaction()
    with bootstrap(Settings(backend="memory"), key=b"k" * 32, store=store) as vault:
        order = WorkOrder(kind="k.review", parameters={"p": 1}, requester="r", idempotency_key="i")
        record, _ = vault.workflows.create(order)
        done = vault.workflows.transition(
            record.workflow_id, "cancelled", expected_state="intake", expected_version=1
        )
        assert done.state == "cancelled"
        assert store.compactions == 1
        assert vault.workflows.get(record.workflow_id).state == "cancelled"


def test_only_store_errors_are_absorbed() -> None:
    """A bug in an adapter's compaction must still surface."""

    class _Broken(InMemorySecureObjectStore):
        def compact(self) -> bool:
            raise RuntimeError("a bug, not a store outage")

    with pytest.raises(RuntimeError):
        compact_after_commit(_Broken())
