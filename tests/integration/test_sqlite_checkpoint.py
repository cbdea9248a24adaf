"""The SQLite store copies its write-ahead log into the database in the background.

The real adapter runs over APSW with a file layer that records which
thread wrote which file (``FaultVFS``, writing straight through). Hundreds
of state saves, several of SQLite's old checkpoint thresholds' worth: the
calling thread never writes the database file itself, the store's
checkpoint thread does, the log stays within a few thresholds, and
closing the store ends the thread and leaves no log behind.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from apsw_driver import adapter_over, registered

from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState

KEY = bytes(range(32))
SAVES = 450
PAGE_WITH_HEADER = 4096 + 24
WAL_BOUND_PAGES = 3_000
"""Three of SQLite's 1,000-page thresholds: the log is copied in long before."""


def _checkpoint_threads() -> set[int]:
    return {t.ident or 0 for t in threading.enumerate() if t.name == "flowvault-checkpoint"}


def test_the_log_is_copied_into_the_database_off_the_callers_thread(tmp_path: Path) -> None:
    """Commits on the caller write only the log; the checkpoint thread writes the database."""
    settings = Settings(backend="sqlite", home=tmp_path / "home", mark_sync="lagged")
    database = settings.database_path.name
    caller = threading.get_ident()
    before = _checkpoint_threads()
    with (
        registered("checkpoint-thread", volatile=False) as vfs,
        adapter_over(vfs.vfs_name),
        bootstrap(settings, key=KEY, create=True) as runtime,
    ):
        vfs.arm(None)
        largest = 0
        for step in range(SAVES):
            runtime.state("main").save(WorkflowState(step=step))
            wal = settings.database_sidecars[0]
            largest = max(largest, wal.stat().st_size if wal.exists() else 0)
        deadline = time.monotonic() + 30
        while not any(n == database and t != caller for _, n, _, t in vfs.touched):
            assert time.monotonic() < deadline, "no background checkpoint in 30 s"
            time.sleep(0.05)
        vfs.disarm()
        checkpointers = _checkpoint_threads() - before
        writers = {thread for kind, name, _, thread in vfs.touched if name == database}
    assert len(checkpointers) == 1
    assert writers == checkpointers, "only the checkpoint thread writes the database file"
    assert largest <= WAL_BOUND_PAGES * PAGE_WITH_HEADER
    assert _checkpoint_threads() == before, "closing the store ends its checkpoint thread"
    assert not settings.database_sidecars[0].exists(), "the last close still removes the log"


SUSTAINED_SAVES = 2_500
"""Enough back-to-back saves to write several times ``WAL_BOUND_PAGES`` in all."""


def test_the_log_starts_over_under_writes_that_never_pause(tmp_path: Path) -> None:
    """Back-to-back commits leave no quiet moment, yet the log stays within a few thresholds.

    SQLite reuses the log from its start only when a write begins with
    every frame copied; a copy that runs while commits go on never sees
    that, so without a pass that holds commits off the log grows for as
    long as the writes go on.
    """
    settings = Settings(backend="sqlite", home=tmp_path / "home", synchronous="normal")
    wal = settings.database_sidecars[0]
    largest = 0
    with bootstrap(settings, key=KEY, create=True) as runtime:
        state = runtime.state("main")
        for step in range(SUSTAINED_SAVES):
            state.save(WorkflowState(step=step))
            if step % 50 == 0:
                largest = max(largest, wal.stat().st_size if wal.exists() else 0)
        largest = max(largest, wal.stat().st_size)
    assert largest <= WAL_BOUND_PAGES * PAGE_WITH_HEADER, f"log grew to {largest:,} bytes"
