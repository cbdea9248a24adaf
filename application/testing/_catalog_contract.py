"""The ``StreamCatalog`` contract: listing ledger streams, sorted and paged.

Mix ``StreamCatalogContract`` into a store's contract test class next to
``SecureObjectStoreContract``; it reuses the same ``make_store`` hook.
"""

from __future__ import annotations

import pytest

from flowvault.application import LedgerTrim, SecureObjectStore, StreamCatalog, UnitOfWork
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application.testing._fakes import make_event, make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import InvalidInput

NAMES = ("b", "B", "a", "_x", "Z", "a/1", "a/10", "a/2", "é", "ö/1", "日本", "z")
"""Names whose code-point order differs from most locales' collation order."""


def _catalog(store: SecureObjectStore) -> StreamCatalog:
    assert isinstance(store, StreamCatalog)
    return store


def _append(store: SecureObjectStore, *names: str) -> None:
    store.commit(UnitOfWork(appends=[make_event(name, 0) for name in names]))


def _all(store: StreamCatalog, limit: int) -> list[str]:
    names: list[str] = []
    while page := store.list_streams(after=names[-1] if names else None, limit=limit):
        assert len(page) <= limit
        names.extend(page)
    return names


class StreamCatalogContract(StoreHarness):
    """What every ``StreamCatalog`` adapter must do."""

    def test_satisfies_the_catalog_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``StreamCatalog`` at runtime."""
        assert isinstance(store, StreamCatalog)

    def test_empty_store_lists_no_streams(self, store: SecureObjectStore) -> None:
        """A store without events lists nothing, records notwithstanding."""
        store.commit(UnitOfWork(upserts=[make_upsert("catalog", "k")]))
        assert _catalog(store).list_streams() == []

    def test_streams_list_in_code_point_order(self, store: SecureObjectStore) -> None:
        """Every stream is listed once, sorted by code point whatever the locale."""
        _append(store, *NAMES)
        assert _catalog(store).list_streams() == sorted(NAMES)

    @pytest.mark.parametrize("limit", [1, 2, 5])
    def test_paging_after_the_last_name_visits_each_once(
        self, store: SecureObjectStore, limit: int
    ) -> None:
        """Passing the last name of a page as ``after`` pages through every stream."""
        _append(store, *NAMES)
        assert _all(_catalog(store), limit) == sorted(NAMES)

    def test_after_need_not_be_a_stream(self, store: SecureObjectStore) -> None:
        """``after`` is a position in the order, not a name that must exist."""
        _append(store, "a", "c", "e")
        assert _catalog(store).list_streams(after="b") == ["c", "e"]
        assert _catalog(store).list_streams(after="e") == []

    def test_stream_appended_twice_is_listed_once(self, store: SecureObjectStore) -> None:
        """A stream with several events is one name."""
        first = make_event("s", 0)
        store.commit(UnitOfWork(appends=[first, make_event("s", 1, first)]))
        assert _catalog(store).list_streams() == ["s"]

    def test_trimmed_stream_is_still_listed(self, store: SecureObjectStore) -> None:
        """Trimming keeps the head, so the stream stays listed."""
        first = make_event("s", 0)
        store.commit(UnitOfWork(appends=[first, make_event("s", 1, first)]))
        store.commit(UnitOfWork(trims=[LedgerTrim("s", 5)]))
        assert _catalog(store).list_streams() == ["s"]

    def test_limit_is_capped_and_must_be_positive(self, store: SecureObjectStore) -> None:
        """``limit`` is capped at ``MAX_LIST_LIMIT``; below 1 is ``InvalidInput``."""
        names = [f"s{n:04d}" for n in range(MAX_LIST_LIMIT + 5)]
        _append(store, *names)
        assert _catalog(store).list_streams(limit=MAX_LIST_LIMIT + 100) == names[:MAX_LIST_LIMIT]
        with pytest.raises(InvalidInput):
            _catalog(store).list_streams(limit=0)
