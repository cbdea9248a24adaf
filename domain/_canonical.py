"""Canonical JSON (an I-JSON profile) and content hashing.

One encoding for everything that is hashed, signed or used as associated
data: keys sorted by code point, UTF-8, no insignificant whitespace. Values
outside the profile are refused with ``InvalidInput`` before any encoder or
parser can fail with a bare ``ValueError``, ``UnicodeError`` or
``RecursionError``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from typing import Final, TypeAlias

from flowvault.domain._errors import InvalidInput

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer magnitude every I-JSON reader can represent exactly."""

MAX_DEPTH = 64
"""Deepest container nesting accepted; a scalar is depth 0, ``[]`` depth 1."""

DIGEST_PREFIX = "sha256:"


class _Rejected(Exception):
    """Internal signal from parser hooks; always converted to InvalidInput."""


def _check_string(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{where} contains a lone surrogate") from None


def _check_scalar(value: object) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise InvalidInput("integer outside +-(2^53-1)")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput("NaN, Infinity and numbers past a double's range are not JSON")
        return
    if isinstance(value, str):
        _check_string(value, "string")
        return
    raise InvalidInput(f"{type(value).__name__} is not a JSON type")


def _check_keys(item: dict[object, object]) -> None:
    for key in item:
        if type(key) is str and key.isascii():
            continue
        if not isinstance(key, str):
            raise InvalidInput("object keys must be strings")
        _check_string(key, "object key")


def _check_container(item: dict[object, object] | list[object], depth: int) -> None:
    """Check one container and, recursively, everything in it.

    Recursion stops at ``MAX_DEPTH`` (far below Python's own limit), so
    hostile nesting or a self-referencing list ends in ``InvalidInput``.
    The common exact types are dispatched inline; subclasses and anything
    else go through the general checks.
    """
    if depth >= MAX_DEPTH:
        raise InvalidInput(f"nesting deeper than {MAX_DEPTH}")
    children: Iterable[object]
    if isinstance(item, dict):
        _check_keys(item)
        children = item.values()
    else:
        children = item
    inner = depth + 1
    for child in children:
        kind = type(child)
        if kind is str:
            if not child.isascii():  # type: ignore[attr-defined]  # kind is str
                _check_string(child, "string")  # type: ignore[arg-type]  # kind is str
        elif kind is int:
            if not -MAX_SAFE_INTEGER <= child <= MAX_SAFE_INTEGER:  # type: ignore[operator]
                raise InvalidInput("integer outside +-(2^53-1)")
        elif kind is dict or kind is list:
            _check_container(child, inner)  # type: ignore[arg-type]  # kind is dict or list
        elif child is not None and kind is not bool:
            _check_value(child, inner)


def _check_value(value: object, depth: int) -> None:
    if isinstance(value, dict | list):
        _check_container(value, depth)
    else:
        _check_scalar(value)


def validate_json(value: object) -> JsonValue:
    """Check that ``value`` lies inside the profile and return it unchanged.

    Hostile nesting (or a self-referencing list) ends in ``InvalidInput``
    at ``MAX_DEPTH`` instead of exhausting the stack.
    """
    _check_value(value, 0)
    return value  # type: ignore[return-value]  # checked structurally above


_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""Built once: ``json.dumps`` with these options builds a new encoder on every call."""


quote_string: Final[Callable[[str], str]] = json.encoder.encode_basestring
"""The canonical text of a string known to be inside the profile: the encoder's own quoting.

For building canonical text from parts without walking a value; give it
only strings already checked (ASCII ones always are).
"""


def canonical_json(value: object) -> str:
    """Return the canonical text of a JSON value, or raise ``InvalidInput``."""
    validate_json(value)
    return _ENCODER.encode(value)


def canonical_bytes(value: object) -> bytes:
    """Return the canonical UTF-8 bytes of a JSON value."""
    return canonical_json(value).encode("utf-8")


def digest_bytes(data: bytes) -> str:
    """Return ``sha256:<hex>`` of raw bytes."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def content_hash(value: object) -> str:
    """Return ``sha256:<hex>`` of the canonical form of a JSON value."""
    return digest_bytes(canonical_bytes(value))


def _pairs(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Rejected("duplicate object key")
    return result


def _constant(_: str) -> float:
    raise _Rejected("NaN and Infinity are not JSON")


_STRICT_DECODER: Final = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant)
_PLAIN_DECODER: Final = json.JSONDecoder()


def parse_json(data: str | bytes) -> JsonValue:
    """Parse JSON text strictly into a value inside the profile.

    Rejects invalid UTF-8, duplicate keys, NaN/Infinity, out-of-range
    numbers, lone surrogates and excessive nesting, all as ``InvalidInput``.
    Numbers are range-checked by the walk over the parsed value (a number
    past a double's range parses as infinity, which the walk refuses), so
    only objects and the NaN/Infinity literals need parser hooks.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("JSON text is not valid UTF-8") from None
    elif isinstance(data, str):
        text = data
    else:
        raise InvalidInput(f"JSON text must be str or bytes, not {type(data).__name__}")
    try:
        value = _STRICT_DECODER.decode(text)
    except _Rejected as exc:
        raise InvalidInput(str(exc)) from None
    except RecursionError:
        raise InvalidInput(f"nesting deeper than {MAX_DEPTH}") from None
    except ValueError:
        raise InvalidInput("malformed JSON text") from None
    return validate_json(value)


def parse_canonical(text: str) -> JsonValue:
    """Parse text that must be exactly the canonical encoding of its value.

    For stored text that was written canonical: the parse needs no Python
    hooks, because re-encoding the value and comparing it with ``text``
    refuses everything they would (a duplicate key, a NaN literal) and also
    any text that is not canonical (whitespace, key order, number or escape
    spelling), so a value can be hashed as the very text it was read from.
    Raises ``InvalidInput`` for anything else.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"JSON text must be str, not {type(text).__name__}")
    try:
        value = _PLAIN_DECODER.decode(text)
    except RecursionError:
        raise InvalidInput(f"nesting deeper than {MAX_DEPTH}") from None
    except ValueError:
        raise InvalidInput("malformed JSON text") from None
    checked = validate_json(value)
    if _ENCODER.encode(checked) != text:
        raise InvalidInput("JSON text is not in canonical form")
    return checked
