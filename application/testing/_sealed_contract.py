"""The security contract: forged records planted through an adapter's own port fail closed.

Subclass ``SealedRepositoryContract`` and fill ``make_store`` and
``make_cipher`` (and ``make_other_cipher``, a cipher under an unrelated
key). Every forgery here is written with ordinary, valid port calls, as an
attacker with write access to the store would; each read must raise
``IntegrityFailure`` and change nothing.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Literal

import pytest

from flowvault.application import (
    Cipher,
    Guard,
    SealedRepository,
    SecureObjectStore,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.application.testing._fakes import FrozenClock
from flowvault.application.testing._store_contract import StoreHarness
from flowvault.domain import EnvelopeHeader, IntegrityFailure, InvalidInput, SchemaTooNew
from flowvault.domain._envelope import Sensitivity

NS = "sealed"
MARKER = "marker-3f9c1e-plaintext"
KEY_MARKER = "natural-key-7b2d44-person@example.org"


class SealedRepositoryContract(StoreHarness):
    """Sealing over an adapter: round trips, and every forgery fails closed."""

    @abstractmethod
    def make_cipher(self) -> Cipher:
        """Return the cipher the store's records are sealed with."""

    @abstractmethod
    def make_other_cipher(self) -> Cipher:
        """Return a cipher under a different, unrelated key."""

    def repository(
        self, store: SecureObjectStore, cipher: Cipher | None = None
    ) -> SealedRepository:
        """Build the sealed repository under test over ``store``."""
        return SealedRepository(store, cipher or self.make_cipher(), FrozenClock())

    def _stored(self, repo: SealedRepository, key: str) -> StoredRecord:
        record = repo.store.load(NS, repo.key_digest(NS, key))
        assert record is not None
        return record

    def _plant(
        self,
        repo: SealedRepository,
        key: str,
        payload: bytes,
        *,
        expected: int | Literal[Guard.ABSENT] = Guard.ABSENT,
        **changes: object,
    ) -> None:
        """Write ``payload`` under a header for ``key`` through the plain port."""
        revision = 1 if isinstance(expected, Guard) else expected + 1
        digest = repo.key_digest(NS, key)
        current = repo.store.peek_metadata(NS, digest)
        base = (
            current.header
            if current is not None
            else self._stored(repo, "a").metadata.header.model_copy(update={"key_digest": digest})
        )
        header = EnvelopeHeader(**{**base.model_dump(), "revision": revision, **changes})
        labels = {} if current is None else current.labels
        upsert = Upsert(header=header, payload=payload, expected=expected, labels=labels)
        repo.store.commit(UnitOfWork(upserts=[upsert]))

    def _assert_fails_closed(self, read: Callable[[], object], store: SecureObjectStore) -> None:
        """Assert ``read`` raises IntegrityFailure, reveals nothing and writes nothing."""
        before = {space: store.list(space, limit=200) for space in (NS, "elsewhere")}
        with pytest.raises(IntegrityFailure) as caught:
            read()
        assert caught.value.code == "INTEGRITY_FAILURE"
        assert MARKER not in str(caught.value) + repr(caught.value)
        assert {space: store.list(space, limit=200) for space in before} == before

    # -- round trips -------------------------------------------------------

    def test_document_round_trips(self, store: SecureObjectStore) -> None:
        """A written document reads back equal, at the revision written."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER, "n": [1, 2]}, expected=Guard.ABSENT)
        repo.write(NS, "a", {"note": "second"}, expected=1)
        opened = repo.read(NS, "a")
        assert opened is not None
        assert opened.document == {"note": "second"}
        assert opened.revision == 2
        assert repo.read(NS, "absent") is None

    def test_store_never_sees_plaintext_or_natural_key(self, store: SecureObjectStore) -> None:
        """Payload bytes and metadata hold neither the document nor the natural key."""
        repo = self.repository(store)
        repo.write(NS, KEY_MARKER, {"note": MARKER}, expected=Guard.ABSENT, labels={"s": "open"})
        record = self._stored(repo, KEY_MARKER)
        visible = record.payload + repr(record.metadata).encode()
        for secret in (MARKER, KEY_MARKER):
            assert secret.encode() not in visible
        assert record.metadata.key_digest != repo.key_digest(NS, "other")

    def test_natural_key_digest_is_keyed(self, store: SecureObjectStore) -> None:
        """The same natural key digests differently under another store key."""
        ours = self.repository(store)
        theirs = self.repository(store, self.make_other_cipher())
        assert ours.key_digest(NS, "a") != theirs.key_digest(NS, "a")

    def test_expected_class_and_schema_are_enforced(self, store: SecureObjectStore) -> None:
        """Reading with another expected class or an older maximum schema fails closed."""
        repo = self.repository(store)
        repo.write(NS, "a", {"x": 1}, expected=Guard.ABSENT, schema_version=3)
        with pytest.raises(IntegrityFailure):
            repo.read(NS, "a", sensitivity=Sensitivity.PUBLIC)
        with pytest.raises(SchemaTooNew):
            repo.read(NS, "a", max_schema_version=2)
        assert repo.read(NS, "a", sensitivity=Sensitivity.CONFIDENTIAL, max_schema_version=3)

    def test_malformed_identity_is_invalid_input(self, store: SecureObjectStore) -> None:
        """An empty or control-character namespace, or an empty key, is INVALID_INPUT."""
        repo = self.repository(store)
        for namespace, key in (("", "a"), ("bad\nspace", "a"), (NS, "")):
            with pytest.raises(InvalidInput):
                repo.write(namespace, key, {"x": 1}, expected=Guard.ABSENT)
        assert store.list(NS).items == ()

    # -- forgeries ---------------------------------------------------------

    def test_ciphertext_moved_to_another_row_fails(self, store: SecureObjectStore) -> None:
        """Another record's ciphertext planted under this key does not open."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER}, expected=Guard.ABSENT)
        self._plant(repo, "b", self._stored(repo, "a").payload)
        self._assert_fails_closed(lambda: repo.read(NS, "b"), store)

    def test_ciphertext_moved_to_another_namespace_fails(self, store: SecureObjectStore) -> None:
        """A ciphertext copied with its key digest into another namespace does not open."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER}, expected=Guard.ABSENT)
        record = self._stored(repo, "a")
        header = record.metadata.header.model_copy(update={"namespace": "elsewhere"})
        store.commit(
            UnitOfWork(
                upserts=[Upsert(header=header, payload=record.payload, expected=Guard.ABSENT)]
            )
        )
        moved = store.load("elsewhere", record.metadata.key_digest)
        assert moved is not None
        self._assert_fails_closed(
            lambda: repo.open(moved, namespace="elsewhere", key_digest=record.metadata.key_digest),
            store,
        )

    def test_older_revision_replayed_under_newer_fails(self, store: SecureObjectStore) -> None:
        """The bytes of revision 1 written back as revision 3 do not open."""
        repo = self.repository(store)
        repo.write(NS, "a", {"balance": 100}, expected=Guard.ABSENT)
        old = self._stored(repo, "a").payload
        repo.write(NS, "a", {"balance": 0}, expected=1)
        self._plant(repo, "a", old, expected=2)
        self._assert_fails_closed(lambda: repo.read(NS, "a"), store)

    @pytest.mark.parametrize(
        "field", ["sensitivity", "schema_version", "written_at", "key_id", "ledger_index"]
    )
    def test_header_rewritten_around_the_same_ciphertext_fails(
        self, store: SecureObjectStore, field: str
    ) -> None:
        """The same ciphertext under a header differing in one field does not open."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER}, expected=Guard.ABSENT)
        record = self._stored(repo, "a")
        header = record.metadata.header
        change = {
            "sensitivity": Sensitivity.PUBLIC,
            "schema_version": header.schema_version + 1,
            "written_at": header.written_at + timedelta(seconds=1),
            "key_id": "k-forged",
            "ledger_index": 0 if header.ledger_index is None else header.ledger_index + 1,
        }[field]
        forged = replace(
            record,
            metadata=replace(record.metadata, header=header.model_copy(update={field: change})),
        )
        self._assert_fails_closed(
            lambda: repo.open(forged, namespace=NS, key_digest=header.key_digest), store
        )
        self._plant(repo, "a", record.payload, expected=1, **{field: change})
        self._assert_fails_closed(lambda: repo.read(NS, "a"), store)

    def test_truncated_payload_fails(self, store: SecureObjectStore) -> None:
        """A ciphertext cut short does not open."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER}, expected=Guard.ABSENT)
        self._plant(repo, "a", self._stored(repo, "a").payload[:-1], expected=1)
        self._assert_fails_closed(lambda: repo.read(NS, "a"), store)

    def test_ciphertext_under_another_key_fails(self, store: SecureObjectStore) -> None:
        """A value sealed by a cipher under another key does not open."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER}, expected=Guard.ABSENT)
        other = self.repository(store, self.make_other_cipher())
        forged = other.prepare(NS, "x", {"note": "forged"}, expected=Guard.ABSENT).payload
        self._plant(repo, "a", forged, expected=1)
        self._assert_fails_closed(lambda: repo.read(NS, "a"), store)

    def test_wrong_key_fails_and_leaves_data(self, store: SecureObjectStore) -> None:
        """Opening with another key fails closed; the right key still reads the record."""
        repo = self.repository(store)
        repo.write(NS, "a", {"note": MARKER}, expected=Guard.ABSENT)
        record = self._stored(repo, "a")
        stranger = self.repository(store, self.make_other_cipher())
        self._assert_fails_closed(
            lambda: stranger.open(record, namespace=NS, key_digest=record.metadata.key_digest),
            store,
        )
        assert self._stored(repo, "a") == record
        assert repo.read(NS, "a") is not None

    def test_rewritten_labels_fail(self, store: SecureObjectStore) -> None:
        """Plaintext labels that differ from the sealed copy fail closed."""
        repo = self.repository(store)
        repo.write(NS, "a", {"n": 1}, expected=Guard.ABSENT, labels={"status": "pending"})
        record = self._stored(repo, "a")
        forged = replace(record, metadata=replace(record.metadata, labels={"status": "approved"}))
        self._assert_fails_closed(
            lambda: repo.open(forged, namespace=NS, key_digest=record.metadata.key_digest), store
        )

    @pytest.mark.parametrize("kind", ["document", "bytes"])
    def test_tags_are_sealed_and_rewritten_tags_fail(
        self, store: SecureObjectStore, kind: str
    ) -> None:
        """Tags read back as written; a row whose tags differ from the sealed copy fails closed.

        The forgeries keep the row's header and sealed bytes and change only
        its tags: one added, one dropped, all dropped, and tags planted
        through the port on the very row (a write shaped as a re-seal).
        """
        repo = self.repository(store)
        first, second, third = (f"sha256:{n:064x}" for n in (11, 12, 13))
        if kind == "document":
            upsert = repo.prepare(NS, "a", {"n": 1}, expected=Guard.ABSENT, tags={first, second})
        else:
            upsert = repo.prepare_bytes(NS, "a", b"\x00raw", expected=Guard.ABSENT, tags={first})
        store.commit(UnitOfWork(upserts=[upsert]))
        record = self._stored(repo, "a")
        assert record.metadata.tags == upsert.tags
        digest = record.metadata.key_digest

        def read(row: StoredRecord) -> Callable[[], object]:
            if kind == "document":
                return lambda: repo.open(row, namespace=NS, key_digest=digest)
            return lambda: repo.open_bytes(row, namespace=NS, key_digest=digest)

        read(record)()
        repo.verify(record, namespace=NS, key_digest=digest)
        def verify(row: StoredRecord) -> Callable[[], object]:
            return lambda: repo.verify(row, namespace=NS, key_digest=digest)

        for tags in (upsert.tags | {third}, upsert.tags - {first}, frozenset()):
            forged = replace(record, metadata=replace(record.metadata, tags=tags))
            self._assert_fails_closed(read(forged), store)
            self._assert_fails_closed(verify(forged), store)
        planted = replace(
            upsert, expected=1, replaces=record.metadata.payload_digest, tags=frozenset({third})
        )
        store.commit(UnitOfWork(upserts=[planted]))
        self._assert_fails_closed(read(self._stored(repo, "a")), store)
