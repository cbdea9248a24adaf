"""A linearizability checker for per-key registers whose writes carry unique revisions.

flowvault numbers every write of a record: a compare-and-swap write guarded
by revision ``e`` stores revision ``e + 1``, and revisions of one key are
unique and contiguous (1, 2, 3, ...). So the *version order* of a key is
known from the history itself, and linearizability reduces to checks that
are linear in the history (after sorting), instead of a search over
interleavings.

A history is a list of ``Op``: who ran it, what it was, on which key, the
clock reading just before the call (``invoked``) and just after it returned
(``returned``), and what it read or wrote. Times from several processes are
comparable when they all come from one system-wide clock (on Linux,
``time.monotonic_ns``, which is ``CLOCK_MONOTONIC``). Every operation in the
history must have a definite outcome (it returned, with a value or with a
conflict).

Operations:

- ``write``: a CAS write that succeeded; ``expected`` is its guard (0 for
  "must be absent"), ``revision`` the revision it stored and ``value`` the
  document it stored.
- ``read``: ``revision`` is what it saw (0 when the record was absent) and
  ``value`` the document (``None`` when absent).
- ``conflict``: a CAS write refused by its guard; it wrote nothing.
  ``revision`` is the revision the store reported as current when it refused
  (``None`` when the store did not say), so it doubles as a read of that
  revision without a value.

Positions in the version order: a write of revision ``r`` sits at ``2r``; a
read (or a conflict that reported ``r``) sits at ``2r + 1``, after the write
of ``r`` and before the write of ``r + 1``. A conflict that reported nothing
has no position.

Rules, checked per key (linearizability is local: a history is linearizable
exactly when each key's sub-history is, so keys never need to be compared):

1. ``duplicate-write``: each revision is written by at most one successful
   write (two would mean one update silently replaced another).
2. ``revision-gap``: the revisions written are exactly ``1..n``, none skipped.
3. ``guard``: a write guarded by ``e`` stored ``e + 1``; a conflict did not
   report the very revision its guard expected.
4. ``phantom-read``: a read or conflict reports 0 or a revision some write in
   the history stored.
5. ``value``: a read of revision ``r`` returned exactly the document the
   write of ``r`` stored (``None`` for revision 0).
6. ``real-time``: if ``a`` returned before ``b`` was invoked
   (``a.returned < b.invoked``), then ``b`` is not earlier in the version
   order: ``position(a) <= position(b)``, with equality allowed only when
   both observe (two reads of one revision). Spelled out, for ``a`` before
   ``b`` in real time:

   - write ``r`` then write ``r'``: ``r < r'`` (writes are not reordered);
   - write ``r`` then read ``r'``: ``r' >= r`` (no stale read after a
     write returned);
   - read ``r`` then write ``r'``: ``r' > r`` (no read from the future);
   - read ``r`` then read ``r'``: ``r' >= r`` (reads never go backwards).

Why these suffice: if they hold, ordering each key's operations by position,
and operations at one position by invocation time, gives a sequential
history that respects every real-time precedence (rule 6) in which every
write applies its guard to the revision just before it (rules 1-3) and
every read returns the last write before it (rules 4-5). Conversely a
linearizable history with unique revisions satisfies them all, since the
revisions fix the order of the writes. A conflict that reported no
revision is only excluded from the real-time check; everything else about
it is unconstrained, which is weaker, never stricter.

Rule 6 is checked with one sweep per key: operations sorted by return
time, and for each operation (by invocation time) the highest position
among those that had already returned. Each operation that breaks the rule
is reported once, against the op that shows it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Final, Literal, TypeAlias

Kind: TypeAlias = Literal["read", "write", "conflict"]
KINDS: Final = ("read", "write", "conflict")
RULES: Final = (
    "duplicate-write",
    "revision-gap",
    "guard",
    "phantom-read",
    "value",
    "real-time",
)


@dataclass(frozen=True, slots=True)
class Op:
    """One completed operation of a history."""

    process: str
    seq: int
    """The operation's number within its process, for messages."""
    kind: Kind
    key: str
    invoked: int
    returned: int
    revision: int | None
    value: object = None
    expected: int | None = None
    """The guard of a write or conflict: the revision it required, 0 for "absent"."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown operation kind {self.kind!r}")
        if self.returned < self.invoked:
            raise ValueError(f"{self.label()} returned before it was invoked")
        if self.kind != "conflict" and self.revision is None:
            raise ValueError(f"{self.label()} has no revision")
        if self.kind != "read" and self.expected is None:
            raise ValueError(f"{self.label()} has no guard")

    @property
    def observes(self) -> bool:
        """Whether this op reads (a read, or a conflict reporting the current revision)."""
        return self.kind != "write"

    @property
    def position(self) -> int | None:
        """Place in the key's version order; ``None`` for a conflict that reported nothing."""
        if self.revision is None:
            return None
        return 2 * self.revision + (1 if self.observes else 0)

    def label(self) -> str:
        """Return a short name such as ``w3#17 k1 wrote r5``."""
        what = {"read": "read", "write": "wrote", "conflict": "conflict at"}[self.kind]
        return f"{self.process}#{self.seq} {self.key} {what} r{self.revision}"

    def to_json(self) -> str:
        """Return the op as one JSON line, the form workers write histories in."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_mapping(cls, row: Mapping[str, object]) -> Op:
        """Rebuild an op from ``asdict`` output or its JSON."""
        return cls(**row)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule, with the operations that show it."""

    rule: str
    key: str
    message: str
    ops: tuple[Op, ...]

    def __str__(self) -> str:
        return f"[{self.rule}] {self.key}: {self.message}"


def check(history: Iterable[Op]) -> list[Violation]:
    """Return every violation of the module's rules; an empty list means linearizable."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    violations: list[Violation] = []
    for key in sorted(by_key):
        violations += check_key(key, by_key[key])
    return violations


def check_key(key: str, ops: Sequence[Op]) -> list[Violation]:
    """Check one key's sub-history against every rule."""
    writes, found = _writes(key, ops)
    found += _gaps(key, writes)
    found += _guards(key, ops)
    found += _reads(key, ops, writes)
    found += _real_time(key, ops)
    return found


def rule_counts(violations: Iterable[Violation]) -> dict[str, int]:
    """Count violations per rule, for a failure message or a figure's detail."""
    return dict(Counter(violation.rule for violation in violations))


def _writes(key: str, ops: Sequence[Op]) -> tuple[dict[int, Op], list[Violation]]:
    writes: dict[int, Op] = {}
    found: list[Violation] = []
    for op in ops:
        if op.kind != "write":
            continue
        assert op.revision is not None
        first = writes.setdefault(op.revision, op)
        if first is not op:
            message = f"{first.label()} and {op.label()} both stored revision {op.revision}"
            found.append(Violation("duplicate-write", key, message, (first, op)))
    return writes, found


def _gaps(key: str, writes: Mapping[int, Op]) -> list[Violation]:
    if not writes:
        return []
    missing = sorted(set(range(1, max(writes) + 1)) - set(writes))
    if not missing:
        return []
    shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
    message = f"revisions {shown} were never written but r{max(writes)} was"
    return [Violation("revision-gap", key, message, ())]


def _guards(key: str, ops: Sequence[Op]) -> list[Violation]:
    found = []
    for op in ops:
        if op.kind == "write" and op.expected is not None and op.revision != op.expected + 1:
            message = f"{op.label()} under a guard of r{op.expected}"
            found.append(Violation("guard", key, message, (op,)))
        if op.kind == "conflict" and op.revision is not None and op.revision == op.expected:
            message = f"{op.label()} was refused although r{op.expected} was what it expected"
            found.append(Violation("guard", key, message, (op,)))
    return found


def _reads(key: str, ops: Sequence[Op], writes: Mapping[int, Op]) -> list[Violation]:
    found = []
    for op in ops:
        if not op.observes or op.revision is None:
            continue
        if op.revision != 0 and op.revision not in writes:
            message = f"{op.label()}, a revision no write stored"
            found.append(Violation("phantom-read", key, message, (op,)))
            continue
        if op.kind != "read":
            continue
        stored = None if op.revision == 0 else writes[op.revision].value
        if op.value != stored:
            message = f"{op.label()} returned {op.value!r}, but r{op.revision} holds {stored!r}"
            found.append(Violation("value", key, message, (op,)))
    return found


def _real_time(key: str, ops: Sequence[Op]) -> list[Violation]:
    placed = [op for op in ops if op.position is not None]
    by_return = sorted(placed, key=lambda op: op.returned)
    found: list[Violation] = []
    highest: Op | None = None
    done = 0
    for op in sorted(placed, key=lambda op: op.invoked):
        while done < len(by_return) and by_return[done].returned < op.invoked:
            candidate = by_return[done]
            if highest is None or _pos(candidate) > _pos(highest):
                highest = candidate
            done += 1
        if highest is None:
            continue
        ahead = _pos(highest) > _pos(op)
        tied = _pos(highest) == _pos(op) and not (highest.observes and op.observes)
        if ahead or tied:
            gap_us = (op.invoked - highest.returned) / 1000
            message = (
                f"{op.label()} started {gap_us:.1f} us after {highest.label()} returned, "
                "yet is not later in the version order"
            )
            found.append(Violation("real-time", key, message, (highest, op)))
    return found


def _pos(op: Op) -> int:
    position = op.position
    assert position is not None
    return position
