"""One sync per acknowledged unit by default: the database's; the mark syncs in the background.

The real SQLite adapter runs over APSW with a file layer that records every
write and sync SQLite makes to the database and its write-ahead log, and
the thread that made it (``FaultVFS``, writing straight through);
``os.fsync`` and ``os.fdatasync``, the mark's syncs, are counted per thread.
Each unit is counted on the thread that calls the service, from the call
to its return: what the caller waits for before the write is
acknowledged. Copying the log into the database runs on the store's own
thread, never the caller's. What remains of SQLite's upkeep on the
caller is the log's restart once it was copied in whole: the commit that
writes its new header syncs that header first. Those units are told
apart by their write at the log's offset 0 and counted separately. The
strict mode is the control: the mark's sync joins every unit.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Literal

import pytest
from apsw_driver import adapter_over, registered
from checkpoint_setup import create_checkpoint, request_approval

from flowvault.application import HistoryEvent
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import WorkflowState, WorkOrder

KEY = bytes(range(32))
UNITS = 12
"""Units counted per operation."""


class SyncCounter:
    """``os.fsync`` and ``os.fdatasync`` wrapped to count calls by the thread that makes them."""

    def __init__(self) -> None:
        self.by_thread: Counter[int] = Counter()
        self._lock = threading.Lock()

    @contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        """Count for the block."""
        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, self._counting(getattr(os, name)))
        yield
        monkeypatch.undo()

    def _counting(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            with self._lock:
                self.by_thread[threading.get_ident()] += 1
            real(fd)

        return sync


def _order(name: str) -> WorkOrder:
    return WorkOrder(kind="sync.count", parameters={"n": name}, requester="t", idempotency_key=name)


def _stepped(state: WorkflowState) -> tuple[WorkflowState, list[HistoryEvent]]:
    step = int(state.model_dump().get("step", 0)) + 1
    return WorkflowState(step=step), [HistoryEvent("state.stepped", {"to": step})]


def _pending_approval(runtime: Runtime, n: int) -> str:
    """Start a run, checkpoint it and ask for an approval; return the approval's id."""
    run, _ = runtime.runs.start_run("graph.sync", {"n": n})
    runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
    checkpoint = create_checkpoint(runtime.checkpoints, run.run_id, {"node": "a"}, {"n": n})
    expires = runtime.clock.now() + timedelta(hours=4)
    return request_approval(runtime.approvals, checkpoint, "finance", expires).approval_id


Unit = Callable[[], object]


def _units(runtime: Runtime) -> dict[str, list[Unit]]:
    """``UNITS`` calls of each operation, everything they act on made beforehand."""
    runtime.definitions.register_definition("graph.sync", {"nodes": ["approve"]})
    created = [runtime.workflows.create(_order(f"moved-{n}"))[0] for n in range(UNITS)]
    runtime.state("main").update_with_events(_stepped)
    approvals = [_pending_approval(runtime, n) for n in range(UNITS)]
    workflows, state = runtime.workflows, runtime.state("main")
    return {
        "create": [lambda n=n: workflows.create(_order(f"new-{n}")) for n in range(UNITS)],
        "transition": [
            lambda wid=record.workflow_id: workflows.transition(
                wid, "planning", expected_state="intake", expected_version=1
            )
            for record in created
        ],
        "state update": [lambda: state.update_with_events(_stepped) for _ in range(UNITS)],
        "approval decide": [
            lambda aid=aid: runtime.approvals.decide(aid, "approve", "bob@example.org")
            for aid in approvals
        ],
    }


@dataclass(frozen=True, slots=True)
class Counted:
    """What one acknowledged unit waited for."""

    database: int
    """Syncs of the database and its log."""
    mark: int
    """``os.fsync``/``os.fdatasync`` calls (the mark's) on the calling thread."""
    upkeep: bool
    """Whether SQLite restarted its log in this unit."""
    copied: bool
    """Whether the caller's thread wrote the database file itself (a checkpoint on the path)."""


Touched = list[tuple[str, str, int, int]]


def _mine(touched: Touched, caller: int) -> Touched:
    return [call for call in touched if call[3] == caller]


def _restarted(touched: Touched) -> bool:
    return any(
        kind == "write" and name.endswith("-wal") and offset == 0
        for kind, name, offset, _ in touched
    )


def _copied(touched: Touched, database: str) -> bool:
    return any(kind != "sync" and name == database for kind, name, _, _ in touched)


def _count_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mark_sync: Literal["lagged", "strict"]
) -> dict[str, list[Counted]]:
    """Run every unit; return what each waited for, by operation."""
    counted: dict[str, list[Counted]] = {}
    syncs = SyncCounter()
    settings = Settings(backend="sqlite", home=tmp_path / mark_sync, mark_sync=mark_sync)
    caller = threading.get_ident()
    with (
        registered(f"sync-count-{mark_sync}", volatile=False) as vfs,
        adapter_over(vfs.vfs_name),
        bootstrap(settings, key=KEY, create=True) as runtime,
    ):
        units = _units(runtime)
        with syncs.installed(monkeypatch):
            for operation, calls in units.items():
                for call in calls:
                    before = syncs.by_thread[caller]
                    vfs.arm(None)
                    call()
                    vfs.disarm()
                    mine = _mine(vfs.touched, caller)
                    counted.setdefault(operation, []).append(
                        Counted(
                            sum(kind == "sync" for kind, _, _, _ in mine),
                            syncs.by_thread[caller] - before,
                            _restarted(mine),
                            _copied(mine, settings.database_path.name),
                        )
                    )
    return counted


def _waits(counted: dict[str, list[Counted]]) -> dict[str, set[tuple[int, int]]]:
    """Each operation's (database, mark) syncs over its units without SQLite's upkeep."""
    return {
        operation: {(unit.database, unit.mark) for unit in units if not unit.upkeep}
        for operation, units in counted.items()
    }


def _upkeep_units(counted: dict[str, list[Counted]]) -> list[Counted]:
    return [unit for units in counted.values() for unit in units if unit.upkeep]


def test_by_default_each_acknowledged_unit_waits_for_one_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Create, transition, state update and approval decide: the database's sync, and no other.

    The mark never syncs on the caller's thread, nor does the copy of the
    log into the database run there. A unit on which the log restarts
    waits for one sync more (its new header), about once per hundred units.
    """
    counted = _count_units(tmp_path, monkeypatch, "lagged")
    assert set(counted) == {"create", "transition", "state update", "approval decide"}
    assert _waits(counted) == {operation: {(1, 0)} for operation in counted}
    assert not any(unit.copied for units in counted.values() for unit in units)
    upkeep = _upkeep_units(counted)
    assert all(unit.mark == 0 and unit.database == 2 for unit in upkeep)
    assert len(upkeep) <= 2, f"{len(upkeep)} of {4 * UNITS} units restarted the log"


def test_the_strict_mode_adds_the_marks_sync_to_every_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with the mark synced before the acknowledgement, two syncs per unit."""
    counted = _count_units(tmp_path, monkeypatch, "strict")
    assert _waits(counted) == {operation: {(1, 1)} for operation in counted}
    assert all(unit.mark == 1 for unit in _upkeep_units(counted))
