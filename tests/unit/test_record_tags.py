"""Tags in sealed bodies and archive lines: rows written before tags still open and still move.

A record without tags is sealed, and written to an archive line, exactly as
before tags existed, so those rows and archives read as they did; a record
with tags carries them in its sealed body and in its line, checked on the
way back in.
"""

from __future__ import annotations

import json

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    Guard,
    LabelFilter,
    SealedRepository,
    StoredRecord,
    TagFilter,
    UnitOfWork,
    Upsert,
)
from flowvault.application._sealed import BYTES_BODY_PREFIX, TAGGED_BYTES_PREFIX
from flowvault.application._transfer import record_from_line, record_line
from flowvault.application.testing import FrozenClock, make_upsert
from flowvault.domain import IntegrityFailure, InvalidInput
from flowvault.domain._canonical import canonical_bytes

KEY = bytes(range(32))
NS = "tags"
TAGS = frozenset({"sha256:" + "1" * 64, "sha256:" + "2" * 64})


@pytest.fixture
def store() -> InMemorySecureObjectStore:
    """Provide an empty memory store."""
    return InMemorySecureObjectStore()


@pytest.fixture
def repo(store: InMemorySecureObjectStore) -> SealedRepository:
    """Provide a sealed repository over the store."""
    return SealedRepository(store, AesGcmCipher(KEY), FrozenClock())


def _plaintext(repo: SealedRepository, upsert: Upsert) -> bytes:
    return repo.cipher.open(upsert.payload, upsert.header.aad())


def _sealed_as(repo: SealedRepository, upsert: Upsert, body: bytes) -> Upsert:
    """Return ``upsert`` with ``body`` sealed under its header in place of its own body."""
    payload = repo.cipher.seal(upsert.header.key_id, body, upsert.header.aad())
    return Upsert(upsert.header, payload, upsert.expected, upsert.labels, tags=upsert.tags)


def test_untagged_bodies_keep_the_layout_sealed_before_tags(repo: SealedRepository) -> None:
    """Without tags a document body is ``{"v", "labels", "document"}`` and bytes use prefix /1."""
    document = repo.prepare(NS, "d", {"n": 1}, expected=Guard.ABSENT, labels={"s": "x"})
    assert _plaintext(repo, document) == canonical_bytes(
        {"v": 1, "labels": {"s": "x"}, "document": {"n": 1}}
    )
    raw = repo.prepare_bytes(NS, "b", b"\x01", expected=Guard.ABSENT)
    assert _plaintext(repo, raw) == BYTES_BODY_PREFIX + (2).to_bytes(4, "big") + b"{}\x01"


def test_tagged_bodies_carry_the_sorted_tags(repo: SealedRepository) -> None:
    """A document body gains ``tags``; a byte body takes prefix /2 with labels and tags."""
    document = repo.prepare(NS, "d", [1], expected=Guard.ABSENT, tags=TAGS)
    assert json.loads(_plaintext(repo, document))["tags"] == sorted(TAGS)
    assert document.tags == TAGS
    raw = repo.prepare_bytes(NS, "b", b"\x01", expected=Guard.ABSENT, tags=TAGS)
    assert _plaintext(repo, raw).startswith(TAGGED_BYTES_PREFIX)
    assert _plaintext(repo, raw).endswith(b"\x01")


def test_a_row_sealed_before_tags_opens_with_no_tags(
    repo: SealedRepository, store: InMemorySecureObjectStore
) -> None:
    """Bodies sealed by hand in the pre-tags layouts open, as documents and as bytes."""
    document = repo.prepare(NS, "d", None, expected=Guard.ABSENT)
    old_document = canonical_bytes({"v": 1, "labels": {}, "document": {"old": True}})
    raw = repo.prepare_bytes(NS, "b", b"", expected=Guard.ABSENT)
    old_bytes = BYTES_BODY_PREFIX + (2).to_bytes(4, "big") + b"{}old"
    store.commit(
        UnitOfWork(
            upserts=[_sealed_as(repo, document, old_document), _sealed_as(repo, raw, old_bytes)]
        )
    )
    opened = repo.read(NS, "d")
    assert opened is not None
    assert opened.document == {"old": True}
    assert opened.metadata.tags == frozenset()
    read = repo.read_bytes(NS, "b")
    assert read is not None
    assert read.data == b"old"


def test_a_body_sealed_with_tags_refuses_a_row_without_them(
    repo: SealedRepository, store: InMemorySecureObjectStore
) -> None:
    """A tagged body stored under a row holding no tags (an edited column) fails closed."""
    upsert = repo.prepare(NS, "d", {"n": 1}, expected=Guard.ABSENT, tags=TAGS)
    stripped = Upsert(upsert.header, upsert.payload, upsert.expected, upsert.labels)
    store.commit(UnitOfWork(upserts=[stripped]))
    with pytest.raises(IntegrityFailure, match="tags differ"):
        repo.read(NS, "d")


def test_tags_must_be_keyed_digests_in_seal_options(repo: SealedRepository) -> None:
    """A malformed tag is refused before anything is sealed."""
    with pytest.raises(InvalidInput):
        repo.prepare(NS, "d", 1, expected=Guard.ABSENT, tags=frozenset({"colour=red"}))
    with pytest.raises(InvalidInput):
        repo.prepare_bytes(NS, "d", b"", expected=Guard.ABSENT, tags=frozenset({"x"}))


def test_archive_lines_carry_tags_and_untagged_lines_are_unchanged() -> None:
    """A line names tags only when the record has some; both kinds read back equal."""
    plain = make_upsert(NS, "plain", labels={"s": "x"})
    tagged = make_upsert(NS, "tagged", tags=TAGS)
    for upsert in (plain, tagged):
        record = StoredRecord(upsert.metadata, upsert.payload)
        assert record_from_line(record_line(record)) == record
    assert "tags" not in json.loads(record_line(StoredRecord(plain.metadata, plain.payload)))
    line = json.loads(record_line(StoredRecord(tagged.metadata, tagged.payload)))
    assert line["tags"] == sorted(TAGS)
    for bad in (["colour=red"], "sha256:" + "1" * 64, [7]):
        edited = canonical_bytes({**line, "tags": bad}) + b"\n"
        with pytest.raises(IntegrityFailure):
            record_from_line(edited)


def test_listing_refuses_what_is_not_a_filter(store: InMemorySecureObjectStore) -> None:
    """A filter that is neither a label nor a tag filter is INVALID_INPUT, not a crash."""
    store.commit(UnitOfWork(upserts=[make_upsert(NS, "a", tags=TAGS)]))
    for bad in (["sha256:" + "1" * 64], [object()], "x"):
        with pytest.raises(InvalidInput):
            store.list(NS, filters=bad)  # type: ignore[arg-type]
    mixed = [TagFilter(min(TAGS)), LabelFilter("missing", 1)]
    assert store.list(NS, filters=mixed).items == ()
