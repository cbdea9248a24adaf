"""Deleting a thread's rows through the saver: each deletion is one unit with its ledger event.

The event says what it deleted by rule (the whole thread, everything but
the kept checkpoints, the checkpoints of some runs), so a later read knows
these rows are gone on purpose and that any of them put back is a replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from flowvault.adapters.langgraph._ledger import (
    PRUNED_EVENT,
    RUNS_DELETED_EVENT,
    THREAD_DELETED_EVENT,
)
from flowvault.adapters.langgraph._threads import (
    BLOBS,
    CHECKPOINTS,
    MAX_EVENT_NAMES,
    WRITES,
    Thread,
    ThreadRows,
)
from flowvault.application import LabelFilter, RecordMetadata, UnitOfWork
from flowvault.domain import InvalidInput, JsonValue

DeletionPlan = tuple[list[RecordMetadata], str, dict[str, JsonValue]]
"""Rows to delete, the event kind that deletes them and its payload."""


class ThreadDeletions:
    """Plans and commits ``delete_thread``, ``delete_for_runs`` and ``prune``."""

    def __init__(self, rows: ThreadRows) -> None:
        self._rows = rows
        self._store = rows.repository.store

    def delete_thread(self, thread: Thread) -> None:
        """Delete every checkpoint, write and value of ``thread``, under one event."""
        self._commit(thread, lambda: (self._rows.thread_rows(thread), THREAD_DELETED_EVENT, {}))

    def delete_runs(self, run_digests: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) of the runs named, in every thread."""
        digests = sorted(set(run_digests))
        for start in range(0, len(digests), MAX_EVENT_NAMES):
            chunk = digests[start : start + MAX_EVENT_NAMES]
            threads: set[str] = set()
            for run in chunk:
                for row in self._rows.rows_of(CHECKPOINTS, [LabelFilter("run", run)]):
                    label = ThreadRows.thread_of(row)
                    if label:
                        threads.add(label)
            for label in sorted(threads):
                thread = Thread.from_digest(label)
                self._commit(thread, partial(self._runs_plan, thread, chunk))

    def prune(self, thread: Thread) -> None:
        """Keep each namespace's newest checkpoint, its writes and the values it names."""
        self._commit(thread, partial(self._prune_plan, thread))

    def _commit(self, thread: Thread, plan: Callable[[], DeletionPlan]) -> None:
        """Commit ``plan()``'s deletions with their event, planning again after a lost race."""

        def build() -> UnitOfWork | None:
            doomed, kind, payload = plan()
            return self._rows.deletion_unit(thread, doomed, kind, payload) if doomed else None

        self._rows.commit(build)

    def _runs_plan(self, thread: Thread, runs: Sequence[str]) -> DeletionPlan:
        doomed: list[RecordMetadata] = []
        for run in runs:
            filters = [*ThreadRows.of_thread("tpos", thread), LabelFilter("run", run)]
            for row in self._rows.rows_of(CHECKPOINTS, filters):
                doomed.append(row)
                doomed.extend(self._writes_rows(row))
        listed: list[JsonValue] = list(runs)
        return doomed, RUNS_DELETED_EVENT, {"runs": listed}

    def _writes_rows(self, checkpoint: RecordMetadata) -> list[RecordMetadata]:
        """Return the task writes row of a checkpoint: it carries the checkpoint's position."""
        position = checkpoint.labels.get("pos")
        if not isinstance(position, str):
            return []
        return list(self._rows.rows_of(WRITES, [LabelFilter("pos", position)]))

    def _prune_plan(self, thread: Thread) -> DeletionPlan:
        newest: dict[str, RecordMetadata] = {}
        checkpoints = list(self._rows.rows_of(CHECKPOINTS, ThreadRows.of_thread("tpos", thread)))
        for row in checkpoints:
            position, cid = row.labels.get("pos"), row.labels.get("cid")
            if not (isinstance(position, str) and isinstance(cid, str) and position.endswith(cid)):
                continue
            ns = position.removesuffix(cid)
            best = newest.get(ns)
            if best is None or str(best.labels.get("cid")) < cid:
                newest[ns] = row
        if len(newest) > MAX_EVENT_NAMES:
            raise InvalidInput(
                f"prune keeps at most {MAX_EVENT_NAMES} namespaces of a thread; "
                "delete the thread's subgraph namespaces first"
            )
        kept = sorted(row.key_digest for row in newest.values())
        doomed = [row for row in checkpoints if row.key_digest not in kept]
        for row in list(doomed):
            doomed.extend(self._writes_rows(row))
        if doomed:
            doomed.extend(self._unnamed_values(thread, list(newest.values())))
        kept_list: list[JsonValue] = list(kept)
        return doomed, PRUNED_EVENT, {"kept": kept_list}

    def _unnamed_values(self, thread: Thread, kept: list[RecordMetadata]) -> list[RecordMetadata]:
        """Return the thread's channel values that no kept checkpoint names."""
        named: set[str] = set()
        repository = self._rows.repository
        for stored in self._rows.open_listed(thread, kept):
            for channel, (version, _digest) in stored.channels.items():
                key = ThreadRows.blob_key(thread, stored.ns, channel, version)
                named.add(repository.key_digest(BLOBS, key))
        return [
            row
            for row in self._rows.rows_of(BLOBS, ThreadRows.of_thread("pos", thread))
            if row.key_digest not in named
        ]
