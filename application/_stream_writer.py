"""Appending a host's events to a ledger stream without computing positions by hand.

An event carries its stream index and the hash of the event before it, and
every event the services append also carries its chain MAC. A host that
builds events itself must read the head, chain on it, key the event and,
when another writer appended first, do it all again. ``StreamWriter`` does
that once, the way the services do it.
"""

from __future__ import annotations

from collections.abc import Sequence

from flowvault.application._backoff import (
    DEFAULT_RETRY,
    LOST,
    Lost,
    RetryPolicy,
    ledger_head_moved,
    settle,
)
from flowvault.application._records import Delete, UnitOfWork, Upsert
from flowvault.application._sealed import SealedRepository
from flowvault.application._streams import keyed, next_position
from flowvault.application.ports import Clock, SecureObjectStore
from flowvault.domain import LedgerEvent, RevisionConflict
from flowvault.domain._sanitise import sanitise_payload


class StreamWriter:
    """Appends keyed events to one ledger stream, each with the record writes it goes with."""

    def __init__(
        self,
        store: SecureObjectStore,
        repository: SealedRepository,
        clock: Clock,
        stream: str,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self._store = store
        self._repository = repository
        self._clock = clock
        self._stream = stream
        self._retry = retry

    @property
    def stream(self) -> str:
        """The ledger stream this writer appends to."""
        return self._stream

    def append(
        self,
        event_type: str,
        payload: object = None,
        *,
        upserts: Sequence[Upsert] = (),
        deletes: Sequence[Delete] = (),
    ) -> LedgerEvent:
        """Append one event after the stream's head, committing ``upserts`` and ``deletes`` with it.

        The payload goes through ``sanitise_payload`` (secret-looking keys
        are redacted) and the event is keyed with its chain MAC. When
        another writer appended to the stream first, the event is rebuilt
        on the new head and committed again, under the retry policy; the
        record writes keep the revisions their guards expect, so a record
        that changed meanwhile is refused, not overwritten.

        Returns:
            The event as committed.

        Raises:
            RevisionConflict: a record guard did not hold, or the stream kept
                moving until the retry policy was spent; nothing is written.
            InvalidInput: an event type or payload the ledger refuses.

        """
        record_upserts, record_deletes = list(upserts), list(deletes)
        safe_payload = sanitise_payload({} if payload is None else payload)

        def attempt() -> LedgerEvent | Lost:
            index, previous = next_position(self._store, self._stream)
            event = keyed(
                LedgerEvent.create(
                    stream=self._stream,
                    index=index,
                    type=event_type,
                    occurred_at=self._clock.now(),
                    payload=safe_payload,
                    previous_hash=previous,
                ),
                self._repository,
            )
            unit = UnitOfWork(upserts=record_upserts, deletes=record_deletes, appends=[event])
            try:
                self._store.commit(unit)
            except RevisionConflict as conflict:
                if ledger_head_moved(conflict):
                    return LOST
                raise
            return event

        return settle(attempt, "the stream's head", policy=self._retry)
