"""Advancing the high-water mark off the commit path, a bounded window behind the database.

Writing the mark after every commit, synced, doubles a durable write's
cost: two syncs per acknowledged unit. The default keeps the mark but
moves it off the critical path: a commit only notes what it grew, and one
background thread writes and syncs the mark at once when it was idle,
then at most once per window, so a burst of commits costs one mark write
per window. The mark may lag the database, never lead it: it is written
after the commits it names have returned. ``close`` stops the thread and
writes the mark one last time; so does an interpreter that exits without
closing the store, unless it is killed.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Collection, Mapping
from typing import Final

from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._observability import EventLog
from flowvault.domain import FlowvaultError

MARK_LAG_WINDOW: Final = 0.1
"""Seconds between background mark writes: about how far the mark trails the last commit."""

_log = EventLog("flowvault.high_water")


def advance_or_defer(
    guard: AntiRollback, sizes: Mapping[str, int] | None = None, dropped: Collection[str] = ()
) -> bool:
    """Advance the mark; on failure log ``high_water_mark_deferred`` and return ``False``.

    The commits it would name are durable already: an error here must not
    tell their caller they failed. What was not written stays pending for
    the next write.
    """
    try:
        guard.advance(sizes, dropped)
    except Exception as exc:  # the commit stands; the mark catches up later
        code = exc.code if isinstance(exc, FlowvaultError) else type(exc).__name__
        _log.warning("high_water_mark_deferred", code=code, location=guard.location)
        return False
    return True


class MarkFlusher:
    """One thread that writes what commits noted, at most once per ``window`` seconds."""

    def __init__(self, guard: AntiRollback, window: float = MARK_LAG_WINDOW) -> None:
        self._guard = guard
        self._window = window
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def note(self, sizes: Mapping[str, int], dropped: Collection[str] = ()) -> None:
        """Take a commit's stream sizes and drops; the thread writes them within the window."""
        self._guard.note(sizes, dropped)
        if self._thread is None:
            self._start()
        self._due.set()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="flowvault-high-water", daemon=True
                )
                self._thread.start()
                atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """Write what is pending when the interpreter exits with the store still open."""
        if not self._stopping.is_set():
            self._halt()
            self.flush()

    def _run(self) -> None:
        while True:
            self._due.wait()
            if self._stopping.is_set():
                return
            self._due.clear()
            if not self.flush():
                self._due.set()
            self._stopping.wait(self._window)

    def flush(self) -> bool:
        """Write the mark now; return whether it was written (a failure is logged, kept pending)."""
        return advance_or_defer(self._guard)

    def stop(self) -> None:
        """Stop the thread after the write in progress, if any; then flush from the caller."""
        atexit.unregister(self._at_exit)
        self._halt()

    def _halt(self) -> None:
        with self._start_lock:
            self._stopping.set()
            thread = self._thread
        self._due.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()


__all__ = ["MARK_LAG_WINDOW", "MarkFlusher", "advance_or_defer"]
