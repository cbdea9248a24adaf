"""Run the flowvault benchmark suite: a markdown table on stdout, and JSON with ``--out``.

From the repository root::

    python benchmarks/run.py [--quick] [--out FILE.json] [--only S1,S2,...]
                             [--postgres-dsn DSN] [--postgres-schema NAME] [--dir DIR] [--keep]

Every figure is a rate over at least five repetitions (median, min, max),
p50/p99 latency per operation, and a ratio to a raw baseline measured in
the same run on the same disk (or server), interleaved repetition by
repetition. S1, S2 and S5a also interleave the peer users would pick
instead (LangGraph's SqliteSaver with AES-GCM, from the ``bench`` extra)
and report a ratio to it; without it installed they say so. The
PostgreSQL scenarios use ``--postgres-dsn``, else ``TEST_POSTGRES_DSN``,
else the local default; when the server does not answer they are reported
as skipped with the reason. ``--quick`` runs the same code paths at tiny
sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from _harness import JsonObject, ScenarioResult, markdown, run_metadata
from _langgraph import s8_langgraph
from _peer import PEER_NAME, peer_unavailable, peer_versions
from _scenarios import (
    FULL,
    QUICK,
    Context,
    PostgresTarget,
    s1_memory,
    s1_sqlite,
    s2_reads,
    s3_growth,
    s4_ledger,
    s5_processes,
    s5_threads,
    s6_postgres,
    s7_hosts,
)

from flowvault.composition import configure_logging

FORMAT: Final = "flowvault-benchmarks/1"
DSN_ENV: Final = "TEST_POSTGRES_DSN"
DEFAULT_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
_SCHEMA: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

Scenario = Callable[[Context], ScenarioResult]

SCENARIOS: Final[tuple[tuple[str, str, Scenario], ...]] = (
    ("S1", "durable transitions", s1_sqlite),
    ("S1-memory", "pure-Python ceiling", s1_memory),
    ("S2", "reads", s2_reads),
    ("S3", "growth", s3_growth),
    ("S4", "ledger verification", s4_ledger),
    ("S5a", "concurrent processes", s5_processes),
    ("S5b", "concurrent threads", s5_threads),
    ("S6", "PostgreSQL", s6_postgres),
    ("S7", "several hosts", s7_hosts),
    ("S8", "LangGraph checkpointer", s8_langgraph),
)
"""Every scenario, in the order they run and are reported."""

ALIASES: Final = {"S5": ("S5a", "S5b")}

BASELINES: Final = {
    "raw SQLite write": (
        "stdlib sqlite3, WAL, synchronous=FULL, isolation_level=None, one long-lived "
        "connection; BEGIN IMMEDIATE; UPDATE t SET v=? WHERE id=?; COMMIT per operation"
    ),
    "raw SQLite read": (
        "stdlib sqlite3, same settings; SELECT payload FROM t WHERE id=? of a random row "
        "among N rows holding a 500-byte blob"
    ),
    "raw psycopg write": "psycopg, autocommit off; one single-row UPDATE then commit",
    "raw psycopg read": "psycopg, autocommit on; SELECT payload by primary key of a random row",
    "S1 single thread": "S1's workload on the same runtime, one thread, interleaved",
}

PEER: Final = (
    "langgraph.checkpoint.sqlite.SqliteSaver on stdlib sqlite3, WAL, synchronous=FULL, the "
    "raw baseline's busy timeout, otherwise the saver's defaults; "
    "EncryptedSerializer.from_pycryptodome_aes with a random 256-bit key in AES.MODE_GCM. "
    "S1/S5a: one put per operation (a thread's checkpoint holding a document shaped like "
    "flowvault's workflow record); S2: get_tuple of the latest checkpoint of a random thread"
)


def _schema(text: str) -> str:
    if not _SCHEMA.match(text) or text.startswith("pg_"):
        raise argparse.ArgumentTypeError(f"not a usable schema name: {text!r}")
    return text


def _selection(text: str | None) -> tuple[str, ...]:
    """Scenario ids named by ``--only`` (case-insensitive; ``S5`` means S5a and S5b)."""
    known = {scenario_id.lower(): scenario_id for scenario_id, _, _ in SCENARIOS}
    if text is None:
        return tuple(known.values())
    chosen: list[str] = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        alias = {key.lower(): ids for key, ids in ALIASES.items()}.get(name.lower())
        if alias is None and name.lower() not in known:
            raise argparse.ArgumentTypeError(
                f"unknown scenario {name!r}; known: {', '.join(known.values())}"
            )
        chosen.extend(alias or (known[name.lower()],))
    return tuple(chosen)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="Measure flowvault against raw SQLite and PostgreSQL baselines.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, same code paths")
    parser.add_argument("--out", type=Path, help="write every figure as JSON to this file")
    parser.add_argument("--only", help="comma-separated scenario ids, e.g. S1,S3,S5")
    parser.add_argument("--postgres-dsn", help=f"PostgreSQL for S6 (default: ${DSN_ENV} or local)")
    parser.add_argument(
        "--postgres-schema",
        type=_schema,
        help="fresh schema for S6, created and dropped by the run (default: a random name)",
    )
    parser.add_argument(
        "--dir", type=Path, help="parent of the work directory (default: the system temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    try:
        args.only = _selection(args.only)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    return args


def _postgres(args: argparse.Namespace) -> PostgresTarget:
    dsn = args.postgres_dsn or os.environ.get(DSN_ENV) or DEFAULT_DSN
    return PostgresTarget(dsn, args.postgres_schema or f"fvbench_{secrets.token_hex(6)}")


def _run_one(scenario_id: str, title: str, scenario: Scenario, ctx: Context) -> ScenarioResult:
    """Run one scenario; a crash is reported as ``failed`` and the others still run."""
    sys.stderr.write(f"{scenario_id}: running\n")
    started = time.perf_counter()
    try:
        result = scenario(ctx)
    except Exception as exc:
        traceback.print_exc()
        reason = (str(exc).strip().splitlines() or [""])[0]
        result = ScenarioResult(
            scenario_id, title, status="failed", reason=f"{type(exc).__name__}: {reason}"
        )
    result.seconds = time.perf_counter() - started
    sys.stderr.write(f"{scenario_id}: {result.status} in {result.seconds:.1f} s\n")
    return result


def _run_all(ctx: Context, selected: Sequence[str]) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    for scenario_id, title, scenario in SCENARIOS:
        if scenario_id in selected:
            results.append(_run_one(scenario_id, title, scenario, ctx))
        else:
            skipped = ScenarioResult(
                scenario_id, title, status="skipped", reason="not selected by --only"
            )
            results.append(skipped)
    return results


def _document(
    args: argparse.Namespace,
    metadata: JsonObject,
    results: Sequence[ScenarioResult],
    seconds: float,
) -> JsonObject:
    sizes = QUICK if args.quick else FULL
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "format": FORMAT,
        "ok": all(result.status != "failed" for result in results),
        "wall_seconds": seconds,
        "metadata": {**metadata, "load_average_at_end": load},
        "parameters": {
            **sizes.to_json(),
            "only": list(args.only),
            "postgres_dsn_given": args.postgres_dsn is not None,
            "postgres_schema": args.postgres_schema,
            "baselines": BASELINES,
            "peer": {
                "name": PEER_NAME,
                "description": PEER,
                "rows": ["S1", "S2", "S5a"],
                "installed": peer_unavailable() is None,
                "reason": peer_unavailable(),
                "versions": peer_versions(),
            },
            "interleaved": (
                "per repetition: baseline, then peer (S1, S2, S5a), then scenario; "
                "one warm-up round first"
            ),
            "ratio": "median(scenario ops/s) / median(baseline ops/s)",
            "peer_ratio": "median(scenario ops/s) / median(peer ops/s)",
        },
        "scenarios": {result.id: result.to_json() for result in results},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected scenarios, print the table, write the JSON; 1 if any scenario failed."""
    args = parse_args(argv)
    configure_logging("warning")
    started = time.perf_counter()
    metadata = run_metadata(quick=args.quick)
    work = Path(tempfile.mkdtemp(prefix="flowvault-bench-", dir=args.dir))
    target = _postgres(args)
    args.postgres_schema = target.schema
    ctx = Context(
        sizes=QUICK if args.quick else FULL,
        work=work,
        tag=secrets.token_hex(4),
        worker=Path(__file__).resolve().with_name("_worker.py"),
        postgres=target,
        peer_key=os.urandom(32),
    )
    try:
        results = _run_all(ctx, args.only)
    finally:
        if args.keep:
            sys.stderr.write(f"work directory kept: {work}\n")
        else:
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - started
    mode = "quick" if args.quick else "full"
    sys.stdout.write(f"## flowvault benchmarks ({mode}, {seconds:.0f} s)\n\n{markdown(results)}\n")
    document = _document(args, metadata, results, seconds)
    if args.out is not None:
        args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
