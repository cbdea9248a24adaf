"""Reading a store out, checking contents, and proving a fill: the policy of a move, on memory."""

from __future__ import annotations

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    LedgerAudit,
    RecordPage,
    SealedRepository,
    SecureObjectStore,
    StoreContents,
    StoredRecord,
    UnitOfWork,
    fill_verified,
    read_contents,
)
from flowvault.application._keys import KeyRing
from flowvault.application._transfer import record_from_line, record_line
from flowvault.application.testing import FrozenClock, make_event, make_upsert
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    RevisionConflict,
    StoreNotEmpty,
    StoreUnavailable,
)

NS = "transfer"


def _record(key: str, **labels: str | int) -> StoredRecord:
    upsert = make_upsert(NS, key, f"sealed-{key}".encode(), labels=labels)
    return StoredRecord(upsert.metadata, upsert.payload)


def _audit(store: SecureObjectStore) -> LedgerAudit:
    cipher = AesGcmCipher.from_ring(KeyRing(primary=generate_master_key()))
    return LedgerAudit(store, SealedRepository(store, cipher, FrozenClock()))


def _source() -> InMemorySecureObjectStore:
    store = InMemorySecureObjectStore()
    first = make_event("s", 0)
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")], appends=[first]))
    store.commit(UnitOfWork(appends=[make_event("s", 1, first)]))
    store.reserve_seals("k1", 3)
    return store


def test_contents_refuse_what_no_store_holds() -> None:
    """A record twice, a stream split in two runs or an unchained event is ``InvalidInput``."""
    first = make_event("s", 0)
    second = make_event("s", 1, first)
    with pytest.raises(InvalidInput):
        StoreContents(records=[_record("a"), _record("a")], events=(), seal_counts={}, epoch=0)
    with pytest.raises(InvalidInput):
        StoreContents(
            records=(), events=[first, make_event("t", 0), second], seal_counts={}, epoch=0
        )
    with pytest.raises(InvalidInput):
        StoreContents(records=(), events=[second, first], seal_counts={}, epoch=0)
    with pytest.raises(InvalidInput):
        StoreContents(records=(), events=(), seal_counts={"k": -1}, epoch=0)
    with pytest.raises(InvalidInput):
        StoreContents(records=(), events=(), seal_counts={}, epoch=-1)


def test_a_record_line_round_trips_and_refuses_a_payload_its_digest_does_not_name() -> None:
    """Labels past 53 bits survive; a payload swapped under its metadata is ``IntegrityFailure``."""
    record = _record("a", big=2**62, text="x")
    assert record_from_line(record_line(record)) == record
    other = _record("b")
    forged = StoredRecord(record.metadata, other.payload)
    with pytest.raises(IntegrityFailure):
        record_from_line(record_line(forged))


class _WrittenWhileRead(InMemorySecureObjectStore):
    """Injected fault: another writer commits while the first page of records is listed."""

    def list(self, namespace: str, **options: object) -> RecordPage:  # type: ignore[override]
        page = super().list(namespace, **options)  # type: ignore[arg-type]
        self.commit(UnitOfWork(upserts=[make_upsert("other", namespace)]))
        return page


def test_a_source_written_while_it_is_read_is_refused() -> None:
    """Its commit count moved: ``RevisionConflict``, and no contents come back."""
    store = _WrittenWhileRead()
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a")]))
    with pytest.raises(RevisionConflict):
        read_contents(store)


class _NoCatalog:
    def __init__(self, inner: InMemorySecureObjectStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "list_streams":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_a_store_that_cannot_list_its_streams_cannot_be_read_out() -> None:
    """Without ``StreamCatalog`` a copy would miss streams: ``StoreUnavailable``."""
    with pytest.raises(StoreUnavailable):
        read_contents(_NoCatalog(_source()))  # type: ignore[arg-type]


class _DropsARecord(InMemorySecureObjectStore):
    """Injected fault: a fill that silently leaves out the last record."""

    def fill(self, contents: StoreContents) -> None:
        super().fill(
            StoreContents(
                records=contents.records[:-1],
                events=contents.events,
                seal_counts=contents.seal_counts,
                epoch=contents.epoch,
            )
        )


def test_a_fill_that_does_not_read_back_as_the_source_fails_the_copy() -> None:
    """The read-back comparison has teeth: a missing record is ``IntegrityFailure``."""
    contents = read_contents(_source())
    with pytest.raises(IntegrityFailure, match="read back"):
        fill_verified(contents, _DropsARecord(), _audit)


def test_a_fill_whose_audit_fails_fails_the_copy() -> None:
    """Rows equal but not opening under the key: the keyed audit refuses the copy."""
    contents = read_contents(_source())
    with pytest.raises(IntegrityFailure, match="audit"):
        fill_verified(contents, InMemorySecureObjectStore(), _audit)


def test_a_target_holding_anything_is_refused_before_anything_is_written() -> None:
    """A seal count alone is content: ``StoreNotEmpty``, the target as it was."""
    target = InMemorySecureObjectStore()
    target.reserve_seals("k9", 1)
    with pytest.raises(StoreNotEmpty):
        fill_verified(read_contents(_source()), target, _audit)
    assert not target.has_records()
