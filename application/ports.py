"""The ports: what the use cases need from the outside world, and nothing more.

A host writes an adapter by matching these shapes and proves it with the
contract kit in ``flowvault.application.testing``. Adapters store and fetch;
every policy (sealing, hashing, state rules, retention) lives above them.
The optional capabilities come in two tiers, plus one that only makes
contended updates faster; ``StoreCapabilities`` says what each carries and
is how the use cases reach them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Final, Protocol, runtime_checkable

from flowvault.application._records import (
    LedgerPage,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoreContents,
    StoredRecord,
    UnitOfWork,
)
from flowvault.domain import LedgerEvent


@runtime_checkable
class SecureObjectStore(Protocol):
    """Sealed records addressed by (namespace, key digest), plus ledger streams.

    Payloads are opaque bytes sealed above the port; the adapter never sees
    a natural key or plaintext, only digests, headers, small labels and
    tags (keyed digests), which it stores with the record and returns as written.
    """

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Return the record with its payload, or ``None`` when absent.

        Raises:
            IntegrityFailure: the stored row is unreadable as a record.
            StoreBusy / StoreUnavailable: the backend could not be read.

        """
        ...

    def peek_metadata(self, namespace: str, key_digest: str) -> RecordMetadata | None:
        """Return the record's metadata without reading its payload, or ``None``."""
        ...

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of metadata in ``order``, all filters applied (AND).

        A ``LabelFilter`` compares one label; a ``TagFilter`` keeps records
        carrying its tag. Each item's metadata carries the record's labels
        and tags as written.

        The order is total (ties end on the key digest), so paging with the
        returned cursor visits every matching record once, even while others
        are written. ``limit`` is capped at ``MAX_LIST_LIMIT``.

        Raises:
            InvalidInput: a malformed cursor, a cursor for another order, or
                a limit below 1.

        """
        ...

    def commit(self, unit: UnitOfWork) -> None:
        """Apply every write of ``unit`` atomically, or none of them.

        Each upsert and delete is checked against its expected revision and
        each ledger append against the stream head before anything changes.

        Raises:
            RevisionConflict: a guard failed; ``details`` name the guard
                (``namespace``/``key_digest`` or ``stream``/``index``) and the
                expected and actual revision or index. Nothing was written.
            StoreBusy: the backend stayed locked past its timeout. Nothing
                was written.

        """
        ...

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Return the last event of ``stream``, or ``None`` for an empty stream."""
        ...

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Return events of ``stream`` with ``index >= from_index``, oldest first.

        When ``from_index`` lies before the first retained event, the page
        starts at the first retained event and ``gap`` is true. ``limit`` is
        capped at ``MAX_LIST_LIMIT``.
        """
        ...

    def close(self) -> None:
        """Release connections and files; the store is unusable afterwards."""
        ...


@runtime_checkable
class Clock(Protocol):
    """The only source of time for use cases, so tests can control it."""

    def now(self) -> datetime:
        """Return the current instant, timezone-aware, in UTC."""
        ...


@runtime_checkable
class IdFactory(Protocol):
    """The only source of fresh identifiers for use cases."""

    def new_id(self) -> str:
        """Return a new unique identifier (URL-safe text, no secrets)."""
        ...


@runtime_checkable
class StreamHeads(Protocol):
    """Optional, durable-store tier: a stream's head index without decoding the head event.

    Record freshness checks compare a record's ledger index with its
    stream's head on every read; reading the index alone spares them
    parsing and validating the whole event. It must come from the events
    themselves, like ``ledger_head``, never from a summary row an editor
    could set to match a replayed record.
    """

    def ledger_head_index(self, stream: str) -> int | None:
        """Return the index of the last event of ``stream``, or ``None`` when it is empty."""
        ...


MAX_HEAD_BATCH: Final = 500
"""Most stream names one ``ledger_head_indexes`` call takes."""


@runtime_checkable
class StreamHeadBatch(Protocol):
    """Optional, durable-store tier: the head indexes of many streams in one round trip.

    The high-water mark compares every stream it remembers with the store
    when the store is opened; one lookup per stream would make opening a
    large store cost a round trip per stream. Like ``ledger_head_index``,
    the answer must come from the events themselves.
    """

    def ledger_head_indexes(self, streams: Sequence[str]) -> Mapping[str, int]:
        """Return the index of the last event of each named stream that holds events.

        Streams without events are left out. Names may repeat.

        Raises:
            InvalidInput: a name that is not text, or more than ``MAX_HEAD_BATCH`` names.

        """
        ...


MAX_LOAD_BATCH: Final = 200
"""Most key digests one ``load_many`` call takes."""


@runtime_checkable
class LabelListing(Protocol):
    """Optional, speed: list the records carrying one label, ordered by its value.

    ``list`` orders only by key digest or write time; a host that keeps a
    sortable text (a time-ordered id, say) in a label and pages newest
    first would otherwise read every record and sort them itself.
    ``StoreCapabilities.list_by_label`` falls back to exactly that, so a
    store without it lists the same pages, only slower.
    """

    def list_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        """Return one page of the metadata of records carrying ``label``, all filters applied.

        The order is total: integer values before text values, integers
        numerically, text in code-point (UTF-8 byte) order with no
        collation, ties on the key digest; ``descending`` reverses the whole
        key, ties included. Records without the label are left out. The
        cursor names the last item's place (value and key digest), so paging
        visits every record present throughout once, in order, while others
        are written. ``limit`` is capped at ``MAX_LIST_LIMIT``.

        Raises:
            InvalidInput: a malformed cursor, a cursor issued for another
                label or direction (or by ``list``), a limit below 1, or
                a label name that is not one.

        """
        ...


@runtime_checkable
class LabelLoad(Protocol):
    """Optional, speed: the first records of a label listing, payloads included, in one call.

    A reader after the newest record by a label (a thread's newest
    checkpoint, say) would otherwise list one item and then load it: two
    round trips, and the record's metadata decoded twice.
    ``StoreCapabilities.load_by_label`` falls back to exactly that.
    """

    def load_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> list[StoredRecord]:
        """Return the records ``list_by_label`` lists first, in its order, each as ``load`` does.

        The same records as the first page of ``list_by_label`` with the
        same arguments and no cursor, read at one instant; ``limit`` is
        capped at ``MAX_LIST_LIMIT``.

        Raises:
            InvalidInput: any argument ``list_by_label`` refuses.

        """
        ...


@runtime_checkable
class BatchLoad(Protocol):
    """Optional, speed: load many records of one namespace in one round trip.

    ``StoreCapabilities.load_many`` falls back to one ``load`` per name.
    """

    def load_many(self, namespace: str, key_digests: Sequence[str]) -> dict[str, StoredRecord]:
        """Return the stored records among ``key_digests``, by key digest.

        Absent records are left out; names may repeat.

        Raises:
            InvalidInput: a name that is not text, or more than ``MAX_LOAD_BATCH`` names.

        """
        ...


@runtime_checkable
class StoreStats(Protocol):
    """Optional, maintenance tier: counts an operator (or key policy) needs without payloads."""

    def has_records(self) -> bool:
        """Return whether any record or ledger event exists; key policy refuses a new key if so.

        Ledger events count: their keyed digests (event keys, deciders) were
        made under the store's key and would mean nothing under a new one.
        """
        ...

    def namespace_counts(self) -> Mapping[str, int]:
        """Return the number of records per namespace (namespaces with none omitted)."""
        ...

    def key_id_counts(self) -> Mapping[str, int]:
        """Return the number of records sealed under each key id."""
        ...


@runtime_checkable
class SealCounter(Protocol):
    """Optional, maintenance tier: a durable count of seals per key id, for the nonce budget.

    AES-GCM with random 96-bit nonces is safe for at most 2^32 seals under
    one key, counted across every process and host sharing the store, so
    the count lives with the data. Like a database sequence, a reservation
    is its own small transaction: durable when it returns, and never undone
    by a unit of work that fails later.
    """

    def reserve_seals(self, key_id: str, count: int) -> int:
        """Add ``count`` to the counter of ``key_id`` and return the new total.

        The total is durable (synced, where the backend syncs) before this
        returns; concurrent reservations from any thread, process or host
        add up exactly.

        Raises:
            StoreBusy / StoreUnavailable: the backend could not be written.

        """
        ...

    def seal_counts(self) -> Mapping[str, int]:
        """Return the reserved total per key id; ids never reserved are omitted."""
        ...


@runtime_checkable
class StreamCatalog(Protocol):
    """Optional, durable-store tier: list the ledger streams, so an audit can verify every one."""

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> list[str]:
        """Return up to ``limit`` names of streams holding events, sorted, after ``after``.

        Names sort in code-point order (UTF-8 byte order); pass the last name
        of a page as ``after`` to get the next one, until a page comes back
        empty. ``limit`` is capped at ``MAX_LIST_LIMIT``.

        Raises:
            InvalidInput: a limit below 1.

        """
        ...


@runtime_checkable
class StoreFill(Protocol):
    """Optional, maintenance tier: write another store's contents, as they are, into this one.

    A move copies sealed rows byte for byte with their headers, so each
    record keeps its revision, each trimmed stream its first retained
    index, and the store its commit count and seal counts; no guarded unit
    of work can write those. What to copy and whether the copy is right is
    decided above the port.
    """

    def fill(self, contents: StoreContents) -> None:
        """Write every record, event, seal count and the epoch of ``contents`` in one transaction.

        Each stream's first retained index is the index of its first event.
        The epoch becomes the greater of the stored one and the contents',
        since nothing lowers it. The emptiness check runs inside the same
        transaction, so two fills racing for one store cannot both land.

        Raises:
            StoreNotEmpty: the store holds a record, an event or a seal
                count already. Nothing was written.

        """
        ...

    def add(self, contents: StoreContents) -> None:
        """Write ``contents`` next to what the store already holds, in one transaction.

        For a store that is not empty (one scope imported into a live
        store): no record key or stream of ``contents`` may exist yet,
        checked inside the same transaction. Each seal count of
        ``contents`` is added to the store's for that key, and the epoch
        rises by one, as for any commit.

        Raises:
            StoreNotEmpty: the store holds one of the records, or a stream
                of the same name already. Nothing was written.

        """
        ...


@runtime_checkable
class Cipher(Protocol):
    """Authenticated encryption under a key ring; keys are chosen by id, never by trial.

    The sealed wire format names the key id it was sealed with, so ``open``
    picks exactly one key. GCM is not key-committing: trying keys in turn
    could "succeed" under a wrong key for a crafted ciphertext.
    """

    @property
    def primary_key_id(self) -> str:
        """Id of the key new seals use."""
        ...

    def key_ids(self) -> frozenset[str]:
        """Ids of every key this cipher can open with."""
        ...

    def seal(self, key_id: str, plaintext: bytes, associated_data: bytes) -> bytes:
        """Encrypt ``plaintext`` bound to ``associated_data`` under key ``key_id``.

        Raises:
            InvalidInput: ``key_id`` is not in the ring.

        """
        ...

    def sealed_key_id(self, sealed: bytes) -> str:
        """Return the key id named in a sealed value's wire header, without decrypting.

        Raises:
            IntegrityFailure: the value is not in a known wire format.

        """
        ...

    def open(self, sealed: bytes, associated_data: bytes) -> bytes:
        """Decrypt and authenticate a sealed value.

        Raises:
            IntegrityFailure: unknown format or key id, or any changed byte
                of header, nonce, ciphertext, tag or associated data.

        """
        ...

    def keyed_digest(self, data: bytes) -> str:
        """Return ``sha256:<hex>`` HMAC-SHA-256 of ``data`` under the integrity key.

        Used for natural keys, so the store never holds a guessable plain hash.
        """
        ...


@runtime_checkable
class StoreEpoch(Protocol):
    """Optional, durable-store tier: a durable commit count, so an older copy can be told apart."""

    def epoch(self) -> int:
        """Return the store's commit count as stored in it now.

        Every commit of a non-empty unit of work that returns leaves it
        higher than it was before that commit began; nothing lowers it (a
        commit that fails may or may not raise it). A restored older copy
        of the store therefore shows a lower count than the live one had.
        """
        ...


@runtime_checkable
class Vacuumer(Protocol):
    """Optional, maintenance tier: rebuild the store's files so no free page is left in them."""

    def vacuum(self) -> bool:
        """Rewrite the whole store compactly, then compact (see ``Compactor``).

        Costs in proportion to the whole store and blocks writers meanwhile:
        an operator's explicit step (``flowvault compact``), never a use
        case's. Returns whether the compaction after it completed.
        """
        ...


@runtime_checkable
class Compactor(Protocol):
    """Optional, maintenance tier: make deleted and overwritten bytes unrecoverable from disk."""

    def compact(self) -> bool:
        """Flush write-ahead state into the main file and drop stale copies.

        Costs in proportion to the pending log, not to the whole store, so
        use cases may call it after scrubbing or purging. Returns whether it
        completed; ``False`` means another process kept it from finishing
        and a later call will.
        """
        ...


@runtime_checkable
class DecisionSignatures(Protocol):
    """Ed25519 checks of deciders' signatures, by public keys the host registered for them.

    Kept behind a port so the application stays free of a crypto library;
    the composition root binds the ``cryptography`` implementation.
    """

    def public_key(self, pem: bytes) -> bytes:
        """Return the raw 32-byte key of a PEM (SubjectPublicKeyInfo) Ed25519 public key.

        Raises:
            InvalidInput: ``pem`` holds no Ed25519 public key.

        """
        ...

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        """Return whether ``signature`` is raw ``public_key``'s Ed25519 signature of ``message``."""
        ...


@runtime_checkable
class StoreClock(Protocol):
    """Optional: the database server's clock, one time source for every host of a shared store.

    Run leases are judged by it, so hosts whose own clocks drift apart
    still agree when a lease ran out. Without it, the host's ``Clock`` is
    used, which is right when every host of the store is one machine.
    """

    def store_now(self) -> datetime:
        """Return the server's current time, timezone-aware UTC, read in a statement of its own."""
        ...


@runtime_checkable
class RecordLock(Protocol):
    """Optional, contention: hold one record exclusively while a read-modify-write runs.

    Eight writers retrying one PostgreSQL record blind spend most of their
    round trips on races they lose; waiting in a queue for the record costs
    one. The lock is advisory and only spares wasted work: every write is
    still guarded by its compare-and-swap, so a writer that does not take
    the lock, or a lock lost with its connection, can never lose an update.
    """

    def record_locked(self, namespace: str, key_digest: str) -> AbstractContextManager[None]:
        """Return a context that holds the record's lock while it runs.

        Entering waits while any other holder, in this or another process
        or host, has the same record's lock; leaving (by return or by
        exception) releases it. The record need not exist. Every call the
        entering thread makes on this store inside the context works as
        outside it, even with a single pooled connection. A thread already
        holding a lock of this store takes no second one: the inner context
        runs under the outer lock, so no two holders wait on each other.

        Raises:
            StoreBusy: the lock was not free within the store's lock timeout.

        """
        ...
