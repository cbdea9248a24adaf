"""Audit ledger events and verification of their hash chain.

Every event commits, through ``event_hash``, to all of its fields including
the hash of the event before it, so editing, dropping, reordering or forking
any stored event is detectable by replaying the chain from a trusted point.
That plain chain needs no key, so anyone can verify it, and anyone who can
write the store can also recompute it. ``chain_mac`` closes that gap: an
HMAC-SHA-256 under the integrity key over the event's hash, which links it
to every event before it, so only a key holder can extend or rewrite the
chain. The application computes and checks it; the domain only carries it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

import pydantic
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationInfo,
)

from flowvault.domain._canonical import (
    MAX_SAFE_INTEGER,
    JsonValue,
    canonical_json,
    content_hash,
    digest_bytes,
    parse_canonical,
    quote_string,
)
from flowvault.domain._envelope import DIGEST_PATTERN, Digest, UtcDatetime, format_instant
from flowvault.domain._errors import IntegrityFailure, InvalidInput
from flowvault.domain._values import ValueModel

GENESIS_HASH = "sha256:" + "0" * 64
"""The ``previous_hash`` of the event at index 0."""

EVENT_FORMAT_VERSION = 1
"""Bound into every hashed body as ``"v"``; bump it when the body changes."""

MAX_NAME_LENGTH = 200
"""Longest stream name, state name or event key."""

EVENT_TYPE_PATTERN = r"^[a-z][a-z0-9_.-]{0,99}$"
"""Event types are short dotted lowercase names such as ``workflow.created``."""


def _check_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode") from None
    return value


_RESTORED_PAYLOAD = "flowvault.restored_payload"
"""Validation context key under which ``LedgerEvent.restore`` names the payload it parsed."""


def _copy_json(value: object, info: ValidationInfo) -> JsonValue:
    """Check the payload and keep a private copy, so a frozen event stays frozen.

    The copy is parsed back from the canonical text just produced, which is
    inside the profile by construction, so the plain parser suffices. A
    payload that ``restore`` has just parsed strictly is already checked and
    owned by no one else, so that very object is kept as it is.
    """
    if info.context is not None and info.context.get(_RESTORED_PAYLOAD) is value:
        return value  # type: ignore[no-any-return]  # restore parsed it
    try:
        copied: JsonValue = json.loads(canonical_json(value))
    except InvalidInput as exc:
        raise ValueError(exc.message) from None
    return copied


_Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH),
    AfterValidator(_check_unicode),
]
_Payload = Annotated[pydantic.JsonValue, PlainValidator(_copy_json)]
"""Pydantic's own alias, because it cannot build a schema from the recursive ``JsonValue``."""


def _quoted_or_null(text: str | None) -> str:
    return "null" if text is None else quote_string(text)


class LedgerEvent(ValueModel):
    """One entry of an audit stream, chained by hash to the entry before it.

    An event built by ``create`` or rebuilt by ``restore`` keeps, in a slot
    outside its fields, its payload and that payload's canonical text (the
    encoding ``create`` made once, or the stored text ``restore`` parsed),
    so its hash, and the row a store writes, are taken from that text
    instead of a fresh encoding. A slot is not compared or dumped, and a
    copy keeps it only through ``with_chain_mac``, which leaves the payload
    as it is: any other copy, changed or not, is encoded from its fields again.
    The payload is the event's own copy; changing it in place is outside
    the frozen model's contract, and the kept text, hash and row stay as built.
    """

    __slots__ = ("_stored_payload",)

    model_config = ConfigDict(frozen=True, extra="forbid")

    stream: _Name
    index: int = Field(ge=0, le=MAX_SAFE_INTEGER, strict=True)
    type: str = Field(pattern=EVENT_TYPE_PATTERN)
    from_state: _Name | None = None
    to_state: _Name | None = None
    occurred_at: UtcDatetime
    payload: _Payload
    previous_hash: Digest
    event_hash: Digest
    event_key: _Name | None = None
    chain_mac: Digest | None = None
    """Keyed MAC over ``event_hash``; outside the hashed body, ``None`` before it is keyed."""

    @classmethod
    def create(
        cls,
        *,
        stream: str,
        index: int,
        type: str,
        occurred_at: datetime,
        payload: JsonValue,
        previous_hash: str,
        from_state: str | None = None,
        to_state: str | None = None,
        event_key: str | None = None,
    ) -> Self:
        """Build a validated event and seal it with its ``event_hash``.

        ``payload`` must already have been through ``sanitise_payload``; the
        domain cannot tell a secret from data, only the sanitiser's key rules
        can. Invalid fields raise ``InvalidInput``.
        """
        try:
            text: str | None = canonical_json(payload)
        except InvalidInput:
            text = None  # the validator below names the payload among the fields at fault
        copied = None if text is None else json.loads(text)
        fields = {
            "stream": stream,
            "index": index,
            "type": type,
            "from_state": from_state,
            "to_state": to_state,
            "occurred_at": occurred_at,
            "payload": payload if text is None else copied,
            "previous_hash": previous_hash,
            "event_hash": GENESIS_HASH,
            "event_key": event_key,
        }
        draft = cls.model_validate(fields, context={_RESTORED_PAYLOAD: copied})
        if text is None:  # pragma: no cover - the validator refuses what the encoder refused
            raise InvalidInput("invalid ledger event: payload", fields="payload")
        object.__setattr__(draft, "_stored_payload", (copied, text))
        return draft._copy_keeping_text({"event_hash": draft.computed_hash()})

    @classmethod
    def restore(
        cls,
        *,
        stream: object,
        index: object,
        type: object,
        from_state: object,
        to_state: object,
        occurred_at: object,
        payload_text: object,
        previous_hash: object,
        event_hash: object,
        event_key: object,
        chain_mac: object = None,
    ) -> Self:
        """Rebuild a stored event from its columns exactly as stored, hash and MAC included.

        The payload is parsed strictly from its stored text, and that parse is
        its only copy. The text must be the payload's canonical encoding, as
        every writer stores it, so the event can be hashed as that very text:
        anything else (whitespace, key order, another spelling of a number)
        was not written by flowvault. Nothing is rehashed: ``verify_chain``
        sees any edit. Raises ``InvalidInput`` for a malformed or
        non-canonical payload or any other malformed column.
        """
        if not isinstance(payload_text, str):
            raise InvalidInput("a stored event payload must be text")
        payload = parse_canonical(payload_text)
        fields = {
            "stream": stream,
            "index": index,
            "type": type,
            "from_state": from_state,
            "to_state": to_state,
            "occurred_at": occurred_at,
            "payload": payload,
            "previous_hash": previous_hash,
            "event_hash": event_hash,
            "event_key": event_key,
            "chain_mac": chain_mac,
        }
        event = cls.model_validate(fields, context={_RESTORED_PAYLOAD: payload})
        object.__setattr__(event, "_stored_payload", (payload, payload_text))
        return event

    def _stored_text(self) -> str | None:
        """Return the canonical text the payload was restored from, while it is still the payload.

        ``None`` for an event built any other way, or whose payload object
        was replaced since.
        """
        stored: tuple[JsonValue, str] | None = getattr(self, "_stored_payload", None)
        if stored is None or stored[0] is not self.payload:
            return None
        return stored[1]

    def payload_text(self) -> str:
        """Return the payload's canonical text, as stores keep it: the kept text if there is one."""
        stored = self._stored_text()
        return canonical_json(self.payload) if stored is None else stored

    def with_chain_mac(self, chain_mac: str) -> Self:
        """Return this event carrying ``chain_mac``; the MAC is not hashed, so the text is kept."""
        return self._copy_keeping_text({"chain_mac": chain_mac})

    def _copy_keeping_text(self, update: dict[str, str]) -> Self:
        """Return a copy with ``update`` (fields other than the payload), its text kept."""
        event = self.model_copy(update=update)
        stored = getattr(self, "_stored_payload", None)
        if stored is not None and stored[0] is event.payload:
            object.__setattr__(event, "_stored_payload", stored)
        return event

    def body(self) -> dict[str, JsonValue]:
        """Return exactly what ``event_hash`` commits to: every field but it and the MAC."""
        return {
            "v": EVENT_FORMAT_VERSION,
            "stream": self.stream,
            "index": self.index,
            "type": self.type,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "occurred_at": format_instant(self.occurred_at),
            "payload": self.payload,
            "previous_hash": self.previous_hash,
            "event_key": self.event_key,
        }

    def computed_hash(self) -> str:
        """Recompute ``event_hash`` from the content; ``InvalidInput`` if it is malformed."""
        stored = self._stored_text()
        if stored is None:
            return content_hash(self.body())
        return digest_bytes(self._canonical_body(stored).encode("utf-8"))

    def _canonical_body(self, payload_text: str) -> str:
        """Return ``canonical_json(self.body())`` put together around canonical payload text.

        Keys in code-point order, as the encoder sorts them; every other
        value is a validated field, quoted as the encoder quotes it.
        """
        return (
            f'{{"event_key":{_quoted_or_null(self.event_key)}'
            f',"from_state":{_quoted_or_null(self.from_state)}'
            f',"index":{self.index}'
            f',"occurred_at":{quote_string(format_instant(self.occurred_at))}'
            f',"payload":{payload_text}'
            f',"previous_hash":{quote_string(self.previous_hash)}'
            f',"stream":{quote_string(self.stream)}'
            f',"to_state":{_quoted_or_null(self.to_state)}'
            f',"type":{quote_string(self.type)}'
            f',"v":{EVENT_FORMAT_VERSION}}}'
        )


class ChainDefect(StrEnum):
    """Why a run of ledger events is not an intact chain."""

    EDITED = "edited"
    """The event's content, or its ``event_hash``, is not what was sealed."""
    WRONG_PREVIOUS = "wrong_previous"
    """``previous_hash`` is not the preceding event's hash (or the start hash)."""
    GAP = "gap"
    """The index jumps forward: events are missing."""
    REORDERED = "reordered"
    """The index goes backwards."""
    DUPLICATE_INDEX = "duplicate_index"
    """The same event appears twice in a row."""
    FORK = "fork"
    """A different event reuses the previous event's index."""
    WRONG_STREAM = "wrong_stream"
    """The event belongs to another stream than the first event."""
    FORGED = "forged"
    """The event's ``chain_mac`` does not verify under the integrity key."""
    UNKEYED = "unkeyed"
    """The event has no ``chain_mac`` and no keyed event of its stream vouches for it."""
    TRUNCATED = "truncated"
    """The stream's retained prefix is missing and no trim event of the stream accounts for it."""


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """The outcome of verifying a run of ledger events.

    ``checked`` counts the events that verified cleanly, so the first
    ``checked`` events are trustworthy even when ``ok`` is false. The
    offending event is named twice: ``first_bad_position`` is its 0-based
    position in the sequence given, ``first_bad_index`` its own ``index``
    field (``None`` if that field is itself malformed). ``tip_hash`` and
    ``next_index`` are what the next page must chain onto: the last clean
    event's hash and index plus one, or the starting values if none was.
    """

    ok: bool
    checked: int
    tip_hash: str
    next_index: int
    first_bad_position: int | None = None
    first_bad_index: int | None = None
    defect: ChainDefect | None = None
    reason: str | None = None

    def raise_for_defect(self) -> None:
        """Raise ``IntegrityFailure`` carrying the defect, or return if the chain is intact."""
        if self.ok or self.defect is None:
            return
        raise IntegrityFailure(
            f"ledger chain broken at position {self.first_bad_position}: {self.reason}",
            position=self.first_bad_position,
            index=self.first_bad_index,
            defect=self.defect.value,
            checked=self.checked,
        )


@dataclass(frozen=True, slots=True)
class _Cursor:
    """What verification remembers of the chain so far: O(1) whatever its length."""

    tip_hash: str
    next_index: int
    stream: str | None = None


def _is_authentic(event: LedgerEvent) -> bool:
    """Revalidate as well as rehash, since ``model_copy`` can bypass validation.

    The payload is left out of the revalidation (it would only be copied):
    hashing it checks it against the JSON profile all the same. An event
    as ``restore`` built it was validated there, and no copy keeps its
    stored text, so it is only rehashed, over that text.
    """
    if event._stored_text() is not None:
        try:
            return event.computed_hash() == event.event_hash
        except InvalidInput:
            return False
    try:
        fields = {**event.__dict__, "payload": None}
        LedgerEvent.model_validate(fields, context={_RESTORED_PAYLOAD: None})
        return event.computed_hash() == event.event_hash
    except InvalidInput:
        return False


def _index_defect(event: LedgerEvent, cursor: _Cursor) -> tuple[ChainDefect, str] | None:
    expected = cursor.next_index
    if cursor.stream is not None and event.index == expected - 1:
        if event.event_hash == cursor.tip_hash:
            return ChainDefect.DUPLICATE_INDEX, f"index {event.index} repeats the previous event"
        return ChainDefect.FORK, f"index {event.index} is reused by a different event"
    if event.index > expected:
        return ChainDefect.GAP, f"expected index {expected}, found {event.index}"
    if event.index < expected:
        return ChainDefect.REORDERED, f"expected index {expected}, found {event.index}"
    return None


def _defect(event: LedgerEvent, cursor: _Cursor) -> tuple[ChainDefect, str] | None:
    """Check one event against the chain so far, in the order ``verify_chain`` documents."""
    if not _is_authentic(event):
        return ChainDefect.EDITED, "event is malformed or does not match its event_hash"
    if cursor.stream is not None and event.stream != cursor.stream:
        return ChainDefect.WRONG_STREAM, "event belongs to another stream than the first event"
    index_defect = _index_defect(event, cursor)
    if index_defect is not None:
        return index_defect
    if event.previous_hash != cursor.tip_hash:
        return ChainDefect.WRONG_PREVIOUS, "previous_hash does not match the preceding hash"
    return None


def _check_start(start_index: int, previous_hash: str) -> None:
    """Refuse a starting point no genuine chain could have."""
    if type(start_index) is not int or not 0 <= start_index <= MAX_SAFE_INTEGER:
        raise InvalidInput(f"start_index must be an integer within 0..{MAX_SAFE_INTEGER}")
    if not isinstance(previous_hash, str) or not DIGEST_PATTERN.fullmatch(previous_hash):
        raise InvalidInput("previous_hash must be sha256:<64 lowercase hex>")
    if (start_index == 0) != (previous_hash == GENESIS_HASH):
        raise InvalidInput("previous_hash must be GENESIS_HASH exactly when start_index is 0")


def _index_or_none(event: LedgerEvent) -> int | None:
    index: object = event.index
    return index if type(index) is int else None


def verify_chain(
    events: Iterable[LedgerEvent],
    *,
    start_index: int = 0,
    previous_hash: str = GENESIS_HASH,
) -> ChainVerdict:
    """Verify that ``events`` form an intact chain and report the first defect.

    Streams in O(1) memory, so ``events`` may be a lazy iterator over a whole
    stream. To verify a page that starts mid-stream, pass the index of its
    first event and the ``event_hash`` of the event before it (for example a
    previous verdict's ``next_index`` and ``tip_hash``). An empty sequence is
    intact. Each event is checked in this order, stopping at the first defect:

    1. EDITED: the event must be well-formed and match its own hash; the
       later checks trust its fields, so this comes first.
    2. WRONG_STREAM: its stream must be the first event's.
    3. DUPLICATE_INDEX (same hash) or FORK (other hash) when its index
       repeats the previous event's; otherwise GAP when the index is above
       the expected one, REORDERED when below.
    4. WRONG_PREVIOUS: ``previous_hash`` must equal the previous event's
       ``event_hash``, or the given ``previous_hash`` for the first event.

    So two swapped events show as a GAP where the later one arrives early,
    and an event edited then rehashed shows as WRONG_PREVIOUS on its
    successor. Rewriting the last event cannot be seen from the chain
    alone: compare ``tip_hash`` with a separately kept tip.
    """
    _check_start(start_index, previous_hash)
    cursor = _Cursor(tip_hash=previous_hash, next_index=start_index)
    checked = 0
    for position, event in enumerate(events):
        found = _defect(event, cursor)
        if found is not None:
            defect, reason = found
            return ChainVerdict(
                ok=False,
                checked=checked,
                tip_hash=cursor.tip_hash,
                next_index=cursor.next_index,
                first_bad_position=position,
                first_bad_index=_index_or_none(event),
                defect=defect,
                reason=reason,
            )
        cursor = _Cursor(tip_hash=event.event_hash, next_index=event.index + 1, stream=event.stream)
        checked += 1
    return ChainVerdict(
        ok=True, checked=checked, tip_hash=cursor.tip_hash, next_index=cursor.next_index
    )


__all__ = [
    "EVENT_FORMAT_VERSION",
    "EVENT_TYPE_PATTERN",
    "GENESIS_HASH",
    "MAX_NAME_LENGTH",
    "ChainDefect",
    "ChainVerdict",
    "LedgerEvent",
    "verify_chain",
]
