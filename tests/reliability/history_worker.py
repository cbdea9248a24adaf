"""One process of the linearizability harness (tests/reliability/test_linearizability.py).

Usage: ``history_worker.py sqlite|postgres TARGET NAME``, TARGET being a
SQLite home or a PostgreSQL schema (the DSN comes from ``TEST_POSTGRES_DSN``,
never the command line). It opens the store through ``bootstrap``, prints
``ready``, then follows one order per stdin line,
``run SEED OPS STALE_RATE KEY,KEY,... OUT``, which the parent sends to every
process at once (the start barrier); one process serves several runs, so a
run does not wait for interpreters to start.

A run is OPS operations on random keys through the sealed repository:
reads, and compare-and-swap writes guarded by the last revision this
process saw of that key. Each is timed with ``time.monotonic_ns`` (one
system-wide clock) just before the call and just after it returns; a random
pause of up to half a millisecond separates them. The history goes to OUT
as JSON lines, and the worker prints ``done COUNT stale STALE``.

With a non-zero STALE_RATE the repository reads through ``StaleStore``, the
deliberately broken mutant: that share of loads returns the first record
this process loaded for the key in this run, as a cache nobody invalidates
would. Randomness is seeded from SEED and the process name.

Any exception other than a refused guard ends the worker with a traceback.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from flowvault.application import SealedRepository, SecureObjectStore, StoredRecord
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import RevisionConflict

KEY = bytes(range(32))
NAMESPACE = "linearizability"
JITTER_SECONDS = 0.0005
READ_SHARE = 0.5


class StaleStore:
    """A real store whose ``load`` sometimes returns a stale cached record (the mutant)."""

    def __init__(self, store: SecureObjectStore, rng: random.Random, rate: float) -> None:
        self._store = store
        self._rng = rng
        self._rate = rate
        self._first: dict[tuple[str, str], StoredRecord] = {}
        self.stale_served = 0

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        """Return the first record ever loaded for the key at ``rate``, else the current one."""
        cached = self._first.get((namespace, key_digest))
        if cached is not None and self._rng.random() < self._rate:
            self.stale_served += 1
            return cached
        record = self._store.load(namespace, key_digest)
        if record is not None:
            self._first.setdefault((namespace, key_digest), record)
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def settings(backend: str, target: str) -> Settings:
    """Return settings for a SQLite home or a PostgreSQL schema (one pooled connection)."""
    if backend == "sqlite":
        return Settings(backend="sqlite", home=Path(target))
    return Settings(
        backend="postgres",
        postgres_dsn=os.environ["TEST_POSTGRES_DSN"],
        postgres_schema=target,
        postgres_pool_size=1,
    )


class Recorder:
    """Runs timed operations and keeps them as the history rows of ``version_order.Op``."""

    def __init__(self, repo: SealedRepository, name: str) -> None:
        self.repo = repo
        self.name = name
        self.rows: list[dict[str, object]] = []
        self.known: dict[str, int] = {}

    def _row(self, kind: str, key: str, invoked: int, revision: int | None, **more: object) -> None:
        returned = time.monotonic_ns()
        self.rows.append(
            {
                "process": self.name,
                "seq": len(self.rows),
                "kind": kind,
                "key": key,
                "invoked": invoked,
                "returned": returned,
                "revision": revision,
                **more,
            }
        )

    def read(self, key: str) -> None:
        """Read the key; remember its revision as the guard of this process's next write."""
        invoked = time.monotonic_ns()
        opened = self.repo.read(NAMESPACE, key)
        revision = 0 if opened is None else opened.revision
        self._row("read", key, invoked, revision, value=None if opened is None else opened.document)
        self.known[key] = revision

    def write(self, key: str) -> None:
        """CAS-write a unique document, guarded by the last revision seen."""
        expected = self.known[key]
        value = {"writer": self.name, "seq": len(self.rows)}
        invoked = time.monotonic_ns()
        try:
            written = self.repo.write(NAMESPACE, key, value, expected=expected)
        except RevisionConflict as exc:
            actual = exc.details.get("actual")
            revision = actual if isinstance(actual, int) else None
            self._row("conflict", key, invoked, revision, expected=expected)
            if revision is not None:
                self.known[key] = revision
            return
        self._row("write", key, invoked, written.revision, value=value, expected=expected)
        self.known[key] = written.revision


def run(recorder: Recorder, rng: random.Random, keys: list[str], ops: int, reads: float) -> None:
    """Run ``ops`` operations: a read where nothing is known yet or by chance, else a write."""
    for _ in range(ops):
        key = rng.choice(keys)
        if key not in recorder.known or rng.random() < reads:
            recorder.read(key)
        else:
            recorder.write(key)
        time.sleep(rng.uniform(0, JITTER_SECONDS))


def serve(runtime: Runtime, name: str, order: list[str]) -> str:
    """Record one history as ``order`` asks: ``run SEED OPS STALE_RATE KEYS OUT``."""
    seed, ops, stale_rate, keys, out = order[1:]
    repo, mutant = runtime.repository, None
    if float(stale_rate):
        stale_rng = random.Random(f"{seed}:{name}:stale")
        mutant = StaleStore(runtime.store, stale_rng, float(stale_rate))
        repo = SealedRepository(mutant, runtime.cipher, runtime.clock)
    recorder = Recorder(repo, name)
    run(recorder, random.Random(f"{seed}:{name}"), keys.split(","), int(ops), READ_SHARE)
    Path(out).write_text("".join(json.dumps(row) + "\n" for row in recorder.rows))
    stale = 0 if mutant is None else mutant.stale_served
    return f"done {len(recorder.rows)} stale {stale}"


def main(backend: str, target: str, name: str) -> None:
    """Open the store, then record one history per order line until stdin closes."""
    with bootstrap(settings(backend, target), key=KEY, create=True) as runtime:
        runtime.repository.read(NAMESPACE, "warm-up")
        print("ready", flush=True)
        for line in sys.stdin:
            order = line.split()
            if len(order) != 6 or order[0] != "run":
                raise SystemExit(f"{name}: cannot follow {line!r}")
            print(serve(runtime, name, order), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
