"""Waiting for SQLite's locks in sub-millisecond steps.

SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20 ms and more between
tries, so under contention from other processes a commit or a checkpoint
waits far longer than the lock is held (a fraction of a millisecond). For
the two statements that wait for other processes, taking the write lock and
the truncating checkpoint, the handler is switched off and short, jittered,
growing pauses stand in for it; every other statement keeps the handler.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable

from flowvault.adapters.sqlite import _queries as sql
from flowvault.adapters.sqlite._errors import is_busy

_FIRST_PAUSE = 0.0001
_LONGEST_PAUSE = 0.002


def _retrying(
    connection: sqlite3.Connection, busy_timeout: float, attempt: Callable[[], bool]
) -> bool:
    """Call ``attempt`` until it reports done or ``busy_timeout`` passes; return whether it did.

    ``attempt`` returns ``False`` (or raises a busy error) while another
    connection holds what it needs. A busy error past the deadline is raised.
    """
    connection.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + busy_timeout
        pause = _FIRST_PAUSE
        while True:
            try:
                if attempt():
                    return True
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
            if time.monotonic() >= deadline:
                return False
            time.sleep(random.uniform(0, pause))  # noqa: S311 - jitter only
            pause = min(pause * 2, _LONGEST_PAUSE)
    finally:
        connection.execute(f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}")


def begin_immediate(connection: sqlite3.Connection, busy_timeout: float) -> None:
    """Take the write lock (``BEGIN IMMEDIATE``), waiting up to ``busy_timeout``.

    Raises the busy error if the lock stays held past the timeout.
    """

    def begin() -> bool:
        connection.execute("BEGIN IMMEDIATE")
        return True

    _retrying(connection, busy_timeout, begin)


def checkpoint_truncate(connection: sqlite3.Connection, busy_timeout: float) -> bool:
    """Checkpoint the whole WAL and truncate it; ``False`` if writers or readers kept it busy.

    A truncating checkpoint needs a moment with no writer and every reader
    on the newest snapshot; under load such moments are short, so it is
    retried in small steps rather than SQLite's long sleeps.
    """

    def checkpoint() -> bool:
        busy, _, _ = connection.execute(sql.CHECKPOINT_TRUNCATE).fetchone()
        return int(busy) == 0

    return _retrying(connection, busy_timeout, checkpoint)
