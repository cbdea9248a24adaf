"""Hypothesis strategies for hostile input, shared by the hostile-input families.

Every strategy mixes values a careless or malicious caller could pass: text
with lone surrogates, NUL and SQL/LIKE metacharacters, empty and very long
ids, JSON outside the I-JSON profile (NaN, infinities, huge integers,
non-string keys, nesting up to 10^5 levels, cycles), JSON text with
duplicate keys, naive and far-future datetimes, revisions of every wrong
type, and values of the wrong type altogether. Plausible values are mixed
in too (``known`` ids, in-profile JSON) so calls also reach the code paths
behind validation.

Each strategy draws half the time from a fixed corpus of hand-picked
values (cheap to draw, and sure to contain every boundary) and half the
time from Hypothesis' own generators (novel values, shrinkable). Costly
values (10^5-level nesting, 2-million-character text) are built once and
shared: nothing under test mutates its input.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

SQL_METACHARACTERS = (
    "%",
    "_",
    "'",
    '"',
    ";",
    "--",
    "\\",
    "%_",
    "\\%",
    "\\_",
    "''",
    "' OR '1'='1",
    "'); DROP TABLE records; --",
    "%' ESCAPE '\\",
    "*/",
    "/*",
)
"""Characters and fragments that break naive SQL, LIKE patterns or escaping."""

HUGE_INTS = st.integers(4301, 6000).map(lambda digits: 10**digits)
"""Integers whose decimal text exceeds Python's conversion limit (``str()`` refuses them).

Drawn lazily: not even a strategy's ``repr`` may hold one.
"""

NASTY_INTS = (
    -1,
    0,
    1,
    2,
    2**31 - 1,
    2**31,
    2**53 - 1,
    2**53,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**53),
    -(2**63),
    -(2**63) - 1,
    10**400,
    -(10**400),
)
"""Integers at and beyond every boundary a store or a JSON reader has."""

NASTY_FLOATS = (
    math.nan,
    -math.nan,
    math.inf,
    -math.inf,
    -0.0,
    0.0,
    1e400,
    5e-324,
    1.7976931348623157e308,
    9007199254740993.0,
    0.5,
    1.0,
)
"""Floats outside JSON (NaN, infinities; ``1e400`` is infinity) and at its edges."""

WRONG_NUMBERS = ("1", "", "0x10", "1e3", b"1", None, [1], {"n": 1}, True, False, 1.5, -0.0)
"""Values a caller might pass where an integer is expected."""

LONG_LENGTHS = (64, 65, 128, 129, 200, 201, 256, 257, 1024, 2048, 2049, 65_537, 100_000, 2_000_000)
"""Lengths at and past every limit the domain uses, up to 2 million characters."""

DEPTHS = (1, 2, 63, 64, 65, 100, 1_000, 10_000, 100_000)
"""Nesting depths around the 64-level limit, and far beyond it."""

_SHAPES = ("list", "dict", "mixed")
_SPECIALS = (
    "\x00",
    "\n",
    "\r",
    "\x1f",
    "\x7f",
    "\ud800",
    "\udbff",
    "\udc80",
    "\udfff",
    "\u2028",
    "\u202e",
    "\ufeff",
    "\ufffd",
    "\U0010ffff",
    "\U0001f600",
    "é",
    "ǅ",
    "İ",
    "ß",
    *SQL_METACHARACTERS,
)
"""Single characters and fragments that trip encoders, patterns, case maps and SQL."""

_ANY_CHARACTER = st.characters(exclude_categories=())
"""Every code point, lone surrogates and NUL included."""


@functools.cache
def _filled(length: int, fill: str) -> str:
    return fill * length


@functools.cache
def _nest(depth: int, shape: str) -> object:
    """Build ``depth`` levels of nesting iteratively (no recursion, whatever the depth).

    Cached: a 10^5-level value costs milliseconds to build, and every example
    that draws it may share one.
    """
    value: object = 0
    for level in range(depth):
        as_list = shape == "list" or (shape == "mixed" and level % 2)
        value = [value] if as_list else {"k": value}
    return value


def _cycle(kind: str) -> object:
    """Return a container that contains itself."""
    if kind == "list":
        looped: list[object] = []
        looped.append(looped)
        return looped
    mapping: dict[str, object] = {}
    mapping["self"] = mapping
    return mapping


NASTY_TEXTS: tuple[str, ...] = (
    "",
    " ",
    "a\x00b",
    "x\ud800y",
    "..",
    ".",
    "a/b",
    "../x",
    "%%",
    "a%",
    "_a_",
    "\\x00",
    "A" * 64,
    *_SPECIALS,
    *(_filled(length, fill) for length in LONG_LENGTHS for fill in ("a", "%")),
    _filled(300, "\x00"),
    _filled(1000, "\ud800"),
)
"""Hand-picked hostile text: empty, NUL, surrogates, metacharacters, every length limit."""

NON_TEXT: tuple[object, ...] = (
    None,
    True,
    False,
    0,
    -1,
    2**63,
    1.5,
    math.nan,
    b"id",
    bytearray(b"id"),
    memoryview(b"id"),
    [1],
    {"a": 1},
    ("tu", "ple"),
    {"set"},
    datetime(2026, 1, 1, tzinfo=UTC),
    object(),
)
"""Values of the wrong type where text is expected."""


def wild_text(*, max_size: int = 24) -> st.SearchStrategy[str]:
    """Any characters at all: lone surrogates, NUL, controls, bidi overrides, SQL metacharacters."""
    pieces = st.text(_ANY_CHARACTER, max_size=4)
    spliced = st.builds(lambda a, s, b: a + s + b, pieces, st.sampled_from(_SPECIALS), pieces)
    return st.one_of(st.text(_ANY_CHARACTER, max_size=max_size), spliced)


def sql_text() -> st.SearchStrategy[str]:
    """Text assembled from SQL and LIKE metacharacters around plausible id fragments."""
    parts = st.sampled_from((*SQL_METACHARACTERS, "a", "run", "1", "id-000001", " "))
    return st.lists(parts, min_size=1, max_size=6).map("".join)


def long_text() -> st.SearchStrategy[str]:
    """Text at and past the length limits the domain uses, up to 2 million characters."""
    fills = st.sampled_from(("a", "%", "\x00", "é", "\U0001f600"))
    return st.builds(_filled, st.sampled_from(LONG_LENGTHS), fills)


def non_text() -> st.SearchStrategy[object]:
    """Values of the wrong type where text is expected."""
    return st.one_of(st.sampled_from(NON_TEXT), HUGE_INTS)


def _near_misses(known: Sequence[str]) -> st.SearchStrategy[str]:
    """Known values with a suffix or prefix (``^...$`` patterns let a trailing newline through)."""
    values = st.sampled_from(tuple(known))
    return st.one_of(
        st.builds(lambda v, s: v + s, values, st.sampled_from(_SPECIALS)),
        st.builds(lambda v, s: s + v, values, st.sampled_from(_SPECIALS)),
        values.map(str.upper),
    )


def hostile_text(
    known: Sequence[str] = (), *, allow_non_text: bool = True
) -> st.SearchStrategy[Any]:
    """Ids, names and free text: known values, near misses, and everything hostile."""
    options: list[st.SearchStrategy[Any]] = [
        st.sampled_from(NASTY_TEXTS),
        wild_text(),
        sql_text(),
        long_text(),
    ]
    if known:
        values = st.sampled_from(tuple(known))
        options += [values, values, _near_misses(known)]
    if allow_non_text:
        options.append(non_text())
    return st.one_of(options)


def hostile_ints() -> st.SearchStrategy[Any]:
    """Revisions, indexes, counters and limits: boundaries, wrong types and any integer."""
    return st.one_of(
        st.sampled_from((*NASTY_INTS, *WRONG_NUMBERS, *NASTY_FLOATS)),
        HUGE_INTS,
        st.integers(-5, 250),
        st.integers(),
    )


def _in_profile_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53) + 1, 2**53 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
    )


def json_values() -> st.SearchStrategy[Any]:
    """In-profile JSON (so calls can succeed): scalars and two levels of small containers."""
    scalars = _in_profile_scalars()
    level = st.one_of(
        st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=6), scalars, max_size=3)
    )
    return st.one_of(
        scalars,
        level,
        st.lists(level, max_size=2),
        st.dictionaries(st.text(max_size=6), level, max_size=2),
    )


def _keys() -> st.SearchStrategy[Any]:
    """Object keys, including the non-string ones JSON cannot hold."""
    return st.one_of(
        wild_text(max_size=8),
        st.sampled_from(("password", "token", "api_key", "a", "", 1, -3, 2**64, None, True)),
        st.sampled_from((1.5, b"k", ("t",), frozenset())),
    )


def _hostile_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from((*NASTY_INTS, *NASTY_FLOATS, *SQL_METACHARACTERS)),
        HUGE_INTS,
        st.floats(),
        wild_text(max_size=12),
    )


def _hostile_containers() -> st.SearchStrategy[Any]:
    """Small containers with one hostile part: a key, a value, or a tuple instead of a list."""
    scalars = st.one_of(_hostile_scalars(), _in_profile_scalars())
    return st.one_of(
        st.lists(scalars, min_size=1, max_size=3),
        st.dictionaries(_keys(), scalars, min_size=1, max_size=3),
        st.tuples(scalars),
        st.lists(st.dictionaries(_keys(), scalars, max_size=2), min_size=1, max_size=2),
    )


def _json_corpus() -> tuple[object, ...]:
    wide_list: list[object] = [0] * 10_000
    return (
        None,
        True,
        -0.0,
        5e-324,
        *NASTY_INTS,
        *NASTY_FLOATS,
        "",
        "\x00",
        "\ud800",
        _filled(2_000_000, "x"),
        _filled(1024 * 1024, "\x00"),
        [],
        {},
        [[]],
        {"a": {"b": []}},
        {1: "int key"},
        {None: 1},
        {True: 1},
        {1.5: 1},
        {b"k": 1},
        {("t",): 1},
        {"\ud800": 1},
        {"password": "hunter2", "token": "t0k3n"},
        [math.nan],
        {"a": math.inf},
        [2**63],
        {"a": [1, {"b": -0.0}]},
        *(_nest(depth, shape) for depth in DEPTHS for shape in _SHAPES),
        _cycle("list"),
        _cycle("dict"),
        wide_list,
        {f"k{i}": i for i in range(1000)},
        {f"k{i}": i for i in range(65)},
        b"bytes",
        bytearray(b"x"),
        {1, 2},
        frozenset(),
        (1, 2),
        datetime(2026, 1, 1),
        Decimal("1.5"),
        complex(1, 2),
        object(),
        range(3),
    )


NASTY_JSON = _json_corpus()
"""Hand-picked values outside (and at the edges of) the canonical JSON profile."""


def hostile_json() -> st.SearchStrategy[Any]:
    """JSON-ish values: in-profile, out of profile, deep, cyclic, huge, or no JSON type at all."""
    return st.one_of(
        st.sampled_from(NASTY_JSON),
        st.sampled_from(NASTY_JSON),
        json_values(),
        _hostile_containers(),
        HUGE_INTS,
    )


def deep_nesting() -> st.SearchStrategy[object]:
    """Draw lists and objects nested up to 10^5 levels, around and far past the 64-level limit."""
    return st.builds(_nest, st.sampled_from(DEPTHS), st.sampled_from(_SHAPES))


NASTY_MAPPINGS: tuple[dict[Any, Any], ...] = (
    {},
    {"deep": _nest(100_000, "dict")},
    {"deep": _nest(65, "list")},
    {1: 2},
    {None: "none"},
    {"a": math.nan},
    {"a": 2**63},
    {"a": b"bytes"},
    {"\ud800": 1},
    {"k": _filled(2_000_000, "x")},
    {"password": "hunter2"},
    {f"k{i}": i for i in range(65)},
    {"self": _cycle("dict")},
)
"""Hand-picked hostile mappings: budgets, counters, payloads."""


def hostile_mapping() -> st.SearchStrategy[Any]:
    """Draw mappings (budgets, payloads, counters) with hostile keys and deep or huge values."""
    return st.one_of(
        st.sampled_from(NASTY_MAPPINGS),
        st.sampled_from(NASTY_MAPPINGS),
        st.dictionaries(_keys(), hostile_json(), max_size=3),
        st.dictionaries(st.text(max_size=6), json_values(), max_size=3),
        st.dictionaries(st.text(max_size=6), hostile_ints(), max_size=3),
    )


def _dumps(value: object) -> str:
    try:
        return json.dumps(value, allow_nan=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return "[]"


def _utf8(text: str) -> bytes:
    """Encode even lone surrogates, as a careless encoder upstream would."""
    return text.encode("utf-8", "surrogatepass")


JSON_TEXT_SAMPLES: tuple[object, ...] = (
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "-0.0",
    "-0",
    "9007199254740993",
    "-9007199254740993",
    "1" * 5000,
    "1" * 5000 + ".0",
    "0." + "0" * 5000 + "1",
    '"\\ud800"',
    '"\\udc00\\ud800"',
    '{"\\ud800": 1}',
    '"\\u0000"',
    '"\x00"',
    '{"a": 1, "a": 2}',
    '{"a": 1, "b": {"c": 1, "c": 1}}',
    '{"": 1, "": 1}',
    "[1,]",
    "{,}",
    "",
    " ",
    "\ufeff[]",
    "[] []",
    '"unterminated',
    "\x00",
    "[" * 100_000,
    "{" * 100_000,
    *("[" * depth + "]" * depth for depth in DEPTHS),
    *('{"a":' * depth + "0" + "}" * depth for depth in DEPTHS),
    b"\xff\xfe[\x00]\x00",
    b"\xed\xa0\x80",
    "[1]".encode("utf-16"),
    None,
    1,
    1.5,
    [b"[]"],
    bytearray(b"[]"),
    memoryview(b"[]"),
)
"""JSON text every strict parser must refuse (and some it must accept), and non-text."""


def json_text() -> st.SearchStrategy[Any]:
    """JSON text (str or bytes): duplicate keys, NaN, overflow, surrogates, 10^5 nesting, junk."""
    duplicate = st.builds(
        lambda key, a, b: f"{{{json.dumps(key)}: {_dumps(a)}, {json.dumps(key)}: {_dumps(b)}}}",
        st.text(max_size=6),
        json_values(),
        json_values(),
    )
    dumped = st.one_of(json_values(), _hostile_containers()).map(_dumps)
    return st.one_of(
        st.sampled_from(JSON_TEXT_SAMPLES),
        st.sampled_from(JSON_TEXT_SAMPLES),
        duplicate,
        dumped,
        dumped.map(_utf8),
        st.binary(max_size=32),
        wild_text(max_size=32),
    )


_OFFSETS = st.sampled_from(
    (
        UTC,
        timezone(timedelta(hours=23, minutes=59)),
        timezone(timedelta(hours=-23, minutes=-59)),
        timezone(timedelta(hours=5, minutes=30)),
    )
)

EXTREME_INSTANTS: tuple[object, ...] = (
    datetime.max.replace(tzinfo=UTC),
    datetime.min.replace(tzinfo=UTC),
    datetime.max.replace(tzinfo=timezone(timedelta(hours=-23, minutes=-59))),
    datetime.min.replace(tzinfo=timezone(timedelta(hours=23, minutes=59))),
    datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 1),
    datetime.max,
    datetime.min,
    datetime.max.date(),
    "2026-01-01T00:00:00Z",
    0,
    1.5,
    None,
    b"2026",
    [2026],
)
"""Instants at the ends of what ``datetime`` can hold, aware and naive, and non-datetimes."""


def hostile_datetimes() -> st.SearchStrategy[Any]:
    """Naive, aware (extreme offsets), far past and far future instants, and non-datetimes."""
    return st.one_of(
        st.sampled_from(EXTREME_INSTANTS),
        st.datetimes(),
        st.datetimes(timezones=_OFFSETS),
        st.dates(),
    )


def hostile_timedeltas() -> st.SearchStrategy[Any]:
    """Ages and retentions: negative, zero, the extremes, and non-timedeltas."""
    return st.one_of(
        st.sampled_from(
            (
                timedelta.max,
                timedelta.min,
                timedelta(0),
                timedelta(microseconds=-1),
                timedelta(days=30),
                timedelta(seconds=1),
                0,
                1,
                -1,
                1.5,
                "1d",
                None,
                b"1",
            )
        ),
        st.timedeltas(),
    )


def hostile_bytes() -> st.SearchStrategy[Any]:
    """Byte strings small and over every size limit, and look-alikes that are not ``bytes``."""
    sizes = (512 * 1024, 512 * 1024 + 1, 1024 * 1024 + 1)
    return st.one_of(
        st.binary(max_size=64),
        st.sampled_from(sizes).map(lambda n: b"\x00" * n),
        st.sampled_from((bytearray(b"x"), memoryview(b"x"), "text", None, 1, [1])),
    )


def hostile_cursors(encode: Callable[[Mapping[str, object]], str]) -> st.SearchStrategy[Any]:
    """Opaque list cursors: forged, for another order, malformed base64 or JSON, wrong types.

    ``encode`` turns a cursor body into its text form, so forged cursors
    carry well-formed framing around hostile content.
    """
    bodies = st.fixed_dictionaries(
        {
            "o": st.one_of(st.sampled_from(("key", "written_at", "written_at_desc")), wild_text()),
            "k": st.one_of(hostile_text(allow_non_text=False), st.sampled_from(NASTY_INTS)),
            "w": st.one_of(hostile_text(allow_non_text=False), st.none()),
        }
    )
    dumped = st.one_of(json_values(), _hostile_containers()).map(_dumps)
    raw = st.one_of(st.binary(max_size=48), dumped.map(_utf8))
    return st.one_of(
        st.none(),
        bodies.map(encode),
        raw.map(lambda data: base64.urlsafe_b64encode(data).decode("ascii")),
        hostile_text(),
    )


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy`` or ``None``."""
    return st.one_of(st.none(), strategy)


__all__ = [
    "DEPTHS",
    "EXTREME_INSTANTS",
    "HUGE_INTS",
    "JSON_TEXT_SAMPLES",
    "LONG_LENGTHS",
    "NASTY_FLOATS",
    "NASTY_INTS",
    "NASTY_JSON",
    "NASTY_MAPPINGS",
    "NASTY_TEXTS",
    "NON_TEXT",
    "SQL_METACHARACTERS",
    "WRONG_NUMBERS",
    "deep_nesting",
    "hostile_bytes",
    "hostile_cursors",
    "hostile_datetimes",
    "hostile_ints",
    "hostile_json",
    "hostile_mapping",
    "hostile_text",
    "hostile_timedeltas",
    "json_text",
    "json_values",
    "long_text",
    "non_text",
    "optional",
    "sql_text",
    "wild_text",
]
