"""The high-water mark's size and open time with N streams, before and after dropping most of them.

Outside the S1-S6 suite: one run, one figure per step. On a SQLite file it
creates ``--streams`` streams of one keyed event each (named as the
LangGraph saver names its threads' streams), through the mark's store
decorator in the strict mode, then reports the mark file's size and the
times of three opens (``bootstrap``, first and median) and of the open
check alone (``AntiRollback.check``, median of three). It then
drops ``--drop`` of them on record (``drop_unit``, 200 per unit) and
reports the same, for the first open after the drops and the one after it.

    .venv/bin/python benchmarks/mark_drops.py --streams 20000 --drop 19000
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

from flowvault.adapters.system import MarkFileStore
from flowvault.application import UnitOfWork, chained_event, drop_unit
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._high_water_store import HighWaterStore
from flowvault.composition import Runtime, Settings, bootstrap

_BATCH = 200


def _names(count: int) -> list[str]:
    return [f"langgraph/{hashlib.sha256(str(n).encode()).hexdigest()}" for n in range(count)]


def _wrapped(runtime: Runtime) -> HighWaterStore:
    store = runtime.store
    if not isinstance(store, HighWaterStore):
        raise SystemExit("the store is not guarded by a high-water mark")
    return store


def _figures(label: str, settings: Settings, mark: Path) -> None:
    """Print the mark's size, and the median times of three opens and of three open checks."""
    size = mark.stat().st_size
    opens: list[float] = []
    for _ in range(3):
        started = time.perf_counter()
        with bootstrap(settings):
            opens.append(time.perf_counter() - started)
    times: list[float] = []
    with bootstrap(settings) as runtime:
        inner = _wrapped(runtime).wrapped
        for _ in range(3):
            guard = AntiRollback(inner, MarkFileStore(mark), runtime.repository)
            started = time.perf_counter()
            guard.check()
            times.append(time.perf_counter() - started)
    print(
        f"{label}: mark {size:,} bytes before the open, {mark.stat().st_size:,} after; "
        f"open (bootstrap) first {opens[0]:.3f} s, median {statistics.median(opens):.3f} s; "
        f"open check alone median {statistics.median(times):.3f} s"
    )


def main() -> None:
    """Create the streams, drop most of them, and print the figures of each step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=20_000)
    parser.add_argument("--drop", type=int, default=19_000)
    arguments = parser.parse_args()
    names = _names(arguments.streams)
    with tempfile.TemporaryDirectory() as home:
        settings = Settings(backend="sqlite", home=Path(home), mark_sync="strict")
        mark = settings.high_water_path
        if mark is None:
            raise SystemExit("this configuration keeps no high-water mark")
        with bootstrap(settings, create=True) as runtime:
            now = runtime.clock.now()
            for start in range(0, len(names), _BATCH):
                events = [
                    chained_event(runtime.repository, name, "test.step", None, now, after=None)
                    for name in names[start : start + _BATCH]
                ]
                runtime.store.commit(UnitOfWork(appends=events))
        _figures(f"{len(names):,} streams", settings, mark)
        with bootstrap(settings) as runtime:
            started = time.perf_counter()
            for start in range(0, arguments.drop, _BATCH):
                batch = names[start : min(start + _BATCH, arguments.drop)]
                runtime.store.commit(
                    drop_unit(
                        runtime.store,
                        runtime.repository,
                        *batch,
                        occurred_at=runtime.clock.now(),
                        reason="benchmark",
                    )
                )
            took = time.perf_counter() - started
        print(f"dropped {arguments.drop:,} streams in {took:.2f} s")
        _figures(f"after dropping {arguments.drop:,}", settings, mark)
        _figures("next open", settings, mark)


if __name__ == "__main__":
    main()
