"""Row edits made through the store port, as a database editor leaves them, and their refusal."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowvault.application import (
    Delete,
    Guard,
    SealedRepository,
    SecureObjectStore,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.application._streams import read_stream
from flowvault.domain import IntegrityFailure, LedgerEvent
from flowvault.domain._canonical import canonical_json


class PassThroughStore:
    """A store passing everything through, for tests that change one method."""

    def __init__(self, inner: SecureObjectStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class RowEditor:
    """Reads and rewrites sealed rows beside the services, addressed as the repository keys them."""

    def __init__(self, store: SecureObjectStore, repository: SealedRepository) -> None:
        self.store = store
        self.repository = repository

    def digest(self, namespace: str, natural_key: str) -> str:
        return self.repository.key_digest(namespace, natural_key)

    def row(self, namespace: str, natural_key: str) -> StoredRecord:
        stored = self.store.load(namespace, self.digest(namespace, natural_key))
        assert stored is not None
        return stored

    def replay(self, old: StoredRecord) -> None:
        """Put an older row back whole, header and ciphertext, as a database editor could.

        The port never lets a revision go back, so whatever stands there is
        deleted first and the old row written where it stood.
        """
        metadata = old.metadata
        if self.store.peek_metadata(metadata.namespace, metadata.key_digest) is not None:
            self.delete(metadata.namespace, metadata.key_digest)
        expected = Guard.ABSENT if metadata.revision == 1 else Guard.ANY
        upsert = Upsert(
            header=metadata.header, payload=old.payload, expected=expected, labels=metadata.labels
        )
        self.store.commit(UnitOfWork(upserts=[upsert]))

    def delete(self, namespace: str, key_digest: str) -> None:
        """Delete a row whole, leaving its streams as they are."""
        self.store.commit(UnitOfWork(deletes=[Delete(namespace, key_digest, Guard.ANY)]))

    def events(self, stream: str) -> list[LedgerEvent]:
        return list(read_stream(self.store, stream))


def refused(call: Callable[[], object], wording: str, *secrets: str) -> IntegrityFailure:
    """Assert ``call`` fails as INTEGRITY_FAILURE naming its event, with none of ``secrets``."""
    with pytest.raises(IntegrityFailure) as caught:
        call()
    failure = caught.value
    assert failure.code == "INTEGRITY_FAILURE"
    assert wording in str(failure)
    assert "ledger_index" in failure.details
    for text in (str(failure), repr(failure), canonical_json(dict(failure.details))):
        for secret in secrets:
            assert secret not in text
    return failure
