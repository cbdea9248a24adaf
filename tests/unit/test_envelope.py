"""The envelope header: validated fields, and AAD that covers every one of them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowvault.application.testing import make_header
from flowvault.application.testing._fakes import EPOCH
from flowvault.domain import EnvelopeHeader, Fingerprint, InvalidInput
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._envelope import Sensitivity, aad_fields, format_instant, natural_key_digest
from flowvault.domain._fingerprint import Readability, Receipt

CHANGES: dict[str, object] = {
    "namespace": "other",
    "key_digest": natural_key_digest("ns", "other"),
    "sensitivity": Sensitivity.RESTRICTED,
    "schema_version": 2,
    "key_id": "k2",
    "revision": 2,
    "written_at": EPOCH + timedelta(microseconds=1),
}


def test_aad_is_canonical_and_versioned() -> None:
    """The AAD is canonical JSON that names its format version."""
    aad = make_header("ns", "a").aad()
    assert aad.startswith(b'{"format":"flowvault.envelope/1"')
    assert aad == make_header("ns", "a").aad()


_printable = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp")), min_size=1, max_size=40
)


@given(
    namespace=_printable,
    revision=st.integers(1, 2**53 - 1),
    schema_version=st.integers(1, 2**31 - 1),
    ledger_index=st.none() | st.integers(0, 2**53 - 1),
    sensitivity=st.sampled_from(Sensitivity),
    key_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    micros=st.integers(0, 10**15),
)
def test_aad_is_the_canonical_json_of_its_fields(
    *,
    namespace: str,
    revision: int,
    schema_version: int,
    ledger_index: int | None,
    sensitivity: Sensitivity,
    key_id: str,
    micros: int,
) -> None:
    """The AAD written out field by field is byte for byte the general canonical encoding."""
    header = EnvelopeHeader(
        namespace=namespace,
        key_digest=natural_key_digest("ns", namespace),
        sensitivity=sensitivity,
        schema_version=schema_version,
        key_id=key_id,
        revision=revision,
        written_at=EPOCH + timedelta(microseconds=micros),
        ledger_index=ledger_index,
    )
    assert header.aad() == canonical_bytes(aad_fields(header))


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_every_field_changes_the_aad(field: str) -> None:
    """Changing any single header field changes the associated data."""
    header = make_header("ns", "a")
    changed = header.model_copy(update={field: CHANGES[field]})
    assert changed.aad() != header.aad()


def test_written_at_is_normalised_to_utc() -> None:
    """The same instant in another zone gives the same header and AAD."""
    shifted = EPOCH.astimezone(timezone(timedelta(hours=5)))
    assert make_header("ns", "a", written_at=shifted).aad() == make_header("ns", "a").aad()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace", ""),
        ("namespace", "x" * 129),
        ("namespace", "line\nbreak"),
        ("namespace", "bidi\u202eoverride"),
        ("key_digest", "sha256:short"),
        ("key_digest", "plain-natural-key"),
        ("schema_version", 0),
        ("revision", 0),
        ("key_id", "bad key"),
        ("written_at", datetime(2026, 1, 1)),
    ],
)
def test_invalid_fields_are_refused(field: str, value: object) -> None:
    """Headers with malformed fields cannot be built."""
    fields = make_header("ns", "a").model_dump()
    fields[field] = value
    with pytest.raises(InvalidInput):
        EnvelopeHeader(**fields)


def test_natural_key_digest_binds_the_namespace() -> None:
    """Equal natural keys in two namespaces have different digests."""
    assert natural_key_digest("a", "k") != natural_key_digest("b", "k")
    assert natural_key_digest("a", "k") == natural_key_digest("a", "k")


def test_format_instant_sorts_as_text() -> None:
    """Formatted instants are fixed width, so text order is time order."""
    early, late = EPOCH, EPOCH + timedelta(microseconds=5)
    assert format_instant(early) < format_instant(late)
    assert format_instant(early) == "2026-01-01T00:00:00.000000Z"


def test_fingerprint_of_absent_record_carries_no_metadata() -> None:
    """An absent fingerprint needs only identity and readability."""
    print_ = Fingerprint(
        namespace="ns", key_digest=natural_key_digest("ns", "a"), readability=Readability.ABSENT
    )
    assert print_.byte_length is None
    assert print_.model_dump(mode="json")["readability"] == "absent"


class _DecisionReceipt(Receipt):
    kind = "decision"
    plain_fields = frozenset({"outcome"})
    subject: str
    outcome: str


def test_receipt_digest_is_stable_and_covers_fields() -> None:
    """A receipt's digest is deterministic and changes with any field."""
    subject = natural_key_digest("ns", "wf")
    receipt = _DecisionReceipt(issued_at=EPOCH, subject=subject, outcome="approved")
    same = _DecisionReceipt(issued_at=EPOCH, subject=subject, outcome="approved")
    other = _DecisionReceipt(issued_at=EPOCH, subject=subject, outcome="rejected")
    assert receipt.digest == same.digest != other.digest
    assert receipt.body()["kind"] == "decision"


def test_receipt_refuses_free_text() -> None:
    """A string field that is neither a digest nor declared plain is refused."""
    with pytest.raises(InvalidInput):
        _DecisionReceipt(issued_at=EPOCH, subject="alice@example.com", outcome="approved")
