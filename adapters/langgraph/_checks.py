"""Reads of a thread's rows, checked against the thread's ledger stream.

Each check compares rows with the events since the oldest row read: a row
a later event wrote or deleted is a replay, and a row the ledger says
stands but that is absent was deleted outside flowvault.
"""

from __future__ import annotations

from collections.abc import Sequence

from langgraph.checkpoint.base import writes_sort_key

from flowvault.adapters.langgraph._ledger import CHECKPOINT_EVENT, ThreadHistory
from flowvault.adapters.langgraph._threads import (
    StoredCheckpoint,
    StoredWrite,
    Thread,
    ThreadRows,
)
from flowvault.domain import IntegrityFailure


def missing(what: str, thread: Thread, **details: str | int) -> IntegrityFailure:
    """Return the error for a row the ledger records that is not in the store."""
    return IntegrityFailure(
        f"{what} that the thread's ledger records is missing: it was deleted outside "
        "flowvault; restore the store from a backup",
        stream=thread.stream,
        **details,
    )


class ThreadChecks:
    """Checks what a read found against the thread's ledger."""

    def __init__(self, rows: ThreadRows) -> None:
        self._rows = rows
        self._store = rows.repository.store

    def history(
        self,
        thread: Thread,
        checkpoints: Sequence[StoredCheckpoint],
        *,
        from_start: bool = False,
    ) -> ThreadHistory:
        """Read the thread's events from the oldest row's bound (or from 0), checking each row.

        A single row naming the stream's head needs no event read: nothing
        was written or deleted after it (a tail cut back to it is what the
        high-water mark catches).
        """
        bounds = [stored.bound for stored in checkpoints]
        if any(bound is None for bound in bounds):
            raise IntegrityFailure("a checkpoint row is not bound to its thread's ledger")
        start = 0 if from_start else min(bound for bound in bounds if bound is not None)
        if not from_start and len(checkpoints) == 1 and self._rows.head_is(thread, start):
            return ThreadHistory(start + 1, (), start)
        history = self._rows.history(thread, start)
        for stored in checkpoints:
            history.check_row(stored.identity, stored.bound, "a checkpoint")
        return history

    def refuse_missing(self, thread: Thread, key_digest: str) -> None:
        """Refuse a checkpoint row that is absent while the ledger says it stands."""
        if self._store.ledger_head(thread.stream) is None:
            return
        for entry in self._rows.history(thread, 0).live_writes():
            if entry.row.key_digest == key_digest:
                raise missing(
                    "a checkpoint", thread, key_digest=key_digest, ledger_index=entry.event.index
                )

    def refuse_any_missing(
        self, thread: Thread, ns: str | None, *, before: str | None = None
    ) -> None:
        """Refuse an empty listing of a namespace the ledger says holds checkpoints."""
        if self._store.ledger_head(thread.stream) is None:
            return
        self._refuse_unlisted(
            thread, self._rows.history(thread, 0), ns, "a checkpoint", below=before
        )

    def refuse_newer_missing(
        self, thread: Thread, ns: str, stored: StoredCheckpoint, history: ThreadHistory
    ) -> None:
        """Refuse a newest checkpoint when the ledger wrote a newer one, not deleted since."""
        self._refuse_unlisted(thread, history, ns, "a newer checkpoint", above=stored.cid)

    def refuse_window_gaps(
        self,
        thread: Thread,
        ns: str | None,
        window: Sequence[StoredCheckpoint],
        history: ThreadHistory,
        *,
        lowest: str | None,
        before: str | None,
    ) -> None:
        """Refuse a listing that lacks a checkpoint the ledger wrote inside the window read.

        The window runs from ``lowest`` (``None``: the listing read to the
        end) up to ``before``.
        """
        listed = frozenset(stored.identity.key_digest for stored in window)
        self._refuse_unlisted(
            thread, history, ns, "a checkpoint", at_least=lowest, below=before, listed=listed
        )

    def _refuse_unlisted(
        self,
        thread: Thread,
        history: ThreadHistory,
        ns: str | None,
        what: str,
        *,
        above: str | None = None,
        at_least: str | None = None,
        below: str | None = None,
        listed: frozenset[str] = frozenset(),
    ) -> None:
        """Refuse when ``history`` holds a standing checkpoint of ``ns`` in range but unlisted."""
        ns_digest = None if ns is None else self._rows.ns_digest(thread, ns)
        for entry in history.live_writes():
            cid = entry.cid
            if (
                entry.event.type != CHECKPOINT_EVENT
                or entry.row.key_digest in listed
                or (ns_digest is not None and entry.ns != ns_digest)
                or (above is not None and cid <= above)
                or (at_least is not None and cid < at_least)
                or (below is not None and cid >= below)
            ):
                continue
            raise missing(
                what, thread, key_digest=entry.row.key_digest, ledger_index=entry.event.index
            )

    def pending_writes(self, stored: StoredCheckpoint, history: ThreadHistory) -> list[StoredWrite]:
        """Return a checkpoint's task writes in ``writes_sort_key`` order, checked by the ledger.

        A writes row the ledger says was written, and not deleted since,
        but that is missing is refused.
        """
        loaded = self._rows.load_writes(stored)
        writes_digest = self._rows.writes_digest(stored.thread, stored.ns, stored.cid)
        if loaded is None:
            for entry in history.live_writes():
                if entry.row.key_digest == writes_digest:
                    raise missing(
                        "a checkpoint's task writes",
                        stored.thread,
                        key_digest=writes_digest,
                        ledger_index=entry.event.index,
                    )
            return []
        writes, identity, bound = loaded
        if bound is not None and bound < history.start:
            history = self._rows.history(stored.thread, bound)
        history.check_row(identity, bound, "a checkpoint's task writes")
        return sorted(writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
