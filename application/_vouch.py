"""Vouching, under the key, for what a keyed verifier cannot prove on its own.

Two kinds of genuine stream fail every keyed verifier. One whose events host
code appended without ``keyed`` holds no keyed event, which is exactly what
a stream stripped of every MAC looks like (``unkeyed``). One whose oldest
events host code dropped with a bare trim lacks the ``ledger.trimmed`` event
that would account for them, exactly like a prefix an editor cut
(``truncated``). Only a person can tell them apart from tampering, by
comparing the stream with a copy they trust. Once they have, one keyed
``ledger.vouched`` event after the head covers every hash before it through
the chain and names the prefix it accepts as trimmed, and the stream
verifies from then on. The head hash the person compared is part of the
request, so what is vouched for is what was compared.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._records import UnitOfWork
from flowvault.application._streams import VOUCH_EVENT, keyed, read_stream
from flowvault.application._verified import StreamVerifier
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import InvalidInput, JsonValue, LedgerEvent, NotFound
from flowvault.domain._ledger import ChainDefect


@dataclass(frozen=True, slots=True)
class Unvouched:
    """A stream the key does not vouch for, as a person compares it before vouching."""

    stream: str
    events: int
    """Retained events, every one of them on the plain chain."""
    first_index: int
    """The first retained index; above 0 once a prefix was trimmed or cut."""
    removed_hash: str
    """The hash of the last event before ``first_index`` (the genesis hash when it is 0)."""
    head_index: int
    head_hash: str
    without_mac: bool
    """Whether no event carries a chain MAC (all appended without ``keyed``)."""
    cut_prefix: bool
    """Whether the events before ``first_index`` are gone with no event accounting for them."""


def inspect_unvouched(store: SecureObjectStore, stream: str, digester: KeyedDigester) -> Unvouched:
    """Return what a person must compare before vouching for ``stream``.

    Raises:
        NotFound: the stream holds no event.
        InvalidInput: the stream verifies under the key: there is nothing to
            vouch for.
        IntegrityFailure: the stream fails in a way no history explains: an
            edited, forged or missing event, or a MAC missing after a keyed
            event (MACs are stripped, never lost).

    """
    verifier = StreamVerifier(digester)
    count = 0
    keyed_events = 0
    first: LedgerEvent | None = None
    head: LedgerEvent | None = None
    for event in read_stream(store, stream):
        verifier.feed([event])
        verifier.raise_for_failure(stream)
        first = event if first is None else first
        head = event
        count += 1
        keyed_events += event.chain_mac is not None
    if first is None or head is None:
        raise NotFound("the stream holds no event")
    verifier.finish()
    failure = verifier.failure
    if failure is None:
        raise InvalidInput("the stream verifies under the key: there is nothing to vouch for")
    cut = failure.defect is ChainDefect.TRUNCATED
    return Unvouched(
        stream=stream,
        events=count,
        first_index=first.index,
        removed_hash=first.previous_hash,
        head_index=head.index,
        head_hash=head.event_hash,
        without_mac=keyed_events == 0,
        cut_prefix=cut,
    )


def vouch_unit(
    digester: KeyedDigester, seen: Unvouched, *, head_hash: str, occurred_at: datetime
) -> UnitOfWork:
    """Return the unit appending a keyed ``ledger.vouched`` event after ``seen``'s head.

    ``seen`` is what ``inspect_unvouched`` returned and ``head_hash`` the
    head the caller compared with a trusted copy. The event extends the
    head ``seen`` holds, so a write landing since makes the unit fail with
    ``RevisionConflict``.

    Raises:
        InvalidInput: ``seen``'s head is not ``head_hash``.

    """
    if not hmac.compare_digest(seen.head_hash.encode(), head_hash.encode()):
        raise InvalidInput(
            "the stream's head is not the one given: it changed, or the hash was copied "
            "wrongly; compare it with the trusted copy again"
        )
    payload: dict[str, JsonValue] = {"events": seen.events}
    if seen.cut_prefix:
        payload |= {"before_index": seen.first_index, "removed_hash": seen.removed_hash}
    event = LedgerEvent.create(
        stream=seen.stream,
        index=seen.head_index + 1,
        type=VOUCH_EVENT,
        occurred_at=occurred_at,
        payload=payload,
        previous_hash=seen.head_hash,
    )
    return UnitOfWork(appends=[keyed(event, digester)])


__all__ = ["Unvouched", "inspect_unvouched", "vouch_unit"]
