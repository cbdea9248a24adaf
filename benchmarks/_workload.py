"""The workflow workload every flowvault scenario drives, timed one operation at a time.

The peer runs the same lifecycle as checkpoints of a thread, one per
operation, each holding a document shaped like flowvault's workflow record.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from _harness import JsonObject, Recorder, Sample, ms_since, sample_from_latencies
from _peer import PeerSaver

from flowvault.application import RunService, WorkflowService
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import FlowvaultError, WorkOrder

LIFECYCLE: Final = ("planning", "executing", "decision", "executing", "completed")
"""The default lifecycle's path from ``intake``; the last move is terminal."""

OPS_PER_WORKFLOW: Final = 1 + len(LIFECYCLE)
"""One create and every transition of the lifecycle."""

PEER_STATES: Final = ("intake", *LIFECYCLE)
"""The state each of the peer's checkpoints records: the create's, then each transition's."""

MACHINE_VERSION: Final = "sha256:" + hashlib.sha256(",".join(PEER_STATES).encode()).hexdigest()


RUN_DEFINITION: Final = "bench.graph"
"""The graph definition every run of the several-hosts scenario starts on."""

OPS_PER_RUN: Final = 4
"""A run's start, its move to ``running``, one event and its finish with a receipt."""


def run_runs(runs: RunService, count: int) -> Sample:
    """Drive ``count`` runs from start to a completed receipt; a failed run is counted.

    Each run is this host's own, so its lease is taken at the start and
    renewed by every write; nothing here waits on another host.
    """
    recorder = Recorder()
    for n in range(count):
        try:
            started = time.perf_counter()
            run, _ = runs.start_run(RUN_DEFINITION, {"n": n})
            recorder.record(started)
            started = time.perf_counter()
            runs.set_status(run.run_id, "running", expected_status="accepted")
            recorder.record(started)
            started = time.perf_counter()
            runs.append_run_events(run.run_id, [("node.done", {"node": "plan"})])
            recorder.record(started)
            started = time.perf_counter()
            runs.finish_run(
                run.run_id, "completed", expected_status="running", final_state={"n": n}
            )
            recorder.record(started)
        except FlowvaultError:
            recorder.errors += 1
    return recorder.sample()


def sqlite_settings(home: Path, *, synchronous: str = "full") -> Settings:
    """Return the settings of a SQLite runtime at ``home``; ``full`` is flowvault's default.

    ``FLOWVAULT_MARK_SYNC`` picks when the high-water mark is written, as it
    does for a host (default ``lagged``), so each mode can be measured.
    """
    return Settings.model_validate(
        {
            "backend": "sqlite",
            "home": home,
            "synchronous": synchronous,
            "mark_sync": os.environ.get("FLOWVAULT_MARK_SYNC", "lagged").strip().lower(),
        }
    )


def open_runtime(settings: Settings) -> Runtime:
    """Bootstrap a runtime; wrapped so the call sites read as what they measure."""
    return bootstrap(settings, create=True)


class Orders:
    """Hands out work orders with fresh idempotency keys, so each create makes a workflow."""

    def __init__(self, tag: str) -> None:
        self._tag = tag
        self._next = 0

    def take(self, count: int) -> list[WorkOrder]:
        """Return ``count`` new orders."""
        return list(self.stream(count))

    def stream(self, count: int) -> Iterator[WorkOrder]:
        """Yield ``count`` new orders one by one, so a large prefill holds none of them."""
        first, self._next = self._next, self._next + count
        return (self._order(n) for n in range(first, first + count))

    def _order(self, number: int) -> WorkOrder:
        return WorkOrder(
            kind="bench.order",
            parameters={"invoice": f"INV-{number}", "amount": number % 10_000, "lines": [1, 2, 3]},
            requester="bench@example.org",
            idempotency_key=f"{self._tag}-{number}",
        )


@dataclass(slots=True)
class LifecycleRun:
    """What driving some workflows through the lifecycle cost, kept apart by kind.

    ``ordinary_ms`` holds creates and non-terminal transitions; ``terminal_ms``
    the transitions into ``completed``, which also scrub and compact.
    """

    ordinary_ms: list[float] = field(default_factory=list)
    terminal_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def sample(self) -> Sample:
        """Return every operation, over the wall time of the whole run."""
        latencies = (*self.ordinary_ms, *self.terminal_ms)
        return Sample(len(latencies), self.seconds, latencies, self.errors)

    def ordinary(self) -> Sample:
        """Return creates and non-terminal transitions, over the time spent in them."""
        return sample_from_latencies(self.ordinary_ms, self.errors)

    def terminal(self) -> Sample:
        """Return the terminal transitions, over the time spent in them."""
        return sample_from_latencies(self.terminal_ms)


def _drive(workflows: WorkflowService, order: WorkOrder, run: LifecycleRun) -> None:
    started = time.perf_counter()
    record, _ = workflows.create(order)
    run.ordinary_ms.append(ms_since(started))
    for target in LIFECYCLE:
        started = time.perf_counter()
        record = workflows.transition(
            record.workflow_id,
            target,
            expected_state=record.state,
            expected_version=record.state_version,
        )
        elapsed = ms_since(started)
        terminal = workflows.machine.is_terminal(target)
        (run.terminal_ms if terminal else run.ordinary_ms).append(elapsed)


def run_lifecycles(workflows: WorkflowService, orders: Sequence[WorkOrder]) -> LifecycleRun:
    """Create each order's workflow and drive it to ``completed``; a failure is counted.

    A workflow whose operation fails is abandoned: its later transitions
    would only repeat the failure.
    """
    run = LifecycleRun()
    started = time.perf_counter()
    for order in orders:
        try:
            _drive(workflows, order, run)
        except FlowvaultError:
            run.errors += 1
    run.seconds = time.perf_counter() - started
    return run


def create_workflows(workflows: WorkflowService, orders: Iterable[WorkOrder]) -> list[str]:
    """Create a workflow per order and return their ids (setup, not measured)."""
    return [workflows.create(order)[0].workflow_id for order in orders]


def prefill(settings: Settings, orders: Iterable[WorkOrder], ids: list[str] | None = None) -> float:
    """Create workflows through a ``synchronous=normal`` runtime, closed before returning.

    Setup only: ``normal`` skips the fsync per commit, and closing the
    runtime leaves the measuring runtime a checkpointed store. Ids are kept
    only when ``ids`` is given, so a large prefill does not inflate the
    process's peak memory. Returns the seconds it took.
    """
    started = time.perf_counter()
    fast = settings.model_copy(update={"synchronous": "normal"})
    with open_runtime(fast) as runtime:
        for order in orders:
            record, _ = runtime.workflows.create(order)
            if ids is not None:
                ids.append(record.workflow_id)
    return time.perf_counter() - started


def workflow_document(
    thread_id: str, order: WorkOrder, state: str, version: int, created_at: str
) -> JsonObject:
    """Return the peer's state: the fields of flowvault's workflow record (about 500 bytes)."""
    return {
        "workflow_id": thread_id,
        "state": state,
        "state_version": version,
        "machine_version": MACHINE_VERSION,
        "work_order": order.model_dump(mode="json"),
        "created_at": created_at,
        "updated_at": datetime.now(UTC).isoformat(),
        "original_content_hash": None,
        "output_content_hash": None,
        "stop_reason": None,
    }


def _peer_lifecycle(peer: PeerSaver, order: WorkOrder, recorder: Recorder) -> None:
    thread_id = order.idempotency_key
    created_at = datetime.now(UTC).isoformat()
    parent: str | None = None
    for step, state in enumerate(PEER_STATES):
        document = workflow_document(thread_id, order, state, step + 1, created_at)
        started = time.perf_counter()
        parent = peer.put(thread_id, document, step, parent)
        recorder.record(started)


def run_peer_lifecycles(peer: PeerSaver, orders: Sequence[WorkOrder]) -> Sample:
    """Write each order's thread through the lifecycle, one checkpoint per operation.

    A thread whose ``put`` fails is abandoned, as ``run_lifecycles``
    abandons a workflow; the failure is counted.
    """
    recorder = Recorder()
    for order in orders:
        try:
            _peer_lifecycle(peer, order, recorder)
        except sqlite3.Error:
            recorder.errors += 1
    return recorder.sample()


def prefill_peer(peer: PeerSaver, orders: Iterable[WorkOrder]) -> list[str]:
    """Write one ``intake`` checkpoint per order, as ``prefill`` creates; return the thread ids."""
    threads: list[str] = []
    created_at = datetime.now(UTC).isoformat()
    for order in orders:
        thread_id = order.idempotency_key
        peer.put(thread_id, workflow_document(thread_id, order, "intake", 1, created_at), 0, None)
        threads.append(thread_id)
    return threads
