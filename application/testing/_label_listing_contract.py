"""The ``LabelListing`` contract: records carrying one label, ordered by its value, paged.

Mix ``LabelListingContract`` into a store's contract test class next to
``SecureObjectStoreContract``; it reuses the same ``make_store`` hook. The
expected orders are computed here from the rule itself, not from any
adapter's code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from flowvault.application import (
    Delete,
    FilterOp,
    LabelFilter,
    LabelListing,
    RecordFilter,
    SecureObjectStore,
    StoreCapabilities,
    TagFilter,
    UnitOfWork,
)
from flowvault.application._records import MAX_LIST_LIMIT, LabelValue
from flowvault.application.testing._fakes import make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.application.testing._tags_contract import tag
from flowvault.domain import InvalidInput
from flowvault.domain._envelope import natural_key_digest

NS = "by-label"
LABEL = "cid"
BIG = 2**63 - 1

VALUES: tuple[LabelValue, ...] = (
    5, -3, BIG, -BIG, 0, 7, 7, 7, 10, 9,
    "b", "B", "a", "é", "e\u0301", "日本", "a/10", "a/2", "Z", "", "z",
    "tie", "tie", "tie", "😀", "\uff5a", "2", "10",
)  # fmt: skip
"""Label values whose right order differs from numeric-as-text, locale and UTF-16 orders.

Integers come before all text (``"10"`` and ``"2"`` are text); ``"😀"`` (past
U+FFFF) sorts after ``"\\uff5a"`` by code point, though not in UTF-16.
"""

_Rank = tuple[int, LabelValue, str]


def _digest(key: str, namespace: str = NS) -> str:
    return natural_key_digest(namespace, key)


def _rank(value: LabelValue, digest: str) -> _Rank:
    return (1 if isinstance(value, str) else 0, value, digest)


def _listing(store: SecureObjectStore) -> LabelListing:
    assert isinstance(store, LabelListing)
    return store


def _write(
    store: SecureObjectStore, values: Sequence[LabelValue] = VALUES
) -> dict[str, dict[str, LabelValue]]:
    """Store one record per value (and some without the label); return each one's labels."""
    written: dict[str, dict[str, LabelValue]] = {}
    upserts = []
    for n, value in enumerate(values):
        labels: dict[str, LabelValue] = {LABEL: value, "kind": ("even", "odd")[n % 2], "n": n}
        upserts.append(make_upsert(NS, f"v{n:03d}", labels=labels))
        written[_digest(f"v{n:03d}")] = labels
    upserts += [make_upsert(NS, f"bare{n}", labels={"kind": "even", "n": n}) for n in range(3)]
    upserts.append(make_upsert("elsewhere", "v000", labels={LABEL: "a"}))
    store.commit(UnitOfWork(upserts=upserts))
    return written


def _expected(
    written: Mapping[str, Mapping[str, LabelValue]],
    *,
    descending: bool = False,
    filters: Sequence[LabelFilter] = (),
) -> list[str]:
    ranked = sorted(
        (_rank(labels[LABEL], digest) for digest, labels in written.items()
         if LABEL in labels and all(one.matches(labels) for one in filters)),
        reverse=descending,
    )  # fmt: skip
    return [digest for _, _, digest in ranked]


def _walk(
    store: SecureObjectStore,
    limit: int,
    *,
    descending: bool = False,
    filters: Sequence[RecordFilter] = (),
    most: int = 500,
) -> list[str]:
    """Page to the end, failing instead of looping once more than ``most`` items came."""
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = _listing(store).list_by_label(
            NS, LABEL, descending=descending, filters=filters, cursor=cursor, limit=limit
        )
        assert len(page.items) <= limit
        seen.extend(meta.key_digest for meta in page.items)
        assert len(seen) <= most, "paging does not end"
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


FILTERS: tuple[tuple[LabelFilter, ...], ...] = (
    (LabelFilter(LABEL, "m", FilterOp.LT),),
    (LabelFilter(LABEL, "tie", FilterOp.LE), LabelFilter("kind", "odd")),
    (LabelFilter(LABEL, 7, FilterOp.LT),),
    (LabelFilter(LABEL, 7, FilterOp.GE),),
    (LabelFilter(LABEL, "tie"),),
    (LabelFilter(LABEL, 7, FilterOp.NE),),
    (LabelFilter(LABEL, "a", FilterOp.GT), LabelFilter(LABEL, "é", FilterOp.LT)),
    (LabelFilter("kind", "even"),),
    (LabelFilter("n", 20, FilterOp.LT), LabelFilter("kind", "odd", FilterOp.NE)),
    (LabelFilter(LABEL, "a"), LabelFilter(LABEL, 5)),
    (LabelFilter("missing", "x"),),
)
"""Bounds on the listed label itself (``before`` is ``LT``), filters on others, and both."""


TAG_FILTERS: tuple[tuple[RecordFilter, ...], ...] = (
    (TagFilter(tag(2)),),
    (TagFilter(tag(2)), TagFilter(tag(3))),
    (TagFilter(tag(3)), LabelFilter("kind", "odd")),
    (TagFilter(tag(2)), LabelFilter(LABEL, "a", FilterOp.GE)),
    (LabelFilter(LABEL, 7, FilterOp.LE), TagFilter(tag(3))),
    (TagFilter(tag(5)),),
)
"""Tags alone, together, with a filter on another label and with bounds on the listed one."""


def _write_tagged(store: SecureObjectStore) -> dict[str, tuple[dict[str, LabelValue], set[str]]]:
    """Store one record per value, tagged ``tag(2)`` and/or ``tag(3)`` by its place."""
    written: dict[str, tuple[dict[str, LabelValue], set[str]]] = {}
    upserts = []
    for n, value in enumerate(VALUES):
        labels: dict[str, LabelValue] = {LABEL: value, "kind": ("even", "odd")[n % 2]}
        tags = {tag(d) for d in (2, 3) if n % d == 0}
        upserts.append(make_upsert(NS, f"v{n:03d}", labels=labels, tags=tags))
        written[_digest(f"v{n:03d}")] = (labels, tags)
    upserts.append(make_upsert("elsewhere", "v000", labels={LABEL: "a"}, tags={tag(2)}))
    store.commit(UnitOfWork(upserts=upserts))
    return written


class LabelListingContract(StoreHarness):
    """What every ``LabelListing`` adapter must do."""

    @pytest.mark.parametrize("descending", [False, True])
    @pytest.mark.parametrize("filters", TAG_FILTERS)
    def test_tag_filters_apply_with_the_label_order(
        self, store: SecureObjectStore, descending: bool, filters: tuple[RecordFilter, ...]
    ) -> None:
        """Tag filters AND with label filters in a label listing, in its order, on every page."""
        written = _write_tagged(store)
        labels_of = {
            digest: labels
            for digest, (labels, tags) in written.items()
            if all(one.tag in tags for one in filters if isinstance(one, TagFilter))
        }
        label_filters = [one for one in filters if isinstance(one, LabelFilter)]
        expected = _expected(labels_of, descending=descending, filters=label_filters)
        listed = _listing(store).list_by_label(
            NS, LABEL, descending=descending, filters=filters, limit=200
        )
        assert [meta.key_digest for meta in listed.items] == expected
        assert all(meta.tags == frozenset(written[meta.key_digest][1]) for meta in listed.items)
        assert _walk(store, 2, descending=descending, filters=filters) == expected
        fallback = StoreCapabilities().list_by_label(
            store, NS, LABEL, descending=descending, filters=filters, limit=200
        )
        assert fallback == listed

    def test_satisfies_the_label_listing_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``LabelListing`` at runtime."""
        assert isinstance(store, LabelListing)

    @pytest.mark.parametrize("descending", [False, True])
    def test_lists_records_carrying_the_label_in_value_order(
        self, store: SecureObjectStore, descending: bool
    ) -> None:
        """Integers before text, text by code point, ties on the key digest; reversed whole.

        Records without the label, and those of another namespace, are not listed.
        """
        written = _write(store)
        page = _listing(store).list_by_label(NS, LABEL, descending=descending, limit=200)
        assert [meta.key_digest for meta in page.items] == _expected(written, descending=descending)
        assert page.next_cursor is None
        for meta in page.items:
            assert meta == store.peek_metadata(NS, meta.key_digest)

    @pytest.mark.parametrize("descending", [False, True])
    @pytest.mark.parametrize("limit", [1, 2, 3, 7])
    def test_paging_visits_every_record_once_in_order(
        self, store: SecureObjectStore, descending: bool, limit: int
    ) -> None:
        """Following the cursor visits each record once, ties split across pages included."""
        written = _write(store)
        expected = _expected(written, descending=descending)
        assert _walk(store, limit, descending=descending) == expected

    @pytest.mark.parametrize("descending", [False, True])
    @pytest.mark.parametrize("filters", FILTERS)
    def test_filters_apply_together_with_bounds_on_the_label(
        self, store: SecureObjectStore, descending: bool, filters: tuple[LabelFilter, ...]
    ) -> None:
        """Every filter applies (AND), a bound on the listed label as any other, on every page."""
        written = _write(store)
        expected = _expected(written, descending=descending, filters=filters)
        listed = _listing(store).list_by_label(
            NS, LABEL, descending=descending, filters=filters, limit=200
        )
        assert [meta.key_digest for meta in listed.items] == expected
        assert _walk(store, 2, descending=descending, filters=filters) == expected

    @pytest.mark.parametrize("descending", [False, True])
    def test_paging_neither_repeats_nor_skips_under_writes(
        self, store: SecureObjectStore, descending: bool
    ) -> None:
        """Records written and deleted between pages do not move the cursor.

        At each page break new records land tied with the page's first,
        middle and last values and past both ends of the order, and one
        record not yet visited is deleted. Every record present throughout
        is visited once, in order; a deleted one never after its delete. A
        cursor counting an offset repeats records once inserts land before it.
        """
        written = _write(store)
        original = _expected(written, descending=descending)
        deleted: set[str] = set()
        fresh = iter(range(1_000_000))
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = _listing(store).list_by_label(
                NS, LABEL, descending=descending, cursor=cursor, limit=4
            )
            for meta in page.items:
                assert meta.key_digest not in seen, "a record was visited twice"
                assert meta.key_digest not in deleted, "a deleted record was listed"
                seen.append(meta.key_digest)
            assert len(seen) <= 4 * len(original), "paging does not end"
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
            values = [page.items[n].labels[LABEL] for n in (0, len(page.items) // 2, -1)]
            values += [-BIG, BIG, "", "\U0010ffff"]
            upserts = [make_upsert(NS, f"late{next(fresh)}", labels={LABEL: v}) for v in values]
            ahead = [d for d in original if d not in seen and d not in deleted]
            deletes = [Delete(NS, ahead[len(ahead) // 2], 1)] if ahead else []
            deleted.update(delete.key_digest for delete in deletes)
            store.commit(UnitOfWork(upserts=upserts, deletes=deletes))
        assert [d for d in seen if d in original] == [d for d in original if d not in deleted]

    def test_changed_deleted_and_unlabelled_records_follow_their_writes(
        self, store: SecureObjectStore
    ) -> None:
        """A delete drops a record, a rewrite without the label too, a new value moves it."""
        written = _write(store, VALUES[:12])
        gone, bare, moved = _digest("v000"), _digest("v001"), _digest("v002")
        store.commit(
            UnitOfWork(
                upserts=[
                    make_upsert(NS, "v001", expected=1, labels={"kind": "odd"}),
                    make_upsert(NS, "v002", expected=1, labels={LABEL: "moved"}),
                ],
                deletes=[Delete(NS, gone, 1)],
            )
        )
        del written[gone]
        written[bare] = {"kind": "odd"}
        written[moved] = {LABEL: "moved"}
        for descending in (False, True):
            expected = _expected(written, descending=descending)
            assert _walk(store, 3, descending=descending) == expected
        assert gone not in expected
        assert bare not in expected

    def test_limit_is_capped(self, store: SecureObjectStore) -> None:
        """A limit above the cap returns at most ``MAX_LIST_LIMIT`` items and a cursor."""
        _write(store, [f"t{n:04d}" for n in range(MAX_LIST_LIMIT + 5)])
        page = _listing(store).list_by_label(NS, LABEL, limit=10_000)
        assert len(page.items) == MAX_LIST_LIMIT
        assert page.next_cursor is not None
        rest = _listing(store).list_by_label(NS, LABEL, cursor=page.next_cursor, limit=10_000)
        assert len(rest.items) == 5
        assert rest.next_cursor is None

    def test_bad_arguments_are_invalid_input(self, store: SecureObjectStore) -> None:
        """Malformed cursors, those of ``list``, another label or direction, bad limits, names."""
        _write(store, VALUES[:8])
        listing = _listing(store)
        cursor = listing.list_by_label(NS, LABEL, limit=2).next_cursor
        other_label = listing.list_by_label(NS, "kind", limit=2).next_cursor
        of_list = store.list(NS, limit=2).next_cursor
        assert cursor is not None
        assert other_label is not None
        assert of_list is not None
        for bad in ("", "not-a-cursor", "e30=", cursor[:-3], of_list, other_label):
            with pytest.raises(InvalidInput):
                listing.list_by_label(NS, LABEL, cursor=bad)
        with pytest.raises(InvalidInput):
            listing.list_by_label(NS, LABEL, descending=True, cursor=cursor)
        with pytest.raises(InvalidInput):
            store.list(NS, cursor=cursor)
        for limit in (0, -1):
            with pytest.raises(InvalidInput):
                listing.list_by_label(NS, LABEL, limit=limit)
        for label in ("Not-A-Label", "", 7):
            with pytest.raises(InvalidInput):
                listing.list_by_label(NS, label)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            listing.list_by_label(7, LABEL)  # type: ignore[arg-type]

    @pytest.mark.parametrize("descending", [False, True])
    def test_the_fallback_lists_the_same_pages(
        self, store: SecureObjectStore, descending: bool
    ) -> None:
        """``StoreCapabilities`` without the capability pages through ``list`` to the same pages."""
        _write(store)
        fallback = StoreCapabilities()
        for filters in ((), *FILTERS):
            for limit in (3, 200):
                cursor: str | None = None
                while True:
                    page = _listing(store).list_by_label(
                        NS,
                        LABEL,
                        descending=descending,
                        filters=filters,
                        cursor=cursor,
                        limit=limit,
                    )
                    assert page == fallback.list_by_label(
                        store,
                        NS,
                        LABEL,
                        descending=descending,
                        filters=filters,
                        cursor=cursor,
                        limit=limit,
                    )
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
