"""The tag rules of the ``SecureObjectStore`` contract: stored as written, filtered by all.

``SecureObjectStoreContract`` includes these tests, so every adapter runs
them. Tags are keyed digests a host makes from a key and value; the store
keeps them with the record, returns them with its metadata, and lists the
records carrying every tag a listing names. The expected answers are
computed here from ``TagFilter``'s reference semantics, not from any
adapter's code.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from flowvault.application import (
    MAX_TAGS,
    BatchLoad,
    Delete,
    Guard,
    LabelFilter,
    Order,
    RecordFilter,
    RecordMetadata,
    SecureObjectStore,
    TagFilter,
    UnitOfWork,
    Upsert,
)
from flowvault.application.testing._fakes import make_header, make_upsert
from flowvault.domain import InvalidInput
from flowvault.domain._envelope import natural_key_digest

NS = "tagged"


def tag(n: int) -> str:
    """Return the ``n``-th test tag: a well-formed keyed digest."""
    return f"sha256:{n:064x}"


RED, BLUE, SQUARE, ROUND = tag(1), tag(2), tag(3), tag(4)

SHAPES: dict[str, tuple[frozenset[str], str]] = {
    "r-sq": (frozenset({RED, SQUARE}), "open"),
    "r-rd": (frozenset({RED, ROUND}), "open"),
    "b-sq": (frozenset({BLUE, SQUARE}), "closed"),
    "b-rd": (frozenset({BLUE, ROUND}), "open"),
    "red": (frozenset({RED}), "closed"),
    "bare": (frozenset(), "open"),
    "all": (frozenset({RED, BLUE, SQUARE, ROUND}), "closed"),
}
"""Key, tags and a ``state`` label of each record: every pair of tags is held by some, not all."""

TAG_FILTERS: tuple[tuple[RecordFilter, ...], ...] = (
    (TagFilter(RED),),
    (TagFilter(RED), TagFilter(SQUARE)),
    (TagFilter(SQUARE), TagFilter(RED)),
    (TagFilter(BLUE), TagFilter(ROUND), TagFilter(SQUARE)),
    (TagFilter(RED), TagFilter(RED)),
    (TagFilter(RED), LabelFilter("state", "open")),
    (LabelFilter("state", "closed"), TagFilter(SQUARE)),
    (TagFilter(tag(99)),),
)
"""One tag, several (in either order, or repeated), tags with a label filter, an unheld tag."""


def _digest(key: str, namespace: str = NS) -> str:
    return natural_key_digest(namespace, key)


def _write_shapes(store: SecureObjectStore) -> dict[str, RecordMetadata]:
    """Store the ``SHAPES`` records, and the same tags in another namespace; return them."""
    upserts = [
        make_upsert(NS, key, key.encode(), tags=tags, labels={"state": state})
        for key, (tags, state) in SHAPES.items()
    ]
    upserts.append(make_upsert("elsewhere", "r-sq", tags={RED, SQUARE}))
    store.commit(UnitOfWork(upserts=upserts))
    return {upsert.header.key_digest: upsert.metadata for upsert in upserts[:-1]}


def _matching(
    written: dict[str, RecordMetadata], filters: Sequence[RecordFilter]
) -> list[str]:
    return sorted(d for d, meta in written.items() if all(f.admits(meta) for f in filters))


def _walk(
    store: SecureObjectStore, filters: Sequence[RecordFilter], order: Order, limit: int
) -> list[RecordMetadata]:
    """Page through ``list`` to the end, failing instead of looping forever."""
    seen: list[RecordMetadata] = []
    cursor: str | None = None
    while True:
        page = store.list(NS, filters=filters, order=order, cursor=cursor, limit=limit)
        assert len(page.items) <= limit
        seen += page.items
        assert len(seen) <= 2 * len(SHAPES), "paging does not end"
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


class RecordTagsContract:
    """What every adapter must do with tags; part of ``SecureObjectStoreContract``."""

    def test_tags_round_trip_through_every_read(self, store: SecureObjectStore) -> None:
        """Load, peek, list and (where offered) load_many return a record's tags as written."""
        tags = {tag(n) for n in range(1, MAX_TAGS + 1)}
        upsert = make_upsert(NS, "full", b"sealed", tags=tags, labels={"state": "open"})
        store.commit(UnitOfWork(upserts=[upsert, make_upsert(NS, "plain")]))
        digest = upsert.header.key_digest
        loaded = store.load(NS, digest)
        assert loaded is not None
        assert loaded.metadata.tags == frozenset(tags)
        assert loaded.metadata == upsert.metadata
        assert store.peek_metadata(NS, digest) == upsert.metadata
        listed = {meta.key_digest: meta for meta in store.list(NS).items}
        assert listed[digest] == upsert.metadata
        assert listed[_digest("plain")].tags == frozenset()
        if isinstance(store, BatchLoad):
            many = store.load_many(NS, [digest, _digest("plain")])
            assert many[digest].metadata == upsert.metadata
            assert many[_digest("plain")].metadata.tags == frozenset()

    @pytest.mark.parametrize("filters", TAG_FILTERS)
    def test_tag_filters_keep_records_carrying_every_tag(
        self, store: SecureObjectStore, filters: tuple[RecordFilter, ...]
    ) -> None:
        """Tag filters AND with each other and with label filters; other namespaces stay out."""
        written = _write_shapes(store)
        expected = _matching(written, filters)
        page = store.list(NS, filters=filters, limit=200)
        assert [meta.key_digest for meta in page.items] == expected
        assert all(meta == written[meta.key_digest] for meta in page.items)

    @pytest.mark.parametrize("order", list(Order))
    def test_tag_filtered_pages_follow_the_order_and_cursor(
        self, store: SecureObjectStore, order: Order
    ) -> None:
        """Paging a tag-filtered listing by one visits each match once, in the listing order."""
        written = _write_shapes(store)
        for filters in TAG_FILTERS[:4]:
            whole = store.list(NS, filters=filters, order=order, limit=200).items
            assert sorted(meta.key_digest for meta in whole) == _matching(written, filters)
            assert _walk(store, filters, order, 1) == list(whole)

    def test_rewrites_and_deletes_move_tag_matches(self, store: SecureObjectStore) -> None:
        """A rewrite's tags replace the old ones; a deleted or recreated record keeps none."""
        _write_shapes(store)
        store.commit(
            UnitOfWork(
                upserts=[
                    make_upsert(NS, "r-sq", expected=1, tags={BLUE}),
                    make_upsert(NS, "red", expected=1),
                ],
                deletes=[Delete(NS, _digest("r-rd"), 1), Delete(NS, _digest("all"), 1)],
            )
        )
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "all", tags={SQUARE})]))
        reds = store.list(NS, filters=[TagFilter(RED)]).items
        assert reds == ()
        blues = [meta.key_digest for meta in store.list(NS, filters=[TagFilter(BLUE)]).items]
        assert blues == sorted(_digest(key) for key in ("r-sq", "b-sq", "b-rd"))
        squares = store.list(NS, filters=[TagFilter(SQUARE)]).items
        assert sorted(meta.key_digest for meta in squares) == sorted(
            _digest(key) for key in ("b-sq", "all")
        )
        recreated = store.peek_metadata(NS, _digest("all"))
        assert recreated is not None
        assert recreated.tags == frozenset({SQUARE})
        cleared = store.peek_metadata(NS, _digest("red"))
        assert cleared is not None
        assert cleared.tags == frozenset()
        assert store.peek_metadata(NS, _digest("r-rd")) is None

    def test_malformed_or_too_many_tags_are_refused(self) -> None:
        """A tag that is not a keyed digest, or more than MAX_TAGS, is refused before any store."""
        header = make_header(NS, "k")
        bad = (
            "sha256:" + "A" * 64,
            "sha256:" + "a" * 63,
            "sha256:" + "a" * 65,
            "md5:" + "a" * 64,
            "a" * 64,
            "",
            7,
        )
        for one in bad:
            with pytest.raises(InvalidInput):
                make_upsert(NS, "k", tags={one})  # type: ignore[arg-type]
            with pytest.raises(InvalidInput):
                TagFilter(one)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            make_upsert(NS, "k", tags={tag(n) for n in range(MAX_TAGS + 1)})
        with pytest.raises(InvalidInput):
            Upsert(header, b"x", Guard.ABSENT, tags=RED)  # type: ignore[arg-type]
        assert make_upsert(NS, "k", tags=[RED, RED]).tags == frozenset({RED})
