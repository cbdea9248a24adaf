"""Values that cross the store port: records, guards, units of work, pages.

Everything here is validated when it is built, above the port, so an
adapter only stores and fetches: it never decides what is a legal write.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from flowvault.domain import EnvelopeHeader, InvalidInput, LedgerEvent, PayloadTooLarge
from flowvault.domain._canonical import digest_bytes

MAX_PAYLOAD_BYTES: Final = 1024 * 1024
"""Largest sealed payload one record may hold (1 MiB)."""

MAX_LABELS: Final = 8
MAX_TAGS: Final = 32
"""Most tags one record carries."""
MAX_LABEL_TEXT: Final = 256
MAX_LIST_LIMIT: Final = 200
"""``list`` and ledger reads never return more than this many items at once."""

_LABEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_LABEL_INT_BOUND = 2**63 - 1
_TAG = re.compile(r"^sha256:[0-9a-f]{64}$")

LabelValue: TypeAlias = str | int
"""Labels are small, non-sensitive plaintext used only for filtering and ordering."""


class Guard(Enum):
    """Revision expectations that are not a specific revision number."""

    ABSENT = "absent"
    """The record must not exist (a create)."""
    ANY = "any"
    """No expectation; for upserts the new revision must still exceed the stored one."""


ExpectedRevision: TypeAlias = int | Guard
"""Either an exact stored revision or one of the ``Guard`` sentinels."""


def check_expected_revision(expected: ExpectedRevision) -> None:
    """Refuse an expectation that is neither a positive revision nor a ``Guard``."""
    if isinstance(expected, Guard):
        return
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise InvalidInput("expected revision must be a positive integer or a Guard")


def _check_labels(labels: Mapping[str, LabelValue]) -> Mapping[str, LabelValue]:
    if len(labels) > MAX_LABELS:
        raise InvalidInput(f"at most {MAX_LABELS} labels per record")
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name):
            raise InvalidInput("label names are 1..32 of [a-z0-9_], starting with a letter")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidInput(f"label {name!r} must be a string or an integer")
        if isinstance(value, int) and abs(value) > _LABEL_INT_BOUND:
            raise InvalidInput(f"label {name!r} is outside the 64-bit range")
        if isinstance(value, str) and (len(value) > MAX_LABEL_TEXT or "\x00" in value):
            raise InvalidInput(f"label {name!r} must be at most {MAX_LABEL_TEXT} characters")
    return MappingProxyType(dict(labels))


def check_tag(tag: object) -> str:
    """Refuse a tag that is not a keyed digest (``sha256:`` and 64 lowercase hex digits)."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise InvalidInput("a tag is a keyed digest: sha256: and 64 lowercase hex digits")
    return tag


def check_tags(tags: object) -> frozenset[str]:
    """Return ``tags`` as a frozen set, refusing more than ``MAX_TAGS`` or a malformed one.

    A bare string is refused rather than read as a set of characters.
    """
    if isinstance(tags, str | bytes) or not isinstance(tags, Iterable):
        raise InvalidInput("tags must be a set of keyed digests")
    checked = frozenset(check_tag(tag) for tag in tags)
    if len(checked) > MAX_TAGS:
        raise InvalidInput(f"at most {MAX_TAGS} tags per record")
    return checked


def check_label(name: object, value: object) -> None:
    """Refuse a label name or value no record could carry, with ``InvalidInput``."""
    if not isinstance(name, str):
        raise InvalidInput("label names are 1..32 of [a-z0-9_], starting with a letter")
    _check_labels({name: value})  # type: ignore[dict-item]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Everything about a stored record except its payload bytes."""

    header: EnvelopeHeader
    labels: Mapping[str, LabelValue]
    byte_length: int
    payload_digest: str
    tags: frozenset[str] = frozenset()
    """Keyed digests the record carries, for equality filters; checked when written."""

    @property
    def namespace(self) -> str:
        """Namespace of the record."""
        return self.header.namespace

    @property
    def key_digest(self) -> str:
        """Digest of the record's natural key."""
        return self.header.key_digest

    @property
    def revision(self) -> int:
        """Revision the record is stored at."""
        return self.header.revision


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as loaded: metadata plus the opaque (sealed) payload."""

    metadata: RecordMetadata
    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Upsert:
    """Write ``payload`` under ``header`` if the stored revision matches ``expected``.

    ``header.revision`` is the revision the record will have: ``1`` for
    ``Guard.ABSENT``, ``expected + 1`` for an exact guard, and anything
    greater than the stored revision for ``Guard.ANY``. The header is sealed
    into the payload above the port, so the revision is fixed before commit.
    """

    header: EnvelopeHeader
    payload: bytes = field(repr=False)
    expected: ExpectedRevision
    labels: Mapping[str, LabelValue] = field(default_factory=dict)
    replaces: str | None = None
    """For a re-seal: the payload digest of the exact row this write replaces.

    A re-seal (key rotation) rewrites the same content at the same revision
    under another key, so readers holding the revision stay valid. The
    revision alone cannot guard it: a record deleted and created again is
    back at revision 1, and re-sealing the old row over it would revive
    deleted content. The payload digest names one seal (its nonce is
    random), so the write lands only on the very row that was read.
    """
    tags: frozenset[str] = frozenset()
    """Keyed digests (``sha256:`` + 64 hex) the record carries; at most ``MAX_TAGS``.

    The caller makes each one, typically ``keyed_digest(purpose, canonical
    [key, value])``, so the store can answer "records carrying these tags"
    without ever holding the values.
    """

    @property
    def reseal(self) -> bool:
        """Whether this write re-seals a row in place (``replaces`` is set)."""
        return self.replaces is not None

    def __post_init__(self) -> None:
        if not isinstance(self.payload, bytes):
            raise InvalidInput("payload must be bytes")
        if len(self.payload) > MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(
                f"payload of {len(self.payload)} bytes exceeds {MAX_PAYLOAD_BYTES}",
                size=len(self.payload),
                limit=MAX_PAYLOAD_BYTES,
            )
        check_expected_revision(self.expected)
        if self.expected is Guard.ABSENT and self.header.revision != 1:
            raise InvalidInput("a create must write revision 1")
        if self.replaces is not None:
            if not isinstance(self.replaces, str):
                raise InvalidInput("replaces must be the payload digest of the replaced row")
            if not isinstance(self.expected, int) or self.header.revision != self.expected:
                raise InvalidInput("a reseal keeps the revision its exact guard expects")
        elif isinstance(self.expected, int) and self.header.revision != self.expected + 1:
            raise InvalidInput("an exact guard must write the next revision")
        object.__setattr__(self, "labels", _check_labels(self.labels))
        object.__setattr__(self, "tags", check_tags(self.tags))

    @property
    def metadata(self) -> RecordMetadata:
        """The metadata the record will carry once committed."""
        return RecordMetadata(
            header=self.header,
            labels=self.labels,
            byte_length=len(self.payload),
            payload_digest=digest_bytes(self.payload),
            tags=self.tags,
        )


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove a record if its stored revision matches ``expected``."""

    namespace: str
    key_digest: str
    expected: ExpectedRevision

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not isinstance(self.key_digest, str):
            raise InvalidInput("a delete names its record by a text namespace and key digest")
        check_expected_revision(self.expected)
        if self.expected is Guard.ABSENT:
            raise InvalidInput("a delete cannot expect the record to be absent")


@dataclass(frozen=True, slots=True)
class LedgerTrim:
    """Drop events of ``stream`` with an index below ``before_index``.

    The head event is never dropped, so the chain can always be continued;
    readers asking for trimmed events get a gap flag.
    """

    stream: str
    before_index: int

    def __post_init__(self) -> None:
        if not isinstance(self.stream, str):
            raise InvalidInput("a trim names its stream as text")
        if type(self.before_index) is not int or self.before_index < 0:
            raise InvalidInput("before_index must be a non-negative integer")


@dataclass(frozen=True, slots=True)
class LedgerDrop:
    """Delete every event of ``stream`` and the stream itself, if its head is at ``head_index``.

    The guard names the head the caller read, so an event appended since
    makes the whole unit fail rather than vanish unseen. Nothing stays
    behind: the stream reads as never written, and can be started again
    at index 0. A drop on the record (``drop_unit``) pairs it with a keyed
    event in another stream, which is what proves the drop was meant.
    """

    stream: str
    head_index: int

    def __post_init__(self) -> None:
        if not isinstance(self.stream, str):
            raise InvalidInput("a drop names its stream as text")
        if type(self.head_index) is not int or self.head_index < 0:
            raise InvalidInput("head_index must be a non-negative integer")


@dataclass(frozen=True, slots=True)
class UnitOfWork:
    """Writes that commit together or not at all.

    Ledger appends are guarded by their own ``index`` and ``previous_hash``:
    index ``0`` needs an empty stream and the genesis hash, index ``n`` needs
    the stream head at ``n - 1`` with exactly that hash. Several appends to
    one stream in a unit must be consecutive. A stream a unit drops it
    neither appends to nor trims: the writes apply in one order (upserts,
    deletes, appends, trims, drops), and a stream both extended and dropped
    by one unit would read as an error either way.
    """

    upserts: Sequence[Upsert] = ()
    deletes: Sequence[Delete] = ()
    appends: Sequence[LedgerEvent] = ()
    trims: Sequence[LedgerTrim] = ()
    drops: Sequence[LedgerDrop] = ()

    def __post_init__(self) -> None:
        for name in ("upserts", "deletes", "appends", "trims", "drops"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        targets = [(u.header.namespace, u.header.key_digest) for u in self.upserts]
        targets += [(d.namespace, d.key_digest) for d in self.deletes]
        if len(set(targets)) != len(targets):
            raise InvalidInput("a unit of work touches each record at most once")
        events = [(event.stream, event.index) for event in self.appends]
        if len(set(events)) != len(events):
            raise InvalidInput("a unit of work appends each ledger index at most once")
        dropped = [drop.stream for drop in self.drops]
        if len(set(dropped)) != len(dropped):
            raise InvalidInput("a unit of work drops each stream at most once")
        extended = {stream for stream, _ in events} | {trim.stream for trim in self.trims}
        if not extended.isdisjoint(dropped):
            raise InvalidInput("a unit of work may not append to or trim a stream it drops")

    @property
    def empty(self) -> bool:
        """True when committing would change nothing."""
        return not (self.upserts or self.deletes or self.appends or self.trims or self.drops)


class FilterOp(Enum):
    """Comparison operators a label filter may use."""

    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


@dataclass(frozen=True, slots=True)
class LabelFilter:
    """Keep records whose label ``name`` compares to ``value`` under ``op``.

    A record without the label never matches. Strings compare to strings
    and integers to integers; mixing them matches nothing.
    """

    name: str
    value: LabelValue
    op: FilterOp = FilterOp.EQ

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidInput("label names are 1..32 of [a-z0-9_], starting with a letter")
        _check_labels({self.name: self.value})

    def matches(self, labels: Mapping[str, LabelValue]) -> bool:
        """Evaluate the filter against one record's labels (reference semantics)."""
        if self.name not in labels:
            return False
        stored = labels[self.name]
        if isinstance(stored, str) != isinstance(self.value, str):
            return False
        return _COMPARE[self.op](stored, self.value)

    def admits(self, metadata: RecordMetadata) -> bool:
        """Evaluate the filter against one record (reference semantics)."""
        return self.matches(metadata.labels)


@dataclass(frozen=True, slots=True)
class TagFilter:
    """Keep records carrying ``tag``; several tag filters keep records carrying them all.

    Only equality: a tag is a keyed digest, so nothing else about it compares.
    """

    tag: str

    def __post_init__(self) -> None:
        check_tag(self.tag)

    def matches(self, tags: AbstractSet[str]) -> bool:
        """Evaluate the filter against one record's tags (reference semantics)."""
        return self.tag in tags

    def admits(self, metadata: RecordMetadata) -> bool:
        """Evaluate the filter against one record (reference semantics)."""
        return self.tag in metadata.tags


RecordFilter: TypeAlias = LabelFilter | TagFilter
"""What ``list`` and ``list_by_label`` take in ``filters``; all of them apply (AND)."""


def check_filters(filters: object) -> tuple[RecordFilter, ...]:
    """Return ``filters`` as a tuple, refusing anything but label and tag filters."""
    if isinstance(filters, str) or not isinstance(filters, Sequence):
        raise InvalidInput("filters must be a sequence of LabelFilter or TagFilter")
    if not all(isinstance(one, LabelFilter | TagFilter) for one in filters):
        raise InvalidInput("filters must be a sequence of LabelFilter or TagFilter")
    return tuple(filters)


def split_filters(
    filters: Sequence[RecordFilter],
) -> tuple[tuple[LabelFilter, ...], tuple[TagFilter, ...]]:
    """Return the label filters and the tag filters of ``filters``, each in their order."""
    labels = tuple(one for one in filters if isinstance(one, LabelFilter))
    tags = tuple(one for one in filters if isinstance(one, TagFilter))
    return labels, tags


_COMPARE: Mapping[FilterOp, Callable[[Any, Any], bool]] = {
    FilterOp.EQ: operator.eq,
    FilterOp.NE: operator.ne,
    FilterOp.LT: operator.lt,
    FilterOp.LE: operator.le,
    FilterOp.GT: operator.gt,
    FilterOp.GE: operator.ge,
}


class Order(Enum):
    """Orders ``list`` supports; every one is total, ending on the key digest."""

    KEY = "key"
    """By key digest ascending."""
    WRITTEN_AT = "written_at"
    """Oldest write first, ties broken by key digest."""
    WRITTEN_AT_DESC = "written_at_desc"
    """Newest write first, ties broken by key digest descending."""


@dataclass(frozen=True, slots=True)
class RecordPage:
    """One page of ``list``: metadata in order and the cursor for the next page."""

    items: tuple[RecordMetadata, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class LedgerPage:
    """One page of a ledger stream.

    ``gap`` is true when events the caller asked for were trimmed, so the
    page starts later than requested. ``next_index`` is ``None`` at the head.
    """

    events: tuple[LedgerEvent, ...]
    next_index: int | None
    gap: bool


@dataclass(frozen=True, slots=True)
class StoreContents:
    """Everything a store holds, as stored: what a move reads out of one store and into another.

    ``events`` holds each stream's retained events as one run in index
    order, so a stream trimmed before index 40 starts at 40; the streams
    follow one another. Checked when built, so an adapter's ``fill`` only
    writes.
    """

    records: Sequence[StoredRecord]
    events: Sequence[LedgerEvent]
    seal_counts: Mapping[str, int]
    epoch: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "records", tuple(self.records))
        object.__setattr__(self, "events", tuple(self.events))
        object.__setattr__(self, "seal_counts", MappingProxyType(dict(self.seal_counts)))
        addresses = {(r.metadata.namespace, r.metadata.key_digest) for r in self.records}
        if len(addresses) != len(self.records):
            raise InvalidInput("store contents hold each record once")
        if type(self.epoch) is not int or self.epoch < 0:
            raise InvalidInput("the epoch must be a non-negative integer")
        for key_id, count in self.seal_counts.items():
            if not isinstance(key_id, str) or type(count) is not int or count < 0:
                raise InvalidInput("seal counts are non-negative integers per key id")
        _check_runs(self.events)

    def unit(self) -> UnitOfWork:
        """Return the writes that, applied unguarded to an empty store, make it hold these contents.

        Records are ``Guard.ANY`` upserts at their own revisions, events
        appends, and a trim at each stream's first retained index past 0.
        Only a ``fill`` applies it, after checking the store is empty.
        """
        return UnitOfWork(
            upserts=[
                Upsert(
                    r.metadata.header,
                    r.payload,
                    Guard.ANY,
                    r.metadata.labels,
                    tags=r.metadata.tags,
                )
                for r in self.records
            ],
            appends=self.events,
            trims=[
                LedgerTrim(name, events[0].index)
                for name, events in self.streams().items()
                if events[0].index > 0
            ],
        )

    def streams(self) -> dict[str, tuple[LedgerEvent, ...]]:
        """Return each stream's retained events, by stream name."""
        runs: dict[str, list[LedgerEvent]] = {}
        for event in self.events:
            runs.setdefault(event.stream, []).append(event)
        return {name: tuple(events) for name, events in runs.items()}


def _check_runs(events: Sequence[LedgerEvent]) -> None:
    """Refuse events that are not one chained run per stream, the streams one after another."""
    seen: set[str] = set()
    previous: LedgerEvent | None = None
    for event in events:
        if previous is not None and previous.stream == event.stream:
            if event.index != previous.index + 1 or event.previous_hash != previous.event_hash:
                raise InvalidInput("a stream's events must be consecutive and chained")
        elif event.stream in seen:
            raise InvalidInput("each stream's events must be one run")
        seen.add(event.stream)
        previous = event
