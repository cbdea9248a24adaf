"""Linearizability: recorded histories of eight processes checked against the version order.

The checker (``version_order``) is proved first on hand-made histories, good
and bad. The harness then records the real stores: eight processes start
together and run mixed reads and compare-and-swap writes on a few keys with
random pauses, timing each call on the system-wide monotonic clock. The
promise: no violation over the whole history. The negative control reads
through a mutant store that serves a stale cached record on 1% of loads,
and the same checker must flag it in every seeded run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import reliability
from version_order import RULES, Op, Violation, check, rule_counts

from flowvault.application import Guard
from flowvault.composition import Settings, bootstrap

WORKER = Path(__file__).with_name("history_worker.py")
KEY = bytes(range(32))
NAMESPACE = "linearizability"
PROCESSES = 8
KEYS_PER_RUN = 4
MUTANT_OPERATIONS = 2_000
"""Per seeded mutant run: about 1,000 loads, so a 1% stale rate serves some in any seed."""
STALE_RATE = 0.01
FORBIDDEN = ("Traceback", "database is locked", "StoreBusy", "STORE_BUSY", "OperationalError")
"""Nothing of this may reach a worker's stderr: a busy store must queue, not fail."""


# -- the checker on hand-made histories ----------------------------------------------------


def ops(*specs: str) -> list[Op]:
    """Build a hand-made history from specs such as ``"a w2 4-9"`` (one op each).

    ``PROCESS WHAT INVOKED-RETURNED [KEY]``, the key ``k`` by default. WHAT is
    ``wR`` (wrote revision R, value ``vR``, guard R-1), ``wR/G`` (guard G),
    ``wR=VALUE``, ``rR`` (read revision R, value ``vR``, or ``None`` for 0),
    ``rR=VALUE``, or ``cG:A`` (a conflict under guard G reporting revision A,
    ``-`` for none).
    """
    history = []
    for seq, spec in enumerate(specs):
        process, what, times, *rest = spec.split()
        invoked, returned = map(int, times.split("-"))
        where = (process, seq, rest[0] if rest else "k", invoked, returned)
        history.append(_op(where, what))
    return history


def _op(where: tuple[str, int, str, int, int], what: str) -> Op:
    process, seq, key, invoked, returned = where
    head, _, value = what[1:].partition("=")
    if what[0] == "c":
        expected, actual = head.split(":")
        reported = None if actual == "-" else int(actual)
        return Op(process, seq, "conflict", key, invoked, returned, reported, None, int(expected))
    revision_text, _, guard_text = head.partition("/")
    revision = int(revision_text)
    stored: object = value or (f"v{revision}" if revision else None)
    if what[0] == "r":
        return Op(process, seq, "read", key, invoked, returned, revision, stored)
    guard = int(guard_text) if guard_text else revision - 1
    return Op(process, seq, "write", key, invoked, returned, revision, stored, guard)


def test_a_sequential_history_is_linearizable() -> None:
    """Writes in order, each read seeing the last write before it: no violation."""
    history = ops("a r0 0-1", "a w1 2-3", "b r1 4-5", "b w2 6-7", "a c1:2 8-9", "a r2 10-11")
    assert check(history) == []


def test_overlapping_operations_may_take_effect_in_either_order() -> None:
    """A read overlapping a write may see it or not; two overlapping reads may differ."""
    history = ops("a w1 0-1", "a w2 10-20", "b r2 12-14", "c r1 11-19", "d c1:2 15-25")
    assert check(history) == []


def test_keys_are_checked_apart() -> None:
    """Revision 1 of one key and revision 5 of another are not compared."""
    writes = [f"a w{n} {2 * n}-{2 * n + 1} x" for n in range(1, 6)]
    assert check(ops(*writes, "b w1 20-21 y", "b r1 22-23 y")) == []


BROKEN = {
    "two writes of one revision": (["a w1 0-1", "b w1=x 0-1"], "duplicate-write"),
    "a skipped revision": (["a w1 0-1", "a w3 2-3"], "revision-gap"),
    "a write past its guard": (["a w2/0 0-1", "a w1 2-3"], "guard"),
    "a conflict that matched its guard": (["a w1 0-1", "b c1:1 2-3"], "guard"),
    "a read of an unwritten revision": (["a w1 0-1", "b r2 2-3"], "phantom-read"),
    "a conflict reporting an unwritten revision": (["a w1 0-1", "b c1:7 2-3"], "phantom-read"),
    "a read with another value": (["a w1 0-1", "b r1=torn 2-3"], "value"),
    "an absent read with a value": (["b r0=ghost 0-1"], "value"),
    "a stale read after a write returned": (["a w1 0-1", "a w2 2-3", "b r1 4-5"], "real-time"),
    "an absent read after the create returned": (["a w1 0-1", "b r0 2-3"], "real-time"),
    "a read from the future": (["a w1 0-1", "b r2 2-3", "a w2 4-5"], "real-time"),
    "reads going backwards": (["a w1 0-1", "a w2 2-10", "b r2 3-4", "c r1 5-6"], "real-time"),
    "writes reordered": (["a w1 0-1", "a w2 5-6", "b w3 2-3"], "real-time"),
    "a stale conflict report": (["a w1 0-1", "a w2 2-3", "b c3:1 4-5"], "real-time"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_the_checker_flags(name: str) -> None:
    """Each broken rule is reported under its name, whatever else the history breaks."""
    specs, rule = BROKEN[name]
    assert rule in rule_counts(check(ops(*specs)))


def test_every_rule_has_a_broken_history() -> None:
    """No rule of the checker goes unproved by a hand-made history that breaks it."""
    assert {rule for _, rule in BROKEN.values()} == set(RULES)


def test_a_read_at_the_instant_a_write_returns_is_concurrent() -> None:
    """Only a strictly earlier return orders two operations: equal clock readings overlap."""
    assert check(ops("a w1 0-1", "a w2 5-9", "b r1 9-10")) == []


def test_a_conflict_that_reported_nothing_is_not_placed() -> None:
    """A refused write whose store named no revision constrains nothing in real time."""
    assert check(ops("a w1 0-1", "a w2 2-3", "b c1:- 4-5")) == []


def test_each_late_operation_is_reported_once_against_its_witness() -> None:
    """A stale read after several writes is one violation, naming the highest write before it."""
    writes = [f"a w{n} {2 * n}-{2 * n + 1}" for n in range(1, 5)]
    [violation] = check(ops(*writes, "b r2 20-21"))
    assert violation.rule == "real-time"
    assert [op.revision for op in violation.ops] == [4, 2]
    assert "b#4 k read r2" in str(violation)


def test_malformed_operations_are_refused() -> None:
    """An op that returned before it started, or that lacks its revision or guard, is refused."""
    with pytest.raises(ValueError, match="returned before"):
        Op("a", 0, "read", "k", 5, 4, 1)
    with pytest.raises(ValueError, match="no revision"):
        Op("a", 0, "read", "k", 0, 1, None)
    with pytest.raises(ValueError, match="no guard"):
        Op("a", 0, "write", "k", 0, 1, 1, "v")


def test_ops_round_trip_through_json() -> None:
    """Workers write ops as JSON lines; reading them back gives the same ops."""
    op = Op("a", 3, "write", "k", 3, 9, 2, {"writer": "a", "seq": [1, None]}, 1)
    assert Op.from_mapping(json.loads(op.to_json())) == op


# -- the harness -------------------------------------------------------------------------


@dataclass
class Run:
    """One recorded history and what the workers said about it."""

    seed: int
    history: list[Op]
    stale_served: int
    violations: list[Violation] = field(init=False)

    def __post_init__(self) -> None:
        self.violations = check(self.history)


class Harness:
    """Eight worker processes on one store, recording one history per run.

    The workers start once and serve every run; each run uses its own keys
    in one namespace, so runs never see each other's writes.
    """

    def __init__(
        self, backend: str, target: str, settings: Settings, env: Mapping[str, str], folder: Path
    ) -> None:
        self.settings = settings
        self.folder = folder
        self.logs = [folder / f"w{n}.stderr" for n in range(PROCESSES)]
        self.workers: list[subprocess.Popen[str]] = []
        for n, log in enumerate(self.logs):
            with log.open("w") as stderr:
                self.workers.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), backend, target, f"w{n}"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        text=True,
                        env=dict(env),
                    )
                )
        self._watchdog = threading.Timer(reliability.size(900, 7200), self.close)
        self._watchdog.start()
        try:
            for n in range(PROCESSES):
                self._expect(n, "ready")
        except BaseException:
            self.close()
            raise

    def _expect(self, n: int, word: str) -> str:
        stdout = self.workers[n].stdout
        assert stdout is not None
        reply = stdout.readline().strip()
        assert reply.startswith(word), f"w{n} said {reply!r}: {self.logs[n].read_text()[-3000:]}"
        return reply

    def close(self) -> None:
        """Stop every worker (end of input, then a kill for any that hangs)."""
        self._watchdog.cancel()
        for worker in self.workers:
            if worker.stdin is not None and not worker.stdin.closed:
                worker.stdin.close()
        for worker in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def problems(self) -> list[str]:
        """Return what the workers' exit codes and stderr show beyond a clean finish."""
        found = []
        for n, (worker, log) in enumerate(zip(self.workers, self.logs, strict=True)):
            err = log.read_text()
            if worker.returncode != 0 or any(marker in err for marker in FORBIDDEN):
                found.append(f"w{n} exited {worker.returncode}: {err[-2000:]}")
        return found

    def _seed_keys(self, keys: Sequence[str]) -> list[Op]:
        """Create every key at revision 1 before the workers start, and record those writes."""
        history = []
        with bootstrap(self.settings, key=KEY, create=True) as runtime:
            for n, key in enumerate(keys):
                value = {"writer": "setup", "seq": n}
                invoked = time.monotonic_ns()
                runtime.repository.write(NAMESPACE, key, value, expected=Guard.ABSENT)
                returned = time.monotonic_ns()
                history.append(Op("setup", n, "write", key, invoked, returned, 1, value, 0))
        return history

    def run(self, seed: int, ops_per_process: int, stale_rate: float = 0.0) -> Run:
        """Record one history: seed the keys, release the workers together, gather their ops."""
        keys = [f"s{seed}-k{n}" for n in range(KEYS_PER_RUN)]
        history = self._seed_keys(keys)
        outs = [self.folder / f"seed-{seed}-w{n}.jsonl" for n in range(PROCESSES)]
        for worker, out in zip(self.workers, outs, strict=True):
            assert worker.stdin is not None
            order = f"run {seed} {ops_per_process} {stale_rate} {','.join(keys)} {out}"
            worker.stdin.write(order + "\n")
            worker.stdin.flush()
        stale = 0
        for n, out in enumerate(outs):
            stale += int(self._expect(n, "done").split()[-1])
            history += [Op.from_mapping(json.loads(line)) for line in out.read_text().splitlines()]
        return Run(seed, history, stale)


@contextmanager
def _harness(
    backend: str, target: str, settings: Settings, env: Mapping[str, str], folder: Path
) -> Iterator[Harness]:
    harness = Harness(backend, target, settings, env, folder)
    try:
        yield harness
    finally:
        harness.close()


def _summary(run: Run) -> str:
    kinds = Counter(op.kind for op in run.history if op.process != "setup")
    return ", ".join(f"{kinds[kind]:,} {kind}s" for kind in ("read", "write", "conflict"))


def _prove(
    backend: str, target: str, settings: Settings, env: Mapping[str, str], folder: Path
) -> None:
    """Check a real history and mutant ones on one backend; record the figure, then assert."""
    label = "SQLite" if backend == "sqlite" else "PostgreSQL"
    watch = reliability.Stopwatch()
    base = reliability.seed_base()
    operations = reliability.size(10_000, 100_000)
    mutant_ops = MUTANT_OPERATIONS
    seeds = [base + 1 + n for n in range(reliability.size(5, 20))]
    with _harness(backend, target, settings, env, folder) as harness:
        real = harness.run(base, operations // PROCESSES)
        mutants = [harness.run(seed, mutant_ops // PROCESSES, STALE_RATE) for seed in seeds]
    problems = harness.problems()
    flagged = [run for run in mutants if run.violations]
    figure = reliability.record(
        reliability.Figure(
            family=f"Linearizability (version order), {label}",
            trials=len(real.history),
            anomalies=len(real.violations) + len(problems),
            control_caught=len(flagged) == len(mutants),
            detail=(
                f"{PROCESSES} processes, {KEYS_PER_RUN} keys, {_summary(real)}; "
                f"mutant (stale load on {STALE_RATE:.0%}) flagged in "
                f"{len(flagged)} of {len(mutants)} seeds: "
                f"{sum(len(run.violations) for run in mutants):,} violations from "
                f"{sum(run.stale_served for run in mutants):,} stale loads"
            ),
            seconds=watch.seconds,
        )
    )
    print(f"\n{figure}")
    replay = f"seed {base} (replay with RELIABILITY_SEED={base})"
    assert problems == [], replay
    assert len(real.history) == operations // PROCESSES * PROCESSES + KEYS_PER_RUN
    kinds = Counter(op.kind for op in real.history)
    assert kinds["write"] > KEYS_PER_RUN, f"no write landed; {replay}"
    assert kinds["conflict"] > 0, f"the processes never raced; {replay}"
    shown = "\n".join(map(str, real.violations[:10]))
    assert real.violations == [], f"{rule_counts(real.violations)}; {replay}\n{shown}"
    for run in mutants:
        assert run.stale_served > 0, f"mutant seed {run.seed} never served a stale load"
        assert run.violations, f"mutant seed {run.seed}: {run.stale_served} stale loads unflagged"
    assert figure.anomalies == 0


def test_sqlite_histories_are_linearizable(tmp_path: Path) -> None:
    """10,000 operations from 8 processes on one SQLite file break no version-order rule."""
    home = tmp_path / "home"
    _prove("sqlite", str(home), Settings(backend="sqlite", home=home), os.environ, tmp_path)


@pytest.mark.postgres
def test_postgres_histories_are_linearizable(
    postgres_server, pg_schema: str, tmp_path: Path
) -> None:
    """10,000 operations from 8 processes, one pool each, on one PostgreSQL schema break no rule."""
    settings = Settings(
        backend="postgres",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        postgres_pool_size=1,
    )
    env = {**os.environ, "TEST_POSTGRES_DSN": postgres_server.dsn}
    _prove("postgres", pg_schema, settings, env, tmp_path)
