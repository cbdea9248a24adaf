"""The scenarios S1 to S6: each drives flowvault and its raw baseline in the same run.

Every function takes the run's ``Context`` and returns a ``ScenarioResult``
whose rows pair a flowvault measurement with the baseline measured
interleaved with it; S1, S2 and S5a also interleave the peer doing the same
work. See ``benchmarks/run.py`` for the list and order.
"""

from __future__ import annotations

import base64
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from _baseline import (
    RawDatabase,
    RawPostgres,
    RawSqlite,
    drop_schema,
    postgres_server_version,
    postgres_unreachable,
    schema_exists,
)
from _harness import (
    JsonObject,
    Peer,
    Recorder,
    Row,
    Sample,
    ScenarioResult,
    as_float,
    as_int,
    as_list,
    as_object,
    interleave,
    interleave_rounds,
)
from _peer import PEER_NAME, PeerSaver, peer_unavailable
from _workload import (
    OPS_PER_RUN,
    OPS_PER_WORKFLOW,
    RUN_DEFINITION,
    LifecycleRun,
    Orders,
    create_workflows,
    open_runtime,
    prefill,
    prefill_peer,
    run_lifecycles,
    run_peer_lifecycles,
    sqlite_settings,
)

from flowvault.application import KeyedDigester, SecureObjectStore, UnitOfWork, WorkflowService
from flowvault.application._audit import verify_stream
from flowvault.application._streams import keyed
from flowvault.application.ports import Clock
from flowvault.composition import Settings
from flowvault.domain import FlowvaultError, LedgerEvent, WorkOrder
from flowvault.domain._ledger import GENESIS_HASH

RAW_WRITE: Final = "raw SQLite write"
RAW_READ: Final = "raw SQLite read"
PG_WRITE: Final = "raw psycopg write"
PG_READ: Final = "raw psycopg read"
RAW_ROWS: Final = 1000
STREAM_BATCH: Final = 500
CHILD_TIMEOUT: Final = 3600.0
WORKER_QUIT_TIMEOUT: Final = 60.0


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each scenario does; ``--quick`` shrinks them, never the code paths."""

    repetitions: int
    s1_workflows: int
    memory_workflows: int
    s2_workflows: int
    s2_reads: int
    s3_sizes: tuple[int, ...]
    s3_workflows: int
    s4_events: int
    s4_workflows: int
    s5_processes: int
    s5_workflows: int
    s5_threads: int
    s5_thread_workflows: int
    s6_workflows: int
    s7_runs: int

    def to_json(self) -> JsonObject:
        """Return the sizes for the report's parameters."""
        return {**asdict(self), "ops_per_workflow": OPS_PER_WORKFLOW}


QUICK: Final = Sizes(
    repetitions=5,
    s1_workflows=3,
    memory_workflows=10,
    s2_workflows=30,
    s2_reads=100,
    s3_sizes=(100, 1000),
    s3_workflows=2,
    s4_events=1000,
    s4_workflows=500,
    s5_processes=4,
    s5_workflows=2,
    s5_threads=8,
    s5_thread_workflows=1,
    s6_workflows=3,
    s7_runs=2,
)

FULL: Final = Sizes(
    repetitions=5,
    s1_workflows=60,
    memory_workflows=400,
    s2_workflows=2000,
    s2_reads=5000,
    s3_sizes=(1000, 10_000, 100_000),
    s3_workflows=20,
    s4_events=10_000,
    s4_workflows=10_000,
    s5_processes=4,
    s5_workflows=15,
    s5_threads=8,
    s5_thread_workflows=8,
    s6_workflows=40,
    s7_runs=20,
)


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """The server and the fresh schema the PostgreSQL scenarios use (and drop)."""

    dsn: str
    schema: str


@dataclass(frozen=True, slots=True)
class Context:
    """What every scenario needs: sizes, a work directory on the measured disk, a run tag."""

    sizes: Sizes
    work: Path
    tag: str
    worker: Path
    postgres: PostgresTarget | None
    peer_key: bytes

    def raw_sqlite(self, name: str, rows: int = RAW_ROWS, *, seed: int = 1) -> RawSqlite:
        """Create and open a raw baseline database next to the flowvault homes."""
        path = self.work / f"{name}-raw.db"
        RawSqlite.create(path, rows)
        return RawSqlite(path, seed=seed)

    def peer_path(self, name: str) -> Path:
        """Return where the peer's database for ``name`` lives, beside the baseline's."""
        return self.work / f"{name}-peer.db"


PeerSlot = PeerSaver | Peer | None
"""A row's peer: a saver to measure, a ``Peer`` saying why none runs, or no peer column."""


@contextmanager
def open_peer(ctx: Context, name: str) -> Iterator[PeerSaver | Peer]:
    """Open the peer's database for ``name`` (FULL), or yield why the peer cannot run."""
    reason = peer_unavailable()
    if reason is not None:
        yield Peer(PEER_NAME, status="not installed", reason=reason)
        return
    saver = PeerSaver(ctx.peer_path(name), ctx.peer_key)
    try:
        yield saver
    finally:
        saver.close()


def _peer_figures(peer: PeerSlot, samples: tuple[Sample, ...]) -> Peer | None:
    return Peer(PEER_NAME, samples) if isinstance(peer, PeerSaver) else peer


def _lifecycle_row(
    row_id: str,
    label: str,
    workflows: WorkflowService,
    raw: RawDatabase,
    baseline_name: str,
    *,
    count: int,
    baseline_ops: int,
    ctx: Context,
    peer: PeerSlot = None,
) -> Row:
    """Interleave raw writes, the peer's threads and ``count`` workflows driven to ``completed``.

    The peer, when it runs, writes ``count`` threads of one checkpoint per
    operation; the raw baseline does ``baseline_ops`` single-row writes.
    """
    orders = Orders(f"{ctx.tag}-{row_id}")
    saver = peer if isinstance(peer, PeerSaver) else None
    peer_orders = Orders(f"{ctx.tag}-{row_id}-peer")
    rounds = interleave_rounds(
        ctx.sizes.repetitions,
        lambda: raw.write_sample(baseline_ops),
        lambda: run_lifecycles(workflows, orders.take(count)).sample(),
        peer=None if saver is None else lambda: run_peer_lifecycles(saver, peer_orders.take(count)),
    )
    transitions = OPS_PER_WORKFLOW - 1
    notes = f"{count} workflows x (create + {transitions} transitions) per repetition"
    return Row(
        row_id,
        label,
        rounds.scenario,
        baseline_name,
        rounds.baseline,
        notes,
        peer=_peer_figures(peer, rounds.peer),
    )


def _read_sample(workflows: WorkflowService, picks: Sequence[str]) -> Sample:
    recorder = Recorder()
    for workflow_id in picks:
        started = time.perf_counter()
        try:
            record = workflows.get(workflow_id)
        except FlowvaultError:
            recorder.errors += 1
            continue
        recorder.record(started)
        if record.workflow_id != workflow_id:
            recorder.errors += 1
    return recorder.sample()


def _peer_read_sample(peer: PeerSaver, picks: Sequence[str]) -> Sample:
    recorder = Recorder()
    for thread_id in picks:
        started = time.perf_counter()
        document = peer.latest(thread_id)
        if document is None or document.get("workflow_id") != thread_id:
            recorder.errors += 1
            continue
        recorder.record(started)
    return recorder.sample()


def _read_row(
    row_id: str,
    label: str,
    workflows: WorkflowService,
    raw: RawDatabase,
    baseline_name: str,
    *,
    ids: Sequence[str],
    reads: int,
    ctx: Context,
    peer: PeerSlot = None,
    threads: Sequence[str] = (),
) -> Row:
    """Interleave raw primary-key reads, the peer's reads and ``get`` of random workflow ids.

    The peer, when it runs, reads the latest checkpoint of random ``threads``.
    """
    picker = random.Random(7)  # noqa: S311 - picks ids to read, not secrets
    peer_picker = random.Random(7)  # noqa: S311
    saver = peer if isinstance(peer, PeerSaver) else None
    rounds = interleave_rounds(
        ctx.sizes.repetitions,
        lambda: raw.read_sample(reads),
        lambda: _read_sample(workflows, [picker.choice(ids) for _ in range(reads)]),
        peer=None
        if saver is None
        else lambda: _peer_read_sample(saver, [peer_picker.choice(threads) for _ in range(reads)]),
    )
    notes = f"{reads} gets of random ids among {len(ids)} workflows per repetition"
    return Row(
        row_id,
        label,
        rounds.scenario,
        baseline_name,
        rounds.baseline,
        notes,
        peer=_peer_figures(peer, rounds.peer),
    )


# -- S1 and the memory ceiling -----------------------------------------------


def s1_sqlite(ctx: Context) -> ScenarioResult:
    """S1: workflows driven through the lifecycle on a SQLite store with synchronous=FULL."""
    count = ctx.sizes.s1_workflows
    raw = ctx.raw_sqlite("s1")
    try:
        with (
            open_runtime(sqlite_settings(ctx.work / "s1")) as runtime,
            open_peer(ctx, "s1") as peer,
        ):
            row = _lifecycle_row(
                "S1",
                "durable transitions (SQLite, FULL)",
                runtime.workflows,
                raw,
                RAW_WRITE,
                count=count,
                baseline_ops=count * OPS_PER_WORKFLOW,
                ctx=ctx,
                peer=peer,
            )
    finally:
        raw.close()
    return ScenarioResult("S1", "durable transitions", [row])


def s1_memory(ctx: Context) -> ScenarioResult:
    """S1 on the memory adapter: the pure-Python ceiling, against the same raw write baseline."""
    raw = ctx.raw_sqlite("s1-memory")
    try:
        with open_runtime(Settings(backend="memory", home=ctx.work / "s1-memory")) as runtime:
            row = _lifecycle_row(
                "S1-memory",
                "transitions (memory adapter)",
                runtime.workflows,
                raw,
                RAW_WRITE,
                count=ctx.sizes.memory_workflows,
                baseline_ops=ctx.sizes.s1_workflows * OPS_PER_WORKFLOW,
                ctx=ctx,
            )
    finally:
        raw.close()
    return ScenarioResult("S1-memory", "pure-Python ceiling", [row])


# -- S2 -------------------------------------------------------------------------


def _prefill_peer_threads(ctx: Context, name: str, count: int) -> tuple[list[str], list[str]]:
    """Write ``count`` threads through a ``synchronous=NORMAL`` saver, closed before measuring.

    Setup only, as ``prefill`` is for flowvault. Returns the thread ids and
    the stored checkpoint types, which must all be encrypted for the reads
    to pay what flowvault's do; without the peer, neither.
    """
    if peer_unavailable() is not None:
        return [], []
    saver = PeerSaver(ctx.peer_path(name), ctx.peer_key, synchronous="NORMAL")
    try:
        threads = prefill_peer(saver, Orders(f"{ctx.tag}-{name}-peer").stream(count))
        types = saver.checkpoint_types()
    finally:
        saver.close()
    if not types or not all(kind.endswith("+aes") for kind in types):
        raise RuntimeError(f"the peer's checkpoints are not all encrypted: {types}")
    return threads, types


def s2_reads(ctx: Context) -> ScenarioResult:
    """S2: ``get`` of random workflows: load the row and open the sealed record."""
    settings = sqlite_settings(ctx.work / "s2")
    ids: list[str] = []
    prefill(settings, Orders(f"{ctx.tag}-s2").stream(ctx.sizes.s2_workflows), ids)
    threads, types = _prefill_peer_threads(ctx, "s2", ctx.sizes.s2_workflows)
    raw = ctx.raw_sqlite("s2", rows=ctx.sizes.s2_workflows)
    try:
        with open_runtime(settings) as runtime, open_peer(ctx, "s2") as peer:
            row = _read_row(
                "S2",
                "reads (get)",
                runtime.workflows,
                raw,
                RAW_READ,
                ids=ids,
                reads=ctx.sizes.s2_reads,
                ctx=ctx,
                peer=peer,
                threads=threads,
            )
    finally:
        raw.close()
    return ScenarioResult("S2", "reads", [row], {"peer_checkpoint_types": types})


# -- S3 -------------------------------------------------------------------------


def run_child(ctx: Context, mode: str, config: JsonObject) -> Mapping[str, object]:
    """Run a worker to completion and return the JSON document it prints last."""
    completed = subprocess.run(  # noqa: S603 - our own worker script, no shell
        [sys.executable, str(ctx.worker), mode],
        input=json.dumps(config) + "\n",
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(
            f"{mode} worker failed ({completed.returncode}): {completed.stderr[-2000:]}"
        )
    return as_object(json.loads(lines[-1]))


def _growth_rows(size: Mapping[str, object]) -> tuple[Row, Row]:
    count = as_int(size["size"])
    base = tuple(Sample.from_json(s) for s in as_list(size["baseline"]))
    ordinary = tuple(Sample.from_json(s) for s in as_list(size["ordinary"]))
    terminal = tuple(Sample.from_json(s) for s in as_list(size["terminal"]))
    where = f"store of {as_int(size['workflows_in_store']):,} workflows"
    notes = f"{where}; rate = ops / time spent in these ops"
    return (
        Row(
            f"S3-{count}-ordinary",
            "create + non-terminal transitions",
            ordinary,
            RAW_WRITE,
            base,
            notes,
        ),
        Row(
            f"S3-{count}-terminal",
            "terminal transition (scrub + compact)",
            terminal,
            RAW_WRITE,
            base,
            notes,
        ),
    )


def _cost_ratio(small: Row, large: Row) -> float:
    """cost(largest) / cost(smallest), where cost is ms per operation (1 / median rate)."""
    large_rate = large.summary.median
    return small.summary.median / large_rate if large_rate > 0 else 0.0


def s3_growth(ctx: Context) -> ScenarioResult:
    """S3: S1's per-operation cost and the terminal cost as one store grows, in a subprocess."""
    config: JsonObject = {
        "home": str(ctx.work / "s3"),
        "raw": str(ctx.work / "s3-raw.db"),
        "sizes": list(ctx.sizes.s3_sizes),
        "workflows": ctx.sizes.s3_workflows,
        "repetitions": ctx.sizes.repetitions,
        "tag": f"{ctx.tag}-s3",
        "warmup": True,
    }
    document = run_child(ctx, "growth", config)
    sizes = [as_object(size) for size in as_list(document["sizes"])]
    pairs = [_growth_rows(size) for size in sizes]
    (small_ordinary, small_terminal), (large_ordinary, large_terminal) = pairs[0], pairs[-1]
    extra: JsonObject = {
        "peak_rss_mb": as_float(document["peak_rss_mb"]),
        "sizes": [
            {
                "size": as_int(size["size"]),
                "workflows_in_store": as_int(size["workflows_in_store"]),
                "prefill_seconds": as_float(size["prefill_seconds"]),
                "ordinary_ms_per_op": _ms_per_op(ordinary),
                "terminal_ms_per_op": _ms_per_op(terminal),
            }
            for size, (ordinary, terminal) in zip(sizes, pairs, strict=True)
        ],
        "growth": {
            "smallest": ctx.sizes.s3_sizes[0],
            "largest": ctx.sizes.s3_sizes[-1],
            "ordinary_cost_ratio": _cost_ratio(small_ordinary, large_ordinary),
            "terminal_cost_ratio": _cost_ratio(small_terminal, large_terminal),
        },
    }
    rows = [row for pair in pairs for row in pair]
    return ScenarioResult("S3", "growth", rows, extra)


def _ms_per_op(row: Row) -> float:
    rate = row.summary.median
    return 1000.0 / rate if rate > 0 else 0.0


# -- S4 -------------------------------------------------------------------------


def build_stream(
    store: SecureObjectStore, clock: Clock, stream: str, events: int, digester: KeyedDigester
) -> None:
    """Append a valid keyed hash chain of ``events`` events, ``STREAM_BATCH`` per unit of work.

    Each event carries its chain MAC, as the services' events do, so the
    pass verifies what ``flowvault ledger verify`` verifies on a real store.
    """
    previous = GENESIS_HASH
    for first in range(0, events, STREAM_BATCH):
        chunk: list[LedgerEvent] = []
        for index in range(first, min(first + STREAM_BATCH, events)):
            event = keyed(
                LedgerEvent.create(
                    stream=stream,
                    index=index,
                    type="bench.event",
                    occurred_at=clock.now(),
                    payload={"n": index, "note": "benchmark"},
                    previous_hash=previous,
                ),
                digester,
            )
            previous = event.event_hash
            chunk.append(event)
        store.commit(UnitOfWork(appends=chunk))


def _per_event(seconds: float, events: int, errors: int) -> Sample:
    """One verification pass; its latency is the pass's time per event."""
    share = seconds * 1000.0 / events if events else seconds * 1000.0
    return Sample(events, seconds, (share,), errors)


def _verify_pass(
    store: SecureObjectStore, stream: str, expected: int, digester: KeyedDigester
) -> Sample:
    started = time.perf_counter()
    audit = verify_stream(store, stream, digester)
    seconds = time.perf_counter() - started
    errors = 0 if audit.ok and audit.events == expected and not audit.unkeyed else 1
    return _per_event(seconds, audit.events, errors)


def _stream_row(ctx: Context) -> Row:
    events = ctx.sizes.s4_events
    settings = sqlite_settings(ctx.work / "s4-stream")
    stream = f"bench/{ctx.tag}"
    with open_runtime(settings.model_copy(update={"synchronous": "normal"})) as runtime:
        build_stream(runtime.store, runtime.clock, stream, events, runtime.repository)
    raw = ctx.raw_sqlite("s4-stream")
    try:
        with open_runtime(settings) as runtime:
            base, samples = interleave(
                ctx.sizes.repetitions,
                lambda: raw.read_sample(events),
                lambda: _verify_pass(runtime.store, stream, events, runtime.repository),
            )
    finally:
        raw.close()
    notes = (
        f"keyed verify_stream (hashes and chain MACs) over one stream of {events:,} events; "
        "latency = ms per event"
    )
    return Row(
        "S4-stream", "events verified (verify_stream)", samples, RAW_READ, base, notes, "event"
    )


def cli_command() -> list[str]:
    """Return the ``flowvault`` console script beside this interpreter, else its entry point."""
    script = Path(sys.executable).with_name("flowvault")
    if script.is_file():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from flowvault.composition._cli import main; sys.exit(main())",
    ]


def _cli_env(home: Path) -> dict[str, str]:
    """Return this environment without other ``FLOWVAULT_*`` settings, pointed at ``home``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLOWVAULT_")}
    return {**env, "FLOWVAULT_HOME": str(home)}


def _cli_pass(home: Path, expected: int, reports: list[JsonObject]) -> Sample:
    started = time.perf_counter()
    completed = subprocess.run(  # noqa: S603 - the flowvault console script, no shell
        [*cli_command(), "ledger", "verify", "--all", "--json"],
        capture_output=True,
        text=True,
        env=_cli_env(home),
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    seconds = time.perf_counter() - started
    try:
        report = as_object(json.loads(completed.stdout))
    except (ValueError, TypeError):
        sys.stderr.write(f"ledger verify failed: {completed.stderr[-2000:]}\n")
        return _per_event(seconds, 0, 1)
    events = as_int(report["events"])
    ok = completed.returncode == 0 and report["ok"] is True
    reports.append({"seconds": seconds, **report})
    return _per_event(seconds, events, 0 if ok and events >= expected else 1)


def _cli_row(ctx: Context, reports: list[JsonObject]) -> Row:
    count = ctx.sizes.s4_workflows
    home = ctx.work / "s4-cli"
    prefill(sqlite_settings(home), Orders(f"{ctx.tag}-s4").stream(count))
    raw = ctx.raw_sqlite("s4-cli")
    try:
        base, samples = interleave(
            ctx.sizes.repetitions,
            lambda: raw.read_sample(count),
            lambda: _cli_pass(home, count, reports),
        )
    finally:
        raw.close()
    notes = (
        f"flowvault ledger verify --all over {count:,} workflows (1 event each, every record "
        "opened); subprocess wall time incl. interpreter start-up"
    )
    return Row("S4-cli", "events verified (CLI --all)", samples, RAW_READ, base, notes, "event")


def s4_ledger(ctx: Context) -> ScenarioResult:
    """S4: ledger verification, in-process on one long stream and by the CLI over a store."""
    reports: list[JsonObject] = []
    stream = _stream_row(ctx)
    cli = _cli_row(ctx, reports)
    measured = reports[-ctx.sizes.repetitions :]
    seconds = [as_float(report["seconds"]) for report in measured]
    last = measured[-1] if measured else {}
    extra: JsonObject = {
        "stream_events": ctx.sizes.s4_events,
        "cli_workflows": ctx.sizes.s4_workflows,
        "cli_seconds": seconds,
        "cli_seconds_median": statistics.median(seconds) if seconds else None,
        "cli_streams_checked": last.get("streams_checked"),
        "cli_events": last.get("events"),
        "cli_records": last.get("records"),
    }
    return ScenarioResult("S4", "ledger verification", [stream, cli], extra)


# -- S5 -------------------------------------------------------------------------


class WorkerGroup:
    """Long-lived writer processes, driven round by round over their pipes.

    Each round sends one command to every worker before reading any reply,
    so they run at the same time; the aggregate rate is the operations of
    all of them over the span from the first start to the last end (the
    monotonic clock is system-wide).
    """

    def __init__(self, ctx: Context, name: str, configs: Sequence[JsonObject]) -> None:
        self._logs = [ctx.work / f"{name}-worker-{n}.log" for n in range(len(configs))]
        self._processes: list[subprocess.Popen[str]] = []
        try:
            self._start(ctx, configs)
        except BaseException:
            self.close()
            raise

    def _start(self, ctx: Context, configs: Sequence[JsonObject]) -> None:
        for log in self._logs:
            with log.open("w", encoding="utf-8") as errors:
                self._processes.append(
                    subprocess.Popen(  # noqa: S603 - our own worker script, no shell
                        [sys.executable, str(ctx.worker), "writer"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=errors,
                        text=True,
                    )
                )
        for n, config in enumerate(configs):
            self._send(n, json.dumps(config))
        for n in range(len(configs)):
            if self._receive(n) != "ready":
                raise RuntimeError(f"worker {n} did not start: {self._tail(n)}")

    def _send(self, n: int, line: str) -> None:
        stdin = self._processes[n].stdin
        if stdin is None:
            raise RuntimeError("worker has no stdin")
        stdin.write(line + "\n")
        stdin.flush()

    def _receive(self, n: int) -> str:
        stdout = self._processes[n].stdout
        line = "" if stdout is None else stdout.readline()
        if not line:
            raise RuntimeError(f"worker {n} exited: {self._tail(n)}")
        return line.strip()

    def _tail(self, n: int) -> str:
        return self._logs[n].read_text(encoding="utf-8", errors="replace")[-2000:]

    def round(self, command: str, workers: int | None = None) -> Sample:
        """Run one round on the first ``workers`` workers (all by default); return the aggregate."""
        taking = range(len(self._processes) if workers is None else workers)
        for n in taking:
            self._send(n, command)
        replies = [as_object(json.loads(self._receive(n))) for n in taking]
        samples = [Sample.from_json(reply) for reply in replies]
        span = max(as_float(r["end"]) for r in replies) - min(as_float(r["start"]) for r in replies)
        return Sample(
            sum(sample.ops for sample in samples),
            span,
            tuple(ms for sample in samples for ms in sample.latencies_ms),
            sum(sample.errors for sample in samples),
        )

    def close(self) -> None:
        """Ask every worker to quit; kill any that does not."""
        for process in self._processes:
            if process.stdin is not None and not process.stdin.closed:
                try:
                    process.stdin.write("quit\n")
                    process.stdin.close()
                except OSError:
                    pass
        for process in self._processes:
            try:
                process.wait(timeout=WORKER_QUIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _process_row(
    ctx: Context,
    row_id: str,
    settings: JsonObject,
    raw: JsonObject,
    baseline_name: str,
    *,
    peer: Peer | Path | None = None,
) -> Row:
    """Interleave raw single-row writers, peer writers and flowvault writers, one process each.

    ``peer`` is the peer's database file every worker writes its own
    threads to, a ``Peer`` saying why the peer cannot run, or ``None``.
    """
    processes, count = ctx.sizes.s5_processes, ctx.sizes.s5_workflows
    peer_config: JsonObject | None = None
    if isinstance(peer, Path):
        key = base64.b64encode(ctx.peer_key).decode("ascii")
        peer_config = {"path": str(peer), "key": key}
    configs: list[JsonObject] = [
        {
            "settings": settings,
            "raw": raw,
            "peer": peer_config,
            "row": n,
            "workflows": count,
            "tag": f"{ctx.tag}-{row_id}",
        }
        for n in range(processes)
    ]
    with WorkerGroup(ctx, row_id, configs) as group:
        rounds = interleave_rounds(
            ctx.sizes.repetitions,
            lambda: group.round("baseline"),
            lambda: group.round("scenario"),
            peer=None if peer_config is None else lambda: group.round("peer"),
        )
    samples = rounds.scenario
    notes = (
        f"{processes} processes x {count} workflows x {OPS_PER_WORKFLOW} ops; "
        f"errors {sum(s.errors for s in samples)}"
    )
    label = f"{processes} processes, own runtimes, distinct workflows"
    figures = peer if isinstance(peer, Peer) else None
    if peer_config is not None:
        figures = Peer(PEER_NAME, rounds.peer)
    return Row(
        row_id,
        label,
        samples,
        f"{baseline_name} x{processes} processes",
        rounds.baseline,
        notes,
        peer=figures,
    )


def s5_processes(ctx: Context) -> ScenarioResult:
    """S5a: several processes, each with its own runtime on one SQLite home.

    The home and the peer's database are created before the workers start,
    so none of them races another to lay out the schema.
    """
    home = ctx.work / "s5a"
    settings: JsonObject = {"backend": "sqlite", "home": str(home)}
    open_runtime(Settings.model_validate(settings)).close()
    raw_path = ctx.work / "s5a-raw.db"
    RawSqlite.create(raw_path, ctx.sizes.s5_processes)
    peer: Peer | Path
    with open_peer(ctx, "s5a") as opened:
        peer = opened if isinstance(opened, Peer) else ctx.peer_path("s5a")
    raw: JsonObject = {"kind": "sqlite", "path": str(raw_path)}
    row = _process_row(ctx, "S5a", settings, raw, RAW_WRITE, peer=peer)
    return ScenarioResult("S5a", "concurrent processes", [row], {"errors": row.summary.errors})


def _thread_round(workflows: WorkflowService, batches: Sequence[Sequence[WorkOrder]]) -> Sample:
    """Run one lifecycle batch per thread, released together; the wall time spans them all."""
    runs: list[LifecycleRun | None] = [None] * len(batches)
    barrier = threading.Barrier(len(batches) + 1)

    def work(n: int) -> None:
        barrier.wait()
        runs[n] = run_lifecycles(workflows, batches[n])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(batches))]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    done = [run for run in runs if run is not None]
    latencies = tuple(ms for run in done for ms in (*run.ordinary_ms, *run.terminal_ms))
    errors = sum(run.errors for run in done) + len(runs) - len(done)
    return Sample(len(latencies), seconds, latencies, errors)


def s5_threads(ctx: Context) -> ScenarioResult:
    """S5b: threads sharing one runtime, against single-thread S1 on the same runtime."""
    threads, per_thread = ctx.sizes.s5_threads, ctx.sizes.s5_thread_workflows
    orders = Orders(f"{ctx.tag}-s5b")
    with open_runtime(sqlite_settings(ctx.work / "s5b")) as runtime:
        workflows = runtime.workflows

        def single() -> Sample:
            return run_lifecycles(workflows, orders.take(ctx.sizes.s1_workflows)).sample()

        base, samples = interleave(
            ctx.sizes.repetitions,
            single,
            lambda: _thread_round(workflows, [orders.take(per_thread) for _ in range(threads)]),
        )
    notes = (
        f"{threads} threads x {per_thread} workflows x {OPS_PER_WORKFLOW} ops; "
        f"errors {sum(s.errors for s in samples)}"
    )
    row = Row("S5b", f"{threads} threads, one runtime", samples, "S1 single thread", base, notes)
    return ScenarioResult("S5b", "concurrent threads", [row], {"errors": row.summary.errors})


# -- S6 -------------------------------------------------------------------------


def _postgres_settings(ctx: Context, target: PostgresTarget) -> JsonObject:
    """Return the PostgreSQL runtime's settings; they hold the DSN and key: never reported."""
    return {
        "backend": "postgres",
        "home": str(ctx.work / "s6"),
        "postgres_dsn": target.dsn,
        "postgres_schema": target.schema,
        "key": base64.urlsafe_b64encode(os.urandom(32)).decode("ascii"),
    }


def _postgres_rows(ctx: Context, target: PostgresTarget) -> list[Row]:
    settings = _postgres_settings(ctx, target)
    count, reads = ctx.sizes.s6_workflows, ctx.sizes.s2_reads
    with open_runtime(Settings.model_validate(settings)) as runtime:
        rows = max(ctx.sizes.s2_workflows, ctx.sizes.s5_processes)
        RawPostgres.create(target.dsn, target.schema, rows)
        raw = RawPostgres(target.dsn, target.schema, seed=1)
        try:
            s1 = _lifecycle_row(
                "S6-S1",
                "durable transitions (PostgreSQL)",
                runtime.workflows,
                raw,
                PG_WRITE,
                count=count,
                baseline_ops=count * OPS_PER_WORKFLOW,
                ctx=ctx,
            )
            ids = create_workflows(
                runtime.workflows, Orders(f"{ctx.tag}-s6-s2").take(ctx.sizes.s2_workflows)
            )
            s2 = _read_row(
                "S6-S2",
                "reads (get, PostgreSQL)",
                runtime.workflows,
                raw,
                PG_READ,
                ids=ids,
                reads=reads,
                ctx=ctx,
            )
        finally:
            raw.close()
    raw_config: JsonObject = {"kind": "postgres", "dsn": target.dsn, "schema": target.schema}
    s5 = _process_row(ctx, "S6-S5a", settings, raw_config, PG_WRITE)
    return [s1, s2, s5]


def s6_postgres(ctx: Context) -> ScenarioResult:
    """S6: S1, S2 and S5a on PostgreSQL in a fresh schema, dropped afterwards."""
    result = ScenarioResult("S6", "PostgreSQL")
    target = ctx.postgres
    if target is None:
        result.status, result.reason = "skipped", "no PostgreSQL DSN"
        return result
    unreachable = postgres_unreachable(target.dsn)
    if unreachable is not None:
        result.status, result.reason = "skipped", f"PostgreSQL is unreachable: {unreachable}"
        return result
    if schema_exists(target.dsn, target.schema):
        result.status = "failed"
        result.reason = f"schema {target.schema} already exists; pass a fresh --postgres-schema"
        return result
    try:
        result.rows = _postgres_rows(ctx, target)
    finally:
        drop_schema(target.dsn, target.schema)
    result.extra = {
        "server_version": postgres_server_version(target.dsn),
        "errors": sum(row.errors for row in result.rows),
    }
    return result


# -- S7 -------------------------------------------------------------------------

HOST_COUNTS: Final = (1, 2, 4)
"""How many host processes drive runs at once in each S7 round."""


def _host_rows(
    ctx: Context, backend: str, hosts: Sequence[JsonObject], raw: JsonObject
) -> list[Row]:
    """Interleave rounds of 1, 2 and 4 hosts starting and finishing their own runs.

    Every host is its own process with its own runtime and host identity;
    the one-host row is set against raw single-row writes of one process,
    the others against the one-host rounds of the same run.
    """
    count = ctx.sizes.s7_runs
    configs: list[JsonObject] = [
        {"settings": settings, "raw": raw, "peer": None, "row": n, "workflows": count, "tag": ""}
        for n, settings in enumerate(hosts)
    ]
    samples: dict[int, list[Sample]] = {hosts: [] for hosts in HOST_COUNTS}
    baseline: list[Sample] = []
    with WorkerGroup(ctx, f"s7-{backend}", configs) as group:
        for hosts_now in HOST_COUNTS:
            group.round("runs", hosts_now)
        for _ in range(ctx.sizes.repetitions):
            baseline.append(group.round("baseline", 1))
            for hosts_now in HOST_COUNTS:
                samples[hosts_now].append(group.round("runs", hosts_now))
    rows = []
    for hosts_now in HOST_COUNTS:
        measured = tuple(samples[hosts_now])
        notes = (
            f"{hosts_now} x {count} runs x {OPS_PER_RUN} ops; "
            f"errors {sum(s.errors for s in measured)}"
        )
        plural = "host" if hosts_now == 1 else "hosts"
        label = f"{hosts_now} {plural}, own runs ({backend})"
        if hosts_now == 1:
            base_name, base = f"raw {backend} write x1 process", tuple(baseline)
        else:
            base_name, base = "1 host", tuple(samples[1])
        rows.append(Row(f"S7-{backend}-{hosts_now}", label, measured, base_name, base, notes))
    return rows


def _register_definition(settings: JsonObject) -> None:
    with open_runtime(Settings.model_validate(settings)) as runtime:
        runtime.definitions.register_definition(RUN_DEFINITION, {"nodes": ["plan", "act"]})


def _sqlite_hosts(ctx: Context) -> list[Row]:
    home = ctx.work / "s7"
    hosts: list[JsonObject] = [
        {"backend": "sqlite", "home": str(home)} for n in range(max(HOST_COUNTS))
    ]
    _register_definition(hosts[0])
    raw_path = ctx.work / "s7-raw.db"
    RawSqlite.create(raw_path, max(HOST_COUNTS))
    return _host_rows(ctx, "sqlite", hosts, {"kind": "sqlite", "path": str(raw_path)})


def _postgres_hosts(ctx: Context, target: PostgresTarget) -> list[Row]:
    shared = _postgres_settings(ctx, target)
    hosts: list[JsonObject] = [
        {**shared, "home": str(ctx.work / f"s7-host-{n}")} for n in range(max(HOST_COUNTS))
    ]
    _register_definition(hosts[0])
    RawPostgres.create(target.dsn, target.schema, max(HOST_COUNTS))
    raw: JsonObject = {"kind": "postgres", "dsn": target.dsn, "schema": target.schema}
    return _host_rows(ctx, "postgres", hosts, raw)


def s7_hosts(ctx: Context) -> ScenarioResult:
    """S7: runs driven by 1, 2 and 4 host processes at once, on SQLite and on PostgreSQL.

    The PostgreSQL rows use a fresh schema, dropped afterwards; without a
    server they are left out and the reason is reported.
    """
    result = ScenarioResult("S7", "several hosts")
    result.rows = _sqlite_hosts(ctx)
    target = ctx.postgres
    reason = "no PostgreSQL DSN" if target is None else postgres_unreachable(target.dsn)
    if target is not None and reason is None:
        if schema_exists(target.dsn, target.schema):
            result.status = "failed"
            result.reason = f"schema {target.schema} already exists; pass a fresh --postgres-schema"
            return result
        try:
            result.rows += _postgres_hosts(ctx, target)
        finally:
            drop_schema(target.dsn, target.schema)
    result.extra = {
        "errors": sum(row.errors for row in result.rows),
        "postgres": "ran" if reason is None else f"skipped: {reason}",
    }
    return result
