"""The bounded thread pool that async callers' blocking store calls run on.

flowvault's stores block (a SQLite ``fsync``, a PostgreSQL round trip), so
an asyncio host must not call them on its event loop. Both the async
runtime and the LangGraph saver's async methods hand each call to one of
these pools, in the caller's context.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, TypeVar

from flowvault.domain import InvalidInput, StoreUnavailable

R = TypeVar("R")

SQLITE_THREADS: Final = 4
"""Worker threads for a SQLite or memory store: enough waiting writers to fill a group commit."""


class Worker:
    """The thread pool every call of one async runtime runs on, and its in-flight work."""

    def __init__(self, threads: int) -> None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise InvalidInput("threads must be a positive integer")
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flowvault-async")
        self._lock = threading.Lock()
        self._closed = False
        self.threads = threads

    @property
    def closed(self) -> bool:
        """Whether ``shutdown`` began: no call is accepted any more."""
        return self._closed

    def submit(self, call: Callable[[], R]) -> Future[R]:
        """Start ``call`` on a pool thread, in the caller's context; refused once shut down."""
        context = contextvars.copy_context()
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            return self._pool.submit(context.run, call)

    async def run(self, call: Callable[[], R]) -> R:
        """Run ``call`` on a pool thread, in the caller's context, and await its outcome.

        Cancelling the awaiting coroutine withdraws a call that has not
        started; one that has runs to its end on its thread.
        """
        return await asyncio.wrap_future(self.submit(call))

    def shutdown(self) -> None:
        """Refuse new calls, then wait for every accepted one to finish (blocks)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)


__all__ = ["SQLITE_THREADS", "Worker"]
