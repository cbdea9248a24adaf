"""How long a verified move of a store of N workflows takes, against a raw copy of its file.

Separate from the S1-S6 suite: one run, one figure per path. It prefills a
SQLite store with ``--workflows`` workflows (each a workflow row, its
idempotency row and its ledger event), then times, each phase apart:
reading the store out, filling the target in one transaction, and
verifying it (read back and compared, then the keyed audit). The paths are
SQLite to SQLite, SQLite to PostgreSQL (with ``TEST_POSTGRES_DSN`` set),
and SQLite through an archive to SQLite. The baseline is SQLite's online
backup of the same file, a raw page copy that verifies nothing; each total
is reported as a ratio to it.

    .venv/bin/python benchmarks/move.py --workflows 10000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _baseline import drop_schema
from _workload import Orders, prefill

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    LedgerAudit,
    SecureObjectStore,
    StoreContents,
    decode_archive,
    encode_archive,
    fill_verified,
    read_contents,
)
from flowvault.composition import Settings, bootstrap


class Phases:
    """Seconds spent in each phase ``fill_verified`` reports, by the line it reports."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.current = "start"
        self.seconds: dict[str, float] = {}

    def __call__(self, line: str) -> None:
        """End the current phase and start the one ``line`` names by its first word."""
        now = time.perf_counter()
        self.seconds[self.current] = now - self.started
        self.current, self.started = line.split(" ", maxsplit=1)[0], now

    def finish(self) -> dict[str, float]:
        """Close the last phase and return every phase's seconds."""
        self("end")
        return {name: round(value, 3) for name, value in self.seconds.items() if name != "start"}


def _timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _backup(source: Path, target: Path) -> None:
    with (
        contextlib.closing(sqlite3.connect(source)) as left,
        contextlib.closing(sqlite3.connect(target)) as right,
    ):
        left.backup(right)


def _fill(
    contents: StoreContents,
    target: SecureObjectStore,
    audit: Callable[[SecureObjectStore], LedgerAudit],
) -> dict[str, float]:
    phases = Phases()
    try:
        fill_verified(contents, target, audit, report=phases)
    finally:
        target.close()
    return phases.finish()


@contextlib.contextmanager
def _postgres(dsn: str | None) -> Iterator[tuple[str, str] | None]:
    if not dsn:
        yield None
        return
    schema = f"fvmove_{os.getpid()}"
    try:
        yield dsn, schema
    finally:
        drop_schema(dsn, schema)


def main() -> int:
    """Build the store, time each path, print one line per path."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workflows", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flowvault-move-") as root:
        base = Path(root)
        settings = Settings(backend="sqlite", home=base / "source")
        seconds = prefill(settings, Orders("move").stream(args.workflows))
        print(f"prefilled {args.workflows} workflows in {seconds:.1f} s")

        def audit(store: SecureObjectStore) -> LedgerAudit:
            return bootstrap(settings, store=store).audit()

        baseline = _timed(lambda: _backup(settings.database_path, base / "backup.db"))
        size = settings.database_path.stat().st_size
        print(f"baseline: online backup of {size / 1e6:.1f} MB in {baseline:.3f} s")

        def report(path: str, read: float, phases: dict[str, float]) -> None:
            total = read + sum(phases.values())
            shown = ", ".join(f"{name} {value:.2f} s" for name, value in phases.items())
            ratio = total / baseline
            print(f"{path}: {total:.2f} s ({ratio:.1f}x baseline; read {read:.2f} s, {shown})")

        with SQLiteSecureObjectStore.open(settings.database_path, read_only=True) as source:
            started = time.perf_counter()
            contents = read_contents(source)
            read = time.perf_counter() - started
        print(f"{len(contents.records)} records, {len(contents.events)} events")

        target = SQLiteSecureObjectStore.open(
            base / "target" / "data" / "flowvault.db", create=True
        )
        report("sqlite -> sqlite", read, _fill(contents, target, audit))

        with _postgres(os.environ.get("TEST_POSTGRES_DSN")) as server:
            if server is not None:
                store = PostgresSecureObjectStore.open(server[0], schema=server[1], create=True)
                report("sqlite -> postgres", read, _fill(contents, store, audit))

        with bootstrap(settings, create=True) as runtime:
            digester = runtime.repository
            started = time.perf_counter()
            data, _ = encode_archive(contents, digester, {"backend": "sqlite"})
            decoded, _ = decode_archive(data, digester)
            coded = time.perf_counter() - started
        print(f"archive: {len(data) / 1e6:.1f} MB, encoded and verified in {coded:.2f} s")
        target = SQLiteSecureObjectStore.open(
            base / "imported" / "data" / "flowvault.db", create=True
        )
        report("sqlite -> archive -> sqlite", read + coded, _fill(decoded, target, audit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
