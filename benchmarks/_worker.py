"""Worker processes: the S3 growth run, and the S5 writers driven in lock-step.

Run as ``python benchmarks/_worker.py MODE``; the configuration (which may
hold a key or a DSN) arrives as one JSON line on stdin, never in argv.

- ``growth``: prefills one store step by step and measures transitions at
  each size; prints one JSON document, with the process's peak RSS.
- ``writer``: opens its own runtime, baseline connection and (when
  configured) peer saver, prints ``ready``, then answers each ``baseline``,
  ``peer`` or ``scenario`` line with one JSON sample stamped on the
  system-wide monotonic clock; ``quit`` ends it.
"""

from __future__ import annotations

import base64
import json
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from _baseline import RawSqlite, open_raw
from _harness import JsonObject, Sample, as_int, as_list, as_object, interleave
from _peer import PeerSaver
from _workload import (
    OPS_PER_WORKFLOW,
    LifecycleRun,
    Orders,
    open_runtime,
    prefill,
    run_lifecycles,
    run_peer_lifecycles,
    run_runs,
    sqlite_settings,
)

from flowvault.composition import Settings, configure_logging

RAW_ROWS = 1000


def peak_rss_mb() -> float:
    """Return the peak resident set size of this process in MB (``ru_maxrss``: KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _samples(samples: Sequence[Sample]) -> list[JsonObject]:
    return [sample.to_json() for sample in samples]


def _measure_size(
    settings: Settings, raw: RawSqlite, orders: Orders, config: Mapping[str, object]
) -> tuple[tuple[Sample, ...], tuple[LifecycleRun, ...]]:
    """Interleave the raw write baseline with lifecycles on a FULL runtime over the store."""
    workflows = as_int(config["workflows"])
    with open_runtime(settings) as runtime:
        return interleave(
            as_int(config["repetitions"]),
            lambda: raw.write_sample(workflows * OPS_PER_WORKFLOW),
            lambda: run_lifecycles(runtime.workflows, orders.take(workflows)),
            warmup=bool(config["warmup"]),
        )


def growth(config: Mapping[str, object]) -> JsonObject:
    """Grow one store through each size and measure ordinary and terminal transitions.

    One store grows (1k, then 10k, then 100k) instead of three being
    filled, which saves most of the prefill. Workflows created while
    measuring count towards the next size.
    """
    settings = sqlite_settings(Path(str(config["home"])))
    raw_path = Path(str(config["raw"]))
    RawSqlite.create(raw_path, RAW_ROWS)
    raw = RawSqlite(raw_path, seed=3)
    orders = Orders(str(config["tag"]))
    per_round = as_int(config["workflows"]) * (as_int(config["repetitions"]) + 1)
    existing = 0
    sizes: list[JsonObject] = []
    try:
        for size in (as_int(value) for value in as_list(config["sizes"])):
            fill = max(0, size - existing)
            prefill_seconds = prefill(settings, orders.stream(fill)) if fill else 0.0
            base, runs = _measure_size(settings, raw, orders, config)
            sizes.append(
                {
                    "size": size,
                    "workflows_in_store": existing + fill,
                    "prefilled": fill,
                    "prefill_seconds": prefill_seconds,
                    "baseline": _samples(base),
                    "ordinary": _samples([run.ordinary() for run in runs]),
                    "terminal": _samples([run.terminal() for run in runs]),
                }
            )
            existing += fill + per_round
    finally:
        raw.close()
    return {"sizes": sizes, "peak_rss_mb": peak_rss_mb()}


def _stamped(sample: Sample, start: float, end: float) -> JsonObject:
    return {**sample.to_json(), "start": start, "end": end}


def _open_peer(config: object) -> PeerSaver | None:
    """Open the peer saver the runner configured, or ``None`` when this row has no peer."""
    if config is None:
        return None
    body = as_object(config)
    return PeerSaver(Path(str(body["path"])), base64.b64decode(str(body["key"])))


def writer(config: Mapping[str, object]) -> None:
    """Serve ``baseline``, ``peer`` and ``scenario`` rounds until ``quit`` or end of input."""
    settings = Settings.model_validate(as_object(config["settings"]))
    row = as_int(config["row"])
    workflows = as_int(config["workflows"])
    orders = Orders(f"{config['tag']}-w{row}")
    peer_orders = Orders(f"{config['tag']}-w{row}-peer")
    raw = open_raw(as_object(config["raw"]), seed=row)
    peer: PeerSaver | None = None
    try:
        peer = _open_peer(config.get("peer"))
        with open_runtime(settings) as runtime:
            print("ready", flush=True)
            for line in sys.stdin:
                command = line.strip()
                if command == "quit":
                    break
                start = time.monotonic()
                if command == "baseline":
                    sample = raw.write_sample(workflows * OPS_PER_WORKFLOW, row=row)
                elif command == "peer":
                    if peer is None:
                        raise RuntimeError("peer round asked of a writer with no peer")
                    sample = run_peer_lifecycles(peer, peer_orders.take(workflows))
                elif command == "scenario":
                    sample = run_lifecycles(runtime.workflows, orders.take(workflows)).sample()
                elif command == "runs":
                    sample = run_runs(runtime.runs, workflows)
                else:
                    raise RuntimeError(f"unknown command {command!r}")
                print(json.dumps(_stamped(sample, start, time.monotonic())), flush=True)
    finally:
        raw.close()
        if peer is not None:
            peer.close()


def main(argv: Sequence[str]) -> int:
    """Read the configuration line and run the requested mode."""
    configure_logging("warning")
    mode = argv[1] if len(argv) > 1 else ""
    config = as_object(json.loads(sys.stdin.readline()))
    if mode == "growth":
        print(json.dumps(growth(config)), flush=True)
        return 0
    if mode == "writer":
        writer(config)
        return 0
    print(f"unknown mode {mode!r}; expected growth or writer", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
