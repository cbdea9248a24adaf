"""The head receipt text format: canonical rendering, strict parsing, signed-note key hints."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta, timezone

import pytest

from flowvault.domain import InvalidInput
from flowvault.domain._receipt import (
    ED25519_ALGORITHM,
    MAX_RECEIPT_BYTES,
    HeadNote,
    HeadReceipt,
    ReceiptSignature,
    key_hint,
    parse_receipt,
)

HEAD = "sha256:" + hashlib.sha256(b"head").hexdigest()
AT = datetime(2026, 11, 30, 7, 0, 1, 123456, tzinfo=UTC)
MAC = ReceiptSignature("flowvault-mac", b"\x01\x02\x03\x04", bytes(range(32)))
SIG = ReceiptSignature("flowvault-ed25519", b"\xaa\xbb\xcc\xdd", bytes(64))


def _note(stream: str = "workflow/0a1b", size: int = 7, first: int = 0) -> HeadNote:
    return HeadNote(stream=stream, size=size, head_hash=HEAD, first_index=first, issued_at=AT)


def _text(note: HeadNote | None = None) -> str:
    return HeadReceipt(note or _note(), (MAC, SIG)).text()


def test_rendering_is_the_documented_layout() -> None:
    """Origin, size, base64 head, extension lines, a blank line, one line per signature."""
    raw_head = base64.b64encode(bytes.fromhex(HEAD.removeprefix("sha256:"))).decode()
    mac = base64.b64encode(MAC.hint + MAC.value).decode()
    sig = base64.b64encode(SIG.hint + SIG.value).decode()
    assert _text() == (
        "flowvault.ledger/workflow/0a1b\n"
        "7\n"
        f"{raw_head}\n"
        "first 0\n"
        "time 2026-11-30T07:00:01.123456Z\n"
        "\n"
        f"\u2014 flowvault-mac {mac}\n"
        f"\u2014 flowvault-ed25519 {sig}\n"
    )


@pytest.mark.parametrize(
    "stream",
    ["scope/main", "a b", "100%", "caf\u00e9/\u2603", "line\nbreak", "x" * 200, "/", "%2F"],
)
def test_any_stream_name_round_trips(stream: str) -> None:
    """The origin line percent-encodes the stream, so spaces, newlines and Unicode survive."""
    receipt = parse_receipt(_text(_note(stream)))
    assert receipt.note.stream == stream
    assert "\n" not in receipt.text().split("\n", 1)[0]


def test_parse_returns_what_was_rendered() -> None:
    """Every field, and the signature lines in order, come back equal."""
    receipt = HeadReceipt(_note(size=2**53, first=5), (MAC, SIG))
    parsed = parse_receipt(receipt.text())
    assert parsed == receipt
    assert parsed.note.head_index == 2**53 - 1
    assert parsed.signed_by("flowvault-mac", MAC.hint) == [MAC]
    assert parsed.signed_by("flowvault-mac", SIG.hint) == []


def _replace(old: str, new: str) -> str:
    text = _text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_replace("flowvault.ledger/", "flowvault.log/"), "first line"),
        (_replace("workflow/0a1b", "workflow%2F0a1b"), "canonically"),
        (_replace("workflow/0a1b", "work flow"), "canonically"),
        (_replace("workflow/0a1b", "%FF"), "UTF-8"),
        (_replace("flowvault.ledger/workflow/0a1b", "flowvault.ledger/"), "canonically"),
        (_replace("\n7\n", "\n07\n"), "leading zeros"),
        (_replace("\n7\n", "\n0\n"), "positive"),
        (_replace("\n7\n", "\n-7\n"), "decimal"),
        (_replace("\n7\n", "\n99999999999999999\n"), "decimal"),
        (_replace("first 0", "first 7"), "within its size"),
        (_replace("first 0", "first  0"), "decimal"),
        (_replace("first 0", "start 0"), "'first'"),
        (_replace("time 2026-11-30T07:00:01.123456Z", "time 2026-11-30T07:00:01Z"), "time"),
        (_replace("time 2026-11-30T07:00:01.123456Z", "time 2026-02-30T07:00:01.000000Z"), "real"),
        (_replace("\n\n", "\n"), "blank line"),
        (_replace("\n\n", "\nextra\n\n"), "five lines"),
        (_text() + "\n", "signature lines"),
        (_text() + "trailing", "newline"),
        (_text().replace("\n", "\r\n"), "CR"),
        (_replace("\u2014 flowvault-mac", "- flowvault-mac"), "signature line"),
        (_replace("\u2014 flowvault-mac", "\u2014 flowvault+mac"), "signature line"),
        (_replace("\u2014 flowvault-mac ", "\u2014 flowvault-mac  "), "signature line"),
        (_text()[:-1] + "=\n", "base64"),
        (_text() + "\u2014 x AQID\n", "too short"),
        (_text() + "\u2014 x !!!!\n", "base64"),
    ],
)
def test_anything_but_the_canonical_form_is_refused(text: str, why: str) -> None:
    """A receipt that parses is byte for byte what was signed; the message says what is wrong."""
    with pytest.raises(InvalidInput) as refused:
        parse_receipt(text)
    assert why in refused.value.message


def test_a_head_of_the_wrong_length_is_refused() -> None:
    """The head line must decode to exactly 32 bytes."""
    short = base64.b64encode(b"\x00" * 31).decode()
    raw_head = base64.b64encode(bytes.fromhex(HEAD.removeprefix("sha256:"))).decode()
    with pytest.raises(InvalidInput, match="32 bytes"):
        parse_receipt(_replace(raw_head, short))


def test_size_and_signature_count_are_bounded() -> None:
    """At most 16 signature lines and 8 KiB of text; non-text is refused."""
    many = HeadReceipt(_note(), (MAC,) * 17).text()
    with pytest.raises(InvalidInput, match=r"1\.\.16 signature lines"):
        parse_receipt(many)
    assert len(parse_receipt(HeadReceipt(_note(), (MAC,) * 16).text()).signatures) == 16
    huge = HeadReceipt(_note(), (ReceiptSignature("x", b"abcd", bytes(MAX_RECEIPT_BYTES)),))
    with pytest.raises(InvalidInput, match="at most 8192 bytes"):
        parse_receipt(huge.text())
    for value in (None, b"bytes", 3, "\udc80"):
        with pytest.raises(InvalidInput):
            parse_receipt(value)


@pytest.mark.parametrize(
    "fields",
    [
        {"stream": ""},
        {"stream": "x" * 201},
        {"stream": "\udc80"},
        {"size": 0},
        {"size": True},
        {"size": 2**53 + 1},
        {"first_index": -1},
        {"first_index": 7},
        {"head_hash": "sha256:XYZ"},
        {"issued_at": datetime(2026, 1, 1)},
    ],
)
def test_a_note_no_stream_could_have_is_refused(fields: dict[str, object]) -> None:
    """Notes are validated when built, so no unrenderable note exists."""
    values: dict[str, object] = {
        "stream": "s",
        "size": 7,
        "head_hash": HEAD,
        "first_index": 0,
        "issued_at": AT,
    }
    with pytest.raises(InvalidInput):
        HeadNote(**{**values, **fields})  # type: ignore[arg-type]


def test_times_are_rendered_in_utc() -> None:
    """An instant in another zone renders as the same UTC instant."""
    elsewhere = AT.astimezone(timezone(timedelta(hours=5, minutes=30)))
    note = HeadNote(stream="s", size=1, head_hash=HEAD, first_index=0, issued_at=elsewhere)
    assert "time 2026-11-30T07:00:01.123456Z\n" in note.body()
    assert parse_receipt(HeadReceipt(note, (MAC,)).text()).note.issued_at == AT


def test_key_hint_follows_signed_notes() -> None:
    """The hint is the first 4 bytes of SHA-256(name, newline, algorithm byte, public key)."""
    public = bytes(range(32))
    expected = hashlib.sha256(b"flowvault-ed25519\n\x01" + public).digest()[:4]
    assert key_hint("flowvault-ed25519", ED25519_ALGORITHM, public) == expected
