"""Scrubbed parameters, purged results and re-sealed records leave no old seal in SQLite's files."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from flowvault.adapters.crypto import FileKeyStore
from flowvault.adapters.crypto._cipher import derive_integrity_key, generate_master_key
from flowvault.application import Guard
from flowvault.application._action_results import ACTION_RESULTS
from flowvault.application._rotation import KeyRotation
from flowvault.application._workflow_records import WORKFLOWS
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import WorkOrder

WINDOW = 32
STRIDE = 16
NONCE_BYTES = 12
ACTION_HASH = "sha256:" + "5e" * 32
PURGED = "action_result.purged"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Point a SQLite vault at a fresh home."""
    return Settings(backend="sqlite", home=tmp_path)


@pytest.fixture
def clock() -> FrozenClock:
    """Hold time still until a test moves it."""
    return FrozenClock()


@pytest.fixture
def runtime(settings: Settings, clock: FrozenClock) -> Iterator[Runtime]:
    """Open the vault on a frozen clock and close it afterwards."""
    opened = bootstrap(settings, clock=clock, create=True)
    try:
        yield opened
    finally:
        opened.close()


def _files(settings: Settings) -> list[Path]:
    database = settings.database_path
    return [database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))]


def _needles(sealed: bytes) -> list[bytes]:
    """Every 16th 32-byte window, the last window, and the nonce with 32 ciphertext bytes."""
    assert len(sealed) > 2 * WINDOW
    windows = [sealed[at : at + WINDOW] for at in range(0, len(sealed) - WINDOW + 1, STRIDE)]
    windows.append(sealed[-WINDOW:])
    nonce_at = 2 + sealed[1]
    windows.append(sealed[nonce_at : nonce_at + NONCE_BYTES + WINDOW])
    return windows


def _raw(settings: Settings) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in _files(settings) if path.exists()}


def _leaks(settings: Settings, needles: list[bytes]) -> list[str]:
    raw = _raw(settings)
    return [
        f"needle {number} in {name}"
        for number, needle in enumerate(needles)
        for name, data in raw.items()
        if needle in data
    ]


def _unseen(settings: Settings, needles: list[bytes]) -> list[int]:
    raw = _raw(settings)
    return [
        number
        for number, needle in enumerate(needles)
        if not any(needle in data for data in raw.values())
    ]


def _sealed(runtime: Runtime, namespace: str, natural_key: str) -> bytes:
    digest = runtime.repository.key_digest(namespace, natural_key)
    stored = runtime.store.load(namespace, digest)
    assert stored is not None
    return stored.payload


def _order(marker: str) -> WorkOrder:
    return WorkOrder(
        kind="invoice.review",
        parameters={"note": marker, "iban": f"DE00-{marker}"},
        requester="requester-1",
        idempotency_key=f"idem-{marker}",
    )


def test_terminal_transition_scrubs_every_sealed_revision(
    settings: Settings, runtime: Runtime
) -> None:
    """Remove every sealed revision that held parameters once the workflow ends."""
    marker = f"scrub-marker-{uuid.uuid4().hex}"
    service = runtime.workflows
    record, created = service.create(_order(marker))
    assert created
    workflow_id = record.workflow_id
    revisions = [_sealed(runtime, WORKFLOWS, workflow_id)]
    for expected_state, target in (("intake", "planning"), ("planning", "executing")):
        current = service.get(workflow_id)
        assert current.state == expected_state
        service.transition(
            workflow_id,
            target,
            expected_state=expected_state,
            expected_version=current.state_version,
        )
        revisions.append(_sealed(runtime, WORKFLOWS, workflow_id))
    needles = [needle for sealed in revisions for needle in _needles(sealed)]

    assert len(set(revisions)) == len(revisions)
    assert _unseen(settings, needles) == [], "the scan cannot see sealed bytes before scrubbing"

    ended = service.transition(
        workflow_id, "completed", expected_state="executing", expected_version=3
    )
    assert ended.work_order.parameters == {}
    assert service.get(workflow_id).work_order.parameters == {}
    assert _leaks(settings, needles) == []
    assert _leaks(settings, [marker.encode()]) == []

    runtime.close()
    assert _leaks(settings, needles) == []
    assert _leaks(settings, [marker.encode()]) == []
    with bootstrap(settings, create=True) as reopened:
        record = reopened.workflows.get(workflow_id)
        assert (record.state, record.state_version) == ("completed", 4)
        assert record.work_order.parameters == {}
        assert len(reopened.workflow_events.events(workflow_id)) == 4


def test_purge_removes_sealed_result_and_leaves_tombstone(
    settings: Settings, runtime: Runtime, clock: FrozenClock
) -> None:
    """Remove a purged result's sealed bytes from disk and record a body-free tombstone."""
    marker = f"result-marker-{uuid.uuid4().hex}"
    service = runtime.action_results
    record, _ = runtime.workflows.create(_order(f"order-{marker}"))
    workflow_id = record.workflow_id
    stored = service.put_action_result(
        workflow_id, ACTION_HASH, {"body": marker}, retention=timedelta(seconds=1)
    )
    natural_key = "\x1f".join((workflow_id, ACTION_HASH))
    needles = _needles(_sealed(runtime, ACTION_RESULTS, natural_key))

    assert _unseen(settings, needles) == [], "the scan cannot see sealed bytes before purging"

    clock.advance(timedelta(seconds=2))
    assert service.purge_expired() == 1
    digest = runtime.repository.key_digest(ACTION_RESULTS, natural_key)
    assert runtime.store.load(ACTION_RESULTS, digest) is None
    assert service.get_action_result(workflow_id, ACTION_HASH) is None
    assert _leaks(settings, needles) == []
    assert _leaks(settings, [marker.encode()]) == []

    events = runtime.workflow_events.events(workflow_id)
    tombstones = [event for event in events if event.type == PURGED]
    assert len(tombstones) == 1
    payload = tombstones[0].payload
    assert isinstance(payload, dict)
    assert "result" not in payload
    assert marker not in str(payload)
    assert payload["action_hash"] == ACTION_HASH
    assert payload["content_hash"] == stored.content_hash
    assert payload["size_bytes"] == stored.size_bytes

    runtime.close()
    assert _leaks(settings, needles) == []
    assert _leaks(settings, [marker.encode()]) == []


def test_rotation_leaves_no_seal_of_the_old_key_on_disk(
    settings: Settings, runtime: Runtime
) -> None:
    """Retiring a key only helps if no copy of what it sealed survives in the files.

    A re-seal overwrites its row, but the write-ahead log keeps the old page
    until a checkpoint; rotation compacts when it is done.
    """
    names = [f"rotated-{n}" for n in range(20)]
    for name in names:
        runtime.repository.write("things", name, {"note": uuid.uuid4().hex}, expected=Guard.ABSENT)
    needles = [needle for name in names for needle in _needles(_sealed(runtime, "things", name))]
    assert _unseen(settings, needles) == [], "the scan cannot see sealed bytes before rotating"
    runtime.close()

    keys = FileKeyStore(settings.keys_dir)
    ring = keys.read_ring()
    assert ring is not None
    rotated = ring.promote(generate_master_key(), integrity=derive_integrity_key(ring.primary))
    keys.replace_ring(rotated, expected=ring)
    with bootstrap(settings, create=True) as reopened:
        report = KeyRotation(reopened.repository).run()
        assert (report.resealed, report.remaining, report.compacted) == (len(names), 0, True)
        assert _leaks(settings, needles) == []
    assert _leaks(settings, needles) == []
