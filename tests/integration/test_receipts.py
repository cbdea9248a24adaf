"""Head receipts on every backend: issued, authenticated, and compared with a store later.

A store that "goes back" is built as a second store holding a prefix of the
first one's events (an older copy), or the same prefix followed by other
events (a fork); the comparison only sees the port, so it is the same on
every adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flowvault.adapters.crypto import AesGcmCipher, Ed25519ReceiptSigner
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    LedgerAudit,
    LedgerTrim,
    SealedRepository,
    SecureObjectStore,
    UnitOfWork,
)
from flowvault.application._keys import KeyRing
from flowvault.application._receipts import (
    ReceiptDefect,
    ReceiptMac,
    authenticate,
    compare_with_receipt,
    issue_receipt,
)
from flowvault.application.testing import FrozenClock
from flowvault.application.testing._fakes import EPOCH
from flowvault.domain import IntegrityFailure, InvalidInput, LedgerEvent, NotFound
from flowvault.domain._ledger import GENESIS_HASH
from flowvault.domain._receipt import HeadReceipt, parse_receipt

STREAM = "workflow/receipts"


def _repository(store: SecureObjectStore, key: bytes = bytes(range(32))) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher.from_ring(KeyRing(primary=key)), FrozenClock())


def _append(store: SecureObjectStore, notes: Sequence[str]) -> None:
    """Append one event per note, chained onto the stream's head."""
    head = store.ledger_head(STREAM)
    index, previous = (0, GENESIS_HASH) if head is None else (head.index + 1, head.event_hash)
    for note in notes:
        event = LedgerEvent.create(
            stream=STREAM,
            index=index,
            type="workflow.noted",
            occurred_at=EPOCH,
            payload={"note": note},
            previous_hash=previous,
        )
        store.commit(UnitOfWork(appends=[event]))
        index, previous = index + 1, event.event_hash


def _receipt(store: SecureObjectStore) -> HeadReceipt:
    return issue_receipt(store, _repository(store), STREAM, issued_at=EPOCH)


def test_a_receipt_describes_the_head_and_carries_a_mac(backend_store: SecureObjectStore) -> None:
    """Size, head hash and first index are the stream's; the MAC verifies under the key."""
    _append(backend_store, ["a", "b", "c"])
    receipt = _receipt(backend_store)
    head = backend_store.ledger_head(STREAM)
    assert head is not None
    assert (receipt.note.size, receipt.note.head_hash, receipt.note.first_index) == (
        3,
        head.event_hash,
        0,
    )
    assert [s.name for s in receipt.signatures] == ["flowvault-mac"]
    authenticate(parse_receipt(receipt.text()), ReceiptMac(_repository(backend_store)))
    assert compare_with_receipt(backend_store, receipt.note) is None
    _append(backend_store, ["d"])
    assert compare_with_receipt(backend_store, receipt.note) is None
    with pytest.raises(NotFound):
        issue_receipt(backend_store, _repository(backend_store), "workflow/none", issued_at=EPOCH)


def test_an_older_copy_and_deleted_events_show_as_truncation(
    backend_store: SecureObjectStore,
) -> None:
    """A store holding only a prefix of what a receipt saw fails it, chain intact or not."""
    _append(backend_store, ["a", "b"])
    older = InMemorySecureObjectStore()
    _append(older, ["a", "b"])
    _append(backend_store, ["c", "d", "e"])
    receipt = _receipt(backend_store)
    report = LedgerAudit(older, None).run([STREAM])
    assert report.ok, "the older copy is a perfectly intact chain on its own"
    mismatch = compare_with_receipt(older, receipt.note)
    assert mismatch is not None
    assert (mismatch.defect, mismatch.index) == (ReceiptDefect.TRUNCATED, 4)
    assert "ends at index 1" in mismatch.reason
    against = LedgerAudit(older, None).against([receipt])
    assert not against.ok
    assert [(f.stream, f.defect) for f in against.failures] == [(STREAM, ReceiptDefect.TRUNCATED)]
    missing = LedgerAudit(InMemorySecureObjectStore(), None).against([receipt])
    assert [f.defect for f in missing.failures] == [ReceiptDefect.TRUNCATED]
    assert "holds no events" in missing.failures[0].reason


def test_a_fork_or_rewritten_history_shows_as_rewritten(backend_store: SecureObjectStore) -> None:
    """The same size, or longer, with another event at the receipt's index fails it."""
    _append(backend_store, ["a", "b", "c"])
    receipt = _receipt(backend_store)
    for forked_tail in (["X"], ["X", "d", "e"]):
        fork = InMemorySecureObjectStore()
        _append(fork, ["a", "b", *forked_tail])
        assert LedgerAudit(fork, None).run([STREAM]).ok
        mismatch = compare_with_receipt(fork, receipt.note)
        assert mismatch is not None
        assert (mismatch.defect, mismatch.index) == (ReceiptDefect.REWRITTEN, 2)


def test_a_trimmed_stream_cannot_vouch_for_an_old_receipt(
    backend_store: SecureObjectStore,
) -> None:
    """Retention past the receipt's head is reported, never passed silently."""
    _append(backend_store, ["a", "b"])
    receipt = _receipt(backend_store)
    _append(backend_store, ["c", "d"])
    backend_store.commit(UnitOfWork(trims=[LedgerTrim(STREAM, 3)]))
    mismatch = compare_with_receipt(backend_store, receipt.note)
    assert mismatch is not None
    assert mismatch.defect is ReceiptDefect.UNANCHORED
    assert "keep a newer receipt" in mismatch.reason
    fresh = _receipt(backend_store)
    assert fresh.note.first_index == 3
    assert compare_with_receipt(backend_store, fresh.note) is None


def test_only_the_issuing_key_authenticates_a_receipt() -> None:
    """An altered receipt, or one issued under another store key, fails the MAC check."""
    store = InMemorySecureObjectStore()
    _append(store, ["a"])
    receipt = _receipt(store)
    mac = ReceiptMac(_repository(store))
    authenticate(receipt, mac)
    stranger = ReceiptMac(_repository(store, key=bytes(range(64, 96))))
    with pytest.raises(IntegrityFailure, match="no flowvault-mac line for this key"):
        authenticate(receipt, stranger)
    altered = parse_receipt(
        receipt.text().replace("\n1\n", "\n2\n", 1).replace("first 0", "first 1")
    )
    with pytest.raises(IntegrityFailure, match="altered or forged"):
        authenticate(altered, mac)
    with pytest.raises(InvalidInput):
        LedgerAudit(store, None).against(["not a receipt"])  # type: ignore[list-item]


def test_an_ed25519_signature_is_checked_with_the_public_key_alone() -> None:
    """The signature line verifies with the verifier; a different key or an edit fails."""
    store = InMemorySecureObjectStore()
    _append(store, ["a", "b"])
    signer = Ed25519ReceiptSigner(Ed25519PrivateKey.generate())
    receipt = issue_receipt(store, _repository(store), STREAM, issued_at=EPOCH, signers=(signer,))
    assert [s.name for s in receipt.signatures] == ["flowvault-mac", "flowvault-ed25519"]
    assert len(receipt.signatures[1].value) == 64
    authenticate(parse_receipt(receipt.text()), signer.verifier())
    other = Ed25519ReceiptSigner(Ed25519PrivateKey.generate()).verifier()
    with pytest.raises(IntegrityFailure, match="no flowvault-ed25519 line"):
        authenticate(receipt, other)
    forged = parse_receipt(receipt.text().replace("time 2026", "time 2027"))
    with pytest.raises(IntegrityFailure, match="altered or forged"):
        authenticate(forged, signer.verifier())
    assert repr(signer) == f"Ed25519ReceiptSigner(hint={signer.hint.hex()})"
