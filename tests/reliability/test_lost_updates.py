"""Lost updates: eight real processes incrementing one state record through the public API.

Every process makes its increments with ``runtime.state(scope).update``
(compare-and-swap on the record's revision, retried on
``REVISION_CONFLICT``) and reports each ``[revision, count]`` it wrote. The
promise: the final count is exact, the revisions written are exactly
``2..N+1`` with none twice, each revision holds the count it should, and no
process ever saw the store busy. The negative control runs in the same
processes right after: load, then ``save`` value + 1 (a write that replaces
whatever is stored), which must end below its expected count, or the
harness could not see a lost update at all. On SQLite the updates must
also have re-run on lost races; on PostgreSQL they queue for the row's
lock instead, so only the control shows the processes racing.

The contention family times one writer alone, eight at once, and one
alone again, each run making as many updates of one counter, and holds
the default retry policy to its promise: no update gives up. The rates
are reported beside the figures, never asserted: they depend on the
machine and whatever else runs on it.
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
from typing import Any

import pytest
import reliability

from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState

WORKER = Path(__file__).with_name("lost_update_worker.py")
KEY = bytes(range(32))
PROCESSES = 8
CAS_SCOPE, NAIVE_SCOPE = "cas", "naive"
FORBIDDEN = ("database is locked", "StoreBusy", "STORE_BUSY", "OperationalError", "Traceback")
"""Nothing of this may reach a worker's stderr: a busy store must queue, not fail."""


@dataclass
class PhaseReport:
    """What one worker wrote in one phase."""

    worker: str
    writes: list[tuple[int, int]]
    retries: int
    reruns: int


@dataclass
class Race:
    """Every worker's reports per phase, and whatever went wrong in the processes."""

    phases: dict[str, list[PhaseReport]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@contextmanager
def _watchdog(workers: Sequence[subprocess.Popen[str]], seconds: float) -> Iterator[None]:
    """Kill every worker that is still running after ``seconds``, so a hang fails the test."""

    def kill() -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()

    timer = threading.Timer(seconds, kill)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        kill()
        for worker in workers:
            worker.wait()


def _race(
    backend: str,
    target: str,
    counts: Mapping[str, int],
    tmp_path: Path,
    env: Mapping[str, str],
    *,
    processes: int = PROCESSES,
) -> Race:
    """Start the workers, release each phase to all of them at once, and collect the reports."""
    logs = [tmp_path / f"w{n}.stderr" for n in range(processes)]
    workers = []
    for n, log in enumerate(logs):
        phase_args = ",".join(f"{phase}={count}" for phase, count in counts.items())
        with log.open("w") as stderr:
            workers.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), backend, target, f"w{n}", phase_args],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                    env=dict(env),
                )
            )
    race = Race()
    with _watchdog(workers, reliability.size(1800, 7200)):
        for n, worker in enumerate(workers):
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready", logs[n].read_text()[-3000:]
        for phase in counts:
            started = time.monotonic()
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write(f"go {phase}\n")
                worker.stdin.flush()
            race.phases[phase] = [_report(n, worker, logs[n]) for n, worker in enumerate(workers)]
            race.seconds[phase] = round(time.monotonic() - started, 3)
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait(timeout=60)
    for n, (worker, log) in enumerate(zip(workers, logs, strict=True)):
        err = log.read_text()
        if worker.returncode != 0:
            race.problems.append(f"w{n} exited {worker.returncode}: {err[-2000:]}")
        race.problems += [f"w{n} stderr shows {marker!r}" for marker in FORBIDDEN if marker in err]
    return race


def _report(n: int, worker: subprocess.Popen[str], log: Path) -> PhaseReport:
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line, f"w{n} stopped before reporting: {log.read_text()[-3000:]}"
    row = json.loads(line)
    writes = [(int(revision), int(count)) for revision, count in row["writes"]]
    return PhaseReport(f"w{n}", writes, row["retries"], row["reruns"])


def _seed(settings: Settings) -> None:
    """Create both counters at 0 (revision 1), so increments write revisions 2..N+1."""
    with bootstrap(settings, key=KEY, create=True) as runtime:
        for scope in (CAS_SCOPE, NAIVE_SCOPE):
            assert runtime.state(scope).save(WorkflowState(count=0)) == 1


def _final(settings: Settings, scope: str) -> tuple[int, int]:
    """Return the counter's final value and revision."""
    with bootstrap(settings, key=KEY) as runtime:
        snapshot = runtime.state(scope).load()
    count = snapshot.state.model_dump()["count"]
    assert isinstance(count, int)
    assert snapshot.revision is not None
    return count, snapshot.revision


def _audit(reports: Sequence[PhaseReport], total: int) -> dict[str, list[Any]]:
    """Name every way the revisions written differ from exactly 2..total+1, each once."""
    seen = Counter(revision for report in reports for revision, _ in report.writes)
    wanted = set(range(2, total + 2))
    return {
        "duplicate revisions": sorted(r for r, n in seen.items() if n > 1),
        "missing revisions": sorted(wanted - set(seen)),
        "unexpected revisions": sorted(set(seen) - wanted),
        "wrong count at revision": sorted(
            (revision, count)
            for report in reports
            for revision, count in report.writes
            if count != revision - 1
        ),
    }


def _run(
    backend: str, target: str, settings: Settings, tmp_path: Path, env: Mapping[str, str]
) -> None:
    """Race on one backend, audit the writes, record the figure, then assert."""
    family = (
        f"Lost updates, {PROCESSES} processes ({'SQLite' if backend == 'sqlite' else 'PostgreSQL'})"
    )
    per_process = (
        reliability.size(2_000, 10_000) if backend == "sqlite" else reliability.size(1_000, 5_000)
    )
    naive_per_process = reliability.size(100, 1_000)
    total, naive_total = PROCESSES * per_process, PROCESSES * naive_per_process
    watch = reliability.Stopwatch()
    _seed(settings)
    race = _race(backend, target, {"cas": per_process, "naive": naive_per_process}, tmp_path, env)
    final, revision = _final(settings, CAS_SCOPE)
    naive_final, naive_revision = _final(settings, NAIVE_SCOPE)
    audit = _audit(race.phases["cas"], total)
    naive_duplicates = _audit(race.phases["naive"], naive_total)["duplicate revisions"]
    anomalies = (
        sum(len(found) for found in audit.values())
        + abs(total - final)
        + abs(total + 1 - revision)
        + len(naive_duplicates)
        + len(race.problems)
    )
    lost = naive_total - naive_final
    reruns = sum(report.reruns for report in race.phases["cas"])
    retries = sum(report.retries for report in race.phases["cas"])
    figure = reliability.record(
        reliability.Figure(
            family=family,
            trials=total,
            anomalies=anomalies,
            control_caught=lost > 0,
            detail=(
                f"{PROCESSES} x {per_process:,} CAS increments via StateRepository.update "
                f"in {race.seconds['cas']:.0f} s: final {final:,} at r{revision:,}, "
                f"{reruns:,} re-runs on conflicts, {retries:,} updates out of retries and retried; "
                f"naive load-then-save control lost {lost:,} of {naive_total:,} updates"
            ),
            seconds=watch.seconds,
        )
    )
    print(f"\n{figure}")
    assert race.problems == []
    assert {name: found for name, found in audit.items() if found} == {}
    assert (final, revision) == (total, total + 1)
    assert naive_duplicates == [], "even unguarded saves must never reuse a revision"
    assert naive_revision == naive_total + 1
    if backend == "sqlite":
        assert reruns > 0, "the workers never raced; the harness proves nothing"
    assert lost > 0, "the naive control lost nothing: the race is too weak to show CAS works"
    assert figure.anomalies == 0


def test_eight_sqlite_processes_lose_no_update(tmp_path: Path) -> None:
    """8 x 2,000 CAS increments on one SQLite file: exact count, revisions 2..16,001 once each."""
    home = tmp_path / "home"
    _run("sqlite", str(home), Settings(backend="sqlite", home=home), tmp_path, os.environ)


@pytest.mark.postgres
def test_eight_postgres_processes_lose_no_update(
    postgres_server, pg_schema: str, tmp_path: Path
) -> None:
    """8 x 1,000 CAS increments on one PostgreSQL row: exact count, revisions 2..8,001 once each."""
    settings = Settings(
        backend="postgres",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        postgres_pool_size=1,
    )
    env = {**os.environ, "TEST_POSTGRES_DSN": postgres_server.dsn}
    _run("postgres", pg_schema, settings, tmp_path, env)


def _contend(
    backend: str, target: str, settings: Settings, tmp_path: Path, env: Mapping[str, str]
) -> None:
    """Time one writer alone, eight at once, then one alone again; count the give-ups.

    Each run makes the same number of updates, and the lone writer's rate
    is taken over both of its runs, so a machine whose load drifts during
    the test weighs on both rates alike.
    """
    name = "SQLite" if backend == "sqlite" else "PostgreSQL"
    per_process = reliability.size(100, 500) if backend == "sqlite" else reliability.size(100, 300)
    watch = reliability.Stopwatch()
    _seed(settings)
    crowd_total = PROCESSES * per_process
    races = []
    for step, processes in enumerate((1, PROCESSES, 1)):
        logs = tmp_path / f"{step}-{processes}-writers"
        logs.mkdir()
        counts = {"cas": crowd_total // processes}
        races.append(_race(backend, target, counts, logs, env, processes=processes))
    before, crowd, after = races
    total = 3 * crowd_total
    final, revision = _final(settings, CAS_SCOPE)
    give_ups = sum(report.retries for race in races for report in race.phases["cas"])
    reruns = sum(report.reruns for report in crowd.phases["cas"])
    alone_rate = 2 * crowd_total / (before.seconds["cas"] + after.seconds["cas"])
    crowd_rate = crowd_total / crowd.seconds["cas"]
    problems = [problem for race in races for problem in race.problems]
    figure = reliability.record(
        reliability.Figure(
            family=f"Contended updates, {PROCESSES} processes ({name})",
            trials=total,
            anomalies=give_ups + abs(total - final) + len(problems),
            control_caught=None,
            detail=(
                f"1 writer: 2 x {crowd_total:,} updates at {alone_rate:.1f}/s; "
                f"{PROCESSES} x {per_process:,} at {crowd_rate:.1f}/s "
                f"({crowd_rate / alone_rate:.0%}), {give_ups:,} gave up, "
                f"{reruns:,} re-runs of fn"
            ),
            seconds=watch.seconds,
        )
    )
    print(f"\n{figure}")
    assert problems == []
    assert (final, revision) == (total, total + 1)
    assert give_ups == 0, f"{give_ups} updates gave up under the default retry policy"


def test_eight_sqlite_processes_never_give_up(tmp_path: Path) -> None:
    """8 x 100 updates of one SQLite row (8 x 500 long): none raises REVISION_CONFLICT."""
    home = tmp_path / "home"
    _contend("sqlite", str(home), Settings(backend="sqlite", home=home), tmp_path, os.environ)


@pytest.mark.postgres
def test_eight_postgres_processes_never_give_up(
    postgres_server, pg_schema: str, tmp_path: Path
) -> None:
    """8 x 100 updates of one PostgreSQL row (8 x 300 long): none raises REVISION_CONFLICT."""
    settings = Settings(
        backend="postgres",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        postgres_pool_size=1,
    )
    env = {**os.environ, "TEST_POSTGRES_DSN": postgres_server.dsn}
    _contend("postgres", pg_schema, settings, tmp_path, env)
