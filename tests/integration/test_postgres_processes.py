"""Eight real processes, each with its own pool, on one PostgreSQL schema.

Compare-and-swap through the state repository (its record lock left out,
so the writers race) loses nothing; the same
processes writing without a guard do lose updates (the negative control
that proves the counting can fail); and concurrent appends never fork a
ledger stream.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.application import SealedRepository, StateRepository
from flowvault.application.testing import FrozenClock
from flowvault.domain._ledger import verify_chain

pytestmark = pytest.mark.postgres

WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "postgres" / "worker.py"
PROCESSES = 8
INCREMENTS = 250
APPENDS = 50
KEY = bytes(range(32))
SCOPE, NAIVE_NS, NAIVE_KEY, STREAM = "race", "race", "naive-counter", "race-ledger"


def _race(server, schema: str, go: Path, count: int, phases: list[str]) -> dict[str, list[int]]:
    """Run the workers phase by phase; return each phase's retried conflicts per worker."""
    go.mkdir()
    env = {**os.environ, "TEST_POSTGRES_DSN": server.dsn}
    command = [sys.executable, str(WORKER), schema, str(go), str(count)]
    workers = [
        subprocess.Popen(
            [*command, f"w{n}", ",".join(phases)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(PROCESSES)
    ]
    conflicts: dict[str, list[int]] = {phase: [] for phase in phases}
    try:
        for line in ["ready", *phases]:
            if line != "ready":
                (go / line).touch()
            for worker in workers:
                assert worker.stdout is not None
                reply = [*worker.stdout.readline().split(), ""]
                assert reply[0] == line, worker.communicate(timeout=60)[1][-3000:]
                if line != "ready":
                    conflicts[line].append(int(reply[1]))
        for worker in workers:
            _, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err[-3000:]
            assert "Traceback" not in err
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return conflicts


def _repository(store: PostgresSecureObjectStore) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher(KEY), FrozenClock())


def test_cas_increments_lose_nothing_and_the_naive_control_does(
    postgres_server, pg_schema: str, tmp_path: Path
) -> None:
    """8 x 250 state updates end at exactly 2,000; 8 x 250 unguarded writes end below it."""
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True).close()
    conflicts = _race(postgres_server, pg_schema, tmp_path / "go", INCREMENTS, ["cas", "naive"])
    total = PROCESSES * INCREMENTS
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        repository = _repository(store)
        snapshot = StateRepository(repository, SCOPE).load()
        naive = repository.read(NAIVE_NS, NAIVE_KEY)
    assert snapshot.state.model_dump() == {"count": total}
    assert snapshot.revision == total
    assert sum(conflicts["cas"]) > 0, "the workers never raced; the test proves nothing"
    assert naive is not None
    lost = total - naive.document["count"]  # type: ignore[index,operator]
    assert naive.revision >= total
    assert lost > 0, "unguarded writes lost nothing: the race is too weak to show CAS works"
    print(f"\ncas retries {sum(conflicts['cas'])}; naive control lost {lost} of {total}")


def test_concurrent_appends_never_fork_the_stream(
    postgres_server, pg_schema: str, tmp_path: Path
) -> None:
    """8 x 50 appends make one gap-free chain of 400 events that verifies end to end."""
    PostgresSecureObjectStore.open(postgres_server.dsn, schema=pg_schema, create=True).close()
    conflicts = _race(postgres_server, pg_schema, tmp_path / "go", APPENDS, ["ledger"])
    total = PROCESSES * APPENDS
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, create=True
    ) as store:
        events = list(store.read_ledger(STREAM, limit=200).events)
        while len(events) < total + 1:
            page = store.read_ledger(STREAM, from_index=len(events), limit=200)
            if not page.events:
                break
            events += page.events
    assert [event.index for event in events] == list(range(total))
    assert verify_chain(events).ok
    writers = Counter(event.payload["writer"] for event in events)  # type: ignore[index]
    assert writers == {f"w{n}": APPENDS for n in range(PROCESSES)}
    assert sum(conflicts["ledger"]) > 0, "the workers never raced; the test proves nothing"
    print(f"\nledger retries {sum(conflicts['ledger'])}")
