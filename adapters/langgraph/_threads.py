"""A LangGraph thread's rows in a flowvault store: names, labels, sealed documents, units.

Nothing here knows LangGraph's types: values arrive already serialised
(``(type, bytes)`` pairs from the saver's serializer), so the rules that
keep a thread's rows sealed, labelled without clear text and bound to the
thread's ledger can be read and tested on their own.
"""

from __future__ import annotations

import base64
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    BlobStore,
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    Order,
    RecordMetadata,
    SealedDocument,
    SealedRepository,
    StoreCapabilities,
    TagFilter,
    UnitOfWork,
    Upsert,
    chained_event,
)
from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._blobs import CHUNK_BYTES
from flowvault.application._records import MAX_TAGS, ExpectedRevision, RecordFilter
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    RevisionConflict,
)

CHECKPOINTS: Final = "langgraph.checkpoints"
WRITES: Final = "langgraph.writes"
BLOBS: Final = "langgraph.blobs"

THREAD_TAG: Final = "flowvault.langgraph-thread/1"
NS_TAG: Final = "flowvault.langgraph-ns/1"
RUN_TAG: Final = "flowvault.langgraph-run/1"
METADATA_TAG: Final = "flowvault.langgraph-metadata/1"
BLOB_TAG: Final = "flowvault.langgraph-blob/1"

STREAM_PREFIX: Final = "langgraph/"
_PAGE: Final = 200
_REMEMBERED_DIGESTS: Final = 4096
_REMEMBERED_HEADS: Final = 1024
_AFTER_ANY_ID: Final = "\U0010ffff"
"""Above every checkpoint id: the upper bound of a thread's range of positions."""
MAX_CHECKPOINT_ID: Final = 100
"""Longest checkpoint id: its positions, two digests and the id, must fit a 256-character label."""
MAX_VERSION: Final = 128
"""Longest channel version text (LangGraph's are 49 characters)."""
MAX_EVENT_NAMES: Final = 100
"""Most digests one deletion event names (a ledger list keeps 100 items)."""
INLINE_BYTES: Final = 4096
"""Largest channel value kept inside its checkpoint's row rather than in a row of its own."""
INLINE_TOTAL: Final = 65536
"""Most bytes of values one checkpoint's row keeps inside it; the rest get rows of their own."""

Serialized = tuple[str, bytes]
"""A value as the saver's serializer wrote it: a type tag and bytes."""


EMPTY: Final = b""
"""A channel that was empty at its version; a value always holds its type tag, never empty."""

KnownValue = tuple[str, str | bytes]
"""A channel's version text and where its value is: a row's value digest, or the value itself."""


def _join(value: Serialized) -> bytes:
    kind, data = value
    if not kind or "\x00" in kind:
        raise InvalidInput("a serializer's type tag is non-empty text without NUL")
    return kind.encode("utf-8") + b"\x00" + data


def _split(data: bytes) -> Serialized:
    kind, separator, rest = data.partition(b"\x00")
    if not separator or not kind:
        raise IntegrityFailure("a sealed channel value has an unexpected shape")
    return kind.decode("utf-8"), rest


def _decode_bytes(value: JsonValue, what: str) -> bytes:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            pass
    raise IntegrityFailure(f"a sealed {what} has an unexpected shape")


def _encode(value: Serialized) -> list[JsonValue]:
    kind, data = value
    return [kind, base64.b64encode(data).decode("ascii")]


def _decode(value: JsonValue, what: str) -> Serialized:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        return value[0], _decode_bytes(value[1], what)
    raise IntegrityFailure(f"a sealed {what} has an unexpected shape")


def checked_text(
    value: object, what: str, *, longest: int | None = None, empty: bool = False
) -> str:
    """Return ``value`` if it is text that UTF-8 can hold, of the allowed length."""
    if not isinstance(value, str) or (not value and not empty):
        raise InvalidInput(f"{what} is {'' if empty else 'non-empty '}text")
    if longest is not None and len(value) > longest:
        raise InvalidInput(f"{what} is at most {longest} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} holds a lone surrogate, which UTF-8 cannot store") from None
    return value


def version_text(version: str | int | float) -> str:
    """Return a channel version as text that round-trips its type."""
    if isinstance(version, bool) or not isinstance(version, str | int | float):
        raise InvalidInput("a channel version is text, an integer or a float")
    if isinstance(version, float) and not math.isfinite(version):
        raise InvalidInput("a channel version is a finite number")
    if isinstance(version, str):
        checked_text(version, "a channel version", longest=MAX_VERSION, empty=True)
    return json.dumps(version)


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
    """Channel name to (version text, value digest) of the values kept in rows of their own."""
    inline: Mapping[str, tuple[str, bytes]]
    """Channel name to (version text, value) of the values kept inside the checkpoint's row."""
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
    known: Mapping[str, KnownValue] = field(default_factory=dict)
    """Channels as the parent checkpoint holds them, to skip lookups and serialising."""
    metadata_values: Mapping[str, object] = field(default_factory=dict)
    """The checkpoint's metadata, whose text values become tags a filtered listing selects by."""
    serialize: Callable[[str], Serialized | None] = lambda _channel: None
    """Serialise an unchanged channel's value (``None``: empty), to keep a small one inline."""


@dataclass(slots=True)
class _PlacedValues:
    """A checkpoint's channel values as placed: rows to write, and what its document names."""

    upserts: list[Upsert] = field(default_factory=list)
    rows: dict[str, JsonValue] = field(default_factory=dict)
    """Channel to ``[version, value digest]`` of a value in a row of its own."""
    inline: dict[str, JsonValue] = field(default_factory=dict)
    """Channel to ``[version, value in base64]`` of a value kept inside the checkpoint."""
    named: dict[str, KnownValue] = field(default_factory=dict)

    def row(self, channel: str, version: str, digest: str) -> None:
        self.rows[channel] = [version, digest]
        self.named[channel] = (version, digest)

    def keep_inline(self, channel: str, version: str, data: bytes) -> None:
        self.inline[channel] = [version, base64.b64encode(data).decode("ascii")]
        self.named[channel] = (version, data)


class ThreadRows:
    """Reads and writes a thread's sealed rows, each checked against the thread's ledger."""

    def __init__(self, repository: SealedRepository) -> None:
        self._repo = repository
        self._store = repository.store
        self._capabilities: StoreCapabilities = repository.capabilities
        self._blobs = BlobStore(repository)
        self._digests: dict[tuple[str, str], str] = {}
        self._heads = self._capabilities.heads
        self._written_heads: OrderedDict[str, LedgerEvent] = OrderedDict()
        self._written_lock = threading.Lock()

    @property
    def repository(self) -> SealedRepository:
        """The sealed repository the rows live in."""
        return self._repo

    def thread(self, thread_id: object) -> Thread:
        """Name a thread by the keyed digest of its id."""
        checked = checked_text(thread_id, "a thread id")
        return Thread(checked, self._digest(THREAD_TAG, checked))

    def ns_digest(self, thread: Thread, ns: str) -> str:
        """Label a namespace by a keyed digest of it, so namespaces stay sealed too."""
        return self._digest(NS_TAG, json.dumps([thread.thread_id, ns]))

    def run_digest(self, run_id: str) -> str:
        """Label a run by a keyed digest of its id, for ``delete_for_runs``."""
        return self._digest(RUN_TAG, run_id)

    def _digest(self, tag: str, text: str) -> str:
        """Return a keyed digest, remembering recent ones: a thread's are needed on every call."""
        key = (tag, text)
        found = self._digests.get(key)
        if found is None:
            if len(self._digests) >= _REMEMBERED_DIGESTS:
                self._digests.clear()
            found = self._digests[key] = self._repo.keyed_digest(tag, text)
        return found

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

    def head_is(self, thread: Thread, index: int) -> bool:
        """Say whether the thread's newest event is ``index``, from the events themselves.

        Only a store offering ``StreamHeads`` answers without decoding an
        event; without it this says ``False`` and the caller reads on.
        """
        return self._heads is not None and self._heads.ledger_head_index(thread.stream) == index

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
        inline = document.get("inline", {})
        if not (
            isinstance(ns, str)
            and isinstance(cid, str)
            and (parent is None or isinstance(parent, str))
            and (run is None or isinstance(run, str))
            and isinstance(channels, dict)
            and isinstance(inline, dict)
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
        values: dict[str, tuple[str, bytes]] = {}
        for channel, entry in inline.items():
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                raise IntegrityFailure(
                    "a sealed checkpoint holds a channel value oddly",
                    key_digest=metadata.key_digest,
                )
            values[channel] = (entry[0], _decode_bytes(entry[1], "checkpoint"))
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
            inline=values,
            identity=identity,
            bound=metadata.header.ledger_index,
        )

    def load_checkpoint(self, thread: Thread, ns: str, cid: str) -> StoredCheckpoint | None:
        """Load and open one checkpoint row (not yet checked against the ledger)."""
        opened = self._repo.read(CHECKPOINTS, self._checkpoint_key(thread, ns, cid))
        return None if opened is None else self.open_checkpoint(thread, opened)

    def listed(
        self,
        thread: Thread | None,
        ns: str | None,
        *,
        before: str | None = None,
        first_page: int = _PAGE,
        tags: Sequence[str] = (),
    ) -> Iterator[RecordMetadata]:
        """Yield checkpoint rows' metadata, newest checkpoint id first, a page at a time.

        ``thread`` ``None`` lists every thread's checkpoints. The first page
        holds ``first_page`` rows, so a caller wanting the newest reads one.
        A thread's rows are listed by a label that starts with the thread's
        (and namespace's) digest, so the store reads only that range of its
        label index however many other threads it holds.
        """
        label, prefix = "cid", ""
        if thread is not None:
            label, prefix = (
                ("tpos", f"{thread.digest}|") if ns is None else ("pos", self._pos(thread, ns))
            )
        filters = _starting_with(label, prefix, below=before)
        if not prefix:
            filters = [] if before is None else [LabelFilter(label, before, FilterOp.LT)]
        selected: list[RecordFilter] = [*filters, *(TagFilter(tag) for tag in tags)]
        cursor: str | None = None
        limit = first_page
        while True:
            page = self._capabilities.list_by_label(
                self._store,
                CHECKPOINTS,
                label,
                descending=True,
                filters=selected,
                cursor=cursor,
                limit=limit,
            )
            yield from page.items
            cursor = page.next_cursor
            if cursor is None:
                return
            limit = _PAGE

    def newest(self, thread: Thread, ns: str) -> StoredCheckpoint | None:
        """Load and open the newest checkpoint of a namespace in one read, if the store can.

        ``None`` when the namespace holds none, or when a store without
        ``LabelLoad`` saw it rewritten between listing and loading: the
        caller then pages through ``listed``.
        """
        prefix = self._pos(thread, ns)
        found = self._capabilities.load_by_label(
            self._store,
            CHECKPOINTS,
            "pos",
            descending=True,
            filters=_starting_with("pos", prefix),
        )
        if not found:
            return None
        record = found[0]
        document = self._repo.open(
            record, namespace=CHECKPOINTS, key_digest=record.metadata.key_digest
        )
        return self.open_checkpoint(thread, document)

    def metadata_tag(self, thread: Thread, key: str, value: str) -> str:
        """Return the tag of one text metadata value: a keyed digest of thread, key and value.

        The thread is in the digest, so equal values in two threads give
        unequal tags and the store shows no link between threads.
        """
        return self._digest(METADATA_TAG, json.dumps([thread.digest, key, value]))

    def metadata_tags(
        self, thread: Thread, metadata: Mapping[str, object]
    ) -> tuple[frozenset[str], bool]:
        """Return a checkpoint's tags, one per text metadata value, and whether some lack one.

        Only text values are tagged: text equals only text, so a listing
        filtered by a text value's tag selects exactly the checkpoints a
        comparison of the values would. Beyond ``MAX_TAGS`` values none is
        tagged and the row is labelled ``partial_tags``.
        """
        texts = {key: value for key, value in metadata.items() if isinstance(value, str)}
        if len(texts) > MAX_TAGS:
            return frozenset(), True
        return frozenset(
            self.metadata_tag(thread, key, value) for key, value in texts.items()
        ), False

    def has_partial_tags(self, thread: Thread) -> bool:
        """Say whether any checkpoint of ``thread`` holds more text metadata than it has tags."""
        page = self._capabilities.list_by_label(
            self._store,
            CHECKPOINTS,
            "tpos",
            filters=[*self.of_thread("tpos", thread), LabelFilter("partial_tags", 1)],
            limit=1,
        )
        return bool(page.items)

    def _pos(self, thread: Thread, ns: str) -> str:
        return f"{thread.digest}|{self.ns_digest(thread, ns)}|"

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

    def open_listed(self, thread: Thread, rows: Sequence[RecordMetadata]) -> list[StoredCheckpoint]:
        """Load (in one batch where the store can) and open listed checkpoint rows.

        Rows deleted since they were listed are left out.
        """
        loaded = self._capabilities.load_many(
            self._store, CHECKPOINTS, [row.key_digest for row in rows]
        )
        opened: list[StoredCheckpoint] = []
        for row in rows:
            record = loaded.get(row.key_digest)
            if record is None:
                continue
            document = self._repo.open(record, namespace=CHECKPOINTS, key_digest=row.key_digest)
            opened.append(self.open_checkpoint(thread, document))
        return opened

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

    def load_values(self, checkpoint: StoredCheckpoint) -> dict[str, Serialized]:
        """Load a checkpoint's channel values, each checked against the digest it names.

        Values kept inside the checkpoint's row need no read; the others are
        read in one batch where the store can. Channels that were empty at
        their version are left out.
        """
        values: dict[str, Serialized] = {
            channel: _split(data) for channel, (_version, data) in checkpoint.inline.items() if data
        }
        if not checkpoint.channels:
            return values
        thread, ns = checkpoint.thread, checkpoint.ns
        keys = {
            channel: self.blob_key(thread, ns, channel, version)
            for channel, (version, _digest) in checkpoint.channels.items()
        }
        digests = {channel: self._repo.key_digest(BLOBS, key) for channel, key in keys.items()}
        loaded = self._capabilities.load_many(self._store, BLOBS, list(digests.values()))
        for channel, (_version, digest) in checkpoint.channels.items():
            key_digest = digests[channel]
            record = loaded.get(key_digest)
            if record is None:
                raise IntegrityFailure(
                    "a channel value its checkpoint names is missing: it was deleted outside "
                    "flowvault; restore the store from a backup",
                    key_digest=key_digest,
                )
            if record.metadata.labels.get("chunked") == 1:
                data = self._blobs.read(BLOBS, keys[channel])
                if data is None:
                    raise IntegrityFailure(
                        "a chunked channel value is missing", key_digest=key_digest
                    )
            else:
                data = self._repo.open_bytes(record, namespace=BLOBS, key_digest=key_digest).data
            if self._value_digest(data) != digest:
                raise IntegrityFailure(
                    "a channel value differs from the one its checkpoint names",
                    key_digest=key_digest,
                )
            if data != EMPTY:
                values[channel] = _split(data)
        return values

    # -- writing -----------------------------------------------------------

    def _event(
        self, thread: Thread, after: LedgerEvent | None, kind: str, payload: dict[str, JsonValue]
    ) -> LedgerEvent:
        return chained_event(
            self._repo, thread.stream, kind, payload, self._repo.clock.now(), after=after
        )

    def commit(self, build: Callable[[], UnitOfWork | None]) -> bool:
        """Commit the unit ``build()`` makes, building it again from fresh reads after a lost race.

        Every write of a thread appends to its stream, so two writers race
        there; the loser re-reads and rebuilds, under the services' own
        retry policy. Returns ``False`` when ``build()`` found nothing to do.
        """

        def attempt() -> bool | Lost:
            unit = build()
            if unit is None:
                return False
            try:
                self._store.commit(unit)
            except RevisionConflict:
                self._forget_heads(unit)
                return LOST
            except BaseException:
                self._forget_heads(unit)
                raise
            self._remember_heads(unit)
            return True

        return settle(attempt, "a LangGraph thread")

    def head(self, thread: Thread) -> LedgerEvent | None:
        """Return the thread's newest event, which the next write chains onto.

        The event this saver last appended to the stream stands in for a
        read: if another writer appended since, the unit chained onto it
        loses its compare-and-swap, which forgets it, and the rebuild reads.
        """
        with self._written_lock:
            found = self._written_heads.get(thread.stream)
        return self._store.ledger_head(thread.stream) if found is None else found

    def _remember_heads(self, unit: UnitOfWork) -> None:
        with self._written_lock:
            for event in unit.appends:
                known = self._written_heads.get(event.stream)
                if known is None or known.index < event.index:
                    self._written_heads[event.stream] = event
                self._written_heads.move_to_end(event.stream)
            while len(self._written_heads) > _REMEMBERED_HEADS:
                self._written_heads.popitem(last=False)

    def _forget_heads(self, unit: UnitOfWork) -> None:
        with self._written_lock:
            for event in unit.appends:
                self._written_heads.pop(event.stream, None)

    def checkpoint_unit(
        self,
        thread: Thread,
        draft: CheckpointDraft,
        after: LedgerEvent | None,
        *,
        pending: dict[str, str] | None = None,
        expected: ExpectedRevision | None = None,
    ) -> tuple[UnitOfWork, LedgerEvent, dict[str, KnownValue]]:
        """Build the unit that writes one checkpoint and its new channel values.

        A value of at most ``INLINE_BYTES`` is kept inside the checkpoint's
        row, within ``INLINE_TOTAL`` for the row, as LangGraph's own savers
        keep a checkpoint whole. A larger one gets a row of its own, keyed
        by channel and version, and is not stored again while a row holds
        it. ``pending`` carries the values earlier units of one batch
        will store (natural key to digest), so a batch stores each once.
        ``expected`` guards the checkpoint row; given, new values are taken
        to be unstored too (a write that finds otherwise fails as a whole,
        and is planned again with ``None``: look everything up).
        Returns the unit, its event and where each channel's value is.
        """
        pending = {} if pending is None else pending
        optimistic = expected is not None
        ns, cid = draft.ns, draft.cid
        checked_text(
            cid, "a checkpoint id (LangGraph's are 36 characters)", longest=MAX_CHECKPOINT_ID
        )
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
        placed = self._place_values(thread, draft, pending, optimistic=optimistic)
        document: dict[str, JsonValue] = {
            "thread": thread.thread_id,
            "ns": ns,
            "id": cid,
            "parent": draft.parent,
            "run": draft.run_id,
            "checkpoint": _encode(draft.checkpoint),
            "metadata": _encode(draft.metadata),
            "channels": placed.rows,
            "inline": placed.inline,
        }
        if expected is None:
            current = self._store.peek_metadata(CHECKPOINTS, digest)
            expected = Guard.ABSENT if current is None else current.revision
        labels: dict[str, str | int] = {
            "cid": cid,
            "pos": self._pos(thread, ns) + cid,
            "tpos": f"{thread.digest}|{cid}",
        }
        if run is not None:
            labels["run"] = run
        tags, partial = self.metadata_tags(thread, draft.metadata_values)
        if partial:
            labels["partial_tags"] = 1
        upserts = list(placed.upserts)
        upserts.append(
            self._repo.prepare(
                CHECKPOINTS,
                self._checkpoint_key(thread, ns, cid),
                document,
                expected=expected,
                labels=labels,
                ledger_index=event.index,
                tags=tags,
            )
        )
        return UnitOfWork(upserts=upserts, appends=[event]), event, placed.named

    def _place_values(
        self,
        thread: Thread,
        draft: CheckpointDraft,
        pending: dict[str, str],
        *,
        optimistic: bool,
    ) -> _PlacedValues:
        """Decide where each channel's value goes: inside the checkpoint, or in a row of its own."""
        placed = _PlacedValues()
        budget = INLINE_TOTAL
        for channel, version in draft.versions.items():
            text = version_text(version)
            key = self.blob_key(thread, draft.ns, channel, text)
            known: str | bytes | None = pending.get(key)
            if known is None and channel in draft.known and draft.known[channel][0] == text:
                known = draft.known[channel][1]
            if channel in draft.new_values:
                value = draft.new_values[channel]
                data = EMPTY if value is None else _join(value)
            elif isinstance(known, bytes):
                data = known
            else:
                row = known or self._blob_named(key)
                if row:
                    placed.row(channel, text, row)
                    continue
                data = self._unchanged_value(thread, draft, channel, text)
            if len(data) <= min(INLINE_BYTES, budget):
                budget -= len(data)
                placed.keep_inline(channel, text, data)
                continue
            digest = self._value_digest(data)
            stored = known if isinstance(known, str) else None
            stored = stored or (None if optimistic else self._blob_named(key))
            if stored is None:
                placed.upserts.extend(self._value_upserts(thread, draft.ns, key, data, digest))
                pending[key] = digest
            placed.row(channel, text, stored or digest)
        return placed

    def _unchanged_value(
        self, thread: Thread, draft: CheckpointDraft, channel: str, version: str
    ) -> bytes:
        """Return an unchanged channel's value that no row holds, to keep inside the checkpoint.

        It is serialised from the checkpoint; a channel LangGraph left out
        of it (a delta channel between snapshots) takes the parent's value
        at the same version, or is empty.
        """
        value = draft.serialize(channel)
        if value is not None:
            return _join(value)
        parent = (
            None if draft.parent is None else self.load_checkpoint(thread, draft.ns, draft.parent)
        )
        entry = None if parent is None else parent.inline.get(channel)
        return entry[1] if entry is not None and entry[0] == version else EMPTY

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

    def _value_digest(self, data: bytes) -> str:
        return self._repo.keyed_digest(BLOB_TAG, data)

    def _value_upserts(
        self, thread: Thread, ns: str, key: str, data: bytes, digest: str
    ) -> list[Upsert]:
        """Seal a channel value: one row of raw bytes, or a chunked blob above one row's size."""
        labels: dict[str, str | int] = {
            "pos": self._pos(thread, ns) + self._repo.key_digest(BLOBS, key),
            "digest": digest,
        }
        if len(data) <= CHUNK_BYTES:
            return [
                self._repo.prepare_bytes(BLOBS, key, data, expected=Guard.ABSENT, labels=labels)
            ]
        written = self._blobs.prepare(BLOBS, key, data, labels={**labels, "chunked": 1})
        return list(written.upserts)

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
        that run: it replaces any writes row the target holds.
        """
        key = self._writes_key(thread, ns, cid)
        checkpoint = self.checkpoint_digest(thread, ns, cid)
        if copy_of_run is None:
            opened = self._repo.read(WRITES, key)
            replaced = None if opened is None else opened.metadata
        else:
            opened = None
            replaced = self._store.peek_metadata(WRITES, self.writes_digest(thread, ns, cid))
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
            expected=Guard.ABSENT if replaced is None else replaced.revision,
            labels={"pos": self._pos(thread, ns) + cid},
            ledger_index=event.index,
        )
        return UnitOfWork(upserts=[upsert], appends=[event])

    def thread_rows(self, thread: Thread) -> list[RecordMetadata]:
        """Return the metadata of every row of ``thread``, in every namespace."""
        found: list[RecordMetadata] = []
        for namespace, label in ((CHECKPOINTS, "tpos"), (WRITES, "pos"), (BLOBS, "pos")):
            found.extend(self.rows_of(namespace, self.of_thread(label, thread)))
        return found

    @staticmethod
    def of_thread(label: str, thread: Thread) -> list[LabelFilter]:
        """Select the rows whose position ``label`` starts with ``thread``'s digest."""
        return _starting_with(label, f"{thread.digest}|")

    @staticmethod
    def thread_of(row: RecordMetadata) -> str | None:
        """Return the thread digest a checkpoint row's ``tpos`` label starts with."""
        position = row.labels.get("tpos")
        return position.partition("|")[0] if isinstance(position, str) else None

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
        deletes: list[Delete] = []
        for row in rows:
            if row.namespace == BLOBS and row.labels.get("chunked") == 1:
                deletes.extend(self._blobs.deletes_at(BLOBS, row.key_digest))
            else:
                deletes.append(Delete(row.namespace, row.key_digest, row.revision))
        return UnitOfWork(deletes=deletes, appends=[event])


def _starting_with(label: str, prefix: str, *, below: str | None = None) -> list[LabelFilter]:
    """Select the values of ``label`` that start with ``prefix``: one range of its index.

    With ``below``, only those sorting under ``prefix + below``.
    """
    return [
        LabelFilter(label, prefix, FilterOp.GE),
        LabelFilter(label, prefix + (below or _AFTER_ANY_ID), FilterOp.LT),
    ]


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
