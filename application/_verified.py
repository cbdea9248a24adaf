"""Verifying a ledger stream under the integrity key, whole or a page at a time.

Every reader that returns ledger events goes through here, so none returns an
event the key does not vouch for. Three things are checked together, from the
first retained event on:

- the plain chain (each event's own hash, index and link to the one before);
- each event's chain MAC under the integrity key. An event without one is
  accepted only before the stream's first keyed event, and only once a keyed
  event follows it (that event's MAC covers every hash before it): a stream
  or a tail with no keyed event after it was written without the key;
- the retained prefix. A stream whose first retained event is not index 0
  must hold a ``ledger.trimmed`` event (or a ``ledger.vouched`` one) naming
  exactly that index and the hash of the last event removed; a trim writes
  one, and only the key can make it, so a prefix cut by someone else is
  ``truncated``.

State is O(1) whatever the stream's length, and a page is checked against the
event just before it, so reading a page costs what it reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._records import MAX_LIST_LIMIT, LedgerPage
from flowvault.application._streams import MAINTENANCE_EVENTS, mac_matches
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import IntegrityFailure, InvalidInput, LedgerEvent
from flowvault.domain._ledger import GENESIS_HASH, ChainDefect, verify_chain

_PAGE: Final = MAX_LIST_LIMIT


@dataclass(frozen=True, slots=True)
class ChainFailure:
    """The first place a stream fails verification, and why."""

    index: int | None
    defect: ChainDefect
    reason: str

    def error(self, stream: str) -> IntegrityFailure:
        """Return the typed error a reader raises for this failure."""
        where = "" if self.index is None else f" at index {self.index}"
        return IntegrityFailure(
            f"ledger stream fails verification{where} ({self.defect.value}): {self.reason}",
            stream=stream,
            index=self.index,
            defect=self.defect.value,
        )


def _proves_trim(event: LedgerEvent, claim: tuple[int, str]) -> bool:
    """Whether ``event`` accounts for everything before ``claim``'s index: a trim, or a vouch."""
    if event.type not in MAINTENANCE_EVENTS or not isinstance(event.payload, Mapping):
        return False
    before, removed = event.payload.get("before_index"), event.payload.get("removed_hash")
    return type(before) is int and (before, removed) == claim


def _start_of(first: LedgerEvent) -> tuple[int, str]:
    return (0, GENESIS_HASH) if first.index == 0 else (first.index, first.previous_hash)


class StreamVerifier:
    """Checks one stream's events fed to it in order; remembers O(1) of the chain.

    ``digester`` is the integrity key's holder; without it only the plain
    chain and the prefix rule are checked, which anyone who can write the
    store could satisfy by recomputing hashes (a keyless auditor's view).
    """

    __slots__ = (
        "_claim",
        "_digester",
        "_keyed_seen",
        "_tip",
        "_uncovered",
        "checked",
        "failure",
        "unkeyed",
    )

    def __init__(self, digester: KeyedDigester | None) -> None:
        self._digester = digester
        self._tip: tuple[int, str] | None = None
        self._claim: tuple[int, str] | None = None
        self._uncovered: int | None = None
        self._keyed_seen = False
        self.checked = 0
        self.unkeyed = 0
        self.failure: ChainFailure | None = None

    @property
    def pending(self) -> bool:
        """Whether what was fed still needs later events to be vouched for."""
        return self.failure is None and (self._claim is not None or self._uncovered is not None)

    def anchor(self, predecessor: LedgerEvent) -> None:
        """Start after ``predecessor``, the event just before the first one to be fed.

        The predecessor itself is checked (its hash and MAC), but nothing
        before it: a page is verified against the event before it, not
        against the whole stream again.
        """
        self._tip = (predecessor.index, predecessor.previous_hash)
        self.feed([predecessor])
        self.checked = 0

    def feed(self, events: Sequence[LedgerEvent]) -> None:
        """Check ``events``, the next ones in index order; stop at the first defect."""
        if self.failure is not None or not events:
            return
        if self._tip is None:
            self._tip = _start_of(events[0])
            if events[0].index > 0:
                self._claim = (events[0].index, events[0].previous_hash)
        try:
            verdict = verify_chain(events, start_index=self._tip[0], previous_hash=self._tip[1])
        except InvalidInput:
            reason = "the first retained event's previous_hash cannot start a chain"
            self.failure = ChainFailure(events[0].index, ChainDefect.WRONG_PREVIOUS, reason)
            return
        for event in events[: verdict.checked]:
            if not self._keyed_ok(event):
                return
            if self._claim is not None and _proves_trim(event, self._claim):
                self._claim = None
            self.checked += 1
            self._tip = (event.index + 1, event.event_hash)
        if not verdict.ok and verdict.defect is not None:
            reason = verdict.reason or verdict.defect.value
            self.failure = ChainFailure(verdict.first_bad_index, verdict.defect, reason)

    def _keyed_ok(self, event: LedgerEvent) -> bool:
        if self._digester is None:
            return True
        if event.chain_mac is None:
            if self._keyed_seen:
                reason = "event has no chain MAC although earlier events of its stream do"
                self.failure = ChainFailure(event.index, ChainDefect.UNKEYED, reason)
                return False
            self.unkeyed += 1
            if self._uncovered is None:
                self._uncovered = event.index
            return True
        if not mac_matches(event, self._digester):
            reason = (
                "event's chain MAC does not verify under this key: it was written or "
                "rewritten without the key (or the key is not this store's)"
            )
            self.failure = ChainFailure(event.index, ChainDefect.FORGED, reason)
            return False
        self._keyed_seen = True
        self._uncovered = None
        return True

    def finish(self) -> None:
        """Declare the head reached: whatever is still waiting for a later event fails."""
        if self.failure is not None:
            return
        if self._claim is not None:
            index = self._claim[0]
            reason = (
                f"the events before index {index} are missing and no ledger.trimmed event "
                "of the stream accounts for them: they were deleted outside retention"
            )
            self.failure = ChainFailure(index, ChainDefect.TRUNCATED, reason)
        elif self._uncovered is not None:
            reason = (
                "no event from here to the head carries a chain MAC: they were written or "
                "rewritten without the key (events appended without a MAC pass only once a "
                "keyed event follows them)"
            )
            self.failure = ChainFailure(self._uncovered, ChainDefect.UNKEYED, reason)

    def raise_for_failure(self, stream: str) -> None:
        """Raise ``IntegrityFailure`` naming the first defect, if there is one."""
        if self.failure is not None:
            raise self.failure.error(stream)


def _pages(store: SecureObjectStore, stream: str, from_index: int) -> Iterator[LedgerPage]:
    """Yield the pages of ``stream`` from ``from_index`` on, up to its head."""
    next_index: int | None = from_index
    while next_index is not None:
        page = store.read_ledger(stream, from_index=next_index, limit=_PAGE)
        yield page
        next_index = page.next_index


def _settle(
    store: SecureObjectStore, stream: str, verifier: StreamVerifier, next_index: int | None
) -> None:
    """Read on past a page until what it left pending is vouched for, or the head is reached."""
    if next_index is None:
        verifier.finish()
        return
    for page in _pages(store, stream, next_index):
        if not verifier.pending:
            return
        verifier.feed(page.events)
        if page.next_index is None:
            verifier.finish()


def verified_events(
    store: SecureObjectStore, stream: str, digester: KeyedDigester | None
) -> list[LedgerEvent]:
    """Return every retained event of ``stream``, oldest first, after verifying them all.

    Raises:
        IntegrityFailure: the stream fails verification (``details`` name the
            first bad index and the defect), or a stored event is malformed.

    """
    verifier = StreamVerifier(digester)
    events: list[LedgerEvent] = []
    for page in _pages(store, stream, 0):
        verifier.feed(page.events)
        verifier.raise_for_failure(stream)
        events.extend(page.events)
    verifier.finish()
    verifier.raise_for_failure(stream)
    return events


def verified_page(
    store: SecureObjectStore,
    stream: str,
    digester: KeyedDigester | None,
    *,
    from_index: int,
    limit: int,
) -> LedgerPage:
    """Return one page of ``stream`` from ``from_index``, verified against the event before it.

    ``gap`` is true when ``from_index`` lies before the first retained event;
    the page then starts there, and the trim that removed the rest must be
    on record. Costs the page, one event before it, and only when the page
    leaves something unproven (a trim, events without a MAC) the events up
    to the one that proves it.

    Raises:
        IntegrityFailure: the page, or its link to the event before it, fails.

    """
    limit = min(limit, _PAGE)
    verifier = StreamVerifier(digester)
    if from_index == 0:
        page = store.read_ledger(stream, from_index=0, limit=limit)
        events = page.events
    else:
        page = store.read_ledger(stream, from_index=from_index - 1, limit=limit + 1)
        events = page.events
        if events and not page.gap:
            if events[0].index != from_index - 1:
                missing = from_index - 1
                reason = "an event inside the retained part of the stream is missing"
                raise ChainFailure(missing, ChainDefect.GAP, reason).error(stream)
            verifier.anchor(events[0])
            events = events[1:]
        elif events:
            page = store.read_ledger(stream, from_index=from_index, limit=limit)
            events = page.events
    verifier.feed(events)
    verifier.raise_for_failure(stream)
    if verifier.pending:
        _settle(store, stream, verifier, page.next_index)
        verifier.raise_for_failure(stream)
    return LedgerPage(events=tuple(events), next_index=page.next_index, gap=page.gap)


__all__ = [
    "ChainFailure",
    "StreamVerifier",
    "verified_events",
    "verified_page",
]
