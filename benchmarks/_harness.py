"""Timing, statistics and reporting shared by the runner and its worker processes.

It imports nothing from flowvault, so a worker and the runner agree on one
sample format, and a figure is computed the same way wherever it was measured.
"""

from __future__ import annotations

import math
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Generic, Literal, TypeVar

JsonObject = dict[str, object]
T = TypeVar("T")

Status = Literal["ok", "skipped", "failed"]
PeerStatus = Literal["ok", "not installed"]


def as_float(value: object) -> float:
    """Return a JSON number as a float; anything else is a protocol error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def as_int(value: object) -> int:
    """Return a JSON integer; anything else is a protocol error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def as_list(value: object) -> list[object]:
    """Return a JSON array; anything else is a protocol error."""
    if not isinstance(value, list):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return value


def as_object(value: object) -> Mapping[str, object]:
    """Return a JSON object; anything else is a protocol error."""
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def ms_since(started: float) -> float:
    """Milliseconds elapsed on the ``perf_counter`` clock since ``started``."""
    return (time.perf_counter() - started) * 1000.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One repetition: how many operations ran, in how long, and each one's latency."""

    ops: int
    seconds: float
    latencies_ms: tuple[float, ...]
    errors: int = 0

    @property
    def rate(self) -> float:
        """Operations per second of this repetition."""
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> JsonObject:
        """Return the sample as worker processes send it over their pipe."""
        return {
            "ops": self.ops,
            "seconds": self.seconds,
            "latencies_ms": list(self.latencies_ms),
            "errors": self.errors,
        }

    @classmethod
    def from_json(cls, data: object) -> Sample:
        """Rebuild a sample a worker process sent."""
        body = as_object(data)
        return cls(
            ops=as_int(body["ops"]),
            seconds=as_float(body["seconds"]),
            latencies_ms=tuple(as_float(v) for v in as_list(body["latencies_ms"])),
            errors=as_int(body["errors"]),
        )


def sample_from_latencies(latencies_ms: Sequence[float], errors: int = 0) -> Sample:
    """Return a sample whose time is the sum of its operations' latencies.

    Used where one repetition mixes kinds of operation (ordinary and
    terminal transitions) and each kind is reported on its own.
    """
    return Sample(len(latencies_ms), sum(latencies_ms) / 1000.0, tuple(latencies_ms), errors)


class Recorder:
    """Collects the latencies and errors of one repetition, timed from construction."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.errors = 0
        self._started = time.perf_counter()

    def record(self, started: float) -> None:
        """Record one operation that began at ``started`` (a ``perf_counter`` value)."""
        self.latencies_ms.append(ms_since(started))

    def sample(self) -> Sample:
        """Return the repetition so far as a sample over the wall time since construction."""
        seconds = time.perf_counter() - self._started
        return Sample(len(self.latencies_ms), seconds, tuple(self.latencies_ms), self.errors)


def percentile(values: Iterable[float], q: float) -> float:
    """Return the ``q``-th percentile by linear interpolation (monotone in ``q``)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Summary:
    """Rates over repetitions (median, min, max) and latencies over every operation."""

    median: float
    minimum: float
    maximum: float
    p50_ms: float
    p99_ms: float
    operations: int
    errors: int
    repetitions: int
    rates: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Summary:
        """Summarise ``samples``; the median rate is the figure every ratio uses."""
        rates = tuple(sample.rate for sample in samples)
        latencies = [ms for sample in samples for ms in sample.latencies_ms]
        return cls(
            median=statistics.median(rates) if rates else 0.0,
            minimum=min(rates, default=0.0),
            maximum=max(rates, default=0.0),
            p50_ms=percentile(latencies, 50),
            p99_ms=percentile(latencies, 99),
            operations=sum(sample.ops for sample in samples),
            errors=sum(sample.errors for sample in samples),
            repetitions=len(samples),
            rates=rates,
        )

    def to_json(self) -> JsonObject:
        """Return every figure of the summary."""
        return {
            "ops_per_s": {
                "median": self.median,
                "min": self.minimum,
                "max": self.maximum,
                "repetitions": list(self.rates),
            },
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "operations": self.operations,
            "errors": self.errors,
            "repetitions": self.repetitions,
        }


@dataclass(frozen=True, slots=True)
class Peer:
    """The same work done by the store users would otherwise pick, or why it was not measured."""

    name: str
    samples: tuple[Sample, ...] = ()
    status: PeerStatus = "ok"
    reason: str | None = None

    @property
    def summary(self) -> Summary:
        """The peer's figures, measured interleaved with the workload and the baseline."""
        return Summary.of(self.samples)

    def to_json(self) -> JsonObject:
        """Return the peer's name and status, and its figures when it ran."""
        head: JsonObject = {"name": self.name, "status": self.status, "reason": self.reason}
        return {**head, **self.summary.to_json()} if self.status == "ok" else head


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the report: a measured workload beside the baseline of the same run.

    ``peer`` is set on the rows where a peer store does the same work.
    """

    id: str
    label: str
    samples: tuple[Sample, ...]
    baseline_name: str
    baseline: tuple[Sample, ...]
    notes: str = ""
    unit: str = "op"
    peer: Peer | None = None

    @property
    def summary(self) -> Summary:
        """The workload's figures."""
        return Summary.of(self.samples)

    @property
    def baseline_summary(self) -> Summary:
        """The baseline's figures, measured interleaved with the workload."""
        return Summary.of(self.baseline)

    @property
    def ratio(self) -> float:
        """Median workload rate over median baseline rate."""
        base = self.baseline_summary.median
        return self.summary.median / base if base > 0 else 0.0

    @property
    def peer_ratio(self) -> float | None:
        """Median workload rate over the peer's median rate; ``None`` when the peer did not run."""
        if self.peer is None or self.peer.status != "ok":
            return None
        base = self.peer.summary.median
        return self.summary.median / base if base > 0 else 0.0

    @property
    def errors(self) -> int:
        """Failed operations of the workload, its baseline and its peer together."""
        peer = self.peer.summary.errors if self.peer is not None else 0
        return self.summary.errors + self.baseline_summary.errors + peer

    def to_json(self) -> JsonObject:
        """Return the row with every number, the baseline's and the peer's included."""
        return {
            "id": self.id,
            "label": self.label,
            "unit": self.unit,
            **self.summary.to_json(),
            "ratio": self.ratio,
            "baseline": {"name": self.baseline_name, **self.baseline_summary.to_json()},
            "peer_ratio": self.peer_ratio,
            "peer": None if self.peer is None else self.peer.to_json(),
            "notes": self.notes,
        }


@dataclass(slots=True)
class ScenarioResult:
    """A scenario's rows and figures, or why it did not run."""

    id: str
    title: str
    rows: list[Row] = field(default_factory=list)
    extra: JsonObject = field(default_factory=dict)
    status: Status = "ok"
    reason: str | None = None
    seconds: float = 0.0

    def to_json(self) -> JsonObject:
        """Return the scenario as the JSON report holds it."""
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "seconds": self.seconds,
            "rows": [row.to_json() for row in self.rows],
            "extra": self.extra,
        }


@dataclass(frozen=True, slots=True)
class Rounds(Generic[T]):
    """What each side measured over the interleaved repetitions; ``peer`` is empty without one."""

    baseline: tuple[Sample, ...]
    peer: tuple[Sample, ...]
    scenario: tuple[T, ...]


def interleave_rounds(
    repetitions: int,
    baseline: Callable[[], Sample],
    scenario: Callable[[], T],
    *,
    peer: Callable[[], Sample] | None = None,
    warmup: bool = True,
) -> Rounds[T]:
    """Run the baseline, then the peer (if any), then the scenario, ``repetitions`` times.

    Alternating them exposes all of them to the same drift (other jobs,
    page cache, disk queue), so their ratios are steadier than any one
    figure. One unrecorded round first opens files and warms caches.
    """
    if warmup:
        baseline()
        if peer is not None:
            peer()
        scenario()
    base: list[Sample] = []
    peers: list[Sample] = []
    measured: list[T] = []
    for _ in range(repetitions):
        base.append(baseline())
        if peer is not None:
            peers.append(peer())
        measured.append(scenario())
    return Rounds(tuple(base), tuple(peers), tuple(measured))


def interleave(
    repetitions: int,
    baseline: Callable[[], Sample],
    scenario: Callable[[], T],
    *,
    warmup: bool = True,
) -> tuple[tuple[Sample, ...], tuple[T, ...]]:
    """Run the baseline then the scenario, ``repetitions`` times (see ``interleave_rounds``)."""
    rounds = interleave_rounds(repetitions, baseline, scenario, warmup=warmup)
    return rounds.baseline, rounds.scenario


def _figure(value: float) -> str:
    """Three significant figures without an exponent, thousands grouped."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


_HEADER = (
    "scenario",
    "ops/s median [min\u2013max]",
    "p50 ms",
    "p99 ms",
    "ratio",
    "peer ratio",
    "baseline ops/s",
    "peer ops/s median [min\u2013max]",
    "peer p50 / p99 ms",
    "notes",
)


def _rates(summary: Summary) -> str:
    return f"{_figure(summary.median)} [{_figure(summary.minimum)}\u2013{_figure(summary.maximum)}]"


def _peer_cells(row: Row) -> tuple[str, str, str]:
    """Return the peer ratio, rates and latencies; a peer that did not run says why."""
    peer, ratio = row.peer, row.peer_ratio
    if peer is None:
        return "-", "-", "-"
    if ratio is None:
        return "-", f"{peer.status}: {peer.reason}", "-"
    summary = peer.summary
    latency = f"{_figure(summary.p50_ms)} / {_figure(summary.p99_ms)}"
    return f"{ratio:.3f}", f"{_rates(summary)} ({peer.name})", latency


def _cells(row: Row) -> tuple[str, ...]:
    summary, base = row.summary, row.baseline_summary
    notes = row.notes if not row.errors else f"{row.errors} ERRORS; {row.notes}"
    peer_ratio, peer_rates, peer_latency = _peer_cells(row)
    return (
        f"{row.id} {row.label}",
        _rates(summary),
        _figure(summary.p50_ms),
        _figure(summary.p99_ms),
        f"{row.ratio:.3f}",
        peer_ratio,
        f"{_figure(base.median)} ({row.baseline_name})",
        peer_rates,
        peer_latency,
        notes,
    )


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"


def markdown(results: Sequence[ScenarioResult]) -> str:
    """Return the report as one markdown table; a scenario that did not run says why."""
    lines = [_line(_HEADER), _line(["---"] * len(_HEADER))]
    for result in results:
        if result.status != "ok":
            blank = ["-"] * (len(_HEADER) - 2)
            note = f"{result.status}: {result.reason}"
            lines.append(_line([f"{result.id} {result.title}", *blank, note]))
        lines.extend(_line(_cells(row)) for row in result.rows)
    return "\n".join(lines)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def run_metadata(*, quick: bool) -> JsonObject:
    """Return where and how the figures were taken, so two runs can be compared."""
    load: list[float] | None = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "sqlite_version": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load,
        "quick": quick,
        "flowvault_version": _version("flowvault"),
        "psycopg_version": _version("psycopg"),
    }
