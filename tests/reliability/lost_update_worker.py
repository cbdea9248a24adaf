"""One process of the lost-update harness (tests/reliability/test_lost_updates.py).

Usage: ``lost_update_worker.py sqlite|postgres TARGET NAME PHASE=COUNT[,PHASE=COUNT...]``,
TARGET being a SQLite home or a PostgreSQL schema (the DSN comes from
``TEST_POSTGRES_DSN``, never the command line). The worker opens the store
through ``bootstrap``, prints ``ready``, and for each phase waits for
``go PHASE`` on stdin, so all processes start it together, then makes its COUNT
increments of one state counter and prints one JSON line: the phase, every
``[revision, count]`` it wrote, how often a whole update was retried after
a ``REVISION_CONFLICT`` and (``cas``) how often the update function re-ran.

Phases:
    cas: ``runtime.state("cas").update(+1)``; a ``REVISION_CONFLICT`` after
        the update's own retries is retried again, so every increment lands.
    naive: the negative control. It loads the counter, then ``save``s
        value + 1, a write that replaces whatever is stored by then, so
        increments made in between are overwritten.

Any other exception ends the worker with a traceback and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import RevisionConflict, WorkflowState

KEY = bytes(range(32))
CAS_SCOPE, NAIVE_SCOPE = "cas", "naive"
T = TypeVar("T")


def settings(backend: str, target: str) -> Settings:
    """Return settings for a SQLite home or a PostgreSQL schema (one pooled connection)."""
    if backend == "sqlite":
        return Settings(backend="sqlite", home=Path(target))
    return Settings(
        backend="postgres",
        postgres_dsn=os.environ["TEST_POSTGRES_DSN"],
        postgres_schema=target,
        postgres_pool_size=1,
    )


def count_of(state: WorkflowState) -> int:
    """Return the counter a state holds."""
    value = state.model_dump()["count"]
    assert isinstance(value, int)
    return value


def retried(write: Callable[[], T]) -> tuple[T, int]:
    """Run ``write`` until no ``REVISION_CONFLICT`` stops it; return its result and the retries."""
    for retries in range(1_000_000):
        try:
            return write(), retries
        except RevisionConflict:
            continue
    raise RuntimeError("no progress after a million conflicts")


class Phases:
    """The two ways of incrementing, over one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.cas_state = runtime.state(CAS_SCOPE)
        self.naive_state = runtime.state(NAIVE_SCOPE)
        self.calls = 0

    def _increment(self, state: WorkflowState) -> WorkflowState:
        self.calls += 1
        return WorkflowState(count=count_of(state) + 1)

    def cas(self) -> tuple[int, int, int]:
        """One guarded increment; return the revision, the count written and the retries."""
        (new, revision), retries = retried(lambda: self.cas_state.update(self._increment))
        return revision, count_of(new), retries

    def naive(self) -> tuple[int, int, int]:
        """Read, then overwrite with value + 1 whatever is stored by then."""
        value = count_of(self.naive_state.load().state) + 1
        revision, retries = retried(lambda: self.naive_state.save(WorkflowState(count=value)))
        return revision, value, retries


def main(backend: str, target: str, name: str, phases: str) -> None:
    """Run each phase's COUNT increments when told to, and report what was written."""
    with bootstrap(settings(backend, target), key=KEY, create=True) as runtime:
        worker = Phases(runtime)
        worker.cas_state.load()
        print("ready", flush=True)
        for phase, count in (item.split("=") for item in phases.split(",")):
            if sys.stdin.readline().split() != ["go", phase]:
                raise SystemExit(f"{name}: expected 'go {phase}' from the parent")
            step = worker.cas if phase == "cas" else worker.naive
            worker.calls = 0
            writes, retries = [], 0
            for _ in range(int(count)):
                revision, value, conflicts = step()
                writes.append([revision, value])
                retries += conflicts
            reruns = max(worker.calls - len(writes), 0)
            report = {"phase": phase, "writes": writes, "retries": retries, "reruns": reruns}
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
