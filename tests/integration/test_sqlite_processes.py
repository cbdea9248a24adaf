"""Two real processes writing one SQLite file: compare-and-swap loses nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from processes import run_together

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import UnitOfWork
from flowvault.application.testing import make_header, make_upsert
from flowvault.domain._ledger import verify_chain

WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "sqlite" / "cas_worker.py"
NAMESPACE, KEY, STREAM = "race", "counter", "race-ledger"
PER_PROCESS = {"counter": 200, "ledger": 100}


def _race(tmp_path: Path, mode: str) -> None:
    """Run two workers against one file and require both to finish every write cleanly."""
    path, go = tmp_path / "data" / "store.db", tmp_path / "go"
    count = str(PER_PROCESS[mode])
    finished = run_together(
        [[sys.executable, str(WORKER), mode, str(path), str(go), count, f"w{n}"] for n in range(2)],
        go,
    )
    for worker in finished:
        assert worker.returncode == 0, worker.stderr
        assert "OperationalError" not in worker.stderr
        assert "StoreBusy" not in worker.stderr
        assert worker.stdout.startswith("conflicts "), worker.stdout


def test_two_processes_increment_without_losing_an_update(tmp_path: Path) -> None:
    """200 CAS increments from each of two processes end at 400, revision 401."""
    path = tmp_path / "data" / "store.db"
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        store.commit(UnitOfWork(upserts=[make_upsert(NAMESPACE, KEY, b"0")]))
    _race(tmp_path, "counter")
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        record = store.load(NAMESPACE, make_header(NAMESPACE, KEY).key_digest)
    assert record is not None
    assert int(record.payload.decode()) == 400
    assert record.metadata.revision == 401


def test_two_processes_extend_one_ledger_without_forking(tmp_path: Path) -> None:
    """100 appends from each of two processes make one intact chain of 200 events."""
    path = tmp_path / "data" / "store.db"
    SQLiteSecureObjectStore.open(path, create=True).close()
    _race(tmp_path, "ledger")
    with SQLiteSecureObjectStore.open(path, create=True) as store:
        page = store.read_ledger(STREAM, limit=200)
    assert len(page.events) == 200
    assert page.next_index is None
    assert verify_chain(page.events).ok
    writers = {event.payload["writer"] for event in page.events}  # type: ignore[index]
    assert writers == {"w0", "w1"}
