"""The ``SecureObjectStore`` contract, written once and run against every adapter.

Subclass ``SecureObjectStoreContract`` in a ``test_*.py`` file and implement
``make_store``; pytest collects the inherited tests through the subclass.
"""

from __future__ import annotations

import random
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from flowvault.application import (
    Delete,
    FilterOp,
    Guard,
    LabelFilter,
    LedgerTrim,
    Order,
    RecordMetadata,
    SecureObjectStore,
    StoredRecord,
    StoreStats,
    StreamCatalog,
    StreamHeadBatch,
    StreamHeads,
    UnitOfWork,
    Upsert,
)
from flowvault.application._records import MAX_LIST_LIMIT, MAX_PAYLOAD_BYTES
from flowvault.application.ports import MAX_HEAD_BATCH
from flowvault.application.testing._drop_contract import LedgerDropContract
from flowvault.application.testing._fakes import (
    EPOCH,
    make_event,
    make_header,
    make_upsert,
)
from flowvault.application.testing._tags_contract import RecordTagsContract
from flowvault.domain import (
    EnvelopeHeader,
    InvalidInput,
    LedgerEvent,
    PayloadTooLarge,
    RevisionConflict,
    StoreUnavailable,
)
from flowvault.domain._envelope import natural_key_digest
from flowvault.domain._ledger import verify_chain

NS = "contract"

_Rank = tuple[datetime, str]
"""A record's place in a listing order: its time (ignored by ``Order.KEY``) and key digest."""


def _digest(key: str, namespace: str = NS) -> str:
    return natural_key_digest(namespace, key)


class StoreHarness(ABC):
    """Hooks and the ``store`` fixture shared by every contract over a store adapter.

    ``make_store`` (required) builds a fresh, empty store; it may use
    ``self.tmp_path``. ``close_store`` (optional) releases it after a test.
    """

    tmp_path: Path

    @abstractmethod
    def make_store(self) -> SecureObjectStore:
        """Return a new, empty store for one test."""

    def close_store(self, store: SecureObjectStore) -> None:
        """Release ``store`` after a test; the default calls ``close()``."""
        store.close()

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SecureObjectStore]:
        """Provide a fresh store and release it afterwards."""
        self.tmp_path = tmp_path
        made = self.make_store()
        try:
            yield made
        finally:
            self.close_store(made)


class SecureObjectStoreContract(RecordTagsContract, StoreHarness, LedgerDropContract):
    """Behaviour every ``SecureObjectStore`` adapter must show."""

    # -- records and guards -------------------------------------------------

    def test_satisfies_the_port_protocol(self, store: SecureObjectStore) -> None:
        """The adapter matches the SecureObjectStore protocol by shape."""
        assert isinstance(store, SecureObjectStore)

    @pytest.mark.parametrize("name", [["ns"], 7, b"ns", None])
    def test_names_that_are_not_text_are_invalid_input(
        self, store: SecureObjectStore, name: object
    ) -> None:
        """A caller's wrong type is ``INVALID_INPUT``, not a driver error read as an outage."""
        reads = (
            lambda: store.load(name, "k"),  # type: ignore[arg-type]
            lambda: store.load("ns", name),  # type: ignore[arg-type]
            lambda: store.peek_metadata(name, "k"),  # type: ignore[arg-type]
            lambda: store.list(name),  # type: ignore[arg-type]
            lambda: store.ledger_head(name),  # type: ignore[arg-type]
            lambda: store.read_ledger(name),  # type: ignore[arg-type]
        )
        for read in reads:
            with pytest.raises(InvalidInput):
                read()

    def test_absent_record_loads_as_none(self, store: SecureObjectStore) -> None:
        """Loading or peeking a record never written returns None."""
        assert store.load(NS, _digest("nope")) is None
        assert store.peek_metadata(NS, _digest("nope")) is None

    def test_create_round_trips_header_payload_and_labels(self, store: SecureObjectStore) -> None:
        """A created record loads back byte for byte with its header and labels."""
        upsert = make_upsert(NS, "a", b"\x00\x01sealed\xff", labels={"status": "open", "n": 3})
        store.commit(UnitOfWork(upserts=[upsert]))
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert loaded.payload == b"\x00\x01sealed\xff"
        assert loaded.metadata.header == upsert.header
        assert dict(loaded.metadata.labels) == {"status": "open", "n": 3}
        assert loaded.metadata == upsert.metadata

    def test_peek_metadata_matches_load(self, store: SecureObjectStore) -> None:
        """peek_metadata returns the same metadata as load, with length and digest."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"12345")]))
        loaded = store.load(NS, _digest("a"))
        peeked = store.peek_metadata(NS, _digest("a"))
        assert loaded is not None
        assert peeked == loaded.metadata
        assert peeked.byte_length == 5
        assert peeked.payload_digest.startswith("sha256:")

    @pytest.mark.parametrize("ledger_index", [None, 0, 2**40, 2**53 - 1])
    def test_ledger_index_reads_back_from_every_read(
        self, store: SecureObjectStore, ledger_index: int | None
    ) -> None:
        """A header's ``ledger_index`` comes back from load, peek and list as written.

        It is part of the sealed payload's associated data, so a store that
        drops or changes it leaves the record unopenable; ``None`` stays ``None``.
        """
        upsert = make_upsert(NS, "a", labels={"n": 1}, ledger_index=ledger_index)
        bystander = make_upsert(NS, "b", labels={"n": 2}, written_at=EPOCH + timedelta(seconds=1))
        store.commit(UnitOfWork(upserts=[upsert, bystander], appends=[make_event("s", 0)]))
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert loaded.metadata.header == upsert.header
        assert loaded.metadata.header.ledger_index == ledger_index
        assert store.peek_metadata(NS, _digest("a")) == upsert.metadata
        for order in Order:
            for filters in ((), (LabelFilter("n", 1),), (LabelFilter("n", 2, FilterOp.LT),)):
                listed = store.list(NS, order=order, filters=filters).items
                found = [meta for meta in listed if meta.key_digest == _digest("a")]
                assert found == [upsert.metadata], (order, filters)
            paged = store.list(NS, order=order, limit=1)
            rest = store.list(NS, order=order, cursor=paged.next_cursor, limit=1)
            headers = {meta.key_digest: meta.header for meta in paged.items + rest.items}
            assert headers == {_digest("a"): upsert.header, _digest("b"): bystander.header}

    def test_ledger_index_follows_every_kind_of_write(self, store: SecureObjectStore) -> None:
        """Each write replaces the stored ``ledger_index`` with its own header's, ``None`` too.

        Created, replaced under an exact guard, advanced under ``Guard.ANY``,
        re-sealed and replaced again: every read returns the last header written.
        """

        def check(header: EnvelopeHeader) -> None:
            loaded = store.load(NS, _digest("a"))
            assert loaded is not None
            assert loaded.metadata.header == header
            peeked = store.peek_metadata(NS, _digest("a"))
            assert peeked is not None
            assert peeked.header == header
            assert [meta.header for meta in store.list(NS).items] == [header]

        created = make_upsert(NS, "a", b"v1", ledger_index=3)
        store.commit(UnitOfWork(upserts=[created]))
        check(created.header)
        replaced = make_upsert(NS, "a", b"v2", expected=1, ledger_index=7)
        store.commit(UnitOfWork(upserts=[replaced]))
        check(replaced.header)
        advanced = make_upsert(NS, "a", b"v5", expected=Guard.ANY, revision=5, ledger_index=2**40)
        store.commit(UnitOfWork(upserts=[advanced]))
        check(advanced.header)
        read = store.load(NS, _digest("a"))
        assert read is not None
        reseal = Upsert(
            header=make_header(NS, "a", revision=5, key_id="k2", ledger_index=2**40),
            payload=b"v5, re-sealed",
            expected=5,
            replaces=read.metadata.payload_digest,
        )
        store.commit(UnitOfWork(upserts=[reseal]))
        check(reseal.header)
        unlinked = make_upsert(NS, "a", b"v6", expected=5)
        store.commit(UnitOfWork(upserts=[unlinked]))
        check(unlinked.header)
        relinked = make_upsert(NS, "a", b"v7", expected=6, ledger_index=0)
        store.commit(UnitOfWork(upserts=[relinked]))
        check(relinked.header)

    def test_create_of_existing_record_conflicts(self, store: SecureObjectStore) -> None:
        """A must-be-absent guard on an existing record fails and changes nothing."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"first")]))
        with pytest.raises(RevisionConflict) as caught:
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"second")]))
        assert caught.value.details["actual"] == 1
        assert caught.value.details["expected"] == "absent"
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert loaded.payload == b"first"

    def test_exact_guard_advances_the_revision(self, store: SecureObjectStore) -> None:
        """An upsert expecting the stored revision writes the next one."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v1")]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v2", expected=1)]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v3", expected=2)]))
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert (loaded.metadata.revision, loaded.payload) == (3, b"v3")

    def test_stale_guard_conflicts_and_leaves_record_unchanged(
        self, store: SecureObjectStore
    ) -> None:
        """An upsert with a stale revision names expected and actual and writes nothing."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v1")]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v2", expected=1)]))
        before = store.load(NS, _digest("a"))
        with pytest.raises(RevisionConflict) as caught:
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"lost", expected=1)]))
        assert caught.value.details["expected"] == 1
        assert caught.value.details["actual"] == 2
        assert caught.value.details["key_digest"] == _digest("a")
        assert store.load(NS, _digest("a")) == before

    def test_reseal_keeps_the_revision_of_the_row_it_replaces(
        self, store: SecureObjectStore
    ) -> None:
        """A re-seal rewrites the row it read in place, at the same revision."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"old seal")]))
        read = store.load(NS, _digest("a"))
        assert read is not None
        reseal = Upsert(
            header=make_header(NS, "a", key_id="k2"),
            payload=b"new seal",
            expected=1,
            replaces=read.metadata.payload_digest,
        )
        store.commit(UnitOfWork(upserts=[reseal]))
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert (loaded.metadata.revision, loaded.metadata.header.key_id) == (1, "k2")
        assert loaded.payload == b"new seal"

    def test_reseal_never_lands_on_a_recreated_row(self, store: SecureObjectStore) -> None:
        """Deleted and created again, a record is back at revision 1: the re-seal must fail.

        Otherwise key rotation would write a deleted document back over the
        new one; the payload digest tells the two rows apart.
        """
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"deleted content")]))
        read = store.load(NS, _digest("a"))
        assert read is not None
        store.commit(UnitOfWork(deletes=[Delete(NS, _digest("a"), 1)]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"new content")]))
        reseal = Upsert(
            header=make_header(NS, "a", key_id="k2"),
            payload=b"deleted content, re-sealed",
            expected=1,
            replaces=read.metadata.payload_digest,
        )
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(upserts=[reseal]))
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert loaded.payload == b"new content"

    def test_exact_guard_on_absent_record_conflicts(self, store: SecureObjectStore) -> None:
        """An exact guard on a record that does not exist fails and creates nothing."""
        with pytest.raises(RevisionConflict) as caught:
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", expected=4)]))
        assert caught.value.details["actual"] is None
        assert store.load(NS, _digest("a")) is None

    def test_any_guard_writes_forward_only(self, store: SecureObjectStore) -> None:
        """Guard.ANY writes absent or older records but never moves a revision back."""
        store.commit(
            UnitOfWork(upserts=[make_upsert(NS, "a", b"v5", expected=Guard.ANY, revision=5)])
        )
        with pytest.raises(RevisionConflict):
            store.commit(
                UnitOfWork(upserts=[make_upsert(NS, "a", b"v5b", expected=Guard.ANY, revision=5)])
            )
        store.commit(
            UnitOfWork(upserts=[make_upsert(NS, "a", b"v9", expected=Guard.ANY, revision=9)])
        )
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert (loaded.metadata.revision, loaded.payload) == (9, b"v9")

    def test_delete_with_exact_guard_removes(self, store: SecureObjectStore) -> None:
        """A delete expecting the stored revision removes the record."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        store.commit(UnitOfWork(deletes=[Delete(NS, _digest("a"), 1)]))
        assert store.load(NS, _digest("a")) is None
        assert store.peek_metadata(NS, _digest("a")) is None

    def test_stale_delete_conflicts_and_keeps_record(self, store: SecureObjectStore) -> None:
        """A delete with a stale revision fails and the record survives."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v1")]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"v2", expected=1)]))
        with pytest.raises(RevisionConflict) as caught:
            store.commit(UnitOfWork(deletes=[Delete(NS, _digest("a"), 1)]))
        assert caught.value.details["actual"] == 2
        assert store.load(NS, _digest("a")) is not None

    def test_delete_of_absent_record(self, store: SecureObjectStore) -> None:
        """An exact delete of an absent record conflicts; Guard.ANY is a no-op."""
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(deletes=[Delete(NS, _digest("a"), 1)]))
        store.commit(UnitOfWork(deletes=[Delete(NS, _digest("a"), Guard.ANY)]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "b")]))
        store.commit(UnitOfWork(deletes=[Delete(NS, _digest("b"), Guard.ANY)]))
        assert store.load(NS, _digest("b")) is None

    def test_deleted_record_can_be_created_again(self, store: SecureObjectStore) -> None:
        """After a delete, a must-be-absent create succeeds."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"old")]))
        store.commit(UnitOfWork(deletes=[Delete(NS, _digest("a"), 1)]))
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", b"new")]))
        loaded = store.load(NS, _digest("a"))
        assert loaded is not None
        assert loaded.payload == b"new"

    def test_empty_unit_is_a_no_op(self, store: SecureObjectStore) -> None:
        """Committing an empty unit succeeds and changes nothing."""
        store.commit(UnitOfWork())
        assert store.list(NS).items == ()

    # -- atomicity ----------------------------------------------------------

    def _seed_for_atomicity(self, store: SecureObjectStore) -> LedgerEvent:
        store.commit(
            UnitOfWork(
                upserts=[make_upsert(NS, "keep", b"k1"), make_upsert(NS, "doomed", b"d1")],
                appends=[make_event("s", 0)],
            )
        )
        head = store.ledger_head("s")
        assert head is not None
        return head

    def _snapshot(self, store: SecureObjectStore) -> tuple[object, ...]:
        keys = ("keep", "doomed", "new1", "new2")
        return (
            tuple(store.load(NS, _digest(key)) for key in keys),
            store.read_ledger("s", limit=MAX_LIST_LIMIT),
            store.read_ledger("t", limit=MAX_LIST_LIMIT),
        )

    @pytest.mark.parametrize("failing", ["upsert", "delete", "append", "second_append"])
    def test_one_failing_guard_applies_nothing(
        self, store: SecureObjectStore, failing: str
    ) -> None:
        """A unit with one failing guard among many leaves records and ledger untouched."""
        head = self._seed_for_atomicity(store)
        before = self._snapshot(store)
        upserts = [
            make_upsert(NS, "keep", b"k2", expected=1),
            make_upsert(NS, "new1", b"n1"),
            make_upsert(NS, "new2", b"n2", expected=7 if failing == "upsert" else Guard.ABSENT),
        ]
        deletes = [Delete(NS, _digest("doomed"), 3 if failing == "delete" else 1)]
        first = make_event("s", 1, head)
        second = make_event("s", 2, head if failing == "second_append" else first)
        other = make_event("t", 1 if failing == "append" else 0)
        unit = UnitOfWork(upserts=upserts, deletes=deletes, appends=[first, second, other])
        with pytest.raises(RevisionConflict) as caught:
            store.commit(unit)
        assert caught.value.details["guard"] in {"upsert", "delete", "append"}
        assert self._snapshot(store) == before

    def test_whole_unit_applies_together(self, store: SecureObjectStore) -> None:
        """A unit whose guards all hold applies every upsert, delete and append."""
        head = self._seed_for_atomicity(store)
        first = make_event("s", 1, head)
        store.commit(
            UnitOfWork(
                upserts=[make_upsert(NS, "keep", b"k2", expected=1), make_upsert(NS, "new1")],
                deletes=[Delete(NS, _digest("doomed"), 1)],
                appends=[first, make_event("s", 2, first), make_event("t", 0)],
            )
        )
        kept = store.load(NS, _digest("keep"))
        assert kept is not None
        assert kept.payload == b"k2"
        assert store.load(NS, _digest("new1")) is not None
        assert store.load(NS, _digest("doomed")) is None
        assert [e.index for e in store.read_ledger("s").events] == [0, 1, 2]
        assert [e.index for e in store.read_ledger("t").events] == [0]

    def test_concurrent_writers_have_one_winner_per_revision(
        self, store: SecureObjectStore
    ) -> None:
        """Eight threads racing on one record produce exactly one winner per revision.

        A barrier lines every round up: all threads read the same revision,
        then all commit the next one at once, so a store that lets a writer
        overwrite a revision it did not read loses an update in the first
        round, whatever the scheduler does.
        """
        workers, rounds = 8, 25
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "hot", b"0")]))
        wins: Counter[int] = Counter()
        lock = threading.Lock()
        barrier = threading.Barrier(workers, timeout=120)
        errors: list[BaseException] = []

        def writer(worker: int) -> None:
            try:
                for attempt in range(rounds):
                    barrier.wait()
                    current = store.peek_metadata(NS, _digest("hot"))
                    assert current is not None
                    barrier.wait()
                    payload = f"{worker}:{attempt}".encode()
                    upsert = make_upsert(NS, "hot", payload, expected=current.revision)
                    try:
                        store.commit(UnitOfWork(upserts=[upsert]))
                    except RevisionConflict:
                        continue
                    with lock:
                        wins[upsert.header.revision] += 1
            except threading.BrokenBarrierError:
                return
            except BaseException as exc:  # surfaced in the main thread
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        final = store.peek_metadata(NS, _digest("hot"))
        assert final is not None
        assert set(wins.values()) == {1}
        assert sorted(wins) == list(range(2, final.revision + 1))
        assert final.revision == 1 + rounds

    def test_every_write_reads_back_at_once(self, store: SecureObjectStore) -> None:
        """A long seeded run of writes and deletes, each read back at once, reads its own write.

        Every write is followed by ``load`` and ``peek_metadata``: a store
        whose ``load`` answers one read in twenty from an older copy fails
        this but for a chance of about one in a billion (400 reads), not only
        when other tests happen to read at the wrong time.
        """
        rng = random.Random(24)  # noqa: S311 - a repeatable run of writes, not a secret
        keys = [f"seq{n}" for n in range(6)]
        stored: dict[str, StoredRecord] = {}
        for step in range(400):
            key = rng.choice(keys)
            current = stored.get(key)
            if current is not None and rng.random() < 0.1:
                delete = Delete(NS, _digest(key), current.metadata.revision)
                store.commit(UnitOfWork(deletes=[delete]))
                del stored[key]
            else:
                upsert = make_upsert(
                    NS,
                    key,
                    rng.randbytes(rng.randrange(1, 64)),
                    expected=Guard.ABSENT if current is None else current.metadata.revision,
                    labels={"step": step},
                    written_at=EPOCH + timedelta(microseconds=1_001 * step),
                )
                store.commit(UnitOfWork(upserts=[upsert]))
                stored[key] = StoredRecord(metadata=upsert.metadata, payload=upsert.payload)
            expected = stored.get(key)
            assert store.load(NS, _digest(key)) == expected, step
            assert store.peek_metadata(NS, _digest(key)) == (
                None if expected is None else expected.metadata
            ), step

    # -- listing ------------------------------------------------------------

    def _fill(self, store: SecureObjectStore, count: int, namespace: str = NS) -> None:
        upserts = [
            make_upsert(
                namespace,
                f"r{n:03d}",
                labels={"parity": "even" if n % 2 == 0 else "odd", "n": n},
                written_at=EPOCH + timedelta(seconds=count - n if n % 3 else n),
            )
            for n in range(count)
        ]
        store.commit(UnitOfWork(upserts=upserts))

    def _walk(self, store: SecureObjectStore, order: Order, limit: int, **kw: object) -> list[str]:
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = store.list(NS, order=order, cursor=cursor, limit=limit, **kw)  # type: ignore[arg-type]
            seen.extend(meta.key_digest for meta in page.items)
            assert len(page.items) <= limit
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    def test_list_orders_by_key_digest(self, store: SecureObjectStore) -> None:
        """Order.KEY lists key digests ascending."""
        self._fill(store, 20)
        digests = [meta.key_digest for meta in store.list(NS, order=Order.KEY).items]
        assert digests == sorted(_digest(f"r{n:03d}") for n in range(20))

    @pytest.mark.parametrize("order", [Order.WRITTEN_AT, Order.WRITTEN_AT_DESC])
    def test_list_orders_by_written_at_with_key_tiebreak(
        self, store: SecureObjectStore, order: Order
    ) -> None:
        """Written-at orders are total: ties are broken by the key digest."""
        self._fill(store, 30)
        items = store.list(NS, order=order).items
        keys = [(meta.header.written_at, meta.key_digest) for meta in items]
        assert keys == sorted(keys, reverse=order is Order.WRITTEN_AT_DESC)
        assert len(items) == 30

    @pytest.mark.parametrize("order", list(Order))
    def test_cursor_visits_every_record_once(self, store: SecureObjectStore, order: Order) -> None:
        """Paging with the cursor returns every record exactly once, in order."""
        self._fill(store, 45)
        whole = [meta.key_digest for meta in store.list(NS, order=order, limit=200).items]
        assert self._walk(store, order, limit=7) == whole
        assert len(set(whole)) == 45

    def test_cursor_survives_concurrent_inserts(self, store: SecureObjectStore) -> None:
        """Records written between pages neither repeat nor hide earlier ones."""
        self._fill(store, 10)
        first = store.list(NS, order=Order.KEY, limit=4)
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "late")]))
        rest = store.list(NS, order=Order.KEY, cursor=first.next_cursor, limit=200)
        seen = [m.key_digest for m in first.items + rest.items]
        assert len(seen) == len(set(seen)) == 11

    def _page_through(
        self, store: SecureObjectStore, order: Order, limit: int, most: int
    ) -> list[str]:
        """Page with the cursor, failing instead of looping once more than ``most`` items came."""
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = store.list(NS, order=order, cursor=cursor, limit=limit)
            assert len(page.items) <= limit
            seen.extend(meta.key_digest for meta in page.items)
            assert len(seen) <= most, f"paging returned more than the {most} records stored"
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    @pytest.mark.parametrize("order", [Order.WRITTEN_AT, Order.WRITTEN_AT_DESC])
    def test_tied_write_times_page_in_key_digest_order(
        self, store: SecureObjectStore, order: Order
    ) -> None:
        """Records written in one instant list and page in key-digest order, each once.

        Ascending under ``WRITTEN_AT``; under ``WRITTEN_AT_DESC`` the whole
        sort key is reversed, ties too (key digest descending). A cursor
        that holds only the time skips or repeats tied records at a page
        break.
        """
        instants = [EPOCH, EPOCH + timedelta(microseconds=1), EPOCH + timedelta(seconds=1)]
        upserts = [make_upsert(NS, f"tie{n:02d}", written_at=instants[n % 3]) for n in range(18)]
        store.commit(UnitOfWork(upserts=upserts))
        ranked = sorted(
            ((u.header.written_at, u.header.key_digest) for u in upserts),
            reverse=order is Order.WRITTEN_AT_DESC,
        )
        expected = [digest for _, digest in ranked]
        assert [meta.key_digest for meta in store.list(NS, order=order).items] == expected
        for limit in (1, 2, 4, 5, 7):
            assert self._page_through(store, order, limit, len(expected)) == expected, limit

    @pytest.mark.parametrize("order", list(Order))
    def test_cursor_neither_repeats_nor_skips_under_inserts(
        self, store: SecureObjectStore, order: Order
    ) -> None:
        """Inserts landing before, inside and after the page just read do not move the cursor.

        Every record present when paging began is visited exactly once, in
        order, and no record twice; a record written meanwhile may or may
        not be visited. A cursor counting an offset from the start repeats
        records once inserts land before its position.
        """
        self._fill(store, 24)
        original = [meta.key_digest for meta in store.list(NS, order=order, limit=200).items]
        descending = order is Order.WRITTEN_AT_DESC

        def rank(written_at: datetime, digest: str) -> _Rank:
            return (EPOCH if order is Order.KEY else written_at, digest)

        def precedes(left: _Rank, right: _Rank) -> bool:
            return left > right if descending else left < right

        fresh = iter(range(1_000_000))

        def insert_between(
            low: _Rank | None, high: _Rank | None, page: list[RecordMetadata]
        ) -> None:
            """Write a new record whose place in the order lies strictly between the bounds."""
            times = [meta.header.written_at for meta in page]
            times += [min(times) - timedelta(seconds=1), max(times) + timedelta(seconds=1)]
            while True:
                key = f"late{next(fresh)}"
                for written_at in times:
                    at = rank(written_at, _digest(key))
                    if (low is None or precedes(low, at)) and (high is None or precedes(at, high)):
                        upsert = make_upsert(NS, key, written_at=written_at)
                        store.commit(UnitOfWork(upserts=[upsert]))
                        return

        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = store.list(NS, order=order, cursor=cursor, limit=5)
            for meta in page.items:
                assert meta.key_digest not in seen, "a record was visited twice"
                seen.append(meta.key_digest)
            assert len(seen) <= 3 * len(original), "paging does not end"
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
            items = list(page.items)
            first = rank(items[0].header.written_at, items[0].key_digest)
            last = rank(items[-1].header.written_at, items[-1].key_digest)
            insert_between(None, first, items)
            insert_between(first, last, items)
            insert_between(last, None, items)
        present = set(original)
        assert [digest for digest in seen if digest in present] == original

    def test_list_filters_on_labels(self, store: SecureObjectStore) -> None:
        """Label filters combine with AND and compare by type."""
        self._fill(store, 20)

        def count(*filters: LabelFilter) -> int:
            return len(store.list(NS, filters=filters, limit=200).items)

        assert count(LabelFilter("parity", "even")) == 10
        assert count(LabelFilter("parity", "even", FilterOp.NE)) == 10
        assert count(LabelFilter("n", 5, FilterOp.LT)) == 5
        assert count(LabelFilter("n", 5, FilterOp.LE)) == 6
        assert count(LabelFilter("n", 15, FilterOp.GT)) == 4
        assert count(LabelFilter("n", 15, FilterOp.GE)) == 5
        assert count(LabelFilter("n", 10, FilterOp.GE), LabelFilter("parity", "odd")) == 5
        assert count(LabelFilter("n", "5")) == 0
        assert count(LabelFilter("missing", "x")) == 0
        assert count(LabelFilter("missing", "x", FilterOp.NE)) == 0

    def test_limit_is_capped(self, store: SecureObjectStore) -> None:
        """A limit above the cap returns at most MAX_LIST_LIMIT items and a cursor."""
        self._fill(store, MAX_LIST_LIMIT + 5)
        page = store.list(NS, limit=10_000)
        assert len(page.items) == MAX_LIST_LIMIT
        assert page.next_cursor is not None
        rest = store.list(NS, cursor=page.next_cursor, limit=10_000)
        assert len(rest.items) == 5
        assert rest.next_cursor is None

    def test_bad_list_arguments_are_invalid_input(self, store: SecureObjectStore) -> None:
        """Malformed cursors, cursors of another order and limits below 1 are refused."""
        self._fill(store, 5)
        cursor = store.list(NS, order=Order.KEY, limit=2).next_cursor
        assert cursor is not None
        for bad in ("", "not-a-cursor", "e30=", cursor[:-3]):
            with pytest.raises(InvalidInput):
                store.list(NS, cursor=bad)
        with pytest.raises(InvalidInput):
            store.list(NS, order=Order.WRITTEN_AT, cursor=cursor)
        with pytest.raises(InvalidInput):
            store.list(NS, limit=0)

    def test_namespaces_are_isolated_and_unicode(self, store: SecureObjectStore) -> None:
        """Unicode namespaces are distinct from each other and from similar ASCII ones."""
        spaces = ["工作流", "工作流/ß", "Ωmega 😀", "contract"]
        for space in spaces:
            store.commit(UnitOfWork(upserts=[make_upsert(space, "same", space.encode())]))
        for space in spaces:
            loaded = store.load(space, natural_key_digest(space, "same"))
            assert loaded is not None
            assert loaded.payload == space.encode()
            assert loaded.metadata.namespace == space
            assert len(store.list(space).items) == 1
        assert store.load("工作流", natural_key_digest("工作流/ß", "same")) is None

    def test_names_differing_only_by_case_or_trailing_space_are_distinct(
        self, store: SecureObjectStore
    ) -> None:
        """Namespaces, stream names and digests compare byte for byte, with no collation.

        What a database's default collation folds (case, trailing spaces)
        still names another record or stream: ``scope/Main`` is not
        ``scope/main``, and ``a`` is not ``a ``.
        """
        spaces = ["scope/main", "scope/Main", "scope/main ", "a", "A", "a "]
        shared = _digest("k", "scope/main")
        for space in spaces:
            upsert = Upsert(
                header=make_header(space, "k").model_copy(update={"key_digest": shared}),
                payload=space.encode(),
                expected=Guard.ABSENT,
                labels={"space": space},
            )
            try:
                store.commit(UnitOfWork(upserts=[upsert]))
            except RevisionConflict as exc:
                raise AssertionError(f"{space!r} was taken for another namespace") from exc
        for space in spaces:
            loaded = store.load(space, shared)
            assert loaded is not None, space
            assert (loaded.metadata.namespace, loaded.payload) == (space, space.encode())
            assert store.peek_metadata(space, shared) == loaded.metadata
            assert store.list(space).items == (loaded.metadata,), space
            for near in (shared.upper(), shared + " "):
                assert store.load(space, near) is None, (space, near)
                assert store.peek_metadata(space, near) is None, (space, near)

        streams = ["s", "S", "s ", "scope/Main", "scope/main"]
        events = {name: make_event(name, 0, payload={"stream": name}) for name in streams}
        for name, event in events.items():
            try:
                store.commit(UnitOfWork(appends=[event]))
            except RevisionConflict as exc:
                raise AssertionError(f"stream {name!r} was taken for another stream") from exc
        for name, event in events.items():
            assert store.ledger_head(name) == event, name
            assert store.read_ledger(name).events == (event,), name
        if isinstance(store, StreamHeadBatch):
            assert store.ledger_head_indexes(streams) == dict.fromkeys(streams, 0)
        if isinstance(store, StreamCatalog):
            assert store.list_streams() == sorted(streams)

    # -- payload limits -----------------------------------------------------

    def test_empty_and_maximum_payloads_round_trip(self, store: SecureObjectStore) -> None:
        """Payloads of 0 bytes and of exactly MAX_PAYLOAD_BYTES store and load intact."""
        biggest = bytes(range(256)) * (MAX_PAYLOAD_BYTES // 256)
        assert len(biggest) == MAX_PAYLOAD_BYTES
        store.commit(
            UnitOfWork(upserts=[make_upsert(NS, "empty", b""), make_upsert(NS, "max", biggest)])
        )
        empty = store.load(NS, _digest("empty"))
        full = store.load(NS, _digest("max"))
        assert empty is not None
        assert full is not None
        assert empty.payload == b""
        assert full.payload == biggest
        assert full.metadata.byte_length == MAX_PAYLOAD_BYTES

    def test_payload_one_byte_over_is_refused(self) -> None:
        """A payload one byte over the limit is a PayloadTooLarge before any store sees it."""
        with pytest.raises(PayloadTooLarge) as caught:
            make_upsert(NS, "big", b"x" * (MAX_PAYLOAD_BYTES + 1))
        assert caught.value.code == "PAYLOAD_TOO_LARGE"

    # -- ledger -------------------------------------------------------------

    def _append_chain(self, store: SecureObjectStore, stream: str, count: int) -> list[LedgerEvent]:
        events: list[LedgerEvent] = []
        for index in range(count):
            event = make_event(stream, index, events[-1] if events else None)
            store.commit(UnitOfWork(appends=[event]))
            events.append(event)
        return events

    def test_ledger_appends_read_back_in_order(self, store: SecureObjectStore) -> None:
        """Appended events read back in index order, equal to what was written."""
        events = self._append_chain(store, "s", 6)
        page = store.read_ledger("s")
        assert list(page.events) == events
        assert page.next_index is None
        assert not page.gap
        assert store.ledger_head("s") == events[-1]
        assert verify_chain(page.events).ok

    def test_chain_mac_reads_back_set_and_unset(self, store: SecureObjectStore) -> None:
        """An event's ``chain_mac`` is stored as given, or as none: it is outside the hash.

        A store that dropped it would still pass ``verify_chain`` and leave a
        keyed audit nothing to check, so it is checked on its own.
        """
        plain = make_event("s", 0)
        keyed = make_event("s", 1, plain).model_copy(update={"chain_mac": "sha256:" + "ab" * 32})
        store.commit(UnitOfWork(appends=[plain]))
        assert store.ledger_head("s") == plain
        store.commit(UnitOfWork(appends=[keyed]))
        events = store.read_ledger("s").events
        assert events == (plain, keyed)
        assert [event.chain_mac for event in events] == [None, keyed.chain_mac]
        assert store.ledger_head("s") == keyed

    def test_empty_stream(self, store: SecureObjectStore) -> None:
        """An unknown stream has no head and reads as an empty page without a gap."""
        assert store.ledger_head("none") is None
        page = store.read_ledger("none")
        assert (page.events, page.next_index, page.gap) == ((), None, False)

    def test_ledger_pages_with_next_index(self, store: SecureObjectStore) -> None:
        """Reading with a limit returns the next index until the head is reached."""
        events = self._append_chain(store, "s", 7)
        first = store.read_ledger("s", limit=3)
        assert [e.index for e in first.events] == [0, 1, 2]
        assert first.next_index == 3
        second = store.read_ledger("s", from_index=3, limit=3)
        third = store.read_ledger("s", from_index=6, limit=3)
        assert [e.index for e in second.events] == [3, 4, 5]
        assert list(third.events) == events[6:]
        assert third.next_index is None
        assert store.read_ledger("s", from_index=50).events == ()

    def test_ledger_limit_is_capped(self, store: SecureObjectStore) -> None:
        """A read_ledger limit above the cap returns MAX_LIST_LIMIT events and the next index."""
        events: list[LedgerEvent] = []
        for index in range(MAX_LIST_LIMIT + 5):
            events.append(make_event("s", index, events[-1] if events else None))
        store.commit(UnitOfWork(appends=events))
        page = store.read_ledger("s", limit=10_000)
        assert len(page.events) == MAX_LIST_LIMIT
        assert list(page.events) == events[:MAX_LIST_LIMIT]
        assert page.next_index == MAX_LIST_LIMIT
        rest = store.read_ledger("s", from_index=MAX_LIST_LIMIT, limit=10_000)
        assert list(rest.events) == events[MAX_LIST_LIMIT:]
        assert rest.next_index is None

    def test_sub_second_times_read_back_exactly(self, store: SecureObjectStore) -> None:
        """``written_at`` and ``occurred_at`` read back to the microsecond, from every read.

        Real clocks have microseconds: a store that keeps whole seconds or
        milliseconds changes every header and event it returns, so sealed
        records no longer open and the ledger chain no longer verifies.
        """
        offsets = (1, 999, 1_000, 123_456, 999_999, 1_000_001)
        instants = [EPOCH + timedelta(microseconds=offset) for offset in offsets]
        upserts = [
            make_upsert(NS, f"t{n}", labels={"n": n}, written_at=at)
            for n, at in enumerate(instants)
        ]
        events: list[LedgerEvent] = []
        for index, at in enumerate(instants):
            events.append(make_event("s", index, events[-1] if events else None, occurred_at=at))
        store.commit(UnitOfWork(upserts=upserts, appends=events))
        for upsert in upserts:
            loaded = store.load(NS, upsert.header.key_digest)
            assert loaded is not None
            assert loaded.metadata.header.written_at == upsert.header.written_at
            assert loaded.metadata == upsert.metadata
            assert store.peek_metadata(NS, upsert.header.key_digest) == upsert.metadata
        in_time_order = [upsert.metadata for upsert in upserts]
        assert list(store.list(NS, order=Order.WRITTEN_AT).items) == in_time_order
        assert list(store.list(NS, order=Order.WRITTEN_AT_DESC).items) == in_time_order[::-1]
        assert {meta.key_digest: meta for meta in store.list(NS).items} == {
            meta.key_digest: meta for meta in in_time_order
        }
        read = store.read_ledger("s").events
        assert [event.occurred_at for event in read] == instants
        assert list(read) == events
        assert store.ledger_head("s") == events[-1]
        assert verify_chain(read).ok

    def test_stale_previous_hash_is_rejected(self, store: SecureObjectStore) -> None:
        """An append whose previous hash is not the head's fails and appends nothing."""
        events = self._append_chain(store, "s", 3)
        forged = make_event("s", 3, events[1])
        with pytest.raises(RevisionConflict) as caught:
            store.commit(UnitOfWork(appends=[forged]))
        assert caught.value.details["stream"] == "s"
        assert store.ledger_head("s") == events[-1]

    def test_append_must_follow_the_head_index(self, store: SecureObjectStore) -> None:
        """An append that skips or repeats an index fails."""
        events = self._append_chain(store, "s", 2)
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(appends=[make_event("s", 3, events[-1])]))
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(appends=[make_event("s", 1, events[0], payload="fork")]))
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(appends=[make_event("new", 1)]))
        assert [e.index for e in store.read_ledger("s").events] == [0, 1]

    def test_two_writers_on_one_head_do_not_fork(self, store: SecureObjectStore) -> None:
        """Of two appends built on the same head, the second is refused."""
        head = self._append_chain(store, "s", 1)[0]
        store.commit(UnitOfWork(appends=[make_event("s", 1, head, payload="a")]))
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(appends=[make_event("s", 1, head, payload="b")]))
        assert verify_chain(store.read_ledger("s").events).ok

    def test_a_trim_counts_the_events_appended_in_its_unit(self, store: SecureObjectStore) -> None:
        """Appends apply before trims in one unit, so a trim up to the new event keeps only it.

        This is how a keyed trim is written: the ``ledger.trimmed`` event and
        the cut it records commit together, and the event is the new head.
        """
        events = self._append_chain(store, "s", 4)
        added = make_event("s", 4, events[-1])
        store.commit(UnitOfWork(appends=[added], trims=[LedgerTrim("s", 4)]))
        page = store.read_ledger("s")
        assert page.gap
        assert list(page.events) == [added]
        assert store.ledger_head("s") == added

    def test_trim_keeps_head_and_flags_gap(self, store: SecureObjectStore) -> None:
        """Trimmed events are gone, the head stays, and reading from before them flags a gap."""
        events = self._append_chain(store, "s", 5)
        store.commit(UnitOfWork(trims=[LedgerTrim("s", 3)]))
        page = store.read_ledger("s")
        assert page.gap
        assert list(page.events) == events[3:]
        assert not store.read_ledger("s", from_index=3).gap
        store.commit(UnitOfWork(trims=[LedgerTrim("s", 100)]))
        assert list(store.read_ledger("s").events) == events[4:]
        assert store.ledger_head("s") == events[4]
        store.commit(UnitOfWork(appends=[make_event("s", 5, events[4])]))
        verdict = verify_chain(
            store.read_ledger("s", from_index=4).events,
            start_index=4,
            previous_hash=events[3].event_hash,
        )
        assert verdict.ok

    def test_head_index_is_the_head_events_index(self, store: SecureObjectStore) -> None:
        """The optional ``StreamHeads`` capability agrees with ``ledger_head``, trims included.

        Record freshness checks trust it on every read, so an adapter that
        offers it must answer from the events, exactly as ``ledger_head``.
        """
        if not isinstance(store, StreamHeads):
            pytest.skip("the adapter does not offer the optional StreamHeads capability")
        assert store.ledger_head_index("s") is None
        events = self._append_chain(store, "s", 4)
        self._append_chain(store, "other", 2)
        assert store.ledger_head_index("s") == events[-1].index == 3
        store.commit(UnitOfWork(trims=[LedgerTrim("s", 3)]))
        assert store.ledger_head_index("s") == 3
        assert store.ledger_head_index("other") == 1
        assert store.ledger_head_index("missing") is None
        with pytest.raises(InvalidInput):
            store.ledger_head_index(7)  # type: ignore[arg-type]

    def test_head_indexes_are_the_head_events_indexes(self, store: SecureObjectStore) -> None:
        """The optional ``StreamHeadBatch`` capability agrees with ``ledger_head`` per stream.

        Opening a store trusts it for every stream the high-water mark
        remembers, so it must answer from the events, trims included, and
        leave out a stream without any.
        """
        if not isinstance(store, StreamHeadBatch):
            pytest.skip("the adapter does not offer the optional StreamHeadBatch capability")

        def one_by_one(streams: list[str]) -> dict[str, int]:
            heads = {name: store.ledger_head(name) for name in streams}
            found = {name: head.index for name, head in heads.items() if head is not None}
            if isinstance(store, StreamHeads):
                assert found == {
                    name: index
                    for name in streams
                    if (index := store.ledger_head_index(name)) is not None
                }
            return found

        assert store.ledger_head_indexes([]) == {}
        assert store.ledger_head_indexes(["s", "missing"]) == {}
        events = self._append_chain(store, "s", 4)
        self._append_chain(store, "other", 2)
        self._append_chain(store, "third", 1)
        streams = ["s", "other", "third", "missing"]
        assert store.ledger_head_indexes(streams) == one_by_one(streams)
        assert store.ledger_head_indexes(streams) == {"s": 3, "other": 1, "third": 0}
        store.commit(UnitOfWork(trims=[LedgerTrim("s", 3), LedgerTrim("other", 100)]))
        assert store.ledger_head_indexes(streams) == one_by_one(streams)
        assert store.ledger_head_indexes(("s", "other")) == {"s": events[-1].index, "other": 1}
        assert store.ledger_head_indexes(["s", "s", "missing", "s"]) == {"s": 3}

        most = ["third", *(f"missing/{n}" for n in range(MAX_HEAD_BATCH - 2)), "s"]
        assert len(most) == MAX_HEAD_BATCH
        assert store.ledger_head_indexes(most) == {"third": 0, "s": 3}
        with pytest.raises(InvalidInput):
            store.ledger_head_indexes([*most, "other"])
        with pytest.raises(InvalidInput):
            store.ledger_head_indexes("s")
        with pytest.raises(InvalidInput):
            store.ledger_head_indexes(["s", 7])  # type: ignore[list-item]

    def test_failed_unit_does_not_trim(self, store: SecureObjectStore) -> None:
        """A trim in a unit whose guard fails leaves the stream whole."""
        events = self._append_chain(store, "s", 4)
        with pytest.raises(RevisionConflict):
            store.commit(
                UnitOfWork(trims=[LedgerTrim("s", 3)], upserts=[make_upsert(NS, "x", expected=2)])
            )
        assert list(store.read_ledger("s").events) == events

    def test_ledger_read_rejects_negative_index(self, store: SecureObjectStore) -> None:
        """A negative from_index is invalid input."""
        with pytest.raises(InvalidInput):
            store.read_ledger("s", from_index=-1)

    # -- lifecycle and secrecy ----------------------------------------------

    def test_record_repr_hides_payload(self, store: SecureObjectStore) -> None:
        """Neither a stored record's repr nor an upsert's shows the payload bytes."""
        upsert = make_upsert(NS, "a", b"very-secret-bytes")
        store.commit(UnitOfWork(upserts=[upsert]))
        assert "very-secret-bytes" not in repr(upsert)
        assert "very-secret-bytes" not in repr(store.load(NS, _digest("a")))

    def test_closed_store_refuses_work(self, store: SecureObjectStore) -> None:
        """After close(), reads and commits raise StoreUnavailable."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        store.close()
        with pytest.raises(StoreUnavailable):
            store.load(NS, _digest("a"))
        with pytest.raises(StoreUnavailable):
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "b")]))

    def test_close_twice_is_harmless(self, store: SecureObjectStore) -> None:
        """A second ``close()`` returns quietly, and the store still refuses work."""
        store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
        store.close()
        try:
            store.close()
        except Exception as exc:
            raise AssertionError(f"a second close() raised {exc!r}") from exc
        with pytest.raises(StoreUnavailable):
            store.load(NS, _digest("a"))


class StoreStatsContract(SecureObjectStoreContract):
    """Behaviour of the optional ``StoreStats`` capability, for adapters that offer it."""

    def test_satisfies_the_stats_protocol(self, store: SecureObjectStore) -> None:
        """The adapter matches the StoreStats protocol by shape."""
        assert isinstance(store, StoreStats)

    def test_counts_follow_writes_and_deletes(self, store: SecureObjectStore) -> None:
        """Per-namespace and per-key-id counts reflect committed work only."""
        assert isinstance(store, StoreStats)
        assert dict(store.namespace_counts()) == {}
        assert dict(store.key_id_counts()) == {}
        assert store.has_records() is False
        upserts = [make_upsert(NS, f"r{n}") for n in range(3)] + [make_upsert("other", "x")]
        store.commit(UnitOfWork(upserts=upserts))
        store.commit(UnitOfWork(deletes=[Delete(NS, _digest("r0"), 1)]))
        with pytest.raises(RevisionConflict):
            store.commit(UnitOfWork(upserts=[make_upsert(NS, "r9"), make_upsert("other", "x")]))
        assert store.has_records() is True
        assert dict(store.namespace_counts()) == {NS: 2, "other": 1}
        assert dict(store.key_id_counts()) == {"k1": 3}

    def test_ledger_events_alone_count_as_data(self, store: SecureObjectStore) -> None:
        """A store holding only ledger events still has data, so no key is invented over it."""
        assert isinstance(store, StoreStats)
        store.commit(UnitOfWork(appends=[make_event("s", 0)]))
        assert store.has_records() is True
        assert dict(store.namespace_counts()) == {}
