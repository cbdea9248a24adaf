"""``FlowvaultSaver``: LangGraph's checkpointer interface over a sealed flowvault store."""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.langgraph._ledger import (
    CHECKPOINT_EVENT,
    PRUNED_EVENT,
    RUNS_DELETED_EVENT,
    THREAD_DELETED_EVENT,
    WRITES_EVENT,
    ThreadHistory,
)
from flowvault.adapters.langgraph._threads import (
    BLOBS,
    CHECKPOINTS,
    MAX_EVENT_NAMES,
    STREAM_PREFIX,
    WRITES,
    CheckpointDraft,
    StoredCheckpoint,
    StoredWrite,
    Thread,
    ThreadRows,
)
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.system import SystemClock
from flowvault.application import (
    Guard,
    LabelFilter,
    RecordMetadata,
    RetryPolicy,
    SealedRepository,
    StoreCapabilities,
    UnitOfWork,
    Upsert,
)
from flowvault.application._keys import KeyRing, check_key_matches
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    RevisionConflict,
)

_RETRY: Final = RetryPolicy()
DEFAULT_THREADS: Final = 4
"""Worker threads of the async methods: what ``AsyncRuntime`` uses on SQLite (docs/async.md)."""
R = TypeVar("R")
_PAGE: Final = 200
_KNOWN_CHECKPOINTS: Final = 256
"""Recent checkpoints whose channels a saver remembers for their children's puts."""

Rows = list[RecordMetadata]
"""Metadata of rows to delete (an alias: ``list`` inside the saver is its method)."""
DeletionPlan = tuple[Rows, str, dict[str, JsonValue]]
"""Rows to delete, the event kind that deletes them and its payload."""


class HasRepository(Protocol):
    """What ``from_runtime`` needs of a flowvault runtime: its sealed repository."""

    @property
    def repository(self) -> SealedRepository: ...


def _configurable(config: RunnableConfig) -> Mapping[str, Any]:
    configurable = config.get("configurable")
    if not isinstance(configurable, Mapping):
        raise InvalidInput("a LangGraph config needs a 'configurable' mapping with a thread_id")
    return configurable


def _ns(configurable: Mapping[str, Any]) -> str:
    ns = configurable.get("checkpoint_ns", "")
    if not isinstance(ns, str):
        raise InvalidInput("checkpoint_ns is text")
    return ns


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


def _missing(what: str, thread: Thread, **details: str | int) -> IntegrityFailure:
    return IntegrityFailure(
        f"{what} that the thread's ledger records is missing: it was deleted outside "
        "flowvault; restore the store from a backup",
        stream=thread.stream,
        **details,
    )


class FlowvaultSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose every row is sealed and bound to its thread's ledger.

    Checkpoints, channel values, task writes and metadata are sealed with
    their row's identity as associated data; thread ids, namespaces and
    run ids appear in the store only as keyed digests. Every write appends
    a keyed event to the thread's stream in the same unit of work, which
    is also the unit's compare-and-swap: two writers of one thread never
    both land on the same head. Reads check rows against that stream and
    raise ``IntegrityFailure`` for a row put back, deleted or moved
    outside flowvault (see ``docs/langgraph.md`` for what is caught).

    The async methods run the same code on a worker thread, so the event
    loop never waits on the store.
    """

    def __init__(
        self,
        repository: SealedRepository,
        *,
        serde: SerializerProtocol | None = None,
        refuse_stale_forks: bool = False,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        super().__init__(serde=serde)
        if not isinstance(repository, SealedRepository):
            raise InvalidInput("FlowvaultSaver takes a SealedRepository (runtime.repository)")
        self._rows = ThreadRows(repository)
        self._store = repository.store
        self._refuse_stale_forks = bool(refuse_stale_forks)
        self._known: OrderedDict[tuple[str, str, str], dict[str, tuple[str, str]]] = OrderedDict()
        self._known_lock = threading.Lock()
        if type(threads) is not int or threads < 1:
            raise InvalidInput("threads is a whole number, 1 or more")
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- construction --------------------------------------------------------

    @classmethod
    def from_runtime(
        cls,
        runtime: HasRepository,
        *,
        serde: SerializerProtocol | None = None,
        refuse_stale_forks: bool = False,
        threads: int = DEFAULT_THREADS,
    ) -> FlowvaultSaver:
        """Return a saver over a flowvault runtime's store (``bootstrap(...)``).

        The runtime keeps the store's high-water mark, where one is kept;
        closing the runtime closes the store.
        """
        return cls(
            runtime.repository,
            serde=serde,
            refuse_stale_forks=refuse_stale_forks,
            threads=threads,
        )

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        key: bytes,
        postgres_schema: str = "flowvault",
        serde: SerializerProtocol | None = None,
        refuse_stale_forks: bool = False,
        threads: int = DEFAULT_THREADS,
    ) -> Iterator[FlowvaultSaver]:
        """Open a saver on a SQLite file, a PostgreSQL DSN or ``":memory:"``, as LangGraph's do.

        ``key`` is the store's 32-byte master key; a store sealed under
        another key is refused at once. The store is created where none
        exists and closed when the block ends. No high-water mark is kept:
        use ``from_runtime`` over ``bootstrap(...)`` to have one.
        """
        repository = open_repository(conn_string, key=key, postgres_schema=postgres_schema)
        saver = cls(repository, serde=serde, refuse_stale_forks=refuse_stale_forks, threads=threads)
        try:
            yield saver
        finally:
            saver.close()
            repository.store.close()

    def setup(self) -> None:
        """Do nothing: a flowvault store sets up and migrates its schema when opened."""

    # -- reading -------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Return the checkpoint ``config`` names, or the thread's newest in its namespace.

        Raises:
            IntegrityFailure: a row is not what the thread's ledger says: put
                back from an older copy, deleted or edited outside flowvault.

        """
        configurable = _configurable(config)
        thread = self._rows.thread(configurable.get("thread_id"))
        ns = _ns(configurable)
        cid = get_checkpoint_id(config)
        if cid:
            stored = self._rows.load_checkpoint(thread, ns, cid)
            if stored is None:
                self._refuse_missing(thread, self._rows.checkpoint_digest(thread, ns, cid))
                return None
            return self._tuple(stored, self._history(thread, [stored]))
        for row in self._rows.listed(thread, ns, first_page=1):
            for stored in self._rows.open_listed(thread, [row]):
                history = self._history(thread, [stored])
                self._refuse_newer_missing(thread, ns, stored, history)
                return self._tuple(stored, history)
        self._refuse_any_missing(thread, ns)
        return None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Yield checkpoints newest first: of one thread (and namespace) or of every thread.

        ``filter`` keeps checkpoints whose metadata holds each key with an
        equal value; ``before`` keeps those with a smaller checkpoint id.
        The whole window read is checked against each thread's ledger
        before anything is yielded.
        """
        if limit is not None and limit <= 0:
            return
        before_id = get_checkpoint_id(before) if before else None
        if config is None:
            yield from self._list_all(filter, before_id, limit)
            return
        configurable = _configurable(config)
        thread = self._rows.thread(configurable.get("thread_id"))
        ns = configurable.get("checkpoint_ns")
        if ns is not None and not isinstance(ns, str):
            raise InvalidInput("checkpoint_ns is text")
        only = get_checkpoint_id(config)
        yield from self._list_thread(
            thread, ns=ns, only=only, wanted=filter, before=before_id, limit=limit
        )

    def _list_thread(
        self,
        thread: Thread,
        *,
        ns: str | None,
        only: str | None,
        wanted: Mapping[str, Any] | None,
        before: str | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        window: builtins.list[StoredCheckpoint] = []
        matches: builtins.list[tuple[StoredCheckpoint, CheckpointMetadata]] = []
        exhausted = True
        batch = _PAGE if wanted or limit is None else min(limit, _PAGE)
        rows = self._rows.listed(thread, ns, before=before, first_page=batch)
        for page in _batched(
            (row for row in rows if only is None or row.labels.get("cid") == only), batch
        ):
            for stored in self._rows.open_listed(thread, page):
                window.append(stored)
                metadata = self.serde.loads_typed(stored.metadata)
                if _matches(metadata, wanted):
                    matches.append((stored, metadata))
                    if limit is not None and len(matches) >= limit:
                        exhausted = False
                        break
            if not exhausted:
                break
        if not window:
            if only is None:
                self._refuse_any_missing(thread, ns, before=before)
            return
        history = self._history(thread, window, from_start=exhausted and only is None)
        if only is None:
            lowest = None if exhausted else min(stored.cid for stored in window)
            self._refuse_window_gaps(thread, ns, window, history, lowest=lowest, before=before)
        for stored, metadata in matches:
            yield self._tuple(stored, history, metadata=metadata)

    def _list_all(
        self, wanted: Mapping[str, Any] | None, before: str | None, limit: int | None
    ) -> Iterator[CheckpointTuple]:
        found = 0
        for row in self._rows.listed(None, None, before=before):
            record = self._store.load(CHECKPOINTS, row.key_digest)
            if record is None:
                continue
            opened = self._rows.repository.open(
                record, namespace=CHECKPOINTS, key_digest=row.key_digest
            )
            document = opened.document
            thread_id = document.get("thread") if isinstance(document, dict) else None
            thread = self._rows.thread(thread_id)
            if thread.digest != row.labels.get("thread"):
                raise IntegrityFailure(
                    "a checkpoint row is labelled with another thread", key_digest=row.key_digest
                )
            stored = self._rows.open_checkpoint(thread, opened)
            metadata = self.serde.loads_typed(stored.metadata)
            if not _matches(metadata, wanted):
                continue
            yield self._tuple(stored, self._history(thread, [stored]), metadata=metadata)
            found += 1
            if limit is not None and found >= limit:
                return

    def _history(
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

    def _refuse_missing(self, thread: Thread, key_digest: str) -> None:
        if self._store.ledger_head(thread.stream) is None:
            return
        for entry in self._rows.history(thread, 0).live_writes():
            if entry.row.key_digest == key_digest:
                raise _missing(
                    "a checkpoint", thread, key_digest=key_digest, ledger_index=entry.event.index
                )

    def _refuse_any_missing(
        self, thread: Thread, ns: str | None, *, before: str | None = None
    ) -> None:
        if self._store.ledger_head(thread.stream) is None:
            return
        ns_digest = None if ns is None else self._rows.ns_digest(thread, ns)
        for entry in self._rows.history(thread, 0).live_writes():
            if entry.event.type != CHECKPOINT_EVENT:
                continue
            if ns_digest is not None and entry.ns != ns_digest:
                continue
            if before is not None and entry.cid >= before:
                continue
            raise _missing(
                "a checkpoint",
                thread,
                key_digest=entry.row.key_digest,
                ledger_index=entry.event.index,
            )

    def _refuse_newer_missing(
        self, thread: Thread, ns: str, stored: StoredCheckpoint, history: ThreadHistory
    ) -> None:
        ns_digest = self._rows.ns_digest(thread, ns)
        for entry in history.live_writes():
            if (
                entry.event.type == CHECKPOINT_EVENT
                and entry.ns == ns_digest
                and entry.cid > stored.cid
            ):
                raise _missing(
                    "a newer checkpoint",
                    thread,
                    key_digest=entry.row.key_digest,
                    ledger_index=entry.event.index,
                )

    def _refuse_window_gaps(
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
        listed = {stored.identity.key_digest for stored in window}
        ns_digest = None if ns is None else self._rows.ns_digest(thread, ns)
        for entry in history.live_writes():
            if entry.event.type != CHECKPOINT_EVENT or entry.row.key_digest in listed:
                continue
            if ns_digest is not None and entry.ns != ns_digest:
                continue
            if (lowest is not None and entry.cid < lowest) or (
                before is not None and entry.cid >= before
            ):
                continue
            raise _missing(
                "a checkpoint",
                thread,
                key_digest=entry.row.key_digest,
                ledger_index=entry.event.index,
            )

    def _tuple(
        self,
        stored: StoredCheckpoint,
        history: ThreadHistory,
        *,
        metadata: CheckpointMetadata | None = None,
    ) -> CheckpointTuple:
        thread, ns, cid = stored.thread, stored.ns, stored.cid
        values = {
            channel: self.serde.loads_typed(value)
            for channel, value in self._rows.load_values(stored).items()
        }
        self._remember(stored)
        checkpoint = cast(
            Checkpoint, {**self.serde.loads_typed(stored.checkpoint), "channel_values": values}
        )
        return CheckpointTuple(
            config=_config(thread.thread_id, ns, cid),
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(stored.metadata) if metadata is None else metadata,
            parent_config=None
            if stored.parent is None
            else _config(thread.thread_id, ns, stored.parent),
            pending_writes=self._pending_writes(stored, history),
        )

    def _pending_writes(
        self, stored: StoredCheckpoint, history: ThreadHistory
    ) -> builtins.list[tuple[str, str, Any]]:
        loaded = self._rows.load_writes(stored)
        writes_digest = self._rows.writes_digest(stored.thread, stored.ns, stored.cid)
        if loaded is None:
            for entry in history.live_writes():
                if entry.row.key_digest == writes_digest:
                    raise _missing(
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
        ordered = sorted(writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        return [(w.task_id, w.channel, self.serde.loads_typed(w.value)) for w in ordered]

    # -- writing -------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Seal and store a checkpoint; only the channel values of ``new_versions`` are stored.

        Raises:
            RevisionConflict: with ``refuse_stale_forks``, the checkpoint's
                parent is no longer the newest of its namespace; or the
                thread kept changing under every retry.

        """
        configurable = _configurable(config)
        thread = self._rows.thread(configurable.get("thread_id"))
        ns = _ns(configurable)
        parent = configurable.get("checkpoint_id")
        body: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = body.pop("channel_values", {})
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        versions = dict(checkpoint["channel_versions"])
        draft = CheckpointDraft(
            ns=ns,
            cid=checkpoint["id"],
            parent=parent if isinstance(parent, str) and parent else None,
            run_id=run_id if isinstance(run_id, str) and run_id else None,
            checkpoint=self.serde.dumps_typed(body),
            metadata=self.serde.dumps_typed(full_metadata),
            versions=versions,
            new_values={
                channel: self.serde.dumps_typed(values[channel]) if channel in values else None
                for channel in new_versions
                if versions.get(channel) == new_versions[channel]
            },
        )
        if draft.parent is not None:
            draft.known = self._known_channels(thread, ns, draft.parent)
        retries = _RETRY.start()
        expected: Guard | None = Guard.ABSENT
        while True:
            if self._refuse_stale_forks and draft.parent is not None:
                self._check_parent_is_newest(thread, ns, draft.parent)
            unit, _, channels = self._rows.checkpoint_unit(
                thread, draft, self._rows.head(thread), expected=expected
            )
            try:
                self._store.commit(unit)
            except RevisionConflict:
                expected = None
                retries.after_lost_race("a LangGraph thread")
                continue
            self._remember_channels(thread, ns, draft.cid, channels)
            return _config(thread.thread_id, ns, draft.cid)

    def _remember(self, stored: StoredCheckpoint) -> None:
        self._remember_channels(stored.thread, stored.ns, stored.cid, stored.channels)

    def _remember_channels(
        self, thread: Thread, ns: str, cid: str, channels: Mapping[str, tuple[str, str]]
    ) -> None:
        """Keep what a checkpoint names, so its child's put looks up no unchanged channel."""
        with self._known_lock:
            key = (thread.digest, ns, cid)
            self._known[key] = dict(channels)
            self._known.move_to_end(key)
            while len(self._known) > _KNOWN_CHECKPOINTS:
                self._known.popitem(last=False)

    def _known_channels(self, thread: Thread, ns: str, cid: str) -> dict[str, tuple[str, str]]:
        with self._known_lock:
            return dict(self._known.get((thread.digest, ns, cid), {}))

    def _forget_known(self) -> None:
        with self._known_lock:
            self._known.clear()

    def _check_parent_is_newest(self, thread: Thread, ns: str, parent: str) -> None:
        newest = next(iter(self._rows.listed(thread, ns, first_page=1)), None)
        if newest is not None and newest.labels.get("cid") != parent:
            raise RevisionConflict(
                "this checkpoint forks its thread from a parent that is no longer the newest: "
                "another writer moved the thread on; reload the thread and retry",
                stream=thread.stream,
            )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes against a checkpoint; a write already stored is kept."""
        configurable = _configurable(config)
        thread = self._rows.thread(configurable.get("thread_id"))
        ns = _ns(configurable)
        cid = configurable.get("checkpoint_id")
        if not isinstance(cid, str) or not cid:
            raise InvalidInput("put_writes needs the checkpoint_id its writes belong to")
        stored = [
            StoredWrite(
                task_id=task_id,
                idx=WRITES_IDX_MAP.get(channel, idx),
                channel=channel,
                value=self.serde.dumps_typed(value),
                task_path=task_path,
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        retries = _RETRY.start()
        while True:
            unit = self._rows.writes_unit(thread, ns, cid, stored, self._rows.head(thread))
            if unit is None:
                return
            try:
                self._store.commit(unit)
            except RevisionConflict:
                retries.after_lost_race("a LangGraph thread")
                continue
            return

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and value of a thread, under one ledger event."""
        thread = self._rows.thread(thread_id)
        self._delete(thread, lambda: (self._rows.thread_rows(thread), THREAD_DELETED_EVENT, {}))

    def _delete(
        self,
        thread: Thread,
        plan: Callable[[], DeletionPlan],
    ) -> None:
        """Commit ``plan()``'s deletions with their event, planning again after a lost race."""
        self._forget_known()
        retries = _RETRY.start()
        while True:
            doomed, kind, payload = plan()
            if not doomed:
                return
            unit = self._rows.deletion_unit(thread, doomed, kind, payload)
            try:
                self._store.commit(unit)
            except RevisionConflict:
                retries.after_lost_race("a LangGraph thread")
                continue
            return

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that the named runs made, in every thread."""
        digests = sorted({self._rows.run_digest(run) for run in run_ids if isinstance(run, str)})
        for start in range(0, len(digests), MAX_EVENT_NAMES):
            chunk = digests[start : start + MAX_EVENT_NAMES]
            threads: set[str] = set()
            for run in chunk:
                for row in self._rows.rows_of(CHECKPOINTS, [LabelFilter("run", run)]):
                    label = row.labels.get("thread")
                    if isinstance(label, str):
                        threads.add(label)
            for label in sorted(threads):
                thread = Thread.from_digest(label)
                self._delete(thread, partial(self._runs_plan, thread, chunk))

    def _runs_plan(self, thread: Thread, runs: Sequence[str]) -> DeletionPlan:
        listed: builtins.list[JsonValue] = builtins.list(runs)
        return self._run_rows(thread, runs), RUNS_DELETED_EVENT, {"runs": listed}

    def _run_rows(self, thread: Thread, runs: Sequence[str]) -> Rows:
        doomed: Rows = []
        for run in runs:
            filters = [LabelFilter("thread", thread.digest), LabelFilter("run", run)]
            for row in self._rows.rows_of(CHECKPOINTS, filters):
                doomed.append(row)
                doomed.extend(self._writes_rows(thread, row))
        return doomed

    def _writes_rows(self, thread: Thread, checkpoint: RecordMetadata) -> Rows:
        ns, cid = checkpoint.labels.get("ns"), checkpoint.labels.get("cid")
        if not isinstance(ns, str) or not isinstance(cid, str):
            return []
        filters = [
            LabelFilter("thread", thread.digest),
            LabelFilter("ns", ns),
            LabelFilter("cid", cid),
        ]
        return builtins.list(self._rows.rows_of(WRITES, filters))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's newest checkpoint (``"keep_latest"``), or delete all.

        Channel values no kept checkpoint names go too. Raises
        ``InvalidInput`` for another strategy.
        """
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInput("prune's strategy is 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            thread = self._rows.thread(thread_id)
            self._delete(thread, partial(self._prune_plan, thread))

    def _prune_plan(self, thread: Thread) -> DeletionPlan:
        doomed, kept = self._pruned_rows(thread)
        if len(kept) > MAX_EVENT_NAMES:
            raise InvalidInput(
                f"prune keeps at most {MAX_EVENT_NAMES} namespaces of a thread; "
                "delete the thread's subgraph namespaces first"
            )
        kept_list: builtins.list[JsonValue] = builtins.list(kept)
        return doomed, PRUNED_EVENT, {"kept": kept_list}

    def _pruned_rows(self, thread: Thread) -> tuple[Rows, builtins.list[str]]:
        """Return what ``keep_latest`` deletes, and the key digests of the checkpoints it keeps."""
        newest: dict[str, RecordMetadata] = {}
        checkpoints = builtins.list(
            self._rows.rows_of(CHECKPOINTS, [LabelFilter("thread", thread.digest)])
        )
        for row in checkpoints:
            ns, cid = row.labels.get("ns"), row.labels.get("cid")
            if not isinstance(ns, str) or not isinstance(cid, str):
                continue
            best = newest.get(ns)
            if best is None or str(best.labels.get("cid")) < cid:
                newest[ns] = row
        keep = {row.key_digest for row in newest.values()}
        doomed = [row for row in checkpoints if row.key_digest not in keep]
        for row in builtins.list(doomed):
            doomed.extend(self._writes_rows(thread, row))
        if not doomed:
            return [], sorted(keep)
        named: set[str] = set()
        repository = self._rows.repository
        for stored in self._rows.open_listed(thread, builtins.list(newest.values())):
            for channel, (version, _digest) in stored.channels.items():
                key = ThreadRows.blob_key(thread, stored.ns, channel, version)
                named.add(repository.key_digest(BLOBS, key))
        for row in self._rows.rows_of(BLOBS, [LabelFilter("thread", thread.digest)]):
            if row.key_digest not in named:
                doomed.append(row)
        return doomed, sorted(keep)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and value of one thread to another, in one unit of work."""
        source = self._rows.thread(source_thread_id)
        target = self._rows.thread(target_thread_id)
        retries = _RETRY.start()
        while True:
            tuples = builtins.list(
                self._list_thread(source, ns=None, only=None, wanted=None, before=None, limit=None)
            )
            if not tuples:
                return
            unit = self._copy_unit(target, tuples)
            try:
                self._store.commit(unit)
            except RevisionConflict:
                retries.after_lost_race("a LangGraph thread")
                continue
            return

    def _copy_unit(self, target: Thread, tuples: Sequence[CheckpointTuple]) -> UnitOfWork:
        upserts: builtins.list[Upsert] = []
        appends: builtins.list[LedgerEvent] = []
        after = self._rows.head(target)
        pending_blobs: dict[str, str] = {}
        for item in sorted(tuples, key=lambda t: t.config["configurable"]["checkpoint_id"]):
            configurable = item.config["configurable"]
            ns, cid = configurable["checkpoint_ns"], configurable["checkpoint_id"]
            parent = (
                item.parent_config["configurable"]["checkpoint_id"] if item.parent_config else None
            )
            body: dict[str, Any] = dict(item.checkpoint)
            values: dict[str, Any] = body.pop("channel_values", {})
            run_id = item.metadata.get("run_id")
            draft = CheckpointDraft(
                ns=ns,
                cid=cid,
                parent=parent,
                run_id=run_id if isinstance(run_id, str) and run_id else None,
                checkpoint=self.serde.dumps_typed(body),
                metadata=self.serde.dumps_typed(item.metadata),
                versions=dict(item.checkpoint["channel_versions"]),
                new_values={
                    channel: self.serde.dumps_typed(value) for channel, value in values.items()
                },
            )
            unit, after, _ = self._rows.checkpoint_unit(target, draft, after, pending=pending_blobs)
            upserts.extend(unit.upserts)
            appends.extend(unit.appends)
            if item.pending_writes:
                writes = [
                    StoredWrite(
                        task_id=task_id,
                        idx=WRITES_IDX_MAP.get(channel, idx),
                        channel=channel,
                        value=self.serde.dumps_typed(value),
                        task_path="",
                    )
                    for idx, (task_id, channel, value) in enumerate(item.pending_writes)
                ]
                writes_unit = self._rows.writes_unit(
                    target, ns, cid, writes, after, copy_of_run=draft.run_id or ""
                )
                if writes_unit is not None:
                    upserts.extend(writes_unit.upserts)
                    appends.extend(writes_unit.appends)
                    after = writes_unit.appends[-1]
        return UnitOfWork(upserts=upserts, appends=appends)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Return the version after ``current``: a padded counter and a random tail."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{secrets.randbelow(10**16):016}"

    # -- async twins ---------------------------------------------------------

    async def _off_loop(self, call: Callable[[], R]) -> R:
        """Run ``call`` on the saver's own bounded pool, in the caller's context.

        A bounded pool, not the loop's default executor (which grows with
        the machine's cores): many threads racing one thread's stream lose
        most of their compare-and-swaps (docs/async.md has the figures).
        A cancelled caller withdraws a call not yet started; one that has
        started runs to its end, so a write may still land.
        """
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._threads, thread_name_prefix="flowvault-langgraph"
                )
            future = self._pool.submit(contextvars.copy_context().run, call)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Wait for the async calls in flight, then stop the saver's worker threads.

        The store stays open: it is the runtime's, or ``from_conn_string``'s
        to close. Calling an async method again starts the workers again.
        """
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple`` on a worker thread."""
        return await self._off_loop(partial(self.get_tuple, config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """``list`` on a worker thread; the window is read and checked before the first item."""
        items = await self._off_loop(
            lambda: builtins.list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """``put`` on a worker thread."""
        return await self._off_loop(partial(self.put, config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``put_writes`` on a worker thread."""
        await self._off_loop(partial(self.put_writes, config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread`` on a worker thread."""
        await self._off_loop(partial(self.delete_thread, thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """``delete_for_runs`` on a worker thread."""
        await self._off_loop(partial(self.delete_for_runs, run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """``copy_thread`` on a worker thread."""
        await self._off_loop(partial(self.copy_thread, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``prune`` on a worker thread."""
        await self._off_loop(partial(self.prune, thread_ids, strategy=strategy))


class AsyncFlowvaultSaver(FlowvaultSaver):
    """The async twin: the same saver, opened with ``async with ....from_conn_string(...)``."""

    @classmethod
    @asynccontextmanager
    async def from_conn_string(  # type: ignore[override]
        cls,
        conn_string: str,
        *,
        key: bytes,
        postgres_schema: str = "flowvault",
        serde: SerializerProtocol | None = None,
        refuse_stale_forks: bool = False,
        threads: int = DEFAULT_THREADS,
    ) -> AsyncIterator[AsyncFlowvaultSaver]:
        """Open a saver as ``FlowvaultSaver.from_conn_string`` does, off the event loop."""
        repository = await asyncio.to_thread(
            open_repository, conn_string, key=key, postgres_schema=postgres_schema
        )
        saver = cls(repository, serde=serde, refuse_stale_forks=refuse_stale_forks, threads=threads)
        try:
            yield saver
        finally:
            await asyncio.to_thread(saver.close)
            await asyncio.to_thread(repository.store.close)


def _batched(rows: Iterator[RecordMetadata], size: int) -> Iterator[Rows]:
    """Group listed rows so each group is loaded in one batch."""
    group: Rows = []
    for row in rows:
        group.append(row)
        if len(group) >= size:
            yield group
            group = []
    if group:
        yield group


def _matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    if not wanted:
        return True
    return all(key in metadata and metadata[key] == value for key, value in wanted.items())


def open_repository(conn_string: str, *, key: bytes, postgres_schema: str) -> SealedRepository:
    """Open (creating where needed) the store ``conn_string`` names, sealed under ``key``."""
    if not isinstance(conn_string, str) or not conn_string:
        raise InvalidInput("a connection string is a SQLite path, a PostgreSQL DSN or ':memory:'")
    cipher = AesGcmCipher.from_ring(KeyRing(primary=key))
    store: Any
    if conn_string == ":memory:":
        store = InMemorySecureObjectStore()
    elif conn_string.startswith(("postgresql://", "postgres://")):
        from flowvault.adapters.postgres import (  # noqa: PLC0415 - an optional extra
            PostgresSecureObjectStore,
        )

        store = PostgresSecureObjectStore.open(conn_string, schema=postgres_schema, create=True)
    else:
        store = SQLiteSecureObjectStore.open(Path(conn_string), create=True)
    try:
        capabilities = StoreCapabilities.of(store)
        if capabilities.stats is not None:
            check_key_matches(capabilities.stats.key_id_counts(), cipher.key_ids())
    except BaseException:
        store.close()
        raise
    return SealedRepository(store, cipher, SystemClock(), capabilities=capabilities)


__all__ = [
    "STREAM_PREFIX",
    "WRITES_EVENT",
    "AsyncFlowvaultSaver",
    "FlowvaultSaver",
    "HasRepository",
]
