from __future__ import annotations

import datetime
import enum
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowvault.domain._canonical import (
    MAX_SAFE_INTEGER,
    canonical_bytes,
    canonical_json,
    content_hash,
    validate_json,
)
from flowvault.domain._errors import InvalidInput
from flowvault.domain._sanitise import (
    MAX_ITEMS,
    OUT_OF_RANGE,
    REDACTED,
    TRUNCATED,
    TRUNCATED_SUFFIX,
    is_secret_key,
    sanitise_payload,
)

SENTINEL = "leak-sentinel-7f3a"


def _nesting(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_nesting(child) for child in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_nesting(child) for child in value), default=0)
    return 0


def _nested_lists(levels: int, leaf: object = "leaf") -> object:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


class _Leaky:
    def __repr__(self) -> str:
        return SENTINEL

    __str__ = __repr__


class _ClaimsToBeDict:
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return dict


class _HostileList(list):
    def __len__(self):
        raise RuntimeError

    def __iter__(self):
        raise RuntimeError

    def __getitem__(self, item):
        raise RuntimeError


class _HostileDict(dict):
    def items(self):
        raise RuntimeError

    def __iter__(self):
        raise RuntimeError


class _Colour(enum.IntEnum):
    RED = 1


class _Mode(enum.StrEnum):
    FAST = "fast"


@pytest.mark.parametrize(
    "key",
    [
        "Password",
        "api_key",
        "API-KEY",
        "x_auth_token",
        "Authorization",
        "private_key",
        "clientSecret",
        "client.secret",
        "passwd",
        "Passphrase",
        "db_credentials",
        "Cookie",
        "session id",
        "signature",
        "aws_access_key_id",
        "AUTH",
        "pin",
        "SSN",
    ],
)
def test_secret_key_variants_are_redacted(key):
    """A value under each secret-looking key variant is replaced and never shown."""
    result = sanitise_payload({key: SENTINEL, "kept": "visible"})

    assert result == {key: REDACTED, "kept": "visible"}
    assert SENTINEL not in canonical_json(result)


def test_secret_keys_are_redacted_inside_lists_and_dicts():
    """Redaction reaches secret keys nested at any depth in lists, tuples and dicts."""
    payload = {
        "steps": [{"config": {"API-KEY": SENTINEL}}, ({"Password": [SENTINEL, SENTINEL]},)],
        "meta": {"deeper": {"clientSecret": {"value": SENTINEL}}},
    }

    result = sanitise_payload(payload)

    assert result == {
        "steps": [{"config": {"API-KEY": REDACTED}}, [{"Password": REDACTED}]],
        "meta": {"deeper": {"clientSecret": REDACTED}},
    }
    assert SENTINEL not in canonical_json(result)


@pytest.mark.parametrize(
    "value", [SENTINEL, 12345, 1.5, True, None, [SENTINEL], {"inner": SENTINEL}, b"raw"]
)
def test_redaction_replaces_values_of_every_type(value):
    """A secret key's value becomes the marker whatever its type."""
    assert sanitise_payload({"token": value}) == {"token": REDACTED}


@pytest.mark.parametrize("key", ["token_count", "tokenizer_name", "password_policy_url"])
def test_substring_match_errs_towards_redaction(key):
    """Keys that merely contain a secret fragment are redacted too, as documented."""
    assert sanitise_payload({key: "harmless"}) == {key: REDACTED}


@pytest.mark.parametrize("key", ["author", "oauth_provider", "pinned", "spin", "lessnote"])
def test_whole_key_fragments_only_match_whole_keys(key):
    """The short fragments auth, pin and ssn redact only when they are the whole key."""
    assert sanitise_payload({key: "visible"}) == {key: "visible"}


def test_benign_keys_are_kept():
    """Ordinary keys and values pass through unchanged."""
    payload = {"name": "deploy", "status": "ok", "count": 3, "ratio": 0.5, "tags": ["a", "b"]}

    assert sanitise_payload(payload) == payload


def test_is_secret_key_normalises_case_and_separators():
    """Case, dashes, underscores, spaces and dots do not hide a secret key."""
    assert is_secret_key("Api.Key")
    assert is_secret_key("API - KEY")
    assert not is_secret_key("apple")


def test_containers_deeper_than_max_depth_are_truncated():
    """Containers past max_depth levels become the truncation marker."""
    result = sanitise_payload(_nested_lists(12))

    assert result == _nested_lists(8, TRUNCATED)
    assert _nesting(result) == 8


def test_max_depth_one_keeps_only_the_top_container():
    """With max_depth 1 every nested container is truncated."""
    result = sanitise_payload({"a": [1], "b": {"c": 1}, "d": 2}, max_depth=1)

    assert result == {"a": TRUNCATED, "b": TRUNCATED, "d": 2}


def test_nesting_within_the_limit_is_kept():
    """A structure exactly max_depth deep is not truncated."""
    assert sanitise_payload(_nested_lists(8)) == _nested_lists(8)


def test_long_strings_are_cut_and_suffixed():
    """A string longer than max_string keeps its prefix and gains the suffix."""
    result = sanitise_payload({"text": "x" * 2000, "exact": "y" * 1024})

    assert result == {"text": "x" * 1024 + TRUNCATED_SUFFIX, "exact": "y" * 1024}


def test_long_keys_are_cut_and_suffixed():
    """Keys obey the same length limit as string values."""
    result = sanitise_payload({"k" * 100: 1}, max_string=80)

    assert result == {"k" * 80 + TRUNCATED_SUFFIX: 1}


def test_long_lists_keep_their_head_and_a_marker():
    """A list longer than MAX_ITEMS keeps its first items, then the marker."""
    result = sanitise_payload(list(range(MAX_ITEMS + 50)))

    assert result == [*range(MAX_ITEMS), TRUNCATED]


def test_wide_mappings_keep_their_smallest_keys():
    """A mapping wider than MAX_ITEMS keeps the keys that sort first."""
    payload = {f"k{number:04d}": number for number in range(MAX_ITEMS + 50)}

    result = sanitise_payload(payload)

    assert isinstance(result, dict)
    assert sorted(result) == sorted(payload)[:MAX_ITEMS]


def test_oversized_result_becomes_a_digest_summary():
    """A result over max_bytes is replaced by its size and content hash."""
    payload = {f"field{number}": "v" * 900 for number in range(30)}
    full = sanitise_payload(payload, max_bytes=10**6)

    result = sanitise_payload(payload)

    assert result == {
        "truncated": True,
        "bytes": len(canonical_bytes(full)),
        "digest": content_hash(full),
    }


def test_digest_summary_is_taken_after_redaction():
    """The summary digest commits to the redacted payload, not the secret."""
    payload = {"password": SENTINEL, "bulk": ["v" * 1000] * 30}
    redacted = {"password": REDACTED, "bulk": ["v" * 1000] * 30}

    result = sanitise_payload(payload)

    assert isinstance(result, dict)
    assert result["digest"] == content_hash(redacted)


def test_shared_references_are_bounded_by_the_work_budget():
    """A wide self-referencing structure ends quickly in a summary without digest."""
    wide: list[object] = []
    wide.extend([wide] * 100)

    assert sanitise_payload(wide) == {"truncated": True, "bytes": None, "digest": None}


def test_non_finite_floats_become_null():
    """NaN and the infinities become None."""
    result = sanitise_payload([math.nan, math.inf, -math.inf, 1.5])

    assert result == [None, None, None, 1.5]


def test_integers_outside_the_safe_range_become_markers():
    """Integers beyond +-(2^53-1) become the out-of-range marker; the edges are kept."""
    payload = [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, -(10**400)]

    result = sanitise_payload(payload)

    assert result == [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, OUT_OF_RANGE, OUT_OF_RANGE]


def test_tuples_become_lists():
    """Tuples, named or not, are written as lists."""
    assert sanitise_payload({"pair": (1, (2, 3))}) == {"pair": [1, [2, 3]]}


def test_scalar_keys_are_stringified_and_others_dropped():
    """Keys of type int, bool and None become str(key); other key types are dropped."""
    payload = {7: "int", False: "no", None: "none", 1.5: "float", (1, 2): "tuple", b"k": "b"}

    result = sanitise_payload(payload)

    assert result == {"7": "int", "False": "no", "None": "none"}


def test_colliding_keys_keep_the_first():
    """When two keys map to the same text, the first in iteration order wins."""
    assert sanitise_payload({7: "int", "7": "str"}) == {"7": "int"}


def test_huge_integer_keys_become_markers():
    """An integer key outside the safe range becomes the out-of-range marker."""
    assert sanitise_payload({2**80: "big"}) == {OUT_OF_RANGE: "big"}


def test_surrogates_are_replaced_in_strings_and_keys():
    """Lone surrogates become U+FFFD, one for one, in values and keys."""
    result = sanitise_payload({"k\ud800": "v\udfffw"})

    assert result == {"k\ufffd": "v\ufffdw"}
    validate_json(result)


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (b"bytes", "bytes"),
        (datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC), "datetime"),
        ({1, 2}, "set"),
        (_Leaky(), "_Leaky"),
        (_ClaimsToBeDict(), "_ClaimsToBeDict"),
    ],
)
def test_other_objects_become_unsupported_markers(value, name):
    """Objects outside JSON show only their type name, never their str or repr."""
    result = sanitise_payload({"value": value})

    assert result == {"value": f"[UNSUPPORTED:{name}]"}
    assert SENTINEL not in canonical_json(result)


def test_subclasses_of_json_types_become_plain_values():
    """Enum members and other subclasses of int and str become their plain values."""
    result = sanitise_payload({"colour": _Colour.RED, "mode": _Mode.FAST})

    assert result == {"colour": 1, "mode": "fast"}
    assert type(result["colour"]) is int
    assert type(result["mode"]) is str


def test_container_subclasses_are_read_through_their_base_type():
    """Overridden access methods of list and dict subclasses are never called."""
    payload = _HostileDict(items=_HostileList([1, 2, 3]), password=SENTINEL)

    assert sanitise_payload(payload) == {"items": [1, 2, 3], "password": REDACTED}


def test_self_referencing_containers_terminate():
    """Cycles through lists and dicts end at the depth limit."""
    loop: list[object] = []
    loop.append(loop)
    ring: dict[str, object] = {}
    ring["self"] = ring

    assert _nesting(sanitise_payload(loop)) == 8
    assert _nesting(sanitise_payload(ring)) == 8


def test_input_is_not_mutated():
    """Sanitising leaves its input exactly as it was."""
    payload = {"password": SENTINEL, "items": [(1, math.nan), {2: b"x"}], "text": "y" * 3000}
    before = repr(payload)

    sanitise_payload(payload)

    assert repr(payload) == before


@pytest.mark.parametrize(
    "limits",
    [
        {"max_depth": 0},
        {"max_depth": 65},
        {"max_string": 10},
        {"max_bytes": 64},
    ],
)
def test_limits_too_small_for_a_fixed_point_are_refused(limits):
    """Limits under which the output would not re-sanitise to itself are invalid."""
    with pytest.raises(InvalidInput):
        sanitise_payload({}, **limits)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(),
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(["a", "é", "\ud800", "\udfff", "…"]), max_size=12),
    st.binary(max_size=8),
    st.datetimes(),
)
_KEYS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["password", "API-KEY", "auth", "pin", "x_auth_token", "name"]),
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.binary(max_size=4),
    st.tuples(st.integers(), st.integers()),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=6).map(tuple),
        st.dictionaries(_KEYS, children, max_size=6),
    ),
    max_leaves=40,
)
_LIMITS = st.fixed_dictionaries(
    {
        "max_depth": st.integers(min_value=1, max_value=10),
        "max_string": st.integers(min_value=71, max_value=200),
        "max_bytes": st.integers(min_value=256, max_value=4000),
    }
)


@settings(deadline=None)
@given(value=_VALUES, limits=_LIMITS)
def test_output_is_valid_bounded_and_idempotent(value, limits):
    """Any mixed structure sanitises to valid JSON within max_bytes, as a fixed point."""
    result = sanitise_payload(value, **limits)

    validate_json(result)
    assert len(canonical_bytes(result)) <= limits["max_bytes"]
    assert canonical_json(sanitise_payload(result, **limits)) == canonical_json(result)


@settings(deadline=None)
@given(value=_VALUES)
def test_default_limits_are_idempotent(value):
    """Sanitising with the defaults twice gives the same result as once."""
    result = sanitise_payload(value)

    validate_json(result)
    assert len(canonical_bytes(result)) <= 16384
    assert canonical_json(sanitise_payload(result)) == canonical_json(result)


@settings(deadline=None)
@given(value=_VALUES)
def test_secrets_never_reach_the_output(value):
    """A secret under a secret key never appears, whatever surrounds it."""
    payload = {"outer": [value, {"Client-Secret": [SENTINEL, value]}], "session_id": SENTINEL}
    before = repr(payload)

    result = sanitise_payload(payload)

    assert SENTINEL not in canonical_json(result)
    assert repr(payload) == before
