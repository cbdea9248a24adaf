"""Values that cross the store port are validated before any adapter sees them."""

from __future__ import annotations

import pytest

from flowvault.application import (
    Delete,
    Guard,
    LabelFilter,
    ListCursor,
    Order,
    UnitOfWork,
    Upsert,
    effective_limit,
)
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application.testing import make_event, make_header, make_upsert
from flowvault.domain import InvalidInput
from flowvault.domain._envelope import natural_key_digest


def test_create_must_write_revision_one() -> None:
    """A must-be-absent upsert that writes another revision is refused."""
    with pytest.raises(InvalidInput):
        Upsert(header=make_header("ns", "a", revision=2), payload=b"", expected=Guard.ABSENT)


def test_exact_guard_must_write_the_next_revision() -> None:
    """An exact guard writing anything but expected + 1 is refused."""
    with pytest.raises(InvalidInput):
        Upsert(header=make_header("ns", "a", revision=5), payload=b"", expected=3)


@pytest.mark.parametrize("expected", [0, -1, True, "1"])
def test_malformed_guards_are_refused(expected: object) -> None:
    """Guards must be a positive integer or a Guard member."""
    with pytest.raises(InvalidInput):
        Delete("ns", natural_key_digest("ns", "a"), expected)  # type: ignore[arg-type]


def test_delete_cannot_expect_absence() -> None:
    """Deleting something expected to be absent is meaningless and refused."""
    with pytest.raises(InvalidInput):
        Delete("ns", natural_key_digest("ns", "a"), Guard.ABSENT)


@pytest.mark.parametrize(
    "labels",
    [
        {"Bad": "x"},
        {"ok": True},
        {"ok": 1.5},
        {"ok": "x" * 257},
        {"ok": 2**63},
        {f"l{n}": n for n in range(9)},
    ],
)
def test_labels_are_small_and_typed(labels: dict[str, object]) -> None:
    """Labels are few, short, named plainly and only strings or integers."""
    with pytest.raises(InvalidInput):
        make_upsert("ns", "a", labels=labels)  # type: ignore[arg-type]


def test_labels_are_frozen_copies() -> None:
    """Mutating the mapping passed in does not change the upsert."""
    labels = {"status": "open"}
    upsert = make_upsert("ns", "a", labels=labels)
    labels["status"] = "closed"
    assert upsert.labels["status"] == "open"
    with pytest.raises(TypeError):
        upsert.labels["status"] = "x"  # type: ignore[index]


def test_unit_touches_each_record_once() -> None:
    """A unit that writes and deletes the same record is refused."""
    upsert = make_upsert("ns", "a")
    with pytest.raises(InvalidInput):
        UnitOfWork(upserts=[upsert], deletes=[Delete("ns", upsert.header.key_digest, 1)])


def test_unit_appends_each_index_once() -> None:
    """Two appends at one stream index in one unit are refused."""
    with pytest.raises(InvalidInput):
        UnitOfWork(appends=[make_event("s", 0), make_event("s", 0, payload="other")])


def test_unit_freezes_its_sequences() -> None:
    """Lists passed to a unit are copied into tuples."""
    upserts = [make_upsert("ns", "a")]
    unit = UnitOfWork(upserts=upserts)
    upserts.append(make_upsert("ns", "b"))
    assert len(unit.upserts) == 1
    assert not unit.empty
    assert UnitOfWork().empty


def test_cursor_round_trips_and_is_order_bound() -> None:
    """A cursor decodes to its position and only for the order it was issued for."""
    cursor = ListCursor(Order.WRITTEN_AT, "sha256:" + "a" * 64, "2026-01-01T00:00:00.000000Z")
    assert ListCursor.decode(cursor.encode(), Order.WRITTEN_AT) == cursor
    with pytest.raises(InvalidInput):
        ListCursor.decode(cursor.encode(), Order.KEY)


def test_limits_are_clamped() -> None:
    """Limits above the cap are clamped; below 1 they are refused."""
    assert effective_limit(10**9) == MAX_LIST_LIMIT
    assert effective_limit(3) == 3
    with pytest.raises(InvalidInput):
        effective_limit(0)


def test_label_filter_validates_its_name() -> None:
    """A filter on a malformed label name is refused at construction."""
    with pytest.raises(InvalidInput):
        LabelFilter("Not A Label", "x")
