"""A LangGraph thread's rows in a flowvault store: names, labels, sealed documents, units.

Nothing here knows LangGraph's types: values arrive already serialised
(``(type, bytes)`` pairs from the saver's serializer), so the rules that
keep a thread's rows sealed, labelled without clear text and bound to the
thread's ledger can be read and tested on their own.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from flowvault.adapters.langgraph._ledger import (
    CHECKPOINT_EVENT,
    PRUNED_EVENT,
    RUNS_DELETED_EVENT,
    THREAD_DELETED_EVENT,
    WRITES_EVENT,
    RowIdentity,
    ThreadHistory,
)
from flowvault.application import (
    Delete,
    Guard,
    LabelFilter,
    Order,
    RecordMetadata,
    SealedDocument,
    SealedRepository,
    StoreCapabilities,
    UnitOfWork,
    Upsert,
    chained_event,
)
from flowvault.domain import IntegrityFailure, InvalidInput, JsonValue, LedgerEvent

CHECKPOINTS: Final = "langgraph.checkpoints"
WRITES: Final = "langgraph.writes"
BLOBS: Final = "langgraph.blobs"

THREAD_TAG: Final = "flowvault.langgraph-thread/1"
NS_TAG: Final = "flowvault.langgraph-ns/1"
RUN_TAG: Final = "flowvault.langgraph-run/1"
BLOB_TAG: Final = "flowvault.langgraph-blob/1"

STREAM_PREFIX: Final = "langgraph/"
_PAGE: Final = 200
MAX_EVENT_NAMES: Final = 100
"""Most digests one deletion event names (a ledger list keeps 100 items)."""

Serialized = tuple[str, bytes]
"""A value as the saver's serializer wrote it: a type tag and bytes."""


def _encode(value: Serialized) -> list[JsonValue]:
    kind, data = value
    return [kind, base64.b64encode(data).decode("ascii")]


def _decode(value: JsonValue, what: str) -> Serialized:
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], str)
    ):
        try:
            return value[0], base64.b64decode(value[1], validate=True)
        except ValueError:
            pass
    raise IntegrityFailure(f"a sealed {what} has an unexpected shape")


def version_text(version: str | int | float) -> str:
    """Return a channel version as text that round-trips its type."""
    if isinstance(version, bool) or not isinstance(version, str | int | float):
        raise InvalidInput("a channel version is text, an integer or a float")
    return json.dumps(version)


def version_value(text: str) -> str | int | float:
    """Return the channel version ``version_text`` wrote."""
    value = json.loads(text)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise IntegrityFailure("a sealed channel version has an unexpected type")
    return value


@dataclass(frozen=True, slots=True)
class Thread:
    """One thread's digests: its label, its stream; the thread id itself stays sealed."""

    thread_id: str
    digest: str

    @classmethod
    def from_digest(cls, digest: str) -> Thread:
        """Name a thread known only by its label (deleting by run): its stream, not its id."""
        return cls("", digest)

    @property
    def stream(self) -> str:
        """The thread's ledger stream, named by the keyed digest of its id."""
        return STREAM_PREFIX + self.digest.removeprefix("sha256:")


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint row, opened and checked."""

    thread: Thread
    ns: str
    cid: str
    parent: str | None
    checkpoint: Serialized
    metadata: Serialized
    channels: Mapping[str, tuple[str, str]]
    """Channel name to (version text, blob digest) of the values it holds."""
    identity: RowIdentity
    bound: int | None


@dataclass(frozen=True, slots=True)
class StoredWrite:
    """One pending write of a task, as ``put_writes`` stored it."""

    task_id: str
    idx: int
    channel: str
    value: Serialized
    task_path: str


@dataclass(slots=True)
class CheckpointDraft:
    """What ``put`` hands over: a checkpoint already serialised, and its new channel values."""

    ns: str
    cid: str
    parent: str | None
    run_id: str | None
    checkpoint: Serialized
    metadata: Serialized
    versions: Mapping[str, str | int | float]
    """Every channel the checkpoint holds and its version."""
    new_values: Mapping[str, Serialized | None] = field(default_factory=dict)
    """Channels written at this step (by their new version); ``None``: the channel is empty."""


class ThreadRows:
    """Reads and writes a thread's sealed rows, each checked against the thread's ledger."""

    def __init__(self, repository: SealedRepository) -> None:
        self._repo = repository
        self._store = repository.store
        self._capabilities: StoreCapabilities = repository.capabilities

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository the rows live in."""
        return self._repo

    def thread(self, thread_id: object) -> Thread:
        """Name a thread by the keyed digest of its id."""
        if not isinstance(thread_id, str) or not thread_id:
            raise InvalidInput("a thread id is non-empty text")
        return Thread(thread_id, self._repo.keyed_digest(THREAD_TAG, thread_id))

    def ns_digest(self, thread: Thread, ns: str) -> str:
        """Label a namespace by a keyed digest of it, so namespaces stay sealed too."""
        return self._repo.keyed_digest(NS_TAG, json.dumps([thread.thread_id, ns]))

    def run_digest(self, run_id: str) -> str:
        """Label a run by a keyed digest of its id, for ``delete_for_runs``."""
        return self._repo.keyed_digest(RUN_TAG, run_id)

    @staticmethod
    def _checkpoint_key(thread: Thread, ns: str, cid: str) -> str:
        return json.dumps(["checkpoint", thread.thread_id, ns, cid])

    @staticmethod
    def _writes_key(thread: Thread, ns: str, cid: str) -> str:
        return json.dumps(["writes", thread.thread_id, ns, cid])

    @staticmethod
    def blob_key(thread: Thread, ns: str, channel: str, version: str) -> str:
        """Return the natural key of a channel value: thread, namespace, channel and version."""
        return json.dumps(["blob", thread.thread_id, ns, channel, version])

    def checkpoint_digest(self, thread: Thread, ns: str, cid: str) -> str:
        """Return the key digest of a checkpoint's row."""
        return self._repo.key_digest(CHECKPOINTS, self._checkpoint_key(thread, ns, cid))

    def writes_digest(self, thread: Thread, ns: str, cid: str) -> str:
        """Return the key digest of the row holding a checkpoint's task writes."""
        return self._repo.key_digest(WRITES, self._writes_key(thread, ns, cid))

    # -- reading -----------------------------------------------------------

    def history(self, thread: Thread, start: int) -> ThreadHistory:
        """Return the thread's verified events from ``start`` to the head."""
        return ThreadHistory.read(self._store, self._repo, thread.stream, start)

    def open_checkpoint(self, thread: Thread, opened: SealedDocument) -> StoredCheckpoint:
        """Check a checkpoint row's sealed identity and return it decoded."""
        document = opened.document
        metadata = opened.metadata
        if not isinstance(document, dict) or document.get("thread") != thread.thread_id:
            raise IntegrityFailure(
                "a checkpoint row belongs to another thread", key_digest=metadata.key_digest
            )
        ns, cid, parent = document.get("ns"), document.get("id"), document.get("parent")
        run, channels = document.get("run"), document.get("channels")
        if not (
            isinstance(ns, str)
            and isinstance(cid, str)
            and (parent is None or isinstance(parent, str))
            and (run is None or isinstance(run, str))
            and isinstance(channels, dict)
        ):
            raise IntegrityFailure(
                "a sealed checkpoint has an unexpected shape", key_digest=metadata.key_digest
            )
        if metadata.key_digest != self.checkpoint_digest(thread, ns, cid):
            raise IntegrityFailure(
                "a checkpoint row is filed under another checkpoint's key",
                key_digest=metadata.key_digest,
            )
        decoded: dict[str, tuple[str, str]] = {}
        for channel, entry in channels.items():
            if not (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], str)
            ):
                raise IntegrityFailure(
                    "a sealed checkpoint names its channel values oddly",
                    key_digest=metadata.key_digest,
                )
            decoded[channel] = (entry[0], entry[1])
        identity = RowIdentity(
            key_digest=metadata.key_digest,
            checkpoint=metadata.key_digest,
            run=None if run is None else self.run_digest(run),
        )
        return StoredCheckpoint(
            thread=thread,
            ns=ns,
            cid=cid,
            parent=parent,
            checkpoint=_decode(document.get("checkpoint"), "checkpoint"),
            metadata=_decode(document.get("metadata"), "checkpoint"),
            channels=decoded,
            identity=identity,
            bound=metadata.header.ledger_index,
        )

    def load_checkpoint(self, thread: Thread, ns: str, cid: str) -> StoredCheckpoint | None:
        """Load and open one checkpoint row (not yet checked against the ledger)."""
        opened = self._repo.read(CHECKPOINTS, self._checkpoint_key(thread, ns, cid))
        return None if opened is None else self.open_checkpoint(thread, opened)

    def listed(
        self, thread: Thread | None, ns: str | None, *, before: str | None = None
    ) -> Iterator[RecordMetadata]:
        """Yield checkpoint rows' metadata, newest checkpoint id first.

        ``thread`` ``None`` lists every thread's checkpoints.
        """
        filters: list[LabelFilter] = []
        if thread is not None:
            filters.append(LabelFilter("thread", thread.digest))
            if ns is not None:
                filters.append(LabelFilter("ns", self.ns_digest(thread, ns)))
        rows = list(self.rows_of(CHECKPOINTS, filters))
        rows = [row for row in rows if isinstance(row.labels.get("cid"), str)]
        rows.sort(key=lambda row: (str(row.labels["cid"]), row.key_digest), reverse=True)
        for row in rows:
            if before is not None and str(row.labels["cid"]) >= before:
                continue
            yield row

    def rows_of(self, namespace: str, filters: Sequence[LabelFilter]) -> Iterator[RecordMetadata]:
        """Yield the metadata of every row of ``namespace`` the filters select."""
        cursor: str | None = None
        while True:
            page = self._store.list(
                namespace, filters=filters, order=Order.KEY, cursor=cursor, limit=_PAGE
            )
            yield from page.items
            cursor = page.next_cursor
            if cursor is None:
                return

    def open_listed(self, thread: Thread, row: RecordMetadata) -> StoredCheckpoint | None:
        """Load and open a listed checkpoint row; ``None`` if it went meanwhile."""
        record = self._store.load(CHECKPOINTS, row.key_digest)
        if record is None:
            return None
        opened = self._repo.open(record, namespace=CHECKPOINTS, key_digest=row.key_digest)
        return self.open_checkpoint(thread, opened)

    def load_writes(
        self, checkpoint: StoredCheckpoint
    ) -> tuple[list[StoredWrite], RowIdentity, int | None] | None:
        """Load a checkpoint's task writes row: the writes, its identity and its bound index."""
        thread, ns, cid = checkpoint.thread, checkpoint.ns, checkpoint.cid
        opened = self._repo.read(WRITES, self._writes_key(thread, ns, cid))
        if opened is None:
            return None
        metadata = opened.metadata
        document = opened.document
        if (
            not isinstance(document, dict)
            or document.get("checkpoint") != checkpoint.identity.key_digest
        ):
            raise IntegrityFailure(
                "a task writes row belongs to another checkpoint", key_digest=metadata.key_digest
            )
        identity = RowIdentity(
            key_digest=metadata.key_digest,
            checkpoint=checkpoint.identity.key_digest,
            run=checkpoint.identity.run,
        )
        return _writes_from(document, metadata.key_digest), identity, metadata.header.ledger_index

    def load_blob(
        self, thread: Thread, ns: str, channel: str, version: str, digest: str
    ) -> Serialized | None:
        """Load a channel value, checked against the digest its checkpoint names.

        Returns ``None`` for a channel that was empty at that version.
        """
        opened = self._repo.read(BLOBS, self.blob_key(thread, ns, channel, version))
        if opened is None:
            raise IntegrityFailure(
                "a channel value its checkpoint names is missing: it was deleted outside flowvault",
                key_digest=self._repo.key_digest(
                    BLOBS, self.blob_key(thread, ns, channel, version)
                ),
            )
        document = opened.document
        if not isinstance(document, dict) or document.get("digest") != digest:
            raise IntegrityFailure(
                "a channel value differs from the one its checkpoint names",
                key_digest=opened.metadata.key_digest,
            )
        value = document.get("value")
        return None if value is None else _decode(value, "channel value")

    # -- writing -----------------------------------------------------------

    def _event(
        self, thread: Thread, after: LedgerEvent | None, kind: str, payload: dict[str, JsonValue]
    ) -> LedgerEvent:
        return chained_event(
            self._repo, thread.stream, kind, payload, self._repo.clock.now(), after=after
        )

    def head(self, thread: Thread) -> LedgerEvent | None:
        """Return the thread's newest event, which the next write chains onto."""
        return self._store.ledger_head(thread.stream)

    def checkpoint_unit(
        self,
        thread: Thread,
        draft: CheckpointDraft,
        after: LedgerEvent | None,
        *,
        pending: dict[str, str] | None = None,
    ) -> tuple[UnitOfWork, LedgerEvent]:
        """Build the unit that writes one checkpoint and its new channel values.

        A value already stored at its channel and version is not stored
        again. ``pending`` carries the values earlier units of one batch
        will store (natural key to digest), so a batch stores each once.
        """
        pending = {} if pending is None else pending
        ns, cid = draft.ns, draft.cid
        digest = self.checkpoint_digest(thread, ns, cid)
        run = None if draft.run_id is None else self.run_digest(draft.run_id)
        payload: dict[str, JsonValue] = {
            "records": [digest],
            "ns": self.ns_digest(thread, ns),
            "cid": cid,
        }
        if run is not None:
            payload["run"] = run
        event = self._event(thread, after, CHECKPOINT_EVENT, payload)
        upserts: list[Upsert] = []
        channels: dict[str, JsonValue] = {}
        for channel, version in draft.versions.items():
            text = version_text(version)
            key = self.blob_key(thread, ns, channel, text)
            blob_digest: str | None = None
            if channel in draft.new_values:
                value = draft.new_values[channel]
                blob_digest = self._blob_digest(value)
                stored = pending.get(key) or self._blob_named(key)
                if stored is None:
                    pending[key] = blob_digest
                    upserts.append(
                        self._repo.prepare(
                            BLOBS,
                            key,
                            {
                                "digest": blob_digest,
                                "value": None if value is None else _encode(value),
                            },
                            expected=Guard.ABSENT,
                            labels={**self._labels(thread, ns), "digest": blob_digest},
                        )
                    )
                else:
                    blob_digest = stored
            else:
                blob_digest = pending.get(key) or self._blob_named(key)
            if blob_digest is not None:
                channels[channel] = [text, blob_digest]
        document: dict[str, JsonValue] = {
            "thread": thread.thread_id,
            "ns": ns,
            "id": cid,
            "parent": draft.parent,
            "run": draft.run_id,
            "checkpoint": _encode(draft.checkpoint),
            "metadata": _encode(draft.metadata),
            "channels": channels,
        }
        current = self._store.peek_metadata(CHECKPOINTS, digest)
        labels: dict[str, str | int] = {**self._labels(thread, ns), "cid": cid}
        if run is not None:
            labels["run"] = run
        upserts.append(
            self._repo.prepare(
                CHECKPOINTS,
                self._checkpoint_key(thread, ns, cid),
                document,
                expected=Guard.ABSENT if current is None else current.revision,
                labels=labels,
                ledger_index=event.index,
            )
        )
        return UnitOfWork(upserts=upserts, appends=[event]), event

    def _blob_named(self, key: str) -> str | None:
        """Return the digest a stored channel value carries, from its row's labels alone.

        The label is only trusted to skip storing the value again: a read
        checks the sealed digest against the one its checkpoint names.
        """
        stored = self._store.peek_metadata(BLOBS, self._repo.key_digest(BLOBS, key))
        if stored is None:
            return None
        digest = stored.labels.get("digest")
        if not isinstance(digest, str):
            raise IntegrityFailure(
                "a stored channel value has no digest label", key_digest=stored.key_digest
            )
        return digest

    def _blob_digest(self, value: Serialized | None) -> str:
        if value is None:
            return self._repo.keyed_digest(BLOB_TAG, b"empty")
        kind, data = value
        return self._repo.keyed_digest(BLOB_TAG, kind.encode("utf-8") + b"\x00" + data)

    def _labels(self, thread: Thread, ns: str) -> dict[str, str | int]:
        return {"thread": thread.digest, "ns": self.ns_digest(thread, ns)}

    def writes_unit(
        self,
        thread: Thread,
        ns: str,
        cid: str,
        writes: Sequence[StoredWrite],
        after: LedgerEvent | None,
        *,
        copy_of_run: str | None = None,
    ) -> UnitOfWork | None:
        """Build the unit that merges ``writes`` into a checkpoint's task writes row.

        A regular write (index 0 or more) already stored for its task and
        index is kept, as LangGraph's savers keep the first; a special one
        (an error, an interrupt) replaces the one stored. Returns ``None``
        when nothing would change. ``copy_of_run`` builds the row of a
        checkpoint copied in the same unit (so not stored yet), made by
        that run.
        """
        key = self._writes_key(thread, ns, cid)
        checkpoint = self.checkpoint_digest(thread, ns, cid)
        opened = None if copy_of_run is not None else self._repo.read(WRITES, key)
        stored: dict[tuple[str, int], StoredWrite] = {}
        if opened is not None:
            for write in _writes_from(opened.document, opened.metadata.key_digest):
                stored[(write.task_id, write.idx)] = write
        changed = False
        for write in writes:
            slot = (write.task_id, write.idx)
            if write.idx >= 0 and slot in stored:
                continue
            if stored.get(slot) == write:
                continue
            stored[slot] = write
            changed = True
        if not changed:
            return None
        if copy_of_run is not None:
            run_label: object = copy_of_run and self.run_digest(copy_of_run)
        else:
            parent = self._store.peek_metadata(CHECKPOINTS, checkpoint)
            run_label = None if parent is None else parent.labels.get("run")
        digest = self.writes_digest(thread, ns, cid)
        payload: dict[str, JsonValue] = {
            "records": [digest],
            "ns": self.ns_digest(thread, ns),
            "cid": cid,
            "checkpoint": checkpoint,
        }
        if isinstance(run_label, str):
            payload["run"] = run_label
        event = self._event(thread, after, WRITES_EVENT, payload)
        document: dict[str, JsonValue] = {
            "checkpoint": checkpoint,
            "writes": [
                [w.task_id, w.idx, w.channel, *_encode(w.value), w.task_path]
                for w in stored.values()
            ],
        }
        upsert = self._repo.prepare(
            WRITES,
            key,
            document,
            expected=Guard.ABSENT if opened is None else opened.metadata.revision,
            labels={**self._labels(thread, ns), "cid": cid},
            ledger_index=event.index,
        )
        return UnitOfWork(upserts=[upsert], appends=[event])

    def thread_rows(self, thread: Thread) -> list[RecordMetadata]:
        """Return the metadata of every row of ``thread``, in every namespace."""
        found: list[RecordMetadata] = []
        for namespace in (CHECKPOINTS, WRITES, BLOBS):
            found.extend(self.rows_of(namespace, [LabelFilter("thread", thread.digest)]))
        return found

    def deletion_unit(
        self,
        thread: Thread,
        rows: Sequence[RecordMetadata],
        kind: str,
        payload: dict[str, JsonValue],
    ) -> UnitOfWork:
        """Build the unit that deletes ``rows`` under one deletion event of the thread."""
        if kind not in (THREAD_DELETED_EVENT, PRUNED_EVENT, RUNS_DELETED_EVENT):
            raise InvalidInput("not a deletion event")
        event = self._event(thread, self.head(thread), kind, payload)
        deletes = [Delete(row.namespace, row.key_digest, row.revision) for row in rows]
        return UnitOfWork(deletes=deletes, appends=[event])


def _writes_from(document: JsonValue, key_digest: str) -> list[StoredWrite]:
    listed = document.get("writes") if isinstance(document, dict) else None
    if not isinstance(listed, list):
        raise IntegrityFailure(
            "a sealed task writes row has an unexpected shape", key_digest=key_digest
        )
    found: list[StoredWrite] = []
    for entry in listed:
        if not (
            isinstance(entry, list)
            and len(entry) == 6
            and isinstance(entry[0], str)
            and type(entry[1]) is int
            and isinstance(entry[2], str)
            and isinstance(entry[5], str)
        ):
            raise IntegrityFailure(
                "a sealed task write has an unexpected shape", key_digest=key_digest
            )
        found.append(
            StoredWrite(
                task_id=entry[0],
                idx=entry[1],
                channel=entry[2],
                value=_decode([entry[3], entry[4]], "task write"),
                task_path=entry[5],
            )
        )
    return found
