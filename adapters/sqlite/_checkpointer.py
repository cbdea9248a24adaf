"""Copying the write-ahead log into the database off the commit path.

SQLite's own checkpoint runs inside the commit that crosses its threshold,
so one unit in about a hundred waited for a thousand page writes and two
more syncs. The writer turns that off (``wal_autocheckpoint = 0``) and one
background thread per store runs a passive checkpoint on its own
connection once ``CHECKPOINT_AFTER_UNITS`` units have committed since the
last one (the store's ``_checkpoint_passive`` says how the log starts
over). Closing the last connection still copies and removes the log, as
before; ``compact`` still truncates it at once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Final

from flowvault.application._observability import EventLog
from flowvault.domain import FlowvaultError

CHECKPOINT_AFTER_UNITS: Final = 100
"""Units committed between background checkpoints: about SQLite's 1,000 pages of a transition."""
CHECKPOINT_PASSIVE: Final = "PRAGMA wal_checkpoint(PASSIVE)"

_log = EventLog("flowvault.sqlite")

Checkpoint = Callable[[], None]
"""Runs ``CHECKPOINT_PASSIVE`` on the calling thread's own connection."""


class Checkpointer:
    """Counts committed units and checkpoints in a background thread every ``after`` of them."""

    def __init__(self, checkpoint: Checkpoint, after: int = CHECKPOINT_AFTER_UNITS) -> None:
        self._checkpoint = checkpoint
        self._after = after
        self._since = 0
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def committed(self, units: int) -> None:
        """Count ``units`` just committed; wake the thread once enough have."""
        with self._lock:
            self._since += units
            if self._since < self._after or self._stopping.is_set():
                return
            self._since = 0
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="flowvault-checkpoint", daemon=True
                )
                self._thread.start()
        self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            if self._stopping.is_set():
                return
            self._due.clear()
            try:
                self._checkpoint()
            except (sqlite3.Error, FlowvaultError) as exc:
                _log.warning("wal_checkpoint_deferred", error=type(exc).__name__)

    def stop(self) -> None:
        """End the thread after the checkpoint in progress, if any."""
        with self._lock:
            self._stopping.set()
            thread = self._thread
        self._due.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()


__all__ = ["CHECKPOINT_AFTER_UNITS", "CHECKPOINT_PASSIVE", "Checkpointer"]
