"""How a thread's records answer to its ledger stream.

Every write of a thread (a checkpoint, a task's writes) appends one keyed
event to the thread's stream, in the same unit of work, and the rows it
writes carry that event's index in their sealed header. Deletions made
through the saver append an event too, naming what they delete by rule
(the whole thread, everything but the kept checkpoints, some runs), not by
row. So the stream alone says which rows must exist and which are gone,
and a read checks the rows against it:

- a row named by a later event, or removed by a later deletion, was put
  back from an older copy (replayed);
- a checkpoint or task writes the stream says were written, and not
  deleted since, but whose row is missing, were deleted outside flowvault.

Only events carrying the chain MAC count, and the events read are verified
as a chain, so someone without the key cannot add an event that excuses a
deletion. A tail of the stream cut together with its rows is what the
store's high-water mark is for (``Runtime.mark``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from flowvault.application import KeyedDigester, SecureObjectStore, verified_page
from flowvault.domain import IntegrityFailure, JsonValue, LedgerEvent

CHECKPOINT_EVENT: Final = "langgraph.checkpoint"
"""A checkpoint row written: ``records`` names it; ``ns``, ``cid`` and ``run`` say which."""
WRITES_EVENT: Final = "langgraph.writes"
"""A checkpoint's task writes written: ``records`` names the row; ``ns`` and ``cid`` whose."""
THREAD_DELETED_EVENT: Final = "langgraph.thread_deleted"
"""Every row of the thread written before this event is gone."""
PRUNED_EVENT: Final = "langgraph.pruned"
"""Every checkpoint (and its writes) written before this event is gone except ``kept``."""
RUNS_DELETED_EVENT: Final = "langgraph.runs_deleted"
"""Every checkpoint of the ``runs`` named (and its writes) written before this event is gone."""

_PAGE: Final = 200


@dataclass(frozen=True, slots=True)
class RowIdentity:
    """What the ledger knows of one row: its digest and the checkpoint it belongs to."""

    key_digest: str
    checkpoint: str
    """Key digest of the checkpoint row the row belongs to (itself, for a checkpoint)."""
    run: str | None
    """Keyed digest of the checkpoint's run id, if it has one."""


def _texts(payload: Mapping[str, JsonValue], field: str) -> frozenset[str]:
    listed = payload.get(field)
    if not isinstance(listed, list):
        return frozenset()
    return frozenset(item for item in listed if isinstance(item, str))


def _payload(event: LedgerEvent) -> Mapping[str, JsonValue]:
    payload = event.payload
    return payload if isinstance(payload, dict) else {}


def removes(event: LedgerEvent, row: RowIdentity) -> bool:
    """Whether ``event``, a later event of the row's thread, deleted the row."""
    kind = event.type
    if kind == THREAD_DELETED_EVENT:
        return True
    payload = _payload(event)
    if kind == PRUNED_EVENT:
        return row.checkpoint not in _texts(payload, "kept")
    if kind == RUNS_DELETED_EVENT:
        return row.run is not None and row.run in _texts(payload, "runs")
    return False


def names(event: LedgerEvent, key_digest: str) -> bool:
    """Whether ``event`` wrote the row ``key_digest``."""
    if event.type not in (CHECKPOINT_EVENT, WRITES_EVENT):
        return False
    return key_digest in _texts(_payload(event), "records")


@dataclass(frozen=True, slots=True)
class Written:
    """A write the stream records: the event, and the row it names."""

    event: LedgerEvent
    row: RowIdentity
    ns: str
    cid: str


def written(event: LedgerEvent) -> Written | None:
    """Return the checkpoint or writes row ``event`` records, if it is such an event."""
    if event.type not in (CHECKPOINT_EVENT, WRITES_EVENT):
        return None
    payload = _payload(event)
    records = payload.get("records")
    ns, cid, run = payload.get("ns"), payload.get("cid"), payload.get("run")
    checkpoint = payload.get("checkpoint")
    if not (
        isinstance(records, list)
        and len(records) == 1
        and isinstance(records[0], str)
        and isinstance(ns, str)
        and isinstance(cid, str)
    ):
        raise IntegrityFailure(
            "a thread event has an unexpected shape", stream=event.stream, index=event.index
        )
    row = RowIdentity(
        key_digest=records[0],
        checkpoint=checkpoint if isinstance(checkpoint, str) else records[0],
        run=run if isinstance(run, str) else None,
    )
    return Written(event=event, row=row, ns=ns, cid=cid)


class ThreadHistory:
    """The verified events of a thread's stream from one index to its head."""

    __slots__ = ("events", "head_index", "start")

    def __init__(self, start: int, events: Sequence[LedgerEvent], head_index: int | None) -> None:
        self.start = start
        self.events = tuple(events)
        self.head_index = head_index

    @classmethod
    def read(
        cls, store: SecureObjectStore, digester: KeyedDigester, stream: str, start: int
    ) -> ThreadHistory:
        """Read and verify the events of ``stream`` from index ``start`` to its head.

        Raises:
            IntegrityFailure: the events fail verification as a chain, one
                lacks its MAC, or an event inside the range is missing.

        """
        events: list[LedgerEvent] = []
        next_index: int | None = start
        while next_index is not None:
            page = verified_page(store, stream, digester, from_index=next_index, limit=_PAGE)
            if page.gap and next_index > 0:
                raise IntegrityFailure(
                    "a thread's ledger no longer holds the events its rows name: "
                    "it was cut outside flowvault",
                    stream=stream,
                    index=next_index,
                )
            events.extend(page.events)
            next_index = page.next_index
        for event in events:
            if event.chain_mac is None:
                raise IntegrityFailure(
                    "a thread event carries no MAC: it was written without the key",
                    stream=stream,
                    index=event.index,
                )
        return cls(start, events, events[-1].index if events else None)

    def after(self, index: int) -> Iterable[LedgerEvent]:
        """Yield the events with an index above ``index``."""
        return (event for event in self.events if event.index > index)

    def check_row(self, row: RowIdentity, bound: int | None, what: str) -> None:
        """Refuse a row that is not the one its stream last wrote, or that it deleted since.

        Raises:
            IntegrityFailure: the row names no event, an event the stream
                does not hold, or a later event wrote or deleted it.

        """
        if bound is None or bound < self.start:
            raise IntegrityFailure(
                f"{what} is not bound to its thread's ledger", key_digest=row.key_digest
            )
        first = next((event for event in self.events if event.index == bound), None)
        if first is None or not names(first, row.key_digest):
            raise IntegrityFailure(
                f"{what} names a ledger event its thread does not hold "
                "(a row from another copy of the store, or a cut ledger)",
                key_digest=row.key_digest,
                ledger_index=bound,
            )
        for event in self.after(bound):
            if names(event, row.key_digest) or removes(event, row):
                raise IntegrityFailure(
                    f"{what} is older than its thread's ledger: a later event wrote or "
                    "deleted it (a replayed row)",
                    key_digest=row.key_digest,
                    ledger_index=bound,
                    later=event.index,
                )

    def live_writes(self) -> list[Written]:
        """Return the writes in this range that no later event of the range deleted or rewrote.

        One pass from the head back: what a later event rewrote or deleted
        is known by the time an earlier write is reached.
        """
        found: list[Written] = []
        rewritten: set[str] = set()
        kept_sets: list[frozenset[str]] = []
        runs: set[str] = set()
        for event in reversed(self.events):
            if event.type == THREAD_DELETED_EVENT:
                break
            payload = _payload(event)
            if event.type == PRUNED_EVENT:
                kept_sets.append(_texts(payload, "kept"))
            elif event.type == RUNS_DELETED_EVENT:
                runs |= _texts(payload, "runs")
            entry = written(event)
            if entry is None:
                continue
            row = entry.row
            gone = (
                row.key_digest in rewritten
                or any(row.checkpoint not in kept for kept in kept_sets)
                or (row.run is not None and row.run in runs)
            )
            rewritten.add(row.key_digest)
            if not gone:
                found.append(entry)
        found.reverse()
        return found
