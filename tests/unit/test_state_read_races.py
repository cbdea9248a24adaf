"""A state read that keeps losing to other writers is one more lost race, retried like a commit.

Under heavy contention the row a state update loads can be rewritten
between its read and its stream's head so often that the read gives up
(``RevisionConflict``). The update's retry loop takes that as a lost race,
pauses and tries again within its budget, as it does for a commit that
lost, instead of failing at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from row_edits import PassThroughStore

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import RetryPolicy, SecureObjectStore, StateRepository, StoredRecord
from flowvault.application._state import STATE_NAMESPACE
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import RevisionConflict, WorkflowState

KEY = bytes(range(32))


class RacedStore(PassThroughStore):
    """Serves an older copy of one row to the next ``times`` loads, as a reader losing races sees.

    The row there has moved on each time it is checked, so every read finds
    its copy stale and the row changed: a race, never tampering.
    """

    def __init__(self, inner: SecureObjectStore) -> None:
        super().__init__(inner)
        self.row: tuple[str, str] | None = None
        self.older: StoredRecord | None = None
        self.times = 0

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Return the older copy while races are left, else the row."""
        if (namespace, key_digest) == self.row and self.times > 0 and self.older is not None:
            self.times -= 1
            return self.older
        return self._inner.load(namespace, key_digest)


def _raced(tmp_path: Path) -> tuple[Runtime, RacedStore]:
    store = RacedStore(InMemorySecureObjectStore())
    runtime = bootstrap(Settings(backend="memory", home=tmp_path), key=KEY, store=store)
    state = runtime.state("main")
    state.save(WorkflowState(step=1))
    digest = runtime.repository.key_digest(STATE_NAMESPACE, "main")
    store.row = (STATE_NAMESPACE, digest)
    store.older = store.load(STATE_NAMESPACE, digest)
    state.save(WorkflowState(step=2))
    return runtime, store


def test_an_update_retries_a_read_that_lost_its_races(tmp_path: Path) -> None:
    """Twenty lost reads (more than one read's tries) and the update still lands."""
    runtime, store = _raced(tmp_path)
    store.times = 20
    state, _ = runtime.state("main").update(
        lambda s: WorkflowState(step=s.model_dump()["step"] + 1)
    )
    assert state == WorkflowState(step=3)
    assert store.times == 0
    assert runtime.state("main").load().state == WorkflowState(step=3)


def test_an_update_still_gives_up_when_every_read_loses(tmp_path: Path) -> None:
    """Endless races spend the update's time budget: ``RevisionConflict``, nothing written."""
    runtime, store = _raced(tmp_path)
    store.times = 10**9
    state = StateRepository(runtime.repository, "main", retry=RetryPolicy(time_budget=0.2))
    with pytest.raises(RevisionConflict) as caught:
        state.update(lambda s: WorkflowState(step=99))
    assert caught.value.details["milliseconds"] >= 200
    store.times = 0
    assert runtime.state("main").load().state == WorkflowState(step=2)
