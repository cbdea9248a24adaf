"""The ``LabelLoad`` contract: the first records of a label listing, payloads included.

Mix ``LabelLoadContract`` into a store's contract test class next to
``LabelListingContract``; it reuses the same ``make_store`` hook and the
same records, and expects exactly what ``list_by_label`` lists first, each
record as ``load`` returns it.
"""

from __future__ import annotations

import pytest

from flowvault.application import (
    Delete,
    LabelLoad,
    RecordFilter,
    SecureObjectStore,
    StoreCapabilities,
    StoredRecord,
    UnitOfWork,
)
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application.testing._fakes import make_upsert
from flowvault.application.testing._label_listing_contract import (
    FILTERS,
    LABEL,
    NS,
    TAG_FILTERS,
    VALUES,
    _digest,
    _expected,
    _write,
    _write_tagged,
)
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import InvalidInput


def _loader(store: SecureObjectStore) -> LabelLoad:
    assert isinstance(store, LabelLoad)
    return store


def _as_loaded(store: SecureObjectStore, records: list[StoredRecord]) -> None:
    """Each record is the one ``load`` returns now: metadata and sealed payload alike."""
    for record in records:
        assert record == store.load(NS, record.metadata.key_digest)


class LabelLoadContract(StoreHarness):
    """What every ``LabelLoad`` adapter must do."""

    def test_satisfies_the_label_load_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``LabelLoad`` at runtime."""
        assert isinstance(store, LabelLoad)

    @pytest.mark.parametrize("descending", [False, True])
    @pytest.mark.parametrize("limit", [1, 2, 7, MAX_LIST_LIMIT])
    def test_loads_the_first_records_of_the_label_order(
        self, store: SecureObjectStore, descending: bool, limit: int
    ) -> None:
        """Integers before text, text by code point, ties on the key digest; payloads as loaded."""
        written = _write(store)
        loaded = _loader(store).load_by_label(NS, LABEL, descending=descending, limit=limit)
        expected = _expected(written, descending=descending)[:limit]
        assert [record.metadata.key_digest for record in loaded] == expected
        _as_loaded(store, loaded)

    @pytest.mark.parametrize("descending", [False, True])
    @pytest.mark.parametrize("filters", FILTERS + TAG_FILTERS)
    def test_filters_select_as_in_the_label_listing(
        self, store: SecureObjectStore, descending: bool, filters: tuple[RecordFilter, ...]
    ) -> None:
        """Label and tag filters, bounds on the label included, select what the listing lists."""
        _write_tagged(store)
        for limit in (1, 3, MAX_LIST_LIMIT):
            listed = StoreCapabilities.of(store).list_by_label(
                store, NS, LABEL, descending=descending, filters=filters, limit=limit
            )
            loaded = _loader(store).load_by_label(
                NS, LABEL, descending=descending, filters=filters, limit=limit
            )
            assert [record.metadata for record in loaded] == list(listed.items)
            _as_loaded(store, loaded)

    def test_deleted_rewritten_and_unlabelled_records_follow_their_writes(
        self, store: SecureObjectStore
    ) -> None:
        """A delete drops a record, a rewrite without the label another; a new value moves one."""
        _write(store, ["a", "b", "c", "d"])
        store.commit(
            UnitOfWork(
                upserts=[
                    make_upsert(NS, "v001", b"bare now", expected=1, labels={"kind": "odd"}),
                    make_upsert(NS, "v003", b"moved", expected=1, labels={LABEL: "0 first"}),
                ],
                deletes=[Delete(NS, _digest("v000"), 1)],
            )
        )
        loaded = _loader(store).load_by_label(NS, LABEL, limit=5)
        assert [record.metadata.key_digest for record in loaded] == [
            _digest("v003"),
            _digest("v002"),
        ]
        assert loaded[0].payload == b"moved"
        assert loaded[0].metadata.revision == 2
        _as_loaded(store, loaded)

    def test_no_record_carrying_the_label_loads_nothing(self, store: SecureObjectStore) -> None:
        """An empty namespace, a label no record carries and a filter nothing passes give ``[]``."""
        assert _loader(store).load_by_label(NS, LABEL) == []
        _write(store, VALUES[:4])
        assert _loader(store).load_by_label(NS, "absent") == []
        assert _loader(store).load_by_label("elsewhere-empty", LABEL) == []

    def test_limit_is_capped(self, store: SecureObjectStore) -> None:
        """A limit above the cap loads ``MAX_LIST_LIMIT`` records."""
        _write(store, [f"t{n:04d}" for n in range(MAX_LIST_LIMIT + 5)])
        loaded = _loader(store).load_by_label(NS, LABEL, limit=10_000)
        assert len(loaded) == MAX_LIST_LIMIT

    def test_bad_arguments_are_invalid_input(self, store: SecureObjectStore) -> None:
        """Limits below 1, label names no record could carry, arguments of the wrong type."""
        _write(store, VALUES[:4])
        loader = _loader(store)
        for limit in (0, -1):
            with pytest.raises(InvalidInput):
                loader.load_by_label(NS, LABEL, limit=limit)
        for label in ("Not-A-Label", "", 7):
            with pytest.raises(InvalidInput):
                loader.load_by_label(NS, label)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            loader.load_by_label(7, LABEL)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            loader.load_by_label(NS, LABEL, descending="yes")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            loader.load_by_label(NS, LABEL, filters=["kind"])  # type: ignore[list-item]

    @pytest.mark.parametrize("descending", [False, True])
    def test_the_fallback_loads_the_same_records(
        self, store: SecureObjectStore, descending: bool
    ) -> None:
        """``StoreCapabilities`` without the capability lists, then loads, the same records."""
        _write_tagged(store)
        fallback = StoreCapabilities()
        for filters in ((), *FILTERS, *TAG_FILTERS):
            for limit in (1, 4, MAX_LIST_LIMIT):
                assert _loader(store).load_by_label(
                    NS, LABEL, descending=descending, filters=filters, limit=limit
                ) == fallback.load_by_label(
                    store, NS, LABEL, descending=descending, filters=filters, limit=limit
                )
