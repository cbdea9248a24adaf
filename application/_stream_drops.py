"""Dropping whole ledger streams on the record: the drop, and the keyed event that proves it.

A ``LedgerDrop`` alone deletes a stream; to every reader afterwards that
looks the same as rows deleted by someone with write access to the
database but without the key. ``drop_unit`` therefore commits each drop
with a keyed ``ledger.dropped`` event in the registry stream
(``DROP_REGISTRY``) naming the stream, its last index and its last event's
hash. Only the integrity key makes that event, so the high-water mark,
which remembers every stream's size, accepts a stream gone from the store
only when the registry holds such an event for it (``proven_drops``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final, Protocol, runtime_checkable

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._records import Delete, LedgerDrop, LedgerPage, UnitOfWork, Upsert
from flowvault.application._streams import chained_event, mac_matches
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import InvalidInput, JsonValue, LedgerEvent
from flowvault.domain._sanitise import sanitise_payload

DROP_REGISTRY: Final = "flowvault/dropped"
"""The stream holding one keyed ``ledger.dropped`` event per stream dropped on the record."""

DROP_EVENT: Final = "ledger.dropped"
"""Names a dropped stream, its last index (``last_index``) and last hash (``last_hash``)."""

MAX_DROPS_PER_UNIT: Final = 200
"""Most streams one ``drop_unit`` drops: each adds a registry event to the same unit."""

_REASON: Final = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
_PAGE: Final = 200


@runtime_checkable
class LedgerReader(Protocol):
    """What ``proven_drops`` reads: one stream, a page at a time."""

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        """Return retained events of ``stream`` from ``from_index`` on."""
        ...


def drop_unit(
    store: SecureObjectStore,
    digester: KeyedDigester,
    *streams: str,
    occurred_at: datetime,
    reason: str,
    upserts: Sequence[Upsert] = (),
    deletes: Sequence[Delete] = (),
) -> UnitOfWork:
    """Return the unit that drops ``streams`` on the record, with the caller's record writes.

    Each stream's ``LedgerDrop`` names the head read now, and one keyed
    ``ledger.dropped`` event per stream is appended to ``DROP_REGISTRY``.
    ``upserts`` and ``deletes`` (the records the streams belonged to, say)
    commit in the same unit, so the streams and their records go together
    or not at all; a record whose header names an event of a dropped
    stream no longer reads as current, so delete it here. Commit the unit
    as it is: an event appended meanwhile to a dropped stream, or another
    drop recorded first, makes it fail with ``RevisionConflict`` and
    nothing is dropped; build it again to retry.
    ``reason`` is a short token (``thread_deleted``), never free text: it
    is written to the ledger in plaintext.

    Raises:
        InvalidInput: no stream, more than ``MAX_DROPS_PER_UNIT``, a stream
            named twice or holding no events, the registry itself, or a
            ``reason`` that is not a lowercase token of at most 64 characters.

    """
    if not streams or len(streams) > MAX_DROPS_PER_UNIT:
        raise InvalidInput(f"drop 1 to {MAX_DROPS_PER_UNIT} streams per unit")
    if not isinstance(reason, str) or not _REASON.fullmatch(reason):
        raise InvalidInput("a drop's reason is a lowercase token of at most 64 characters")
    if len(set(streams)) != len(streams):
        raise InvalidInput("a unit drops each stream once")
    drops: list[LedgerDrop] = []
    events: list[LedgerEvent] = []
    previous = store.ledger_head(DROP_REGISTRY)
    for stream in streams:
        if not isinstance(stream, str):
            raise InvalidInput("a drop names its stream as text")
        if stream == DROP_REGISTRY:
            raise InvalidInput("the drop registry is the proof of every drop; it is never dropped")
        head = store.ledger_head(stream)
        if head is None:
            raise InvalidInput("the stream holds no events to drop", stream=stream)
        payload: dict[str, JsonValue] = {
            "stream": stream,
            "last_index": head.index,
            "last_hash": head.event_hash,
            "reason": reason,
        }
        if sanitise_payload(payload) != payload:
            raise InvalidInput("the stream's name cannot be recorded whole", stream=stream)
        previous = chained_event(
            digester, DROP_REGISTRY, DROP_EVENT, payload, occurred_at, after=previous
        )
        events.append(previous)
        drops.append(LedgerDrop(stream, head.index))
    return UnitOfWork(upserts=upserts, deletes=deletes, appends=events, drops=drops)


def _proved(event: LedgerEvent, digester: KeyedDigester) -> tuple[str, int] | None:
    """Return the stream and last index a registry event proves dropped, if the key made it."""
    if event.stream != DROP_REGISTRY or event.type != DROP_EVENT:
        return None
    if not isinstance(event.payload, Mapping):
        return None
    stream, last = event.payload.get("stream"), event.payload.get("last_index")
    if not isinstance(stream, str) or type(last) is not int or not mac_matches(event, digester):
        return None
    try:
        authentic = event.computed_hash() == event.event_hash
    except InvalidInput:
        return None
    return (stream, last) if authentic else None


def proven_drops(store: LedgerReader, digester: KeyedDigester) -> dict[str, int]:
    """Return, per stream the registry proves dropped, the highest last index it names.

    An event counts only if its content hashes to its ``event_hash`` and
    its ``chain_mac`` verifies under the key: rows planted, edited or
    copied by someone without the key prove nothing. Registry events
    deleted make drops unproven, never the reverse.
    """
    proven: dict[str, int] = {}
    next_index: int | None = 0
    while next_index is not None:
        page = store.read_ledger(DROP_REGISTRY, from_index=next_index, limit=_PAGE)
        for event in page.events:
            found = _proved(event, digester)
            if found is not None and found[1] > proven.get(found[0], -1):
                proven[found[0]] = found[1]
        next_index = page.next_index
    return proven


__all__ = [
    "DROP_EVENT",
    "DROP_REGISTRY",
    "MAX_DROPS_PER_UNIT",
    "LedgerReader",
    "drop_unit",
    "proven_drops",
]
