"""``FlowvaultSaver``: LangGraph's checkpointer interface over a sealed flowvault store."""

from __future__ import annotations

import asyncio
import builtins
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any, Final, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from flowvault.adapters.langgraph._checks import ThreadChecks
from flowvault.adapters.langgraph._deletions import ThreadDeletions
from flowvault.adapters.langgraph._ledger import (
    ThreadHistory,
)
from flowvault.adapters.langgraph._open import HasRepository, open_repository
from flowvault.adapters.langgraph._threads import (
    CHECKPOINTS,
    CheckpointDraft,
    KnownValue,
    StoredCheckpoint,
    StoredWrite,
    Thread,
    ThreadRows,
    checked_text,
)
from flowvault.application import (
    Guard,
    RecordMetadata,
    SealedRepository,
    UnitOfWork,
    Upsert,
)
from flowvault.application._worker import SQLITE_THREADS, Worker
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    RevisionConflict,
)

DEFAULT_THREADS: Final = SQLITE_THREADS
"""Worker threads of the async methods: what ``AsyncRuntime`` uses on SQLite (docs/async.md)."""
R = TypeVar("R")
_PAGE: Final = 200
_KNOWN_CHECKPOINTS: Final = 256
_LONGEST_COUNTER: Final = 32
"""Recent checkpoints whose channels a saver remembers for their children's puts."""

Rows = list[RecordMetadata]
"""Listed rows (an alias: ``list`` inside the saver is its method)."""


def _configurable(config: object) -> Mapping[str, Any]:
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(configurable, Mapping):
        raise InvalidInput("a LangGraph config needs a 'configurable' mapping with a thread_id")
    return configurable


def _ns(configurable: Mapping[str, Any]) -> str:
    return checked_text(configurable.get("checkpoint_ns", ""), "checkpoint_ns", empty=True)


def _optional_id(configurable: Mapping[str, Any]) -> str | None:
    cid = configurable.get("checkpoint_id")
    return None if cid is None or cid == "" else checked_text(cid, "checkpoint_id")


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise InvalidInput(f"{what} is a mapping with text keys")
    return value


def _texts(values: object, what: str) -> builtins.list[str]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidInput(f"{what} is a sequence of text")
    return [checked_text(value, what) for value in values]


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


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
        self._checks = ThreadChecks(self._rows)
        self._deletions = ThreadDeletions(self._rows)
        self._store = repository.store
        self._refuse_stale_forks = bool(refuse_stale_forks)
        self._known: OrderedDict[tuple[str, str, str], dict[str, KnownValue]] = OrderedDict()
        self._known_lock = threading.Lock()
        if type(threads) is not int or threads < 1:
            raise InvalidInput("threads is a whole number, 1 or more")
        self._threads = threads
        self._worker: Worker | None = None
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
        cid = _optional_id(configurable)
        if cid:
            stored = self._rows.load_checkpoint(thread, ns, cid)
            if stored is None:
                self._checks.refuse_missing(thread, self._rows.checkpoint_digest(thread, ns, cid))
                return None
            return self._tuple(stored, self._checks.history(thread, [stored]))
        newest = self._rows.newest(thread, ns)
        candidates = (
            [newest]
            if newest is not None
            else (
                stored
                for row in self._rows.listed(thread, ns, first_page=1)
                for stored in self._rows.open_listed(thread, [row])
            )
        )
        for stored in candidates:
            history = self._checks.history(thread, [stored])
            self._checks.refuse_newer_missing(thread, ns, stored, history)
            return self._tuple(stored, history)
        self._checks.refuse_any_missing(thread, ns)
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
        if limit is not None and (type(limit) is not int):
            raise InvalidInput("limit is a whole number or None")
        if filter is not None:
            _mapping(filter, "filter")
        before_id = None if before is None else _optional_id(_configurable(before))
        if limit is not None and limit <= 0:
            return
        if config is None:
            yield from self._list_all(filter, before_id, limit)
            return
        configurable = _configurable(config)
        thread = self._rows.thread(configurable.get("thread_id"))
        ns = None if configurable.get("checkpoint_ns") is None else _ns(configurable)
        only = _optional_id(configurable)
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
        tags = self._filter_tags(thread, wanted)
        batch = _PAGE if wanted or limit is None else min(limit, _PAGE)
        rows = self._rows.listed(thread, ns, before=before, first_page=batch, tags=tags)
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
        whole = only is None and not tags
        if not window:
            if whole:
                self._checks.refuse_any_missing(thread, ns, before=before)
            return
        history = self._checks.history(thread, window, from_start=exhausted and whole)
        if whole:
            lowest = None if exhausted else min(stored.cid for stored in window)
            self._checks.refuse_window_gaps(
                thread, ns, window, history, lowest=lowest, before=before
            )
        for stored, metadata in matches:
            yield self._tuple(stored, history, metadata=metadata)

    def _filter_tags(self, thread: Thread, wanted: Mapping[str, Any] | None) -> builtins.list[str]:
        """Return the tags the store can select a filter's text values by, or none.

        None while any checkpoint of the thread has more text metadata than
        tags: the store could not select it, so every checkpoint is opened.
        """
        texts = {key: value for key, value in (wanted or {}).items() if isinstance(value, str)}
        if not texts or self._rows.has_partial_tags(thread):
            return []
        return [self._rows.metadata_tag(thread, key, value) for key, value in texts.items()]

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
            if thread.digest != ThreadRows.thread_of(row):
                raise IntegrityFailure(
                    "a checkpoint row is labelled with another thread", key_digest=row.key_digest
                )
            stored = self._rows.open_checkpoint(thread, opened)
            metadata = self.serde.loads_typed(stored.metadata)
            if not _matches(metadata, wanted):
                continue
            yield self._tuple(stored, self._checks.history(thread, [stored]), metadata=metadata)
            found += 1
            if limit is not None and found >= limit:
                return

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
            pending_writes=[
                (write.task_id, write.channel, self.serde.loads_typed(write.value))
                for write in self._checks.pending_writes(stored, history)
            ],
        )

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
        parent = _optional_id(configurable)
        body: dict[str, Any] = dict(_mapping(checkpoint, "a checkpoint"))
        values = dict(_mapping(body.pop("channel_values", {}), "channel_values"))
        versions = dict(_mapping(body.get("channel_versions"), "channel_versions"))
        new = _mapping(new_versions, "new_versions")
        _mapping(metadata, "metadata")
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        metadata_values: Mapping[str, object] = full_metadata
        draft = CheckpointDraft(
            ns=ns,
            cid=checked_text(body.get("id"), "a checkpoint's id"),
            parent=parent if isinstance(parent, str) and parent else None,
            run_id=run_id if isinstance(run_id, str) and run_id else None,
            checkpoint=self._dumps(body),
            metadata=self._dumps(full_metadata),
            versions=versions,
            metadata_values=metadata_values,
            new_values={
                channel: self._dumps(values[channel]) if channel in values else None
                for channel in new
                if versions.get(channel) == new[channel]
            },
            serialize=lambda channel: self._dumps(values[channel]) if channel in values else None,
        )
        if draft.parent is not None:
            draft.known = self._known_channels(thread, ns, draft.parent)
        # The first build takes the checkpoint and its values to be new; a rebuild looks.
        optimistic: list[Guard | None] = [Guard.ABSENT]
        written: dict[str, KnownValue] = {}

        def build() -> UnitOfWork:
            if self._refuse_stale_forks and draft.parent is not None:
                self._check_parent_is_newest(thread, ns, draft.parent)
            unit, _, channels = self._rows.checkpoint_unit(
                thread,
                draft,
                self._rows.head(thread),
                expected=optimistic.pop() if optimistic else None,
            )
            written.clear()
            written.update(channels)
            return unit

        self._rows.commit(build)
        self._remember_channels(thread, ns, draft.cid, written)
        return _config(thread.thread_id, ns, draft.cid)

    def _dumps(self, value: object) -> tuple[str, bytes]:
        """Serialise ``value``; one the serializer refuses is the caller's ``InvalidInput``."""
        try:
            return self.serde.dumps_typed(value)
        except (TypeError, ValueError, OverflowError, RecursionError) as refused:
            raise InvalidInput(
                f"the serializer cannot encode a value ({type(refused).__name__})"
            ) from None

    def _remember(self, stored: StoredCheckpoint) -> None:
        channels: dict[str, KnownValue] = {**stored.channels, **stored.inline}
        self._remember_channels(stored.thread, stored.ns, stored.cid, channels)

    def _remember_channels(
        self, thread: Thread, ns: str, cid: str, channels: Mapping[str, KnownValue]
    ) -> None:
        """Keep what a checkpoint names, so its child's put looks up no unchanged channel."""
        with self._known_lock:
            key = (thread.digest, ns, cid)
            self._known[key] = dict(channels)
            self._known.move_to_end(key)
            while len(self._known) > _KNOWN_CHECKPOINTS:
                self._known.popitem(last=False)

    def _known_channels(self, thread: Thread, ns: str, cid: str) -> dict[str, KnownValue]:
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
        cid = _optional_id(configurable)
        if cid is None:
            raise InvalidInput("put_writes needs the checkpoint_id its writes belong to")
        checked_text(task_id, "a task id")
        checked_text(task_path, "a task path", empty=True)
        if isinstance(writes, str | bytes) or not isinstance(writes, Sequence):
            raise InvalidInput("writes are a sequence of (channel, value) pairs")
        stored = []
        for idx, write in enumerate(writes):
            if isinstance(write, str | bytes) or not isinstance(write, Sequence) or len(write) != 2:
                raise InvalidInput("writes are a sequence of (channel, value) pairs")
            channel = checked_text(write[0], "a write's channel")
            stored.append(
                StoredWrite(
                    task_id=task_id,
                    idx=WRITES_IDX_MAP.get(channel, idx),
                    channel=channel,
                    value=self._dumps(write[1]),
                    task_path=task_path,
                )
            )
        self._rows.commit(
            lambda: self._rows.writes_unit(thread, ns, cid, stored, self._rows.head(thread))
        )

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and value of a thread, under one ledger event."""
        thread = self._rows.thread(thread_id)
        self._forget_known()
        self._deletions.delete_thread(thread)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that the named runs made, in every thread."""
        runs = _texts(run_ids, "run ids")
        self._forget_known()
        self._deletions.delete_runs([self._rows.run_digest(run) for run in runs])

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's newest checkpoint (``"keep_latest"``), or delete all.

        Channel values no kept checkpoint names go too. Raises
        ``InvalidInput`` for another strategy.
        """
        if not isinstance(strategy, str) or strategy not in ("keep_latest", "delete"):
            raise InvalidInput("prune's strategy is 'keep_latest' or 'delete'")
        threads = _texts(thread_ids, "thread ids")
        self._forget_known()
        for thread_id in threads:
            thread = self._rows.thread(thread_id)
            if strategy == "delete":
                self._deletions.delete_thread(thread)
            else:
                self._deletions.prune(thread)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and value of one thread to another, in one unit of work."""
        source = self._rows.thread(source_thread_id)
        target = self._rows.thread(target_thread_id)

        def build() -> UnitOfWork | None:
            tuples = builtins.list(
                self._list_thread(source, ns=None, only=None, wanted=None, before=None, limit=None)
            )
            return self._copy_unit(target, tuples) if tuples else None

        self._rows.commit(build)

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
                metadata_values=item.metadata,
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
        elif isinstance(current, int) and not isinstance(current, bool):
            if not 0 <= current < 10**_LONGEST_COUNTER - 1:
                raise InvalidInput("a channel version to follow is a counter below 10**32 - 1")
            number = current
        else:
            head = current.split(".")[0] if isinstance(current, str) else ""
            if not head.isascii() or not head.isdigit() or len(head) > _LONGEST_COUNTER:
                raise InvalidInput("a channel version to follow is a number or a counter text")
            number = int(head)
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
            if self._worker is None:
                self._worker = Worker(self._threads)
            future = self._worker.submit(call)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Wait for the async calls in flight, then stop the saver's worker threads.

        The store stays open: it is the runtime's, or ``from_conn_string``'s
        to close. Calling an async method again starts the workers again.
        """
        with self._pool_lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown()

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
    return all(metadata.get(key) == value for key, value in wanted.items())


__all__ = ["AsyncFlowvaultSaver", "FlowvaultSaver", "HasRepository"]
