"""Every kind of deletion leaves no plaintext and no old seal in SQLite's raw files.

Each test writes records whose sealed documents carry a unique marker,
keeps every seal it sees in the ``records`` table, deletes through the
public API (or the CLI), then reads the raw bytes of the database, its
write-ahead log and its shared-memory file: no 16-byte window of a seal that
is no longer current may remain, and the marker never appears at all. The
controls show the scan has teeth: before the deletion it finds every seal
the deletion removes, and with compaction or ``secure_delete`` switched off
it still finds them afterwards.

Terminal scrubs, results purged by ``purge_expired`` and key rotation are
scanned the same way in ``test_workflow_scrub.py``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from cli_helpers import json_document, run_cli

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite._connect import ConnectOptions
from flowvault.application import Compactor, Delete, Guard, LedgerTrim, UnitOfWork
from flowvault.application._action_results import ACTION_RESULTS
from flowvault.application._graph_namespaces import (
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_DEFINITIONS,
    GRAPH_RUN_IDEMPOTENCY,
    GRAPH_RUNS,
)
from flowvault.application._record_kinds import (
    APPROVAL_SLOTS,
    APPROVALS,
    CHECKPOINTS,
    REQUEST_IDEMPOTENCY,
)
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._state import STATE_NAMESPACE
from flowvault.application._streams import read_stream
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import Checkpoint, LedgerEvent, WorkflowState, WorkOrder
from flowvault.domain._ledger import GENESIS_HASH

PIECE = 8
"""Any 16-byte window of a seal covers one of its 8-byte pieces, so looking for pieces suffices."""
SIDECARS = ("-wal", "-shm")
DAY = timedelta(days=1)
HOST_NAMESPACE = "host.notes"
ACTION_HASH = "sha256:" + "a7" * 32
DEFINITION = "graph.review"

Address = tuple[str, str]
Files = dict[str, bytes]


class Disk:
    """One SQLite database's raw files, and every seal its records have held."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.seals: dict[Address, list[bytes]] = {}

    def rows(self) -> dict[Address, bytes]:
        """Read every record's sealed payload straight from the ``records`` table."""
        uri = f"file:{quote(str(self.database))}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as raw:
            rows = raw.execute("SELECT namespace, key_digest, payload FROM records").fetchall()
        return {(namespace, digest): bytes(payload) for namespace, digest, payload in rows}

    def observe(self) -> dict[Address, bytes]:
        """Remember the seals current now, so a later revision cannot hide an earlier one."""
        current = self.rows()
        for address, seal in current.items():
            known = self.seals.setdefault(address, [])
            if seal not in known:
                known.append(seal)
        return current

    def stale(self, current: dict[Address, bytes]) -> list[bytes]:
        """Every seal seen that no record holds now: none of them may stay on disk."""
        return [
            seal
            for address, seals in self.seals.items()
            for seal in seals
            if current.get(address) != seal
        ]

    def read(self) -> Files:
        """Return the raw bytes of the database and of each sidecar that exists."""
        name = self.database.name
        paths = [self.database, *(self.database.with_name(name + s) for s in SIDECARS)]
        return {path.name: path.read_bytes() for path in paths if path.exists()}


def _pieces(seal: bytes) -> list[bytes]:
    """Split the random part of a seal (nonce, ciphertext, tag) into 8-byte pieces.

    The wire header (version, key-id length, key id) is shared by every seal
    under one key, so the pieces start at the nonce.
    """
    start = 2 + seal[1]
    assert len(seal) - start >= 2 * PIECE
    return [seal[at : at + PIECE] for at in range(start, len(seal) - PIECE + 1, PIECE)]


def _leaks(files: Files, seals: Iterable[bytes]) -> list[str]:
    """Name every piece of ``seals`` found in any file."""
    return [
        f"seal {number} piece {index} in {name}"
        for number, seal in enumerate(seals)
        for index, piece in enumerate(_pieces(seal))
        for name, data in files.items()
        if piece in data
    ]


def _missing(files: Files, seals: Iterable[bytes]) -> list[str]:
    """Name every piece of ``seals`` found in no file."""
    return [
        f"seal {number} piece {index}"
        for number, seal in enumerate(seals)
        for index, piece in enumerate(_pieces(seal))
        if not any(piece in data for data in files.values())
    ]


def _plaintext(files: Files, marker: str) -> list[str]:
    return [name for name, data in files.items() if marker.encode() in data]


@dataclass
class Vault:
    """A SQLite runtime on a frozen clock, its raw files, and the marker its documents carry."""

    runtime: Runtime
    clock: FrozenClock
    disk: Disk
    marker: str = field(default_factory=lambda: f"deletion-marker-{uuid.uuid4().hex}")


@contextlib.contextmanager
def _vault(home: Path, clock: FrozenClock | None = None) -> Iterator[Vault]:
    settings = Settings(backend="sqlite", home=home)
    frozen = clock or FrozenClock()
    with bootstrap(settings, clock=frozen, create=True) as runtime:
        yield Vault(runtime, frozen, Disk(settings.database_path))


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    """Open a SQLite vault in a fresh home on a frozen clock."""
    with _vault(tmp_path) as opened:
        yield opened


# -- the kinds of deletion: each set-up writes and returns the deletion ------------

Deletion = Callable[[], None]


def _host_delete(v: Vault) -> Deletion:
    """Delete a record in the host's own unit of work, then call ``compact`` as the docs say."""
    repo, store = v.runtime.repository, v.runtime.store
    repo.write(HOST_NAMESPACE, "note-1", {"note": v.marker}, expected=Guard.ABSENT)
    v.disk.observe()
    repo.write(HOST_NAMESPACE, "note-1", {"note": v.marker, "revised": True}, expected=1)
    v.disk.observe()
    digest = repo.key_digest(HOST_NAMESPACE, "note-1")

    def delete() -> None:
        store.commit(UnitOfWork(deletes=[Delete(HOST_NAMESPACE, digest, 2)]))
        assert isinstance(store, Compactor)
        assert store.compact() is True

    return delete


def _state_reset(v: Vault) -> Deletion:
    state = v.runtime.state("main")
    state.save(WorkflowState(step=1, note=v.marker))
    v.disk.observe()
    state.update(lambda current: WorkflowState(step=2, note=v.marker))
    v.disk.observe()

    def delete() -> None:
        fingerprint = state.reset(actor="tester", source="secure-deletion")
        assert fingerprint.revision == 2
        assert state.load().revision is None

    return delete


def _expired_result_replaced(v: Vault) -> Deletion:
    """Replace a result past its retention by a new one under the same action hash."""
    workflows = v.runtime.workflows
    order = WorkOrder(kind="invoice.review", requester="requester-1", idempotency_key="wf-1")
    record, _ = workflows.create(order)
    v.runtime.action_results.put_action_result(
        record.workflow_id, ACTION_HASH, {"body": v.marker}, retention=timedelta(seconds=1)
    )
    v.disk.observe()
    v.clock.advance(timedelta(seconds=2))

    def delete() -> None:
        fresh = v.runtime.action_results.put_action_result(
            record.workflow_id, ACTION_HASH, {"body": "fresh"}
        )
        assert fresh.result == {"body": "fresh"}

    return delete


def _checkpoint(v: Vault) -> Checkpoint:
    runs = v.runtime.runs
    v.runtime.definitions.register_definition(DEFINITION, {"nodes": ["plan", "approve", "act"]})
    run, _ = runs.start_run(DEFINITION, {"ticket": "T-1"})
    checkpoint = v.runtime.checkpoints.create_checkpoint(
        run.run_id,
        {"node": "approve"},
        state={"note": v.marker},
        budgets={"tokens": 100},
        counters={"nodes": 2},
        dependency_summary={"deps": [v.marker]},
        terminal_cursor=None,
        event_cursor=1,
    )
    v.disk.observe()
    return checkpoint


def _checkpoint_purged(v: Vault) -> Deletion:
    checkpoints = v.runtime.checkpoints
    checkpoint = _checkpoint(v)
    checkpoints.consume_checkpoint(checkpoint.checkpoint_id)
    v.disk.observe()
    v.clock.advance(2 * DAY)

    def delete() -> None:
        assert checkpoints.purge(v.clock.now(), DAY) == 1

    return delete


def _approval_purged(v: Vault) -> Deletion:
    approvals = v.runtime.approvals
    checkpoint = _checkpoint(v)
    approval = approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="finance-team",
        prompt_digest="sha256:" + "5e" * 32,
        allowed_decisions=["approve", "reject"],
        expires_at=v.clock.now() + timedelta(hours=1),
    )
    v.disk.observe()
    approvals.decide(approval.approval_id, "approve", f"{v.marker}@example.org")
    v.disk.observe()
    v.clock.advance(2 * DAY)

    def delete() -> None:
        assert approvals.purge(v.clock.now(), DAY) == 1

    return delete


def _idempotency_purged(v: Vault) -> Deletion:
    idempotency = v.runtime.idempotency
    idempotency.remember(f"request-{v.marker}", {"op": v.marker}, {"status": v.marker})
    v.disk.observe()
    v.clock.advance(8 * DAY)

    def delete() -> None:
        assert idempotency.purge(v.clock.now(), 7 * DAY) == 1

    return delete


def _run_purged(v: Vault) -> Deletion:
    runs = v.runtime.runs
    v.runtime.definitions.register_definition(DEFINITION, {"nodes": ["plan", "approve", "act"]})
    run, _ = runs.start_run(DEFINITION, {"ticket": v.marker}, idempotency_key=f"run-{v.marker}")
    v.disk.observe()
    runs.set_status(run.run_id, "running", expected_status="accepted")
    v.disk.observe()
    runs.finish_run(
        run.run_id, "completed", expected_status="running", final_state={"answer": v.marker}
    )
    v.disk.observe()
    v.clock.advance(2 * DAY)

    def delete() -> None:
        purged = purge_finished_runs(v.runtime.repository, v.runtime.clock, v.clock.now(), DAY)
        assert purged == 1

    return delete


def _definition_deleted(v: Vault) -> Deletion:
    v.runtime.definitions.register_definition("graph.secret", {"nodes": [v.marker]})
    v.disk.observe()
    v.runtime.definitions.register_definition("graph.secret", {"nodes": [v.marker, "act"]})
    v.disk.observe()

    def delete() -> None:
        assert v.runtime.definitions.delete_definition("graph.secret") == 2

    return delete


@dataclass(frozen=True)
class Kind:
    """A deletion's set-up, and the namespaces whose current seals it must remove."""

    setup: Callable[[Vault], Deletion]
    namespaces: frozenset[str]


KINDS = {
    "host-delete-then-compact": Kind(_host_delete, frozenset({HOST_NAMESPACE})),
    "state-reset": Kind(_state_reset, frozenset({STATE_NAMESPACE})),
    "expired-result-replaced": Kind(_expired_result_replaced, frozenset({ACTION_RESULTS})),
    "consumed-checkpoint-purged": Kind(_checkpoint_purged, frozenset({CHECKPOINTS})),
    "decided-approval-purged": Kind(_approval_purged, frozenset({APPROVALS, APPROVAL_SLOTS})),
    "idempotency-record-purged": Kind(_idempotency_purged, frozenset({REQUEST_IDEMPOTENCY})),
    "finished-run-purged": Kind(_run_purged, frozenset({GRAPH_RUNS, GRAPH_RUN_IDEMPOTENCY})),
    "definition-deleted": Kind(
        _definition_deleted, frozenset({GRAPH_DEFINITIONS, GRAPH_DEFINITION_VERSIONS})
    ),
}
"""Every record deletion beyond those ``test_workflow_scrub.py`` scans; trims and verbs follow."""

FREED_SPACE_REUSED = {"expired-result-replaced", "decided-approval-purged"}
"""Kinds whose unit may reuse the space it frees, so without secure_delete a seal can vanish."""


@dataclass(frozen=True)
class Outcome:
    """The seals a deletion removed, every stale seal, and the raw files around it."""

    removed: dict[Address, bytes]
    stale: list[bytes]
    before: Files
    after: Files


def _delete(v: Vault, kind: Kind) -> Outcome:
    deletion = kind.setup(v)
    current = v.disk.observe()
    before = v.disk.read()
    deletion()
    now = v.disk.observe()
    removed = {address: seal for address, seal in current.items() if now.get(address) != seal}
    assert {namespace for namespace, _ in removed} == kind.namespaces
    return Outcome(removed, v.disk.stale(now), before, v.disk.read())


@pytest.mark.parametrize("name", KINDS)
def test_deletion_leaves_no_old_seal_and_no_plaintext(vault: Vault, name: str) -> None:
    """After the deletion no piece of any stale seal, and never the marker, is on disk."""
    outcome = _delete(vault, KINDS[name])

    assert _missing(outcome.before, outcome.removed.values()) == [], "control: seen before"
    assert _leaks(outcome.after, outcome.stale) == []
    assert _plaintext(outcome.before, vault.marker) == []
    assert _plaintext(outcome.after, vault.marker) == []


@pytest.mark.parametrize("name", KINDS)
def test_without_compaction_the_scan_finds_the_removed_seals(
    vault: Vault, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with compaction a no-op, the write-ahead log still holds every removed seal."""
    monkeypatch.setattr(SQLiteSecureObjectStore, "compact", lambda self: True)
    outcome = _delete(vault, KINDS[name])

    assert _missing(outcome.after, outcome.removed.values()) == []


FREED_IN_PLACE = [name for name in KINDS if name not in FREED_SPACE_REUSED]


@pytest.mark.parametrize("name", FREED_IN_PLACE)
def test_without_secure_delete_the_scan_finds_the_removed_seals(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: compaction alone empties the log, but free space keeps the removed seals."""
    pragmas = ConnectOptions.pragmas

    def insecure(options: ConnectOptions) -> tuple[tuple[str, str, object], ...]:
        return tuple(
            ("secure_delete", "OFF", 0) if pragma[0] == "secure_delete" else pragma
            for pragma in pragmas(options)
        )

    monkeypatch.setattr(ConnectOptions, "pragmas", insecure)
    with _vault(tmp_path) as vault:
        outcome = _delete(vault, KINDS[name])

    assert outcome.after.get("flowvault.db-wal", b"") == b""
    assert _missing({"flowvault.db": outcome.after["flowvault.db"]}, outcome.removed.values()) == []


def test_trimmed_ledger_events_leave_no_copy(vault: Vault) -> None:
    """Ledger payloads are plaintext by design, so a trim plus ``compact`` must drop them."""
    store, stream = vault.runtime.store, "host/notes"
    notes = [f"{vault.marker}-{index}" for index in range(3)]
    events: list[LedgerEvent] = []
    for index, note in enumerate(notes):
        previous = events[-1].event_hash if events else GENESIS_HASH
        event = LedgerEvent.create(
            stream=stream,
            index=index,
            type="note.added",
            occurred_at=vault.clock.now(),
            payload={"note": note},
            previous_hash=previous,
        )
        store.commit(UnitOfWork(appends=[event]))
        events.append(event)
    assert [_plaintext(vault.disk.read(), note) != [] for note in notes] == [True] * 3

    store.commit(UnitOfWork(trims=[LedgerTrim(stream, 2)]))
    assert isinstance(store, Compactor)
    assert store.compact() is True

    files = vault.disk.read()
    assert [_plaintext(files, note) != [] for note in notes] == [False, False, True]
    assert [event.index for event in read_stream(store, stream)] == [2]


# -- the verbs: purge and reset-progress in a child process ------------------------


def test_purge_verb_leaves_no_old_seal_and_no_plaintext(tmp_path: Path) -> None:
    """``flowvault purge`` deletes every kind past its age; none of their seals stays on disk."""
    home = tmp_path / "home"
    clock = FrozenClock(datetime.now(UTC) - 30 * DAY)
    with _vault(home, clock) as vault:
        for setup in (
            _expired_result_replaced,
            _approval_purged,
            _idempotency_purged,
            _run_purged,
        ):
            setup(vault)
        current = vault.disk.observe()
    before = vault.disk.read()

    result = run_cli(
        tmp_path,
        "purge",
        "--older-than-days",
        "0",
        "--finished-runs-older-than-days",
        "0",
        "--json",
        home=home,
    )

    assert result.returncode == 0, result.stderr
    document = json_document(result)
    assert document["deleted"] == {
        "action_results": 1,
        "consumed_checkpoints": 1,
        "decided_approvals": 1,
        "idempotency_records": 1,
        "finished_runs": 1,
    }
    assert document["compacted"] is True
    now = vault.disk.observe()
    removed = [seal for address, seal in current.items() if address not in now]
    assert {namespace for namespace, _ in current.keys() - now.keys()} == {
        ACTION_RESULTS,
        APPROVALS,
        APPROVAL_SLOTS,
        CHECKPOINTS,
        REQUEST_IDEMPOTENCY,
        GRAPH_RUNS,
        GRAPH_RUN_IDEMPOTENCY,
    }
    assert _missing(before, removed) == [], "control: seen before"
    after = vault.disk.read()
    assert _leaks(after, vault.disk.stale(now)) == []
    assert _plaintext(before, vault.marker) == []
    assert _plaintext(after, vault.marker) == []
    assert vault.marker not in result.stdout + result.stderr


def test_reset_progress_verb_leaves_no_old_seal_and_no_plaintext(tmp_path: Path) -> None:
    """``flowvault reset-progress`` removes every seal the scope's state has had."""
    home = tmp_path / "home"
    with _vault(home) as vault:
        _state_reset(vault)
        current = vault.disk.observe()
    before = vault.disk.read()

    result = run_cli(tmp_path, "reset-progress", "--scope", "main", "--yes", "--json", home=home)

    assert result.returncode == 0, result.stderr
    assert json_document(result)["applied"] is True
    now = vault.disk.observe()
    removed = [seal for address, seal in current.items() if address not in now]
    assert {namespace for namespace, _ in current.keys() - now.keys()} == {STATE_NAMESPACE}
    assert _missing(before, removed) == [], "control: seen before"
    after = vault.disk.read()
    assert _leaks(after, vault.disk.stale(now)) == []
    assert _plaintext(before, vault.marker) == []
    assert _plaintext(after, vault.marker) == []
