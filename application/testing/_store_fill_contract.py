"""The ``StoreFill`` contract: an empty store filled with contents reads back exactly as them.

Mix ``StoreFillContract`` into a store's contract test class next to
``StoreStatsContract``, ``StoreEpochContract``, ``StreamCatalogContract``
and ``SealCounterContract``; it reuses the same ``make_store`` hook.
"""

from __future__ import annotations

import pytest

from flowvault.application import (
    Delete,
    SealCounter,
    SecureObjectStore,
    StoreContents,
    StoredRecord,
    StoreEpoch,
    StoreFill,
    StoreStats,
    TagFilter,
    UnitOfWork,
)
from flowvault.application.testing._fakes import make_event, make_upsert
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import LedgerEvent, StoreNotEmpty
from flowvault.domain._envelope import natural_key_digest

NS = "contract"


def _fill(store: SecureObjectStore) -> StoreFill:
    assert isinstance(store, StoreFill)
    return store


def _chain(stream: str, length: int) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    for index in range(length):
        events.append(make_event(stream, index, events[-1] if events else None))
    return events


TAG = "sha256:" + "5a" * 32


def _tagged(store: SecureObjectStore) -> list[str]:
    """Return the key digests ``list`` finds carrying ``TAG``: the filled tag index at work."""
    return [meta.key_digest for meta in store.list(NS, filters=[TagFilter(TAG)]).items]


def _contents() -> StoreContents:
    """Return records past revision 1 with labels and tags, a whole stream, and a trimmed one."""
    records = [
        StoredRecord(upsert.metadata, upsert.payload)
        for upsert in (
            make_upsert(NS, "a", b"sealed-a", expected=4, labels={"state": "x", "n": 2**40}),
            make_upsert(NS, "b", b"sealed-b", ledger_index=2, tags={TAG, "sha256:" + "0" * 64}),
            make_upsert("other", "c", b"sealed-c", expected=1),
        )
    ]
    whole = _chain("s/whole", 3)
    trimmed = _chain("s/trimmed", 6)[3:]
    return StoreContents(
        records=records, events=[*whole, *trimmed], seal_counts={"k1": 70, "k0": 4}, epoch=41
    )


class StoreFillContract(StoreHarness):
    """What every ``StoreFill`` adapter must do."""

    def test_satisfies_the_store_fill_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``StoreFill`` at runtime."""
        assert isinstance(store, StoreFill)

    def test_filled_store_reads_back_as_its_contents(self, store: SecureObjectStore) -> None:
        """Every record, every retained event (a trimmed start kept), the counts and the epoch."""
        contents = _contents()
        _fill(store).fill(contents)
        for record in contents.records:
            meta = record.metadata
            assert store.load(meta.namespace, meta.key_digest) == record
        assert _tagged(store) == [natural_key_digest(NS, "b")]
        page = store.read_ledger("s/trimmed")
        assert page.gap
        assert page.events == tuple(contents.streams()["s/trimmed"])
        assert store.read_ledger("s/whole").events == tuple(contents.streams()["s/whole"])
        assert isinstance(store, SealCounter)
        assert isinstance(store, StoreEpoch)
        assert dict(store.seal_counts()) == {"k1": 70, "k0": 4}
        assert store.epoch() == 41

    def test_filled_streams_continue_from_their_heads(self, store: SecureObjectStore) -> None:
        """A later unit appends after a filled head, and a record's revision guard holds."""
        contents = _contents()
        _fill(store).fill(contents)
        head = contents.streams()["s/trimmed"][-1]
        store.commit(UnitOfWork(appends=[make_event("s/trimmed", head.index + 1, head)]))
        assert store.ledger_head("s/trimmed") is not None
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", expected=5)]))
        assert isinstance(store, StoreEpoch)
        assert store.epoch() > 41

    @pytest.mark.parametrize("held", ["record", "event", "seal count"])
    def test_a_store_holding_anything_is_refused_whole(
        self, store: SecureObjectStore, held: str
    ) -> None:
        """A record, an event or a seal count already there: ``StoreNotEmpty``, nothing written."""
        if held == "record":
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "z")]))
        elif held == "event":
            store.commit(UnitOfWork(appends=[make_event("s/z", 0)]))
        else:
            assert isinstance(store, SealCounter)
            store.reserve_seals("k9", 1)
        assert isinstance(store, StoreStats)
        before = dict(store.namespace_counts())
        with pytest.raises(StoreNotEmpty):
            _fill(store).fill(_contents())
        assert dict(store.namespace_counts()) == before
        assert store.read_ledger("s/whole").events == ()

    def test_a_commit_count_alone_is_no_content_and_is_never_lowered(
        self, store: SecureObjectStore
    ) -> None:
        """A store whose records were all deleted is filled, and keeps its higher count."""
        for _ in range(25):
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "gone")]))
            store.commit(UnitOfWork(deletes=[Delete(NS, natural_key_digest(NS, "gone"), 1)]))
        assert isinstance(store, StoreEpoch)
        counted = store.epoch()
        assert counted >= 50
        _fill(store).fill(_contents())
        assert store.epoch() >= counted
        assert store.load(NS, natural_key_digest(NS, "b")) is not None

    def test_add_writes_next_to_what_the_store_holds(self, store: SecureObjectStore) -> None:
        """Other rows stay, seal counts are added to, and the epoch rises by one."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "kept")]))
        store.commit(UnitOfWork(appends=[make_event("s/kept", 0)]))
        assert isinstance(store, SealCounter)
        assert isinstance(store, StoreEpoch)
        store.reserve_seals("k1", 5)
        before = store.epoch()
        contents = _contents()
        _fill(store).add(contents)
        for record in contents.records:
            meta = record.metadata
            assert store.load(meta.namespace, meta.key_digest) == record
        assert _tagged(store) == [natural_key_digest(NS, "b")]
        assert store.read_ledger("s/trimmed").events == tuple(contents.streams()["s/trimmed"])
        assert store.load(NS, natural_key_digest(NS, "kept")) is not None
        assert store.ledger_head("s/kept") is not None
        assert dict(store.seal_counts()) == {"k1": 75, "k0": 4}
        assert store.epoch() == before + 1

    @pytest.mark.parametrize("held", ["record", "stream"])
    def test_add_refuses_a_record_or_stream_that_exists(
        self, store: SecureObjectStore, held: str
    ) -> None:
        """One of its records or streams already there: ``StoreNotEmpty``, nothing written."""
        if held == "record":
            store.commit(UnitOfWork(upserts=[make_upsert("other", "c")]))
        else:
            store.commit(UnitOfWork(appends=[make_event("s/trimmed", 0)]))
        assert isinstance(store, StoreStats)
        assert isinstance(store, StoreEpoch)
        assert isinstance(store, SealCounter)
        before = (dict(store.namespace_counts()), store.epoch())
        with pytest.raises(StoreNotEmpty):
            _fill(store).add(_contents())
        assert (dict(store.namespace_counts()), store.epoch()) == before
        assert store.read_ledger("s/whole").events == ()
        assert dict(store.seal_counts()) == {}
