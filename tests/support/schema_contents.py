"""What a baseline store holds before a migration, and the check that it still reads back.

Both SQL backends' migration tests write these records, events, a trim and
seal reservations at the baseline, migrate, and read every one of them back
through the store, so a step that loses or garbles data fails here. The
labelled records are for the step that rebuilds the label indexes: their
label listings must return the same records before and after it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    FilterOp,
    Guard,
    LabelFilter,
    LedgerTrim,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    UnitOfWork,
    Upsert,
)
from flowvault.domain import EnvelopeHeader, LedgerEvent
from flowvault.domain._envelope import Sensitivity, natural_key_digest
from flowvault.domain._ledger import GENESIS_HASH, verify_chain

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UNICODE_NS = "工作流/ß"
AUDIT = "audit/\N{GREEK SMALL LETTER ALPHA}"
TRIM = ("orders", 2)
"""The ``orders`` stream is trimmed before index 2, so the store holds a gap."""
SEAL_COUNTS = {"k1": 192, "k2": 64}
KEYED_MAC = "sha256:" + "ab" * 32
"""The chain MAC the audit stream's last event carries; the store keeps it as given."""


def _upsert(namespace: str, key: str, payload: bytes, **fields: Any) -> Upsert:
    labels = fields.pop("labels")
    header = EnvelopeHeader(
        namespace=namespace,
        key_digest=natural_key_digest(namespace, key),
        schema_version=1,
        **fields,
    )
    return Upsert(header=header, payload=payload, expected=Guard.ANY, labels=labels)


def baseline_upserts() -> list[Upsert]:
    """Return the records a baseline store holds: labelled, linked to the ledger or not."""
    confidential, restricted = Sensitivity.CONFIDENTIAL, Sensitivity.RESTRICTED
    return [
        _upsert(
            "orders", "order-1", b"\x00sealed-order-1\xff", sensitivity=confidential,
            key_id="k1", revision=2, written_at=T0 + timedelta(seconds=1),
            labels={"status": "open", "n": 3}, ledger_index=3,
        ),
        _upsert(
            "orders", "order-2", b"sealed-order-2", sensitivity=restricted,
            key_id="k2", revision=1, written_at=T0,
            labels={"status": "closed", "n": 2**53 + 1, "big": -(2**63) + 1},
        ),
        _upsert(
            UNICODE_NS, "run-1", b"", sensitivity=Sensitivity.PUBLIC,
            key_id="k1", revision=7, written_at=T0 + timedelta(seconds=2),
            ledger_index=2**53 - 1, labels={"who": "ü😀"},
        ),
    ]  # fmt: skip


def _chain(stream: str, bodies: list[dict[str, Any]]) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    for index, body in enumerate(bodies):
        previous = events[-1].event_hash if events else GENESIS_HASH
        occurred = T0 + timedelta(minutes=index)
        events.append(
            LedgerEvent.create(
                stream=stream,
                index=index,
                occurred_at=occurred,
                previous_hash=previous,
                **body,
            )
        )
    return events


def baseline_events() -> dict[str, list[LedgerEvent]]:
    """Return every event a baseline store's streams were written with (trimmed ones too)."""
    orders = _chain("orders", [{"type": "order.changed", "payload": {"n": n}} for n in range(4)])
    created: dict[str, Any] = {
        "type": "workflow.created",
        "payload": {"who": "ops", "mixed": [1, 2.5, None, True, "ü"]},
        "to_state": "draft",
        "event_key": "create-1",
    }
    approved: dict[str, Any] = {
        "type": "workflow.approved",
        "payload": {},
        "from_state": "draft",
        "to_state": "approved",
    }
    audit = _chain(AUDIT, [created, approved])
    audit[-1] = audit[-1].with_chain_mac(KEYED_MAC)
    return {"orders": orders, AUDIT: audit}


def fill_baseline(store: Any) -> None:
    """Write the baseline contents: records, two streams, one trimmed, and seal counts."""
    events = baseline_events()
    store.commit(
        UnitOfWork(upserts=baseline_upserts(), appends=[*events["orders"], *events[AUDIT]])
    )
    store.commit(UnitOfWork(trims=[LedgerTrim(*TRIM)]))
    for key_id, count in SEAL_COUNTS.items():
        store.reserve_seals(key_id, count)


def _identity(metadata: RecordMetadata) -> tuple[str, str]:
    return metadata.namespace, metadata.key_digest


def assert_records_read_back(store: Any) -> None:
    """Every record loads, peeks and lists, in every order, with its header and payload intact."""
    upserts = baseline_upserts()
    for upsert in upserts:
        header = upsert.header
        loaded = store.load(header.namespace, header.key_digest)
        assert loaded is not None
        assert loaded.metadata == upsert.metadata
        assert loaded.payload == upsert.payload
        assert store.peek_metadata(header.namespace, header.key_digest) == upsert.metadata
    for order in Order:
        listed = [*store.list("orders", order=order).items, *store.list(UNICODE_NS).items]
        assert sorted(listed, key=_identity) == sorted(
            (upsert.metadata for upsert in upserts), key=_identity
        )
    assert dict(store.namespace_counts()) == {"orders": 2, UNICODE_NS: 1}
    assert dict(store.key_id_counts()) == {"k1": 2, "k2": 1}
    big = store.list("orders", filters=[LabelFilter("n", 2**53, FilterOp.GT)]).items
    assert [meta.labels["status"] for meta in big] == ["closed"]


def assert_ledger_reads_back(store: Any) -> None:
    """Both streams read back hash for hash and MAC for MAC, with the trimmed stream's gap."""
    events = baseline_events()
    stream, trimmed_before = TRIM
    audit = store.read_ledger(AUDIT)
    assert list(audit.events) == events[AUDIT]
    assert [event.chain_mac for event in audit.events] == [None, KEYED_MAC]
    assert verify_chain(audit.events).ok
    assert not audit.gap
    orders = store.read_ledger(stream)
    assert orders.gap
    assert list(orders.events) == events[stream][trimmed_before:]
    assert store.ledger_head(stream) == events[stream][-1]


def assert_baseline_reads_back(store: Any) -> None:
    """Check that records, streams and seal counts read back as ``fill_baseline`` wrote them."""
    assert_records_read_back(store)
    assert_ledger_reads_back(store)
    assert dict(store.seal_counts()) == SEAL_COUNTS


# -- label rows, for the migration that rebuilds the label indexes ------------------

LABELLED = "labelled"
"""The namespace of the records ``label_upserts`` writes."""


def label_upserts() -> list[Upsert]:
    """Return records labelled with text, with integers, and with one name holding both types.

    ``mixed`` is an integer on odd records and text on even ones, so a
    listing by it reads both label indexes; every fourth record has no
    ``size``.
    """
    upserts = []
    for n in range(12):
        labels: dict[str, str | int] = {
            "colour": ("red", "green", "blue")[n % 3],
            "mixed": n if n % 2 else f"m{n:02d}",
        }
        if n % 4:
            labels["size"] = n - 6
        upserts.append(
            _upsert(
                LABELLED, f"item-{n}", b"labelled-%d" % n, sensitivity=Sensitivity.INTERNAL,
                key_id="k1", revision=1, written_at=T0 + timedelta(seconds=n), labels=labels,
            )
        )  # fmt: skip
    return upserts


def assert_labelled_reads_back(store: Any) -> None:
    """Check that every ``label_upserts`` record loads with its header, labels and payload."""
    for upsert in label_upserts():
        loaded = store.load(LABELLED, upsert.header.key_digest)
        assert loaded is not None
        assert loaded.metadata == upsert.metadata
        assert loaded.payload == upsert.payload


_FILTERED: dict[str, tuple[Order, list[RecordFilter]]] = {
    "colour = red": (Order.KEY, [LabelFilter("colour", "red")]),
    "colour <> red, newest first": (
        Order.WRITTEN_AT_DESC,
        [LabelFilter("colour", "red", FilterOp.NE)],
    ),
    "colour >= green, by time": (Order.WRITTEN_AT, [LabelFilter("colour", "green", FilterOp.GE)]),
    "size < 0": (Order.KEY, [LabelFilter("size", 0, FilterOp.LT)]),
    "size >= -3 and colour = blue": (
        Order.KEY,
        [LabelFilter("size", -3, FilterOp.GE), LabelFilter("colour", "blue")],
    ),
    "mixed > 4": (Order.KEY, [LabelFilter("mixed", 4, FilterOp.GT)]),
    "mixed <= m06": (Order.KEY, [LabelFilter("mixed", "m06", FilterOp.LE)]),
}
"""``list`` with label filters of each type and several operators."""

_BY_LABEL: dict[str, tuple[str, bool, list[RecordFilter]]] = {
    "by colour": ("colour", False, []),
    "by colour, descending, blue <= colour < red": (
        "colour",
        True,
        [LabelFilter("colour", "blue", FilterOp.GE), LabelFilter("colour", "red", FilterOp.LT)],
    ),
    "by size, descending": ("size", True, []),
    "by size > -4, colour = green": (
        "size",
        False,
        [LabelFilter("size", -4, FilterOp.GT), LabelFilter("colour", "green")],
    ),
    "by mixed": ("mixed", False, []),
    "by mixed, descending": ("mixed", True, []),
}
"""``list_by_label`` over text, integers and both, with and without bounds on the label."""


def _all_pages(fetch: Callable[[str | None], RecordPage]) -> list[str]:
    """Page through a listing two records at a time, following its cursors; return key digests."""
    found: list[str] = []
    cursor = None
    while True:
        page = fetch(cursor)
        found += [meta.key_digest for meta in page.items]
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def label_listings(store: Any) -> dict[str, list[str]]:
    """Return every label listing of the ``label_upserts`` records, key digests in order."""
    listings = {
        name: _all_pages(
            lambda cursor, order=order, filters=filters: store.list(
                LABELLED, filters=filters, order=order, cursor=cursor, limit=2
            )
        )
        for name, (order, filters) in _FILTERED.items()
    }
    for name, (label, descending, filters) in _BY_LABEL.items():
        listings[name] = _all_pages(
            lambda cursor, label=label, descending=descending, filters=filters: store.list_by_label(
                LABELLED, label, descending=descending, filters=filters, cursor=cursor, limit=2
            )
        )
    return listings


def reference_label_listings() -> dict[str, list[str]]:
    """Return the label listings the reference adapter gives for the ``label_upserts`` records."""
    store = InMemorySecureObjectStore()
    store.commit(UnitOfWork(upserts=label_upserts()))
    return label_listings(store)
