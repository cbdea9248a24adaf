"""Canonical JSON: one encoding, strict parsing, typed errors only."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowvault.domain import InvalidInput, content_hash
from flowvault.domain._canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    canonical_bytes,
    canonical_json,
    parse_canonical,
    parse_json,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def _nest(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


@given(json_values)
def test_encoding_round_trips(value: object) -> None:
    """Parsing the canonical text of any JSON value gives the value back."""
    assert parse_json(canonical_json(value)) == value
    assert parse_json(canonical_bytes(value)) == value


@given(json_values)
def test_encoding_is_deterministic(value: object) -> None:
    """The canonical text is a fixed point: re-encoding the parse changes nothing."""
    text = canonical_json(value)
    assert canonical_json(parse_json(text)) == text
    assert content_hash(parse_json(text)) == content_hash(value)


@given(st.dictionaries(st.text(max_size=6), st.integers(-9, 9), min_size=2, max_size=8))
def test_key_order_does_not_matter(mapping: dict[str, int]) -> None:
    """Dicts with equal items in a different insertion order encode identically."""
    reversed_mapping = dict(reversed(list(mapping.items())))
    assert canonical_json(mapping) == canonical_json(reversed_mapping)


def test_exact_form() -> None:
    """Keys are sorted, separators are tight and non-ASCII stays UTF-8."""
    assert canonical_json({"b": [1, 2.5, None], "a": "é", "c": True}) == (
        '{"a":"é","b":[1,2.5,null],"c":true}'
    )
    assert canonical_bytes("é") == '"é"'.encode()
    assert (
        content_hash({})
        == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        MAX_SAFE_INTEGER + 1,
        -(MAX_SAFE_INTEGER + 1),
        {1: "non-string key"},
        {"a": 1, 2: "a non-string key after a string one"},
        {None: 1},
        {b"bytes": 1},
        {"\u00e9": 1, "\udfff": 2},
        {"k": "\ud800"},
        {"\udfff": 1},
        b"bytes",
        (1, 2),
        {1, 2},
        object(),
        _nest(MAX_DEPTH + 1),
    ],
)
def test_encoding_refuses_values_outside_the_profile(value: object) -> None:
    """Every out-of-profile value is an INVALID_INPUT, never a bare Python error."""
    with pytest.raises(InvalidInput) as caught:
        canonical_json(value)
    assert caught.value.code == "INVALID_INPUT"


def test_text_keys_are_accepted_whatever_their_script_or_class() -> None:
    """Non-ASCII keys and keys of a ``str`` subclass encode as their text."""

    class Name(str):
        __slots__ = ()

    assert canonical_json({"\u00e9": 1, Name("k"): 2}) == '{"k":2,"\u00e9":1}'


def test_nesting_at_the_limit_is_accepted() -> None:
    """Exactly MAX_DEPTH levels of nesting encode and parse."""
    value = _nest(MAX_DEPTH)
    assert parse_json(canonical_json(value)) == value


def test_self_referencing_list_is_refused() -> None:
    """A cyclic structure ends in InvalidInput, not RecursionError."""
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(InvalidInput):
        canonical_json(loop)


HOSTILE_TEXT = [
    '{"a":1,"a":2}',
    "NaN",
    "[Infinity]",
    "-Infinity",
    "1e400",
    str(MAX_SAFE_INTEGER + 1),
    "1" * 5000,
    '"\\ud800"',
    '{"\\udc00":1}',
    "[" * 100_000 + "]" * 100_000,
    "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "{",
    "",
    "\ufeff{}",
    "[1,]",
]
"""JSON text outside the profile, or not JSON at all."""


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_parsing_refuses_text_outside_the_profile(text: str) -> None:
    """Hostile JSON text is an INVALID_INPUT, never ValueError or RecursionError."""
    with pytest.raises(InvalidInput):
        parse_json(text)


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_canonical_parsing_refuses_text_outside_the_profile(text: str) -> None:
    """The hook-free parse of stored text refuses all the strict parser does."""
    with pytest.raises(InvalidInput):
        parse_canonical(text)


@given(json_values)
def test_canonical_parsing_reads_back_every_encoding(value: object) -> None:
    """Whatever was written canonical is read back as the same value and text."""
    text = canonical_json(value)
    parsed = parse_canonical(text)
    assert parsed == value
    assert canonical_json(parsed) == text


@pytest.mark.parametrize(
    "text",
    [
        '{"b":1,"a":2}',
        '{"a": 1}',
        " 1",
        "1 ",
        "[1, 2]",
        "1.50",
        "1E2",
        "1e2",
        "-0",
        '"\\u00fc"',
        '"\\/"',
    ],
)
def test_canonical_parsing_refuses_other_spellings(text: str) -> None:
    """Text that parses, but not as its value's canonical encoding, is refused."""
    json.loads(text)
    with pytest.raises(InvalidInput):
        parse_canonical(text)


def test_parsing_refuses_invalid_utf8() -> None:
    """Bytes that are not UTF-8 are refused as InvalidInput."""
    with pytest.raises(InvalidInput):
        parse_json(b'"\xff"')


def test_error_messages_do_not_echo_input() -> None:
    """Errors describe the problem without repeating the offending content."""
    with pytest.raises(InvalidInput) as caught:
        parse_json('{"password":"hunter2","password":"x"}')
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in repr(caught.value)


def test_agrees_with_the_standard_parser() -> None:
    """Canonical text is ordinary JSON any parser reads back."""
    value = {"z": [1, {"y": "ü"}], "a": -0.5}
    assert json.loads(canonical_json(value)) == value
