"""Make arbitrary Python values safe to write into the audit ledger.

The ledger is append-only and widely readable, so nothing secret may ever
enter it. ``sanitise_payload`` redacts values under secret-looking keys,
bounds depth, width, string length and total size, and maps every value
outside the canonical JSON profile to a harmless marker instead of failing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from flowvault.domain._canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    JsonValue,
    canonical_bytes,
    content_hash,
)
from flowvault.domain._errors import InvalidInput

REDACTED = "[REDACTED]"
"""Replaces the whole value under a secret-looking key, whatever its type."""
TRUNCATED = "[TRUNCATED]"
"""Replaces a container nested past ``max_depth``; also ends a cut list."""
TRUNCATED_SUFFIX = "…[TRUNCATED]"
"""Appended to a string (or key) cut at ``max_string`` characters."""
OUT_OF_RANGE = "[OUT_OF_RANGE]"
"""Replaces an integer that I-JSON readers cannot represent exactly."""
UNSUPPORTED_PREFIX = "[UNSUPPORTED:"
"""Starts ``[UNSUPPORTED:<typename>]``; only the type name is ever shown."""

MAX_ITEMS = 100
"""Most list items or mapping entries kept from any one container."""

SECRET_FRAGMENTS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "authorization",
        "privatekey",
        "credential",
        "cookie",
        "sessionid",
        "signature",
        "accesskey",
        "clientsecret",
    }
)
"""A normalised key containing any of these is treated as secret."""
SECRET_KEYS = frozenset({"auth", "pin", "ssn"})
"""Normalised keys that are secret only when they are the whole key."""

_KEY_SEPARATORS = str.maketrans("", "", "-_ .")
_SURROGATES = dict.fromkeys(range(0xD800, 0xE000), "\ufffd")
_WORK_FACTOR = 64
_MIN_MAX_STRING = len(content_hash(None))


def _summary(size: int | None, digest: str | None) -> dict[str, JsonValue]:
    return {"truncated": True, "bytes": size, "digest": digest}


_SUMMARY_CEILING = len(canonical_bytes(_summary(MAX_SAFE_INTEGER, content_hash(None))))


class _OverBudget(Exception):
    """Internal signal that the walk has spent its work allowance."""


def is_secret_key(key: str) -> bool:
    """Tell whether a mapping key looks like it names a secret.

    Matching is by substring on a normalised key, so it errs towards
    redaction: ``token_count`` or ``tokenizer_name`` are redacted too,
    because a missed secret in an append-only ledger cannot be undone.
    """
    normalised = key.lower().translate(_KEY_SEPARATORS)
    if normalised in SECRET_KEYS:
        return True
    return any(fragment in normalised for fragment in SECRET_FRAGMENTS)


def _clean_text(text: str) -> str:
    """Replace every surrogate one-for-one, so lengths and cuts stay stable."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.translate(_SURROGATES)
    return text


def _clip(text: str, limit: int) -> str:
    """Cut before cleaning so a huge string costs no more than ``limit``."""
    if len(text) <= limit:
        return _clean_text(text)
    return _clean_text(text[:limit]) + TRUNCATED_SUFFIX


def _key_text(key: object) -> str | None:
    """Map a mapping key to text, or ``None`` when the key must be dropped."""
    kind = type(key)
    if issubclass(kind, str):
        return _clean_text(str.__str__(cast("str", key)))
    if key is None or kind is bool:
        return str(key)
    if issubclass(kind, int):
        number = int.__int__(cast("int", key))
        return str(number) if abs(number) <= MAX_SAFE_INTEGER else OUT_OF_RANGE
    return None


@dataclass(slots=True)
class _Walker:
    """One sanitising pass: its limits and the work it may still spend."""

    max_depth: int
    max_string: int
    budget: int

    def spend(self, units: int) -> None:
        self.budget -= units
        if self.budget < 0:
            raise _OverBudget

    def text(self, text: str) -> str:
        clipped = _clip(text, self.max_string)
        self.spend(1 + len(clipped))
        return clipped

    def walk(self, value: object, depth: int) -> JsonValue:
        kind = type(value)
        is_mapping = issubclass(kind, dict)
        if not is_mapping and not issubclass(kind, list | tuple):
            return self.scalar(value)
        if depth >= self.max_depth:
            return self.text(TRUNCATED)
        if is_mapping:
            return self.mapping(cast("dict[object, object]", value), depth)
        window = slice(None, MAX_ITEMS + 1)
        if issubclass(kind, list):
            return self.sequence(list.__getitem__(cast("list[object]", value), window), depth)
        return self.sequence(tuple.__getitem__(cast("tuple[object, ...]", value), window), depth)

    def scalar(self, value: object) -> JsonValue:
        kind = type(value)
        self.spend(1)
        if value is None or kind is bool:
            return cast("bool | None", value)
        if issubclass(kind, int):
            number = int.__int__(cast("int", value))
            return number if abs(number) <= MAX_SAFE_INTEGER else self.text(OUT_OF_RANGE)
        if issubclass(kind, float):
            real = float.__float__(cast("float", value))
            return real if math.isfinite(real) else None
        if issubclass(kind, str):
            return self.text(str.__str__(cast("str", value)))
        return self.text(f"{UNSUPPORTED_PREFIX}{_clean_text(kind.__name__)}]")

    def sequence(self, head: Sequence[object], depth: int) -> JsonValue:
        """Walk a plain slice of at most one item past the limit, never the whole input."""
        self.spend(1)
        kept = [self.walk(item, depth + 1) for item in head[:MAX_ITEMS]]
        if len(head) > MAX_ITEMS:
            kept.append(self.text(TRUNCATED))
        return kept

    def mapping(self, value: dict[object, object], depth: int) -> JsonValue:
        self.spend(1)
        entries: dict[str, object] = {}
        for key, item in dict.items(value):
            self.spend(1)
            text = _key_text(key)
            if text is not None:
                entries.setdefault(text, item)
        result: dict[str, JsonValue] = {}
        for text in heapq.nsmallest(MAX_ITEMS, entries):
            shown = self.text(text)
            if shown in result:
                continue
            if is_secret_key(text):
                result[shown] = self.text(REDACTED)
            else:
                result[shown] = self.walk(entries[text], depth + 1)
        return result


def _check_limits(max_depth: int, max_string: int, max_bytes: int) -> None:
    """Refuse limits under which a sanitised payload would not be a fixed point."""
    if any(type(limit) is not int for limit in (max_depth, max_string, max_bytes)):
        raise InvalidInput("max_depth, max_string and max_bytes must be integers")
    if not 1 <= max_depth <= MAX_DEPTH:
        raise InvalidInput(f"max_depth must be within 1..{MAX_DEPTH}")
    if max_string < _MIN_MAX_STRING:
        raise InvalidInput(f"max_string must be at least {_MIN_MAX_STRING}")
    if max_bytes < _SUMMARY_CEILING:
        raise InvalidInput(f"max_bytes must be at least {_SUMMARY_CEILING}")


def sanitise_payload(
    value: object,
    *,
    max_depth: int = 8,
    max_string: int = 1024,
    max_bytes: int = 16384,
) -> JsonValue:
    """Return a ledger-safe JSON copy of ``value``; never raises for its content.

    Rules, applied in one pure pass that never mutates ``value``:

    * a value under a secret-looking key (see ``is_secret_key``) becomes
      ``REDACTED`` without being looked at;
    * containers nested deeper than ``max_depth`` levels (``[]`` is one
      level) become ``TRUNCATED``, which also ends self-referencing cycles;
    * a list or tuple keeps its first ``MAX_ITEMS`` items followed by
      ``TRUNCATED``; a mapping silently keeps its ``MAX_ITEMS`` smallest
      keys, since a marker key could collide with a real one;
    * strings and keys longer than ``max_string`` characters are cut and end
      in ``TRUNCATED_SUFFIX``; surrogates become U+FFFD;
    * keys that are ``int``, ``bool`` or ``None`` become ``str(key)``; other
      key types are dropped; when two keys end up equal the first wins;
    * NaN and infinities become ``None``, integers beyond +-(2^53-1) become
      ``OUT_OF_RANGE``, tuples become lists, and anything else becomes
      ``[UNSUPPORTED:<typename>]``: its ``str`` or ``repr`` could leak.

    If the canonical encoding still exceeds ``max_bytes``, the result is
    ``{"truncated": true, "bytes": <size>, "digest": <content_hash>}``. The
    digest is taken after redaction, so it commits to no secret; it lets a
    holder of the full payload prove it is the one that was logged. A value
    whose walk exceeds ``64 * max_bytes`` units of work (an item inspected or
    a character kept each cost one; only reachable with shared references or
    huge mappings) gets ``bytes`` and ``digest`` of ``None``, since measuring
    it would cost the very work the bound refuses.

    The output is a fixed point: sanitising it again with the same limits
    returns an equal value. Limits too small for that are ``InvalidInput``.
    """
    _check_limits(max_depth, max_string, max_bytes)
    walker = _Walker(max_depth=max_depth, max_string=max_string, budget=max_bytes * _WORK_FACTOR)
    try:
        result = walker.walk(value, 0)
    except _OverBudget:
        return _summary(None, None)
    size = len(canonical_bytes(result))
    if size > max_bytes:
        return _summary(size, content_hash(result))
    return result


__all__ = [
    "MAX_ITEMS",
    "OUT_OF_RANGE",
    "REDACTED",
    "SECRET_FRAGMENTS",
    "SECRET_KEYS",
    "TRUNCATED",
    "TRUNCATED_SUFFIX",
    "UNSUPPORTED_PREFIX",
    "is_secret_key",
    "sanitise_payload",
]
