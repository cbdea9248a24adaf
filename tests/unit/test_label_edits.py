"""Clear labels an editor changed do not steer a choice: latest checkpoint, approval order, purges.

A listing returns each row's labels in the clear, and a database editor can
change them (the row's own copy and the index alike) without the key. Where
a service chooses by a label (the newest checkpoint of a run, the order of a
run's approvals, which idempotency records are old enough to purge) it opens
the rows first, which checks their labels against the sealed copy, so an
edit is refused rather than making the service pass over the newest record
or purge a fresh one under a keyed tombstone. Every adapter runs these.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from checkpoint_setup import create_checkpoint, request_approval
from row_edits import RowEditor

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.application import (
    ApprovalService,
    CheckpointService,
    IdempotencyService,
    SealedRepository,
    SecureObjectStore,
    StoredRecord,
    UnreadableItem,
)
from flowvault.application._record_kinds import APPROVALS, CHECKPOINTS, REQUEST_IDEMPOTENCY
from flowvault.application._records import LabelValue
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import Checkpoint, IntegrityFailure

KEY = bytes(range(13, 45))
RUN = "run-labels"
HOUR = timedelta(hours=1)


class World(RowEditor):
    """Checkpoints, approvals and idempotency records over one store, and an editor of its rows."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.clock = FrozenClock()
        super().__init__(store, SealedRepository(store, AesGcmCipher(KEY), self.clock))
        repo = self.repository
        self.checkpoints = CheckpointService(repo, self.clock, integrity=repo)
        self.approvals = ApprovalService(
            repo, self.clock, SequentialIds("ap"), checkpoints=self.checkpoints, integrity=repo
        )
        self.idempotency = IdempotencyService(repo, self.clock)

    def checkpoint(self, cursor: str) -> Checkpoint:
        self.clock.advance()
        return create_checkpoint(self.checkpoints, RUN, cursor, {"at": cursor})

    def relabel(self, row: StoredRecord, **labels: LabelValue) -> None:
        """Put ``row`` back with some clear labels changed, as an editor of the database could."""
        changed = {**row.metadata.labels, **labels}
        metadata = dataclasses.replace(row.metadata, labels=changed)
        self.replay(dataclasses.replace(row, metadata=metadata))


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def test_a_backdated_newest_checkpoint_is_refused_not_passed_over(world: World) -> None:
    """Lowering the newest checkpoint's clear creation time must not make an older one latest."""
    world.checkpoint("node-a")
    newest = world.checkpoint("node-b")
    assert world.checkpoints.latest_checkpoint(RUN) == newest
    row = world.row(CHECKPOINTS, newest.checkpoint_id)
    world.relabel(row, created_at=0)
    with pytest.raises(IntegrityFailure):
        world.checkpoints.latest_checkpoint(RUN)


def test_a_backdated_approval_is_reported_not_reordered(world: World) -> None:
    """Approvals come most recently written first; one with a changed label is reported apart."""
    made = world.checkpoint("node-a")
    first = request_approval(world.approvals, made, "finance", world.clock.now() + HOUR)
    world.clock.advance()
    second = request_approval(world.approvals, made, "legal", world.clock.now() + HOUR)
    listed = world.approvals.list_approvals(RUN, limit=1)
    assert [a.approval_id for a in listed.items] == [second.approval_id]
    assert [a.approval_id for a in world.approvals.list_approvals(RUN).items] == [
        second.approval_id,
        first.approval_id,
    ]
    edited = world.row(APPROVALS, second.approval_id)
    world.relabel(edited, requested_at=0)
    listed = world.approvals.list_approvals(RUN)
    assert [a.approval_id for a in listed.items] == [first.approval_id]
    assert listed.unreadable == (UnreadableItem(edited.metadata.key_digest, "INTEGRITY_FAILURE"),)


def test_a_backdated_idempotency_record_is_not_purged_early(world: World) -> None:
    """A fresh record whose clear creation time was set back fails the purge and stays."""
    world.idempotency.remember("req-old", {"op": 1}, {"status": 201})
    world.clock.advance(timedelta(days=2))
    world.idempotency.remember("req-new", {"op": 2}, {"status": 202})
    fresh = world.row(REQUEST_IDEMPOTENCY, "req-new")
    world.relabel(fresh, created_at=0)
    with pytest.raises(IntegrityFailure):
        world.idempotency.purge(world.clock.now(), timedelta(days=1))
    assert world.store.peek_metadata(REQUEST_IDEMPOTENCY, fresh.metadata.key_digest) is not None


def test_untouched_labels_purge_exactly_the_old_records(world: World) -> None:
    """The control: without an edit the purge removes the old record and keeps the fresh one."""
    world.idempotency.remember("req-old", {"op": 1}, {"status": 201})
    world.clock.advance(timedelta(days=2))
    world.idempotency.remember("req-new", {"op": 2}, {"status": 202})
    assert world.idempotency.purge(world.clock.now(), timedelta(days=1)) == 1
    assert world.idempotency.recall("req-new", {"op": 2}) == {"status": 202}
