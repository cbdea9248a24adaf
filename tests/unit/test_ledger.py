from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowvault.domain._canonical import canonical_json, content_hash, digest_bytes
from flowvault.domain._envelope import format_instant
from flowvault.domain._errors import IntegrityFailure, InvalidInput
from flowvault.domain._ledger import (
    EVENT_FORMAT_VERSION,
    GENESIS_HASH,
    ChainDefect,
    ChainVerdict,
    LedgerEvent,
    verify_chain,
)

STREAM = "workflow-7"
START = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
SENTINEL = "leak-sentinel-7f3a"
OTHER_HASH = "sha256:" + "ab" * 32


def _chain(count, *, stream=STREAM, payloads=None):
    events = []
    previous = GENESIS_HASH
    for index in range(count):
        event = LedgerEvent.create(
            stream=stream,
            index=index,
            type="workflow.stepped" if index else "workflow.created",
            occurred_at=START + timedelta(seconds=index),
            payload=payloads[index] if payloads is not None else {"step": index},
            previous_hash=previous,
            from_state=None if index == 0 else f"s{index - 1}",
            to_state=f"s{index}",
            event_key=f"key-{index}",
        )
        events.append(event)
        previous = event.event_hash
    return events


def _stored(event, **columns):
    """Rebuild ``event`` from the columns a store keeps, as the SQL adapters read them back."""
    stored = {
        "stream": event.stream,
        "index": event.index,
        "type": event.type,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "occurred_at": format_instant(event.occurred_at),
        "payload_text": canonical_json(event.payload),
        "previous_hash": event.previous_hash,
        "event_hash": event.event_hash,
        "event_key": event.event_key,
        "chain_mac": event.chain_mac,
    }
    return LedgerEvent.restore(**{**stored, **columns})


def _rehash(event):
    return event.model_copy(update={"event_hash": event.computed_hash()})


def _assert_defect(verdict, defect, position, index):
    assert not verdict.ok
    assert verdict.defect is defect
    assert verdict.first_bad_position == position
    assert verdict.first_bad_index == index
    assert verdict.checked == position
    assert verdict.reason


def test_genesis_hash_is_all_zero_digest():
    """The genesis hash is a sha256-prefixed run of 64 zeros."""
    assert GENESIS_HASH == "sha256:" + "0" * 64


def test_create_seals_the_event_with_its_hash():
    """The created event's hash is the content hash of its versioned body."""
    event = _chain(1)[0]

    assert event.event_hash == event.computed_hash() == content_hash(event.body())
    assert event.body()["v"] == EVENT_FORMAT_VERSION
    assert "event_hash" not in event.body()


def test_body_renders_occurred_at_as_utc_with_microseconds():
    """The hashed instant is fixed-width ISO-8601 UTC with microseconds."""
    event = _chain(1)[0]

    assert event.body()["occurred_at"] == "2026-01-02T03:04:05.000006Z"


def test_occurred_at_is_normalised_to_utc():
    """An aware instant in another zone is stored and hashed as UTC."""
    local = START.astimezone(timezone(timedelta(hours=5, minutes=30)))

    event = LedgerEvent.create(
        stream=STREAM,
        index=0,
        type="workflow.created",
        occurred_at=local,
        payload=None,
        previous_hash=GENESIS_HASH,
    )

    assert event.occurred_at.utcoffset() == timedelta(0)
    assert event.occurred_at == START
    assert event.body()["occurred_at"] == "2026-01-02T03:04:05.000006Z"


def test_early_years_render_at_fixed_width():
    """Years before 1000 are zero-padded, so the hash does not depend on the platform."""
    event = LedgerEvent.create(
        stream=STREAM,
        index=0,
        type="workflow.created",
        occurred_at=datetime(5, 6, 7, tzinfo=UTC),
        payload=None,
        previous_hash=GENESIS_HASH,
    )

    assert event.body()["occurred_at"] == "0005-06-07T00:00:00.000000Z"


def test_create_rejects_naive_datetimes():
    """A naive occurred_at is refused with InvalidInput."""
    with pytest.raises(InvalidInput, match="occurred_at"):
        LedgerEvent.create(
            stream=STREAM,
            index=0,
            type="workflow.created",
            occurred_at=datetime(2026, 1, 2, 3, 4, 5),
            payload=None,
            previous_hash=GENESIS_HASH,
        )


def test_direct_validation_rejects_naive_datetimes():
    """Loading an event with a naive occurred_at is invalid input."""
    fields = _chain(1)[0].model_dump()
    fields["occurred_at"] = datetime(2026, 1, 2, 3, 4, 5)

    with pytest.raises(InvalidInput):
        LedgerEvent.model_validate(fields)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", ""),
        ("stream", "s" * 201),
        ("index", -1),
        ("index", 2**53),
        ("index", "3"),
        ("type", "Workflow.Created"),
        ("type", "9lives"),
        ("previous_hash", "sha256:xyz"),
        ("payload", {"ratio": math.nan}),
        ("event_key", "k" * 201),
        ("to_state", ""),
    ],
)
def test_create_rejects_invalid_fields(field, value):
    """Each field's rule is enforced and reported by field name."""
    fields = {
        "stream": STREAM,
        "index": 0,
        "type": "workflow.created",
        "occurred_at": START,
        "payload": None,
        "previous_hash": GENESIS_HASH,
        field: value,
    }

    with pytest.raises(InvalidInput) as caught:
        LedgerEvent.create(**fields)

    assert caught.value.details["fields"] == field


def test_invalid_input_messages_never_echo_values():
    """A rejected event's error names fields and rules but not the values given."""
    with pytest.raises(InvalidInput) as caught:
        LedgerEvent.create(
            stream=SENTINEL * 20,
            index=0,
            type=SENTINEL,
            occurred_at=START,
            payload={"note": SENTINEL, "bad": math.inf},
            previous_hash=SENTINEL,
        )

    assert SENTINEL not in str(caught.value)
    assert SENTINEL not in repr(caught.value.details)


def test_extra_fields_are_forbidden():
    """Unknown fields are refused when loading an event."""
    fields = _chain(1)[0].model_dump()
    fields["extra"] = 1

    with pytest.raises(InvalidInput):
        LedgerEvent.model_validate(fields)


def test_events_are_frozen():
    """Assigning to a field of an event fails."""
    event = _chain(1)[0]

    with pytest.raises(InvalidInput):
        event.index = 5


def test_payload_is_copied_on_creation():
    """Mutating the caller's payload afterwards does not change the event."""
    payload = {"items": [1, 2]}
    event = LedgerEvent.create(
        stream=STREAM,
        index=0,
        type="workflow.created",
        occurred_at=START,
        payload=payload,
        previous_hash=GENESIS_HASH,
    )

    payload["items"].append(3)

    assert event.payload == {"items": [1, 2]}
    assert verify_chain([event]).ok


def test_model_dump_round_trips():
    """An event dumped to JSON and loaded back is equal and still verifies."""
    events = _chain(3)

    loaded = [LedgerEvent.model_validate_json(event.model_dump_json()) for event in events]

    assert loaded == events
    assert verify_chain(loaded).ok


def test_valid_chain_verifies():
    """A chain built in order verifies and reports its tip."""
    events = _chain(5)

    verdict = verify_chain(events)

    assert verdict == ChainVerdict(ok=True, checked=5, tip_hash=events[-1].event_hash, next_index=5)


def test_empty_sequence_verifies():
    """No events is an intact chain that leaves the starting point unchanged."""
    verdict = verify_chain([])

    assert verdict.ok
    assert verdict.checked == 0
    assert verdict.tip_hash == GENESIS_HASH
    assert verdict.next_index == 0


def test_verification_streams_from_a_one_shot_iterator():
    """A generator is consumed once and verified like a list."""
    events = _chain(50)

    verdict = verify_chain(event for event in events)

    assert verdict.ok
    assert verdict.checked == 50


def test_edited_payload_is_reported_as_edited():
    """A payload changed without rehashing is EDITED at that event."""
    events = _chain(5)
    events[2] = events[2].model_copy(update={"payload": {"step": 99}})

    _assert_defect(verify_chain(events), ChainDefect.EDITED, position=2, index=2)


def test_edited_event_hash_is_reported_as_edited():
    """A replaced event_hash no longer matches the content: EDITED."""
    events = _chain(4)
    events[1] = events[1].model_copy(update={"event_hash": OTHER_HASH})

    _assert_defect(verify_chain(events), ChainDefect.EDITED, position=1, index=1)


@pytest.mark.parametrize(
    "update",
    [
        {"index": -1},
        {"index": "two"},
        {"occurred_at": datetime(2026, 1, 2)},
        {"occurred_at": "yesterday"},
        {"payload": {"ratio": math.nan}},
        {"type": "NOT VALID"},
        {"previous_hash": "nonsense"},
    ],
)
def test_malformed_fields_are_reported_as_edited(update):
    """Fields made invalid by bypassing validation are EDITED, not a crash."""
    events = _chain(3)
    events[1] = events[1].model_copy(update=update)

    verdict = verify_chain(events)

    assert verdict.defect is ChainDefect.EDITED
    assert verdict.first_bad_position == 1


def test_malformed_index_is_reported_as_none():
    """An index that is not an integer is reported as None, not echoed."""
    events = _chain(2)
    events[1] = events[1].model_copy(update={"index": "two"})

    assert verify_chain(events).first_bad_index is None


def test_swapped_events_report_a_gap_first():
    """Swapping two events is first seen as a GAP where the later one arrives early.

    Verification streams and checks the index before the link, so at
    position 2 it finds index 3 where 2 was due; the move backwards that
    follows is never reached because verification stops at the first defect.
    """
    events = _chain(5)
    events[2], events[3] = events[3], events[2]

    _assert_defect(verify_chain(events), ChainDefect.GAP, position=2, index=3)


def test_index_going_backwards_is_reordered():
    """An index lower than its predecessor's is REORDERED."""
    events = _chain(4)
    replayed = [*events[:3], events[1]]

    _assert_defect(verify_chain(replayed), ChainDefect.REORDERED, position=3, index=1)


def test_dropped_event_is_a_gap():
    """A missing event makes the next one a GAP."""
    events = _chain(5)
    del events[2]

    _assert_defect(verify_chain(events), ChainDefect.GAP, position=2, index=3)


def test_missing_head_is_a_gap():
    """A chain verified from the start that lacks index 0 is a GAP at position 0."""
    events = _chain(3)

    _assert_defect(verify_chain(events[1:]), ChainDefect.GAP, position=0, index=1)


def test_rehashed_edit_is_caught_by_the_next_event():
    """An edited and rehashed event passes itself, so its successor is WRONG_PREVIOUS."""
    events = _chain(5)
    events[2] = _rehash(events[2].model_copy(update={"payload": {"step": 99}}))

    _assert_defect(verify_chain(events), ChainDefect.WRONG_PREVIOUS, position=3, index=3)


def test_rehashed_edit_of_the_tip_shows_only_in_the_tip_hash():
    """Rewriting the last event verifies, but its tip differs from the one kept aside."""
    events = _chain(4)
    kept_tip = events[-1].event_hash
    events[-1] = _rehash(events[-1].model_copy(update={"payload": {"step": 99}}))

    verdict = verify_chain(events)

    assert verdict.ok
    assert verdict.tip_hash != kept_tip


def test_same_event_twice_is_duplicate_index():
    """An identical event repeated in a row is DUPLICATE_INDEX."""
    events = _chain(4)
    repeated = [*events[:2], events[1], *events[2:]]

    _assert_defect(verify_chain(repeated), ChainDefect.DUPLICATE_INDEX, position=2, index=1)


def test_different_event_with_the_same_index_is_a_fork():
    """Two different, individually valid events at one index are a FORK."""
    events = _chain(4)
    rival = LedgerEvent.create(
        stream=STREAM,
        index=1,
        type="workflow.stepped",
        occurred_at=START,
        payload={"step": "rival"},
        previous_hash=events[0].event_hash,
    )
    forked = [*events[:2], rival, *events[2:]]

    _assert_defect(verify_chain(forked), ChainDefect.FORK, position=2, index=1)


def test_event_from_another_stream_is_wrong_stream():
    """A valid event of another stream spliced in is WRONG_STREAM."""
    events = _chain(3)
    foreign = _chain(3, stream="workflow-8")
    spliced = [events[0], foreign[1], events[2]]

    _assert_defect(verify_chain(spliced), ChainDefect.WRONG_STREAM, position=1, index=1)


def test_first_event_off_genesis_is_wrong_previous():
    """Verifying from the start, index 0 must chain onto GENESIS_HASH."""
    stray = LedgerEvent.create(
        stream=STREAM,
        index=0,
        type="workflow.created",
        occurred_at=START,
        payload=None,
        previous_hash=OTHER_HASH,
    )

    _assert_defect(verify_chain([stray]), ChainDefect.WRONG_PREVIOUS, position=0, index=0)


def test_mid_stream_page_verifies_from_its_predecessor():
    """A page starting mid-stream verifies against the hash of the event before it."""
    events = _chain(6)

    verdict = verify_chain(events[3:], start_index=3, previous_hash=events[2].event_hash)

    assert verdict.ok
    assert verdict.checked == 3
    assert verdict.next_index == 6


def test_mid_stream_page_with_wrong_previous_hash_fails():
    """A page checked against the wrong predecessor hash is WRONG_PREVIOUS at its head."""
    events = _chain(6)

    verdict = verify_chain(events[3:], start_index=3, previous_hash=events[1].event_hash)

    _assert_defect(verdict, ChainDefect.WRONG_PREVIOUS, position=0, index=3)


def test_mid_stream_page_before_its_start_index_is_reordered():
    """A page whose head lies before start_index is REORDERED."""
    events = _chain(6)

    verdict = verify_chain(events[3:], start_index=4, previous_hash=events[3].event_hash)

    _assert_defect(verdict, ChainDefect.REORDERED, position=0, index=3)


def test_pages_chain_through_the_verdict_tip():
    """A verdict's tip_hash and next_index are the starting point of the next page."""
    events = _chain(7)
    first = verify_chain(events[:4])

    second = verify_chain(events[4:], start_index=first.next_index, previous_hash=first.tip_hash)

    assert second.ok
    assert second.tip_hash == events[-1].event_hash


def test_failed_verdict_keeps_the_last_clean_tip():
    """After a defect, the tip and next index describe the last clean event."""
    events = _chain(5)
    del events[3]

    verdict = verify_chain(events)

    assert verdict.tip_hash == events[2].event_hash
    assert verdict.next_index == 3


@pytest.mark.parametrize(
    ("start_index", "previous_hash"),
    [
        (-1, GENESIS_HASH),
        (0, OTHER_HASH),
        (3, GENESIS_HASH),
        (3, "sha256:short"),
    ],
)
def test_impossible_starting_points_are_refused(start_index, previous_hash):
    """A start no genuine chain could have raises InvalidInput."""
    with pytest.raises(InvalidInput):
        verify_chain([], start_index=start_index, previous_hash=previous_hash)


def test_raise_for_defect_is_silent_for_an_intact_chain():
    """An ok verdict raises nothing."""
    verify_chain(_chain(3)).raise_for_defect()


def test_raise_for_defect_raises_integrity_failure_with_details():
    """A defect becomes IntegrityFailure carrying position, index and defect."""
    events = _chain(4)
    del events[1]

    with pytest.raises(IntegrityFailure) as caught:
        verify_chain(events).raise_for_defect()

    assert caught.value.code == "INTEGRITY_FAILURE"
    assert caught.value.details == {
        "position": 1,
        "index": 2,
        "defect": "gap",
        "checked": 1,
    }


def test_defect_reasons_never_echo_payloads_or_streams():
    """Reasons and raised messages name no payload value and no stream name."""
    events = _chain(3, payloads=[{"note": SENTINEL}] * 3, stream=SENTINEL)
    events[1] = events[1].model_copy(update={"payload": {"note": SENTINEL + "!"}})
    verdict = verify_chain(events)

    with pytest.raises(IntegrityFailure) as caught:
        verdict.raise_for_defect()

    assert SENTINEL not in (verdict.reason or "")
    assert SENTINEL not in str(caught.value)


_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=10),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=4),
    ),
    max_leaves=12,
)
_DIGESTS = st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex())
_NAMES = st.text(min_size=1, max_size=12)
_MUTATIONS = {
    "stream": _NAMES,
    "index": st.integers(min_value=0, max_value=20),
    "type": st.from_regex(r"\A[a-z][a-z0-9_.-]{0,12}\Z"),
    "from_state": st.none() | _NAMES,
    "to_state": st.none() | _NAMES,
    "occurred_at": st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7))])),
    "payload": _JSON,
    "previous_hash": _DIGESTS,
    "event_hash": _DIGESTS,
    "event_key": st.none() | _NAMES,
}


def _differs(field, old, new):
    if field == "payload":
        return canonical_json(old) != canonical_json(new)
    return old != new


@settings(deadline=None, max_examples=300)
@given(
    payloads=st.lists(_JSON, min_size=1, max_size=8),
    field=st.sampled_from(sorted(_MUTATIONS)),
    data=st.data(),
)
def test_any_single_mutation_is_detected(payloads, field, data):
    """Changing any one field of any one event breaks verification at or next to it.

    Half the chains are restored from stored columns first: a changed copy
    of a restored event must be hashed from its fields, not its stored text.
    """
    events = _chain(len(payloads), payloads=payloads)
    if data.draw(st.booleans(), label="restored"):
        events = [_stored(event) for event in events]
    assert verify_chain(events).ok
    position = data.draw(st.integers(min_value=0, max_value=len(events) - 1), label="position")
    old = getattr(events[position], field)
    new = data.draw(
        _MUTATIONS[field].filter(lambda value: _differs(field, old, value)), label="value"
    )
    events[position] = events[position].model_copy(update={field: new})

    verdict = verify_chain(events)

    assert not verdict.ok
    assert verdict.first_bad_position is not None
    assert verdict.first_bad_position <= position + 1
    assert verdict.first_bad_position == position
    assert verdict.defect is ChainDefect.EDITED


_UNICODE_NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(deadline=None, max_examples=200)
@given(
    payloads=st.lists(_JSON, min_size=1, max_size=5),
    stream=_UNICODE_NAMES,
    state=st.none() | _UNICODE_NAMES,
    event_key=st.none() | _UNICODE_NAMES,
)
def test_a_restored_event_hashes_as_its_fields_do(payloads, stream, state, event_key):
    """Hashing the stored payload text gives exactly the hash of the canonical body."""
    previous = GENESIS_HASH
    for index, payload in enumerate(payloads):
        event = LedgerEvent.create(
            stream=stream,
            index=index,
            type="workflow.stepped",
            occurred_at=START,
            payload=payload,
            previous_hash=previous,
            from_state=state,
            to_state=state,
            event_key=event_key,
        )
        restored = _stored(event)
        assert restored == event
        assert restored.computed_hash() == content_hash(restored.body()) == event.event_hash
        assert verify_chain([restored], start_index=index, previous_hash=previous).ok
        previous = event.event_hash


def _hash_over(event, payload_text):
    """Return the hash an editor would give ``event`` with its body around ``payload_text``."""
    body = canonical_json({**event.body(), "payload": "\x00"})
    return digest_bytes(body.replace('"\\u0000"', payload_text).encode("utf-8"))


@pytest.mark.parametrize(
    "payload_text",
    ['{"step":1, "z":2}', '{"z":2,"step":1}', '{"step":1,"z":2.00}', ' {"step":1,"z":2}'],
)
def test_a_payload_stored_in_other_text_is_refused(payload_text):
    """Stored payload text that is not its value's canonical encoding never verifies.

    Whether the editor kept the event hash or rehashed it over the text as
    stored, the event is refused when it is read back.
    """
    event = _chain(1, payloads=[{"step": 1, "z": 2}])[0]
    for event_hash in (event.event_hash, _hash_over(event, payload_text)):
        with pytest.raises(InvalidInput):
            _stored(event, payload_text=payload_text, event_hash=event_hash)


def test_a_restored_event_changed_by_a_copy_is_hashed_from_its_fields():
    """A copy with a new payload does not carry the text the original was read from."""
    restored = _stored(_chain(1)[0])
    changed = restored.model_copy(update={"payload": {"step": 99}})

    assert changed.computed_hash() == content_hash(changed.body()) != restored.event_hash
    assert verify_chain([changed]).defect is ChainDefect.EDITED
    assert verify_chain([restored.model_copy()]).ok


@settings(deadline=None, max_examples=200)
@given(payload=_JSON, stream=_UNICODE_NAMES, state=st.none() | _UNICODE_NAMES)
def test_a_created_event_is_hashed_and_stored_as_its_fields_encode(payload, stream, state):
    """The text ``create`` encodes once gives the hash and stored text the general encoder gives."""
    event = LedgerEvent.create(
        stream=stream,
        index=3,
        type="workflow.stepped",
        occurred_at=START,
        payload=payload,
        previous_hash=OTHER_HASH,
        from_state=state,
        to_state=state,
        event_key=state,
    )
    assert event.event_hash == content_hash(event.body())
    assert event.payload_text() == canonical_json(event.payload) == canonical_json(payload)
    maced = event.with_chain_mac(OTHER_HASH)
    assert maced.chain_mac == OTHER_HASH
    assert maced.payload_text() == event.payload_text()
    assert maced.computed_hash() == event.event_hash


def test_the_kept_text_follows_the_payload_not_the_callers_object():
    """Changing the caller's payload, or copying the event with another, never reuses stale text."""
    payload = {"step": 1, "items": [1, 2]}
    event = _chain(1, payloads=[payload])[0]
    payload["items"].append(3)
    payload["step"] = 2

    assert event.payload_text() == '{"items":[1,2],"step":1}'
    changed = event.model_copy(update={"payload": {"step": 99}})
    assert changed.payload_text() == '{"step":99}'
    assert changed.with_chain_mac(OTHER_HASH).payload_text() == '{"step":99}'
    assert verify_chain([changed]).defect is ChainDefect.EDITED
    assert verify_chain([event.with_chain_mac(OTHER_HASH)]).ok
